"""The compact typed signature ("IR") of a tool that the engine generates arguments over.

``create_pull_request(owner: str, repo: str, title: str, head: str, base: str, body?: str, draft?: bool)``
followed by the first words of the description (~11 tokens a tool; without it the tuning sample scored the
same but e.g. "Tokyo" no longer maps to the IANA name get_current_time asks for — docs/experiments/args_experiments.md).
Optional parameters carry ``?``, enums are inlined
(``state?: "open"|"closed"``), nested objects are flattened one level, arrays read ``T[]`` (an array of objects
shows its items' members one level deep, like an object).
"""

from __future__ import annotations

import json
import re
from typing import Any

from services.common.tools import Tool

# v4: grammars bound arrays (MAX_ARRAY_ITEMS); v5: arrays of objects show their members, nested members in
# param_order (signature and grammar: edit_file's edits read {oldText, newText}, no longer newText first)
# v6: dependentRequired in the grammar (an anyOf of variants); v7: numeric bounds, bounded repetition and
# any-value properties in the grammar (services/compiler/grammar.py)
IR_VERSION = "nexus-ir-v7"

_TYPE_NAMES = {"string": "str", "integer": "int", "number": "num", "boolean": "bool", "null": "null"}
MAX_ENUM = 6
MAX_DESC_WORDS = 12


def _resolve(schema: Any, root: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and depth < 8:
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return _resolve(node, root, depth + 1)
    return schema


def type_hint(schema: Any, root: dict[str, Any], depth: int = 0) -> str:
    """A short type for a JSON Schema node."""
    s = _resolve(schema, root)
    if "enum" in s and isinstance(s["enum"], list):
        vals = [v for v in s["enum"] if isinstance(v, (str, int, float, bool))]
        shown = "|".join(f'"{v}"' if isinstance(v, str) else str(v).lower() for v in vals[:MAX_ENUM])
        return shown + ("|…" if len(vals) > MAX_ENUM else "") if shown else "any"
    if "const" in s:
        return repr(s["const"])
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            parts = [type_hint(x, root, depth + 1) for x in s[key]]
            parts = [p for p in dict.fromkeys(parts) if p != "null"]
            return "|".join(parts) or "any"
    t = s.get("type")
    if isinstance(t, list):
        parts = [_TYPE_NAMES.get(x, str(x)) for x in t if x != "null"]
        return "|".join(parts) or "any"
    if t == "array":  # an array of objects shows its items' members: ``relations: {from: str, to: str}[]``
        return f"{type_hint(s.get('items', {}), root, depth)}[]"
    if t == "object" or "properties" in s:
        props = s.get("properties")
        if isinstance(props, dict) and props and depth < 1:
            req = set(s.get("required", []) or [])
            inner = ", ".join(f"{k}{'' if k in req else '?'}: {type_hint(props[k], root, depth + 1)}"
                              for k in param_order(s))
            return "{" + inner + "}"
        return "obj"
    return _TYPE_NAMES.get(t, "any") if isinstance(t, str) else "any"


def short_description(text: str, max_words: int = MAX_DESC_WORDS) -> str:
    """First sentence of a description, at most ``max_words`` words."""
    text = re.sub(r"\s+", " ", text or "").strip()
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    words = first.split(" ")
    out = " ".join(words[:max_words]).rstrip(".")
    return out + ("…" if len(words) > max_words else "")


def param_order(schema: dict[str, Any]) -> list[str]:
    """Required parameters in the order the schema's ``required`` lists them (servers write it in the natural
    order, owner/repo/title/head/base, while many sort ``properties`` alphabetically), then the optional ones by
    name. A function of the canonical schema only (the registry stores tools as canonical JSON, which sorts
    object keys), so the compiler and the engine derive the same text and tokens. The signature and the
    grammar use the same order, so the model fills parameters as shown."""
    props = schema.get("properties", {}) or {}
    req = [k for k in dict.fromkeys(schema.get("required", []) or []) if k in props]
    return req + sorted(k for k in props if k not in req)


def signature(tool: Tool, with_description: bool = True) -> str:
    """The tool's compact signature text (a function of the canonical schema: object keys sorted)."""
    schema = json.loads(json.dumps(tool.input_schema, sort_keys=True))
    props = schema.get("properties", {}) or {}
    req = set(schema.get("required", []) or [])
    ordered = param_order(schema)
    params = ", ".join(f"{k}{'' if k in req else '?'}: {type_hint(props[k], schema)}" for k in ordered)
    sig = f"{tool.name}({params})"
    if with_description and tool.description:
        sig += f" - {short_description(tool.description)}"
    return sig
