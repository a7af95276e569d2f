"""The grammar sampler's fast path (argmax first, whole vocabulary only on rejection) picks exactly what a
mask-then-greedy chain picks, on the real SmolLM2 vocabulary and a tool's compiled grammar."""

import json

import llama_cpp
import numpy as np
import pytest

from services.compiler.grammar import compile_grammar
from services.engine.sampling import GrammarError, GrammarSampler, Vocabulary
from services.runtime.splice import SpliceContext


@pytest.fixture(scope="module")
def sc():
    c = SpliceContext(n_ctx=64, n_batch=32, n_threads=1, n_seq_max=3)
    yield c
    c.close()


def raw(sc, tok: int) -> bytes:
    buf = llama_cpp.ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(sc.vocab, tok, buf, 64, 0, True)
    return buf.raw[:n]


def piece(sc, tok: int) -> str:
    return raw(sc, tok).decode("utf-8", "ignore")


@pytest.fixture(scope="module")
def vocabulary(sc):
    return Vocabulary(llama_cpp, sc.vocab, sc.n_vocab)


def tool_sampler(vocabulary, all_tools, name: str) -> GrammarSampler:
    tool = next(t for t in all_tools if t.name == name)
    return GrammarSampler(vocabulary, compile_grammar(tool).text)


def tokens(sc, text: str) -> list[int]:
    buf = (llama_cpp.llama_token * 256)()
    n = llama_cpp.llama_tokenize(sc.vocab, text.encode(), len(text.encode()), buf, 256, False, False)
    return list(buf[:n])


def test_fast_path_matches_the_mask(sc, vocabulary, all_tools):
    """The one-token check (end-of-generation tokens included) agrees with the whole mask at every step, whether the
    argmax is allowed (every other step) or not; greedy under the mask ends in a closed object."""
    rng = np.random.default_rng(0)
    fast = tool_sampler(vocabulary, all_tools, "get_current_time")
    ref = tool_sampler(vocabulary, all_tools, "get_current_time")
    out, ended = b"", False
    for step in range(300):
        ok = np.isfinite(ref.masked(np.zeros(sc.n_vocab, dtype=np.float32)))
        logits = rng.normal(size=sc.n_vocab).astype(np.float32)
        logits[rng.choice(np.flatnonzero(ok)) if step % 2 else rng.integers(sc.n_vocab)] += 100
        want = int(np.flatnonzero(ok)[np.argmax(logits[ok])])
        for t in (int(np.argmax(logits)), *sorted(vocabulary.eog)):
            assert fast.allows(t) == ok[t]
        got = fast.pick(logits)
        assert got == want
        if got in vocabulary.eog:
            ended = True
            break
        fast.accept(got)
        ref.accept(got)
        out += raw(sc, got)
    assert ended and 0 < fast.full_scans < step
    args = json.loads(out)
    assert list(args) == ["timezone"] and len(args["timezone"]) <= 160  # closed to its keys, the string bounded


def test_the_grammar_forbids_what_breaks_the_schema(sc, vocabulary, all_tools):
    """After ``{"owner": "octo", "repo": "demo", "pullNumber": `` only a number may follow: a quote (a string) is
    refused by the one-token check and masked out; closing the object before the required keys is too."""
    s = tool_sampler(vocabulary, all_tools, "github_merge_pull_request")
    for t in tokens(sc, '{"owner": "octo", "repo": "demo", "pullNumber": '):
        assert s.allows(t)
        s.accept(t)
    (quote,) = tokens(sc, '"')
    (close,) = tokens(sc, "}")
    (digit,) = tokens(sc, "7")
    assert not s.allows(quote) and not s.allows(close) and s.allows(digit)
    logits = np.zeros(sc.n_vocab, dtype=np.float32)
    logits[quote], logits[close], logits[digit] = 30.0, 20.0, 10.0
    assert s.pick(logits) == digit
    assert not any(s.allows(t) for t in vocabulary.eog)  # no end of generation inside the object


def test_a_grammar_that_does_not_compile_is_a_clear_error(vocabulary):
    with pytest.raises(GrammarError, match="does not compile"):
        GrammarSampler(vocabulary, '{"grammars": [{"json_schema": {"type": "strang"}}]}')
