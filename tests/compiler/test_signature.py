from services.common.tools import parse_tool
from services.compiler.signature import short_description, signature


def _tool(props, required=(), desc="Create a new pull request in a GitHub repository. More text."):
    return parse_tool({"name": "create_pull_request", "description": desc,
                       "inputSchema": {"type": "object", "properties": props, "required": list(required)}})


def test_required_first_optional_marked_types_short():
    t = _tool({"draft": {"type": "boolean"}, "owner": {"type": "string"}, "count": {"type": "integer"}},
              required=["owner"])
    assert signature(t, with_description=False) == "create_pull_request(owner: str, count?: int, draft?: bool)"


def test_enums_inline_and_arrays_and_nested_objects():
    t = _tool({
        "state": {"type": "string", "enum": ["open", "closed"]},
        "labels": {"type": "array", "items": {"type": "string"}},
        "target": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    })
    sig = signature(t, with_description=False)
    assert 'state?: "open"|"closed"' in sig
    assert "labels?: str[]" in sig
    assert "target?: {path: str}" in sig


def test_refs_are_resolved():
    t = parse_tool({"name": "x", "description": "", "inputSchema": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "integer"}}}})
    assert signature(t) == "x(p?: int)"


def test_description_is_first_sentence_truncated():
    assert short_description("Create a new pull request in a GitHub repository. More text.") == \
        "Create a new pull request in a GitHub repository"
    long = " ".join(["word"] * 40)
    assert short_description(long).endswith("…")
    assert len(short_description(long).split()) == 12


def test_every_registry_tool_has_a_signature_naming_all_required_params(all_tools):
    for t in all_tools:
        sig = signature(t)
        assert sig.startswith(t.name + "(")
        for req in t.input_schema.get("required", []) or []:
            assert f"{req}:" in sig, (t.name, req)


def test_signature_and_grammar_depend_only_on_the_canonical_schema(all_tools):
    """The registry stores tools as canonical JSON (object keys sorted): a tool read back from it must give the
    same signature and grammar as the tool the compiler was handed, or the KV block's tokens would not match."""
    from services.common.tools import parse_tool
    from services.compiler.grammar import compile_grammar

    for tool in all_tools:
        back = parse_tool(tool.to_json())
        assert signature(back) == signature(tool), tool.name
        assert compile_grammar(back).text == compile_grammar(tool).text, tool.name


def test_required_parameters_follow_the_required_list():
    t = _tool({"base": {"type": "string"}, "draft": {"type": "boolean"}, "owner": {"type": "string"},
               "repo": {"type": "string"}, "body": {"type": "string"}}, required=("owner", "repo", "base"))
    assert signature(t).startswith("create_pull_request(owner: str, repo: str, base: str, body?: str, draft?: bool)")


def test_arrays_of_objects_show_their_members_in_the_required_order():
    from services.compiler.grammar import compile_grammar

    item = {"type": "object", "properties": {"newText": {"type": "string"}, "oldText": {"type": "string"},
                                             "note": {"type": "string"}}, "required": ["oldText", "newText"]}
    t = _tool({"edits": {"type": "array", "items": item}, "path": {"type": "string"}}, required=("path", "edits"))
    assert signature(t, with_description=False) == \
        "create_pull_request(path: str, edits: {oldText: str, newText: str, note?: str}[])"
    # the grammar writes the required members in the same order (canonical key order put newText first)
    from services.compiler.grammar import schema_for_matcher

    schema, _ = schema_for_matcher(t)
    assert list(schema["properties"]["edits"]["items"]["properties"]) == ["oldText", "newText", "note"]
    assert compile_grammar(t).text.index('"oldText"') < compile_grammar(t).text.index('"newText"')
    deep = _tool({"a": {"type": "array", "items": {"type": "object", "properties": {
        "b": {"type": "array", "items": {"type": "object", "properties": {"c": {"type": "string"}}}}}}}})
    assert signature(deep, with_description=False) == "create_pull_request(a?: {b?: obj[]}[])"  # one level deep
