"""The router's single-request query encoder on onnxruntime: the torch vector (cosine >= 0.9999) for a real
export of the base all-MiniLM-L6-v2 encoder, thread-safe, and the torch path (logged) whenever the export is
missing, unreadable, stale, or onnxruntime is absent; training's hook exports into a cached model. Its INT8
graph (opted into with precision="int8"): written beside the export from a smoothed copy of the encoder calibrated
on the model's exemplar requests (exact at fp32, nearer the torch vectors than the plain quantization), close to the
torch vector but not it, the fp32 graph (logged) when it is missing, torch when it is foreign; training's cached
path re-quantizes a graph that is not smoothed."""

import json
import logging
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from services.common.models import default_embedder_path
from services.router import onnx_encoder
from services.router.gate import GATE_FORMAT, GateModel, exemplar_texts, export_query_onnx
from services.router.onnx_encoder import INT8_METHOD, INT8_PLAIN, MIN_COSINE_INT8, int8_method, onnx_path
from training import gate as training

LONG = " ".join(["schedule a meeting with the design team tomorrow at 3pm in the big room"] * 30)
REQUESTS = [
    "what time is it in Tokyo?",
    "get config:max_upload_mb",
    "",
    LONG,  # ~450 tokens: truncated to the encoder's max length
    "convert 3pm New York time to London time\n[context] user: hi\n[context] assistant: hello",
    "東京の天気を教えて 🌧️ — réunion à 15 h, naïve café, Ünïcödé",
]


def _requests(start: int, n: int) -> list[str]:
    from tests.conftest import QUERIES

    return [json.loads(x)["query"] for x in QUERIES.read_text().splitlines()[start : start + n]]


def _gate_dir(root, onnx: bool):
    """A gate model dir around the base encoder (no training: the export is what is under test), with 150 real
    requests as its exemplars (the INT8 graph's calibration)."""
    root.mkdir()
    shutil.copytree(default_embedder_path(), root / "query_encoder")
    (root / "cross_encoder").symlink_to(default_embedder_path(), target_is_directory=True)
    (root / "gate.json").write_text(json.dumps({"format": GATE_FORMAT, "tau": 0.0, "alpha": 0.0, "ce_top_k": 3}))
    (root / "exemplars.jsonl").write_text("".join(json.dumps({"id": f"e{i}", "tool": "x", "text": t}) + "\n"
                                                  for i, t in enumerate(_requests(0, 300)[::2])))
    if onnx:
        assert export_query_onnx(root / "query_encoder") == onnx_path(root / "query_encoder")
    return root


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory):
    return _gate_dir(tmp_path_factory.mktemp("onnx") / "gate", onnx=True)


@pytest.fixture(scope="module")
def gate(gate_dir):
    return GateModel(gate_dir, threads=2)


def _variant(gate_dir, tmp_path):
    """A copy of the exported model whose ONNX file a test may replace or remove."""
    dst = tmp_path / "gate"
    shutil.copytree(gate_dir, dst, symlinks=True)
    return dst


def test_onnx_vectors_are_the_torch_vectors(gate):
    assert gate.onnx is not None
    assert len(gate.query_encoder.tokenizer(LONG)["input_ids"]) > gate.query_encoder.max_seq_length
    for text in REQUESTS:
        a, b = gate.embed_query(text), gate.embed_query_torch(text)
        assert a.dtype == np.float32 and a.shape == b.shape == (384,)
        assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
        assert float(a @ b) >= 0.9999, text


def test_concurrent_requests_get_their_own_vectors(gate):
    texts = [f"{t} #{i}" for i in range(4) for t in REQUESTS]
    want = [gate.embed_query(t) for t in texts]
    with ThreadPoolExecutor(6) as pool:  # both paths at once: they share the tokenizer
        got = list(pool.map(gate.embed_query, texts))
        ref = list(pool.map(gate.embed_query_torch, texts))
    for w, g, r in zip(want, got, ref, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-6)
        assert float(g @ r) >= 0.9999


