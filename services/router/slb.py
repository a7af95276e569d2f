"""Semantic lookaside buffer (SLB): INT8-quantized tool keys and their top-k scan.

Every tool has one *text key*: the unit-norm embedding of its text (``tool_text``: name with ``_`` read as
spaces + description, the measured best of the variants in docs/experiments/routing_experiments.md). A tool may also
have *exemplar keys*: embeddings of queries known to route to it. A tool's score is

    text_sim + exemplar_weight * (pooled exemplar sim, or text_sim + exemplar_gap when the tool has no exemplar)

so with ``exemplar_weight == 0`` it is plain cosine similarity. The pooling of a tool's exemplar sims is their
max (``exemplar_temperature == 0``) or their log-mean-exp at that temperature ``T``,
``m + T * log(mean(exp((sims - m) / T)))`` with ``m`` the max: it tends to the max as T -> 0 and to the mean as T
grows, so one stray exemplar of a neighbour weighs less than several close ones (``pool_exemplars``).
``exemplar_gap`` (measured on validation: the median of pooled exemplar sim - text sim for the right tool) stands
in for the exemplars a tool registered after training does not have, so it is not ranked below tools with them
for lacking one. The router takes the weight, temperature and gap its gate model chose on its validation and
calibration lines (``slb.*``, training's ``calibrate_slb``): the fit and augment requests of every tool, ~4,900 rows
over 338 tools, lift held-out top-1 at N = 250 from 78 to ~90 % (docs/experiments/routing_experiments.md §14-17). A tool may
have an *alternate key* (``set_alt_keys``: another text of the tool, services/router/keys.py); then its
``text_sim`` is the max over its two keys. A tool may carry a *bias* (``set_tool_bias``: a calibrated addend fitted
on its exemplar requests, §18; a tool without one adds 0). ``search`` may add a per-tool ``bonus`` (the lexical
score).

Keys are quantized symmetric per vector to INT8 (``q = clip(rint(x * 127 / max|x|), -127, 127)``, scale
``max|x| / 127``); the query is quantized the same way and a row's score is
``float(int_dot(q_row, q_query)) * scale_row * scale_query``. The scan runs in the native module
``nexus_native.Int8Index`` when it is importable, else in ``NumpyInt8Index``, a reference with identical
semantics; ``int8_backend`` is the one seam between the two.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping

import numpy as np

log = logging.getLogger("nexus.router")


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-vector INT8 along the last axis; returns ``(q int8, scale float32)``.
    An all-zero vector quantizes to zeros with scale 0."""
    x = np.asarray(x, dtype=np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError("vector has a non-finite element (nan or inf)")
    maxabs = np.max(np.abs(x), axis=-1, keepdims=True).astype(np.float32)
    safe = np.where(maxabs == 0, np.float32(1), maxabs).astype(np.float32)
    inv = (np.float32(127.0) / safe).astype(np.float32)
    q = np.clip(np.rint((x * inv).astype(np.float32)), -127, 127).astype(np.int8)
    q = np.where(maxabs == 0, np.int8(0), q).astype(np.int8)
    return q, (maxabs / np.float32(127.0)).astype(np.float32)[..., 0]


class NumpyInt8Index:
    """Pure-numpy INT8 index with the scoring semantics of ``nexus_native.Int8Index`` (rows in id order)."""

    isa = "numpy"

    def __init__(self, dim: int):
        self.dim = dim
        self._q = np.zeros((0, dim), np.int8)
        self._scale = np.zeros(0, np.float32)

    def __len__(self) -> int:
        return len(self._scale)

    def add(self, vectors: np.ndarray) -> None:
        q, s = quantize_int8(np.asarray(vectors, np.float32).reshape(-1, self.dim))
        self._q = np.ascontiguousarray(np.vstack([self._q, q]))
        self._scale = np.concatenate([self._scale, s])

    def scores(self, query: np.ndarray) -> np.ndarray:
        q, qs = quantize_int8(np.asarray(query, np.float32).reshape(1, self.dim))
        dots = self._q.astype(np.int32) @ q[0].astype(np.int32)
        return (dots.astype(np.float32) * self._scale * qs[0]).astype(np.float32)


class _NativeInt8Index:
    """Adapter over ``nexus_native.Int8Index``: rows get ids 0..n-1 in insertion order; ``scores`` returns
    them in that order whatever the native row order."""

    def __init__(self, native_cls, dim: int):
        self._idx = native_cls(dim)
        self.dim = dim
        self.isa = str(self._idx.isa)
        self._n = 0
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        return self._n

    def add(self, vectors: np.ndarray) -> None:
        v = np.ascontiguousarray(np.asarray(vectors, np.float32).reshape(-1, self.dim))
        ids = np.arange(self._n, self._n + len(v), dtype=np.int64)
        self._idx.add(v, ids)
        self._n += len(v)
        row_ids = np.asarray(self._idx.ids(), np.int64)
        self._order = None if np.array_equal(row_ids, np.arange(self._n)) else np.argsort(row_ids)

    def scores(self, query: np.ndarray) -> np.ndarray:
        s = np.asarray(self._idx.scores(np.ascontiguousarray(query, dtype=np.float32)), np.float32)
        return s if self._order is None else s[self._order]


def pool_exemplars(sims: np.ndarray, starts: np.ndarray, temperature: float = 0.0,
                   counts: np.ndarray | None = None) -> np.ndarray:
    """Per group of consecutive entries along the last axis of ``sims`` (group g is ``[starts[g]:starts[g + 1]]``,
    the last one to the end; ``counts``: the group sizes, when the caller keeps them), the max
    (``temperature == 0``) or the log-mean-exp at ``temperature``; float32 like the scan."""
    best = np.maximum.reduceat(sims, starts, axis=-1)
    if temperature <= 0:
        return best
    if counts is None:
        counts = np.diff(np.append(starts, sims.shape[-1]))
    t = np.float32(temperature)
    e = np.exp((sims - np.repeat(best, counts, axis=-1)) / t)
    return (best + t * np.log(np.add.reduceat(e, starts, axis=-1) / counts)).astype(np.float32)


def int8_backend(dim: int, prefer_native: bool = True):
    """The INT8 scan: ``nexus_native.Int8Index`` when importable (and wanted), else the numpy reference.
    Both expose ``add(vectors)``, ``scores(query) -> float32[n]`` in insertion order, ``isa``, ``len``."""
    if prefer_native:
        try:
            from nexus_native import Int8Index  # type: ignore[import-not-found]

            return _NativeInt8Index(Int8Index, dim)
        except ImportError:
            pass
    return NumpyInt8Index(dim)


class _Snapshot:
    """An immutable built index: swapped in whole so readers never see a half-built one."""

    def __init__(self, dim: int, names: list[str], text: np.ndarray, exemplars: Mapping[str, np.ndarray],
                 exemplar_weight: float, prefer_native: bool, alt: Mapping[str, np.ndarray] | None = None,
                 exemplar_gap: float = 0.0, exemplar_temperature: float = 0.0,
                 tool_bias: Mapping[str, float] | None = None):
        self.names = names
        # per-tool addend in index order (None: none); a tool without one, e.g. registered after training, adds 0
        self.bias = (np.array([tool_bias.get(n, 0.0) for n in names], np.float32)
                     if tool_bias and any(n in tool_bias for n in names) else None)
        self.exemplar_gap = np.float32(exemplar_gap)
        self.exemplar_temperature = float(exemplar_temperature)
        self.pos = {n: i for i, n in enumerate(names)}
        self.text = np.ascontiguousarray(text, np.float32).reshape(len(names), dim)
        self.exemplar_weight = float(exemplar_weight)
        self.backend = int8_backend(dim, prefer_native)
        groups: list[int] = []
        ex_rows: list[np.ndarray] = []
        if self.exemplar_weight != 0.0:
            for name in names:  # grouped by tool, in tool order, for reduceat
                vecs = exemplars.get(name)
                if vecs is None or len(vecs) == 0:
                    continue
                vecs = np.asarray(vecs, np.float32).reshape(-1, dim)
                ex_rows.append(vecs)
                groups.extend([self.pos[name]] * len(vecs))
        if names:
            self.backend.add(self.text)
        self.n_exemplars = len(groups)
        if groups:
            self.backend.add(np.vstack(ex_rows))
            g = np.asarray(groups, np.int64)
            self.ex_tools = np.unique(g)
            self.ex_starts = np.searchsorted(g, self.ex_tools)
            self.ex_counts = np.diff(np.append(self.ex_starts, len(g)))
        # alternate keys: n rows after the exemplars, a tool without one repeats its text key
        self.has_alt = bool(alt) and bool(names)
        if self.has_alt:
            assert alt is not None
            self.backend.add(np.vstack([np.asarray(alt[n], np.float32).reshape(1, dim) if n in alt
                                        else self.text[i : i + 1] for i, n in enumerate(names)]))

    def tool_scores(self, query: np.ndarray) -> np.ndarray:
        s = self.backend.scores(query)
        n = len(self.names)
        text = s[:n]
        if self.has_alt:
            text = np.maximum(text, s[n + self.n_exemplars : 2 * n + self.n_exemplars])
        if self.n_exemplars == 0:
            return text if self.bias is None else text + self.bias
        best = text + self.exemplar_gap
        best[self.ex_tools] = pool_exemplars(s[n : n + self.n_exemplars], self.ex_starts, self.exemplar_temperature,
                                             self.ex_counts)
        out = text + self.exemplar_weight * best
        return out if self.bias is None else out + self.bias


class SemanticIndex:
    """Tool keys by name; ``search`` returns the top-k tools by (INT8) score. Thread-safe: builds are
    serialised and swapped in atomically; searches read one consistent snapshot."""

    def __init__(self, dim: int, exemplar_weight: float = 0.0, prefer_native: bool = True, exemplar_gap: float = 0.0,
                 exemplar_temperature: float = 0.0):
        if exemplar_temperature < 0:
            raise ValueError(f"exemplar_temperature must be >= 0, got {exemplar_temperature}")
        self.dim = dim
        self.exemplar_weight = float(exemplar_weight)
        self.exemplar_gap = float(exemplar_gap)
        self.exemplar_temperature = float(exemplar_temperature)
        self.prefer_native = prefer_native
        self._exemplars: dict[str, np.ndarray] = {}
        self._alt: dict[str, np.ndarray] = {}
        self._bias: dict[str, float] = {}
        self._lock = threading.Lock()
        self._snap = _Snapshot(dim, [], np.zeros((0, dim), np.float32), {}, 0.0, prefer_native)

    def __len__(self) -> int:
        return len(self._snap.names)

    @property
    def backend_name(self) -> str:
        return self._snap.backend.isa

    def names(self) -> list[str]:
        return list(self._snap.names)

    def __contains__(self, name: str) -> bool:
        return name in self._snap.pos

    def vector(self, name: str) -> np.ndarray:
        """The float text key of a tool (``KeyError`` if absent)."""
        snap = self._snap
        return snap.text[snap.pos[name]]

    def _build(self, names: list[str], text: np.ndarray) -> _Snapshot:
        """A snapshot of ``names`` / ``text`` keys with the current exemplars, alternate keys and scoring (under
        ``_lock``)."""
        return _Snapshot(self.dim, names, text, self._exemplars, self.exemplar_weight, self.prefer_native, self._alt,
                         self.exemplar_gap, self.exemplar_temperature, self._bias)

    def set_exemplars(self, exemplars: Mapping[str, np.ndarray]) -> None:
        """Exemplar keys per tool name (used from the next build on; tools not registered are ignored)."""
        with self._lock:
            self._exemplars = {k: np.asarray(v, np.float32).reshape(-1, self.dim) for k, v in exemplars.items()}
            self._snap = self._build(self._snap.names, self._snap.text)

    def set_tool_bias(self, bias: Mapping[str, float]) -> None:
        """A score addend per tool name (the calibration's ``tool_bias``); tools not named add 0, ``{}`` clears."""
        bad = [n for n, b in bias.items() if not np.isfinite(b)]
        if bad:
            raise ValueError(f"tool bias of {bad[0]!r} is not finite")
        with self._lock:
            self._bias = {k: float(v) for k, v in bias.items()}
            self._snap = self._build(self._snap.names, self._snap.text)

    def set_alt_keys(self, alt: Mapping[str, np.ndarray]) -> None:
        """Alternate keys per tool name (a tool then scores the max of its two keys); ``{}`` turns them off."""
        for n, v in alt.items():
            if np.asarray(v).size != self.dim:
                raise ValueError(f"alternate key of {n!r} has {np.asarray(v).size} values, expected {self.dim}")
        with self._lock:
            self._alt = {k: np.asarray(v, np.float32).reshape(self.dim) for k, v in alt.items()}
            self._snap = self._build(self._snap.names, self._snap.text)

    def replace_all(self, items: Mapping[str, np.ndarray], exemplars: Mapping[str, np.ndarray] | None = None,
                    bias: Mapping[str, float] | None = None) -> None:
        """Rebuild from ``{name: text key}`` (the registry's order is kept); ``exemplars`` / ``bias``, when given,
        replace the exemplar keys / tool biases in the same build (the router's, re-keyed to the registry's names
        at every load)."""
        if bias is not None:
            bad = [n for n, b in bias.items() if not np.isfinite(b)]
            if bad:
                raise ValueError(f"tool bias of {bad[0]!r} is not finite")
        names = list(items)
        for n, v in items.items():
            if np.asarray(v).size != self.dim:
                raise ValueError(f"key of {n!r} has {np.asarray(v).size} values, expected {self.dim}")
        text = (np.vstack([np.asarray(items[n], np.float32).reshape(1, self.dim) for n in names])
                if names else np.zeros((0, self.dim), np.float32))
        with self._lock:
            if exemplars is not None:
                self._exemplars = {k: np.asarray(v, np.float32).reshape(-1, self.dim) for k, v in exemplars.items()}
            if bias is not None:
                self._bias = {k: float(v) for k, v in bias.items()}
            self._snap = self._build(names, text)

    def upsert(self, items: Mapping[str, np.ndarray]) -> None:
        with self._lock:
            snap = self._snap
            current = {n: snap.text[i] for i, n in enumerate(snap.names)}
        current.update(items)
        self.replace_all(current)

    def remove(self, names: Iterable[str]) -> None:
        drop = set(names)
        with self._lock:
            snap = self._snap
            current = {n: snap.text[i] for i, n in enumerate(snap.names) if n not in drop}
        self.replace_all(current)

    def scores(self, query: np.ndarray) -> tuple[list[str], np.ndarray]:
        """Every tool's score for ``query`` (names in index order)."""
        snap = self._snap
        if not snap.names:
            return [], np.zeros(0, np.float32)
        return snap.names, snap.tool_scores(np.asarray(query, np.float32).reshape(self.dim))

    def search(self, query: np.ndarray, k: int, allowed: np.ndarray | None = None,
               bonus: np.ndarray | None = None) -> list[tuple[str, float]]:
        """Top-``k`` tools, best first (ties: registry order). ``allowed``: optional boolean mask over the
        index order restricting the candidates (used by the evaluation's per-query registries); ``bonus``:
        optional per-tool addend in index order (the weighted lexical score)."""
        names, s = self.scores(query)
        if not names or k <= 0:
            return []
        if bonus is not None and len(bonus) == len(s):  # (a registry swap in between: skip the addend)
            s = s + np.asarray(bonus, np.float32)
        if allowed is not None:
            s = np.where(allowed, s, -np.inf)
            k = min(k, int(np.count_nonzero(allowed)))
        k = min(k, len(names))
        if k <= 0:
            return []
        top = np.argpartition(-s, k - 1)[:k]
        top = top[np.lexsort((top, -s[top]))]
        return [(names[i], float(s[i])) for i in top]
