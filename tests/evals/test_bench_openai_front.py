"""bench/openai_front.py's pure parts: the request sets, the plain server's overflow error read back, and the report's
per-size summaries (the runs themselves are the benchmark's, not a test's)."""

from __future__ import annotations

import json

from tests.conftest import load_bench

bench = load_bench("openai_front")


def test_tool_sets_hold_every_requested_tool_and_nest_by_size():
    names = [bench.request_for("contoso", i)[1] for i in range(3)]
    assert len(set(names)) == 3
    sets = {n: [t["function"]["name"] for t in bench.tool_set(n, "contoso", names)] for n in (20, 50, 300)}
    for n, got in sets.items():
        assert len(got) == len(set(got)) == n and set(names) <= set(got)
    assert set(sets[20]) <= set(sets[300]) and set(sets[50]) <= set(sets[300])
    query, expected = bench.request_for("acme")
    assert expected == "acme_create_invoice" and "Acme" in query


def test_arguments_are_checked_against_the_chosen_tools_schema():
    tools = bench.synthetic_tools(300, "acme")
    assert bench.check_arguments(tools, "acme_create_invoice", json.dumps({"name": "March"}))
    assert not bench.check_arguments(tools, "acme_create_invoice", json.dumps({"notes": "no name"}))
    assert not bench.check_arguments(tools, "acme_create_invoice", '{"name": "March"')  # cut JSON
    assert not bench.check_arguments(tools, "acme_no_such_tool", "{}")
    assert not bench.check_arguments(tools, None, None)


def test_the_plain_servers_context_error_gives_the_prompts_token_count():
    err = {"status": 400, "error": {"code": "context_length_exceeded", "message": (
        "This model's maximum context length is 8192 tokens. However, you requested 16914 tokens (16914 in the "
        "messages, None in the completion). Please reduce the length of the messages or completion.")}}
    assert bench.overflow_tokens(err) == 16914
    assert bench.overflow_tokens({"status": 400, "error": {"code": "invalid_request_error", "message": "x"}}) is None
    assert bench.overflow_tokens({"status": 200, "ms": 1.0}) is None


def run(size, repeat, expected, front_ms, front_tool, plain):
    front = {"stream": {"first_chunk_ms": front_ms / 2, "tool": front_tool},
             "complete": {"status": 200, "ms": front_ms, "tool": front_tool, "valid": True, "prompt_tokens": 200,
                          "nexus": {"prefill_path": "splice"}}}
    return {"size": size, "repeat": repeat, "expected": expected, "front": front, "plain": plain}


def fits(cold_ms, tool, valid=True):
    return {"overflow": False,
            "complete_cold": {"status": 200, "ms": cold_ms, "tool": tool, "valid": valid, "prompt_tokens": 1300},
            "complete_warm": {"status": 200, "ms": cold_ms / 4, "tool": tool, "valid": valid},
            "complete_prefix": {"status": 200, "ms": cold_ms / 2, "tool": tool, "valid": valid},
            "stream_named_prefix": {"first_chunk_ms": cold_ms / 2, "tool": tool}}


def test_the_plain_summary_per_size_with_overflow_and_goals():
    runs = [run(20, 0, "a", 1000, "a", fits(3000, "a")),
            run(20, 1, "b", 1200, "b", fits(2000, "c", valid=False)),
            run(50, 0, "a", 1000, "x", fits(2500, "a")),
            run(300, 0, "a", 1500, "a", {"overflow": True, "prompt_tokens": 16914, "error": "..."}),
            run(300, 1, "b", 1700, "b", {"overflow": True, "prompt_tokens": 17002, "error": "..."})]
    s = bench.summarize_plain(runs, n_ctx=8192)
    assert list(s) == ["20", "50", "300"]
    small = s["20"]
    assert small["front"]["complete_ms"] == 1100 and small["front"]["right_tool"] == 2
    assert small["plain"]["complete_ms_cold"] == 2500 and small["plain"]["complete_ms_warm"] == 625
    assert small["plain"]["complete_ms_prefix_warm"] == 1250 and small["plain"]["right_tool_prefix_warm"] == 1
    assert small["plain"]["right_tool"] == 1 and small["plain"]["valid_arguments"] == 1
    assert small["speedup_complete_cold"] == round(2500 / 1100, 2) and small["goal_right_tool"]
    assert "goal_3x_cold" not in small  # the 3x goal starts at 50 tools
    # 50 tools: the front picked the wrong tool where the plain server did not, and is only 2.5x sooner
    assert not s["50"]["goal_right_tool"] and s["50"]["goal_3x_cold"] is False
    assert s["50"]["speedup_complete_prefix_warm"] == 1.25 and s["50"]["goal_3x_prefix_warm"] is False
    big = s["300"]
    assert big["plain"] == {"n_ctx": 8192, "overflow": 2, "requests": 2, "overflow_prompt_tokens": 16958}
    assert "speedup_complete_cold" not in big and big["goal_right_tool"] and big["goal_3x_cold"]
    assert big["front"]["right_tool"] == 2 and big["front"]["prefill_paths"] == ["splice"]


def test_the_overhead_summary_compares_wall_times_and_residuals():
    pairs = [{"size": 20, "front": {"ms": f, "residual_ms": fr, "tool": "a"},
              "direct": {"ms": d, "residual_ms": dr, "tool": "a" if i else "b"}}
             for i, (f, fr, d, dr) in enumerate([(510, 6, 500, 3), (530, 7, 540, 4), (700, 5, 690, 3)])]
    (row,) = bench.summarize_overhead(pairs).values()
    assert (row["front_ms"], row["direct_ms"], row["overhead_ms"]) == (530, 540, -10)
    assert row["paired_overhead_ms"] == 10 and row["residual_overhead_ms"] == 3 and row["same_tool"] == 2
