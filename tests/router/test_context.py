"""History pruning: recent turns verbatim, payloads as surrogates, bounded window, query first."""

from services.router.context import prune_history, routing_text, surrogate
from services.router.router import HistoryTurn


def test_no_history_is_the_query():
    assert routing_text("list my repos", []) == "list my repos"


def test_payloads_become_short_surrogates_and_dialogue_stays_verbatim():
    payload = '{"threads": [{"path": "db/schema.sql", "comments": [' + ", ".join(['{"id": 1}'] * 60) + "]}]}"
    hist = [HistoryTurn("user", "Show the review comments on PR #57 in acme/billing."),
            HistoryTurn("tool", payload),
            HistoryTurn("assistant", "One open thread on db/schema.sql.")]
    window = prune_history(hist)
    assert window[0] == ("user", "Show the review comments on PR #57 in acme/billing.")
    assert window[2] == ("assistant", "One open thread on db/schema.sql.")
    role, text = window[1]
    assert role == "tool" and text.startswith("[tool result, JSON object with keys threads")
    assert len(text) < 160 < len(payload)


def test_window_keeps_only_recent_turns_newest_first_after_the_query():
    hist = [{"role": "user", "content": f"turn {i}"} for i in range(10)]
    text = routing_text("merge it", hist, max_turns=3)
    assert text.startswith("merge it\n")
    assert "turn 9" in text and "turn 7" in text and "turn 6" not in text
    assert text.index("turn 9") < text.index("turn 7")


def test_long_turns_are_cut_and_empty_turns_skipped():
    hist = [("user", "x" * 1000), ("assistant", "   ")]
    window = prune_history(hist, max_chars=50, payload_chars=2000)
    assert window == [("user", "x" * 50 + "…")]


def test_surrogate_of_plain_text_names_its_size():
    s = surrogate("a1b2c3d Bump AWS provider\n9f8e7d6 Add VPC module\n" * 10)
    assert s.startswith("[tool result, text, ") and "a1b2c3d Bump AWS provider" in s
