"""The routing evaluation's protocol on the real data: registries, folds, correctness, concat-all prompt."""

import random
from collections import Counter, defaultdict

import pytest

from evals.routing import concat_prompt, names_grammar, registries_for, summarize, summarize_draws
from services.common.errors import InvalidArgument
from tests.conftest import REPO
from training.data import (
    assign_folds,
    equivalents,
    is_correct,
    load_queries,
    load_registry,
    parse_sizes,
    query_registry,
)

QUERIES = REPO / "data" / "queries" / "train.jsonl"
TOOLS = REPO / "data" / "mcp_tools"


@pytest.fixture(scope="module")
def data():
    return load_queries(QUERIES), load_registry(TOOLS)


def test_slots_follow_each_tools_lines(data):
    lines, registry = data
    assert len(lines) == 962 and len(registry.tools) == 338
    per_tool = defaultdict(list)
    for ln in lines:
        per_tool[ln.tool].append(ln.slot)
    assert all(slots == list(range(len(slots))) for slots in per_tool.values())
    assert Counter(len(s) for s in per_tool.values()) == {3: 312, 1: 26}  # github-legacy has 1 line per tool


def test_registry_has_target_own_server_first_then_others(data):
    _, registry = data
    rng = random.Random(0)
    reg = query_registry("git_status", "50", registry, rng)
    servers = [registry.server_of[n] for n in reg]
    assert len(reg) == len(set(reg)) == 50 and reg[0] == "git_status"
    assert servers[:12] == ["git"] * 12 and "git" not in servers[12:]  # git has 12 tools: all of them first
    big = query_registry("pods_list", "10", registry, rng)  # kubernetes has 47 > 9 distractors: all same-server
    assert {registry.server_of[n] for n in big} == {"kubernetes"} and "pods_list" in big
    assert query_registry("pods_list", "all", registry, rng) == registry.names


def test_registries_are_reproducible_for_a_seed_and_differ_across_seeds(data):
    lines, registry = data
    a = registries_for(lines[:50], ["10", "all"], registry, seed=0)
    b = registries_for(lines[:50], ["10", "all"], registry, seed=0)
    c = registries_for(lines[:50], ["10", "all"], registry, seed=1)
    assert a == b and a["10"] != c["10"] and a["all"] == c["all"]


def test_a_sizes_registries_do_not_depend_on_the_other_sizes(data):
    lines, registry = data
    alone = registries_for(lines[:50], ["250"], registry, seed=0)
    among = registries_for(lines[:50], ["10", "50", "100", "250", "all"], registry, seed=0)
    assert alone["250"] == among["250"]
    assert registries_for(lines[:50], ["50", "250"], registry, seed=0)["50"] == among["50"]


def test_folds_hold_at_most_one_line_per_tool_and_mix_slots(data):
    lines, _ = data
    folds = assign_folds(lines, 3, seed=0)
    assert folds == assign_folds(lines, 3, seed=0) and folds != assign_folds(lines, 3, seed=1)
    per = Counter((ln.tool, f) for ln, f in zip(lines, folds, strict=True))
    assert max(per.values()) == 1
    for f in range(3):
        slots = Counter(ln.slot for ln, g in zip(lines, folds, strict=True) if g == f)
        assert all(slots[s] > 60 for s in range(3))  # every wording style is tested in every fold


def test_equivalence_groups_count_as_correct():
    assert is_correct("read_text_file", "read_file") and is_correct("add_sub_issue", "sub_issue_write")
    assert not is_correct("write_file", "read_file")
    assert equivalents("git_status") == {"git_status"}


def test_sizes_parse_and_validate():
    assert parse_sizes("10, 50,all") == ["10", "50", "all"]
    for bad in ("", "1", "ten"):
        with pytest.raises(InvalidArgument):
            parse_sizes(bad)


def test_summary_uses_wilson_and_percentiles():
    recs = [{"correct": i < 9, "slb_top1": i < 8, "slb_top3": True, "escalated": i == 0, "route_ms": float(i),
             "slot": i % 3, "multi_turn": i == 1} for i in range(10)]
    s = summarize(recs, 10)
    assert s["accuracy"] == 0.9 and s["slb_top1"] == 0.8 and s["escalation_rate"] == 0.1
    assert 0.59 < s["ci95"][0] < 0.6 and 0.98 < s["ci95"][1] < 0.99  # Wilson, not normal approximation
    assert s["route_ms_p50"] == 4.5 and s["accuracy_escalated"] == 1.0


def _recs(correct):
    return [{"i": i, "correct": c, "slb_top1": c, "slb_top3": True, "escalated": False, "route_ms": 1.0,
             "slot": i % 3, "multi_turn": i % 2 == 0} for i, c in enumerate(correct)]


