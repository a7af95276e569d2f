import json

import pytest

from services.common.errors import ResourceExhausted, SchemaError
from services.common.tools import parse_tool


def test_all_registry_tools_parse(all_tools):
    assert len(all_tools) == 338
    assert len({t.name for t in all_tools}) == 338


def test_schema_hash_is_canonical():
    a = parse_tool('{"name":"x","description":"d","inputSchema":{"type":"object","properties":{"a":{"type":"string"}}}}')
    b = parse_tool({"inputSchema": {"properties": {"a": {"type": "string"}}, "type": "object"}, "description": "d",
                    "name": "x"})
    assert a.schema_hash == b.schema_hash
    c = parse_tool({"name": "x", "description": "d2", "inputSchema": {"type": "object"}})
    assert c.schema_hash != a.schema_hash


@pytest.mark.parametrize(
    "raw, match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"description": "no name"}', "no 'name'"),
        ('{"name": "has space"}', "must match"),
        ('{"name": "x", "inputSchema": {"type": "array"}}', "type 'object'"),
        ('{"name": "x", "inputSchema": {"type": "object", "properties": {"a": {"type": "strin"}}}}', "invalid JSON Schema"),
        ('{"name": "x", "inputSchema": {"type": "object", "properties": []}}', "properties must be an object"),
    ],
)
def test_malformed_tools_name_the_problem(raw, match):
    with pytest.raises(SchemaError, match=match):
        parse_tool(raw)


def test_oversized_tool_is_resource_exhausted():
    big = json.dumps({"name": "x", "description": "d" * 300_000, "inputSchema": {"type": "object"}})
    with pytest.raises(ResourceExhausted):
        parse_tool(big)
