"""The trained routing model: a query encoder for the SLB and a cross-encoder behind the margin gate.

A gate model directory (written by ``training.gate.train_gate``) holds

    gate.json        tau, alpha, ce_top_k, the hyper-parameters, data hash and validation figures
    query_encoder/   SentenceTransformer fine-tuned to map requests onto the *base* all-MiniLM-L6-v2
                     tool-text keys (asymmetric: tool keys stay the compiler's embeddings)
    cross_encoder/   sentence-transformers CrossEncoder fine-tuned from the all-MiniLM-L6-v2 weights
    query_encoder/onnx/sentence_embedding.onnx
                     the query encoder + pooling for one request on onnxruntime (services/router/onnx_encoder.py;
                     exported by training, also into a cached model without it); absent: torch embeds

The serving form that ships in models/gate (``training.ship``) keeps what the router runs: gate.json, the
exemplars (vectors at float16), the query encoder's tokenizer and INT8 graph and ``query_encoder/probe.json`` (its
truncation length and the torch vector the graph is checked against at load); no torch weights and no cross-encoder (alpha is 0).

Decision rule: SLB top-1 wins outright when ``top1 - top2 >= tau``; otherwise the top ``ce_top_k``
candidates are scored by the cross-encoder and re-ranked by ``slb_score + alpha * ce_logit``. The SLB
score itself may use each tool's alternate key and a lexical addend (``gate.json`` ``slb``: ``alt_keys``,
``lexical_weight``, chosen on validation by ``training.calibrate_slb``; services/router/keys.py).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from services.common.tools import Tool
from services.router import onnx_encoder

log = logging.getLogger("nexus.router")

GATE_FORMAT = "nexus-gate-v1"
PROBE_FILE = "probe.json"
CE_DESC_WORDS = 16


def ce_tool_text(tool: Tool) -> str:
    """The tool side of a cross-encoder pair: the name read as words and the description's first sentence
    (short inputs keep the cross-encoder fast)."""
    desc = re.sub(r"\s+", " ", tool.description or "").strip()
    first = re.split(r"(?<=[.!?])\s", desc, maxsplit=1)[0]
    words = first.split(" ")[:CE_DESC_WORDS]
    return f"{tool.name.replace('_', ' ').replace('-', ' ')}: {' '.join(words)}"


def set_threads(n: int) -> None:
    import torch

    if n > 0 and torch.get_num_threads() != n:
        torch.set_num_threads(n)


@dataclass(frozen=True)
class GateInfo:
    path: str
    tau: float
    alpha: float
    ce_top_k: int
    max_turns: int
    meta: dict[str, Any]
    alt_keys: bool = False
    lexical_weight: float = 0.0
    # weight of the best exemplar key in the SLB score (chosen on validation; 0 = text keys only)
    exemplar_weight: float = 0.0
    # exemplar score offset from the key score for tools without exemplars (registered after training)
    exemplar_gap: float = 0.0
    # pooling of a tool's exemplar sims: 0 = their max, T > 0 = their log-mean-exp at temperature T
    exemplar_temperature: float = 0.0
    # a score addend per trained tool (by its name in training), calibrated with the exemplar weight
    tool_bias: Mapping[str, float] = field(default_factory=dict)
    # {trained tool name: schema hash}: what each trained tool is (exemplars and bias follow the hash, not the name)
    tool_schemas: Mapping[str, str] = field(default_factory=dict)


class GateModel:
    """A loaded gate model. ``embed_query`` and ``ce_scores`` are thread-safe (one lock: the tokenizers are not,
    and the two cores are better spent on one forward pass at a time)."""

    def __init__(self, path: str | Path, threads: int = 2, precision: str = "fp32"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        root = Path(path)
        doc = json.loads((root / "gate.json").read_text())
        if doc.get("format") != GATE_FORMAT:
            raise ValueError(f"{root}/gate.json: format {doc.get('format')!r}, expected {GATE_FORMAT!r}")
        self.info = GateInfo(path=str(root), tau=float(doc["tau"]), alpha=float(doc["alpha"]),
                             ce_top_k=int(doc["ce_top_k"]), max_turns=int(doc.get("max_turns", 4)), meta=doc,
                             alt_keys=bool(doc.get("slb", {}).get("alt_keys", False)),
                             lexical_weight=float(doc.get("slb", {}).get("lexical_weight", 0.0)),
                             exemplar_weight=float(doc.get("slb", {}).get("exemplar_weight", 0.0)),
                             exemplar_gap=float(doc.get("slb", {}).get("exemplar_gap", 0.0)),
                             exemplar_temperature=float(doc.get("slb", {}).get("exemplar_temperature", 0.0)),
                             tool_bias={str(k): float(v) for k, v in
                                        (doc.get("slb", {}).get("tool_bias") or {}).items()},
                             tool_schemas={str(k): str(v) for k, v in (doc.get("tool_schemas") or {}).items()})
        self._ce_path, self._ce_max_len = root / "cross_encoder", int(doc.get("ce_max_len", 96))
        if self.info.alpha > 0 and not self._ce_path.is_dir():
            raise ValueError(f"{root}/gate.json fuses the cross-encoder (alpha {self.info.alpha:g}) but {root} has "
                             "no cross_encoder/")
        self._ce = None  # the CrossEncoder, loaded at its first use: with alpha = 0 it is never used
        self._lock = threading.Lock()
        qdir = root / "query_encoder"
        self.onnx: onnx_encoder.OnnxQueryEncoder | None = None
        if not (qdir / "model.safetensors").is_file():
            self._load_serving_form(qdir, threads, precision)
            return
        from sentence_transformers import SentenceTransformer

        set_threads(threads)
        self.query_encoder = SentenceTransformer(str(qdir), device="cpu")
        self.query_encoder.eval()
        self.dim = int((getattr(self.query_encoder, "get_embedding_dimension", None)
                        or self.query_encoder.get_sentence_embedding_dimension)())
        self._single = _single_query_path(self.query_encoder)
        if self._single is not None:
            tokenizer, _, max_len = self._single
            self.onnx = onnx_encoder.load(qdir, tokenizer, max_len, threads, self._torch_single, precision)

    def _load_serving_form(self, qdir: Path, threads: int, precision: str) -> None:
        """The serving form (what models/gate ships, ``training.ship``): the query encoder's tokenizer, its
        ONNX graph and ``probe.json`` (its truncation length and the torch vector of ``onnx_encoder.PROBE``, which the
        graph must reproduce),
        no torch weights: every request is embedded on onnxruntime."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(qdir))
        probe = json.loads((qdir / PROBE_FILE).read_text())
        max_len = int(probe["max_len"])  # the encoder's truncation
        if probe.get("text") != onnx_encoder.PROBE:
            raise ValueError(f"{qdir}/{PROBE_FILE} is the vector of another probe text")
        self._probe = np.asarray(probe["vector"], np.float32)
        self.query_encoder = None
        self.dim = int(self._probe.shape[0])
        self._single = (tokenizer, None, max_len)
        self.onnx = onnx_encoder.load(qdir, tokenizer, max_len, threads, lambda _text: self._probe, precision)
        if self.onnx is None:
            raise ValueError(f"{qdir} holds no usable ONNX graph at {precision} and no torch weights (the shipped "
                             "gate model carries its INT8 graph only; `make train` writes the full model)")

    @functools.cached_property
    def fingerprint(self) -> str:
        """What the query encoder's vectors are keyed by in the store (its files' bytes): tool keys embedded with it
        (a model built on a given encoder, gate.json tool_keys) are cached under it."""
        from services.common.models import dir_fingerprint

        return dir_fingerprint(Path(self.info.path) / "query_encoder")

    def probe_vector(self) -> np.ndarray:
        """The query encoder's fp32 (torch) vector of ``onnx_encoder.PROBE``: what a graph of this encoder must give."""
        return self._probe if self.query_encoder is None else self._torch_single(onnx_encoder.PROBE)

    @property
    def query_stack(self) -> tuple[Any, Any, int] | None:
        """(tokenizer, transformer, max length) when the query encoder is the plain Transformer + mean pooling
        (+ normalize) stack a graph of our own reproduces (the ONNX export), else
        None. The serving form has no torch weights: its transformer is None."""
        return self._single

    @staticmethod
    def exists(path: str | Path) -> bool:
        root = Path(path)
        return (root / "gate.json").is_file() and (root / "query_encoder").is_dir()

    def exemplar_keys(self) -> dict[str, np.ndarray]:
        """The model's exemplar keys per tool: the requests of ``exemplars.jsonl`` as embedded at calibration
        (``exemplars.npy``); embedded now, slower, when a model has the texts only. ``{}`` when it has none."""
        root = Path(self.info.path)
        path = root / "exemplars.jsonl"
        if not path.is_file():
            return {}
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        vecs = None
        if (root / "exemplars.npy").is_file():
            vecs = np.load(root / "exemplars.npy")  # float16 in the serving form: below the SLB's INT8 step
            dim = self.dim
            if vecs.shape != (len(rows), dim):
                log.warning("%s/exemplars.npy has shape %s, expected %s: embedding the exemplars again", root,
                            vecs.shape, (len(rows), dim))
                vecs = None
        if vecs is None:
            vecs = self.embed_queries([r["text"] for r in rows]) if rows else np.zeros((0, 1), np.float32)
        return exemplar_groups([r["tool"] for r in rows], vecs)

    def by_schema(self, per_tool: Mapping[str, Any]) -> dict[str, Any]:
        """``per_tool`` (keyed by trained tool name: exemplar keys, bias) re-keyed by the trained tools' schema
        hashes. A model without ``tool_schemas`` (trained before it existed) gives ``{}``: its per-tool data could
        only be matched by name, and a user's tool that merely shares a name must not inherit it."""
        schemas = self.info.tool_schemas
        return {schemas[n]: v for n, v in per_tool.items() if n in schemas}

    def embed_queries(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        if self.query_encoder is None:  # the serving form: one request at a time through its graph
            with self._lock:
                vecs = [self.onnx.embed(t) for t in texts]
            return np.ascontiguousarray(np.stack(vecs) if vecs else np.zeros((0, self.dim)), dtype=np.float32)
        with self._lock:
            v = self.query_encoder.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                          normalize_embeddings=True, show_progress_bar=False)
        return np.ascontiguousarray(v, dtype=np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        """One request's vector: onnxruntime when the model has its export (same vector, tested; the torch
        forward pass was most of a Route's latency), else ``embed_query_torch``."""
        if self.onnx is None:
            return self.embed_query_torch(text)
        with self._lock:
            return self.onnx.embed(text)

    def embed_query_torch(self, text: str) -> np.ndarray:
        """One request's vector with torch, the reference the ONNX path is checked against. For the common
        Transformer → mean pooling (→ normalize) stack, one forward pass without ``encode``'s batching
        machinery (~3 ms of a ~17 ms call here; same vector, tested)."""
        if self.query_encoder is None:
            raise ValueError(f"the gate model at {self.info.path} is the serving form: no torch weights")
        if self._single is None:
            return self.embed_queries([text])[0]
        with self._lock:
            return self._torch_single(text)

    def _torch_single(self, text: str) -> np.ndarray:
        import torch

        tokenizer, transformer, max_len = self._single
        with torch.inference_mode():
            feats = tokenizer([text], return_tensors="pt", truncation=True, max_length=max_len)
            v = transformer(**feats).last_hidden_state[0].mean(dim=0)  # one sequence: no padding to mask
            v = torch.nn.functional.normalize(v, dim=0)
        return np.ascontiguousarray(v.numpy(), dtype=np.float32)

    @property
    def cross_encoder(self):
        """The cross-encoder, loaded on first use (a router whose gate has alpha = 0 never loads it)."""
        if self._ce is None:
            from sentence_transformers import CrossEncoder

            with self._lock:
                if self._ce is None:
                    ce = CrossEncoder(str(self._ce_path), device="cpu", max_length=self._ce_max_len)
                    ce.model.eval()
                    self._ce = ce
        return self._ce

    def ce_scores(self, query_text: str, tool_texts: list[str]) -> np.ndarray:
        """Cross-encoder logits of ``(query, tool)`` pairs."""
        if not tool_texts:
            return np.zeros(0, np.float32)
        import torch

        ce = self.cross_encoder
        with self._lock, torch.inference_mode():
            s = ce.predict([(query_text, t) for t in tool_texts], batch_size=len(tool_texts),
                                           show_progress_bar=False, convert_to_numpy=True,
                                           activation_fn=torch.nn.Identity())
        return np.asarray(s, np.float32).reshape(-1)


def exemplar_groups(tools_of: Sequence[str], vecs: np.ndarray) -> dict[str, np.ndarray]:
    """Exemplar keys per tool: the rows of ``vecs`` grouped by the tool each row's request routes to."""
    rows: dict[str, list[int]] = {}
    for i, t in enumerate(tools_of):
        rows.setdefault(t, []).append(i)
    return {t: np.asarray(vecs[r], np.float32) for t, r in rows.items()}


def _single_query_path(model) -> tuple[Any, Any, int] | None:
    """(tokenizer, transformer, max length) when ``model`` is exactly Transformer + mean Pooling (+ Normalize),
    else None (``encode`` is used)."""
    try:
        from sentence_transformers.models import Normalize, Pooling, Transformer
    except ImportError:  # pragma: no cover - older sentence-transformers layout
        return None
    mods = list(model)
    if len(mods) not in (2, 3) or not isinstance(mods[0], Transformer) or not isinstance(mods[1], Pooling):
        return None
    if len(mods) == 3 and not isinstance(mods[2], Normalize):
        return None
    pool = mods[1].get_config_dict()
    if pool.get("pooling_mode") not in (None, "mean") and not pool.get("pooling_mode_mean_tokens"):
        return None
    if any(pool.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_lasttoken",
                                 "pooling_mode_weightedmean_tokens", "pooling_mode_mean_sqrt_len_tokens")):
        return None
    return model.tokenizer, mods[0].auto_model, int(model.max_seq_length)


