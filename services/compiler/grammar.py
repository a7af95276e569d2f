"""GBNF grammar for a tool's arguments, compiled from its JSON Schema by llama-cpp-python's
``json_schema_to_gbnf``. Schemas it cannot express fall back to a generic JSON-object grammar
(the output is then validated against the schema after the fact, and the fallback is counted)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from services.common.tools import Tool
from services.compiler.signature import param_order

log = logging.getLogger("nexus.compiler.grammar")

# Any JSON object: what the fallback grammar admits.
OBJECT_GBNF = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
"""


# Free strings are bounded (characters): a small model that starts repeating inside a value reaches the
# closing quote instead of running to max_tokens. Values users state are far shorter than this.
MAX_STRING_CHARS = 160
_FREE_STRING = 'string ::= "\\"" char* "\\"" space'
# Arrays without a maxItems get this bound: a small model that starts listing (ids 1, 2, 3, …, enum values over
# and over) stops there instead of running to the token budget.
MAX_ARRAY_ITEMS = 10


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


# llama-cpp-python's converter lets any character but a quote or backslash into a string, control characters
# included; a raw newline inside a JSON string does not parse (seen: a 135M model wrote "\n#\n#..." into a
# value). JSON forbids U+0000-U+001F unescaped.
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


def bound_strings(text: str, max_chars: int = MAX_STRING_CHARS) -> str:
    """Bound the generic ``string`` rule of a ``json_schema_to_gbnf`` grammar to ``max_chars`` characters, and
    keep control characters out of strings (they must be escaped in JSON)."""
    text = text.replace(_LOOSE_CHAR, _JSON_CHAR)
    return text.replace(_FREE_STRING, f'string ::= "\\"" char{{0,{max_chars}}} "\\"" space')


@dataclass(frozen=True)
class CompiledGrammar:
    text: str
    fallback: bool
    reason: str = ""


MAX_DEPENDENT_VARIANTS = 8


def _split_dependent_required(node: Any) -> Any:
    """``dependentRequired`` (kiali: ``resourceName`` needs ``namespaces``), which the converter ignores, as an
    ``anyOf`` of plain objects: for each dependency, a variant without the key and one where the key and what it
    needs are required. More than ``MAX_DEPENDENT_VARIANTS`` variants raise (the grammar falls back, counted)."""
    if isinstance(node, list):
        return [_split_dependent_required(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _split_dependent_required(v) for k, v in node.items()}
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
            raise ValueError(f"dependentRequired needs more than {MAX_DEPENDENT_VARIANTS} grammar variants")
    return {**variants[0], **defs} if len(variants) == 1 else {"anyOf": variants, **defs}


def _schema_for_grammar(tool: Tool) -> dict:
    # canonical key order (as the registry stores tools), so the grammar is a function of the schema hash
    schema = json.loads(json.dumps(tool.input_schema, sort_keys=True))
    schema.setdefault("type", "object")
    schema = _split_dependent_required(schema)
    _order_properties(schema)  # the signature's parameter order (required first, as `required` lists them)
    # Drop keywords that only document (they change nothing the grammar can enforce).
    for k in ("$schema", "title", "description", "examples"):
        schema.pop(k, None)
    return bound_arrays(schema)


def _order_properties(node: Any) -> None:
    """Every object (nested ones too) lists its properties in ``param_order``, in place: the converter writes
    required members in ``properties`` order, and canonical (sorted) order put ``newText`` before ``oldText``."""
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


def compile_grammar(tool: Tool) -> CompiledGrammar:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        text = bound_strings(json_schema_to_gbnf(json.dumps(_schema_for_grammar(tool))))
        return CompiledGrammar(text=text, fallback=False)
    except Exception as e:  # noqa: BLE001 - the converter raises assorted errors on exotic schemas
        log.warning("grammar fallback", extra={"tool": tool.name, "error": repr(e)})
        return CompiledGrammar(text=OBJECT_GBNF.strip() + "\n", fallback=True, reason=repr(e)[:200])
