"""The grammar sampler's fast path (argmax first, whole vocabulary only on rejection) picks exactly what a
grammar-then-greedy chain picks, on the real SmolLM2 vocabulary."""

import llama_cpp
import numpy as np
import pytest

from services.engine.sampling import GrammarError, GrammarSampler
from services.runtime.splice import SpliceContext

GRAMMAR = r'''root ::= "{" ws "\"ok\"" ws ":" ws ("true" | "false") ws "}"
ws ::= [ \t\n]?'''


@pytest.fixture(scope="module")
def sc():
    c = SpliceContext(n_ctx=64, n_batch=32, n_threads=1, n_seq_max=3)
    yield c
    c.close()


def piece(sc, tok: int) -> str:
    buf = llama_cpp.ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(sc.vocab, tok, buf, 64, 0, True)
    return buf.raw[:n].decode("utf-8", "ignore")


def allowed(sampler: GrammarSampler, n_vocab: int) -> np.ndarray:
    return np.isfinite(sampler.masked(np.zeros(n_vocab, dtype=np.float32)))


def test_fast_path_matches_the_full_grammar_filter(sc):
    rng = np.random.default_rng(0)
    fast = GrammarSampler(llama_cpp, sc.vocab, GRAMMAR, sc.n_vocab)
    ref = GrammarSampler(llama_cpp, sc.vocab, GRAMMAR, sc.n_vocab)
    text = ""
    for _ in range(30):
        logits = rng.normal(size=sc.n_vocab).astype(np.float32)
        ok = allowed(ref, sc.n_vocab)
        if not ok.any():
            break
        want = int(np.flatnonzero(ok)[np.argmax(logits[ok])])
        got = fast.pick(logits)
        assert got == want
        if llama_cpp.llama_vocab_is_eog(sc.vocab, got):
            break
        fast.accept(got)
        ref.accept(got)
        text += piece(sc, got)
    assert text.replace(" ", "").replace("\n", "").replace("\t", "") in ('{"ok":true}', '{"ok":false}')
    assert fast.full_scans > 0  # random logits rarely land on a legal token: the slow path ran and agreed
    fast.close()
    ref.close()


def test_unparsable_grammar_is_a_clear_error(sc):
    with pytest.raises(GrammarError):
        GrammarSampler(llama_cpp, sc.vocab, "root ::= (", sc.n_vocab)
