"""The gate's argument-evidence stage (services/router/argevidence.py): features, calibration, staleness, and the
router escalating with the real gate model and the real slot reader."""

import json
import logging
from dataclasses import dataclass

import numpy as np
import pytest

from services.router import argevidence as ae

SLOTS = "var/models/slots"
GATE = "var/models/gate"


@pytest.fixture(scope="module")
def reader():
    from services.engine.slots import SlotModel

    if not SlotModel.exists(SLOTS):
        pytest.fail(f"no slot model at {SLOTS}: run `make setup` (make models trains it)")
    return SlotModel(SLOTS, threads=1)


@pytest.fixture(scope="module")
def by_name(all_tools):
    return {t.name: t for t in all_tools}


def test_candidate_features_read_the_required_parameters_and_count_the_stated_ones():
    reading = [("owner", True, 18.0), ("repo", True, 4.0), ("issue_number", True, -6.0), ("page", False, 3.0)]
    # scores clipped to +-CLIP (10) and scaled: owner 1.0, repo 0.4, issue_number -0.6
    assert ae.candidate_feature(reading, "req_min", 0.5) == pytest.approx(-0.6)
    assert ae.candidate_feature(reading, "req_mean", 0.5) == pytest.approx((1.0 + 0.4 - 0.6) / 3)
    assert ae.candidate_feature(reading, "stated", 0.5) == 3.0  # owner, repo and the optional page
    assert ae.candidate_feature(reading, "stated", 5.0) == 1.0
    # no required span parameter: no evidence either way; no parameter at all: nothing stated
    assert ae.candidate_feature([("page", False, 9.0)], "req_min", 0.5) == 0.0
    assert ae.candidate_feature([], "stated", 0.5) == 0.0
    # a lower clip saturates sooner: two clearly stated parameters weigh as much as one, 4.0 and 18.0 alike
    assert ae.candidate_feature(reading, "req_mean", 0.5, clip=2.0) == pytest.approx((1.0 + 1.0 - 1.0) / 3)
    assert ae.candidate_feature(reading[:2], "req_mean", 0.5, clip=2.0) == ae.candidate_feature(
        reading[:1], "req_mean", 0.5, clip=2.0) == 1.0
    with pytest.raises(ValueError, match="unknown argument-evidence feature"):
        ae.candidate_feature(reading, "nope", 0.5)


def test_rerank_adds_the_weighted_feature_and_keeps_the_slb_order_on_ties():
    slb = np.array([0.50, 0.48, 0.30])
    feats = np.array([-1.0, 0.5, 1.0])
    assert ae.rerank(slb, feats, 0.0).tolist() == [0, 1, 2]
    assert ae.rerank(slb, feats, 0.01).tolist() == [0, 1, 2]  # 0.49 vs 0.485 vs 0.31
    assert ae.rerank(slb, feats, 0.05).tolist() == [1, 0, 2]  # 0.45 vs 0.505 vs 0.35
    assert ae.rerank(slb, feats, 1.0).tolist() == [2, 1, 0]  # -0.5 vs 0.98 vs 1.3
    assert ae.rerank(np.array([0.5, 0.5]), np.zeros(2), 1.0).tolist() == [0, 1]


def test_margins_ignore_tools_outside_the_registry():
    s = np.array([[0.9, -np.inf, 0.7, 0.1], [0.2, 0.6, -np.inf, 0.55]])
    assert np.allclose(ae.margins(s), [0.2, 0.05])


def test_the_real_reader_finds_the_stated_namespace_of_the_tool_that_requires_it(reader, by_name):
    text = "list the pods in the kube-system namespace"
    ns, plain, gone = ae.read(reader, text, [by_name["pods_list_in_namespace"], by_name["pods_list"], None], False)
    assert [(n, r) for n, r, _ in ns if n == "namespace"] == [("namespace", True)]
    assert ae.candidate_feature(ns, "req_min", reader.threshold) > 0.05
    assert ae.candidate_feature(plain, "req_min", reader.threshold) == 0.0  # pods_list requires no span parameter
    assert gone == []  # a tool unregistered meanwhile reads as no parameters
    req_only = ae.read(reader, text, [by_name["pods_list_in_namespace"]], True)[0]
    assert {n for n, _, _ in req_only} == {n for n, r, _ in ns if r} and all(r for _, r, _ in req_only)
    # reading required parameters only gives the same scores for them (one batch either way)
    full = {n: s for n, _, s in ns}
    assert all(s == pytest.approx(full[n], abs=1e-3) for n, _, s in req_only)
    # a request that names no namespace: the same tool's evidence is against it
    other = ae.read(reader, "show me every pod running in the cluster", [by_name["pods_list_in_namespace"]], True)[0]
    assert ae.candidate_feature(other, "req_min", reader.threshold) < ae.candidate_feature(ns, "req_min",
                                                                                           reader.threshold)


