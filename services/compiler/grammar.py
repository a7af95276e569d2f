"""The grammar a tool's arguments are sampled under: llguidance's grammar for the tool's JSON Schema, made ready
for a small model first (``schema_for_matcher``: free strings and arrays bounded, objects closed,
``dependentRequired`` written as variants, properties in the signature's order).

llguidance enforces the schema itself (types, enums, numeric bounds, patterns, formats, lengths); a keyword it
does not implement (``propertyNames``, an unknown ``format``) is left to the check after sampling and named in
``CompiledGrammar.unchecked``, and a pattern its regex engine cannot read (look-around) likewise. A schema nothing
of which compiles samples under any JSON object (``fallback``). Either way the engine validates every call against
the tool's ``inputSchema``."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from services.common.tools import Tool
from services.compiler.signature import param_order

log = logging.getLogger("nexus.compiler.grammar")

# What the grammar artifact is: llguidance's top-level grammar (JSON text) for the schema. Part of its store key,
# so a store written by another grammar compiler is never read as this one.
GRAMMAR_FORMAT = "llguidance-json-schema-v1"

# Free strings are bounded (characters): a small model that starts repeating inside a value reaches the
# closing quote instead of running to max_tokens. Values users state are far shorter than this.
MAX_STRING_CHARS = 160
# Arrays without a maxItems get this bound: a small model that starts listing (ids 1, 2, 3, …, enum values over
# and over) stops there instead of running to the token budget.
MAX_ARRAY_ITEMS = 10
# dependentRequired (which llguidance does not implement) becomes an anyOf of at most this many variants
MAX_DEPENDENT_VARIANTS = 8
# JSON as the signature prompt writes it: at most one space where JSON allows whitespace
_OPTIONS = {"whitespace_pattern": " ", "lenient": True}
ANY_OBJECT: dict = {"type": "object"}


def bound_arrays(node, max_items: int = MAX_ARRAY_ITEMS):
    """A copy of a JSON Schema (fragment) with every array bounded to ``max_items`` unless it says otherwise."""
    if isinstance(node, list):
        return [bound_arrays(v, max_items) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: bound_arrays(v, max_items) for k, v in node.items()}
    t = out.get("type")
    if (t == "array" or (isinstance(t, list) and "array" in t)) and "maxItems" not in out:
        out["maxItems"] = max(max_items, int(out.get("minItems", 0) or 0))
    return out


def bound_strings(node: Any, max_chars: int = MAX_STRING_CHARS) -> Any:
    """A copy of a JSON Schema (fragment) with every string that has no ``enum``, ``const``, ``pattern`` or
    ``maxLength`` of its own bounded to ``max_chars`` (llguidance cannot always intersect a pattern with a length)."""
    if isinstance(node, list):
        return [bound_strings(v, max_chars) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: bound_strings(v, max_chars) for k, v in node.items()}
    if out.get("type") == "string" and not {"enum", "const", "pattern", "maxLength"} & set(out):
        out["maxLength"] = max(max_chars, int(out.get("minLength", 0) or 0))
    return out


def close_objects(node: Any, in_all_of: bool = False) -> Any:
    """A copy of a JSON Schema (fragment) in which an object with ``properties`` and no ``additionalProperties``
    admits no other key (JSON Schema admits any: a small model adds keys of its own). The members of an ``allOf``
    stay open: closed, their intersection would admit only the keys all of them list."""
    if isinstance(node, list):
        return [close_objects(v, in_all_of) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "properties" and isinstance(v, dict):  # a map of names to subschemas, not a schema
            out[k] = {name: close_objects(sub) for name, sub in v.items()}
        else:
            out[k] = close_objects(v, in_all_of=k == "allOf")
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out and not in_all_of:
        out["additionalProperties"] = False
    return out


def split_dependent_required(node: Any) -> Any:
    """``dependentRequired`` (kiali: ``resourceName`` needs ``namespaces``) as an ``anyOf`` of plain objects: for
    each dependency, a variant without the key and one where the key and what it needs are required. More than
    ``MAX_DEPENDENT_VARIANTS`` variants raise ValueError (the keyword is then checked after sampling only)."""
    if isinstance(node, list):
        return [split_dependent_required(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: split_dependent_required(v) for k, v in node.items()}
    dep, props = node.get("dependentRequired"), node.get("properties")
    if not isinstance(dep, dict) or not isinstance(props, dict):
        return node
    defs = {k: node[k] for k in ("$defs", "definitions") if k in node}  # stay at the root for "#/$defs/..."
    base = {k: v for k, v in node.items() if k != "dependentRequired" and k not in defs}
    variants = [base]
    for key, needs in dep.items():
        out = []
        for v in variants:
            req = list(v.get("required", []) or [])
            if key not in v["properties"]:
                out.append(v)
                continue
            if key not in req:
                out.append({**v, "properties": {k: p for k, p in v["properties"].items() if k != key},
                            "required": [r for r in req if r != key]})
            out.append({**v, "required": list(dict.fromkeys(req + [key] + list(needs)))})
        variants = out
        if len(variants) > MAX_DEPENDENT_VARIANTS:
            raise ValueError(f"dependentRequired needs more than {MAX_DEPENDENT_VARIANTS} variants")
    return {**variants[0], **defs} if len(variants) == 1 else {"anyOf": variants, **defs}


def _order_properties(node: Any) -> None:
    """Every object (nested ones too) lists its properties in ``param_order``, in place: JSON members are written in
    ``properties`` order, and canonical (sorted) order put ``newText`` before ``oldText``."""
    if isinstance(node, list):
        for v in node:
            _order_properties(v)
        return
    if not isinstance(node, dict):
        return
    props = node.get("properties")
    if isinstance(props, dict):
        node["properties"] = {k: props[k] for k in param_order(node)}
    for v in node.values():
        _order_properties(v)


def _drop(node: Any, keyword: str) -> Any:
    """A copy of a JSON Schema without ``keyword`` anywhere (property names are not keywords)."""
    if isinstance(node, list):
        return [_drop(v, keyword) for v in node]
    if not isinstance(node, dict):
        return node
    return {k: ({n: _drop(s, keyword) for n, s in v.items()} if k == "properties" and isinstance(v, dict)
                else _drop(v, keyword)) for k, v in node.items() if k != keyword}


def schema_for_matcher(tool: Tool) -> tuple[dict, list[str]]:
    """The JSON Schema the grammar is compiled from, and the keywords left out of it (checked after sampling only):
    canonical, ``dependentRequired`` split, properties in the signature's order, documentation keywords dropped,
    arrays and free strings bounded, objects closed."""
    # canonical key order (as the registry stores tools), so the grammar is a function of the schema hash
    schema = json.loads(json.dumps(tool.input_schema, sort_keys=True))
    schema.setdefault("type", "object")
    left_out: list[str] = []
    try:
        schema = split_dependent_required(schema)
    except ValueError:
        schema, left_out = _drop(schema, "dependentRequired"), ["dependentRequired"]
    _order_properties(schema)  # the signature's parameter order (required first, as `required` lists them)
    for k in ("$schema", "title", "description", "examples"):  # they only document
        schema.pop(k, None)
    return close_objects(bound_strings(bound_arrays(schema))), left_out


@dataclass(frozen=True)
class CompiledGrammar:
    text: str  # llguidance's grammar (JSON text): what ``LLMatcher`` compiles for the engine's vocabulary
    fallback: bool  # nothing of the schema compiled: any JSON object
    reason: str = ""
    unchecked: tuple[str, ...] = ()  # schema keywords the grammar does not enforce (checked after sampling only)


def grammar_text(schema: dict) -> str:
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_json_schema(schema, overrides=_OPTIONS)


_UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[.*?\])")


def _unchecked(warnings: list[str]) -> list[str]:
    """Keywords llguidance's lenient mode left out, from its warnings."""
    out: list[str] = []
    for w in warnings:
        m = _UNIMPLEMENTED.search(w)
        if m:
            try:
                out += [str(k) for k in json.loads(m.group(1))]
            except ValueError:
                out.append(w)
        elif w.startswith("Unknown format"):
            out.append("format")
        else:
            out.append(w)
    return out


