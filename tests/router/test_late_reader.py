"""The late reader as the stage's reader (services/router/late_reader.py): a saved directory loads for the real gate
model and reads the router's own pass, what it cannot trust is refused with the reason, and a real router escalates
through it. The head here is untrained (seeded): these tests check the mechanics; its reading quality is
`nexus eval routing`'s (each fold model with its own late reader; make eval)."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from services.router import argevidence as ae
from services.router import late_reader as lr

GATE = Path("var/models/gate")
TEXT = "list the pods in the kube-system namespace"


def write_late_reader(out: Path, gate_dir: Path = GATE, section: dict | None = None, seed: int = 0) -> Path:
    """An untrained head saved as a late-reader directory for the gate model at ``gate_dir``, carrying ``section``
    (feature, alpha, tau, ...) as its stage calibration, made current for it (version, reader and SLB keys)."""
    import torch
    from sentence_transformers import SentenceTransformer

    if not (gate_dir / "gate.json").is_file():
        pytest.fail(f"no gate model at {gate_dir}: run `make setup` (it trains and links it)")
    meta = json.loads((gate_dir / "gate.json").read_text())
    st = SentenceTransformer(str(gate_dir / "query_encoder"), device="cpu")
    torch.manual_seed(seed)
    head = lr.build_head().eval()
    rec = {"data_hash": f"test-head-{seed}"}
    full = None
    if section is not None:
        key = {"data_hash": rec["data_hash"], "threshold": 0.0, "format": lr.FORMAT}
        full = {"version": ae.ARG_EVIDENCE_VERSION, "reader": key, "slb": ae.slb_key(meta), "distinct": True,
                **section}
    return lr.save(out, head, st[0].auto_model.eval(), st.tokenizer, 0.0, rec, meta, arg_evidence=full)


@pytest.fixture(scope="module")
def gate():
    from services.router.gate import GateModel

    if not GateModel.exists(GATE):
        pytest.fail(f"no gate model at {GATE}: run `make setup` (it trains and links it)")
    return GateModel(GATE, threads=1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return write_late_reader(tmp_path_factory.mktemp("late") / "late_reader",
                             section={"feature": "req_min", "alpha": 10.0, "tau": 1e9, "top_k": 4})


def test_a_saved_reader_reads_the_routers_own_pass(saved, gate):
    import torch

    reader = lr.load(saved, gate)
    assert reader is not None and reader.meta["format"] == lr.FORMAT and reader.threshold == 0.0
    assert ae.reader_key(reader) == reader.meta["arg_evidence"]["reader"]
    vec, states = reader.encoder.embed_with_states(TEXT)
    assert float(vec @ gate.embed_query(TEXT)) > 0.9999  # the vector the SLB scans with is the gate model's
    tokenizer, transformer, _ = gate._single
    ref = lr.encode_states(transformer, tokenizer, [TEXT])[TEXT][0]
    assert states.shape == ref.shape == (lr.LAYERS, len(tokenizer(TEXT)["input_ids"]), lr.HIDDEN)
    assert torch.allclose(lr.as_states(states), ref.float(), atol=2e-2)  # the training path's, float16-rounded
    questions = ["What is the namespace?", "What is the pod name?", "What is the label selector?"]
    given = reader.score(questions, TEXT, states=states)
    assert given == reader.score(questions, TEXT)  # the router's states or its own pass: the same reading
    assert len(given) == 3 and all(len(r) == 1 and np.isfinite(r[0][2]) for r in given)
    assert len(reader._q) == 3 and reader.score(questions[:1], TEXT) == given[:1] and len(reader._q) == 3
    # the benches' torch path over the same head reads the same scores
    torch_reader = lr.LateReader(reader.head, lambda ts: [lr.encode_states(transformer, tokenizer, ts)[t][0]
                                                          for t in ts], tokenizer, 0.0, {})
    assert np.allclose([r[0][2] for r in torch_reader.score(questions, TEXT)], [r[0][2] for r in given], atol=0.05)
    for i in range(70):  # the request cache is bounded (cache_size 64)
        reader.score(questions[:1], f"request {i}")
    assert len(reader._c) == 64 and reader.score([], TEXT) == []


def test_load_refuses_what_it_cannot_trust(saved, gate, tmp_path, caplog):
    import shutil

    from sentence_transformers import SentenceTransformer

    from services.common.models import resolve_embedder

    # a missing reader is a warning (the router's default path before `make setup` trains it), the rest errors
    caplog.set_level(logging.WARNING, logger="nexus.router.late_reader")

    def copy(name):
        dst = tmp_path / name
        shutil.copytree(saved, dst)
        return dst

    assert lr.load(tmp_path / "nowhere", gate) is None
    fmt = copy("format")
    doc = json.loads((fmt / lr.META_FILE).read_text())
    (fmt / lr.META_FILE).write_text(json.dumps({**doc, "format": "nexus-late-reader-v0"}))
    other = copy("other-gate")
    (other / lr.META_FILE).write_text(json.dumps({**doc, "gate": {**doc["gate"], "data_hash": "another model"}}))
    corrupt = copy("corrupt")
    (corrupt / lr.HEAD_FILE).write_bytes(b"not a state dict")
    foreign = copy("foreign-graph")  # the base MiniLM's states: not the encoder the gate model routes with
    st = SentenceTransformer(str(resolve_embedder("")), device="cpu")
    lr.export_states_graph(st[0].auto_model.eval(), st.tokenizer, foreign / lr.GRAPH_FILE)
    for d, want in ((fmt, "nexus-late-reader-v0"), (other, "another model"), (corrupt, "unusable"),
                    (foreign, "probe cosine")):
        n = len(caplog.records)
        assert lr.load(d, gate) is None
        assert len(caplog.records) == n + 1 and str(d) in caplog.records[-1].getMessage()
        assert want in caplog.records[-1].getMessage(), caplog.records[-1].getMessage()
    said = [r.getMessage() for r in caplog.records]
    assert "no late reader at" in said[0] and "make setup" in said[0] and caplog.records[0].levelname == "WARNING"
    assert all(r.levelname == "ERROR" for r in caplog.records[1:])
    assert all("the argument-evidence stage is off" in m for m in said)


def _router(tmp_path, late_dir, tools, on=True, precision="fp32"):
    import asyncio

    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.router.config import RouterConfig
    from services.router.router import Router

    store = LocalStore(str(tmp_path / "store"))
    store.registry_put(list(tools))
    router = Router(RouterConfig(store_url=str(tmp_path / "store"), gate_model_dir=str(GATE), arg_evidence=on,
                                 late_reader_dir=str(late_dir), torch_threads=1, query_encoder_precision=precision),
                    store, Embedder(""))
    asyncio.run(router.sync(force=True))
    return router


def test_the_router_escalates_through_the_late_reader(saved, tmp_path, all_tools, caplog):
    k8s = [t for t in all_tools if t.name.startswith(("pods_", "namespaces_", "resources_"))]
    caplog.set_level(logging.INFO, logger="nexus.router")
    router = _router(tmp_path / "on", saved, k8s)
    stage = router.arg_evidence
    assert stage is not None and isinstance(stage.reader, lr.LateReader) and stage.distinct
    # the registry's questions were read at load: an escalation only reads the request
    assert set(stage.reader._q) == {*ae.questions_of(k8s), "warm up"} and "argument-evidence questions cached" in caplog.text
    d = router.decide(TEXT, 3)
    assert d.gate == "escalated" and d.escalated  # tau above any margin: every request escalates
    off = _router(tmp_path / "off", saved, k8s, on=False)
    assert off.arg_evidence is None and off.decide(TEXT, 3).gate == "auto"
    # the late path's SLB: the same candidates as the router's own graph gives, to float noise
    want = off.decide(TEXT, 8).slb_candidates[:4]
    assert [n for n, _ in d.slb_candidates[:4]] == [n for n, _ in want]
    assert np.allclose([s for _, s in d.slb_candidates[:4]], [s for _, s in want], atol=1e-4)
    tools = {t.name: t for t in k8s}
    top4 = [n for n, _ in d.slb_candidates[:4]]
    feats = stage.features(TEXT, [tools[n] for n in top4])  # the reader's own pass over the request
    slb4 = np.array([s for _, s in d.slb_candidates[:4]])
    best = int(ae.rerank(slb4, feats, 10.0)[0])
    assert d.tool == top4[best] and d.score == pytest.approx(slb4[best] + 10.0 * feats[best], abs=1e-3)
    # no calibration in the directory, or one made for another SLB calibration: the stage stays off, logged
    bare = write_late_reader(tmp_path / "bare")
    assert _router(tmp_path / "bare-r", bare, k8s).arg_evidence is None
    assert any("carries no argument-evidence calibration" in r.getMessage() for r in caplog.records)
    stale = write_late_reader(tmp_path / "stale", section={"feature": "req_min", "alpha": 10.0, "tau": 1e9})
    doc = json.loads((stale / lr.META_FILE).read_text())
    doc["arg_evidence"]["slb"]["tool_bias"] = "another"
    (stale / lr.META_FILE).write_text(json.dumps(doc))
    r = _router(tmp_path / "stale-r", stale, k8s)
    assert r.arg_evidence is None and r.decide(TEXT, 3).gate == "auto"
    assert _router(tmp_path / "none-r", tmp_path / "nowhere", k8s).arg_evidence is None


def test_an_int8_router_reads_the_late_readers_int8_graph(saved, tmp_path, all_tools, caplog):
    """At query_encoder_precision=int8 (the default) the reader's INT8 graph embeds the request and gives its states;
    a directory without one embeds with the fp32 graph, logged; an fp32 router keeps the fp32 graph."""
    import shutil

    import torch

    from services.router.gate import exemplar_texts

    k8s = [t for t in all_tools if t.name.startswith(("pods_", "namespaces_", "resources_"))]
    caplog.set_level(logging.INFO, logger="nexus.router")
    fp32 = _router(tmp_path / "fp32", saved, k8s, precision="fp32")
    quant = tmp_path / "quantized"
    shutil.copytree(saved, quant)
    lr.add_int8(quant, GATE, texts=exemplar_texts(GATE)[::40])  # a sample of the requests, for the test's time
    assert (quant / lr.INT8_GRAPH_FILE).is_file()
    r8 = _router(tmp_path / "int8", quant, k8s, precision="int8")
    assert r8.gate.onnx.precision == "int8"
    enc = r8.arg_evidence.reader.encoder
    assert enc.precision == "int8" and enc.path.name == lr.INT8_GRAPH_FILE
    vec8, states8 = enc.embed_with_states(TEXT)
    vec32, states32 = fp32.arg_evidence.reader.encoder.embed_with_states(TEXT)
    assert 0.97 < float(vec8 @ vec32) < 1.0  # quantized: close to the fp32 vector, not equal to it
    assert states8.shape == states32.shape
    cos = torch.nn.functional.cosine_similarity(torch.from_numpy(states8), torch.from_numpy(states32), dim=-1)
    assert float(cos.mean()) > 0.95  # every layer's token states stay where the head reads them
    d8, d32 = r8.decide(TEXT, 4), fp32.decide(TEXT, 4)
    assert d8.tool == d32.tool and d8.gate == d32.gate == "escalated"  # tau 1e9: every request escalates
    # an fp32 router beside an INT8 graph still reads the fp32 one; a directory without one reads its fp32 graph at
    # int8 too, and says how to add it
    assert lr.load(quant, fp32.gate, precision="fp32").encoder.precision == "fp32"
    caplog.clear()
    assert lr.load(saved, r8.gate, precision="int8").encoder.precision == "fp32"
    assert any(lr.INT8_GRAPH_FILE in r.getMessage() and "add_int8" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def test_add_int8_refuses_a_gate_model_the_reader_does_not_read(saved, tmp_path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(saved, other)
    doc = json.loads((other / lr.META_FILE).read_text())
    (other / lr.META_FILE).write_text(json.dumps({**doc, "gate": {**doc["gate"], "data_hash": "another model"}}))
    with pytest.raises(ValueError, match="reads gate model"):
        lr.add_int8(other, GATE)
    assert not (other / lr.INT8_GRAPH_FILE).exists()


def test_set_arg_evidence_replaces_only_the_calibration(saved, tmp_path):
    import shutil

    d = tmp_path / "recalibrated"
    shutil.copytree(saved, d)
    before = json.loads((d / lr.META_FILE).read_text())
    section = {**before["arg_evidence"], "alpha": 0.5, "tau": 0.25}
    lr.set_arg_evidence(d, section)
    after = json.loads((d / lr.META_FILE).read_text())
    assert after["arg_evidence"] == section
    assert {k: v for k, v in after.items() if k != "arg_evidence"} == {
        k: v for k, v in before.items() if k != "arg_evidence"}
    assert not list(d.glob(".*.tmp"))  # written atomically, nothing left behind
