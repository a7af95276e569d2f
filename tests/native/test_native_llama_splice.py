"""Splice parity against the real llama.cpp (llama-cpp-python 0.3.36) on SmolLM2-135M-Instruct.

A block is captured from seq 1 with llama_state_seq_get_data, converted to .atb, then placed at
position p two ways:
  (a) our path: native reanchor + blob with rewritten positions -> llama_state_seq_set_data(seq 0)
  (b) llama.cpp's path: the block at its original positions, then llama_memory_seq_add (K-shift)
and the same next token is decoded in both. K must come out bit-identical and so must the logits.
Both V layouts are covered (flash attention on: row-major V; off: transposed V).
"""

from __future__ import annotations

import ctypes

import llama_cpp  # a hard requirement: without llama.cpp this test must fail, not skip
import nexus_native as nn
import numpy as np
import pytest
from native_helpers import gguf_path
from nexus_native.llama import spec_from_llama

PROMPT = b"You are a tool router. Available tools: get_weather(city: string), create_issue(repo: string)."
ANCHOR = 3  # the block is captured at positions 3 .. 3 + n - 1, so every placement is a real re-rotation
PLACEMENTS = [ANCHOR, 4, 100, 1000, 3900]


class Llama:
    """Just enough of the llama.cpp C API for the splice: one context, two sequences, unified KV."""

    _log_cb = llama_cpp.llama_log_callback(lambda level, text, user: None)  # keep a reference: C holds it

    def __init__(self, model, flash_attn: bool) -> None:
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 4096, 256, 256, 2
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = 1  # a 2-core box shared with others: no spin-waiting peer thread
        cp.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self.params = cp
        self.ctx = llama_cpp.llama_init_from_model(model, cp)
        assert self.ctx, "llama_init_from_model failed"
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(256, 0, 1)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)

    def decode(self, tokens: list[int], pos0: int, seq: int) -> np.ndarray:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, pos0 + i, 1, seq
            b.logits[i] = i == len(tokens) - 1
        assert llama_cpp.llama_decode(self.ctx, b) == 0
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def get_seq(self, seq: int) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self.ctx, buf, size, seq)
        assert n > 0
        return bytes(buf[:n])

    def set_seq(self, blob: bytes, seq: int) -> None:
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        assert llama_cpp.llama_state_seq_set_data(self.ctx, buf, len(blob), seq) == len(blob)


@pytest.fixture(scope="module")
def model():
    llama_cpp.llama_backend_init()
    llama_cpp.llama_log_set(Llama._log_cb, None)
    mp = llama_cpp.llama_model_default_params()
    # This VM's CPU advertises AMX but the kernel does not enable it: a -march=native llama.cpp build runs
    # AMX tile kernels on weights in the AMX "extra" buffer type and dies with SIGILL. The Makefile builds
    # llama-cpp-python portable (no AMX); keeping weights out of extra buffer types makes this test safe
    # on either build.
    mp.use_extra_bufts = False
    m = llama_cpp.llama_model_load_from_file(gguf_path().encode(), mp)
    assert m, "model failed to load"
    yield m
    llama_cpp.llama_model_free(m)


def tokenize(model, text: bytes) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(model)
    out = (llama_cpp.llama_token * 512)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), out, 512, False, False)
    assert n > 0
    return list(out[:n])


def test_model_spec_from_the_gguf(model):
    spec = spec_from_llama(model, fingerprint=bytes(16))
    assert (spec.n_layer, spec.n_head_kv, spec.head_dim, spec.n_rot) == (30, 3, 64, 64)
    assert spec.rope_type == nn.RopeType.NORM  # llama architecture
    assert spec.freq_base == 100000.0 and spec.freq_scale == 1.0  # SmolLM2: rope_theta = 1e5


@pytest.mark.parametrize("flash_attn", [True, False], ids=["fa-on-rowV", "fa-off-transposedV"])
def test_reanchor_splice_matches_llama_cpp_k_shift(model, flash_attn):
    llm = Llama(model, flash_attn)
    try:
        spec = spec_from_llama(model, llm.params, fingerprint=bytes(16))
        toks = tokenize(model, PROMPT)
        *block_toks, nxt = toks
        n = len(block_toks)
        llm.decode(block_toks, ANCHOR, 1)
        # the original sequence's own next-token logits: what an anchored splice must reproduce
        llm.decode([nxt], ANCHOR + n, 1)
        original = llm.get_seq(1)
        llama_cpp.llama_memory_seq_rm(llm.mem, 1, ANCHOR + n, -1)
        reference_logits = None
        blob = llm.get_seq(1)
        info = nn.state_info(blob)
        assert info["cell_count"] == n and info["v_trans"] == (not flash_attn)
        assert info["positions"].tolist() == list(range(ANCHOR, ANCHOR + n))
        block = nn.AtbBlock.from_state(blob, spec, token_hash=nn.token_hash(block_toks))
        assert block.anchor == ANCHOR and block.n_tokens == n
        assert block.v_layout == (nn.VLayout.ROWS if flash_attn else nn.VLayout.TRANSPOSED)
        assert block.to_state(ANCHOR, seq_id=1) == blob  # lossless both ways
        # the .atb file round trip in between, as the compiler/engine would do it
        block = nn.AtbBlock.from_bytes(block.to_bytes(), spec)

        for p in PLACEMENTS:
            # (a) ours: reanchored K, positions rewritten, straight into seq 0
            llama_cpp.llama_memory_seq_rm(llm.mem, 0, -1, -1)
            llm.set_seq(block.to_state(p), 0)
            logits_a = llm.decode([nxt], p + n, 0)
            # (b) llama.cpp's: the block at its anchor, then K-shift by p - anchor
            llama_cpp.llama_memory_seq_rm(llm.mem, 0, -1, -1)
            llm.set_seq(block.to_state(ANCHOR), 0)
            llama_cpp.llama_memory_seq_add(llm.mem, 0, -1, -1, p - ANCHOR)
            logits_b = llm.decode([nxt], p + n, 0)
            shifted = nn.state_info(llm.get_seq(0))
            k_shift = nn.AtbBlock.from_state(llm.get_seq(0), spec).k[:, :n]

            ours = block.copy()
            ours.reanchor(p)
            differ = int(np.count_nonzero(ours.k.view(np.uint16) != k_shift.view(np.uint16)))
            assert shifted["positions"].tolist() == list(range(p, p + n + 1))
            assert differ == 0, (
                f"p={p}: {differ} K elements differ from llama.cpp's K-shift "
                "(a llama.cpp build without FMA contraction needs fma=False)"
            )
            assert float(np.max(np.abs(logits_a - logits_b))) <= 1e-4, p
            assert int(np.argmax(logits_a)) == int(np.argmax(logits_b))
            if p == ANCHOR:
                reference_logits = logits_a
        # anchored splice == the original sequence's continuation (decoded above in seq 1)
        llama_cpp.llama_memory_seq_rm(llm.mem, 0, -1, -1)
        llama_cpp.llama_memory_seq_rm(llm.mem, 1, -1, -1)
        llm.set_seq(original, 1)
        llama_cpp.llama_memory_seq_rm(llm.mem, 1, ANCHOR + n, -1)
        cont = llm.decode([nxt], ANCHOR + n, 1)
        assert reference_logits is not None
        np.testing.assert_array_equal(reference_logits, cont)
    finally:
        llm.close()