def test_shared_parameters_are_the_ones_every_candidate_has():
    assert ae.shared_names([["owner", "repo", "issue_number"], ["owner", "repo"], None]) == {"owner", "repo"}
    assert ae.shared_names([["owner"], []]) == set() and ae.shared_names([["owner"]]) == set()
    readings = [[("owner", True, 9.0), ("repo", True, 8.0), ("issue_number", True, -3.0)],
                [("owner", True, 9.5), ("repo", True, 7.0), ("state", False, 2.0)]]
    assert ae.drop_shared(readings) == [[("issue_number", True, -3.0)], [("state", False, 2.0)]]


def test_distinct_reading_skips_what_every_candidate_asks_for(reader, by_name):
    text = "diff the working tree of /srv/app against main"
    tools = [by_name["git_diff"], by_name["git_diff_staged"], by_name["git_status"]]
    full = ae.read(reader, text, tools, required_only=False)
    distinct = ae.read(reader, text, tools, required_only=False, distinct=True)
    assert [[n for n, _, _ in r] for r in distinct] == [["target", "context_lines"], ["context_lines"], []]
    assert distinct == [[(n, q, pytest.approx(s, abs=1e-3)) for n, q, s in r] for r in ae.drop_shared(full)]
    # git_diff requires the target the request names; git_status requires nothing once repo_path is shared
    feats = [ae.candidate_feature(r, "req_min", reader.threshold) for r in distinct]
    assert feats[0] > 0 and feats[1] == feats[2] == 0.0


@pytest.mark.parametrize("query, stated", [
    ("close PR octo-org/web-app#199, abandoned", True),  # close ~ closed
    ("close it without merging", True),
    ("show the open issues", True),
    ("reopen it", False),  # a prefix of the request's word only
    ("list everything", False),
])
def test_an_enum_value_named_in_words_is_stated(query, stated):
    assert ae.enum_stated({"type": "string", "enum": ["open", "closed"]}, query) is stated


def test_enum_words_need_every_word_of_a_value_and_short_values_exactly():
    assert ae.enum_stated({"enum": ["not_planned", "completed"]}, "close it as not planned")
    assert not ae.enum_stated({"enum": ["not_planned"]}, "not yet")
    assert ae.enum_stated({"enum": ["asc", "desc"]}, "oldest first, asc")
    assert not ae.enum_stated({"enum": ["asc", "desc"]}, "sorted descending")
    assert not ae.enum_stated({"type": "string"}, "open") and not ae.enum_stated({"enum": [1, 2]}, "1")


def test_enum_words_lift_a_named_value_to_stated_when_on(reader, by_name, monkeypatch):
    """The real reader reads an enum stated in words ("close ... without merging": state=closed) as not stated; with
    ENUM_WORDS the parameter reads at +CLIP, and only in the request's own words (not its context)."""
    tool = by_name["update_pull_request"]
    props = tool.input_schema["properties"]
    assert props["state"].get("enum")
    text = "close octo-org/web-app#199 without merging"
    off = dict((n, s) for n, _, s in ae.read(reader, text, [tool], required_only=False)[0])
    monkeypatch.setattr(ae, "ENUM_WORDS", True)
    on = dict((n, s) for n, _, s in ae.read(reader, text, [tool], required_only=False)[0])
    assert off["state"] < reader.threshold and on["state"] == ae.CLIP
    assert {n: s for n, s in on.items() if n != "state"} == pytest.approx({n: s for n, s in off.items() if n != "state"})
    # the stage reads as its section says, whatever the module's default
    monkeypatch.setattr(ae, "ENUM_WORDS", False)
    stated = [ae.ArgEvidence(reader, "stated", 1.0, 1.0, enum_words=w).features(text, [tool])[0] for w in (False, True)]
    assert stated[1] == stated[0] + 1
    monkeypatch.setattr(ae, "ENUM_WORDS", True)
    with_context = "merge it\n[context] user: close the other one"
    ctx_on = ae.read(reader, with_context, [tool], required_only=False)[0]
    monkeypatch.setattr(ae, "ENUM_WORDS", False)
    assert ctx_on == ae.read(reader, with_context, [tool], required_only=False)[0]