def export_query_onnx(encoder_dir: str | Path, model=None) -> Path | None:
    """Export a saved query encoder for ``embed_query`` on onnxruntime, and its INT8 quantization beside it
    (training's hook, run on fresh and cached models). None, logged, when it cannot be: the router then embeds with
    torch, which is only slower; a failed quantization is logged and leaves the fp32 export."""
    if model is None:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(encoder_dir), device="cpu")
    single = _single_query_path(model)
    if single is None:
        log.warning("query encoder %s is not Transformer + mean pooling: not exported to ONNX", encoder_dir)
        return None
    tokenizer, transformer, _ = single
    try:
        out = onnx_encoder.export(transformer, tokenizer, encoder_dir)
    except (ImportError, RuntimeError, OSError) as e:  # onnx missing: torch.onnx raises a RuntimeError
        log.warning("query encoder %s not exported to ONNX (%s): the router embeds with torch", encoder_dir, e)
        return None
    quantize_query_onnx(encoder_dir)
    return out


def quantize_query_onnx(encoder_dir: str | Path) -> Path | None:
    """The INT8 graph of an exported query encoder (``onnx_encoder.quantize``), or None, logged: a router asked
    for int8 then embeds at fp32."""
    try:
        return onnx_encoder.quantize(encoder_dir)
    except Exception as e:  # onnxruntime's quantizer raises its own and onnx's exception types
        log.warning("query encoder %s not quantized to INT8 (%s): query_encoder_precision=int8 embeds at fp32",
                    encoder_dir, e)
        return None


def fuse(slb_scores: np.ndarray, ce_logits: np.ndarray, alpha: float) -> np.ndarray:
    """The re-ranking score of escalated candidates: the SLB score plus ``alpha`` times the CE logit."""
    return np.asarray(slb_scores, np.float32) + np.float32(alpha) * np.asarray(ce_logits, np.float32)


def load_gate(path: str, threads: int = 2, precision: str = "fp32") -> GateModel | None:
    """The gate model at ``path``, or None (logged) when there is none or it cannot be read."""
    if not path:
        log.warning("no gate model configured: routing is SLB-only (escalation disabled)")
        return None
    if not GateModel.exists(path):
        log.warning("no gate model at %s: routing is SLB-only with the base embedder (escalation disabled); "
                    "train one with `nexus train-gate`", path)
        return None
    try:
        return GateModel(path, threads=threads, precision=precision)
    except (OSError, ValueError, KeyError) as e:
        log.error("gate model at %s unreadable (%s): routing is SLB-only (escalation disabled)", path, e)
        return None
