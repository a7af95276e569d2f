"""The KV splice path: compiled ``.atb`` schema blocks transplanted into a live llama.cpp sequence.

Mechanics (DESIGN.md §4, paper §3.1 / §6.1), on one low-level llama.cpp context with a unified KV cache:

    compile_block(prelude, schema)   decode prelude+schema in the scratch sequence, drop the prelude cells,
                                     serialise the schema cells -> AtbBlock (anchor m0 = len(prelude))
    prefill(tokens)                  text prefill of the live sequence
    splice(block, n_past, R)         1. validate the block against the runtime model (ModelMismatch before
                                        anything is touched)
                                     2. block -> state blob with positions n_past.. and K re-rotated
                                        (native reanchor, fused in the copy) -> llama_state_seq_set_data(scratch)
                                     3. llama_memory_seq_cp(scratch -> live), llama_memory_seq_rm(scratch)
                                     4. invalidate and re-decode the contiguous trailing suffix of
                                        ceil(S * R / 100) schema tokens (depth-adaptive repair)
    logits()                         next-token logits of the last decoded position

Sequence ids: 0 live, 1 scratch, 2 and 3 free for callers (the evals keep a cached context / a reference
there). Domain code only: no protobuf.
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.common.errors import FailedPrecondition, InvalidArgument, ModelMismatch
from services.common.models import resolve_gguf

LIVE_SEQ = 0
SCRATCH_SEQ = 1

# R(n) defaults (paper §3.1 / issue 5)
SPLICE_THRESHOLD_M = 256
R_BASE_PCT = 5.0
FULL_RECOMPUTE_MULTIPLE_K = 4


def recompute_fraction(n_past: int, M: int = SPLICE_THRESHOLD_M, R_base: float = R_BASE_PCT,
                       K: float = FULL_RECOMPUTE_MULTIPLE_K) -> float:
    """Depth-adaptive recompute fraction R(n_past) in percent.

    R = R_base for n_past <= M, else R_base + (n_past - M) / (M (K - 1)) * (100 - R_base), clamped to 100.
    """
    if M <= 0 or K <= 1:
        raise InvalidArgument(f"recompute_fraction needs M > 0 and K > 1 (got M={M}, K={K})")
    if n_past <= M:
        r = R_base
    else:
        r = R_base + (n_past - M) / (M * (K - 1)) * (100.0 - R_base)
    return float(min(100.0, max(0.0, r)))


def recompute_tokens(n_tokens: int, recompute_pct: float) -> int:
    """ceil(S * R / 100), clamped to [0, S]."""
    if not 0.0 <= recompute_pct <= 100.0:
        raise InvalidArgument(f"recompute_pct must be in [0, 100], got {recompute_pct}")
    return min(n_tokens, int(math.ceil(n_tokens * recompute_pct / 100.0 - 1e-9)))


# ---------------------------------------------------------------------------------------------------------
# UMA check: the splice writes K/V straight into host-visible cache memory. CPU (host memory) and Apple
# Metal (unified memory SoC) qualify; a discrete GPU (CUDA, ROCm/HIP, Vulkan, SYCL, ...) or a remote
# backend (RPC, cloud API) does not -> path B (text prefill), with the reason.

_UNIFIED = {"cpu": "CPU back-end: KV cache in host memory (unified)",
            "metal": "Apple Metal: unified-memory SoC"}
_REMOTE = ("rpc", "remote", "cloud", "http", "api")


@dataclass(frozen=True)
class UmaVerdict:
    unified: bool
    backend: str
    reason: str

    @property
    def path(self) -> str:
        return "splice" if self.unified else "text"


def uma_check(backend: str) -> UmaVerdict:
    """Whether a back-end (a ggml device/backend name such as "CPU", "Metal", "CUDA0", "Vulkan0", "RPC")
    supports an in-place KV splice. Anything not known to be unified is declined (safe default)."""
    name = (backend or "").strip()
    low = name.lower()
    if low in _UNIFIED or low.startswith("cpu"):
        return UmaVerdict(True, name, _UNIFIED.get(low, _UNIFIED["cpu"]))
    if low.startswith("metal") or low == "mtl":
        return UmaVerdict(True, name, _UNIFIED["metal"])
    if any(low.startswith(r) for r in _REMOTE):
        return UmaVerdict(False, name, f"path B: remote back-end {name!r} exposes no local KV cache "
                                       "to transplant into; text prefill")
    return UmaVerdict(False, name, f"path B: back-end {name!r} is not unified memory (discrete GPU); "
                                   "a strided host-to-device KV copy is declined, text prefill")


def tokenize(ll: Any, vocab: Any, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
    """``text``'s tokens in a llama.cpp ``vocab`` (``ll`` = the llama_cpp module)."""
    data = text.encode("utf-8")
    cap = len(data) + 16
    out = (ll.llama_token * cap)()
    n = ll.llama_tokenize(vocab, data, len(data), out, cap, add_bos, special)
    if n < 0:
        raise InvalidArgument("tokenization overflow")
    return list(out[:n])


