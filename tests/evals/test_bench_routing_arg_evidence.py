"""bench/routing_arg_evidence.py's candidate features, re-rank and reader cache (the arms' run is the bench's)."""

import numpy as np
import pytest

from tests.conftest import load_bench


def test_candidate_features_read_the_required_parameters_and_count_the_stated_ones():
    ae = load_bench("routing_arg_evidence")
    reading = [("owner", True, 18.0), ("repo", True, 4.0), ("issue_number", True, -6.0), ("page", False, 3.0)]
    # scores clipped to +-CLIP (10) and scaled: owner 1.0, repo 0.4, issue_number -0.6
    assert ae.candidate_feature(reading, "req_min", 0.5) == pytest.approx(-0.6)
    assert ae.candidate_feature(reading, "req_mean", 0.5) == pytest.approx((1.0 + 0.4 - 0.6) / 3)
    assert ae.candidate_feature(reading, "stated", 0.5) == 3.0  # owner, repo and the optional page
    assert ae.candidate_feature(reading, "stated", 5.0) == 1.0
    # no required span parameter: no evidence either way; no parameter at all: nothing stated
    assert ae.candidate_feature([("page", False, 9.0)], "req_min", 0.5) == 0.0
    assert ae.candidate_feature([], "stated", 0.5) == 0.0
    with pytest.raises(ValueError):
        ae.candidate_feature(reading, "nope", 0.5)


def test_rerank_adds_the_weighted_feature_and_keeps_the_slb_order_on_ties():
    ae = load_bench("routing_arg_evidence")
    slb = np.array([0.50, 0.48, 0.30])
    feats = np.array([-1.0, 0.5, 1.0])
    assert ae.rerank(slb, feats, 0.0) == 0
    assert ae.rerank(slb, feats, 0.01) == 0  # 0.49 vs 0.485 vs 0.31
    assert ae.rerank(slb, feats, 0.05) == 1  # 0.45 vs 0.505 vs 0.35
    assert ae.rerank(slb, feats, 1.0) == 2  # -0.5 vs 0.98 vs 1.3
    assert ae.rerank(np.array([0.5, 0.5]), np.zeros(2), 1.0) == 0


def test_margins_ignore_tools_outside_the_registry():
    ae = load_bench("routing_arg_evidence")
    s = np.array([[0.9, -np.inf, 0.7, 0.1], [0.2, 0.6, -np.inf, 0.55]])
    assert np.allclose(ae.margins(s), [0.2, 0.05])


def test_reader_cache_asks_the_real_reader_once_per_request_and_tool(all_tools):
    from services.engine.slots import SlotModel

    path = "var/models/slots"
    if not SlotModel.exists(path):
        pytest.fail("no slot model at var/models/slots: run `make setup` (make models trains it)")
    ae = load_bench("routing_arg_evidence")
    by_name = {t.name: t for t in all_tools}
    reader = SlotModel(path, threads=1)
    cache = ae.ReaderCache(reader, by_name)
    text = "list the pods in the kube-system namespace"
    ns, plain = cache.read(text, ["pods_list_in_namespace", "pods_list"])
    assert [(n, r) for n, r, _ in ns if n == "namespace"] == [("namespace", True)]
    # the namespace the request names is read as stated for the tool that requires it
    assert ae.candidate_feature(ns, "req_min", reader.threshold) > 0
    assert ae.candidate_feature(plain, "req_min", reader.threshold) == 0.0  # pods_list requires no span parameter
    assert len(cache.line_seconds) == 1
    assert cache.read(text, ["pods_list"]) == [plain] and len(cache.line_seconds) == 1  # cached: no new reading


def test_plot_writes_a_png(tmp_path):
    ae = load_bench("routing_arg_evidence")
    size = {"accuracy": 0.9, "ci95": [0.87, 0.92]}
    report = {"n": 962, "draws": 3, "pooled": {arm: {"10": size, "250": size} for arm in ("none", "arg evidence")}}
    ae.plot(report, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
