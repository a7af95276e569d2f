"""bench/routing_escalation.py: its arms, its argument check and its figure (the routing it measures is
`nexus eval routing`'s, tests/router/test_eval_routing_late.py)."""

import pytest

from tests.conftest import load_bench


def test_arms_are_named_by_what_they_do_and_the_calibrated_tau_is_required(capsys):
    b = load_bench("routing_escalation")
    assert [b.arm_name(x) for x in (0, 0.5, 1, 2)] == ["off", "tau x0.5", "calibrated", "tau x2"]
    with pytest.raises(SystemExit):
        b.main(["--scales", "0,2"])
    assert "including 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        b.main(["--late-seed", "-2"])
    assert "--late-seed" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path):
    b = load_bench("routing_escalation")
    pooled = {arm: {s: {"n": 10, "accuracy": acc, "ci95": [acc - 0.02, acc + 0.02]} for s in ("10", "250")}
              for arm, acc in (("off", 0.90), ("calibrated", 0.91), ("tau x2", 0.905))}
    rates = {arm: {"10": r / 3, "250": r} for arm, r in (("off", 0.0), ("calibrated", 0.13), ("tau x2", 0.24))}
    b.plot({"sizes": ["10", "250"], "pooled": pooled, "escalation_rate": rates}, str(tmp_path / "e.png"))
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
