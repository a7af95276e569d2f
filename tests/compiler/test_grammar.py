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
    assert len(fallbacks) <= 5, fallbacks  # 0 since the any-value fix (projects_write was the one)


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


def _accepts(vocab, grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar sampler accepts ``text`` token by token (the real model's tokens)."""
    import llama_cpp
    import numpy as np

    from services.engine.sampling import GrammarSampler

    s = GrammarSampler(llama_cpp, vocab._model.vocab, grammar, vocab.n_vocab())
    try:
        for tok in vocab.tokenize(text.encode(), add_bos=False, special=False):
            if not s.allows(tok, 0.0):
                return False
            s.accept(tok)
        assert np is not None
        return True
    finally:
        s.close()


def test_strings_admit_no_raw_control_characters(vocab):
    # JSON forbids an unescaped newline inside a string; the converter's own char rule let one through
    t = parse_tool({"name": "x", "description": "", "inputSchema": {
        "type": "object", "properties": {"step": {"type": "string"}}, "required": ["step"]}})
    g = compile_grammar(t).text
    assert _accepts(vocab, g, '{"step": "build\\nrun"}')  # escaped: fine
    assert not _accepts(vocab, g, '{"step": "build\nrun"}')
    assert not _accepts(vocab, g, '{"step": "a\tb"}')


def test_arrays_are_bounded_unless_the_schema_says_otherwise(vocab):
    from services.compiler.grammar import MAX_ARRAY_ITEMS

    def arr(extra):
        return parse_tool({"name": "x", "description": "", "inputSchema": {"type": "object", "properties": {
            "ids": {"type": "array", "items": {"type": "integer"}, **extra}}, "required": ["ids"]}})
    many = lambda n: '{"ids": [' + ", ".join(str(i) for i in range(n)) + "]}"  # noqa: E731
    g = compile_grammar(arr({})).text
    assert _accepts(vocab, g, many(MAX_ARRAY_ITEMS)) and not _accepts(vocab, g, many(MAX_ARRAY_ITEMS + 1))
    g = compile_grammar(arr({"maxItems": 12})).text  # the schema's own bound wins
    assert _accepts(vocab, g, many(12)) and not _accepts(vocab, g, many(13))


def test_dependent_required_is_enforced(vocab):
    # kiali_get_resource_details: resourceName needs namespaces (the converter ignores dependentRequired, and an
    # evaluation output {"resourceType": "app", "resourceName": "cart"} failed schema validation)
    t = parse_tool({"name": "x", "description": "", "inputSchema": {
        "type": "object", "required": ["resourceType"], "dependentRequired": {"resourceName": ["namespaces"]},
        "properties": {"resourceType": {"type": "string", "enum": ["app", "service"]},
                       "resourceName": {"type": "string"}, "namespaces": {"type": "string"},
                       "meshCluster": {"type": "string"}}}})
    c = compile_grammar(t)
    assert not c.fallback
    assert _accepts(vocab, c.text, '{"resourceType": "app", "resourceName": "cart", "namespaces": "shop"}')
    assert _accepts(vocab, c.text, '{"resourceType": "app", "meshCluster": "west"}')
    assert not _accepts(vocab, c.text, '{"resourceType": "app", "resourceName": "cart"}')
    assert not _accepts(vocab, c.text, '{"resourceType": "app", "resourceName": "cart", "meshCluster": "west"}')


def _bounded(prop):
    return parse_tool({"name": "x", "description": "", "inputSchema": {
        "type": "object", "properties": {"n": prop}, "required": ["n"]}})


@pytest.mark.parametrize("prop,good,bad", [
    # GitHub's perPage (28 tools): the converter ignored the bounds and tune lines wrote 1000 and 10^15
    ({"type": "number", "minimum": 1, "maximum": 100}, ["1", "7", "42", "99", "100", "2.5", "99.75"],
     ["0", "101", "1000", "-3", "100.5", "1000000000000000"]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000000}, ["1", "5000", "999999"],
     ["0", "1000000", "2.5"]),
    ({"type": "integer", "minimum": 0}, ["0", "12", "123456789"], ["-1", "1.5"]),
    ({"type": "integer", "minimum": 1, "maximum": 9007199254740991}, ["1", "9007199254740991", "4000000000000000"],
     ["0", "9007199254740992"]),
    ({"type": "integer", "maximum": 30}, ["-4", "0", "29", "30"], ["31", "100"]),
    ({"type": "integer", "exclusiveMinimum": -0.5, "exclusiveMaximum": 10.5}, ["0", "10"], ["-1", "11"]),
])
def test_numeric_bounds_are_compiled_into_the_grammar(vocab, prop, good, bad):
    import json

    import jsonschema

    g = compile_grammar(_bounded(prop))
    assert not g.fallback and "nexus-num-0 ::=" in g.text
    for v in good:
        assert _accepts(vocab, g.text, '{"n": ' + v + "}"), v
        jsonschema.validate(json.loads('{"n": ' + v + "}"), _bounded(prop).input_schema)
    for v in bad:
        assert not _accepts(vocab, g.text, '{"n": ' + v + "}"), v


def test_bounds_out_of_reach_are_left_to_validation(vocab):
    g = compile_grammar(_bounded({"type": "integer", "minimum": 5, "maximum": 9}))
    assert not g.fallback and "nexus-num" not in g.text and _parses(vocab, g.text)


def test_no_repetition_is_unbounded_so_every_value_can_end(all_tools, vocab):
    from services.compiler.grammar import MAX_ATOM_REPEAT, MAX_GROUP_REPEAT, bound_repetition

    # kubernetes fieldSelector's pattern: a model writing digits never reached the '=' it needs before the quote
    pat = "^[.\\-A-Za-z0-9]+([=!,]{1,2}[./\\-A-Za-z0-9]+)+$"
    t = parse_tool({"name": "x", "description": "", "inputSchema": {
        "type": "object", "properties": {"f": {"type": "string", "pattern": pat}}, "required": ["f"]}})
    g = compile_grammar(t).text
    assert f"{{1,{MAX_ATOM_REPEAT}}}" in g and f"{{1,{MAX_GROUP_REPEAT}}}" in g
    assert _accepts(vocab, g, '{"f": "status.phase=Running"}')
    assert not _accepts(vocab, g, '{"f": "' + "1" * (MAX_ATOM_REPEAT + 1) + '=x"}')
    # literals and character classes keep their own + and *
    assert bound_repetition('a ::= "+*" [+*]+ b* (c [a-z]+)+') == 'a ::= "+*" [+*]{1,64} b{0,64} (c [a-z]{1,64}){1,4}'
    # a group of one character is an atom: the labelSelector pattern's ([/_.A-Za-z0-9=, ()!])+ was cut to 4
    # characters ("app=" for app=prometheus) when every group got the small bound
    t = parse_tool({"name": "x", "description": "", "inputSchema": {"type": "object", "required": ["s"],
                    "properties": {"s": {"type": "string", "pattern": "^([/_.\\-A-Za-z0-9=, ()!])+$"}}}})
    g = compile_grammar(t).text
    assert _accepts(vocab, g, '{"s": "app=prometheus,tier!=db"}')
    for tool in all_tools:
        text = compile_grammar(tool).text
        if text.strip() == OBJECT_GBNF.strip():
            continue
        assert bound_repetition(text) == text, tool.name  # nothing left to bound


def test_a_property_of_any_value_compiles_instead_of_falling_back(vocab):
    # github projects_write: "value" has only a description; the converter raised and the whole tool fell back,
    # and a tune-split output left out the required "method"
    t = parse_tool({"name": "x", "description": "", "inputSchema": {"type": "object", "required": ["method"],
                    "properties": {"method": {"type": "string", "enum": ["add", "delete"]},
                                   "value": {"description": "Any JSON value is accepted"}}}})
    g = compile_grammar(t)
    assert not g.fallback
    for v in ('"x"', "3", "null", '{"a": 1}', "[1, 2]", "true"):
        assert _accepts(vocab, g.text, '{"method": "add", "value": ' + v + "}"), v
    assert not _accepts(vocab, g.text, '{"value": 3}')
