"""The argument-evidence stage's fast reader: a small head over the router's own query-encoder states (issue 4).

The slot reader the stage was calibrated with (services/engine/slots.py) cross-encodes every (parameter question,
request) pair: ~250-350 ms per escalated request on one thread. This reader instead reads the hidden states of the
pass the router already makes over the request to embed it (docs/experiments/routing_experiments.md §21-§23):

* the router's query encoder runs once, through ``states.onnx`` (``states.int8.onnx`` at the router's default
  precision, int8): the request's vector (what the SLB scans with, the same vector as the gate model's own graph at
  that precision, checked at load) and every layer's token states;
* each parameter question goes through the same graph once, and the head's keys and values of its tokens at every
  layer are cached (questions attend to themselves only);
* what an escalation computes is the head's ``k`` small layers over the request's tokens, one batch of questions:
  ~11 / 26 / 44 ms p50 / p95 / p99 on one thread (bench/routing_late_reader.py, retired: docs/experiments/README.md);
* a question's score is its best span's logit minus "not stated" (the request's [CLS]), as the slot reader's.

A late-reader directory (``save``; `nexus train-late-reader`, services/training/late_reader.py, trains and
calibrates one):

    late_reader.json  format, the head's shape, its stated threshold and data hash, the gate model it reads
                      (``gate``: its data hash) and ``arg_evidence``: the stage calibrated with this reader under
                      that gate model's SLB (``argevidence.calibrate``'s section, as gate.json holds the slot reader's)
    head.safetensors  the head's weights (safetensors: loading them runs no code)
    states.onnx       the gate's query encoder + mean pooling + normalization, its hidden states a second output
    states.int8.onnx  the same graph at INT8 (``quantize_states``: the query encoder's SmoothQuant method, smoothed
                      on the gate model's exemplar requests), what a router at query_encoder_precision=int8 runs

The router uses it when ``NEXUS_ROUTER_ARG_EVIDENCE=true`` and ``NEXUS_ROUTER_LATE_READER_DIR`` name it (``load``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.router.onnx_encoder import OnnxQueryEncoder

log = logging.getLogger("nexus.router.late_reader")

FORMAT = "nexus-late-reader-v1"
HEAD_VERSION = "late-reader-v1"
D = 128
K = 2
LAYERS = 7  # the embeddings and MiniLM-L6's 6 layers
MAX_LEN = 256  # the query encoder's
HIDDEN = 384
META_FILE, HEAD_FILE, GRAPH_FILE = "late_reader.json", "head.safetensors", "states.onnx"
INT8_GRAPH_FILE = "states.int8.onnx"


def build_head(d: int = D, k: int = K, hidden: int = HIDDEN, layers: int = LAYERS):
    """The head: a learned softmax mix of the encoder's ``layers`` states projected to ``d``, ``k`` pre-norm
    transformer layers over [question; request] (the question's tokens attend to themselves only, so their keys and
    values are cached per question), a start/end head."""
    import torch
    from torch import nn

    class Layer(nn.Module):
        """Pre-norm attention + feed-forward; ``kv`` gives the question's cached keys and values at this layer."""

        def __init__(self) -> None:
            super().__init__()
            self.heads = max(1, d // 64)
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.drop = nn.Dropout(0.1)

        def split(self, x):
            b, n, _ = x.shape
            return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        def forward(self, x, mask, kv=None):
            """``x``: (B, N, d) queries; ``kv``: (keys, values) of the tokens before x (B, heads, M, d/heads);
            ``mask``: (B, 1, N, M + N) True where a query may attend."""
            q, k_, v = self.qkv(self.ln1(x)).chunk(3, -1)
            q, k_, v = self.split(q), self.split(k_), self.split(v)
            own = (k_, v)
            if kv is not None:
                k_, v = torch.cat([kv[0], k_], 2), torch.cat([kv[1], v], 2)
            a = torch.nn.functional.scaled_dot_product_attention(q, k_, v, attn_mask=mask)
            x = x + self.drop(self.o(a.transpose(1, 2).reshape(x.shape)))
            return x + self.drop(self.ff(self.ln2(x))), own

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mix = nn.Parameter(torch.zeros(layers))
            self.norm = nn.LayerNorm(hidden)
            self.proj = nn.Linear(hidden, d)
            self.seg = nn.Embedding(2, d)
            self.layers = nn.ModuleList([Layer() for _ in range(k)])
            self.out_norm = nn.LayerNorm(d)
            self.qa = nn.Linear(d, 2)

        def embed(self, h, seg: int):
            """(B, layers, N, hidden) frozen states -> (B, N, d)."""
            x = torch.einsum("blnh,l->bnh", h, torch.softmax(self.mix, 0))
            return self.proj(self.norm(x)) + self.seg.weight[seg]

        def question_kv(self, hq, mq):
            """Each layer's (keys, values) of the questions (B, Lq): they attend to themselves only."""
            x = self.embed(hq, 0)
            mask = mq[:, None, None, :].expand(-1, 1, x.shape[1], -1)
            out = []
            for layer in self.layers:
                x, kv = layer(x, mask)
                out.append(kv)
            return out

        def forward(self, qkv, mq, hc, mc, rows=None):
            """Start and end logits over the request's tokens (B, Lc) given the questions' cached keys and values
            (``question_kv``) and the request's frozen states ``hc`` (B, layers, Lc, hidden) or, broadcast, (1, ...);
            with ``rows`` (B,), row i reads request ``rows[i]`` of ``hc`` (each distinct request embedded once)."""
            x = self.embed(hc, 1)
            if rows is not None:
                x = x[rows]
            b = max(x.shape[0], mq.shape[0])
            x = x.expand(b, -1, -1)
            keys = torch.cat([mq, mc.expand(b, -1)], 1)[:, None, None, :].expand(-1, 1, x.shape[1], -1)
            for layer, kv in zip(self.layers, qkv, strict=True):
                x, _ = layer(x, keys, kv)
            lo = self.qa(self.out_norm(x))
            return lo[..., 0], lo[..., 1]

    return Head()


def span_mask(mc):
    """Where an answer may start or end: the request's tokens without [CLS] (the "not stated" answer) and [SEP]."""
    import torch

    allow = mc.clone()
    allow[:, 0] = False
    last = mc.sum(1) - 1
    allow[torch.arange(len(mc)), last] = False
    return allow


def encode_states(transformer, tokenizer, texts: Sequence[str], bs: int = 64,
                  max_len: int = MAX_LEN) -> dict[str, tuple]:
    """text -> (hidden states (LAYERS, n, hidden) float16, character offsets (n, 2)) under the frozen torch encoder
    (training's path; the router's is ``OnnxStates``, the same states to float16)."""
    import torch

    out: dict[str, tuple] = {}
    todo = sorted(set(texts), key=len)
    for b in range(0, len(todo), bs):
        chunk = todo[b:b + bs]
        enc = tokenizer(chunk, truncation=True, max_length=max_len, padding=True, return_offsets_mapping=True,
                        return_tensors="pt")
        offsets = enc.pop("offset_mapping").numpy()
        with torch.inference_mode():
            hs = torch.stack(transformer(**enc, output_hidden_states=True).hidden_states, 1)
        for i, text in enumerate(chunk):
            n = int(enc["attention_mask"][i].sum())
            out[text] = (hs[i, :, :n].to(torch.float16), offsets[i, :n])
    return out


def export_states_graph(transformer, tokenizer, path: str | Path) -> Path:
    """The router's ONNX graph (transformer, mean pooling, normalization) with the hidden states (batch, LAYERS,
    seq, hidden) as a second output, written atomically."""
    import torch

    from services.router.onnx_encoder import INPUT_ORDER, OPSET

    class WithStates(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                           output_hidden_states=True)
            m = attention_mask.unsqueeze(-1).to(o.last_hidden_state.dtype)
            v = (o.last_hidden_state * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(v, dim=-1), torch.stack(o.hidden_states, 1)

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    feats = tokenizer(["what time is it in Tokyo", "hi"], padding=True, return_tensors="pt")
    names = list(INPUT_ORDER)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the wrapper in eval mode: the exporter restores the module's mode afterwards, and a fresh module is in
            # training mode, which would leave the encoder's dropout on
            torch.onnx.export(WithStates(transformer).eval(), tuple(feats[n] for n in names), str(tmp), dynamo=False,
                              opset_version=OPSET, input_names=names,
                              output_names=["sentence_embedding", "hidden_states"],
                              dynamic_axes={**{n: {0: "batch", 1: "seq"} for n in names},
                                            "sentence_embedding": {0: "batch"},
                                            "hidden_states": {0: "batch", 2: "seq"}})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def quantize_states(root: str | Path, transformer, tokenizer, texts: Sequence[str], max_len: int) -> Path:
    """Write ``root``'s ``states.int8.onnx``: ``states.onnx``'s graph of ``transformer`` (the gate model's query
    encoder) quantized as the query encoder's INT8 graph is (``onnx_encoder.quantize_graph``: smoothed on ``texts``,
    the gate model's exemplar requests, then dynamic per-channel int8). Its vector is the router's INT8 vector."""
    from services.router.onnx_encoder import quantize_graph

    root = Path(root)
    out = root / INT8_GRAPH_FILE
    quantize_graph(root / GRAPH_FILE, out,
                   lambda model, tmp: export_states_graph(model, tokenizer, Path(tmp) / GRAPH_FILE),
                   transformer, tokenizer, texts, max_len)
    return out


class OnnxStates(OnnxQueryEncoder):
    """One pass of ``states.onnx``: a request's vector and its token states (``embed`` still gives the vector
    alone). ``InferenceSession.run`` is thread-safe, the tokenizer is not: here it has a lock of its own."""

    def __init__(self, path: str | Path, tokenizer, max_len: int, threads: int):
        super().__init__(path, tokenizer, max_len, threads)
        self._lock = threading.Lock()

    def run(self, texts: Sequence[str]) -> tuple[np.ndarray, list[np.ndarray]]:
        """The unit vectors (B, dim) of ``texts`` and each one's states (LAYERS, n, hidden), float32 (the reader
        rounds them to float16 as the head was trained, ``as_states``, only when it reads them)."""
        with self._lock:
            feats = self.tokenizer(list(texts), return_tensors="np", truncation=True, max_length=self.max_len,
                                   padding=True)
        vec, hs = self.session.run(None, {n: feats[n].astype(np.int64, copy=False) for n in self.inputs})
        lens = feats["attention_mask"].sum(1)
        return np.ascontiguousarray(vec, dtype=np.float32), [hs[i, :, :int(n)] for i, n in enumerate(lens)]

    def embed_with_states(self, text: str) -> tuple[np.ndarray, Any]:
        """One request: its vector (what the router scans the SLB with) and its states (what an escalation reads)."""
        vec, states = self.run([text])
        return vec[0], states[0]


def as_states(h):
    """States as the head reads them: a float32 tensor of float16-rounded values (training kept them in float16)."""
    import torch

    if isinstance(h, np.ndarray):
        h = torch.from_numpy(h)
    return h.to(torch.float16).float()


class LateReader:
    """A trained head behind the slot reader's interface (``score``, ``threshold``, ``meta``, ``tokenizer``,
    ``max_len``: what argevidence.read and the benches use). ``states_of(texts)``: each text's states (LAYERS, n,
    hidden); ``score`` takes the request's states from the router's pass when given, else encodes the request (kept
    in a cache of ``cache_size`` requests, None: unbounded, for the benches' repeated reads). ``encoder``: the
    ``OnnxStates`` the router embeds with when the reader was loaded from a directory, else None."""

    def __init__(self, head, states_of: Callable[[Sequence[str]], list[Any]], tokenizer, threshold: float,
                 meta: dict[str, Any], threads: int = 1, max_len: int = MAX_LEN, cache_size: int | None = 64,
                 encoder: OnnxStates | None = None):
        self.head, self.states_of, self.tokenizer = head.eval(), states_of, tokenizer
        self.threshold, self.meta, self.max_len, self.threads = threshold, meta, max_len, threads
        self.encoder, self.cache_size = encoder, cache_size
        self._q: dict[str, Any] = {}
        self._c: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.RLock()

    def question_cache(self, questions: Sequence[str], chunk: int = 32) -> int:
        """Registry-time work: each question's frozen states and the head's keys and values at every layer (the
        router warms it for every tool it loads). ``chunk`` questions at a time, each chunk under the reader's lock
        (an escalation meanwhile waits for one chunk, not the whole registry). Returns how many were new."""
        import torch

        new = [q for q in dict.fromkeys(questions) if q not in self._q]
        for b in range(0, len(new), chunk):
            with self._lock, torch.inference_mode():
                if self.threads > 0 and torch.get_num_threads() != self.threads:
                    torch.set_num_threads(self.threads)
                part = [q for q in new[b:b + chunk] if q not in self._q]
                for q, h in zip(part, self.states_of(part) if part else [], strict=True):
                    h = as_states(h)
                    kv = self.head.question_kv(h[None], torch.ones(1, h.shape[1], dtype=torch.bool))
                    self._q[q] = [(k[0], v[0]) for k, v in kv]
        return len(new)

    def score_states(self, questions: Sequence[str], hc) -> list[list[tuple[int, int, float]]]:
        """The escalation: every question's (start, end, score) over the request's states ``hc`` (LAYERS, n,
        hidden): one batch."""
        import torch

        from services.engine.slots import top_spans

        with self._lock:
            if self.threads > 0 and torch.get_num_threads() != self.threads:
                torch.set_num_threads(self.threads)
            self.question_cache(questions)
            cached = [self._q[q] for q in questions]
            lq = max(c[0][0].shape[1] for c in cached)
            mq = torch.zeros(len(questions), lq, dtype=torch.bool)
            kv = []
            for layer in range(len(self.head.layers)):
                ks = torch.zeros(len(questions), *cached[0][layer][0].shape[:1], lq, cached[0][layer][0].shape[2])
                vs = torch.zeros_like(ks)
                for i, c in enumerate(cached):
                    n = c[layer][0].shape[1]
                    ks[i, :, :n], vs[i, :, :n] = c[layer]
                    mq[i, :n] = True
                kv.append((ks, vs))
            with torch.inference_mode():
                mc = torch.ones(1, hc.shape[1], dtype=torch.bool)
                s, e = self.head(kv, mq, as_states(hc)[None], mc)
        allow = span_mask(mc).numpy()[0]
        return [[top_spans(s[i].numpy(), e[i].numpy(), allow)[0]] for i in range(len(questions))]

    def states(self, context: str):
        """``context``'s states, from the cache or encoded now."""
        with self._lock:
            got = self._c.get(context)
            if got is None:
                got = self.states_of([context])[0]
                self._c[context] = got
                if self.cache_size is not None and len(self._c) > self.cache_size:
                    self._c.popitem(last=False)
            return got

    def score(self, questions: list[str], context: str, k: int = 1,
              states: Any = None) -> list[list[tuple[int, int, float]]]:
        """(token start, token end, score) per question (``k`` is 1: the stage reads the best span's score).
        ``states``: ``context``'s own, from the router's pass."""
        if not questions:
            return []
        return self.score_states(questions, self.states(context) if states is None else states)


def gate_key(gate_meta: dict[str, Any]) -> dict[str, Any]:
    """What a late reader records of the gate model whose encoder it reads."""
    return {"data_hash": gate_meta.get("data_hash"), "format": gate_meta.get("format")}


def save(out: str | Path, head, transformer, tokenizer, threshold: float, meta: dict[str, Any],
         gate_meta: dict[str, Any], arg_evidence: dict[str, Any] | None = None) -> Path:
    """Write a late-reader directory (the module's layout) for ``head`` trained on ``transformer`` (the gate
    model's query encoder, described by its gate.json ``gate_meta``). ``meta``: the head's record (its
    ``data_hash`` identifies its scores, with the threshold); ``arg_evidence``: the stage's calibration with it."""
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(out / HEAD_FILE))
    export_states_graph(transformer, tokenizer, out / GRAPH_FILE)
    mix = torch.softmax(head.mix.detach(), 0)
    doc = {**meta, "format": FORMAT, "threshold": float(threshold), "gate": gate_key(gate_meta),
           "shape": {"d": int(head.proj.out_features), "k": len(head.layers), "layers": int(mix.numel()),
                     "hidden": int(head.proj.in_features)},
           "arg_evidence": arg_evidence}
    _write_meta(out, doc)
    return out


def set_arg_evidence(out: str | Path, arg_evidence: dict[str, Any]) -> None:
    """Replace the stage calibration a saved late-reader directory carries (its ``late_reader.json``)."""
    out = Path(out)
    doc = json.loads((out / META_FILE).read_text())
    _write_meta(out, {**doc, "arg_evidence": arg_evidence})


def _write_meta(out: Path, doc: dict[str, Any]) -> None:
    tmp = out / f".{META_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out / META_FILE)


def exists(path: str | Path) -> bool:
    root = Path(path)
    return all((root / f).is_file() for f in (META_FILE, HEAD_FILE, GRAPH_FILE))


def add_int8(root: str | Path, gate_dir: str | Path, texts: Sequence[str] | None = None) -> Path:
    """Quantize the states graph of the late reader at ``root`` for the gate model at ``gate_dir`` (the one it reads:
    checked) into ``states.int8.onnx``, smoothed on ``texts``: by default the gate model's exemplar requests, as its
    INT8 query encoder is."""
    from sentence_transformers import SentenceTransformer

    from services.router.gate import _single_query_path, exemplar_texts

    root, gate_dir = Path(root), Path(gate_dir)
    doc = json.loads((root / META_FILE).read_text())
    gate_meta = json.loads((gate_dir / "gate.json").read_text())
    if doc.get("gate") != gate_key(gate_meta):
        raise ValueError(f"late reader at {root} reads gate model {doc.get('gate')}, not {gate_key(gate_meta)} at "
                         f"{gate_dir}")
    single = _single_query_path(SentenceTransformer(str(gate_dir / "query_encoder"), device="cpu"))
    if single is None:
        raise ValueError(f"the query encoder of {gate_dir} is not Transformer + mean pooling")
    texts = exemplar_texts(gate_dir) if texts is None else list(texts)
    if not texts:
        raise ValueError(f"{gate_dir} has no exemplar requests to smooth the INT8 graph on")
    tokenizer, transformer, max_len = single
    return quantize_states(root, transformer, tokenizer, texts, max_len)


def load(path: str | Path, gate, threads: int = 1, precision: str = "fp32") -> LateReader | None:
    """The late reader at ``path`` for the loaded ``gate`` (a GateModel), or None with the reason logged: none there,
    another format, trained for another gate model, or a graph whose vector is not the gate's. ``precision``: the
    router's query-encoder precision; at int8 the reader's INT8 graph embeds and gives the states (the fp32 graph,
    logged, when the directory has none)."""
    from services.router.onnx_encoder import MIN_COSINE, MIN_COSINE_INT8, PRECISIONS, PROBE

    if precision not in PRECISIONS:
        raise ValueError(f"query encoder precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    root = Path(path)
    if not exists(root):
        log.warning("no late reader at %s (%s, %s and %s): the argument-evidence stage is off; `make setup` "
                    "(or `nexus train-late-reader`) writes one", root, META_FILE, HEAD_FILE, GRAPH_FILE)
        return None
    graph = GRAPH_FILE
    if precision == "int8":
        if (root / INT8_GRAPH_FILE).is_file():
            graph = INT8_GRAPH_FILE
        else:
            log.warning("no %s in the late reader at %s: requests are embedded by its fp32 graph (slower); "
                        "services.router.late_reader.add_int8(%s, <gate model>) adds it (`make late-reader` writes both)",
                        INT8_GRAPH_FILE, root, root)
    min_cosine = MIN_COSINE_INT8 if graph == INT8_GRAPH_FILE else MIN_COSINE
    try:
        doc = json.loads((root / META_FILE).read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT!r}")
        if doc.get("gate") != gate_key(gate.info.meta):
            raise ValueError(f"trained for gate model {doc.get('gate')}, not the loaded {gate_key(gate.info.meta)}")
        single = gate.query_stack
        if single is None:
            raise ValueError("the gate model's query encoder is not Transformer + mean pooling")
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        shape = doc["shape"]
        head = build_head(d=int(shape["d"]), k=int(shape["k"]), hidden=int(shape["hidden"]),
                          layers=int(shape["layers"]))
        head.load_state_dict(load_file(str(root / HEAD_FILE)))
        tokenizer = AutoTokenizer.from_pretrained(str(Path(gate.info.path) / "query_encoder"))
        enc = OnnxStates(root / graph, tokenizer, single[2], threads)
        vec, _ = enc.embed_with_states(PROBE)
        cos = float(vec @ gate.embed_query_torch(PROBE))
        if not cos >= min_cosine:  # NaN fails too
            raise ValueError(f"its graph's vector is not the gate model's (probe cosine {cos:.5f} < {min_cosine})")
    except Exception as e:  # a corrupt file raises anything from json, torch or onnxruntime
        log.error("late reader at %s unusable (%s): the argument-evidence stage is off", root, e)
        return None
    log.info("late reader: %s (%s, probe cosine to the torch vector %.5f)", graph, enc.precision, cos)
    return LateReader(head, lambda texts: enc.run(texts)[1], tokenizer, float(doc["threshold"]), doc,
                      threads=threads, max_len=single[2], encoder=enc)
