"""Gate training on a tiny real subset (deterministic for a seed) and the router's use of the model:
margin gate, cross-encoder re-ranking, SLB-only fallback, registry changes seen by a second replica."""

import asyncio
import hashlib
import json
import shutil

import numpy as np
import pytest

from services.common.embedder import Embedder
from services.common.store import LocalStore
from services.router.config import RouterConfig
from services.router.keys import LexicalIndex, alt_tool_text, query_part
from services.router.router import HistoryTurn, Router
from tests.conftest import REPO
from training.data import equivalents, load_queries, load_registry
from training.gate import (
    EXEMPLAR_GRID,
    EXEMPLAR_TEMPERATURES,
    LEXICAL_GRID,
    SLB_CALIBRATION_VERSION,
    TOOL_BIAS_MU,
    GateHyperParams,
    calibration_hash,
    make_examples,
    setting_name,
    train_gate,
)

SERVERS = {"time", "redis"}
HP = GateHyperParams(seed=3, q_epochs=1, ce_epochs=1, q_batch=16, ce_batch_groups=16, val_fraction=0.25,
                     threads=1, ce_top_k=3)


def _weights_digest(path):
    h = hashlib.sha256()
    for sub in ("query_encoder", "cross_encoder"):
        h.update((path / sub / "model.safetensors").read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    registry = load_registry(REPO / "data" / "mcp_tools")
    tools = [t for t in registry.tools if registry.server_of[t.name] in SERVERS]
    lines = [ln for ln in load_queries(REPO / "data" / "queries" / "train.jsonl") if ln.server in SERVERS]
    root = tmp_path_factory.mktemp("gate")
    doc = train_gate(lines, tools, root / "a", HP, equivalents=equivalents, progress=False)
    return {"tools": tools, "lines": lines, "root": root, "doc": doc, "gate": root / "a"}


@pytest.fixture(scope="module")
def embedder():
    return Embedder("")


def test_training_is_deterministic_for_a_seed_and_cached(tiny):
    doc2 = train_gate(tiny["lines"], tiny["tools"], tiny["root"] / "b", HP, equivalents=equivalents, progress=False)
    strip = lambda d: {k: v for k, v in d.items() if k != "train_seconds"}  # noqa: E731
    assert strip(doc2) == strip(tiny["doc"])
    assert _weights_digest(tiny["root"] / "a") == _weights_digest(tiny["root"] / "b")
    # same data + hyper-parameters: the cached model is kept, not retrained
    mtime = (tiny["root"] / "b" / "gate.json").stat().st_mtime_ns
    train_gate(tiny["lines"], tiny["tools"], tiny["root"] / "b", HP, equivalents=equivalents, progress=False)
    assert (tiny["root"] / "b" / "gate.json").stat().st_mtime_ns == mtime


def test_gate_json_records_calibration_and_never_validates_on_training_lines(tiny):
    doc = tiny["doc"]
    assert doc["n_fit"] + doc["n_val"] == len(tiny["lines"]) and doc["n_val"] >= 3
    assert set(doc["val_ids"]) <= {ln.id for ln in tiny["lines"]}
    # the single-key tau; the calibration of the SLB scoring then re-chooses tau and alpha under its scoring
    assert doc["slb"]["before"]["tau"] == pytest.approx(doc["calibration"]["margin_quantiles"]["20"])
    assert doc["alpha"] in HP.alpha_grid and doc["ce_top_k"] == 3


def test_slb_calibration_is_chosen_on_validation_and_in_force(tiny):
    slb = tiny["doc"]["slb"]
    assert slb["version"] == SLB_CALIBRATION_VERSION and slb["n_val"] == tiny["doc"]["n_val"]
    assert slb["lexical_weight"] in LEXICAL_GRID and isinstance(slb["alt_keys"], bool)
    assert slb["exemplar_weight"] in EXEMPLAR_GRID and slb["n_exemplars"] == tiny["doc"]["n_fit"]
    # text keys: alternate key x lexical weight; exemplar keys: each weight x pooling temperature, description key alone
    assert len(slb["by_setting"]) == 2 * len(LEXICAL_GRID) + (len(EXEMPLAR_GRID) - 1) * len(EXEMPLAR_TEMPERATURES)
    assert slb["exemplar_weight"] == 0 or (slb["lexical_weight"], slb["alt_keys"]) == (0.0, False)
    assert slb["exemplar_temperature"] in EXEMPLAR_TEMPERATURES
    assert slb["exemplar_weight"] > 0 or slb["exemplar_temperature"] == 0.0
    chosen = setting_name(slb["alt_keys"], slb["lexical_weight"], slb["exemplar_weight"], slb["exemplar_temperature"])
    assert slb["by_setting"][chosen] == slb["val_slb_top1"] == max(slb["by_setting"].values())
    # among settings of equal top-1 the best mean reciprocal rank wins
    tied = [k for k, v in slb["by_setting"].items() if v == slb["val_slb_top1"]]
    assert slb["by_setting_mrr"][chosen] == slb["val_slb_mrr"] == max(slb["by_setting_mrr"][k] for k in tied)
    assert np.isfinite(slb["exemplar_gap"]) and (slb["exemplar_weight"] > 0 or slb["exemplar_gap"] == 0.0)
    assert (tiny["doc"]["tau"], tiny["doc"]["alpha"]) == (slb["tau"], slb["alpha"]) and slb["alpha"] in HP.alpha_grid
    # the tool bias: none, or the fit whose L2 strength beat none on the same lines
    if slb["exemplar_weight"] > 0:
        assert set(slb["by_tool_bias"]) == {"none"} | {f"{mu:g}" for mu in TOOL_BIAS_MU}
        if slb["tool_bias"]:
            assert slb["by_tool_bias"][f"{slb['tool_bias_mu']:g}"] >= slb["by_tool_bias"]["none"]
            assert set(slb["tool_bias"]) <= {t.name for t in tiny["tools"]}
        else:
            assert slb["tool_bias_mu"] is None
    else:
        assert (slb["tool_bias"], slb["by_tool_bias"]) == ({}, {})


def test_cached_model_without_calibration_is_calibrated_in_place(tiny):
    dst = tiny["root"] / "uncalibrated"
    shutil.copytree(tiny["gate"], dst)
    doc = json.loads((dst / "gate.json").read_text())
    before = doc.pop("slb")
    doc.update(before["before"])  # the uncalibrated doc as an older training run wrote it
    (dst / "gate.json").write_text(json.dumps(doc))
    (dst / "exemplars.npy").unlink()  # older models have the texts only
    again = train_gate(tiny["lines"], tiny["tools"], dst, HP, equivalents=equivalents, progress=False)
    assert again["slb"] == before and again["tau"] == tiny["doc"]["tau"]
    np.testing.assert_allclose(np.load(dst / "exemplars.npy"), np.load(tiny["gate"] / "exemplars.npy"), atol=1e-6)
    assert json.loads((dst / "gate.json").read_text())["slb"] == before
    assert _weights_digest(dst) == _weights_digest(tiny["gate"])  # not retrained


def _router(store, embedder, gate_dir, precision="int8"):
    r = Router(RouterConfig(store_url=str(store.root), gate_model_dir=str(gate_dir), native_scan=False,
                            query_encoder_precision=precision), store, embedder)
    asyncio.run(r.sync(force=True))
    return r


def _with_tau(tiny, tau, alpha=0.5, alt_keys=False, lexical_weight=0.0, exemplar_weight=0.0, exemplar_temperature=0.0,
              tool_bias=None):
    dst = tiny["root"] / (f"tau{tau}-alpha{alpha}-alt{alt_keys}-lex{lexical_weight}-ex{exemplar_weight}"
                          f"-T{exemplar_temperature}-bias{sorted((tool_bias or {}).items())}")
    if not dst.exists():
        shutil.copytree(tiny["gate"], dst)
        doc = json.loads((dst / "gate.json").read_text())
        doc["tau"], doc["alpha"] = tau, alpha
        doc["slb"].update(alt_keys=alt_keys, lexical_weight=lexical_weight, exemplar_weight=exemplar_weight,
                          exemplar_temperature=exemplar_temperature, tool_bias=tool_bias or {})
        (dst / "gate.json").write_text(json.dumps(doc))
    return dst


def test_router_scores_the_max_of_both_keys_plus_the_lexical_addend(tiny, embedder, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.registry_put(tiny["tools"])
    r = _router(store, embedder, _with_tau(tiny, -1e9, alt_keys=True, lexical_weight=0.5))
    query = "redis set key session:42"
    d = r.route(query, [HistoryTurn("user", "what time is it in Tokyo")], top_k=len(tiny["tools"]))
    names = r.index.names()
    by_name = {t.name: t for t in tiny["tools"]}
    q = r.gate.embed_query(d_text := f"{query}\n[context] user: what time is it in Tokyo")
    assert query_part(d_text) == query
    text = np.array([r.index.vector(n) for n in names]) @ q
    alt = embedder.embed([alt_tool_text(by_name[n]) for n in names]) @ q
    lex = LexicalIndex.of_tools([by_name[n] for n in names]).scores(query)  # the query only, not the history
    want = dict(zip(names, np.maximum(text, alt) + 0.5 * lex, strict=True))
    assert lex.max() == 1.0 and not np.allclose(alt, text, atol=0.02)
    for n, s in d.candidates:
        assert s == pytest.approx(want[n], abs=0.02)
    # alternate keys are stored once per schema and reused by the next replica
    assert store.get(r._alt_key_name(tiny["tools"][0], r._key_encoder()[0]))
    plain = _router(store, embedder, _with_tau(tiny, -1e9))
    assert not plain.index._snap.has_alt and plain._lexical_bonus(query) is None


def test_exemplar_keys_are_stored_with_the_model_and_scored_at_the_chosen_weight(tiny, embedder, tmp_path):
    from services.router.gate import GateModel

    g = GateModel(tiny["gate"], threads=1)
    rows = [json.loads(x) for x in (tiny["gate"] / "exemplars.jsonl").read_text().splitlines()]
    stored = np.load(tiny["gate"] / "exemplars.npy")
    assert len(rows) == len(stored) == tiny["doc"]["n_fit"] and not {r["id"] for r in rows} & set(tiny["doc"]["val_ids"])
    np.testing.assert_allclose(stored[:5], g.embed_queries([r["text"] for r in rows[:5]]), atol=1e-5)
    keys = g.exemplar_keys()
    assert sum(len(v) for v in keys.values()) == len(rows) and set(keys) <= {t.name for t in tiny["tools"]}

    store = LocalStore(tmp_path / "store")
    store.registry_put(tiny["tools"])
    r = _router(store, embedder, _with_tau(tiny, -1e9, exemplar_weight=0.75))
    assert r.exemplar_weight == 0.75 and r.index._snap.n_exemplars == len(rows)
    query = "what time is it in Tokyo right now?"
    d = r.route(query, top_k=len(tiny["tools"]))
    q = r.gate.embed_query(query)
    names = r.index.names()
    text = np.array([r.index.vector(n) for n in names]) @ q
    best = {n: float((keys[n] @ q).max()) if n in keys else float(text[i]) for i, n in enumerate(names)}
    want = {n: text[i] + 0.75 * best[n] for i, n in enumerate(names)}
    for n, s in d.candidates:
        assert s == pytest.approx(want[n], abs=0.02)
    # the model's pooling temperature reaches the scan: log-mean-exp of each tool's exemplar sims
    pooled = _router(store, embedder, _with_tau(tiny, -1e9, exemplar_weight=0.75, exemplar_temperature=0.02))
    assert pooled.index.exemplar_temperature == 0.02
    lme = {n: float((s := keys[n] @ q).max() + 0.02 * np.log(np.mean(np.exp((s - s.max()) / 0.02)))) for n in keys}
    want = {n: text[i] + 0.75 * lme.get(n, best[n]) for i, n in enumerate(names)}
    got = pooled.route(query, top_k=len(tiny["tools"])).candidates
    for n, s in got:
        assert s == pytest.approx(want[n], abs=0.02)
    assert any(abs(lme[n] - best[n]) > 0.01 for n in keys)  # the pooling changes scores here
    # a model whose stored vectors do not match its rows embeds the exemplars again (logged), same keys
    stale = tiny["root"] / "stale-exemplars"
    shutil.copytree(tiny["gate"], stale)
    np.save(stale / "exemplars.npy", stored[:3])
    again = GateModel(stale, threads=1).exemplar_keys()
    assert again.keys() == keys.keys()
    for n in keys:
        np.testing.assert_allclose(again[n], keys[n], atol=1e-5)
    # the configured weight overrides the model's: 0 turns exemplar keys off
    cfg = RouterConfig(store_url=str(store.root), gate_model_dir=str(_with_tau(tiny, -1e9, exemplar_weight=0.75)),
                       native_scan=False, exemplar_weight=0.0)
    off = Router(cfg, store, embedder)
    asyncio.run(off.sync(force=True))
    assert off.exemplar_weight == 0.0 and off.index._snap.n_exemplars == 0


def test_the_calibrated_tool_bias_is_added_at_the_models_exemplar_weight_only(tiny, embedder, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.registry_put(tiny["tools"])
    query = "what time is it in Tokyo right now?"
    plain = _router(store, embedder, _with_tau(tiny, -1e9, exemplar_weight=0.75)).route(query, top_k=len(tiny["tools"]))
    bias = {"set": 0.4, "no_such_tool": 9.0}  # a tool the registry does not hold is ignored
    r = _router(store, embedder, _with_tau(tiny, -1e9, exemplar_weight=0.75, tool_bias=bias))
    assert r.gate.info.tool_bias == bias
    got = dict(r.route(query, top_k=len(tiny["tools"])).candidates)
    for n, s in plain.candidates:
        assert got[n] == pytest.approx(s + bias.get(n, 0.0), abs=1e-5)
    # under a configured exemplar weight other than the calibrated one the bias is not applied
    cfg = RouterConfig(store_url=str(store.root), native_scan=False, exemplar_weight=0.5,
                       gate_model_dir=str(_with_tau(tiny, -1e9, exemplar_weight=0.75, tool_bias=bias)))
    other = Router(cfg, store, embedder)
    asyncio.run(other.sync(force=True))
    assert other.index._snap.bias is None
    # a corrupt bias (NaN in gate.json) is logged and dropped: the router still routes
    broken = _router(store, embedder, _with_tau(tiny, -1e9, exemplar_weight=0.75, tool_bias={"set": float("nan")}))
    assert broken.index._snap.bias is None and dict(broken.route(query, top_k=3).candidates)


def test_a_gate_directory_scores_in_float_what_the_router_scans(tiny, embedder, tmp_path):
    """``routing_models.load_scorer``, the benches' float SLB of a gate directory (and so of a fold model): the
    router's scores at fp32 to INT8 noise, tool bias included; a request's own exemplar row can be left out."""
    from dataclasses import fields

    from evals.routing_models import FoldModel, GateScorer, load_scorer

    bias = {"set": 0.4}
    gate_dir = _with_tau(tiny, -1e9, exemplar_weight=0.75, exemplar_temperature=0.02, tool_bias=bias)
    store = LocalStore(tmp_path / "store")
    store.registry_put(tiny["tools"])
    r = _router(store, embedder, gate_dir, precision="fp32")  # the benches' float SLB embeds with torch
    names = r.index.names()
    gs = load_scorer(gate_dir, names)
    assert (gs.w, gs.temp) == (0.75, 0.02) and np.allclose(gs.bias(names), [bias.get(n, 0.0) for n in names])
    keys = np.array([r.index.vector(n) for n in names])
    rows = gs.rows[:3]
    got = gs.scores([x["text"] for x in rows], keys) + gs.bias(names)
    for x, sc in zip(rows, got, strict=True):
        want = dict(r.route(x["text"], top_k=len(names)).candidates)
        assert all(sc[i] == pytest.approx(want[n], abs=0.02) for i, n in enumerate(names))
    out = gs.scores([x["text"] for x in rows], keys, leave_out=np.arange(3))
    own = [names.index(x["tool"]) for x in rows]
    assert all(out[i, j] <= got[i, j] - gs.bias(names)[j] + 1e-6 for i, j in enumerate(own))
    fm = FoldModel(**{f.name: getattr(gs, f.name) for f in fields(GateScorer)}, idxs=[1])
    assert np.array_equal(fm.scores([rows[0]["text"]], keys), gs.scores([rows[0]["text"]], keys)) and fm.held == []


def test_router_escalates_below_tau_and_reranks_top_k(tiny, embedder, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.registry_put(tiny["tools"])
    query = "what time is it in Tokyo right now?"
    always = _router(store, embedder, _with_tau(tiny, 1e9))
    never = _router(store, embedder, _with_tau(tiny, -1e9))
    d_always, d_never = always.route(query, top_k=5), never.route(query, top_k=5)
    assert d_always.escalated and d_always.gate == "escalated" and not d_never.escalated
    assert d_never.tool == d_never.slb_candidates[0][0] and d_never.candidates == d_never.slb_candidates[:5]
    reranked = [n for n, _ in d_always.candidates[:3]]
    assert sorted(reranked) == sorted(n for n, _ in d_always.slb_candidates[:3])  # only the top ce_top_k move
    gate = always.gate
    ce = gate.ce_scores(query, [always._ce_texts[n] for n in reranked])  # no history: the text is the query
    fused = np.array([dict(d_always.slb_candidates)[n] for n in reranked]) + gate.info.alpha * ce
    assert [s for _, s in d_always.candidates[:3]] == pytest.approx(sorted(fused, reverse=True), abs=1e-4)


def test_cross_encoder_weight_zero_never_escalates(tiny, embedder, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.registry_put(tiny["tools"])
    r = _router(store, embedder, _with_tau(tiny, 1e9, alpha=0.0))
    d = r.route("what time is it in Tokyo right now?")
    assert not d.escalated and d.gate == "auto" and d.tool == d.slb_candidates[0][0]


def test_router_without_gate_model_is_slb_only(tiny, embedder, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.registry_put(tiny["tools"])
    r = _router(store, embedder, tmp_path / "no-such-model")
    d = r.route("convert 3pm New York time to London time", [HistoryTurn("user", "hi")])
    assert r.gate is None and d.gate == "slb-only" and not d.escalated and d.tool in {t.name for t in tiny["tools"]}


def test_registry_changes_reach_a_second_replica(tiny, embedder, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.registry_put(tiny["tools"][:3])
    a, b = _router(store, embedder, tiny["gate"]), _router(store, embedder, tiny["gate"])
    assert len(b.index) == 3
    asyncio.run(a.register([t.to_json() for t in tiny["tools"][3:]], lambda t: asyncio.sleep(0)))
    assert len(a.index) == len(tiny["tools"])
    assert asyncio.run(b.sync()) and sorted(b.index.names()) == sorted(t.name for t in tiny["tools"])
    gone = tiny["tools"][0].name
    asyncio.run(a.remove([gone]))
    assert asyncio.run(b.sync()) and gone not in b.index
    assert all(n != gone for n, _ in b.route("what time is it", top_k=10).candidates)


def test_augment_lines_join_the_fit_split_only(tiny):
    from pathlib import Path

    from evals.routing_models import load_augment

    aug_dir = Path(__file__).resolve().parents[2] / "data" / "routing_augment"
    extra = [ln for ln in load_augment(aug_dir) if ln.server in SERVERS]
    assert len(extra) == 12 * len(tiny["tools"])  # the committed data: three batches of 4 requests per tool
    out = tiny["root"] / "aug"
    doc = train_gate(tiny["lines"], tiny["tools"], out, HP, equivalents=equivalents, progress=False, extra=extra)
    assert doc["data_hash"] != tiny["doc"]["data_hash"]  # another model, cached apart
    assert doc["n_fit_extra"] == len(extra) and doc["n_fit"] == tiny["doc"]["n_fit"] + len(extra)
    # validation (tau, alpha, SLB calibration) stays on the same real lines
    assert doc["val_ids"] == tiny["doc"]["val_ids"] and not any(i.startswith(("a-", "b-", "c-")) for i in doc["val_ids"])
    # the exemplar keys: every fit line, real and augment, and no validation line
    ids = [json.loads(row)["id"] for row in (out / "exemplars.jsonl").read_text().splitlines()]
    assert len(ids) == doc["n_fit"] == doc["slb"]["n_exemplars"] and not set(ids) & set(doc["val_ids"])
    assert sum(i.startswith(("a-", "b-", "c-")) for i in ids) == len(extra)
    assert np.load(out / "exemplars.npy").shape == (len(ids), 384)


def _calibration_lines():
    from pathlib import Path

    from evals.routing_models import load_augment

    return [ln for ln in load_augment(Path(__file__).resolve().parents[2] / "data" / "routing_calibration")
            if ln.server in SERVERS]


def test_calibration_lines_join_validation_and_recalibrate_a_cached_model_in_place(tiny):
    calib = _calibration_lines()
    assert len(calib) == 4 * len(tiny["tools"])  # the committed batch: 4 requests per tool
    dst = tiny["root"] / "calibrated"
    shutil.copytree(tiny["gate"], dst)
    doc = train_gate(tiny["lines"], tiny["tools"], dst, HP, equivalents=equivalents, progress=False,
                     calibration=calib)
    assert _weights_digest(dst) == _weights_digest(tiny["gate"])  # calibrated again, not retrained
    slb = doc["slb"]
    assert (slb["n_val"], slb["n_calibration"]) == (tiny["doc"]["n_val"], len(calib))
    assert slb["calibration_hash"] == calibration_hash(make_examples(calib, {t.name for t in tiny["tools"]},
                                                                     equivalents))
    assert tiny["doc"]["slb"]["calibration_hash"] == "" and tiny["doc"]["slb"]["n_calibration"] == 0
    # every choice is scored over validation + calibration lines (fractions of their sum), the real lines apart
    n = slb["n_val"] + slb["n_calibration"]
    assert all(abs(v * n - round(v * n)) < 1e-6 for v in slb["by_setting"].values())
    assert slb["val_slb_top1_real_lines"] is not None and 0 <= slb["val_slb_top1_real_lines"] <= 1
    assert abs(doc["val_escalation_rate"] * n - round(doc["val_escalation_rate"] * n)) < 1e-6
    # the same set again: kept as is; no calibration set: back to the validation-only calibration
    mtime = (dst / "gate.json").stat().st_mtime_ns
    train_gate(tiny["lines"], tiny["tools"], dst, HP, equivalents=equivalents, progress=False, calibration=calib)
    assert (dst / "gate.json").stat().st_mtime_ns == mtime
    back = train_gate(tiny["lines"], tiny["tools"], dst, HP, equivalents=equivalents, progress=False)
    assert back["slb"] == tiny["doc"]["slb"]


def test_calibration_lines_must_be_held_out_of_training(tiny):
    dst = tiny["root"] / "calibrated-in-sample"
    shutil.copytree(tiny["gate"], dst)
    fit_line = next(ln for ln in tiny["lines"] if ln.id not in set(tiny["doc"]["val_ids"]))
    with pytest.raises(ValueError, match="held out of training and validation"):
        train_gate(tiny["lines"], tiny["tools"], dst, HP, equivalents=equivalents, progress=False,
                   calibration=[fit_line])


def test_single_query_fast_path_gives_the_encode_vector(tiny):
    from services.router.gate import GateModel

    g = GateModel(tiny["gate"], threads=1)
    assert g._single is not None  # the trained encoder is Transformer + mean pooling + normalize
    qs = ["What time is it in Tokyo right now?", "get config:max_upload_mb", "x" * 2000]  # the last is truncated
    for q in qs:
        np.testing.assert_allclose(g.embed_query(q), g.embed_queries([q])[0], atol=2e-6)


def test_the_cross_encoder_is_switched_on_only_for_a_real_validation_gain():
    from training.gate import CE_MIN_GAIN, choose_alpha

    grid = (0.0, 0.05, 0.2, 0.5)
    # session 5's production model: +1.4 points (2 of 144 lines) at 0.05 -> stays off
    assert choose_alpha({"0.0": 0.743, "0.05": 0.757, "0.2": 0.736, "0.5": 0.653}, grid) == 0.0
    # session 3's folds: +4-5 points at 0.2 -> on, at the smallest of the best weights
    assert choose_alpha({"0.0": 0.69, "0.05": 0.70, "0.2": 0.74, "0.5": 0.74}, grid) == 0.2
    assert choose_alpha({"0.0": 0.5, "0.05": 0.5 + CE_MIN_GAIN, "0.2": 0.5, "0.5": 0.4}, grid) == 0.05
    assert choose_alpha({"0.0": 0.8, "0.05": 0.7, "0.2": 0.6, "0.5": 0.5}, grid) == 0.0


def test_exemplar_gap_is_the_median_lift_of_the_right_tools_best_exemplar():
    from training.gate import Example, exemplar_gap

    e = np.eye(4, dtype=np.float32)
    keys = np.stack([e[0], e[1]])  # tools a, b
    q = np.stack([0.6 * e[0] + 0.8 * e[2], 0.6 * e[1] + 0.8 * e[3], 0.6 * e[0] + 0.8 * e[2]])
    val = [Example("1", "x", "a", frozenset({"a"})), Example("2", "y", "b", frozenset({"b"})),
           Example("3", "z", "c", frozenset({"c"}))]  # c: not in the registry, skipped
    ex = {"a": np.stack([e[2], -e[2]]), "b": np.stack([0.5 * e[3]])}
    # a: best exemplar 0.8 - key 0.6 = 0.2; b: 0.4 - 0.6 = -0.2 -> median 0
    assert exemplar_gap(q[:2], val[:2], keys, None, ["a", "b"], ex) == pytest.approx(0.0, abs=1e-6)
    assert exemplar_gap(q[:1], val[:1], keys, None, ["a", "b"], ex) == pytest.approx(0.2, abs=1e-6)
    # the alternate key raises the key side: a's key becomes max(0.6, 0.8) = 0.8
    assert exemplar_gap(q[:1], val[:1], keys, np.stack([e[2], e[1]]), ["a", "b"], ex) == pytest.approx(0.0, abs=1e-6)
    assert exemplar_gap(q, val, keys, None, ["a", "b"], {}) == 0.0
    # pooled as the SLB pools: a's log-mean-exp over {0.8, -0.8} at T = 0.5 is 0.8 + 0.5 log((1 + e^-3.2) / 2)
    lme = 0.8 + 0.5 * np.log((1 + np.exp(-3.2)) / 2)
    assert exemplar_gap(q[:1], val[:1], keys, None, ["a", "b"], ex, 0.5) == pytest.approx(lme - 0.6, abs=1e-5)


def test_warmup_linear_rises_over_a_tenth_then_decays_to_zero():
    import torch

    from training.gate import warmup_linear

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_linear(opt, 20)
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([0.5, 19 / 20, 18 / 20])  # warm-up over 2 steps, times the linear decay
    assert max(lrs) <= 1.0 and lrs[-1] == pytest.approx(1 / 20) and opt.param_groups[0]["lr"] == 0.0
    assert warmup_linear(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 0).get_last_lr() == [1.0]


def test_leave_one_out_scores_are_the_scores_without_that_exemplar():
    from training.gate import float_tool_scores

    rng = np.random.default_rng(0)
    keys, ex = rng.normal(size=(5, 8)).astype(np.float32), rng.normal(size=(12, 8)).astype(np.float32)
    tool_of_row = np.array([0, 0, 1, 1, 1, 2, 3, 3, 0, 1, 2, 4])  # tool 4 has one row; no tool has none
    for temp in (0.0, 0.05):
        got = float_tool_scores(ex, keys, ex, tool_of_row, 2.0, temp, 0.1, leave_out=np.arange(12))
        for i in range(12):
            keep = np.arange(12) != i
            want = float_tool_scores(ex[i : i + 1], keys, ex[keep], tool_of_row[keep], 2.0, temp, 0.1)[0]
            np.testing.assert_allclose(got[i], want, atol=1e-5)
        # without leave-out: the key plus w times the pooled sims, the row's own sim included
        full = float_tool_scores(ex[:1], keys, ex, tool_of_row, 2.0, temp, 0.1)[0]
        assert full[0] > got[0, 0]  # its own row (sim |x|^2 > any other) lifted its tool
        assert full[4] == pytest.approx(float(keys[4] @ ex[0] + 2.0 * (ex[11] @ ex[0])), abs=1e-4)


def test_the_tool_bias_lifts_a_tool_its_neighbour_keeps_beating():
    from training.gate import fit_tool_bias

    # tool 1's requests score tool 0 a little higher (the SLB errs on all of them); tool 0's own requests win by far;
    # tool 2 has no request
    scores = np.array([[0.9, 0.3, 0.2]] * 20 + [[0.75, 0.7, 0.1]] * 20, np.float32)
    right = np.zeros(scores.shape, bool)
    right[:20, 0] = right[20:, 1] = True
    b = fit_tool_bias(scores, right, mu=1e-3)
    assert b[2] == 0.0
    fixed = (scores + b).argmax(1)
    assert (fixed[:20] == 0).all() and (fixed[20:] == 1).all()
    strong = fit_tool_bias(scores, right, mu=100.0)  # a strong L2 keeps it near none: the SLB's errors stay
    assert abs(strong).max() < 0.02 and ((scores + strong).argmax(1) == 0).all()
    # an equivalent of the right tool counts as right: tool 0 is right for every request, so it is not lowered
    both = right.copy()
    both[20:, 0] = True
    eq = fit_tool_bias(scores, both, mu=1e-3)
    assert eq[0] > eq[1] and both[np.arange(40), (scores + eq).argmax(1)].all()


@pytest.mark.integration
def test_exemplar_keys_and_bias_follow_the_schema_not_the_name_through_register_and_route(tiny, tmp_path):
    """A user's tool that shares a trained tool's name inherits neither its exemplar keys nor its bias; a trained tool
    re-registered with a new description loses them; the trained schema itself keeps them (RegisterTools + Route +
    ListTools over gRPC, the tiny real gate model)."""
    from nexus_client import NexusClient
    from tests.conftest import start_compiler, start_router

    assert tiny["doc"]["tool_schemas"] == {t.name: t.schema_hash for t in tiny["tools"]}
    gate = _with_tau(tiny, -1e9, exemplar_weight=0.75, tool_bias={"get_current_time": 0.3})
    store_url = str(tmp_path / "store")
    compiler = start_compiler(store_url)
    router = start_router(store_url, compiler.addr, gate_model_dir=str(gate), native_scan=False)
    try:
        with NexusClient(router=router.addr, timeout_s=120) as client:
            client.register([t.to_json() for t in tiny["tools"]])
            keys = {t.name: t.keys for t in client.list_tools().tools}
            assert set(keys.values()) == {"trained"}  # every tool of the model's own schemas
            query = "what time is it in Tokyo right now?"
            before = dict((c.tool, c.score) for c in client.route(query, top_k=len(tiny["tools"])).candidates)
            # a user's own server with a tool named like a trained one, and a trained tool re-described
            by_name = {t.name: t for t in tiny["tools"]}
            mine = {"name": "get_current_time", "description": "Read the wall clock of the build farm's agents.",
                    "inputSchema": {"type": "object", "properties": {"agent": {"type": "string"}}}}
            convert = by_name["convert_time"]
            redescribed = {"name": convert.name, "description": convert.description + " (v2)",
                           "inputSchema": convert.input_schema}
            client.register([mine, redescribed])
            keys = {t.name: t.keys for t in client.list_tools().tools}
            assert keys["get_current_time"] != "trained" and keys["convert_time"] != "trained"
            assert all(keys[n] == "trained" for n in keys if n not in ("get_current_time", "convert_time"))
            after = dict((c.tool, c.score) for c in client.route(query, top_k=len(tiny["tools"])).candidates)
            # the unchanged tools score as before; the user's get_current_time has no bias and no exemplar keys:
            # its score is the text key's, as for any tool registered after training
            for n, s in before.items():
                if n not in ("get_current_time", "convert_time"):
                    assert after[n] == pytest.approx(s, abs=1e-4)
            r = Router(RouterConfig(store_url=store_url, gate_model_dir=str(gate), native_scan=False,
                                    derived_keys=False), LocalStore(store_url), Embedder(""))
            asyncio.run(r.sync(force=True))
            snap = r.index._snap
            assert snap.bias is None or snap.bias[snap.pos["get_current_time"]] == 0.0
            assert snap.pos["get_current_time"] not in set(snap.ex_tools.tolist())
            assert snap.pos["convert_time"] not in set(snap.ex_tools.tolist())
            # the trained schema registered again gets its keys and bias back
            client.register([by_name["get_current_time"].to_json(), convert.to_json()])
            assert {t.keys for t in client.list_tools().tools} == {"trained"}
            again = dict((c.tool, c.score) for c in client.route(query, top_k=len(tiny["tools"])).candidates)
            for n, s in before.items():
                assert again[n] == pytest.approx(s, abs=1e-4)
    finally:
        router.stop()
        compiler.stop()


def test_a_users_example_requests_key_their_tool_through_register_route_and_list(tiny, tmp_path):
    """RegisterTools with examples: the router keys the user's tool by them too (ListTools keys "examples"), a
    request like one of them scores the tool higher than its text key alone did, they stay with the schema across a
    re-registration without examples and not with a re-described tool; bad examples register nothing (real gRPC,
    the tiny real gate model)."""
    import grpc

    from nexus_client import NexusClient, NexusClientError
    from tests.conftest import start_compiler, start_router

    gate = _with_tau(tiny, -1e9, exemplar_weight=0.75)
    store_url = str(tmp_path / "store")
    compiler = start_compiler(store_url)
    router = start_router(store_url, compiler.addr, gate_model_dir=str(gate), native_scan=False)
    refund = {"name": "shop_refund_order", "description": "Refund a customer order.",
              "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}}}}
    query = "the parcel for A-1009 arrived broken, give the buyer their money back"
    examples = {"shop_refund_order": ["the parcel for A-2210 arrived broken, give the buyer their money back",
                                      "customer wants their money back for order 881"]}
    try:
        with NexusClient(router=router.addr, timeout_s=120) as client:
            client.register([t.to_json() for t in tiny["tools"]] + [refund])
            assert {t.name: t.keys for t in client.list_tools().tools}["shop_refund_order"] == "text"
            before = {c.tool: c.score for c in client.route(query, top_k=10).candidates}["shop_refund_order"]
            for bad, msg in (({"nope": ["x"]}, "not a tool of this registration"),
                             ({"shop_refund_order": [" "]}, "non-empty"),
                             ({"shop_refund_order": ["x"] * 65}, "the limit is 64")):
                with pytest.raises(NexusClientError, match=msg) as e:
                    client.register([refund], examples=bad)
                assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert {t.name: t.keys for t in client.list_tools().tools}["shop_refund_order"] == "text"
            client.register([refund], examples=examples)
            assert {t.name: t.keys for t in client.list_tools().tools}["shop_refund_order"] == "examples"
            after = {c.tool: c.score for c in client.route(query, top_k=10).candidates}["shop_refund_order"]
            assert after > before
            client.register([refund])  # the same schema again, no examples given: it keeps them
            assert {t.name: t.keys for t in client.list_tools().tools}["shop_refund_order"] == "examples"
            client.register([{**refund, "description": "Refund a customer order in full."}])  # a new tool
            assert {t.name: t.keys for t in client.list_tools().tools}["shop_refund_order"] == "text"
    finally:
        router.stop()
        compiler.stop()


def test_example_files_read_as_tool_to_requests(tmp_path):
    from cli.main import load_examples

    f = tmp_path / "ex.jsonl"
    f.write_text('{"tool": "a", "request": "one"}\n\n{"tool": "a", "request": "two"}\n{"tool": "b", "request": "x"}\n')
    assert load_examples(str(f)) == {"a": ["one", "two"], "b": ["x"]}
    f.write_text('{"tool": "a"}\n')
    with pytest.raises(SystemExit, match="ex.jsonl:1"):
        load_examples(str(f))


def test_nexus_register_sends_an_example_file_with_its_tools(tiny, tmp_path, capsys):
    """`nexus register --tools DIR --examples FILE.jsonl` against a real router: the tools named in the file are keyed
    by their examples (ListTools), the others by their text; examples for a tool not in DIR register nothing."""
    from cli.main import main as nexus
    from nexus_client import NexusClient
    from tests.conftest import start_compiler, start_router

    tools_dir = tmp_path / "tools"
    tools_dir.mkdir()
    (tools_dir / "shop.json").write_text(json.dumps({"server": "shop", "tools": [
        {"name": "shop_refund_order", "description": "Refund a customer order.",
         "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}}}},
        {"name": "shop_track_parcel", "description": "Where a parcel is now.",
         "inputSchema": {"type": "object", "properties": {"parcel_id": {"type": "string"}}}}]}))
    examples = tmp_path / "examples.jsonl"
    examples.write_text(json.dumps({"tool": "shop_refund_order", "request": "money back for order 881"}) + "\n")
    store_url = str(tmp_path / "store")
    compiler = start_compiler(store_url)
    router = start_router(store_url, compiler.addr, gate_model_dir=str(_with_tau(tiny, -1e9, exemplar_weight=0.75)),
                          native_scan=False)
    try:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"tool": "shop_cancel_order", "request": "cancel 881"}) + "\n")
        with pytest.raises(SystemExit, match="shop_cancel_order"):
            nexus(["register", "--tools", str(tools_dir), "--router", router.addr, "--examples", str(bad)])
        assert nexus(["register", "--tools", str(tools_dir), "--router", router.addr, "--examples", str(examples)]) == 0
        assert "examples 1, text 1" in capsys.readouterr().out
        with NexusClient(router=router.addr) as client:
            keys = {t.name: t.keys for t in client.list_tools().tools}
        assert keys == {"shop_refund_order": "examples", "shop_track_parcel": "text"}
    finally:
        router.stop()
        compiler.stop()
