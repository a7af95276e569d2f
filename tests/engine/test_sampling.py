"""The grammar samplers' fast path (argmax first, whole vocabulary only on rejection) picks exactly what a
grammar-then-greedy chain picks, on the real SmolLM2 vocabulary: llama.cpp's on a GBNF, llguidance's on a tool's
JSON Schema."""

import json

import llama_cpp
import numpy as np
import pytest

from services.compiler.grammar import schema_for_matcher
from services.engine.sampling import (
    GrammarError,
    GrammarSampler,
    LLGuidance,
    LLGuidanceSampler,
    schema_grammar,
)
from services.runtime.splice import SpliceContext

GRAMMAR = r'''root ::= "{" ws "\"ok\"" ws ":" ws ("true" | "false") ws "}"
ws ::= [ \t\n]?'''


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


# -- llguidance on a tool's JSON Schema (grammar_engine = "llguidance") ------------------------------------------


@pytest.fixture(scope="module")
def ll(sc):
    return LLGuidance(llama_cpp, sc.vocab, sc.n_vocab)


def tool_sampler(ll, all_tools, name: str) -> LLGuidanceSampler:
    tool = next(t for t in all_tools if t.name == name)
    return LLGuidanceSampler(ll, schema_grammar(schema_for_matcher(tool)))


def tokens(sc, text: str) -> list[int]:
    buf = (llama_cpp.llama_token * 256)()
    n = llama_cpp.llama_tokenize(sc.vocab, text.encode(), len(text.encode()), buf, 256, False, False)
    return list(buf[:n])


def test_llguidance_fast_path_matches_its_mask(sc, ll, all_tools):
    """The one-token check (end-of-generation tokens included) agrees with the whole mask at every step, whether the
    argmax is allowed (every other step) or not; greedy under the mask ends in a closed object."""
    rng = np.random.default_rng(0)
    fast = tool_sampler(ll, all_tools, "get_current_time")
    ref = tool_sampler(ll, all_tools, "get_current_time")
    out, ended = b"", False
    for step in range(300):
        ok = np.isfinite(ref.masked(np.zeros(sc.n_vocab, dtype=np.float32)))
        logits = rng.normal(size=sc.n_vocab).astype(np.float32)
        logits[rng.choice(np.flatnonzero(ok)) if step % 2 else rng.integers(sc.n_vocab)] += 100
        want = int(np.flatnonzero(ok)[np.argmax(logits[ok])])
        for t in (int(np.argmax(logits)), *sorted(ll.eog)):
            assert fast.allows(t) == ok[t]
        got = fast.pick(logits)
        assert got == want
        if got in ll.eog:
            ended = True
            break
        fast.accept(got)
        ref.accept(got)
        out += raw(sc, got)
    assert ended and 0 < fast.full_scans < step
    args = json.loads(out)
    assert list(args) == ["timezone"] and len(args["timezone"]) <= 160  # closed to its keys, the string bounded


def test_llguidance_forbids_what_breaks_the_schema(sc, ll, all_tools):
    """After ``{"owner": "octo", "repo": "demo", "pullNumber": `` only a number may follow: a quote (a string) is
    refused by the one-token check and masked out; closing the object before the required keys is too."""
    s = tool_sampler(ll, all_tools, "github_merge_pull_request")
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
    assert not any(s.allows(t) for t in ll.eog)  # no end of generation inside the object


def test_schema_llguidance_cannot_compile_is_a_grammar_error(ll, all_tools):
    # browser_drop's ``data`` uses propertyNames, which llguidance does not implement; the engine falls back to GBNF
    with pytest.raises(GrammarError, match="propertyNames"):
        tool_sampler(ll, all_tools, "browser_drop")
