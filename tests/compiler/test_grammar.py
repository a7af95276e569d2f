"""Grammars for the real registry: llguidance's, compiled from each tool's JSON Schema, checked token by token with
the real SmolLM2 vocabulary (what the engine samples under)."""

import json

import jsonschema
import pytest

from services.common.tools import parse_tool
from services.compiler.grammar import (
    ANY_OBJECT,
    MAX_ARRAY_ITEMS,
    MAX_STRING_CHARS,
    compile_grammar,
    grammar_fingerprint,
    grammar_text,
)


@pytest.fixture(scope="module")
def vocabulary():
    import llama_cpp

    from services.common.models import small_gguf_path
    from services.engine.sampling import Vocabulary

    llm = llama_cpp.Llama(model_path=str(small_gguf_path()), vocab_only=True, verbose=False)
    yield llm, Vocabulary(llama_cpp, llm._model.vocab, llm.n_vocab())
    llm.close()


def _accepts(vocabulary, grammar: str, text: str) -> bool:
    """Whether the engine's sampler accepts ``text`` token by token (the real model's tokens) and is then complete."""
    from services.engine.sampling import GrammarSampler

    llm, vocab = vocabulary
    s = GrammarSampler(vocab, grammar)
    for tok in llm.tokenize(text.encode(), add_bos=False, special=False):
        if not s.allows(tok):
            return False
        s.accept(tok)
    return s.allows(llm.token_eos())


def _tool(schema: dict, name: str = "x"):
    return parse_tool({"name": name, "description": "", "inputSchema": {"type": "object", **schema}})


def test_every_registry_schema_compiles_and_what_it_cannot_enforce_is_named(all_tools, vocabulary):
    from services.engine.sampling import GrammarSampler

    unchecked = {}
    for t in all_tools:
        g = compile_grammar(t)
        assert not g.fallback, (t.name, g.reason)
        GrammarSampler(vocabulary[1], g.text)  # compiles for a real vocabulary
        if g.unchecked:
            unchecked[t.name] = g.unchecked
    assert unchecked == {"browser_drop": ("propertyNames",)}


def test_the_grammar_artifact_is_keyed_by_its_format_and_library_release(monkeypatch):
    import importlib.metadata

    fp = grammar_fingerprint()
    assert len(fp) == 64 and fp == grammar_fingerprint()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.0.1")
    assert grammar_fingerprint() != fp  # another llguidance release writes under another key


def test_a_pattern_the_regex_engine_cannot_read_is_left_to_validation(vocabulary):
    g = compile_grammar(_tool({"properties": {"p": {"type": "string", "pattern": "(?<=a)b"},
                                              "n": {"type": "integer"}}, "required": ["n"]}))
    assert not g.fallback and g.unchecked == ("pattern",)
    assert _accepts(vocabulary, g.text, '{"n": 3, "p": "anything"}')
    assert not _accepts(vocabulary, g.text, '{"n": "three"}')  # the rest of the schema still holds


def test_a_schema_nothing_of_which_compiles_samples_any_object(vocabulary):
    g = compile_grammar(_tool({"properties": {"a": {"$ref": "#/$defs/missing"}}}))
    assert g.fallback and "missing" in g.reason and g.text == grammar_text(ANY_OBJECT)
    assert _accepts(vocabulary, g.text, '{"a": 1, "b": [true]}')
    assert not _accepts(vocabulary, g.text, "[1]")


def test_free_strings_are_bounded_so_loops_end(vocabulary):
    g = compile_grammar(_tool({"properties": {"p": {"type": "string"}}, "required": ["p"]})).text
    assert _accepts(vocabulary, g, '{"p": "' + "a" * MAX_STRING_CHARS + '"}')
    assert not _accepts(vocabulary, g, '{"p": "' + "a" * (MAX_STRING_CHARS + 1) + '"}')


def test_strings_admit_no_raw_control_characters(vocabulary):
    # JSON forbids an unescaped newline inside a string (a 135M model once wrote "\n#\n#..." into a value)
    g = compile_grammar(_tool({"properties": {"step": {"type": "string"}}, "required": ["step"]})).text
    assert _accepts(vocabulary, g, '{"step": "build\\nrun"}')  # escaped: fine
    assert not _accepts(vocabulary, g, '{"step": "build\nrun"}')
    assert not _accepts(vocabulary, g, '{"step": "a\tb"}')


def test_objects_are_closed_and_members_come_in_the_signatures_order(vocabulary):
    g = compile_grammar(_tool({"properties": {"newText": {"type": "string"}, "oldText": {"type": "string"}},
                               "required": ["oldText", "newText"]})).text
    assert _accepts(vocabulary, g, '{"oldText": "a", "newText": "b"}')
    assert not _accepts(vocabulary, g, '{"newText": "b", "oldText": "a"}')
    assert not _accepts(vocabulary, g, '{"oldText": "a", "newText": "b", "extra": 1}')


