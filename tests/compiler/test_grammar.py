"""Grammars for the real registry: compiled by llama-cpp-python's converter and parsed by llama.cpp."""

import ctypes

import pytest

from services.common.tools import parse_tool
from services.compiler.grammar import OBJECT_GBNF, compile_grammar


@pytest.fixture(scope="module")
def vocab():
    import llama_cpp

    from services.common.models import default_gguf_path

    llm = llama_cpp.Llama(model_path=str(default_gguf_path()), vocab_only=True, verbose=False)
    return llm


def _parses(vocab, text: str) -> bool:
    """Ask llama.cpp itself to build a grammar sampler from the text (NULL when it does not parse)."""
    import llama_cpp

    smpl = llama_cpp.llama_sampler_init_grammar(vocab._model.vocab, text.encode(), b"root")
    if not smpl:
        return False
    llama_cpp.llama_sampler_free(smpl)
    return True


def test_every_registry_grammar_parses_in_llama_cpp(all_tools, vocab):
    fallbacks = []
    for t in all_tools:
        g = compile_grammar(t)
        if g.fallback:
            fallbacks.append(t.name)
        assert _parses(vocab, g.text), t.name
    # The converter handles nearly every real schema; the few it cannot are counted, not hidden.
    assert len(fallbacks) <= 5, fallbacks


def test_unexpressible_schema_falls_back_to_object_grammar(vocab):
    t = parse_tool({"name": "odd", "inputSchema": {"type": "object", "properties": {
        "p": {"type": "string", "pattern": "(?<=a)b"}}}})
    g = compile_grammar(t)
    assert _parses(vocab, g.text)
    if g.fallback:
        assert g.text.strip() == OBJECT_GBNF.strip() and g.reason


def test_fallback_grammar_itself_parses(vocab):
    assert _parses(vocab, OBJECT_GBNF)
    assert ctypes  # ctypes is what llama_cpp uses underneath; imported to fail loudly if missing


def test_free_strings_are_bounded_so_loops_end(vocab):
    from services.compiler.grammar import MAX_STRING_CHARS

    t = parse_tool({"name": "x", "description": "", "inputSchema": {
        "type": "object", "properties": {"p": {"type": "string"}}, "required": ["p"]}})
    g = compile_grammar(t)
    assert not g.fallback and f"char{{0,{MAX_STRING_CHARS}}}" in g.text and "char*" not in g.text
    assert _parses(vocab, g.text)