def test_one_draw_summarizes_as_before_and_several_pool_with_a_bootstrap_over_lines():
    a = _recs([i < 80 for i in range(100)])
    assert summarize_draws([a], 10) == summarize(a, 10)
    b = _recs([i < 70 for i in range(100)])
    s = summarize_draws([a, b], 10)
    assert s["n"] == 100 and s["n_draws"] == 2 and s["accuracy"] == 0.75 and s["accuracy_by_draw"] == [0.8, 0.7]
    lo, hi = s["ci95"]
    assert lo < 0.75 < hi
    # the interval is over 100 lines, not 200 independent trials: wider than Wilson over the pooled pairs
    wl, wh = summarize(a + b, 10)["ci95"]
    assert hi - lo > (wh - wl) * 1.2
    assert s["accuracy_multi_turn"]["n"] == 50 and summarize_draws([a, b], 10) == s  # deterministic
    with pytest.raises(ValueError, match="same lines"):
        summarize_draws([a, b[:50]], 10)


def test_draws_are_independent_and_the_first_is_the_single_draw(data):
    from evals.routing import load_protocol

    lines, registry = data
    assert registries_for(lines[:50], ["10"], registry, 0, draw=0) == registries_for(lines[:50], ["10"], registry, 0)
    assert registries_for(lines[:50], ["10"], registry, 0, draw=1) != registries_for(lines[:50], ["10"], registry, 0)
    q, t = str(REPO / "data" / "queries" / "train.jsonl"), str(REPO / "data" / "mcp_tools")
    proto = load_protocol(q, t, "10", draws=2)
    assert len(proto.draw_regs) == 2 and proto.draw_regs[0] == proto.regs != proto.draw_regs[1]
    with pytest.raises(ValueError, match="draws"):
        load_protocol(q, t, "10", draws=0)


def test_concat_prompt_holds_every_schema_and_grammar_only_names(data):
    lines, registry = data
    tools = list(registry.tools[:5])
    ln = next(x for x in lines if x.history)
    prompt = concat_prompt(tools, ln)
    assert all(f'"name": "{t.name}"' in prompt for t in tools) and prompt.endswith("<|im_start|>assistant\n")
    assert ln.query in prompt and ln.history[0][1] in prompt
    g = names_grammar(["a", 'we"ird'])
    assert g == 'root ::= "a" | "we\\"ird"\n'


def test_load_protocol_is_the_evaluations_folds_and_registries():
    from evals.routing import load_protocol

    q, t = str(REPO / "data" / "queries" / "train.jsonl"), str(REPO / "data" / "mcp_tools")
    proto = load_protocol(q, t, "10,all")
    assert proto.sizes == ["10", "all"] and len(proto.fold_of) == len(proto.lines) == 962
    assert proto.regs == registries_for(proto.lines, ["10", "all"], proto.registry, 0)
    train, held = proto.split(1)
    assert len(train) + len(held) == len(proto.lines)
    assert {proto.lines[i].id for i in held}.isdisjoint({ln.id for ln in train})
    assert all(proto.fold_of[i] == 1 for i in held)


def test_write_report_writes_the_json_and_the_plot_beside_it(tmp_path, capsys):
    import json

    from evals.routing import pooled_top1, write_report

    seen = []
    png = write_report(str(tmp_path / "sub" / "r.json"), {"x": 1}, lambda rep, path: seen.append((rep, path)))
    assert json.loads((tmp_path / "sub" / "r.json").read_text()) == {"x": 1}
    assert png == str(tmp_path / "sub" / "r.png") and seen == [({"x": 1}, png)]
    assert write_report(str(tmp_path / "q.json"), {}, echo=({"k": 1},)) == ""
    assert '"k": 1' in capsys.readouterr().out
    assert pooled_top1({"a": {"250": {"accuracy": 0.90517}}}) == {"a": {"250": 90.5}}


def test_arms_pool_over_lines_and_draws_with_paired_counts_against_the_base():
    from evals.routing import pool_line_draws

    hits = {"base": {"250": {"a#0": True, "a#1": False, "b#0": True, "b#1": True}},
            "new": {"250": {"a#0": True, "a#1": True, "b#0": False, "b#1": True}}}
    pooled, paired = pool_line_draws(hits, "base")
    assert pooled["base"]["250"]["n"] == 2 and pooled["base"]["250"]["accuracy"] == 0.75  # lines a 0.5, b 1.0
    lo, hi = pooled["base"]["250"]["ci95"]
    assert 0.5 <= lo <= 0.75 <= hi <= 1.0
    assert paired == {"new": {"250": {"fixed": 1, "broken": 1}}}


def test_extra_lines_keep_the_registered_tools_only(tmp_path):
    import json

    from evals.routing import load_protocol

    q, t = str(REPO / "data" / "queries" / "train.jsonl"), str(REPO / "data" / "mcp_tools")
    proto = load_protocol(q, t, "10")
    rows = [{"id": "x1", "tool": proto.registry.names[0], "query": "a", "args": {}, "history": []},
            {"id": "x2", "tool": "no_such_tool", "query": "b", "args": {}, "history": []}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [ln.id for ln in proto.extra_lines(tmp_path)] == ["x1"]
    assert proto.extra_lines("") == []
