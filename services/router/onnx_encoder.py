"""The query encoder's single-request path on onnxruntime: its INT8 quantization (the router's default), ~1.6x
faster than the fp32 graph with the same held-out top-1 within noise (bench/routing_int8.py,
docs/experiments/routing_experiments.md §29), or the fp32 graph, the same vector as the torch forward pass in about half its
time (bench/embed_latency.py, retired: docs/experiments/README.md).

Layout: ``query_encoder/onnx/sentence_embedding.onnx`` beside the sentence-transformers files, written by
training (``export``), and ``sentence_embedding.int8.onnx`` beside it (``quantize``: a SmoothQuant-smoothed copy of
the encoder, calibrated on the model's exemplar requests, then dynamic quantization with per-channel signed int8
weights of every MatMul; without the smoothing, top-1 at N = 250 fell 0.66 points, §27). The graph is transformer
+ masked mean pooling + L2 normalization, so its output is the vector the router scores with. Inputs are int64
``(batch, seq)``, both axes dynamic.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
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
# The INT8 graph is quantized from a smoothed copy of the encoder (``smoothed``): alpha chosen by the vectors'
# cosine to fp32 on data/routing_calibration, never on the held-out lines (0.85 of 0.5-0.95 on fold 0's model; the
# error 1 - cos halves, 0.011 -> 0.0055). Training re-quantizes an unrecorded graph, and an INT8_PLAIN one (made
# without calibration texts) once the model has its exemplars.
SMOOTH_ALPHA = 0.85
INT8_METHOD = "smoothquant-v1"
INT8_PLAIN = "plain"
SHARED = "__shared__"  # activation_ranges' key for the groups of Linears that read one tensor


def onnx_path(encoder_dir: str | Path, precision: str = "fp32") -> Path:
    if precision not in PRECISIONS:
        raise ValueError(f"query encoder precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return Path(encoder_dir) / (ONNX_FILE if precision == "fp32" else INT8_FILE)


def quantize(encoder_dir: str | Path, transformer=None, tokenizer=None, texts: Sequence[str] = (),
             max_len: int = 128, alpha: float = SMOOTH_ALPHA) -> Path:
    """Write the INT8 graph of ``encoder_dir``'s encoder atomically. With ``transformer`` (the torch model the fp32
    export was made from) and calibration ``texts`` (the requests it trained on), the graph is exported from a
    smoothed copy first (``smoothed``: exact at fp32), which halves the quantization error of the vectors;
    without, from the fp32 export as it is. Then onnxruntime's pre-processing (graph optimization, shape inference)
    and dynamic quantization with per-channel signed int8 weights (per-tensor unsigned weights lost ~0.5 points
    more; docs/experiments/routing_experiments.md §27). The method is recorded in the graph's metadata (``int8_method``).
    Deterministic for given weights and texts."""
    src = onnx_path(encoder_dir)
    if not src.is_file():
        raise FileNotFoundError(f"no fp32 ONNX export at {src} to quantize")
    out = onnx_path(encoder_dir, "int8")
    quantize_graph(src, out, lambda model, tmp: export(model, tokenizer, tmp), transformer, tokenizer, texts,
                   max_len, alpha)
    log.info("query encoder quantized to %s", out)
    return out


def quantize_graph(src: Path, out: Path, export_fn: Callable[[Any, Path], Path], transformer=None, tokenizer=None,
                   texts: Sequence[str] = (), max_len: int = 128, alpha: float = SMOOTH_ALPHA) -> dict[str, str]:
    """``quantize``'s method for any graph of ``transformer``: ``out`` (written atomically) is the dynamic INT8
    quantization of ``export_fn(smoothed copy, a scratch directory)`` (the fp32 graph's path, made from the copy),
    smoothed on ``texts``; without a transformer, tokenizer or texts, of ``src`` as it is. Returns the method recorded
    in ``out``'s metadata. SmoothQuant scales only what each Linear reads, so every tensor the graph outputs (the
    vector, hidden states) is the same function as the fp32 graph's."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    stem = out.with_name(f".{out.name}.{os.getpid()}")
    smooth_dir, pre, tmp = Path(f"{stem}.smooth"), Path(f"{stem}.pre.tmp"), Path(f"{stem}.tmp")
    method = {"method": INT8_PLAIN}
    try:
        if transformer is not None and tokenizer is not None and len(texts):
            ranges = activation_ranges(transformer, tokenizer, texts, max_len)
            smooth_dir.mkdir(parents=True, exist_ok=True)
            src = export_fn(smoothed(transformer, ranges, alpha), smooth_dir)
            method = {"method": INT8_METHOD, "alpha": f"{alpha:g}", "texts": str(len(texts))}
        # symbolic shape inference does not complete on the exported attention-mask graph; onnx's does
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        quantize_dynamic(str(pre), str(tmp), per_channel=True, weight_type=QuantType.QInt8)
        _set_metadata(tmp, {f"nexus_int8_{k}": v for k, v in method.items()})
        os.replace(tmp, out)
    finally:
        pre.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
        shutil.rmtree(smooth_dir, ignore_errors=True)
    log.info("graph %s quantized to INT8 (%s)", out.name, ", ".join(f"{k} {v}" for k, v in method.items()))
    return method


