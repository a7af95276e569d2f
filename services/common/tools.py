"""MCP tool definitions: parsing, validation, canonical form and content hash."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from services.common.errors import InvalidArgument, ResourceExhausted, SchemaError

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
MAX_TOOL_JSON_BYTES = 256 * 1024


@dataclass(frozen=True)
class Tool:
    """One MCP tool: ``name``, ``description`` and its JSON Schema ``input_schema``."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def canonical_json(self) -> str:
        """The tool's canonical JSON: sorted keys, no whitespace. What the schema hash covers."""
        return json.dumps(
            {"name": self.name, "description": self.description, "inputSchema": self.input_schema},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @functools.cached_property
    def schema_hash(self) -> str:
        """SHA-256 of the canonical JSON, hex. Computed once per object (a tool is not changed once made: the
        OpenAI front looks up the same request tools' hashes on every request)."""
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    def to_json(self) -> str:
        return self.canonical_json()


def _check_json_schema(name: str, schema: Any) -> None:
    import jsonschema

    if not isinstance(schema, dict):
        raise SchemaError(f"tool {name!r}: inputSchema must be a JSON object, got {type(schema).__name__}")
    if schema.get("type", "object") != "object":
        raise SchemaError(f"tool {name!r}: inputSchema must have type 'object', got {schema.get('type')!r}")
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaError(f"tool {name!r}: inputSchema.properties must be an object")
    try:
        validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator_cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise SchemaError(f"tool {name!r}: invalid JSON Schema at {path}: {e.message}") from e


def parse_tool(raw: str | bytes | dict[str, Any]) -> Tool:
    """Parse one MCP tool from JSON text (or an already-decoded dict), validating it.

    Raises ``InvalidArgument``/``SchemaError`` naming the problem, ``ResourceExhausted`` when too large.
    """
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidArgument(f"tool JSON is not valid UTF-8: {e}") from e
    if isinstance(raw, str):
        if len(raw.encode("utf-8")) > MAX_TOOL_JSON_BYTES:
            raise ResourceExhausted(f"tool JSON is {len(raw)} bytes; the limit is {MAX_TOOL_JSON_BYTES}")
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise SchemaError(f"tool is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from e
    else:
        data = raw
    if not isinstance(data, dict):
        raise SchemaError(f"tool must be a JSON object, got {type(data).__name__}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise SchemaError("tool has no 'name' (a non-empty string is required)")
    if not NAME_RE.match(name):
        raise SchemaError(f"tool name {name!r} must match {NAME_RE.pattern}")
    desc = data.get("description", "")
    if not isinstance(desc, str):
        raise SchemaError(f"tool {name!r}: 'description' must be a string")
    schema = data.get("inputSchema", data.get("input_schema", {"type": "object", "properties": {}}))
    _check_json_schema(name, schema)
    return Tool(name=name, description=desc, input_schema=schema)


def load_registry_dir(path: str) -> list[Tool]:
    """Load every tool from a directory of registry files like ``data/mcp_tools``
    (``{"server", "tools": [...]}``) or plain lists of tools."""
    import pathlib

    tools: list[Tool] = []
    seen: set[str] = set()
    root = pathlib.Path(path)
    if not root.is_dir():
        raise InvalidArgument(f"tool directory not found: {path}")
    for f in sorted(root.glob("*.json")):
        data = json.loads(f.read_text())
        items = data.get("tools", []) if isinstance(data, dict) else data
        for item in items:
            tool = parse_tool(item)
            if tool.name in seen:
                raise InvalidArgument(f"duplicate tool name {tool.name!r} in {f}")
            seen.add(tool.name)
            tools.append(tool)
    return tools