@dataclass(frozen=True)
class Line:
    text: str
    positives: frozenset


def _choose_lines():
    """20 lines over the kubernetes pod twins; the stand-in SLB confuses the namespaced ones by a small margin."""
    spaces = ["kube-system", "monitoring", "payments", "default", "ingress-nginx", "staging", "argo", "istio-system"]
    lines, ranks = [], {}
    for j, ns in enumerate(spaces):  # the SLB puts pods_list first by 0.001-0.008: near-ties, all wrong
        t = f"list the pods in the {ns} namespace"
        lines.append(Line(t, frozenset({"pods_list_in_namespace"})))
        ranks[t] = [("pods_list", 0.6), ("pods_list_in_namespace", 0.6 - 0.001 * (j + 1))]
    for j in range(12):  # confident and right: large margins
        t = f"show every pod across the cluster, view {j}"
        lines.append(Line(t, frozenset({"pods_list"})))
        ranks[t] = [("pods_list", 0.7), ("pods_list_in_namespace", 0.7 - 0.05 - 0.01 * j)]
    return lines, ranks


META = {"data_hash": "d1", "slb": {"version": "slb-cal-v8", "calibration_hash": "c1", "tool_bias": {"x": 0.1}}}


def test_calibrate_keeps_the_stage_when_it_fixes_near_ties_and_says_none_when_it_cannot(reader, by_name):
    lines, ranks = _choose_lines()
    doc = ae.calibrate(lambda text, n: ranks[text][:n], lines, by_name.get, reader, META)
    assert doc["choose_top1_slb"] == pytest.approx(12 / 20)
    assert doc["feature"] in ae.FEATURES and doc["alpha"] > 0 and doc["choose_top1"] > 12 / 20 + ae.MIN_GAIN
    assert 0 < doc["tau"] <= 0.05  # only the near-ties escalate
    assert doc["reader"] == ae.reader_key(reader) and doc["slb"] == ae.slb_key(META) and doc["distinct"] is True
    assert ae.is_current({**META, "arg_evidence": doc}, reader)
    assert len(doc["grid"]) == len(ae.ESCALATE_Q) * len(ae.FEATURES) * len(ae.ALPHAS)
    req = ae.calibrate(lambda text, n: ranks[text][:n], lines, by_name.get, reader, META,
                       features=ae.REQUIRED_FEATURES)
    assert len(req["grid"]) == len(ae.ESCALATE_Q) * len(ae.REQUIRED_FEATURES) * len(ae.ALPHAS)
    assert req["feature"] in ae.REQUIRED_FEATURES
    wide = ae.calibrate(lambda text, n: ranks[text][:n], lines, by_name.get, reader, META, alphas=(0.5, 1.0),
                        clip=2.0)
    assert {g["alpha"] for g in wide["grid"]} == {0.5, 1.0} and wide["alpha"] in (0.5, 1.0)
    assert doc["clip"] == ae.CLIP and wide["clip"] == 2.0
    assert ae.from_gate({**META, "arg_evidence": wide}, reader).clip == 2.0  # the router reads as it was chosen
    words = ae.calibrate(lambda text, n: ranks[text][:n], lines, by_name.get, reader, META, enum_words=True)
    assert doc["enum_words"] is False and words["enum_words"] is True
    assert ae.from_gate({**META, "arg_evidence": words}, reader).enum_words is True
    # the SLB already right everywhere: nothing to gain, no stage
    right = {t: (r if "namespace" not in t else list(reversed(r))) for t, r in ranks.items()}
    none = ae.calibrate(lambda text, n: right[text][:n], lines, by_name.get, reader, META)
    assert none["feature"] == "none" and none["alpha"] == 0.0 and none["choose_escalation_rate"] == 0.0
    assert ae.from_gate({**META, "arg_evidence": none}, reader) is None
    # one tool in the registry: no margins, nothing to escalate
    single = ae.calibrate(lambda text, n: [("pods_list", 0.5)], lines, by_name.get, reader, META)
    assert single["feature"] == "none" and single["choose_top1_slb"] == pytest.approx(12 / 20)
    with pytest.raises(ValueError, match="no choosing lines"):
        ae.calibrate(lambda text, n: [], [], by_name.get, reader, META)
    # the cross-fit covers the lines and never scores above the whole set's best setting
    cf = doc["crossfit"]
    assert len(cf["splits"]) == ae.CROSSFIT_SPLITS and cf["slb_top1"] == pytest.approx(12 / 20)
    assert all(sum(s["n"]) == len(lines) for s in cf["splits"])
    assert 12 / 20 <= cf["top1"] <= doc["best_if_kept"]["top1"] + 1e-12