def test_int8_graph_is_close_to_the_torch_vectors_but_not_them(gate_dir):
    g = GateModel(gate_dir, threads=1, precision="int8")
    assert g.onnx is not None and g.onnx.precision == "int8"
    assert g.onnx.path == onnx_path(gate_dir / "query_encoder", "int8")
    assert g.onnx.path.stat().st_size < onnx_path(gate_dir / "query_encoder").stat().st_size / 3  # int8 weights
    cos = []
    for text in REQUESTS:
        v = g.embed_query(text)
        assert v.dtype == np.float32 and np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)
        cos.append(float(v @ g.embed_query_torch(text)))
    assert min(cos) >= MIN_COSINE_INT8, cos
    assert min(cos) < 0.9999, cos  # quantized: not the fp32 graph under another name


def test_smoothing_is_exact_at_fp32():
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(default_embedder_path()), device="cpu")
    tok, model = st.tokenizer, st[0].auto_model
    ranges = onnx_encoder.activation_ranges(model, tok, _requests(0, 40), 128)
    groups = ranges.pop(onnx_encoder.SHARED)
    assert len(ranges) >= 36 and all(r.shape[0] in (384, 1536) for r in ranges.values())  # every Linear's input
    assert len(groups) == 6 and all(sorted(n.rsplit(".", 1)[1] for n in g) == ["key", "query", "value"] for g in groups)
    ranges[onnx_encoder.SHARED] = groups
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    smooth = onnx_encoder.smoothed(model, ranges)
    feats = tok(REQUESTS, return_tensors="pt", padding=True, truncation=True, max_length=128)
    with torch.no_grad():
        a, b = model(**feats).last_hidden_state, smooth(**feats).last_hidden_state
    assert float((a - b).abs().max()) < 1e-3 * float(a.abs().max())  # float rounding only
    m = feats["attention_mask"].unsqueeze(-1)
    va, vb = (torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1) for h in (a, b))
    assert float((va * vb).sum(-1).min()) > 0.999999
    changed = [n for n, p in smooth.named_parameters() if n.endswith("linear.weight")]
    assert len(changed) == len(ranges) - 1  # each Linear wrapped, its weights scaled ...
    q, k = (smooth.get_submodule(f"encoder.layer.0.attention.self.{n}") for n in ("query", "key"))
    assert torch.equal(q.inv_s, k.inv_s)  # one smoothing per activation
    after = dict(smooth.named_parameters())
    assert not any(torch.equal(before[n.replace("linear.", "")], after[n]) for n in changed)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # ... in a copy only


def test_int8_graph_is_smoothed_on_the_exemplars_and_nearer_the_torch_vectors(gate_dir, tmp_path, caplog):
    assert exemplar_texts(gate_dir) == _requests(0, 300)[::2]
    assert int8_method(gate_dir / "query_encoder") == INT8_METHOD
    plain = _variant(gate_dir, tmp_path)
    (plain / "exemplars.jsonl").unlink()
    with caplog.at_level(logging.WARNING, logger="nexus.router"):
        assert training.quantize_query_onnx(plain / "query_encoder") == onnx_path(plain / "query_encoder", "int8")
    assert [r for r in caplog.records if "is not smoothed" in r.getMessage()]
    assert int8_method(plain / "query_encoder") == INT8_PLAIN
    smooth_gate, plain_gate = (GateModel(d, threads=1, precision="int8") for d in (gate_dir, plain))
    probes = _requests(1, 300)[::2]  # requests the calibration did not read
    err = {name: np.mean([1 - float(g.embed_query(t) @ g.embed_query_torch(t)) for t in probes])
           for name, g in (("smooth", smooth_gate), ("plain", plain_gate))}
    assert err["smooth"] < 0.8 * err["plain"], err


def test_unknown_precision_is_refused(gate_dir):
    with pytest.raises(ValueError, match="precision"):
        onnx_path(gate_dir / "query_encoder", "fp16")


def test_missing_int8_graph_falls_back_to_fp32(gate_dir, tmp_path, caplog):
    path = _variant(gate_dir, tmp_path)
    onnx_path(path / "query_encoder", "int8").unlink()
    with caplog.at_level(logging.WARNING, logger="nexus.router"):
        g = GateModel(path, threads=1, precision="int8")
    assert g.onnx is not None and g.onnx.precision == "fp32"
    assert [r for r in caplog.records if "no INT8 query encoder" in r.getMessage() and r.levelno == logging.ERROR]
    assert float(g.embed_query(REQUESTS[0]) @ g.embed_query_torch(REQUESTS[0])) >= 0.9999


