"""The KV splice path against the real llama.cpp on SmolLM2-135M (services.runtime.splice).

Reference = text prefill of context + schema, then the query decoded on top; splice = text prefill of
the context, the compiled schema block transplanted at n_past (native RoPE reanchor), optional suffix
repair, then the same query. Fidelity is measured on the query's next-token distribution.
"""

from __future__ import annotations

import math

import nexus_native as nn
import numpy as np
import pytest

from services.common.errors import FailedPrecondition, ModelMismatch
from services.runtime.splice import (
    LIVE_SEQ,
    SpliceContext,
    kl_divergence,
    recompute_fraction,
    recompute_tokens,
    uma_check,
)

SCHEMA = ('{"name":"get_weather","description":"Get the current weather for a city","inputSchema":'
          '{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}\n')
FILLER = " Earlier the user asked about train times between Lyon and Paris, then about hotel prices." * 3
QUERY = "<|im_end|>\n<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n{"


@pytest.fixture(scope="module")
def sc():
    # n_threads=1: on this shared 2-core box a second ggml thread spin-waits and is ~10x slower
    c = SpliceContext(n_ctx=512, n_batch=256, n_threads=1)
    yield c
    c.close()


@pytest.fixture(scope="module")
def toks(sc):
    pre = sc.tokenize("<|im_start|>system\nYou are a tool caller. Tools:\n")
    return {"pre": pre, "filler": sc.tokenize(FILLER), "schema": sc.tokenize(SCHEMA), "query": sc.tokenize(QUERY)}


@pytest.fixture(scope="module")
def block(sc, toks):
    return sc.compile_block(toks["pre"], toks["schema"])


def _prefill_logits(sc, ctxt, toks):
    sc.prefill(ctxt + toks["schema"])
    sc.append(toks["query"])
    return sc.logits()


def _splice_logits(sc, ctxt, block, toks, pct, **kw):
    sc.prefill(ctxt)
    sc.splice(block, len(ctxt), pct, schema_tokens=toks["schema"], **kw)
    sc.append(toks["query"])
    return sc.logits()


def test_recompute_fraction_curve():
    assert recompute_fraction(0) == 5.0
    assert recompute_fraction(256) == 5.0  # R_base up to the threshold M
    assert recompute_fraction(512) == pytest.approx(5 + 256 / 768 * 95)  # K=4: 1/3 of the way
    assert recompute_fraction(256 * 4) == 100.0  # K*M: full recompute
    assert recompute_fraction(5000) == 100.0  # clamped
    assert recompute_fraction(512, K=2) == 100.0
    assert recompute_fraction(512, K=8) == pytest.approx(5 + 256 / (256 * 7) * 95)
    assert recompute_tokens(44, 5.0) == math.ceil(44 * 0.05) == 3
    assert recompute_tokens(44, 100.0) == 44 and recompute_tokens(44, 0.0) == 0


def test_uma_check():
    assert uma_check("CPU").unified and uma_check("Metal").unified
    for name in ("CUDA0", "Vulkan0", "ROCm0", "RPC[127.0.0.1:50052]"):
        v = uma_check(name)
        assert not v.unified and v.path == "text" and v.reason.startswith("path B")
    assert "remote" in uma_check("RPC").reason


def test_context_is_cpu_unified(sc):
    assert sc.backend == "CPU" and sc.uma.unified


def test_block_records_anchor_fingerprint_and_tokens(sc, toks, block):
    assert block.anchor == len(toks["pre"]) and block.n_tokens == len(toks["schema"])
    assert block.spec.fingerprint == sc.fingerprint
    assert block.token_hash == nn.token_hash(toks["schema"])
    assert block.v_layout == nn.VLayout.TRANSPOSED  # flash attention off
    assert sc.load_block(block.to_bytes(nn.ATB_COMPACT_ALIGN_LOG2)).payload_crc() == block.payload_crc()


def test_anchored_splice_is_bit_identical_to_prefill(sc, toks, block):
    ref = _prefill_logits(sc, toks["pre"], toks)
    got = _splice_logits(sc, toks["pre"], block, toks, 0.0)
    np.testing.assert_array_equal(ref, got)
    assert kl_divergence(ref, got) == 0.0


def test_exact_recompute_is_bit_identical_off_anchor(sc, toks, block):
    ctxt = toks["pre"] + toks["filler"]
    ref = _prefill_logits(sc, ctxt, toks)
    got = _splice_logits(sc, ctxt, block, toks, 100.0)
    np.testing.assert_array_equal(ref, got)


def test_off_anchor_bare_splice_drifts_a_little(sc, toks, block):
    ctxt = toks["pre"] + toks["filler"]
    ref = _prefill_logits(sc, ctxt, toks)
    bare = kl_divergence(ref, _splice_logits(sc, ctxt, block, toks, 0.0))
    # the block was compiled under another preceding context: a small, non-zero residual
    assert 0.0 < bare < 1.0
    # without the reanchor the keys carry the wrong phase: different (here larger) divergence
    no_re = kl_divergence(ref, _splice_logits(sc, ctxt, block, toks, 0.0, reanchor=False))
    assert no_re > 0.0 and no_re != bare


def test_scattered_repair_runs(sc, toks, block):
    ctxt = toks["pre"] + toks["filler"]
    sc.prefill(ctxt)
    r = sc.splice(block, len(ctxt), 20.0, schema_tokens=toks["schema"], repair="scattered")
    assert r == recompute_tokens(block.n_tokens, 20.0)
    assert sc.seq_len() == len(ctxt) + block.n_tokens


def _foreign(block, **overrides):
    d = block.spec.to_dict()
    d.update(overrides)
    return nn.AtbBlock(nn.ModelSpec(**d), block.k, block.v, block.anchor, token_hash=block.token_hash,
                       v_layout=block.v_layout)


@pytest.mark.parametrize("overrides", [{"fingerprint": bytes(16)}, {"freq_base": 10000.0}],
                         ids=["fingerprint", "rope-base"])
def test_mismatched_block_raises_and_leaves_live_unchanged(sc, toks, block, overrides):
    ctxt = toks["pre"] + toks["filler"]
    sc.prefill(ctxt)
    before = sc.get_seq(LIVE_SEQ)
    bad = _foreign(block, **overrides)
    with pytest.raises(ModelMismatch) as ei:
        sc.splice(bad, len(ctxt), 0.0)
    assert isinstance(ei.value, FailedPrecondition)
    assert ei.value.code.name == "FAILED_PRECONDITION"
    with pytest.raises(ModelMismatch):
        sc.load_block(bad.to_bytes(nn.ATB_COMPACT_ALIGN_LOG2))
    assert sc.seq_len() == len(ctxt)
    assert sc.get_seq(LIVE_SEQ) == before


def test_llama_log_callback_outlives_the_context():
    """llama.cpp keeps its log callback process-wide: after a SpliceContext is gone, loading another model
    (which logs) must not call into a freed ctypes thunk (it segfaulted the whole suite once)."""
    import gc

    from services.compiler.tokenizer import load_tokenizer
    from services.runtime import splice
    from services.runtime.splice import SpliceContext

    ctx = SpliceContext(n_ctx=256, n_threads=1)
    ctx.close()
    del ctx
    gc.collect()
    # the thunk is held by the module, not by the (now collected) context
    assert splice._LOG_CALLBACK is not None and not hasattr(SpliceContext, "_log_cb")
    assert load_tokenizer("")("hello world")
