"""Semantic lookaside buffer: the tool embedding matrix and its top-k scan."""

from __future__ import annotations

import threading

import numpy as np


class SemanticIndex:
    """Unit-norm tool vectors keyed by name; ``search`` returns the top-k by cosine similarity."""

    def __init__(self, dim: int):
        self.dim = dim
        self._names: list[str] = []
        self._pos: dict[str, int] = {}
        self._mat = np.zeros((0, dim), dtype=np.float32)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._names)

    def names(self) -> list[str]:
        return list(self._names)

    def upsert(self, items: dict[str, np.ndarray]) -> None:
        with self._lock:
            rows = list(self._mat)
            for name, vec in items.items():
                vec = np.asarray(vec, dtype=np.float32).reshape(self.dim)
                if name in self._pos:
                    rows[self._pos[name]] = vec
                else:
                    self._pos[name] = len(self._names)
                    self._names.append(name)
                    rows.append(vec)
            self._mat = np.ascontiguousarray(np.vstack(rows) if rows else np.zeros((0, self.dim), np.float32))

    def remove(self, names: list[str]) -> None:
        with self._lock:
            drop = {n for n in names if n in self._pos}
            if not drop:
                return
            keep = [i for i, n in enumerate(self._names) if n not in drop]
            self._names = [self._names[i] for i in keep]
            self._mat = np.ascontiguousarray(self._mat[keep]) if keep else np.zeros((0, self.dim), np.float32)
            self._pos = {n: i for i, n in enumerate(self._names)}

    def replace_all(self, items: dict[str, np.ndarray]) -> None:
        with self._lock:
            self._names = list(items)
            self._pos = {n: i for i, n in enumerate(self._names)}
            self._mat = (
                np.ascontiguousarray(np.vstack([np.asarray(v, np.float32) for v in items.values()]))
                if items
                else np.zeros((0, self.dim), np.float32)
            )

    def search(self, query: np.ndarray, k: int) -> list[tuple[str, float]]:
        with self._lock:
            names, mat = self._names, self._mat
        if not names:
            return []
        scores = mat @ np.asarray(query, dtype=np.float32)
        k = min(k, len(names))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(names[i], float(scores[i])) for i in top]