def int8_method(encoder_dir: str | Path) -> str | None:
    """How the INT8 graph of ``encoder_dir`` was made (``INT8_METHOD``, ``INT8_PLAIN``, or "" for a graph from
    before the record), None without one. Training's cached path re-quantizes a graph not of ``INT8_METHOD``."""
    path = onnx_path(encoder_dir, "int8")
    if not path.is_file():
        return None
    import onnx

    try:
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    except Exception:  # a corrupt file: as good as one of unknown making
        return ""
    return props.get("nexus_int8_method", "")


def _set_metadata(path: Path, props: dict[str, str]) -> None:
    import onnx

    model = onnx.load(str(path))
    for k, v in props.items():
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(path))


def activation_ranges(transformer, tokenizer, texts: Sequence[str], max_len: int) -> dict[str, Any]:
    """Per input channel, the largest |activation| each ``nn.Linear`` of ``transformer`` reads over ``texts``
    (one request at a time, as the router runs them: texts of one token length are batched, never padded), and under
    ``SHARED`` the groups of Linears that read one tensor (a layer's query, key and value)."""
    import torch

    enc = tokenizer(list(texts), truncation=True, max_length=max_len)
    names = [n for n in INPUT_ORDER if n in enc]
    by_len: dict[int, list[int]] = {}
    for i, seq in enumerate(enc["input_ids"]):
        by_len.setdefault(len(seq), []).append(i)
    ranges: dict[str, Any] = {}
    inputs: dict[str, Any] = {}  # the first batch's input tensor of each Linear, held: no address is reused
    hooks = []
    for name, mod in transformer.named_modules():
        if isinstance(mod, torch.nn.Linear):
            def seen(m, args, name=name):
                inputs.setdefault(name, args[0])
                x = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0)
                ranges[name] = torch.maximum(ranges[name], x) if name in ranges else x
            hooks.append(mod.register_forward_pre_hook(seen))
    was_training = transformer.training
    transformer.eval()
    try:
        with torch.inference_mode():
            for _n, idx in sorted(by_len.items()):
                for b in range(0, len(idx), 64):
                    transformer(**{k: torch.tensor([enc[k][i] for i in idx[b:b + 64]], dtype=torch.int64)
                                   for k in names})
    finally:
        for h in hooks:
            h.remove()
        transformer.train(was_training)
    groups: dict[int, list[str]] = {}
    for name, x in inputs.items():
        groups.setdefault(id(x), []).append(name)
    ranges[SHARED] = [g for g in groups.values() if len(g) > 1]
    return ranges


def smoothed(transformer, ranges: dict[str, Any], alpha: float = SMOOTH_ALPHA):
    """A copy of ``transformer`` whose every measured ``nn.Linear`` reads ``x / s`` with weights ``W * s``
    (SmoothQuant, Xiao et al. 2023): the same function at fp32, but an activation's outlier channels move into
    the weights, which are quantized per channel, so the per-tensor dynamic quantization of the activations keeps
    more of the other channels. ``s_j = max|x_j|^alpha / max|W_:j|^(1 - alpha)``, one ``s`` per activation: the
    Linears that read one tensor (``ranges[SHARED]``) take the max of their weights."""
    import copy

    import torch

    class Smoothed(torch.nn.Module):
        def __init__(self, linear, s):
            super().__init__()
            self.linear = linear
            self.register_buffer("inv_s", (1.0 / s).to(linear.weight.dtype))

        def forward(self, x):
            return self.linear(x * self.inv_s)

    model = copy.deepcopy(transformer)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n in ranges}
    shared = [g for g in ranges.get(SHARED, []) if all(n in linears for n in g)]
    grouped = {n for g in shared for n in g}
    for group in shared + [[n] for n in linears if n not in grouped]:
        a = torch.stack([ranges[n] for n in group]).amax(0).clamp(min=1e-5)
        w = torch.stack([linears[n].weight.detach().abs().amax(0) for n in group]).amax(0).clamp(min=1e-5)
        s = (a ** alpha / w ** (1 - alpha)).clamp(min=1e-5)
        for name in group:
            mod = linears[name]
            with torch.no_grad():
                mod.weight.mul_(s[None, :])
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, Smoothed(mod, s))
    return model


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
