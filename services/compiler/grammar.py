"""GBNF grammar for a tool's arguments, compiled from its JSON Schema by llama-cpp-python's
``json_schema_to_gbnf``. Schemas it cannot express fall back to a generic JSON-object grammar
(the output is then validated against the schema after the fact, and the fallback is counted)."""

from __future__ import annotations

import json
import logging
import math
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


def bound_schema_strings(node: Any, max_chars: int = MAX_STRING_CHARS) -> Any:
    """A copy of a JSON Schema (fragment) with free strings bounded as ``bound_strings`` bounds the GBNF's, written
    as ``maxLength`` (for engines that read the schema itself); a string with an enum, const, pattern, format or
    maxLength of its own keeps it."""
    if isinstance(node, list):
        return [bound_schema_strings(v, max_chars) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: bound_schema_strings(v, max_chars) for k, v in node.items()}
    if out.get("type") == "string" and not {"enum", "const", "pattern", "format", "maxLength"} & set(out):
        out["maxLength"] = max_chars
    return out


def close_objects(node: Any, in_all_of: bool = False) -> Any:
    """A copy of a JSON Schema (fragment) in which an object with ``properties`` and no ``additionalProperties`` admits
    no other key, as llama.cpp's converter reads it (JSON Schema admits any: a small model adds keys of its own). The
    members of an ``allOf`` stay open: closed, their intersection would admit only the keys all of them list."""
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


# Bounded repetition: the converter turns a pattern's ``+`` / ``*`` into unbounded GBNF repetition, and a small
# model that writes digits into a pattern-constrained string (kubernetes fieldSelector: ``ns-123456...``) never
# reaches the characters the pattern needs before its closing quote; the call was cut at the hard stop as broken
# JSON (2 of 240 tune lines). Every repetition is bounded: an atom to MAX_ATOM_REPEAT, a group to MAX_GROUP_REPEAT.
MAX_ATOM_REPEAT = 64
MAX_GROUP_REPEAT = 4


def _repeats_inside(text: str) -> bool:
    """Whether the parenthesised group that ends ``text`` holds a repetition (``{``) outside its literals and
    character classes (its own ``+`` / ``*`` are already bounded when the group closes)."""
    depth, j, found = 0, len(text) - 1, False
    while j >= 0:
        ch = text[j]
        if ch in "\"]":  # skip back over a literal or a class
            open_ = '"' if ch == '"' else "["
            j -= 1
            while j >= 0 and not (text[j] == open_ and (j == 0 or text[j - 1] != "\\")):
                j -= 1
        elif ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                return found
        elif ch == "{":
            found = True
        j -= 1
    return found


