"""Prompt assembly: system + signature + pruned conversation window + query, in the model's chat template."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

# The system prompt and the worked examples are the same for every tool and every turn: they form a
# constant prefix that stays in the KV cache across turns. The tool's signature and the request come last.
SYSTEM = (
    "You fill in the JSON arguments of one function call. Use only values written in the request or the "
    "conversation, copied character for character (names, paths, numbers, quoted text). Map words to the "
    "allowed choices. Leave out every argument the request does not give."
)
# One worked example from a domain no registered tool covers, so its values cannot leak into real calls. It
# shows copying paths verbatim and words mapped onto an enum and a boolean. (Three examples measured no
# better on the tuning sample and cost ~200 more tokens of re-prefill: docs/experiments/args_experiments.md.)
# The function comes before the request: without history, everything before the function's signature is
# the same for every tool and turn, so a tool's compiled KV block (.atb) lands exactly at its compile anchor.
EXAMPLES = (
    ('Function: backup_folder(source_dir: str, dest_dir: str, compress?: bool, mode?: "full"|"incremental")\n'
     "Request: copy /var/photos/2019 to /mnt/nas/bk as a compressed full backup",
     '{"source_dir": "/var/photos/2019", "dest_dir": "/mnt/nas/bk", "compress": true, "mode": "full"}'),
)
# Marks where the tool view sits in the rendered prompt (split out to tokenize the prompt in segments).
VIEW_MARK = "\x00NEXUS_TOOL_VIEW\x00"

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Turn:
    role: str
    content: str


def surrogate(content: str, limit: int) -> str:
    """A short stand-in for a bulky tool payload: its kind and size, and its first characters."""
    text = content.strip()
    if len(text) <= limit:
        return text
    kind = "text"
    try:
        parsed = json.loads(text)
        kind = f"JSON {type(parsed).__name__}" + (f" with {len(parsed)} items" if isinstance(parsed, (list, dict)) else "")
    except ValueError:
        pass
    return f"[tool output: {kind}, {len(text)} chars] {text[: limit // 2]}…"


def prune_history(history: Sequence[Turn], max_turns: int, turn_chars: int) -> list[Turn]:
    """Recent turns verbatim (cut to ``turn_chars``), tool payloads replaced by surrogates."""
    out: list[Turn] = []
    for t in list(history)[-max_turns:] if max_turns > 0 else []:
        role = t.role if t.role in ("user", "assistant") else "tool"
        if role == "tool":
            out.append(Turn("user", "Tool result: " + surrogate(t.content, turn_chars // 2)))
        else:
            text = t.content if len(t.content) <= turn_chars else t.content[:turn_chars] + "…"
            out.append(Turn(role, text))
    return out


def copy_source(query: str, window: Sequence[Turn]) -> str:
    """The text stated values are copied from (copy bias, slot reader): the pruned window's turns and the
    request, one per line."""
    return "\n".join([t.content for t in window] + [query])


def prefix_messages() -> list[dict[str, str]]:
    """The constant head of every prompt: system + worked examples."""
    msgs = [{"role": "system", "content": SYSTEM}]
    for q, a in EXAMPLES:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return msgs


def request_text(tool_view: str, query: str, history: Sequence[Turn]) -> str:
    """The final user turn: the pruned conversation window, the tool (its signature, or its whole schema in
    the full-schema arm) and the request."""
    parts = []
    if history:
        parts.append("Conversation so far:\n" + "\n".join(f"{t.role}: {t.content}" for t in history) + "\n")
    parts.append(f"Function: {tool_view}\nRequest: {query}")
    return "\n".join(parts)


def build_messages(tool_view: str, query: str, history: Sequence[Turn]) -> list[dict[str, str]]:
    return [*prefix_messages(), {"role": "user", "content": request_text(tool_view, query, history)}]


@dataclass(frozen=True)
class PromptText:
    """A rendered prompt cut around the tool view: ``head + view + tail``. ``view`` starts with the space
    after "Function:", so the cut sits on a pre-token boundary and the three parts tokenize independently."""

    head: str
    view: str
    tail: str


def split_prompt(template: ChatTemplate, tool_view: str, query: str, history: Sequence[Turn]) -> PromptText:
    text = template.render(build_messages(VIEW_MARK, query, history))
    head, sep, tail = text.partition(VIEW_MARK)
    if not sep or VIEW_MARK in tail:
        raise ValueError("chat template lost or repeated the tool view")
    if head.endswith(" "):
        head, view = head[:-1], " " + tool_view
    else:
        view = tool_view
    return PromptText(head, view, tail)


class ChatTemplate:
    """Renders messages with the model's own Jinja chat template (GGUF metadata), ChatML otherwise."""

    def __init__(self, template: str | None, bos: str = "", eos: str = ""):
        import jinja2
        import jinja2.sandbox

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson  # as Hugging Face renders chat templates: plain JSON, no HTML escaping
        self.source = template or CHATML
        self._tpl = env.from_string(self.source)
        self.bos, self.eos = bos, eos

    def render(self, messages: list[dict[str, str]], tools: list[dict] | None = None) -> str:
        """The prompt up to the assistant's turn; ``tools``: OpenAI-style function entries, for a template that
        writes them (Qwen2.5's ``# Tools`` system section); a template without tools ignores them."""
        def raise_exception(msg: str):
            raise ValueError(msg)

        return self._tpl.render(messages=messages, tools=tools, add_generation_prompt=True, bos_token=self.bos,
                                eos_token=self.eos, raise_exception=raise_exception)


def _tojson(value, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
