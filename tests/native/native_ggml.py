"""ggml's own CPU RoPE (the kernel llama.cpp's K-shift runs), called through ctypes on the libggml
shipped inside llama-cpp-python: the ground truth for the reanchor parity tests."""

from __future__ import annotations

import ctypes
import os

import nexus_native as nn
import numpy as np

_vp = ctypes.c_void_p
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_I32 = 0, 1, 26


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class GgmlRope:
    def __init__(self) -> None:
        import llama_cpp

        libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
        base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
        cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"))
        base.ggml_init.restype, base.ggml_init.argtypes = _vp, [_InitParams]
        base.ggml_free.argtypes = [_vp]
        base.ggml_new_tensor_1d.restype, base.ggml_new_tensor_1d.argtypes = (
            _vp,
            [_vp, ctypes.c_int, ctypes.c_int64],
        )
        base.ggml_new_tensor_3d.restype = _vp
        base.ggml_new_tensor_3d.argtypes = [_vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
        base.ggml_rope_ext.restype = _vp
        base.ggml_rope_ext.argtypes = [_vp, _vp, _vp, _vp, ctypes.c_int, ctypes.c_int, ctypes.c_int] + [
            ctypes.c_float
        ] * 6
        base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = _vp, [_vp]
        base.ggml_build_forward_expand.argtypes = [_vp, _vp]
        base.ggml_get_data.restype, base.ggml_get_data.argtypes = _vp, [_vp]
        cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
        cpu.ggml_graph_compute_with_ctx.argtypes = [_vp, _vp, ctypes.c_int]
        self.base, self.cpu = base, cpu

    def _fill(self, tensor: int, arr: np.ndarray, ctype: type) -> None:
        ptr = ctypes.cast(self.base.ggml_get_data(tensor), ctypes.POINTER(ctype))
        np.ctypeslib.as_array(ptr, (arr.size,))[:] = arr.ravel()

    def rope(self, k: np.ndarray, delta: int, spec: nn.ModelSpec) -> np.ndarray:
        """ggml_rope_ext of float16 k (n_tokens, n_head, head_dim) by `delta` positions, like a K-shift."""
        T, H, D = k.shape
        ctx = self.base.ggml_init(_InitParams(k.nbytes * 4 + (16 << 20), None, False))
        try:
            a = self.base.ggml_new_tensor_3d(ctx, GGML_TYPE_F16, D, H, T)
            self._fill(a, np.ascontiguousarray(k, np.float16).view(np.uint16), ctypes.c_uint16)
            pos = self.base.ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T)
            self._fill(pos, np.full(T, delta, np.int32), ctypes.c_int32)
            ff = spec.freq_factors
            c = None
            if ff is not None:
                c = self.base.ggml_new_tensor_1d(ctx, GGML_TYPE_F32, len(ff))
                self._fill(c, ff.astype(np.float32), ctypes.c_float)
            out = self.base.ggml_rope_ext(
                ctx, a, pos, c, spec.n_rot, spec.rope_type.value, spec.n_ctx_orig, spec.freq_base,
                spec.freq_scale, spec.ext_factor, spec.attn_factor, spec.beta_fast, spec.beta_slow,
            )  # fmt: skip
            graph = self.base.ggml_new_graph(ctx)
            self.base.ggml_build_forward_expand(graph, out)
            if self.cpu.ggml_graph_compute_with_ctx(ctx, graph, 1) != 0:
                raise RuntimeError("ggml graph compute failed")
            ptr = ctypes.cast(self.base.ggml_get_data(out), ctypes.POINTER(ctypes.c_uint16))
            return np.ctypeslib.as_array(ptr, (T * H * D,)).copy().view(np.float16).reshape(T, H, D)
        finally:
            self.base.ggml_free(ctx)