def bound_repetition(text: str, atom: int = MAX_ATOM_REPEAT, group: int = MAX_GROUP_REPEAT) -> str:
    """``text`` (GBNF) with every postfix ``+`` / ``*`` outside literals and character classes replaced by
    ``{1,n}`` / ``{0,n}`` (n = ``group`` after a parenthesised group, else ``atom``)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"[":  # a literal or a character class: copied through, escapes included
            close = '"' if ch == '"' else "]"
            j = i + 1
            while j < n and text[j] != close:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            continue
        if ch == "#":  # a comment runs to the end of the line
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(text[i:j])
            i = j
            continue
        if ch in "+*":
            done = "".join(out).rstrip()
            prev = done[-1:]
            if prev and (prev in ")]\"" or prev.isalnum() or prev == "-"):
                # a group that repeats inside (``(x-1 (x-1)? [a-z]{1,64})+``) gets the small bound; a group of
                # one character (``([/_.A-Za-z0-9=, ()!])+``) is an atom
                bound = group if prev == ")" and _repeats_inside(done) else atom
                out.append(f"{{{1 if ch == '+' else 0},{bound}}}")
                i += 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)


# Numeric bounds: the converter ignores minimum / maximum (perPage 1..100 came out as 1000 and 10^15, schema-invalid
# on 2 of 240 tune lines). A number or integer with bounds in reach (lower bound none, 0 or 1; upper bound a
# whole number) is compiled to a rule of its own that admits exactly the whole numbers in range (decimals too for
# "number", below the upper bound); other bounds are left to validation after the fact.
_NUM_TOKEN = "__nexus_num_{}__"


def _le_alternatives(hi: int) -> list[str]:
    """GBNF alternatives for the whole numbers 1..hi without leading zeros; the last one is ``hi`` itself."""
    s = str(hi)
    d = len(s)
    alts = []
    if d > 1:
        alts.append("[1-9]" + (f" [0-9]{{0,{d - 2}}}" if d > 2 else ""))  # fewer digits than hi
    for i in range(d):
        low = 1 if i == 0 else 0
        top = int(s[i]) - 1
        if top >= low:
            digit = f"[{low}-{top}]" if top > low else f"[{low}]"
            prefix = f'"{s[:i]}" ' if i else ""
            rest = f" [0-9]{{{d - i - 1}}}" if d - i - 1 else ""
            alts.append(f"{prefix}{digit}{rest}")
    alts.append(f'"{s}"')
    return alts


def number_rule(node: dict) -> str | None:
    """The GBNF body for a bounded number / integer schema, or None when its bounds are out of reach."""
    t = node.get("type")
    if t not in ("integer", "number"):
        return None
    lo, hi = node.get("minimum"), node.get("maximum")
    if "exclusiveMinimum" in node or "exclusiveMaximum" in node:
        if t != "integer":
            return None
        xlo, xhi = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
        if isinstance(xlo, (int, float)) and not isinstance(xlo, bool):
            floor = math.floor(xlo) + 1  # the least integer above it
            lo = max(lo, floor) if isinstance(lo, (int, float)) else floor
        if isinstance(xhi, (int, float)) and not isinstance(xhi, bool):
            cap = math.ceil(xhi) - 1  # the greatest integer below it
            hi = min(hi, cap) if isinstance(hi, (int, float)) else cap
    for v in (lo, hi):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer()):
            return None
    lo = None if lo is None else int(lo)
    hi = None if hi is None else int(hi)
    if (lo is not None and lo not in (0, 1)) or (hi is not None and hi < max(1, lo or 0)):
        return None
    frac = ' ("." [0-9]{1,16})?' if t == "number" else ""
    if hi is None:
        alts = [f"[1-9] [0-9]{{0,15}}{frac}"]
    else:
        below = _le_alternatives(hi)
        alts = [f"{a}{frac}" for a in below[:-1]] + [below[-1]]
    if lo is None or lo == 0:
        alts.insert(0, f'"0"{frac}')
    if lo is None:
        alts.append(f'"-" [1-9] [0-9]{{0,15}}{frac}')
    return "(" + " | ".join(f"({a})" for a in alts) + ") space"


def _mark_numbers(node: Any, rules: list[str]) -> Any:
    """A copy of the schema with each bounded number the grammar can express replaced by a placeholder constant
    (its rule body appended to ``rules``); compile_grammar swaps the placeholders for the rules."""
    if isinstance(node, list):
        return [_mark_numbers(v, rules) for v in node]
    if not isinstance(node, dict):
        return node
    if any(k in node for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")) \
            and set(node) <= {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "description",
                              "default", "title", "examples"}:
        body = number_rule(node)
        if body is not None:
            rules.append(body)
            return {"const": _NUM_TOKEN.format(len(rules) - 1)}
    return {k: _mark_numbers(v, rules) for k, v in node.items()}


# A subschema that says nothing about its value (projects_write's ``value``: "Any JSON value is accepted") made the
# converter raise, and the whole tool fell back to the loose object grammar (its required ``method`` went
# missing); ``{}`` the converter reads as an object. Such a subschema becomes an explicit any-value type list.
_ANY_TYPES = ["string", "number", "boolean", "object", "array", "null"]
_SHAPES = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "items", "not", "pattern",
           "format", "additionalProperties", "prefixItems"}


def _typed(node: Any) -> Any:
    """A copy of the schema in which every property / item subschema without a shape keyword admits any value."""
    if isinstance(node, list):
        return [_typed(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _typed(v) for k, v in node.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        out["properties"] = {k: ({**v, "type": _ANY_TYPES} if isinstance(v, dict) and not _SHAPES & set(v) else v)
                             for k, v in props.items()}
    items = out.get("items")
    if isinstance(items, dict) and not _SHAPES & set(items):
        out["items"] = {**items, "type": _ANY_TYPES}
    return out


def schema_for_grammar(tool: Tool) -> dict:
    """The JSON Schema the converter reads: canonical, properties in the signature's order, dependentRequired
    split, shapeless values typed, arrays bounded, the root's documentation keywords dropped."""
    # canonical key order (as the registry stores tools), so the grammar is a function of the schema hash
    schema = json.loads(json.dumps(tool.input_schema, sort_keys=True))
    schema.setdefault("type", "object")
    schema = _typed(_split_dependent_required(schema))
    _order_properties(schema)  # the signature's parameter order (required first, as `required` lists them)
    # Drop keywords that only document (they change nothing the grammar can enforce).
    for k in ("$schema", "title", "description", "examples"):
        schema.pop(k, None)
    return bound_arrays(schema)


def schema_for_matcher(tool: Tool) -> dict:
    """The JSON Schema a schema-driven grammar engine (llguidance) reads: the converter's (``schema_for_grammar``),
    free strings bounded and objects closed as the GBNF bounds and closes them. Numeric bounds and patterns such an
    engine enforces from the schema itself."""
    return close_objects(bound_schema_strings(schema_for_grammar(tool)))


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
        rules: list[str] = []
        schema = _mark_numbers(schema_for_grammar(tool), rules)
        text = bound_repetition(bound_strings(json_schema_to_gbnf(json.dumps(schema)))).rstrip("\n") + "\n"
        for i, body in enumerate(rules):
            token = _NUM_TOKEN.format(i)
            text = text.replace(f'"\\"{token}\\""', f"nexus-num-{i}") + f"nexus-num-{i} ::= {body}\n"
        return CompiledGrammar(text=text, fallback=False)
    except Exception as e:  # noqa: BLE001 - the converter raises assorted errors on exotic schemas
        log.warning("grammar fallback", extra={"tool": tool.name, "error": repr(e)})
        return CompiledGrammar(text=OBJECT_GBNF.strip() + "\n", fallback=True, reason=repr(e)[:200])
