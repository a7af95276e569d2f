"""llama.cpp glue: a ``ModelSpec`` from a loaded llama-cpp-python model, a file fingerprint.

``llama_cpp`` is imported lazily, inside the functions, so ``import nexus_native`` never needs it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from typing import Any

from ._core import ModelSpec, RopeType


class UnsupportedModelError(ValueError):
    """The model uses a RoPE variant one ``ModelSpec`` cannot express (build the spec explicitly)."""

def gguf_fingerprint(path: str | os.PathLike[str]) -> bytes:
    """First 16 bytes of the SHA-256 of a model file: the 16-byte fingerprint stored in .atb headers."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.digest()[:16]


def _meta(model: Any, key: str) -> str | None:
    import llama_cpp

    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else None


def spec_from_llama(model: Any, ctx_params: Any = None, *, fingerprint: bytes) -> ModelSpec:
    """The runtime ``ModelSpec`` of a llama.cpp model (a ``llama_model_p``) under context params
    ``ctx_params`` (a ``llama_context_params``; None = defaults), resolved the way llama.cpp's
    llama_context constructor resolves cparams for plain / linearly scaled RoPE.

    Raises UnsupportedModelError for what a single ModelSpec cannot express or this helper does not
    resolve: M-RoPE / vision RoPE, YaRN, per-layer (SWA) RoPE bases. Build the ModelSpec by hand
    there. Models with a ``rope_freqs`` tensor (Llama 3.1 style) need ``freq_factors`` passed by hand
    too: this helper cannot see tensors and does not detect them.
    """
    import llama_cpp

    arch = _meta(model, "general.architecture") or ""
    rope = llama_cpp.llama_model_rope_type(model)
    if rope not in (llama_cpp.LLAMA_ROPE_TYPE_NORM, llama_cpp.LLAMA_ROPE_TYPE_NEOX):
        raise UnsupportedModelError(f"rope type {rope} of architecture {arch!r} is not NORM/NEOX")
    if (_meta(model, f"{arch}.rope.scaling.type") or "none") == "yarn":
        raise UnsupportedModelError("YaRN models: build the ModelSpec explicitly")
    if _meta(model, f"{arch}.rope.freq_base_swa") is not None:
        raise UnsupportedModelError("per-layer (SWA) RoPE bases cannot be expressed in one ModelSpec")
    n_head = llama_cpp.llama_model_n_head(model)
    n_embd = llama_cpp.llama_model_n_embd(model)
    head_dim = int(_meta(model, f"{arch}.attention.key_length") or n_embd // n_head)
    n_rot = int(_meta(model, f"{arch}.rope.dimension_count") or head_dim)
    p = ctx_params if ctx_params is not None else llama_cpp.llama_context_default_params()
    freq_base = p.rope_freq_base or float(_meta(model, f"{arch}.rope.freq_base") or 10000.0)
    scaling = _meta(model, f"{arch}.rope.scaling.type") or "none"
    if p.rope_freq_scale:
        freq_scale = p.rope_freq_scale
    elif scaling == "none":
        freq_scale = 1.0
    else:
        freq_scale = llama_cpp.llama_model_rope_freq_scale_train(model)
    if p.yarn_ext_factor > 0:
        raise UnsupportedModelError("yarn_ext_factor set in the context params: build the ModelSpec explicitly")
    attn = p.yarn_attn_factor if p.yarn_attn_factor >= 0 else 1.0
    attn *= float(_meta(model, f"{arch}.rope.scaling.attn_factor") or 1.0)
    n_ctx_orig = p.yarn_orig_ctx or int(
        _meta(model, f"{arch}.rope.scaling.original_context_length")
        or llama_cpp.llama_model_n_ctx_train(model)
    )
    return ModelSpec(
        fingerprint=fingerprint,
        n_layer=llama_cpp.llama_model_n_layer(model),
        n_head_kv=llama_cpp.llama_model_n_head_kv(model),
        head_dim=head_dim,
        n_rot=n_rot,
        rope_type=RopeType.NORM if rope == llama_cpp.LLAMA_ROPE_TYPE_NORM else RopeType.NEOX,
        freq_base=freq_base,
        freq_scale=freq_scale,
        n_ctx_orig=n_ctx_orig,
        ext_factor=0.0,
        attn_factor=attn,
        beta_fast=p.yarn_beta_fast if p.yarn_beta_fast >= 0 else 32.0,
        beta_slow=p.yarn_beta_slow if p.yarn_beta_slow >= 0 else 1.0,
    )
