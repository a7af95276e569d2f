"""bench/routing_errors.py: the error breakdown on hand-made records with known counts, the labels file's checks, and
one run on the production gate model (the mechanics; its held-out figures need the fold models and are the
bench's), with bad flags as clear errors."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, load_bench
from training.data import QueryLine

SERVER = {"a1": "a", "a2": "a", "a3": "a", "b1": "b"}


def _rec(i, draw, tool, pred, multi=False, margin=0.5, top3=True):
    return {"id": i, "draw": draw, "tool": tool, "pred": pred, "correct": pred == tool, "multi_turn": multi,
            "candidates": [pred, tool, "b1"], "margin": margin, "slb_top3": top3}


def _records():
    # two lines x two draws; N = 10: x wrong once (sibling); N = 250: x wrong twice (sibling, then b1), y (multi-turn)
    # wrong once (sibling), so of N = 250's 3 wrong pairs 2 were right at N = 10
    return {
        "10": [_rec("x", 0, "a1", "a2"), _rec("x", 1, "a1", "a1"), _rec("y", 0, "a3", "a3", True),
               _rec("y", 1, "a3", "a3", True)],
        "250": [_rec("x", 0, "a1", "a2", margin=0.01), _rec("x", 1, "a1", "b1", margin=0.5),
                _rec("y", 0, "a3", "a3", True, margin=0.3), _rec("y", 1, "a3", "a1", True, margin=0.02, top3=False)],
    }


def test_errors_split_by_origin_turns_draws_and_verdicts():
    be = load_bench("routing_errors")
    labels = {"x": {"id": "x", "verdict": "decidable", "reason": "r", "pick": "a2"}}
    out = be.analyse(_records(), SERVER, labels)
    small, big = out["10"], out["250"]
    assert small["errors"] == 1 and small["accuracy"] == 0.75 and small["same_server_share"] == 1.0
    assert big["errors"] == 3 and big["accuracy"] == 0.25 and big["lines_wrong"] == 2
    assert big["lines_wrong_every_draw"] == 1  # x
    assert big["same_server"] == 2 and big["multi_turn"] == 1 and big["multi_turn_accuracy"] == 0.5
    assert big["right_at_10"] == 2
    assert big["by_target_server"] == {"a": 3}
    assert big["by_verdict"] == {"decidable": 2, "ambiguous": 0, "label_questionable": 0, "unlabelled": 1}
    assert big["accuracy_if_decidable_fixed"] == pytest.approx(0.75)
    assert "by_verdict" not in be.analyse(_records(), SERVER, {})["250"]


def test_a_perfect_stage_fixes_the_low_margin_errors_whose_target_is_in_the_top_3():
    be = load_bench("routing_errors")
    o = be.oracle_stage(_records()["250"], (0.25, 0.5))
    # margins 0.01 (x, wrong), 0.5 (x, wrong), 0.3 (y, right), 0.02 (y, wrong, target not in the top 3)
    assert o["0.25"]["escalated"] == 0.25 and o["0.25"]["errors_escalated"] == 1 and o["0.25"]["fixable"] == 1
    assert o["0.25"]["accuracy"] == 0.5
    assert o["0.5"]["escalated"] == 0.5 and o["0.5"]["errors_escalated"] == 2 and o["0.5"]["fixable"] == 1
    assert o["0.5"]["accuracy"] == 0.5
    assert set(be.analyse(_records(), SERVER, {})["250"]["oracle_stage"]) == {"0.15", "0.2", "0.25"}


def test_wrong_lines_list_picks_draws_and_a_verdict_given_against_another_pick():
    be = load_bench("routing_errors")
    lines = {i: QueryLine(id=i, server="a", tool=t, query=f"q {i}", args={}, history=h, slot=0)
             for i, t, h in (("x", "a1", ()), ("y", "a3", (("user", "earlier"),)))}
    labels = {"x": {"id": "x", "verdict": "decidable", "reason": "says so", "pick": "a3"}}
    rows = be.wrong_lines(_records(), lines, SERVER, labels)
    assert [r["id"] for r in rows] == ["x", "y"]  # most wrong draws first
    x, y = rows
    assert x["picks"] == {"a2": 1, "b1": 1} and x["same_server"] is False and x["wrong_draws"] == {"10": 1, "250": 2}
    assert x["slb_top3"] == ["a2", "a1", "b1"] and x["verdict"] == "decidable" and x["labelled_pick"] == "a3"
    assert y["history"] == [["user", "earlier"]] and y["verdict"] == "unlabelled" and "labelled_pick" not in y


@pytest.mark.parametrize("doc, message", [
    ({"id": "x"}, "expected a JSON list"),
    ([{"verdict": "decidable"}], "item 0 has no id"),
    ([{"id": "x", "verdict": "maybe"}], "verdict 'maybe'"),
    ([{"id": "x", "verdict": "ambiguous"}, {"id": "x", "verdict": "decidable"}], "x twice"),
])
def test_a_bad_labels_file_is_a_clear_error(tmp_path, doc, message):
    be = load_bench("routing_errors")
    (tmp_path / "l.json").write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match=message):
        be.load_labels(str(tmp_path / "l.json"))


def test_the_labels_in_reports_are_well_formed():
    be = load_bench("routing_errors")
    labels = be.load_labels(str(REPO / "reports" / "routing_error_labels.json"))
    assert len(labels) >= 90 and all(lab["reason"] for lab in labels.values())


def _run(tmp_path, *extra):
    return subprocess.run([sys.executable, str(REPO / "bench" / "routing_errors.py"), "--json", str(tmp_path / "e.json"),
                           *extra], capture_output=True, text=True, timeout=600, cwd=REPO)


def test_a_run_on_the_production_model_routes_every_line_and_draws_the_plot(tmp_path):
    gate = REPO / "var" / "models" / "gate"
    out = _run(tmp_path, "--folds", "1", "--gates", str(gate), "--limit", "6", "--draws", "2", "--sizes", "10,all",
               "--labels", str(REPO / "reports" / "routing_error_labels.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    from services.router.config import RouterConfig

    rep = json.loads((tmp_path / "e.json").read_text())
    assert rep["held_out"] is False and rep["labelled"] is True
    assert rep["precision"] == RouterConfig().query_encoder_precision  # the router's, by default
    assert list(rep["sizes"]) == ["10", "all"] and all(rep["sizes"][s]["n"] == 12 for s in ("10", "all"))
    for row in rep["sizes"].values():
        assert row["errors"] == round((1 - row["accuracy"]) * 12) and sum(row["by_verdict"].values()) == row["errors"]
    assert all(r["wrong_draws"]["all"] >= 1 for r in rep["wrong_lines"])
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("flags, message", [
    (["--folds", "0,1", "--gates", "a"], "--gates: 1 model(s) for 2 fold(s)"),
    (["--folds", "3"], "--folds: of 0, 1, 2"),
    (["--labels", "/nonexistent/labels.json"], "--labels /nonexistent/labels.json"),
])
def test_bad_flags_are_clear_errors(tmp_path, flags, message):
    out = _run(tmp_path, *flags)
    assert out.returncode != 0 and message in out.stderr