def compile_grammar(tool: Tool) -> CompiledGrammar:
    """The tool's grammar; a pattern llguidance cannot read is dropped (and named), anything else that does not
    compile falls back to any JSON object (logged, counted)."""
    from llguidance import LLMatcher

    schema, left_out = schema_for_matcher(tool)
    error = ""
    for dropped in ([], ["pattern"]):  # the copy without patterns only when the schema as it is fails
        text = grammar_text(_drop(schema, "pattern") if dropped else schema)
        failed, warnings = LLMatcher.validate_grammar_with_warnings(text)
        if not failed:
            unchecked = left_out + _unchecked(warnings) + dropped
            return CompiledGrammar(text=text, fallback=False, unchecked=tuple(dict.fromkeys(unchecked)))
        error = error or "; ".join(warnings)
    log.warning("grammar fallback", extra={"tool": tool.name, "error": error[:300]})
    return CompiledGrammar(text=grammar_text(ANY_OBJECT), fallback=True, reason=error[:200])


def grammar_fingerprint() -> str:
    """What the grammar artifact's store key is keyed by: its format and the llguidance release that wrote it."""
    from importlib.metadata import version

    return hashlib.sha256(f"{GRAMMAR_FORMAT}/{version('llguidance')}".encode()).hexdigest()