def test_crossfit_scores_each_half_at_the_setting_chosen_on_the_other():
    texts = [f"request {i}" for i in range(60)]
    half = ae.halves(texts, 0)
    assert 0 < half.sum() < len(texts)
    base = np.zeros(len(texts), bool)
    # one setting fixes every line of half 0 and none of half 1 (what a choice overfit to half 0 looks like);
    # another fixes every other line of both halves
    overfit = half == 0
    general = np.arange(len(texts)) % 2 == 0
    rights = [({"feature": "req_min", "alpha": 0.1, "tau": 0.2, "q": 0.1}, overfit),
              ({"feature": "stated", "alpha": 0.05, "tau": 0.3, "q": 0.2}, general)]
    cf = ae._crossfit(rights, base, texts, splits=1)["splits"][0]
    assert cf["n"] == [int((half == 0).sum()), int((half == 1).sum())]
    # half 0 chooses the overfit setting, which fixes nothing on half 1; half 1 chooses the general one, which
    # fixes half 0's even lines
    assert [c["feature"] for c in cf["choices"]] == ["req_min", "stated"]
    assert cf["top1"] == pytest.approx((general & (half == 0)).sum() / len(texts))
    # a setting that fixes one line of half 0: half 0 keeps it, half 1 (nothing to gain) chooses no stage
    one = np.zeros(len(texts), bool)
    one[np.flatnonzero(half == 0)[0]] = True
    few = ae._crossfit([({"feature": "stated", "alpha": 0.05, "tau": 0.3, "q": 0.2}, one)], base, texts,
                       splits=1)["splits"][0]
    assert 1 / (half == 0).sum() >= ae.MIN_GAIN  # one line is a gain on half 0
    assert [c["feature"] for c in few["choices"]] == ["stated", "none"]
    assert few["top1"] == 0.0  # the one fixed line is on half 0, scored at half 1's choice: none
    # all lines on one side: no cross-fit, the SLB's figure
    same = ae._crossfit(rights, base, ["x"] * 5, splits=3)
    assert all(s["choices"] == [] and sorted(s["n"]) == [0, 5] for s in same["splits"]) and same["top1"] == 0.0
    # several halvings: each its own, the figure their mean
    many = ae._crossfit(rights, base, texts, splits=4)
    assert len(many["splits"]) == 4 and many["slb_top1"] == 0.0
    assert many["splits"][0] == cf and len({tuple(s["n"]) for s in many["splits"]}) > 1
    assert many["top1"] == pytest.approx(np.mean([s["top1"] for s in many["splits"]]))


def test_from_gate_loads_only_a_choice_made_for_this_reader_and_slb(reader, caplog):
    section = {"version": ae.ARG_EVIDENCE_VERSION, "reader": ae.reader_key(reader), "slb": ae.slb_key(META),
               "feature": "req_min", "alpha": 0.05, "tau": 0.1, "top_k": 3, "distinct": True}
    got = ae.from_gate({**META, "arg_evidence": section}, reader)
    assert (got.feature, got.alpha, got.tau, got.top_k, got.distinct) == ("req_min", 0.05, 0.1, 3, True)
    assert got.clip == ae.CLIP  # a section written before the clip was recorded reads with the old constant
    assert got.enum_words is False  # ... and before enum words, without them
    assert ae.from_gate({**META, "arg_evidence": {**section, "enum_words": True}}, reader).enum_words is True
    assert ae.from_gate({**META, "arg_evidence": {**section, "enum_words": "yes"}}, reader).enum_words is False
    assert ae.from_gate({**META, "arg_evidence": {**section, "clip": 2.0}}, reader).clip == 2.0
    assert ae.is_current({**META, "arg_evidence": section}, reader)
    # a choice made reading every parameter is not the product's: calibrated again
    assert not ae.is_current({**META, "arg_evidence": {**section, "distinct": False}}, reader)
    assert ae.from_gate({**META, "arg_evidence": {**section, "distinct": False}}, reader).distinct is False
    assert ae.from_gate(META, reader) is None and ae.from_gate({**META, "arg_evidence": section}, None) is None
    caplog.set_level(logging.WARNING, logger="nexus.router.argevidence")
    recalibrated = {**META, "slb": {**META["slb"], "tool_bias": {}}, "arg_evidence": section}
    assert ae.from_gate(recalibrated, reader) is None and not ae.is_current(recalibrated, reader)
    other_reader = {**section, "reader": {**section["reader"], "threshold": 9.0}}
    assert ae.from_gate({**META, "arg_evidence": other_reader}, reader) is None
    assert ae.from_gate({**META, "arg_evidence": {**section, "version": "arg-evidence-v0"}}, reader) is None
    assert sum("train-gate --slots" in r.message for r in caplog.records) == 3
    assert ae.from_gate({**META, "arg_evidence": {**section, "alpha": float("nan")}}, reader) is None
    assert ae.from_gate({**META, "arg_evidence": {**section, "feature": "vibes"}}, reader) is None
    no_alpha = {k: v for k, v in section.items() if k != "alpha"}
    assert ae.from_gate({**META, "arg_evidence": no_alpha}, reader) is None  # logged, the router still routes
    assert ae.from_gate({**META, "arg_evidence": {**section, "top_k": 1}}, reader) is None
    assert ae.from_gate({**META, "arg_evidence": {**section, "clip": 0}}, reader) is None
    assert ae.from_gate({**META, "arg_evidence": {**section, "clip": "wide"}}, reader) is None


