"""bench/routing_rescore.py's hubness term and plot (the arms' run is the bench's; the bias fit is
training.fit_tool_bias, tested with the gate training)."""

import numpy as np

from tests.conftest import load_bench


def test_hubness_is_the_mean_of_a_tools_best_scores_over_other_tools_requests():
    rr = load_bench("routing_rescore")
    scores = np.array([[0.9, 0.8, 0.1], [0.2, 0.9, 0.6], [0.7, 0.1, 0.95]], np.float32)  # requests x tools
    own = np.array([0, 1, 2])  # request r belongs to tool r
    foreign = np.ones_like(scores, bool)
    foreign[np.arange(3), own] = False
    assert rr.hub_scores(scores, foreign, 1).tolist() == np.float32([0.7, 0.8, 0.6]).tolist()
    assert np.allclose(rr.hub_scores(scores, foreign, 2), [0.45, 0.45, 0.35])
    # k beyond the foreign requests: the mean of those there are; a tool with none: 0
    assert np.allclose(rr.hub_scores(scores, foreign, 5), [0.45, 0.45, 0.35])
    assert rr.hub_scores(scores, np.zeros_like(foreign), 2).tolist() == [0.0, 0.0, 0.0]


def test_plot_writes_a_png(tmp_path):
    rr = load_bench("routing_rescore")
    size = {"accuracy": 0.9, "ci95": [0.87, 0.92]}
    report = {"n": 962, "draws": 3, "pooled": {arm: {"10": size, "250": size} for arm in ("none", "bias")}}
    rr.plot(report, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
