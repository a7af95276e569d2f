"""bench/routing_aggregate.py's poolings, scores and plot (the arms' run is the bench's)."""

import numpy as np
import pytest

from tests.conftest import load_bench


def _bench():
    return load_bench("routing_aggregate")


SIMS = np.array([[0.9, 0.2, 0.5, 0.85, 0.1], [0.1, 0.3, 0.8, 0.2, 0.7]], np.float32)
TOOL = np.array([0, 0, 1, 0, 2])  # tool 3 has no exemplar rows


def test_poolings_bracket_max_and_the_mean():
    ra = _bench()
    mx = ra.pool(SIMS, TOOL, 4, "max", 0)
    assert np.allclose(mx[:, :3], [[0.9, 0.5, 0.1], [0.3, 0.8, 0.7]]) and np.all(np.isneginf(mx[:, 3]))
    assert np.allclose(ra.pool(SIMS, TOOL, 4, "lme", 1e-4)[:, :3], mx[:, :3], atol=1e-3)  # T -> 0: max
    means = [[np.mean([0.9, 0.2, 0.85]), 0.5, 0.1], [np.mean([0.1, 0.3, 0.2]), 0.8, 0.7]]
    assert np.allclose(ra.pool(SIMS, TOOL, 4, "lme", 100.0)[:, :3], means, atol=1e-3)  # T large: mean
    assert np.all(ra.pool(SIMS, TOOL, 4, "lse", 0.05)[:, :3] >= mx[:, :3])  # sum rewards several close rows
    assert np.allclose(ra.pool(SIMS, TOOL, 4, "top", 2)[0, 0], 0.875) and np.allclose(
        ra.pool(SIMS, TOOL, 4, "top", 1)[:, :3], mx[:, :3])
    with pytest.raises(ValueError, match="pooling"):
        ra.pool(SIMS, TOOL, 4, "median", 0)


def test_knn_vote_shares_sum_to_one_and_scores_fall_back_to_the_key():
    ra = _bench()
    v = ra.knn_vote(SIMS, TOOL, 4, 2)
    assert np.allclose(v.sum(1), 1.0) and np.allclose(v[0], [1.0, 0, 0, 0]) and np.allclose(v[1], [0, 0.5, 0.5, 0])
    key = np.array([[0.1, 0.2, 0.3, 0.4]] * 2, np.float32)
    s = ra.arm_scores(key, SIMS, TOOL, "max", 0.0, 2.0)
    assert np.allclose(s[0], [0.1 + 1.8, 0.2 + 1.0, 0.3 + 0.2, 0.4 + 0.8])  # tool 3: key + w * key
    assert np.allclose(ra.arm_scores(key, SIMS, TOOL, "vote2", 0.5, 2.0), s + 0.5 * v)


def test_first_hits_ranks_within_the_registry_mask():
    ra = _bench()
    scores = np.array([[0.9, 0.5, 0.7]], np.float32)
    pos = [np.array([False, True, False])]
    assert ra.first_hits(scores, pos).tolist() == [3]
    assert ra.first_hits(scores, pos, np.array([[False, True, True]])).tolist() == [2]
    assert ra.first_hits(scores, pos, depth=1).tolist() == [0]


def test_plot_writes_a_png(tmp_path):
    ra = _bench()
    size = {"accuracy": 0.9, "ci95": [0.87, 0.92]}
    report = {"folds": [0], "n": 319, "draws": 2, "pooled": {arm: {"10": size, "250": size} for arm in ra.ARMS}}
    ra.plot(report, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