def test_arrays_are_bounded_unless_the_schema_says_otherwise(vocabulary):
    def arr(extra):
        return _tool({"properties": {"ids": {"type": "array", "items": {"type": "integer"}, **extra}},
                      "required": ["ids"]})
    many = lambda n: '{"ids": [' + ", ".join(str(i) for i in range(n)) + "]}"  # noqa: E731
    g = compile_grammar(arr({})).text
    assert _accepts(vocabulary, g, many(MAX_ARRAY_ITEMS)) and not _accepts(vocabulary, g, many(MAX_ARRAY_ITEMS + 1))
    g = compile_grammar(arr({"maxItems": 12})).text  # the schema's own bound wins
    assert _accepts(vocabulary, g, many(12)) and not _accepts(vocabulary, g, many(13))


def test_dependent_required_is_enforced(vocabulary):
    # kiali_get_resource_details: resourceName needs namespaces (llguidance does not implement dependentRequired;
    # an evaluation output {"resourceType": "app", "resourceName": "cart"} once failed schema validation)
    t = _tool({"required": ["resourceType"], "dependentRequired": {"resourceName": ["namespaces"]},
               "properties": {"resourceType": {"type": "string", "enum": ["app", "service"]},
                              "resourceName": {"type": "string"}, "namespaces": {"type": "string"},
                              "meshCluster": {"type": "string"}}})
    c = compile_grammar(t)
    assert not c.fallback and not c.unchecked
    assert _accepts(vocabulary, c.text, '{"resourceType": "app", "resourceName": "cart", "namespaces": "shop"}')
    assert _accepts(vocabulary, c.text, '{"resourceType": "app", "meshCluster": "west"}')
    assert not _accepts(vocabulary, c.text, '{"resourceType": "app", "resourceName": "cart"}')
    assert not _accepts(vocabulary, c.text, '{"resourceType": "app", "resourceName": "cart", "meshCluster": "west"}')


def test_too_many_dependencies_are_left_to_validation():
    props = {f"k{i}": {"type": "string"} for i in range(8)}
    t = _tool({"properties": props, "dependentRequired": {f"k{i}": [f"k{i + 1}"] for i in range(0, 8, 2)}})
    g = compile_grammar(t)
    assert not g.fallback and g.unchecked == ("dependentRequired",)


@pytest.mark.parametrize("prop,good,bad", [
    # GitHub's perPage (28 tools): llama.cpp's converter ignored the bounds and tune lines wrote 1000 and 10^15
    ({"type": "number", "minimum": 1, "maximum": 100}, ["1", "7", "42", "99", "100", "2.5", "99.75"],
     ["0", "101", "1000", "-3", "100.5", "1000000000000000"]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000000}, ["1", "5000", "999999"],
     ["0", "1000000", "2.5"]),
    ({"type": "integer", "minimum": 0}, ["0", "12", "123456789"], ["-1", "1.5"]),
    ({"type": "integer", "minimum": 5, "maximum": 9}, ["5", "9"], ["4", "10"]),
    ({"type": "integer", "maximum": 30}, ["-4", "0", "29", "30"], ["31", "100"]),
])
def test_numeric_bounds_are_enforced(vocabulary, prop, good, bad):
    t = _tool({"properties": {"n": prop}, "required": ["n"]})
    g = compile_grammar(t)
    assert not g.fallback
    for v in good:
        assert _accepts(vocabulary, g.text, '{"n": ' + v + "}"), v
        jsonschema.validate(json.loads('{"n": ' + v + "}"), t.input_schema)
    for v in bad:
        assert not _accepts(vocabulary, g.text, '{"n": ' + v + "}"), v


def test_a_property_of_any_value_compiles(vocabulary):
    # github projects_write: "value" has only a description
    g = compile_grammar(_tool({"required": ["method"],
                               "properties": {"method": {"type": "string", "enum": ["add", "delete"]},
                                              "value": {"description": "Any JSON value is accepted"}}}))
    assert not g.fallback
    for v in ('"x"', "3", "null", '{"a": 1}', "[1, 2]", "true"):
        assert _accepts(vocabulary, g.text, '{"method": "add", "value": ' + v + "}"), v
    assert not _accepts(vocabulary, g.text, '{"value": 3}')


def test_patterns_are_enforced(vocabulary):
    # kubernetes fieldSelector
    pat = "^[.\\-A-Za-z0-9]+([=!,]{1,2}[./\\-A-Za-z0-9]+)+$"
    g = compile_grammar(_tool({"properties": {"f": {"type": "string", "pattern": pat}}, "required": ["f"]}))
    assert not g.fallback and not g.unchecked
    assert _accepts(vocabulary, g.text, '{"f": "status.phase=Running"}')
    assert not _accepts(vocabulary, g.text, '{"f": "no selector"}')
