"""`nexus eval routing`'s second stage: each fold model routes through a real router with that model's late reader
(here the production gate model and late reader stand in for the fold models and their readers: the mechanics, not
held-out figures, which are `make eval`'s)."""

import json

import pytest

from tests.conftest import REPO


def test_each_fold_routes_with_its_own_late_reader_and_the_report_says_what_it_changed(tmp_path, monkeypatch):
    from services.evals import routing
    from services.training import late_reader as late_training

    gate, late = REPO / "var" / "models" / "gate", REPO / "var" / "models" / "late_reader"
    lines = [json.loads(x) for x in (REPO / "data" / "queries" / "train.jsonl").read_text().splitlines()[:24]]
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps(x) + "\n" for x in lines))
    asked = []

    def fold_models(lines, folds, k, *a, **kw):
        return [gate] * k

    def fold_late_reader(gate_dir, registry, train, augment, calibration, root, progress=True):
        asked.append({ln.id for ln in train})
        return late, {"feature": json.loads((late / "late_reader.json").read_text())["arg_evidence"]["feature"]}

    monkeypatch.setattr(routing, "fold_models", fold_models)
    monkeypatch.setattr(late_training, "fold_late_reader", fold_late_reader)
    from services.evals.routing import evaluate

    earlier = tmp_path / "earlier.json"  # a run whose held-out server's routing this one reuses
    server = lines[0]["server"]
    earlier.write_text(json.dumps({"protocol": {"seed": 0, "sizes": ["10", "all"], "draws": 1, "n_lines": 24},
                                   "generalization": {"server": server, "n": 5, "sizes": {"10": {"accuracy": 0.5}},
                                                      "same_lines_k_fold": "the earlier run's"}}))
    rep = evaluate(str(queries), str(REPO / "data" / "mcp_tools"), "10,all", str(tmp_path / "r.json"),
                   holdout_server="", skip_concat=True, progress=False, augment="", calibration="",
                   late_reader=True, generalization_from=str(earlier))
    gen = rep["generalization"]
    assert gen["reused_from"] == str(earlier) and gen["sizes"] == {"10": {"accuracy": 0.5}}
    assert gen["same_lines_k_fold"]["10"]["n"] == sum(x["server"] == server for x in lines)  # this run's figures
    with pytest.raises(ValueError, match="protocol"):
        evaluate(str(queries), str(REPO / "data" / "mcp_tools"), "10", str(tmp_path / "g.json"),
                 holdout_server="", skip_concat=True, progress=False, augment="", calibration="",
                 late_reader=True, generalization_from=str(earlier))
    assert rep["protocol"]["second_stage"] == "late reader per fold"
    folds = rep["folds"]
    assert [f["arg_evidence_active"] for f in folds] == [True] * 3 and all(f["late_reader"] for f in folds)
    ids = {x["id"] for x in lines}
    held = [ids - seen for seen in asked]  # each fold's reader never saw the lines that fold routes
    assert len(asked) == 3 and all(h and not (h & seen) for h, seen in zip(held, asked, strict=True))
    for s in ("10", "all"):
        r = rep["sizes"][s]
        assert r["n"] == 24 and 0 <= r["escalation_rate"] <= 1
        flips = r["second_stage_fixed"] - r["second_stage_broken"]
        assert r["accuracy"] * 24 == pytest.approx(r["slb_top1"] * 24 + flips)
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="one of them"):
        evaluate(str(queries), str(REPO / "data" / "mcp_tools"), "10", str(tmp_path / "s.json"),
                 holdout_server="", skip_concat=True, progress=False, augment="", calibration="",
                 late_reader=True, slots=str(REPO / "var" / "models" / "slots"))


