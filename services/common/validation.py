"""Request validation every service applies the same way (clear INVALID_ARGUMENT messages)."""

from __future__ import annotations

from services.common.errors import InvalidArgument


def check_request(query: str, history_len: int, *, max_query_chars: int, max_history_turns: int) -> None:
    """A non-blank query within the length limit and a history within the turn limit."""
    if not query or not query.strip():
        raise InvalidArgument("query is empty")
    if len(query) > max_query_chars:
        raise InvalidArgument(f"query is {len(query)} characters; the limit is {max_query_chars}")
    if history_len > max_history_turns:
        raise InvalidArgument(f"history has {history_len} turns; the limit is {max_history_turns}")


def bounded_count(name: str, value: int | None, *, default: int, limit: int) -> int:
    """An optional positive count: unset or 0 means ``default``; negative or above ``limit`` is refused."""
    if value is None or value == 0:
        return default
    if value < 0 or value > limit:
        raise InvalidArgument(f"{name} must be in 1..{limit}, got {value}")
    return value
