"""The router's single-request query encoder on onnxruntime: the torch vector (cosine >= 0.9999) for a real
export of the base all-MiniLM-L6-v2 encoder, thread-safe, and the torch path (logged) whenever the export is
missing, unreadable, stale, or onnxruntime is absent; training's hook exports into a cached model. Its INT8
graph (opted into with precision="int8"): written beside the export, block-wise int8 MatMuls and int8 embedding
rows, close to the torch vector but not it, the fp32 graph (logged) when it is missing, torch when it is foreign;
training's cached path re-quantizes a graph made by another method."""

import json
import logging
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from services.common.models import default_embedder_path
from services.router.gate import GATE_FORMAT, GateModel, export_query_onnx
from services.router.onnx_encoder import INT8_METHOD, MIN_COSINE_INT8, int8_method, onnx_path
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
    requests as its exemplars."""
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


def test_int8_graph_quantizes_every_matmul_and_the_embeddings_block_wise(gate_dir):
    """Every weight MatMul reads int8 blocks with int8 activations per block (MatMulNBits, accuracy level 4), the
    embedding tables are int8 rows: nothing of the encoder's weights is left at fp32, and the vectors stay within
    1 - cos 0.001 of torch on requests (per-tensor dynamic activations moved them ~0.002)."""
    import onnx

    graph = onnx.load(str(onnx_path(gate_dir / "query_encoder", "int8"))).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("MatMulNBits") == 36  # 6 layers x (q, k, v, attention out, FFN in, FFN out)
    attrs = [{a.name: a.i for a in n.attribute} for n in graph.node if n.op_type == "MatMulNBits"]
    assert all(a["accuracy_level"] == 4 and a["bits"] == 8 for a in attrs)
    big = [i for i in graph.initializer if np.prod(i.dims) >= 100_000]
    assert big and all(i.data_type != onnx.TensorProto.FLOAT for i in big)
    assert int8_method(gate_dir / "query_encoder") == INT8_METHOD
    g = GateModel(gate_dir, threads=1, precision="int8")
    err = [1 - float(g.embed_query(t) @ g.embed_query_torch(t)) for t in _requests(0, 60)]
    assert 0 < np.mean(err) < 1e-3, np.mean(err)


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
    # both graphs of other weights; those on disk stay the base ones
    export_query_onnx(path / "query_encoder", other)
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
    # a graph quantized by another method (or with no record of its method) is quantized again; a current one is kept
    shutil.copy(onnx_path(out / "query_encoder"), int8)
    assert int8_method(out / "query_encoder") == ""
    assert training.train_gate(lines, tools, out, equivalents=equivalents, progress=False) == doc
    assert int8_method(out / "query_encoder") == INT8_METHOD
    current_mtime = int8.stat().st_mtime_ns
    assert training.train_gate(lines, tools, out, equivalents=equivalents, progress=False) == doc
    assert int8.stat().st_mtime_ns == current_mtime
