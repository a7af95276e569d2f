"""Pure-Python / numpy reference implementations of every native kernel.

They define the expected behaviour bit for bit where the native code promises it (quantisation, scan
scores and order, the .atb encoding, state blobs, RoPE rotation given a cos/sin table, buddy and
radix policies) and are what the parity tests in ``tests/native`` compare against. They are slow on
purpose: clarity over speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------------
# INT8 SLB
# ---------------------------------------------------------------------------------------------------


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-vector INT8 along the last axis: q = clip(rint(x * (127 / max|x|)), -127, 127)."""
    x = np.asarray(x, dtype=np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError("vector has a non-finite element (nan or inf)")
    maxabs = np.max(np.abs(x), axis=-1, keepdims=True).astype(np.float32)
    # tiny (subnormal-range) vectors are first scaled by an exact 2^64 so 127 / max|x| stays finite
    pre = np.where(maxabs < np.float32(1e-30), np.float32(2.0**64), np.float32(1)).astype(np.float32)
    safe = np.where(maxabs == 0, np.float32(1), maxabs * pre).astype(np.float32)
    inv = (np.float32(127.0) / safe).astype(np.float32)
    q = np.clip(np.rint(((x * pre).astype(np.float32) * inv).astype(np.float32)), -127, 127).astype(np.int8)
    q = np.where(maxabs == 0, np.int8(0), q).astype(np.int8)
    scale = (maxabs / np.float32(127.0)).astype(np.float32)[..., 0]
    return q, scale


class Int8IndexRef:
    """Reference SLB: same ids, same swap-with-last removal, same score formula and tie order."""

    def __init__(self, dim: int) -> None:
        if not 1 <= dim <= 65536:
            raise ValueError("dim must be in [1, 65536]")
        self.dim = dim
        self.q = np.zeros((0, dim), np.int8)
        self.scale = np.zeros(0, np.float32)
        self.ids = np.zeros(0, np.int64)
        self.next_id = 0

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, vectors: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
        x = np.asarray(vectors, np.float32).reshape(-1, self.dim)
        if ids is None:
            ids = np.arange(self.next_id, self.next_id + len(x), dtype=np.int64)
        ids = np.asarray(ids, np.int64)
        if len(set(ids.tolist())) != len(ids) or set(ids.tolist()) & set(self.ids.tolist()):
            raise ValueError("duplicate id")
        q, s = quantize_int8(x)
        self.q = np.concatenate([self.q, q])
        self.scale = np.concatenate([self.scale, s])
        self.ids = np.concatenate([self.ids, ids])
        if len(ids):
            self.next_id = max(self.next_id, int(ids.max()) + 1)
        return ids

    def replace(self, id_: int, vector: np.ndarray) -> None:
        (r,) = np.nonzero(self.ids == id_)[0]
        q, s = quantize_int8(np.asarray(vector, np.float32)[None])
        self.q[r], self.scale[r] = q[0], s[0]

    def remove(self, id_: int) -> None:
        (r,) = np.nonzero(self.ids == id_)[0]
        last = len(self.ids) - 1
        for a in ("q", "scale", "ids"):
            arr = getattr(self, a)
            arr[r] = arr[last]
            setattr(self, a, arr[:last].copy())

    def scores(self, query: np.ndarray) -> np.ndarray:
        q, qs = quantize_int8(np.asarray(query, np.float32)[None])
        dots = self.q.astype(np.int32) @ q[0].astype(np.int32)
        return (dots.astype(np.float32) * self.scale * qs[0]).astype(np.float32)

    def search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k < 0:
            raise ValueError("k must be >= 0")
        s = self.scores(query)
        order = np.lexsort((self.ids, -s))[: min(k, len(s))]
        return self.ids[order], s[order]


# ---------------------------------------------------------------------------------------------------
# .atb codec
# ---------------------------------------------------------------------------------------------------

ATB_MAGIC = b"\x89ATB\r\n\x1a\n"
ATB_VERSION = 1
ATB_HEADER_SIZE = 128
GGML_TYPE_F16 = 1
ROPE_NORM, ROPE_NEOX = 0, 2
V_ROWS, V_TRANSPOSED = 0, 1
# magic, version, header_size, flags, fingerprint, n_tokens, anchor, token_hash, rope_type, n_rot,
# freq_base, freq_scale, n_ctx_orig, ext_factor, attn_factor, beta_fast, beta_slow, freq_factors_crc,
# n_layer, n_head_kv, head_dim, k_type, v_type, v_layout, align_log2, data_offset, plane_stride,
# payload_crc, header_crc
ATB_HEADER = struct.Struct("<8sHHI16sIiQIIffIffffIIIIBBBBQQII")
assert ATB_HEADER.size == ATB_HEADER_SIZE
ATB_FIELDS = (
    "magic version header_size flags fingerprint n_tokens anchor token_hash rope_type n_rot freq_base "
    "freq_scale n_ctx_orig ext_factor attn_factor beta_fast beta_slow freq_factors_crc n_layer n_head_kv "
    "head_dim k_type v_type v_layout align_log2 data_offset plane_stride payload_crc header_crc"
).split()
SPEC_FIELDS = (
    "fingerprint n_layer n_head_kv head_dim n_rot rope_type freq_base freq_scale n_ctx_orig ext_factor "
    "attn_factor beta_fast beta_slow"
).split()


def _round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def freq_factors_crc(freq_factors: np.ndarray | None) -> int:
    if freq_factors is None or len(freq_factors) == 0:
        return 0
    return zlib.crc32(np.asarray(freq_factors, "<f4").tobytes())


def encode_atb(
    spec: dict[str, Any],
    k: np.ndarray,
    v: np.ndarray,
    anchor: int,
    token_hash: int = 0,
    v_layout: int = V_ROWS,
    align_log2: int = 21,
) -> bytes:
    """Encode planes (k: (L, T, E) float16, v: (L, T, E) or (L, E, T)) as an .atb byte string."""
    k = np.ascontiguousarray(k, np.float16)
    v = np.ascontiguousarray(v, np.float16)
    n_layer, n_tokens = k.shape[0], k.shape[1]
    align = 1 << align_log2
    plane_bytes = k[0].nbytes
    data_offset = _round_up(ATB_HEADER_SIZE, align)
    stride = _round_up(plane_bytes, align)
    size = data_offset + (2 * n_layer - 1) * stride + plane_bytes
    out = bytearray(size)
    crc = 0
    for layer in range(n_layer):
        for j, arr in enumerate((k[layer], v[layer])):
            off = data_offset + (2 * layer + j) * stride
            out[off : off + plane_bytes] = arr.tobytes()
            crc = zlib.crc32(arr.tobytes(), crc)
    f = spec
    fields = [
        ATB_MAGIC, ATB_VERSION, ATB_HEADER_SIZE, 0, f["fingerprint"], n_tokens, anchor, token_hash,
        int(f["rope_type"]), f["n_rot"], f["freq_base"], f["freq_scale"], f["n_ctx_orig"], f["ext_factor"],
        f["attn_factor"], f["beta_fast"], f["beta_slow"], freq_factors_crc(f.get("freq_factors")), n_layer,
        f["n_head_kv"], f["head_dim"], GGML_TYPE_F16, GGML_TYPE_F16, v_layout, align_log2, data_offset, stride,
        crc, 0,
    ]  # fmt: skip
    head = bytearray(ATB_HEADER.pack(*fields))
    struct.pack_into("<I", head, 124, zlib.crc32(bytes(head[:124])))
    out[:ATB_HEADER_SIZE] = head
    return bytes(out)


def parse_atb_header(data: bytes) -> dict[str, Any]:
    """Structural header validation, as the native reader does it. Raises ValueError."""
    if len(data) < ATB_HEADER_SIZE:
        raise ValueError("truncated header")
    h = dict(zip(ATB_FIELDS, ATB_HEADER.unpack_from(data, 0), strict=True))
    if h["magic"] != ATB_MAGIC:
        raise ValueError("bad magic")
    if h["version"] != ATB_VERSION:
        raise ValueError("unsupported version")
    if h["header_size"] != ATB_HEADER_SIZE:
        raise ValueError("header_size")
    if zlib.crc32(bytes(data[:124])) != h["header_crc"]:
        raise ValueError("header checksum mismatch")
    if h["flags"]:
        raise ValueError("unknown flags")
    if not (1 <= h["n_layer"] <= 4096 and 1 <= h["n_head_kv"] <= 4096):
        raise ValueError("geometry")
    if not (2 <= h["head_dim"] <= 8192 and h["head_dim"] % 2 == 0):
        raise ValueError("head_dim")
    if not (2 <= h["n_rot"] <= h["head_dim"] and h["n_rot"] % 2 == 0):
        raise ValueError("n_rot")
    if h["rope_type"] not in (ROPE_NORM, ROPE_NEOX):
        raise ValueError("rope_type")
    for name in ("freq_base", "freq_scale"):
        if not (math.isfinite(h[name]) and h[name] > 0):
            raise ValueError(name)
    for name in ("ext_factor", "attn_factor", "beta_fast", "beta_slow"):
        if not math.isfinite(h[name]):
            raise ValueError(name)
    if not 1 <= h["n_tokens"] <= 1 << 24:
        raise ValueError("n_tokens")
    if h["anchor"] < 0 or h["anchor"] + h["n_tokens"] - 1 > 2**31 - 1:
        raise ValueError("anchor")
    if h["k_type"] != GGML_TYPE_F16 or h["v_type"] != GGML_TYPE_F16:
        raise ValueError("dtype")
    if h["v_layout"] not in (V_ROWS, V_TRANSPOSED):
        raise ValueError("v_layout")
    if not 6 <= h["align_log2"] <= 21:
        raise ValueError("alignment")
    align = 1 << h["align_log2"]
    h["plane_bytes"] = h["n_tokens"] * h["n_head_kv"] * h["head_dim"] * 2
    if h["data_offset"] != _round_up(ATB_HEADER_SIZE, align):
        raise ValueError("data offset")
    if h["plane_stride"] != _round_up(h["plane_bytes"], align):
        raise ValueError("plane stride")
    h["file_size"] = h["data_offset"] + (2 * h["n_layer"] - 1) * h["plane_stride"] + h["plane_bytes"]
    if h["file_size"] > 1 << 40:
        raise ValueError("block too large")
    if len(data) != h["file_size"]:
        raise ValueError("size mismatch")
    return h


def decode_atb(data: bytes, expect: dict[str, Any]) -> dict[str, Any]:
    """Full validation + decode. Raises ValueError (malformed) or LookupError-free ValueError (mismatch)."""
    h = parse_atb_header(data)
    for name in SPEC_FIELDS:
        a, b = h[name], expect[name]
        if isinstance(a, float):
            a, b = struct.pack("<f", a), struct.pack("<f", b)
        if a != b:
            raise ValueError(f"mismatch: {name}")
    if h["freq_factors_crc"] != freq_factors_crc(expect.get("freq_factors")):
        raise ValueError("mismatch: freq_factors")
    L, T, E = h["n_layer"], h["n_tokens"], h["n_head_kv"] * h["head_dim"]
    crc = 0
    planes = []
    for p in range(2 * L):
        off = h["data_offset"] + p * h["plane_stride"]
        raw = bytes(data[off : off + h["plane_bytes"]])
        crc = zlib.crc32(raw, crc)
        planes.append(np.frombuffer(raw, np.float16))
    if crc != h["payload_crc"]:
        raise ValueError("payload checksum mismatch")
    k = np.stack([planes[2 * i].reshape(T, E) for i in range(L)])
    vshape = (E, T) if h["v_layout"] == V_TRANSPOSED else (T, E)
    v = np.stack([planes[2 * i + 1].reshape(vshape) for i in range(L)])
    return {"header": h, "k": k, "v": v}


# ---------------------------------------------------------------------------------------------------
# RoPE (ggml-cpu ops.cpp: ggml_rope_cache_init / rope_yarn / rotate_pairs, float32 throughout)
# ---------------------------------------------------------------------------------------------------

f32 = np.float32


def _libm_f32() -> tuple[Any, Any, Any, Any]:
    """The C library's float functions (what ggml and the native code call), else Python's math."""
    name = ctypes.util.find_library("m")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        lib = None
    if lib is None:
        return (
            (lambda a, b: f32(math.pow(a, b))),
            (lambda a: f32(math.cos(a))),
            (lambda a: f32(math.sin(a))),
            (lambda a: f32(math.log(a))),
        )
    fns = []
    for fname, nargs in (("powf", 2), ("cosf", 1), ("sinf", 1), ("logf", 1)):
        fn = getattr(lib, fname)
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float] * nargs
        fns.append(lambda *a, _fn=fn: f32(_fn(*(float(x) for x in a))))
    return tuple(fns)  # type: ignore[return-value]


