"""The query encoder's single-request path on onnxruntime: its INT8 quantization (the router's default), ~1.6x
faster than the fp32 graph with the same held-out top-1 within noise (bench/routing_int8.py,
docs/experiments/routing_experiments.md §29), or the fp32 graph, the same vector as the torch forward pass in about half its
time (bench/embed_latency.py, retired: docs/experiments/README.md).

Layout: ``query_encoder/onnx/sentence_embedding.onnx`` beside the sentence-transformers files, written by
training (``export``), and ``sentence_embedding.int8.onnx`` beside it (``quantize``: block-wise int8 weights and
activations of every MatMul, int8 embedding rows; ``INT8_METHOD``). The graph is transformer
+ masked mean pooling + L2 normalization, so its output is the vector the router scores with. Inputs are int64
``(batch, seq)``, both axes dynamic.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("nexus.router")

ONNX_FILE = Path("onnx") / "sentence_embedding.onnx"
INT8_FILE = Path("onnx") / "sentence_embedding.int8.onnx"
PRECISIONS = ("fp32", "int8")
OPSET = 17
INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")
# At load the ONNX encoder must give the torch vector of this request (a stale or foreign export would
# otherwise move every route silently): long enough for attention to matter, with non-ASCII text.
PROBE = "convert 3pm New York time to Tokyo time\n[context] user: réunion à 15 h, 東京 👋"
MIN_COSINE = 0.9999
# The INT8 graph moves vectors (probe cosine ~0.99 on the gate models, 0.97 at worst over their exemplars); a
# stale or foreign file lands far lower.
MIN_COSINE_INT8 = 0.95
# The INT8 graph (``quantize``): every MatMul weight int8 per block of BLOCK values along its input axis, read by
# onnxruntime's MatMulNBits with its activations quantized per block too (accuracy level 4: int8 compute); the
# embedding tables int8 per row. The vectors move 5x less than with per-tensor dynamic activations (1 - cos 0.0004 vs
# 0.002) and the router's decisions follow the fp32 graph's on 99.3 % of the calibration lines against 98.0 %
# (docs/experiments/int8_parity.md). Training re-quantizes a graph made by any other method.
INT8_METHOD = "blockwise-int8-v1"
BLOCK = 32
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations per block (0 would dequantize the weights to fp32: ~5x slower)


def onnx_path(encoder_dir: str | Path, precision: str = "fp32") -> Path:
    if precision not in PRECISIONS:
        raise ValueError(f"query encoder precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return Path(encoder_dir) / (ONNX_FILE if precision == "fp32" else INT8_FILE)


def quantize(encoder_dir: str | Path) -> Path:
    """Write the INT8 graph of ``encoder_dir``'s fp32 export atomically (``quantize_graph``)."""
    src = onnx_path(encoder_dir)
    if not src.is_file():
        raise FileNotFoundError(f"no fp32 ONNX export at {src} to quantize")
    out = onnx_path(encoder_dir, "int8")
    quantize_graph(src, out)
    log.info("query encoder quantized to %s", out)
    return out


def quantize_graph(src: Path, out: Path) -> None:
    """``out`` (written atomically): ``src`` with its MatMul weights block-wise int8 (MatMulNBits, ``BLOCK``,
    ``ACCURACY_LEVEL``) and its embedding tables int8 per row (``_int8_gathers``), ``INT8_METHOD`` in its
    metadata. Deterministic; the graph's inputs and outputs are the fp32 graph's."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        model = onnx.load(str(src))
        opsets = {o.domain: o.version for o in model.opset_import}
        cfg = DefaultWeightOnlyQuantConfig(block_size=BLOCK, is_symmetric=True, bits=8,
                                           accuracy_level=ACCURACY_LEVEL)
        quantizer = MatMulNBitsQuantizer(model, bits=8, block_size=BLOCK, is_symmetric=True,
                                         accuracy_level=ACCURACY_LEVEL, algo_config=cfg)
        quantizer.process()
        model = quantizer.model.model
        for o in model.opset_import:  # the quantizer raises the default opset; the graph's ops are the export's
            if o.domain == "":
                o.version = opsets[""]
        _int8_gathers(model)
        model.metadata_props.add(key="nexus_int8_method", value=INT8_METHOD)
        onnx.save(model, str(tmp))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("graph %s quantized to INT8 (%s)", out.name, INT8_METHOD)


def _int8_gathers(model, min_size: int = 100_000) -> None:
    """Replace each Gather of a 2-D fp32 table of at least ``min_size`` values (the word and position embeddings)
    by a Gather of the int8 table and of its per-row scale, multiplied back: the rows read are exact to 1/254 of
    their largest value, and only they are dequantized."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    nodes = []
    for n in g.node:
        w = numpy_helper.to_array(inits[n.input[0]]) if n.op_type == "Gather" and n.input[0] in inits else None
        if w is None or w.ndim != 2 or w.size < min_size or w.dtype != np.float32:
            nodes.append(n)
            continue
        scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        table, out = n.input[0], n.output[0]
        g.initializer.remove(inits[table])
        g.initializer.extend([numpy_helper.from_array(q, f"{table}_int8"),
                              numpy_helper.from_array(scale.astype(np.float32), f"{table}_scale")])
        nodes += [helper.make_node("Gather", [f"{table}_int8", n.input[1]], [f"{out}_int8"], axis=0),
                  helper.make_node("Cast", [f"{out}_int8"], [f"{out}_f"], to=TensorProto.FLOAT),
                  helper.make_node("Gather", [f"{table}_scale", n.input[1]], [f"{out}_scale"], axis=0),
                  helper.make_node("Mul", [f"{out}_f", f"{out}_scale"], [out], name=n.name)]
    del g.node[:]
    g.node.extend(nodes)


