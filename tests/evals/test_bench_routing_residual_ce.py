"""bench/routing_residual_ce.py's SLB temperature fit and plot (the cross-encoder's run is the bench's)."""

import numpy as np

from tests.conftest import load_bench


def test_beta_is_sharp_when_the_slb_is_right_by_wide_margins_and_soft_when_it_errs():
    rc = load_bench("routing_residual_ce")
    sure = [{"scores": [0.9, 0.5, 0.4]} for _ in range(10)]  # the right tool (element 0) always far ahead
    assert rc.fit_beta(sure) == rc.BETAS[-1]
    noisy = sure[:6] + [{"scores": [0.5, 0.9, 0.4]} for _ in range(4)]  # wrong 4 times in 10
    b = rc.fit_beta(noisy)
    assert rc.BETAS[0] < b < rc.BETAS[-1]
    # the likelihood's optimum: sharper or softer fits the groups worse

    def loglik(beta):
        z = beta * np.array([g["scores"] for g in noisy])
        return float(np.mean(z[:, 0] - np.log(np.exp(z).sum(1))))

    assert loglik(b) >= max(loglik(b / 1.5), loglik(b * 1.5))


def test_plot_writes_a_png(tmp_path):
    rc = load_bench("routing_residual_ce")
    size = {"accuracy": 0.9, "ci95": [0.87, 0.92]}
    report = {"n": 319, "draws": 3, "hyperparams": {"offset": 1.0},
              "per_fold": {"0": {"beta": 5.6, "alpha": 0.0, "choose_by_alpha": {"0.0": 0.79, "0.1": 0.8}}},
              "pooled": {arm: {"10": size, "250": size} for arm in ("slb", "gated")}}
    rc.plot(report, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
