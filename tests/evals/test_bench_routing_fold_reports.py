"""bench/routing_fold_reports.py: pooling per-fold reports of bench/routing_arg_evidence.py (their runs are the
bench's; here hand-made reports with known figures)."""

import json
import math

import pytest

from tests.conftest import load_bench


def _report(path, folds: dict[str, tuple[int, float, dict[str, float]]], paired: dict[str, tuple[int, int]]):
    """A report of ``folds``: fold -> (lines, top-1 without the stage at N = 250, {arm: top-1 with it}); every other
    size is the N = 250 figure shifted down, so sizes stay apart."""
    per_fold = {}
    for f, (n, none, arms) in folds.items():
        per_fold[f] = {"n": n, "arms": {arm: {"alpha": 0.2, "feature": "req_min", "sizes": {
            s: {"top1_none": none - d, "top1": top - d, "escalation_rate": 0.1}
            for s, d in (("10", -0.05), ("250", 0.0), ("all", 0.01))}} for arm, top in arms.items()}}
    doc = {"per_fold": per_fold, "paired_vs_none_line_draws": {
        arm: {s: {"fixed": fx, "broken": br} for s in ("10", "250", "all")} for arm, (fx, br) in paired.items()}}
    path.write_text(json.dumps(doc))
    return str(path)


def test_sign_test_is_the_exact_two_sided_binomial():
    fr = load_bench("routing_fold_reports")
    assert fr.sign_test(0, 0) == 1.0
    assert fr.sign_test(5, 5) == 1.0
    assert fr.sign_test(10, 0) == pytest.approx(2 / 2 ** 10)
    assert fr.sign_test(25, 15) == pytest.approx(2 * sum(math.comb(40, i) for i in range(16)) / 2 ** 40)
    assert fr.sign_test(15, 25) == fr.sign_test(25, 15)


def test_folds_pool_by_lines_and_the_leave_one_fold_out_choice_uses_the_other_folds(tmp_path):
    fr = load_bench("routing_fold_reports")
    # grid "a": arm x gains +1 point on folds 0 and 1, loses 1 on fold 2; arm y gains nothing anywhere
    a01 = _report(tmp_path / "a01.json", {"0": (100, 0.90, {"x": 0.91, "y": 0.90}),
                                          "1": (300, 0.80, {"x": 0.81, "y": 0.80})}, {"x": (8, 2), "y": (0, 0)})
    a2 = _report(tmp_path / "a2.json", {"2": (100, 0.70, {"x": 0.69, "y": 0.70})}, {"x": (1, 2), "y": (0, 0)})
    # grid "b": arm x gains +3 on fold 2 only
    b = _report(tmp_path / "b.json", {f: (n, none, {"x": none + (0.03 if f == "2" else 0.0), "y": none})
                                      for f, (n, none) in {"0": (100, 0.90), "1": (300, 0.80), "2": (100, 0.70)}.items()},
                {"x": (2, 0), "y": (0, 0)})
    grids = {"a": fr.load_grid([a01, a2]), "b": fr.load_grid([b])}
    s = fr.summarize(grids, "250")
    assert s["folds"] == ["0", "1", "2"] and s["arms"] == ["x", "y"]
    x = s["table"]["a"]["x"]["250"]
    assert x["n"] == 500 and x["none"] == pytest.approx((100 * 0.90 + 300 * 0.80 + 100 * 0.70) / 500)
    assert x["gain"] == pytest.approx((100 * 0.01 + 300 * 0.01 - 100 * 0.01) / 500)
    assert (x["fixed"], x["broken"]) == (9, 4) and x["sign_test_p"] == pytest.approx(fr.sign_test(9, 4), abs=1e-4)
    assert s["table"]["a"]["x"]["10"]["none"] == pytest.approx(x["none"] + 0.05)  # sizes are kept apart
    lofo = s["leave_one_fold_out"]["per_fold"]
    # fold 0 judged by folds 1 + 2: a/x gains (3 - 1) / 400, b/x 3 / 400: b/x, which gains nothing on fold 0
    assert (lofo["0"]["grid"], lofo["0"]["arm"], lofo["0"]["top1"]) == ("b", "x", pytest.approx(0.90))
    assert (lofo["1"]["grid"], lofo["1"]["arm"]) == ("b", "x")  # by folds 0 + 2: a/x 0, b/x 3 / 200
    # fold 2 judged by folds 0 + 1: a/x gains, b/x does not; a/x loses on fold 2
    assert (lofo["2"]["grid"], lofo["2"]["arm"], lofo["2"]["top1"]) == ("a", "x", pytest.approx(0.69))
    assert s["leave_one_fold_out"]["gain"] == pytest.approx(-1 / 500)  # choosing on other folds can lose
    # the choice among arm y only: nothing gains anywhere, so every fold keeps the first grid's y, at no gain
    only_y = fr.summarize(grids, "250", ["y"])["leave_one_fold_out"]
    assert only_y["options"] == [["a", "y"], ["b", "y"]] and only_y["gain"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="no arm 'z'"):
        fr.summarize(grids, "250", ["z"])
    # one fold in two reports of a grid is refused
    with pytest.raises(ValueError, match="fold 2"):
        fr.load_grid([a2, a2])


def test_the_cli_writes_the_report_and_its_plot_and_refuses_a_missing_report(tmp_path, capsys):
    fr = load_bench("routing_fold_reports")
    r = _report(tmp_path / "r.json", {"0": (10, 0.9, {"x": 1.0}), "1": (10, 0.8, {"x": 0.8})}, {"x": (1, 0)})
    out = tmp_path / "out.json"
    assert fr.main(["--grid", "alpha <= 1=" + r, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["grids"] == {"alpha <= 1": [r]} and doc["summary"]["table"]["alpha <= 1"]["x"]["250"]["fixed"] == 1
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        fr.main(["--grid", f"g={tmp_path / 'missing.json'}", "--json", str(out)])
    assert "no report at" in capsys.readouterr().err