def int8_method(encoder_dir: str | Path) -> str | None:
    """How the INT8 graph of ``encoder_dir`` was made (``INT8_METHOD``, an older method's name, or "" for a graph
    from before the record), None without one. Training's cached path re-quantizes a graph not of ``INT8_METHOD``."""
    path = onnx_path(encoder_dir, "int8")
    if not path.is_file():
        return None
    import onnx

    try:
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    except Exception:  # a corrupt file: as good as one of unknown making
        return ""
    return props.get("nexus_int8_method", "")


def export(transformer, tokenizer, encoder_dir: str | Path) -> Path:
    """Write the ONNX graph of ``transformer`` (a Hugging Face encoder) + mean pooling + normalization into
    ``encoder_dir`` atomically (a reader never sees half a file). Needs the ``onnx`` package."""
    import torch

    class MeanPooled(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            kw = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            h = self.model(input_ids=input_ids, attention_mask=attention_mask, **kw).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            v = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(v, dim=-1)

    # two sequences of different lengths: the traced graph takes the padded-mask path, valid for any batch
    feats = tokenizer(["what time is it in Tokyo", "hi"], padding=True, return_tensors="pt")
    names = [n for n in INPUT_ORDER if n in feats]
    out = onnx_path(encoder_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    was_training = transformer.training
    transformer.eval()
    try:
        # The tracer warns about Python conditions on shapes in transformers' mask/SDPA code; each is constant
        # over sequence lengths here (tests and GateModel's load-time probe compare the vectors with torch).
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(MeanPooled(transformer), tuple(feats[n].to(torch.int64) for n in names), str(tmp),
                              dynamo=False, opset_version=OPSET, input_names=names,
                              output_names=["sentence_embedding"],
                              dynamic_axes={**{n: {0: "batch", 1: "seq"} for n in names},
                                            "sentence_embedding": {0: "batch"}})
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        transformer.train(was_training)
    log.info("query encoder exported to %s", out)
    return out


class OnnxQueryEncoder:
    """One request → its unit vector through onnxruntime. ``InferenceSession.run`` is thread-safe, the
    tokenizer is not (truncation settings live on the Rust object): callers serialize ``embed``."""

    def __init__(self, path: str | Path, tokenizer, max_len: int, threads: int):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(0, threads)  # 0: onnxruntime's default (one per core)
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.path = Path(path)
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        # sentence_embedding.int8.onnx or sentence_embedding.onnx
        self.precision = "int8" if self.path.name.endswith(".int8.onnx") else "fp32"
        self.tokenizer = tokenizer
        self.max_len = max_len

    def embed(self, text: str) -> np.ndarray:
        feats: dict[str, Any] = self.tokenizer([text], return_tensors="np", truncation=True, max_length=self.max_len)
        v = self.session.run(None, {n: feats[n].astype(np.int64, copy=False) for n in self.inputs})[0][0]
        return np.ascontiguousarray(v, dtype=np.float32)


def load(encoder_dir: str | Path, tokenizer, max_len: int, threads: int,
         reference: Callable[[str], np.ndarray], precision: str = "fp32") -> OnnxQueryEncoder | None:
    """The ONNX encoder of ``encoder_dir`` at ``precision`` when it reproduces ``reference`` (the torch path) on
    ``PROBE`` (cosine >= MIN_COSINE, or MIN_COSINE_INT8 for the INT8 graph), else None with the reason logged (the
    caller embeds with torch). An INT8 graph that is missing falls back to the fp32 one, logged."""
    path = onnx_path(encoder_dir, precision)
    if precision == "int8" and not path.is_file():
        log.error("no INT8 query encoder at %s: embedding at fp32 instead; `nexus train-gate` on the model's data "
                  "writes it (a cached model gets it without retraining)", path)
        return load(encoder_dir, tokenizer, max_len, threads, reference)
    min_cosine = MIN_COSINE if precision == "fp32" else MIN_COSINE_INT8
    if not path.is_file():
        log.warning("no ONNX query encoder at %s: single requests are embedded with torch (slower); "
                    "`nexus train-gate` exports it", path)
        return None
    try:
        enc = OnnxQueryEncoder(path, tokenizer, max_len, threads)
        cos = float(enc.embed(PROBE) @ reference(PROBE))
    except ImportError:
        log.warning("onnxruntime is not installed: single requests are embedded with torch (slower)")
        return None
    except Exception as e:  # onnxruntime raises its own exception types for a corrupt or foreign file
        log.error("ONNX query encoder %s unusable (%s): single requests are embedded with torch", path, e)
        return None
    if not cos >= min_cosine:  # NaN fails too
        log.error("ONNX query encoder %s disagrees with the torch weights (probe cosine %.5f < %g): single requests "
                  "are embedded with torch; delete it and run `nexus train-gate` to re-export", path, cos, min_cosine)
        return None
    log.info("query encoder: onnxruntime %s (%s, probe cosine %.5f)", precision, path, cos)
    return enc