_powf, _cosf, _sinf, _logf = _libm_f32()


def rope_cache(spec: dict[str, Any], delta: int, fma: bool = True) -> np.ndarray:
    """cos/sin table for a rotation by ``delta``, float32 step by step like ggml's rope_cache_init,
    with the C library's powf/cosf/sinf/logf (``fma``: contract the two YaRN terms like an FMA build)."""
    n_dims = int(spec["n_rot"])
    base, scale = f32(spec["freq_base"]), f32(spec["freq_scale"])
    ext, attn = f32(spec["ext_factor"]), f32(spec["attn_factor"])
    theta_scale = _powf(base, f32(-2.0) / f32(n_dims))

    def corr_dim(n_rot: float) -> float:
        n_ctx = f32(spec["n_ctx_orig"])
        num = f32(f32(n_dims) * _logf(f32(n_ctx / f32(f32(f32(n_rot) * f32(2)) * f32(math.pi)))))
        return f32(num / f32(f32(2) * _logf(base)))

    if ext != 0:
        low = max(f32(0), f32(math.floor(corr_dim(spec["beta_fast"]))))
        high = min(f32(n_dims - 1), f32(math.ceil(corr_dim(spec["beta_slow"]))))
    ff = spec.get("freq_factors")
    out = np.zeros(n_dims, np.float32)
    theta = f32(delta)
    for i0 in range(0, n_dims, 2):
        extrap = f32(theta / f32(ff[i0 // 2])) if ff is not None else f32(theta / f32(1))
        interp = f32(scale * extrap)
        th, mscale = interp, attn
        if ext != 0:
            y = f32(f32(i0 // 2 - low) / max(f32(0.001), f32(high - low)))
            ramp = f32(f32(1) - min(f32(1), max(f32(0), y)))
            mix = f32(ramp * ext)
            lg = _logf(f32(f32(1) / scale))
            if fma:
                th = fma_f32(np.array([interp]), np.array([f32(1 - mix)]), np.array([f32(extrap * mix)]))[0]
                mscale = f32(mscale * fma_f32(np.array([f32(0.1)]), np.array([lg]), np.array([f32(1)]))[0])
            else:
                th = f32(f32(interp * f32(1 - mix)) + f32(extrap * mix))
                mscale = f32(mscale * f32(f32(1) + f32(f32(0.1) * lg)))
        out[i0] = f32(_cosf(th) * mscale)
        out[i0 + 1] = f32(_sinf(th) * mscale)
        theta = f32(theta * theta_scale)
    return out


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Correctly rounded float32 fused multiply-add, elementwise, in numpy.

    a*b is exact in float64; the float64 sum is rounded once more, so the rare sums that land exactly
    on a float32 midpoint are corrected with the exact TwoSum error term (no double rounding)."""
    a64, b64, c64 = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a64 * b64
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    r = s.astype(np.float32)
    bits = s.view(np.uint64)
    mid = ((bits & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)) & (err != 0)
    if np.any(mid):
        up = np.nextafter(r, np.float32(np.inf))
        down = np.nextafter(r, np.float32(-np.inf))
        r64 = r.astype(np.float64)
        fix_up = mid & (err > 0) & (r64 < s)
        fix_down = mid & (err < 0) & (r64 > s)
        r = np.where(fix_up, up, np.where(fix_down, down, r))
    return r.astype(np.float32)


def rope_rotate(
    k: np.ndarray, cache: np.ndarray, head_dim: int, n_rot: int, rope_type: int, fma: bool = True
) -> np.ndarray:
    """Rotated copy of float16 head vectors (any shape, size % head_dim == 0) with a given cache.

    ggml's rotate_pairs: y0 = x0*c - x1*s, y1 = x0*s + x1*c, rounded like an FMA build when ``fma``
    (y0 = fma(x0, c, -(x1*s)), y1 = fma(x0, s, x1*c)), else every operation rounded separately."""
    src = np.asarray(k, np.float16).reshape(-1, head_dim)
    x = src.astype(np.float32)
    y = x.copy()
    c, s = cache[0::2].astype(np.float32), cache[1::2].astype(np.float32)
    if rope_type == ROPE_NORM:
        i0, i1 = np.arange(0, n_rot, 2), np.arange(1, n_rot, 2)
    else:
        i0, i1 = np.arange(n_rot // 2), np.arange(n_rot // 2, n_rot)
    x0, x1 = x[:, i0], x[:, i1]
    if fma:
        y[:, i0] = fma_f32(x0, np.broadcast_to(c, x0.shape), -(x1 * s))
        y[:, i1] = fma_f32(x0, np.broadcast_to(s, x0.shape), x1 * c)
    else:
        y[:, i0] = x0 * c - x1 * s
        y[:, i1] = x0 * s + x1 * c
    out = y.astype(np.float16)
    out[:, n_rot:] = src[:, n_rot:]
    return out.reshape(np.shape(k))


# ---------------------------------------------------------------------------------------------------
# llama.cpp sequence-state blobs (llama-kv-cache.cpp state_write / state_read)
# ---------------------------------------------------------------------------------------------------


STATE_IO_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic, first u32 of every sequence-state blob


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.d, self.o = memoryview(bytes(data)), 0

    def get(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        if self.o + n > len(self.d):
            raise ValueError("truncated")
        (v,) = struct.unpack_from(fmt, self.d, self.o)
        self.o += n
        return v

    def take(self, n: int) -> bytes:
        if n < 0 or self.o + n > len(self.d):
            raise ValueError("truncated")
        b = bytes(self.d[self.o : self.o + n])
        self.o += n
        return b


def parse_state(blob: bytes) -> dict[str, Any]:
    """Parse a single-sequence state blob into positions, v_trans and per-layer raw planes."""
    r = _Reader(blob)
    if r.get("<I") != STATE_IO_MAGIC:
        raise ValueError("bad magic")
    seq = r.get("<i")
    n_stream = r.get("<I")
    if not 1 <= n_stream <= 4096:
        raise ValueError("n_stream")
    out: dict[str, Any] = {
        "seq_id": seq,
        "n_stream": n_stream,
        "cell_count": 0,
        "positions": [],
        "k": [],
        "v": [],
    }
    for s in range(n_stream):
        cells = r.get("<I")
        if cells == 0:
            continue
        if out["cell_count"]:
            raise ValueError("more than one stream")
        out.update(stream=s, cell_count=cells)
        for _ in range(cells):
            out["positions"].append(r.get("<i"))
            n_seq = r.get("<I")
            if n_seq > 4096:
                raise ValueError("n_seq_id")
            r.take(4 * n_seq)
        v_trans = r.get("<I")
        if v_trans > 1:
            raise ValueError("v_trans")
        n_layer = r.get("<I")
        if not 1 <= n_layer <= 4096:
            raise ValueError("n_layer")
        out.update(v_trans=bool(v_trans), n_layer=n_layer)
        for _ in range(n_layer):
            t, row = r.get("<i"), r.get("<Q")
            if row == 0:
                raise ValueError("row size")
            out["k"].append((t, row, r.take(row * cells)))
        for _ in range(n_layer):
            t = r.get("<i")
            if not v_trans:
                row = r.get("<Q")
                if row == 0:
                    raise ValueError("row size")
                out["v"].append((t, row, r.take(row * cells)))
            else:
                el, ne = r.get("<I"), r.get("<I")
                if el == 0 or ne == 0:
                    raise ValueError("V geometry")
                out["v"].append((t, (el, ne), r.take(el * ne * cells)))
    if r.o != len(r.d):
        raise ValueError("trailing bytes")
    return out


def atb_from_state(blob: bytes, n_embd: int, n_layer: int) -> dict[str, Any]:
    """Blob -> {anchor, k (L,T,E), v, v_layout}; cells ordered by position, which must be contiguous."""
    st = parse_state(blob)
    if st["cell_count"] == 0:
        raise ValueError("empty")
    if st["n_layer"] != n_layer:
        raise ValueError("n_layer")
    pos = np.asarray(st["positions"], np.int64)
    order = np.argsort(pos, kind="stable")
    m0 = int(pos[order[0]])
    if m0 < 0 or not np.array_equal(pos[order], m0 + np.arange(len(pos))):
        raise ValueError("positions not contiguous")
    T = len(pos)
    ks, vs = [], []
    for (kt, krow, kb), (vt, vgeo, vb) in zip(st["k"], st["v"], strict=True):
        if kt != GGML_TYPE_F16 or vt != GGML_TYPE_F16 or krow != 2 * n_embd:
            raise ValueError("K geometry/type")
        ks.append(np.frombuffer(kb, np.float16).reshape(T, n_embd)[order])
        if st["v_trans"]:
            if vgeo != (2, n_embd):
                raise ValueError("V geometry")
            vs.append(np.frombuffer(vb, np.float16).reshape(n_embd, T)[:, order])
        else:
            if vgeo != 2 * n_embd:
                raise ValueError("V geometry")
            vs.append(np.frombuffer(vb, np.float16).reshape(T, n_embd)[order])
    return {
        "anchor": m0,
        "k": np.stack(ks),
        "v": np.stack(vs),
        "v_layout": V_TRANSPOSED if st["v_trans"] else V_ROWS,
    }


def state_from_atb(
    k: np.ndarray,
    v: np.ndarray,
    v_layout: int,
    position: int,
    *,
    v_trans: bool,
    n_stream: int = 1,
    seq_id: int = 0,
) -> bytes:
    """Planes (K already rotated as wanted) -> llama.cpp single-sequence state blob."""
    k = np.ascontiguousarray(k, np.float16)
    L, T, E = k.shape
    out = bytearray(struct.pack("<IiII", STATE_IO_MAGIC, seq_id, n_stream, T))
    for i in range(T):
        out += struct.pack("<iIi", position + i, 1, seq_id)
    out += struct.pack("<II", int(v_trans), L)
    for layer in range(L):
        out += struct.pack("<iQ", GGML_TYPE_F16, 2 * E) + k[layer].tobytes()
    for layer in range(L):
        rows = v[layer] if v_layout == V_ROWS else v[layer].T  # (T, E)
        if v_trans:
            out += (
                struct.pack("<iII", GGML_TYPE_F16, 2, E) + np.ascontiguousarray(rows.T, np.float16).tobytes()
            )
        else:
            out += struct.pack("<iQ", GGML_TYPE_F16, 2 * E) + np.ascontiguousarray(rows, np.float16).tobytes()
    out += b"\0\0\0\0" * (n_stream - 1)
    return bytes(out)


# ---------------------------------------------------------------------------------------------------
# Buddy allocator (same free-list discipline as the native one: LIFO lists, left half kept on split)
# ---------------------------------------------------------------------------------------------------


class BuddyRef:
    def __init__(self, arena_bytes: int, min_block: int = 4096) -> None:
        assert arena_bytes & (arena_bytes - 1) == 0 and min_block & (min_block - 1) == 0
        self.min_block = min_block
        self.n_orders = (arena_bytes // min_block).bit_length()
        self.free_lists: list[list[int]] = [[] for _ in range(self.n_orders)]  # unit indices, head = end
        self.free_lists[-1].append(0)
        self.allocated: dict[int, int] = {}  # unit -> order

    def _order(self, size: int) -> int:
        o = 0
        while (self.min_block << o) < size:
            o += 1
        return o

    def alloc(self, size: int) -> int | None:
        want = self._order(size)
        if want >= self.n_orders:
            raise ValueError("too large")
        o = want
        while o < self.n_orders and not self.free_lists[o]:
            o += 1
        if o >= self.n_orders:
            return None
        idx = self.free_lists[o].pop()
        while o > want:
            o -= 1
            self.free_lists[o].append(idx + (1 << o))
        self.allocated[idx] = want
        return idx * self.min_block

    def free(self, offset: int) -> None:
        idx = offset // self.min_block
        if offset % self.min_block or idx not in self.allocated:
            raise ValueError("not allocated")
        o = self.allocated.pop(idx)
        while o + 1 < self.n_orders:
            buddy = idx ^ (1 << o)
            if buddy in self.free_lists[o]:
                self.free_lists[o].remove(buddy)
                idx = min(idx, buddy)
                o += 1
            else:
                break
        self.free_lists[o].append(idx)

    @property
    def free_bytes(self) -> int:
        return sum(len(lst) * (self.min_block << o) for o, lst in enumerate(self.free_lists))

    def free_blocks_per_order(self) -> list[int]:
        return [len(lst) for lst in self.free_lists]


# ---------------------------------------------------------------------------------------------------
# L0 radix arena (linear LCP over the slots; same slot choice, LRU and tie rules as the native tree)
# ---------------------------------------------------------------------------------------------------


@dataclass
class RadixRef:
    max_tokens: int = 8192
    n_slots: int = 32
    tokens: list[list[int] | None] = field(default_factory=lambda: [None] * 32)
    values: list[int] = field(default_factory=lambda: [0] * 32)
    stamps: list[int] = field(default_factory=lambda: [0] * 32)
    clock: int = 0

    @staticmethod
    def _lcp(a: list[int], b: list[int]) -> int:
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        return n

    def lookup(self, t: list[int], touch: bool = True) -> tuple[int, int]:
        best, best_len = -1, 0
        for s, seq in enumerate(self.tokens):
            if seq is None:
                continue
            n = self._lcp(seq, t)
            if n > best_len or (n == best_len and n > 0 and self.stamps[s] > self.stamps[best]):
                best, best_len = s, n
        if best >= 0 and touch:
            self.clock += 1
            self.stamps[best] = self.clock
        return best, best_len

    def insert(self, t: list[int], value: int = 0) -> tuple[int, int, bool]:
        if not t or len(t) > self.max_tokens:
            raise ValueError("bad length")
        for s, seq in enumerate(self.tokens):
            if seq == list(t):
                self.values[s] = value
                self.clock += 1
                self.stamps[s] = self.clock
                return s, -1, True
        evicted = -1
        free = [s for s, seq in enumerate(self.tokens) if seq is None]
        if free:
            slot = free[0]
        else:
            slot = min(range(self.n_slots), key=lambda s: self.stamps[s])
            evicted = slot
        self.tokens[slot] = list(t)
        self.values[slot] = value
        self.clock += 1
        self.stamps[slot] = self.clock
        return slot, evicted, False

    def remove(self, slot: int) -> None:
        if self.tokens[slot] is None:
            raise ValueError("empty slot")
        self.tokens[slot] = None

    def touch(self, slot: int) -> None:
        if self.tokens[slot] is None:
            raise ValueError("empty slot")
        self.clock += 1
        self.stamps[slot] = self.clock

    def lru_order(self) -> list[int]:
        occ = [s for s, seq in enumerate(self.tokens) if seq is not None]
        return sorted(occ, key=lambda s: self.stamps[s])