def test_write_replaces_only_the_section(tmp_path):
    (tmp_path / "gate.json").write_text(json.dumps({"tau": 0.1, "arg_evidence": {"feature": "old"}}))
    ae.write(tmp_path, {"feature": "req_min"})
    assert json.loads((tmp_path / "gate.json").read_text()) == {"tau": 0.1, "arg_evidence": {"feature": "req_min"}}
    assert [p.name for p in tmp_path.iterdir()] == ["gate.json"]


def _gate_copy(tmp_path, reader, section):
    """var/models/gate with its gate.json holding ``section`` as arg_evidence (the models are linked, not copied)."""
    from pathlib import Path

    src = Path(GATE)
    if not (src / "gate.json").is_file():
        pytest.fail(f"no gate model at {GATE}: run `make setup` (it trains and links it)")
    dst = tmp_path / "gate"
    dst.mkdir(parents=True)
    for p in src.resolve().iterdir():
        if p.name != "gate.json":
            (dst / p.name).symlink_to(p)
    meta = json.loads((src / "gate.json").read_text())
    meta["arg_evidence"] = {"version": ae.ARG_EVIDENCE_VERSION, "reader": ae.reader_key(reader),
                            "slb": ae.slb_key(meta), **section}
    (dst / "gate.json").write_text(json.dumps(meta))
    return dst


def _router(tmp_path, gate_dir, slots, tools, on=True):
    import asyncio

    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.router.config import RouterConfig
    from services.router.router import Router

    store = LocalStore(str(tmp_path / "store"))
    store.registry_put(list(tools))
    router = Router(RouterConfig(store_url=str(tmp_path / "store"), gate_model_dir=str(gate_dir),
                                 arg_evidence=on, slots_model_dir=slots, late_reader_dir="", torch_threads=1), store,
                    Embedder(""))
    asyncio.run(router.sync(force=True))
    return router


