"""training/public_ce.py: a cross-encoder trained on Seal-Tools only, and the public protocol's second-stage arms."""

import json

import numpy as np
import pytest

from tests.conftest import REPO
from training import public, public_ce


def test_validation_holds_whole_requests_out():
    pairs = [public.Pair(f"r{i // 2}", f"q{i // 2}", f"t{i}") for i in range(40)]
    fit, val = public_ce.split(pairs, 0.25, seed=1)
    assert len(fit) + len(val) == 40 and len(val) == 10
    assert not {p.request_id for p in fit} & {p.request_id for p in val}
    assert public_ce.split(pairs, 0.25, seed=1) == (fit, val)  # seeded


def test_the_second_stage_reorders_only_the_first_stages_best_candidates():
    from evals.public import rank_hits

    names = ["a", "b", "c", "d"]
    pos = {n: i for i, n in enumerate(names)}
    lines = [type("L", (), {"id": "x", "tool": "c"})()]
    regs = [{"all": [names]}]
    scores = np.array([[0.9, 0.8, 0.7, 0.1]], np.float32)

    def rerank(i, tools, s):  # prefers the last of the candidates it is shown
        return np.arange(len(tools), dtype=float)

    rerank.top_k = 3
    assert rank_hits(scores, None, 0.0, lines, regs, "all", pos, names) == {"x#0": (False, True)}
    assert rank_hits(scores, None, 0.0, lines, regs, "all", pos, names, rerank=rerank) == {"x#0": (True, True)}
    rerank.top_k = 2  # "c" is not among the two it re-ranks
    assert rank_hits(scores, None, 0.0, lines, regs, "all", pos, names, rerank=rerank)["x#0"][0] is False


@pytest.mark.integration
def test_a_small_cross_encoder_trains_on_seal_and_scores_in_the_public_protocol(tmp_path):
    from evals import public as protocol

    pairs, tools, _ = public.training_pairs()
    pairs = pairs[:48]
    out = tmp_path / "ce"
    meta = public_ce.train(pairs, tools, "", out, val_fraction=0.25, progress=False)
    assert meta["fit_pairs"] + meta["val_pairs"] == 48 and meta["alpha"] in meta["hp"]["alpha_grid"]
    assert 0 <= meta["val_rerank_top1"] <= 1 and (out / "cross_encoder").is_dir()
    assert set(json.loads((out / "public_ce.json").read_text())) >= {"alpha", "top_k", "max_len", "data_hash"}
    rep = protocol.evaluate("", str(tmp_path / "p.json"), servers=("time", "redis"), sizes="3,all", draws=2,
                            cross_encoder=str(out), plot_png=False,
                            new_queries=str(REPO / "data" / "routing_calibration" / "time-b4.jsonl"))
    for arm in ("public + cross-encoder", "public + cross-encoder alone", "public + cross-encoder, new requests"):
        assert rep["arms"][arm]["protocol"] == "unseen"
        for x in rep["arms"][arm]["by_size"].values():
            assert 0 <= x["top1"] <= x["top3"] <= 1
    ce = rep["cross_encoder"]
    # cached per (line, tool): far fewer pairs than line-draws x sizes x top_k
    assert 0 < ce["pairs_scored"] <= (rep["protocol"]["lines"] + rep["protocol"]["new_lines"]) * 6
    assert "public + cross-encoder vs public dense" in rep["paired"]
