"""GBNF grammar for a tool's arguments, compiled from its JSON Schema by llama-cpp-python's
``json_schema_to_gbnf``. Schemas it cannot express fall back to a generic JSON-object grammar
(the output is then validated against the schema after the fact, and the fallback is counted)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

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


def bound_strings(text: str, max_chars: int = MAX_STRING_CHARS) -> str:
    """Bound the generic ``string`` rule of a ``json_schema_to_gbnf`` grammar to ``max_chars`` characters."""
    return text.replace(_FREE_STRING, f'string ::= "\\"" char{{0,{max_chars}}} "\\"" space')


@dataclass(frozen=True)
class CompiledGrammar:
    text: str
    fallback: bool
    reason: str = ""


def _schema_for_grammar(tool: Tool) -> dict:
    # canonical key order (as the registry stores tools), so the grammar is a function of the schema hash
    schema = json.loads(json.dumps(tool.input_schema, sort_keys=True))
    schema.setdefault("type", "object")
    props = schema.get("properties")
    if isinstance(props, dict):  # the signature's parameter order (required first, as `required` lists them)
        schema["properties"] = {k: props[k] for k in param_order(schema)}
    # Drop keywords that only document (they change nothing the grammar can enforce).
    for k in ("$schema", "title", "description", "examples"):
        schema.pop(k, None)
    return schema


def compile_grammar(tool: Tool) -> CompiledGrammar:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        text = bound_strings(json_schema_to_gbnf(json.dumps(_schema_for_grammar(tool))))
        return CompiledGrammar(text=text, fallback=False)
    except Exception as e:  # noqa: BLE001 - the converter raises assorted errors on exotic schemas
        log.warning("grammar fallback", extra={"tool": tool.name, "error": repr(e)})
        return CompiledGrammar(text=OBJECT_GBNF.strip() + "\n", fallback=True, reason=repr(e)[:200])