def test_the_router_escalates_near_ties_to_the_argument_evidence(tmp_path, reader, all_tools):
    k8s = [t for t in all_tools if t.name.startswith(("pods_", "namespaces_", "resources_"))]
    # tau above any margin: every request escalates; a large alpha lets the evidence decide the top 4
    gate_dir = _gate_copy(tmp_path, reader, {"feature": "req_min", "alpha": 10.0, "tau": 1e9, "top_k": 4})
    router = _router(tmp_path, gate_dir, SLOTS, k8s)
    assert router.arg_evidence is not None and router.escalation_enabled
    d = router.decide("pods in kube-system please", 3)
    assert d.gate == "escalated" and d.escalated
    top4 = [n for n, _ in d.slb_candidates[:4]]
    assert {n for n, _ in d.candidates} <= set(top4) | {n for n, _ in d.slb_candidates[4:]}
    tools = {t.name: t for t in k8s}
    feats = router.arg_evidence.features("pods in kube-system please", [tools[n] for n in top4])
    slb4 = np.array([s for _, s in d.slb_candidates[:4]])
    want = top4[int(ae.rerank(slb4, feats, 10.0)[0])]
    assert d.tool == want and d.score == pytest.approx(slb4[top4.index(want)] + 10.0 * feats[top4.index(want)])
    scores = [s for _, s in d.candidates]  # the top 3 of the re-ranked 4, fused scores, best first
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    # the same model with the stage off, without a reader, or with the stage calibrated for another SLB:
    # no escalation
    off = _router(tmp_path / "c", gate_dir, SLOTS, k8s, on=False)
    assert off.arg_evidence is None and off.decide("pods in kube-system please", 3).gate == "auto"
    assert _router(tmp_path / "a", gate_dir, "", k8s).arg_evidence is None
    stale = _gate_copy(tmp_path / "b", reader, {"feature": "req_min", "alpha": 10.0, "tau": 1e9})
    doc = json.loads((stale / "gate.json").read_text())
    doc["arg_evidence"]["slb"]["tool_bias"] = "another"
    (stale / "gate.json").write_text(json.dumps(doc))
    r = _router(tmp_path / "b", stale, SLOTS, k8s)
    assert r.arg_evidence is None and r.decide("pods in kube-system please", 3).gate == "auto"


def test_calibrating_a_real_gate_model_writes_a_current_section_once(tmp_path, reader, tools_dir):
    """``routing_models.calibrate_arg_evidence`` on a copy of the production gate model: a real router ranks the
    model's validation lines + 40 calibration lines, the section lands in gate.json, a second call keeps it."""
    from services.evals.routing_models import calibrate_arg_evidence, load_augment
    from services.training.data import load_queries, load_registry
    from tests.conftest import QUERIES, REPO

    gate_dir = _gate_copy(tmp_path, reader, {"feature": "none"})
    meta = json.loads((gate_dir / "gate.json").read_text())
    del meta["arg_evidence"]
    (gate_dir / "gate.json").write_text(json.dumps(meta))
    calibration = load_augment(REPO / "data" / "routing_calibration")[::33][:40]
    registry = load_registry(tools_dir)
    section = calibrate_arg_evidence(gate_dir, load_queries(QUERIES), registry, calibration, SLOTS)
    doc = json.loads((gate_dir / "gate.json").read_text())
    assert doc["arg_evidence"] == section and ae.is_current(doc, reader)
    assert section["n_choose"] == len(meta["val_ids"]) + len(calibration)
    assert section["feature"] in (*ae.FEATURES, "none") and section["choose_top1"] >= section["choose_top1_slb"]
    assert {k: doc[k] for k in meta} == meta  # nothing else in gate.json changed
    cf = section["crossfit"]  # each half of the lines scored at the other half's choice
    assert all(sum(s["n"]) == section["n_choose"] and min(s["n"]) > 0 and len(s["choices"]) == 2
               for s in cf["splits"])
    assert cf["slb_top1"] == pytest.approx(section["choose_top1_slb"])
    assert cf["top1"] <= section["best_if_kept"]["top1"] + 1e-12  # never above the whole set's best setting
    before = (gate_dir / "gate.json").stat().st_mtime_ns
    assert calibrate_arg_evidence(gate_dir, load_queries(QUERIES), registry, calibration, SLOTS) == section
    assert (gate_dir / "gate.json").stat().st_mtime_ns == before  # current: kept, not rewritten
    # another reader (a bench's), asked without writing: it reads the escalated lines itself, gate.json stays as is
    calls = []

    class Spy:
        threshold, meta, tokenizer, max_len = reader.threshold, reader.meta, reader.tokenizer, reader.max_len

        def score(self, questions, context, k=1):
            calls.append(context)
            return reader.score(questions, context, k)

    asked = calibrate_arg_evidence(gate_dir, load_queries(QUERIES), registry, calibration, "", force=True,
                                   reader=Spy(), write=False)
    assert calls and {k: asked[k] for k in ("feature", "alpha", "tau", "choose_top1")} == {
        k: section[k] for k in ("feature", "alpha", "tau", "choose_top1")}
    assert (gate_dir / "gate.json").stat().st_mtime_ns == before
    with pytest.raises(FileNotFoundError, match="no slot reader"):
        calibrate_arg_evidence(gate_dir, [], registry, calibration, str(tmp_path / "none"))
    with pytest.raises(ValueError, match="validation ids"):
        calibrate_arg_evidence(gate_dir, load_queries(QUERIES)[:5], registry, calibration, SLOTS, force=True)
