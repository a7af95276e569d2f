"""`nexus eval models`: one model per run into a side-by-side report; the default named by a stated rule."""

import json
import shutil

import pytest

from evals import models as M


def _line(args, route_ok, lat=None):
    return {"args": args, "route_ok": route_ok, "valid": True, "json": True, "first_arg_ms": 100.0,
            "latency": lat}


def test_end_to_end_counts_an_argument_only_where_the_router_picked_the_gold_tool():
    lines = [_line([True, True], True), _line([True, False], False),
             _line([False], True, {"engine": 100.0, "full_schema": 400.0, "prefix_cached": 120.0}),
             _line([True], True, {"engine": 200.0, "full_schema": 600.0, "prefix_cached": None})]
    s = M.summarize(lines, {"a": {"seconds": 2.0, "bytes": 2 ** 20}, "b": {"seconds": 1.5, "bytes": 2 ** 20}})
    assert s["args"] == 6 and s["arg_accuracy_gold_tool"] == pytest.approx(4 / 6)
    assert s["arg_accuracy_e2e"] == pytest.approx(3 / 6) and s["routing_accuracy"] == 0.75
    assert s["latency_lines"] == 2 and s["first_arg_ms_prefix_cached"] == 120.0
    assert s["speedup_vs_full_schema"] == pytest.approx(500 / 150) and len(s["speedup_vs_full_schema_ci95"]) == 2
    assert s["engine_over_prefix_cached"] == pytest.approx(100 / 120)  # the one line that ran both
    assert s["engine_over_prefix_cached_ci95"] is None
    assert s["compile"] == {"tools": 2, "seconds": 3.5, "store_mb": 2.0}


def test_the_default_is_the_most_accurate_model_that_meets_the_targets():
    def m(e2e, speedup, over, compile_s, over_ci=None):
        return {"arg_accuracy_e2e": e2e, "arg_accuracy_gold_tool": e2e, "speedup_vs_full_schema": speedup,
                "engine_over_prefix_cached": over, "engine_over_prefix_cached_ci95": over_ci,
                "compile": {"seconds": compile_s}}

    v = M.verdict({"small": m(0.79, 7.0, 0.9, 120), "mid": m(0.86, 6.0, 1.06, 200, [0.93, 1.2]),
                   "big": m(0.92, 5.0, 1.3, 900, [1.1, 1.5])})
    assert v["default"] == "mid" and v["meets_targets"]  # 1.06x, but its interval holds 1: not slower
    assert len(v["misses"]["big"]) == 2 and not v["misses"]["mid"]
    v = M.verdict({"a": m(0.5, 1.0, 2.0, 10), "b": m(0.6, 1.0, 2.0, 10)})
    assert v["default"] == "b" and not v["meets_targets"]  # none meets them: the most accurate, said so


@pytest.mark.integration
def test_a_real_run_on_smollm2_resumes_and_keeps_other_models(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    for server in ("everart", "fetch"):
        shutil.copy(f"data/mcp_tools/{server}.json", tools)
    out = tmp_path / "models.json"
    out.write_text(json.dumps({"models": {"other": {
        "arg_accuracy_e2e": 0.1, "arg_accuracy_gold_tool": 0.1, "speedup_vs_full_schema": 9.0,
        "engine_over_prefix_cached": 0.5, "compile": {"seconds": 1.0}}}}))
    kw = dict(tools=str(tools), limit=3, latency_lines=2, workdir=str(tmp_path / "w"), progress=False)
    rep = M.evaluate("data/queries/train.jsonl", str(kw.pop("tools")), str(out), **kw)
    name = next(n for n in rep["models"] if n != "other")
    got = rep["models"][name]
    assert set(rep["models"]) == {"other", name} and got["lines"] == 3 and got["schema_valid"] == 1.0
    assert got["compile"]["tools"] == 2 and got["compile"]["store_mb"] > 0 and got["memory"]["engine_rss_mb"] > 0
    assert got["latency_lines"] == 2 and got["first_arg_ms_full_schema"] > 0 and got["first_arg_ms_prefix_cached"] > 0
    assert rep["verdict"]["default"] in rep["models"] and out.with_suffix(".png").is_file()
    ckpt = tmp_path / f"models.json.{name}.jsonl"
    assert len(ckpt.read_text().splitlines()) == 3 + 2  # lines and compiled tools
    again = M.evaluate("data/queries/train.jsonl", str(tools), str(out), **kw)
    assert again["models"][name]["arg_accuracy_gold_tool"] == got["arg_accuracy_gold_tool"]
    assert again["models"][name]["seconds_this_run"] < got["seconds_this_run"]
    with pytest.raises(ValueError, match="other lines"):
        M.evaluate("data/queries/train.jsonl", str(tools), str(out), **{**kw, "limit": 2})


def test_models_on_the_same_lines_are_compared_argument_by_argument():
    a = {"per_line": {"x": {"args": [True, False]}, "y": {"args": [False]}}}
    b = {"per_line": {"x": {"args": [True, True]}, "y": {"args": [True]}}}
    other = {"per_line": {"z": {"args": [True]}}}
    got = M.paired_models({"a": a, "b": b, "other": other})
    assert set(got) == {"b vs a"} and (got["b vs a"]["gained"], got["b vs a"]["lost"]) == (2, 0)
