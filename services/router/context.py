"""The routing text of a request: the query plus a pruned window of the conversation before it.

Multi-turn requests refer back ("open a pull request there", "merge it"), so the router reads the recent
turns too — but only a bounded window: the last ``max_turns`` turns verbatim (each cut at ``max_chars``),
and bulky tool payloads (role ``tool``, or any turn longer than ``payload_chars``) replaced by a short
surrogate naming their kind, size and first words. The query comes first so that truncation by the
encoder's sequence limit only ever cuts old context, and the window is newest-first for the same reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

MAX_TURNS = 4
MAX_CHARS = 300
PAYLOAD_CHARS = 400
SURROGATE_HEAD = 80


def _role_content(turn: Any) -> tuple[str, str]:
    if isinstance(turn, dict):
        return str(turn.get("role", "")), str(turn.get("content", ""))
    if isinstance(turn, (tuple, list)):
        return str(turn[0]), str(turn[1])
    return str(turn.role), str(turn.content)


def surrogate(content: str) -> str:
    """A short stand-in for a tool payload: its kind, size and first words."""
    text = content.strip()
    kind = "text"
    if text[:1] in "[{":
        try:
            doc = json.loads(text)
            if isinstance(doc, dict):
                kind = "JSON object with keys " + ", ".join(list(doc)[:6])
            elif isinstance(doc, list):
                kind = f"JSON list of {len(doc)}"
        except ValueError:
            pass
    head = re.sub(r"\s+", " ", text)[:SURROGATE_HEAD]
    return f"[tool result, {kind}, {len(text)} chars: {head}…]"


def prune_history(history: Sequence[Any], max_turns: int = MAX_TURNS, max_chars: int = MAX_CHARS,
                  payload_chars: int = PAYLOAD_CHARS) -> list[tuple[str, str]]:
    """The last ``max_turns`` non-empty turns as ``(role, text)``, oldest first: payloads become surrogates,
    other turns are kept verbatim up to ``max_chars``."""
    out: list[tuple[str, str]] = []
    for turn in reversed(history):
        if len(out) >= max_turns:
            break
        role, content = _role_content(turn)
        content = content.strip()
        if not content:
            continue
        if role == "tool" and len(content) > SURROGATE_HEAD or len(content) > payload_chars:
            content = surrogate(content)
        elif len(content) > max_chars:
            content = content[:max_chars] + "…"
        out.append((role or "user", content))
    return out[::-1]


def routing_text(query: str, history: Sequence[Any] = (), max_turns: int = MAX_TURNS,
                 max_chars: int = MAX_CHARS) -> str:
    """What the router encodes for a request: the query, then the pruned window newest-first."""
    window = prune_history(history, max_turns=max_turns, max_chars=max_chars)
    if not window:
        return query
    ctx = " | ".join(f"{role}: {text}" for role, text in reversed(window))
    return f"{query}\n[context] {ctx}"