def test_the_benches_stage_arms_route_as_each_stage_alone_and_leave_the_routers_own(tmp_path):
    """``route_stage_arms`` (bench/routing_escalation.py's and routing_late_seeds.py's arms, interleaved line by line):
    each arm's picks are what the router gives with that stage alone, a stage that never escalates escalates
    nothing, and the router keeps its own stage afterwards."""
    import dataclasses

    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.evals.routing import _open_router, load_protocol, route_lines, route_stage_arms

    proto = load_protocol(str(REPO / "data" / "queries" / "train.jsonl"), str(REPO / "data" / "mcp_tools"),
                          "10,all", draws=2)
    store = LocalStore(str(tmp_path))
    store.registry_put(list(proto.registry.tools))
    router = _open_router(store, Embedder(""), REPO / "var" / "models" / "gate",
                          late_reader=REPO / "var" / "models" / "late_reader", precision="int8")
    own = router.arg_evidence
    assert own is not None and own.tau > 0
    stages = {"off": dataclasses.replace(own, tau=0.0), "on": own, "wide": dataclasses.replace(own, tau=own.tau * 50)}
    idxs = list(range(0, 400, 10))
    hits, esc, picks = {}, {}, {}
    route_stage_arms(router, proto, idxs, stages, hits, esc, picks=picks)
    assert router.arg_evidence is own
    regs = {(s, d): r[s] for d, r in enumerate(proto.draw_regs) for s in proto.sizes}
    for arm, stage in stages.items():
        router.arg_evidence = stage
        alone = route_lines(router, proto.lines, regs, idxs)
        assert {f"{r['id']}#{d}": r["correct"] for (s, d), recs in alone.items() if s == "all" for r in recs} \
            == hits[arm]["all"]
        assert {f"{r['id']}#{d}": r["pred"] for (s, d), recs in alone.items() if s == "all" for r in recs} \
            == picks[arm]["all"]
        assert [r["escalated"] for (s, d), recs in alone.items() if s == "10" for r in recs] != [] \
            and len(esc[arm]["10"]) == 2 * len(idxs)
    router.arg_evidence = own
    # how many of these 80 line-draws the production stage escalates is the trained model's (0 with this
    # session's reader, tau 0.18); a 50x wider tau escalates more
    assert not any(esc["off"]["all"]) and sum(esc["wide"]["all"]) > sum(esc["on"]["all"]) >= 0


def test_held_out_benches_build_each_folds_reader_per_seed_from_its_own_lines(monkeypatch):
    """``held_out_late_readers`` (bench/routing_escalation.py --late-seed, routing_late_seeds.py): one reader per fold
    model and seed, each from the lines its fold does not route, with the bench's augment and calibration lines."""
    from types import SimpleNamespace

    from services.evals.routing import held_out_late_readers, load_protocol
    from services.training import late_reader as late_training

    proto = load_protocol(str(REPO / "data" / "queries" / "train.jsonl"), str(REPO / "data" / "mcp_tools"), "10")
    asked = []

    def fold_late_reader(gate, registry, train, augment, calibration, root, progress=True, seed=0):
        asked.append((gate, {ln.id for ln in train}, len(augment), len(calibration), root, seed))
        return f"{gate}/{seed}", {"seed": seed}

    monkeypatch.setattr(late_training, "fold_late_reader", fold_late_reader)
    a = SimpleNamespace(augment=str(REPO / "data" / "routing_augment"), models_root="mr",
                        calibration=str(REPO / "data" / "routing_calibration"))
    got = held_out_late_readers(a, proto, {0: "g0", 2: "g2"}, seeds=[0, 3], progress=False)
    assert got == {0: {0: ("g0/0", {"seed": 0}), 3: ("g0/3", {"seed": 3})},
                   2: {0: ("g2/0", {"seed": 0}), 3: ("g2/3", {"seed": 3})}}
    for gate, train, n_aug, n_cal, root, _ in asked:
        f = int(gate[1])
        held = {proto.lines[i].id for i in proto.split(f)[1]}
        assert train and not (train & held) and len(train) + len(held) == len(proto.lines)
        assert n_aug > 0 and n_cal > 0 and root == "mr"
