"""bench/routing_late_seeds.py: its seed argument, the spread it reports and its figure (each seed's reader is built
by ``late_training.fold_late_reader``, tests/router/test_late_training.py; the arms it routes are
``route_stage_arms``', tests/router/test_eval_routing_late.py)."""

import pytest

from tests.conftest import load_bench


def test_seeds_must_be_distinct_non_negative_integers(capsys):
    b = load_bench("routing_late_seeds")
    assert b.parse_seeds("0, 1,2") == [0, 1, 2]
    for bad in ("", "0,0", "-1", "a"):
        with pytest.raises(ValueError, match="--seeds"):
            b.parse_seeds(bad)
    with pytest.raises(SystemExit):
        b.main(["--seeds", "1,1"])
    assert "distinct" in capsys.readouterr().err


def pooled(accs):
    return {arm: {s: {"n": 300, "accuracy": a, "ci95": [a - 0.02, a + 0.02]} for s, a in by.items()}
            for arm, by in accs.items()}


def test_spread_is_each_seeds_gain_over_the_stage_off():
    b = load_bench("routing_late_seeds")
    p = pooled({"off": {"250": 0.90}, "seed 0": {"250": 0.91}, "seed 3": {"250": 0.895}})
    got = b.spread(p, [0, 3], ["250"])["250"]
    assert got["gain_pts"] == {"0": pytest.approx(1.0), "3": pytest.approx(-0.5)}
    assert (got["min"], got["max"], got["mean"]) == (pytest.approx(-0.5), pytest.approx(1.0), pytest.approx(0.25))
    assert got["sd"] == pytest.approx(1.0607, abs=1e-3)
    assert b.spread(p, [0], ["250"])["250"]["sd"] == 0.0


def test_plot_writes_a_png(tmp_path):
    b = load_bench("routing_late_seeds")
    p = pooled({"off": {"10": 0.97, "250": 0.90}, "seed 0": {"10": 0.975, "250": 0.91},
                "seed 1": {"10": 0.97, "250": 0.905}})
    rep = {"sizes": ["10", "250"], "pooled": p, "folds": [0], "draws": 3, "spread": b.spread(p, [0, 1], ["10", "250"])}
    b.plot(rep, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # with the vote arm, its pairs and the hindsight ceiling
    rep["pooled"] |= pooled({"vote": {"10": 0.975, "250": 0.912}})
    rep["paired_vs_off"] = {"vote": {"10": {"fixed": 2, "broken": 0}, "250": {"fixed": 30, "broken": 6}}}
    rep["hindsight"] = pooled({"any": {"10": 0.98, "250": 0.93}})["any"]
    b.plot(rep, str(tmp_path / "v.png"))
    assert (tmp_path / "v.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_choice_figures_are_the_readers_own_calibration():
    import json

    from services.router.late_reader import META_FILE
    from tests.conftest import REPO

    b = load_bench("routing_late_seeds")
    reader = REPO / "var" / "models" / "late_reader"
    section = json.loads((reader / META_FILE).read_text())["arg_evidence"]
    got = b.choice_figures(reader)
    assert got == {"choose_top1_slb": section["choose_top1_slb"], "choose_top1": section["choose_top1"],
                   "choose_top1_crossfit": section["crossfit"]["top1"]}
    assert 0 < got["choose_top1_slb"] <= got["choose_top1"] <= 1


def test_vote_is_the_seeds_majority_else_the_stage_off_and_hindsight_any_seed_right():
    from services.training.data import is_correct

    b = load_bench("routing_late_seeds")
    labels = {"a": "t1", "b": "t2", "c": "t3"}
    picks = {"off": {"250": {"a#0": "t1", "b#0": "x", "c#0": "t3", "a#1": "x"}},
             "seed 0": {"250": {"a#0": "x", "b#0": "t2", "c#0": "y", "a#1": "x"}},
             "seed 1": {"250": {"a#0": "x", "b#0": "t2", "c#0": "z", "a#1": "t1"}},
             "seed 2": {"250": {"a#0": "t1", "b#0": "y", "c#0": "t3", "a#1": "y"}}}
    vote, anyone = b.vote_hits(picks, [0, 1, 2], labels, is_correct)
    # a#0: two seeds agree on a wrong tool and outvote the right one; b#0: the majority is right;
    # c#0: no majority, so the stage off's pick (right); a#1: no majority, the stage off's pick (wrong)
    assert vote == {"250": {"a#0": False, "b#0": True, "c#0": True, "a#1": False}}
    assert anyone == {"250": {"a#0": True, "b#0": True, "c#0": True, "a#1": True}}
    # two seeds: a majority is both of them, else the stage off's pick
    vote2, _ = b.vote_hits(picks, [0, 2], labels, is_correct)
    assert vote2 == {"250": {"a#0": True, "b#0": False, "c#0": True, "a#1": False}}
