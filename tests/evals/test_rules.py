"""`nexus eval rules`: each decoding rule off alone vs all on, paired per argument; a real run on SmolLM2."""

import json
from dataclasses import replace

import pytest

from evals import rules as R
from services.engine.config import EngineConfig


def test_every_rule_names_real_config_values_and_the_defaults_run_it():
    cfg = EngineConfig()
    for r in R.RULES:
        assert all(hasattr(cfg, k) for k in r.off), r
    assert R.rule_is_on(R.RULES[0], cfg) and not R.rule_is_on(R.RULES[0], replace(cfg, copy_bias=False))


def test_arguments_are_scored_one_by_one():
    assert R.arg_results('{"a": "x", "b": 2}', {"a": "x", "b": 3}) == [True, False]
    assert R.arg_results("not json", {"a": 1, "b": 2}) == [False, False]
    assert R.arg_results("[1]", {"a": 1}) == [False]


def test_a_rule_gains_what_is_right_only_with_it_and_loses_what_is_right_only_without_it():
    rule = R.Rule("r", {"copy_bias": False}, "x")

    def line(on, off):
        return {"arms": {R.ALL_ON: {"args": on, "valid": True}, "r": {"args": off, "valid": True}}}

    lines = [line([True, True], [False, True])] * 9 + [line([False], [True])]
    s = R.summarize(lines, [rule])
    r = s["rules"]["r"]
    assert s["args"] == 19 and (r["gained"], r["lost"], r["net"]) == (9, 1, 8)
    assert r["sign_test_p"] < 0.05 and r["verdict"] == "pays"
    assert R.summarize([line([True], [True])] * 3, [rule])["rules"]["r"]["verdict"] == "no evidence"
    assert R.summarize([line([False], [True])] * 12, [rule])["rules"]["r"]["verdict"] == "costs"


@pytest.mark.integration
def test_a_real_run_on_smollm2_resumes_from_its_checkpoint(tmp_path):
    out = tmp_path / "rules.json"
    kw = dict(limit=2, rules=["reuse penalty"], together=["enum choices", "reuse penalty"], workdir=str(tmp_path / "w"),
              progress=False)
    rep = R.evaluate("data/queries/train.jsonl", "data/mcp_tools", str(out), **kw)
    assert rep["lines"] == 2 and rep["args"] >= 2
    assert set(rep["rules"]) == {"reuse penalty", "enum choices + reuse penalty"}
    for r in rep["rules"].values():
        assert r["gained"] + r["lost"] <= rep["args"] and 0 <= r["sign_test_p"] <= 1
    assert rep["all_rules"]["schema_valid"] == 1.0
    assert out.with_suffix(".png").is_file()
    assert len(out.with_name("rules.json.lines.jsonl").read_text().splitlines()) == 2
    again = R.evaluate("data/queries/train.jsonl", "data/mcp_tools", str(out), **kw)  # every line checkpointed
    assert again["seconds_this_run"] < rep["seconds_this_run"] and again["rules"] == rep["rules"]
    assert json.loads(out.read_text())["model"]["name"].endswith(".gguf")
