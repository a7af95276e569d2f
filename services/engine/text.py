"""Text answers: the engine's path for a turn that calls no tool (a Generate request without a tool: the OpenAI
front's ``tool_choice: "none"``, or ``"auto"`` right after a tool result).

The conversation goes through the model's own chat template as it is: no signature, no grammar, no copy bias, no KV
splice (``Engine.generate_text``). This module holds what needs no model: the turns as chat messages and the result.
No protobuf here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.runtime.prompt import Turn

TOOL_RESULT = "Tool result: "


@dataclass(frozen=True)
class TextResult:
    """The final event of a text answer (after its ``Token`` pieces)."""

    text: str
    first_token_ms: float
    total_ms: float
    prefill_ms: float
    prompt_tokens: int
    completion_tokens: int
    # stopped at max_tokens (or the context's end) rather than at the model's end of turn
    truncated: bool
    # oldest turns left out so that the prompt and max_tokens fit the context
    dropped_turns: int = 0


def chat_messages(history: Sequence[Turn], query: str) -> list[dict[str, str]]:
    """The conversation as chat-template messages: the system turns first (joined), then the user and assistant turns
    in order, ``query`` (when not blank) as the last user turn. A tool result becomes a user turn ("Tool result:
    ..."), any other role too: not every chat template knows a ``tool`` role. Blank turns are left out and
    consecutive turns of one role joined (some templates refuse two user turns in a row)."""
    system = [t.content.strip() for t in history if t.role in ("system", "developer") and t.content.strip()]
    out: list[dict[str, str]] = [{"role": "system", "content": "\n\n".join(system)}] if system else []
    turns = [t for t in history if t.role not in ("system", "developer")]
    if query.strip():
        turns.append(Turn("user", query))
    for t in turns:
        text = t.content.strip()
        if not text:
            continue
        role = t.role if t.role in ("user", "assistant") else "user"
        if t.role == "tool":
            text = TOOL_RESULT + text
        if out and out[-1]["role"] == role and role != "system":
            out[-1] = {"role": role, "content": out[-1]["content"] + "\n\n" + text}
        else:
            out.append({"role": role, "content": text})
    return out


def droppable(messages: list[dict[str, str]]) -> int | None:
    """The index of the oldest message that may be left out to fit the context (never the system prompt nor the
    last message), or None."""
    first = 1 if messages and messages[0]["role"] == "system" else 0
    return first if len(messages) - first > 1 else None