def detect_backend(n_gpu_layers: int = 0) -> str:
    """The back-end the KV cache lives on for this process/config: "CPU" unless layers are offloaded
    to a GPU, then "Metal" on macOS and "GPU" (discrete) elsewhere."""
    import llama_cpp

    if n_gpu_layers == 0 or not llama_cpp.llama_supports_gpu_offload():
        return "CPU"
    return "Metal" if sys.platform == "darwin" else "GPU"


# ---------------------------------------------------------------------------------------------------------


def _silence(level: int, text: bytes, user: Any) -> None:  # pragma: no cover - C callback
    return None


# llama.cpp keeps the log callback in a process-wide global: the ctypes thunk must live as long as the process.
# (Held by one SpliceContext, it was freed with it and the next model load anywhere logged through a dangling
# pointer: a segfault in an unrelated test.)
_LOG_CALLBACK: Any = None


def _silence_llama_logs(llama_cpp: Any) -> None:
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = llama_cpp.llama_log_callback(_silence)
        llama_cpp.llama_log_set(_LOG_CALLBACK, None)


class SpliceContext:
    """One llama.cpp context (unified KV, flash attention off -> transposed V, n_seq_max >= 3) with the
    compile / prefill / splice / repair operations. Not thread-safe: hold the engine's per-turn lock."""

    def __init__(self, model_path: str = "", *, n_ctx: int = 4096, n_batch: int = 512, n_threads: int = 1,
                 n_seq_max: int = 4, n_gpu_layers: int = 0, model: Any = None,
                 fingerprint: bytes | None = None) -> None:
        """``model``: an already loaded ``llama_model_p`` to share (e.g. ``Llama(...)._model.model`` of
        the engine's high-level Llama; it must be the file at ``model_path``); not freed by close().
        ``fingerprint``: the model file's 16-byte fingerprint when the caller already hashed it."""
        import llama_cpp
        import nexus_native as nn
        from nexus_native.llama import gguf_fingerprint, spec_from_llama

        if n_seq_max < 3:
            raise InvalidArgument("SpliceContext needs n_seq_max >= 3 (live, scratch, one spare)")
        self._ll = llama_cpp
        self._nn = nn
        self.model_path = str(resolve_gguf(model_path))
        self.backend = detect_backend(n_gpu_layers)
        self.uma = uma_check(self.backend)
        llama_cpp.llama_backend_init()
        _silence_llama_logs(llama_cpp)
        self._owns_model = model is None
        if model is None:
            mp = llama_cpp.llama_model_default_params()
            mp.n_gpu_layers = n_gpu_layers
            # AMX-advertising VMs: weights in the AMX extra buffer type SIGILL on a -march=native build
            mp.use_extra_bufts = False
            model = llama_cpp.llama_model_load_from_file(self.model_path.encode(), mp)
            if not model:
                raise FailedPrecondition(f"llama.cpp could not load {self.model_path}")
        self.model = model
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, n_batch, n_seq_max
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.params = cp
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not self.ctx:
            if self._owns_model:
                llama_cpp.llama_model_free(self.model)
            raise FailedPrecondition("llama_init_from_model failed")
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        self.n_batch = n_batch
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.fingerprint = fingerprint or gguf_fingerprint(self.model_path)
        self.spec = spec_from_llama(self.model, cp, fingerprint=self.fingerprint)
        self._logits: np.ndarray | None = None
        self._state_buf: Any = None
        self._prelude_cache: tuple[int, list[int]] | None = None
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._ll.llama_batch_free(self.batch)
        self._ll.llama_free(self.ctx)
        if self._owns_model:
            self._ll.llama_model_free(self.model)

    def __enter__(self) -> SpliceContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- basic ops ------------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> list[int]:
        return tokenize(self._ll, self.vocab, text, add_bos=add_bos, special=special)

    def decode(self, tokens: Sequence[int], pos0: int, seq: int = LIVE_SEQ) -> None:
        """Decode tokens at pos0.. into a sequence, in n_batch chunks; keeps the last position's logits."""
        if not tokens:
            return
        if pos0 + len(tokens) > self.n_ctx:
            raise InvalidArgument(f"{pos0 + len(tokens)} positions exceed the context ({self.n_ctx})")
        b = self.batch
        for s in range(0, len(tokens), self.n_batch):
            chunk = tokens[s:s + self.n_batch]
            b.n_tokens = len(chunk)
            last = s + len(chunk) == len(tokens)
            for i, t in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, pos0 + s + i, 1, seq
                b.logits[i] = last and i == len(chunk) - 1
            rc = self._ll.llama_decode(self.ctx, b)
            if rc != 0:
                raise FailedPrecondition(f"llama_decode failed ({rc})")
        ptr = self._ll.llama_get_logits_ith(self.ctx, -1)
        self._logits = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def logits(self) -> np.ndarray:
        """Next-token logits (float32 copy) of the last decoded position."""
        if self._logits is None:
            raise FailedPrecondition("nothing decoded yet")
        return self._logits

    def seq_len(self, seq: int = LIVE_SEQ) -> int:
        """Number of positions in a sequence (pos_max + 1; 0 when empty)."""
        return int(self._ll.llama_memory_seq_pos_max(self.mem, seq)) + 1

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> None:
        self._ll.llama_memory_seq_rm(self.mem, seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self._ll.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def reset(self, seq: int = LIVE_SEQ) -> None:
        self.seq_rm(seq)
        self._logits = None

    def prefill(self, tokens: Sequence[int], seq: int = LIVE_SEQ) -> None:
        """Text prefill: the sequence becomes exactly ``tokens`` at positions 0.. (path B)."""
        self.seq_rm(seq)
        self.decode(list(tokens), 0, seq)

    def append(self, tokens: Sequence[int], seq: int = LIVE_SEQ) -> None:
        """Decode tokens after the sequence's current end."""
        self.decode(list(tokens), self.seq_len(seq), seq)

    def get_seq(self, seq: int) -> bytes:
        size = self._ll.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        n = self._ll.llama_state_seq_get_data(self.ctx, buf, size, seq)
        if n <= 0:
            raise FailedPrecondition(f"llama_state_seq_get_data(seq {seq}) failed")
        return bytes(buf[:n])

    # -- compile --------------------------------------------------------------------------------------
    def compile_block(self, prelude_tokens: Sequence[int], schema_tokens: Sequence[int], *,
                      prelude_seq: int | None = None) -> Any:
        """Decode prelude+schema in the scratch sequence and keep only the schema cells: an AtbBlock with
        anchor m0 = len(prelude), this model's fingerprint and the schema's token hash. With ``prelude_seq``
        the prelude's K/V are kept in that sequence and reused by the next call with the same prelude (the
        schema's K/V come out bit-identical: llama.cpp's batched decode does not depend on the split)."""
        nn = self._nn
        schema = list(schema_tokens)
        if not schema:
            raise InvalidArgument("empty schema")
        m0 = len(prelude_tokens)
        self.seq_rm(SCRATCH_SEQ)
        saved = self._logits
        try:
            if prelude_seq is None:
                self.decode(list(prelude_tokens) + schema, 0, SCRATCH_SEQ)
            else:
                # the prelude stays decoded in ``prelude_seq`` across calls: only the schema is decoded here
                prelude = list(prelude_tokens)
                if self._prelude_cache != (prelude_seq, prelude):
                    self.prefill(prelude, prelude_seq)
                    self._prelude_cache = (prelude_seq, prelude)
                self.seq_cp(prelude_seq, SCRATCH_SEQ)
                self.decode(schema, m0, SCRATCH_SEQ)
            self.seq_rm(SCRATCH_SEQ, 0, m0)
            blob = self.get_seq(SCRATCH_SEQ)
        finally:
            self.seq_rm(SCRATCH_SEQ)
            self._logits = saved
        block = nn.AtbBlock.from_state(blob, self.spec, token_hash=nn.token_hash(schema))
        assert block.anchor == m0 and block.n_tokens == len(schema)
        return block

    def load_block(self, data: bytes) -> Any:
        """Decode an .atb byte string against this model; a foreign block raises ModelMismatch."""
        nn = self._nn
        try:
            return nn.AtbBlock.from_bytes(data, self.spec)
        except nn.AtbMismatchError as e:
            raise ModelMismatch(f"KV block compiled for another model or RoPE regime: {e}") from e

    def check_block(self, block: Any) -> None:
        """ModelMismatch unless the block's fingerprint, geometry and every RoPE parameter match."""
        diff = list(block.spec.diff(self.spec))
        if diff:
            raise ModelMismatch("KV block compiled for another model or RoPE regime: differs in "
                                + ", ".join(diff))

    # -- splice ---------------------------------------------------------------------------------------
    def splice(self, block: Any, n_past: int, recompute_pct: float = 0.0, *,
               schema_tokens: Sequence[int] | None = None, reanchor: bool = True,
               repair: str = "suffix", seq: int = LIVE_SEQ) -> int:
        """Transplant ``block`` at positions n_past.. of the live sequence (which must hold exactly
        n_past positions), then re-decode ceil(S*R/100) schema tokens: the contiguous trailing suffix
        (``repair="suffix"``, the design) or the leading tokens (``"scattered"``, EPIC/LegoLink-style,
        eval only). ``reanchor=False`` relabels positions without rotating K (eval only).
        Returns the number of re-decoded tokens. Nothing is touched when validation fails."""
        if not self.uma.unified:
            raise FailedPrecondition(self.uma.reason)
        self.check_block(block)
        S = block.n_tokens
        r = recompute_tokens(S, recompute_pct)
        if repair not in ("suffix", "scattered"):
            raise InvalidArgument(f"unknown repair {repair!r}")
        if r:
            if schema_tokens is None:
                raise InvalidArgument("re-decoding a suffix needs the block's schema tokens")
            schema = list(schema_tokens)
            if len(schema) != S or self._nn.token_hash(schema) != block.token_hash:
                raise InvalidArgument("schema tokens do not match the block's token hash")
        have = self.seq_len(seq)
        if have != n_past:
            raise InvalidArgument(f"live sequence holds {have} positions, splice asked at n_past={n_past}")
        if n_past + S > self.n_ctx:
            raise InvalidArgument(f"splice to {n_past + S} positions exceeds the context ({self.n_ctx})")

        size = block.state_size(v_trans=True)
        if self._state_buf is None or len(self._state_buf) < size:
            self._state_buf = (ctypes.c_uint8 * size)()
        n = block.to_state_into(self._state_buf, n_past, v_trans=True, seq_id=SCRATCH_SEQ, reanchor=reanchor)
        self.seq_rm(SCRATCH_SEQ)
        if self._ll.llama_state_seq_set_data(self.ctx, self._state_buf, n, SCRATCH_SEQ) != n:
            self.seq_rm(SCRATCH_SEQ)
            raise FailedPrecondition("llama_state_seq_set_data rejected the block (KV cache full?)")
        self.seq_cp(SCRATCH_SEQ, seq)
        self.seq_rm(SCRATCH_SEQ)
        self._logits = None
        if r:
            if repair == "suffix":
                p0 = n_past + S - r
                self.seq_rm(seq, p0, -1)
                self.decode(schema[S - r:], p0, seq)
            else:
                # llama.cpp only decodes at a sequence's end: re-decode the leading tokens in the scratch
                # sequence over the shared context cells, then swap them into the live sequence
                self.seq_cp(seq, SCRATCH_SEQ, 0, n_past)
                self.decode(schema[:r], n_past, SCRATCH_SEQ)
                self.seq_rm(seq, n_past, n_past + r)
                self.seq_cp(SCRATCH_SEQ, seq, n_past, n_past + r)
                self.seq_rm(SCRATCH_SEQ)
                self._logits = None  # the last decoded position is not the sequence's end
        return r

    def splice_adaptive(self, block: Any, n_past: int, schema_tokens: Sequence[int], *,
                        M: int = SPLICE_THRESHOLD_M, R_base: float = R_BASE_PCT,
                        K: float = FULL_RECOMPUTE_MULTIPLE_K) -> int:
        """The production splice: R = recompute_fraction(n_past, M, R_base, K), contiguous suffix."""
        return self.splice(block, n_past, recompute_fraction(n_past, M, R_base, K), schema_tokens=schema_tokens)


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(P || Q) in nats of the softmax distributions of two logit vectors (float64)."""
    p = np.asarray(p_logits, dtype=np.float64)
    q = np.asarray(q_logits, dtype=np.float64)
    lp = p - p.max()
    lp -= np.log(np.exp(lp).sum())
    lq = q - q.max()
    lq -= np.log(np.exp(lq).sum())
    return float(max(0.0, np.sum(np.exp(lp) * (lp - lq))))


__all__ = ["SpliceContext", "UmaVerdict", "uma_check", "detect_backend", "recompute_fraction",
           "recompute_tokens", "kl_divergence", "LIVE_SEQ", "SCRATCH_SEQ"]