def _assert_torch_fallback(path, caplog, message: str, precision: str = "fp32"):
    with caplog.at_level(logging.WARNING, logger="nexus.router"):
        g = GateModel(path, threads=1, precision=precision)
    assert g.onnx is None
    assert [r.getMessage() for r in caplog.records if message in r.getMessage()]
    np.testing.assert_array_equal(g.embed_query(REQUESTS[0]), g.embed_query_torch(REQUESTS[0]))


def test_missing_export_falls_back_to_torch(gate_dir, tmp_path, caplog):
    path = _variant(gate_dir, tmp_path)
    shutil.rmtree(onnx_path(path / "query_encoder").parent)
    _assert_torch_fallback(path, caplog, "no ONNX query encoder")


def test_missing_onnxruntime_falls_back_to_torch(gate_dir, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    _assert_torch_fallback(gate_dir, caplog, "onnxruntime is not installed")


def test_unreadable_export_falls_back_to_torch(gate_dir, tmp_path, caplog):
    path = _variant(gate_dir, tmp_path)
    onnx_path(path / "query_encoder").write_bytes(b"not a model")
    _assert_torch_fallback(path, caplog, "unusable")


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_export_of_other_weights_is_refused(gate_dir, tmp_path, caplog, precision):
    import torch
    from sentence_transformers import SentenceTransformer

    path = _variant(gate_dir, tmp_path)
    other = SentenceTransformer(str(default_embedder_path()), device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # both graphs of other weights (INT8 unsmoothed: quicker, and as foreign); those on disk stay the base ones
    export_query_onnx(path / "query_encoder", other, texts=())
    _assert_torch_fallback(path, caplog, "disagrees with the torch weights", precision=precision)


def test_cached_model_without_export_gets_one(tmp_path, monkeypatch):
    from tests.conftest import QUERIES, TOOLS_DIR
    from training.data import equivalents, load_queries, load_registry

    registry = load_registry(TOOLS_DIR)
    tools = [t for t in registry.tools if registry.server_of[t.name] == "time"]
    lines = [ln for ln in load_queries(QUERIES) if ln.server == "time"]
    out = _gate_dir(tmp_path / "gate", onnx=False)
    doc = json.loads((out / "gate.json").read_text())
    doc.update(data_hash="cached", slb={"version": training.SLB_CALIBRATION_VERSION},
               tool_schemas=training.tool_schemas(tools))
    (out / "gate.json").write_text(json.dumps(doc))
    monkeypatch.setattr(training, "data_hash", lambda *a, **k: "cached")  # the model matches: no training
    assert training.train_gate(lines, tools, out, equivalents=equivalents, progress=False) == doc
    assert onnx_path(out / "query_encoder").is_file()
    assert GateModel(out, threads=1).onnx is not None
    # a model exported before the INT8 graph gets it on the next (cached) run, and keeps its fp32 export
    int8 = onnx_path(out / "query_encoder", "int8")
    int8.unlink()
    fp32_mtime = onnx_path(out / "query_encoder").stat().st_mtime_ns
    assert training.train_gate(lines, tools, out, equivalents=equivalents, progress=False) == doc
    assert int8.is_file() and onnx_path(out / "query_encoder").stat().st_mtime_ns == fp32_mtime
    assert GateModel(out, threads=1, precision="int8").onnx.precision == "int8"
    assert int8_method(out / "query_encoder") == INT8_METHOD
    # a graph quantized before the smoothing (no record of its method) is quantized again; a smoothed one is kept
    shutil.copy(onnx_path(out / "query_encoder"), int8)
    assert int8_method(out / "query_encoder") == ""
    assert training.train_gate(lines, tools, out, equivalents=equivalents, progress=False) == doc
    assert int8_method(out / "query_encoder") == INT8_METHOD
    smoothed_mtime = int8.stat().st_mtime_ns
    assert training.train_gate(lines, tools, out, equivalents=equivalents, progress=False) == doc
    assert int8.stat().st_mtime_ns == smoothed_mtime
