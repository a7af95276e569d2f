"""Training the gate model (query encoder + cross-encoder + tau) from routing queries.

    lines ──split(seed)──► fit (1 - val_fraction)  ──► query encoder: all-MiniLM-L6-v2 fine-tuned so a
                      │                                 request scores its tool's *base* text key highest
                      │                                 (softmax over every tool key, temperature q_temp)
                      │                             ──► cross-encoder: all-MiniLM-L6-v2 weights + a new head,
                      │                                 listwise softmax over [positive, hard negatives mined
                      │                                 from the tuned SLB]
                      └► val (calibration + validation; never trained on)
                                                    ──► best query-encoder epoch (val SLB top-1)
                                                    ──► tau = q-th percentile of val top1-top2 margins
                                                    ──► best CE epoch and alpha (val re-rank accuracy)
                                                    ──► SLB scoring (calibrate_slb): exemplar-key weight (the
                                                        fit + extra requests of each tool) and a per-tool bias,
                                                        or alternate key on/off and lexical weight (val top-1, then
                                                        MRR), then tau and
                                                        alpha again under that scoring (gate.json "slb"; a cached
                                                        model without it is calibrated in place, no retraining)

Deterministic for a seed on one machine: seeded shuffles, ``torch.manual_seed``, fixed thread count,
no dropout randomness across runs (seeded), sorted inputs.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.common.embedder import KEY_TEXTS, NAME_DESC, key_text
from services.common.models import default_embedder_path, dir_fingerprint
from services.common.tools import Tool
from services.router.context import routing_text
from services.router.gate import (
    GATE_FORMAT,
    ce_tool_text,
    exemplar_groups,
    export_query_onnx,
    fuse,
    quantize_query_onnx,
    set_threads,
)
from services.router.keys import ALT_KEY_VERSION, LexicalIndex, alt_tool_text, query_part
from services.router.onnx_encoder import INT8_METHOD, int8_method, onnx_path
from services.router.slb import SemanticIndex, pool_exemplars

log = logging.getLogger("nexus.router.training")

TRAINING_VERSION = "gate-train-v1"
# Calibration of the SLB scoring (alternate keys, lexical weight) and of tau / alpha under it, on the
# validation split of a trained model: cheap (no training), so a cached model is calibrated in place.
# v2: the cross-encoder must gain CE_MIN_GAIN on validation; v3: exemplar keys (the fit + augment requests) and
# their weight (EXEMPLAR_GRID), written with the model as exemplars.jsonl + exemplars.npy; v4: ties of validation
# top-1 broken by mean reciprocal rank, and the exemplar gap of tools registered after training; v5: exemplar keys
# with the description key only (no alternate key, no lexical addend); v6: the calibration lines (held-out
# hand-written requests, ``data/routing_calibration``) join the validation lines for every calibrated choice; v7: the
# exemplar pooling's temperature (EXEMPLAR_TEMPERATURES) and weights past 1.5, chosen on those 1,400+ lines
# v8: a score addend per tool (``tool_bias``, fitted on the exemplar requests left out one at a time; its L2 strength
# from TOOL_BIAS_MU, or none) chosen on the same lines
SLB_CALIBRATION_VERSION = "slb-cal-v8"
# The cross-encoder is switched on (alpha > 0) only when its best fused re-rank beats alpha = 0 by this much
# validation accuracy: an escalation costs ~55 ms on this VM (gRPC p99 30.7 -> 95 ms at 16 % escalated), and the
# production model of session 5 chose alpha 0.05 for +1.4 points (2 of 144 lines) that no fold reproduced.
CE_MIN_GAIN = 0.02
LEXICAL_GRID: tuple[float, ...] = (0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)
# Weights of the pooled exemplar keys (score = key + w * pooled exemplar sims); docs/experiments/routing_experiments.md §14
# found 0.5 and 0.75 on two folds' validation lines. With w > 0 the key is the description key alone and there is no
# lexical addend (the recipe of §14): searched jointly, the ~100 validation lines of a fold picked noisy mixes of
# all three (§15: 87.1 % held-out at N = 250), so the alternate key and the lexical weight are searched at w = 0 only.
# Past 1.5 (v7): the calibration lines' top-1 keeps rising with w, and with a smooth pooling it carries over to
# held-out lines (§17: 89.6 -> 90.5 % at N = 250 over 3 draws); with max pooling a larger w is no better (§16-17).
EXEMPLAR_GRID: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0)
# Temperatures of the exemplar pooling (slb.pool_exemplars): 0 = the best exemplar alone, T > 0 = log-mean-exp.
EXEMPLAR_TEMPERATURES: tuple[float, ...] = (0.0, 0.01, 0.02, 0.03, 0.05)
# L2 strengths of the per-tool bias fit (``fit_tool_bias``), weakest bias first; no bias is tried before all of them.
# docs/experiments/reports/routing_rescore.json: the three folds' calibration lines chose 1, 0.1, 1 (folds 0 and 2: a bias of ~1e-3,
# i.e. none; fold 1: +1.6 points held-out at N = 250, 15 lines fixed, none broken)
TOOL_BIAS_MU: tuple[float, ...] = (1.0, 0.1, 0.01, 0.001)
# inverse temperature of the softmax the bias is fitted under (the SLB's own, fitted on fold 0's rows: ~6)
TOOL_BIAS_BETA = 10.0
# depth of the ranking whose mean reciprocal rank breaks ties between settings of equal validation top-1
MRR_DEPTH = 10


@dataclass(frozen=True)
class GateHyperParams:
    seed: int = 0
    val_fraction: float = 0.15
    # query encoder (SLB side)
    q_epochs: int = 3
    q_lr: float = 4e-5
    q_batch: int = 32
    q_temp: float = 0.05
    q_max_len: int = 96
    # cross-encoder (gate side)
    ce_epochs: int = 1
    ce_lr: float = 8e-5
    ce_negatives: int = 3
    ce_batch_groups: int = 8
    ce_max_len: int = 64
    ce_top_k: int = 5
    ce_head_lr_mult: float = 20.0
    # the cross-encoder also trains on the extra (augment) lines, not only the real fit lines
    ce_extra: bool = False
    alpha_grid: tuple[float, ...] = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
    # margin gate
    tau_percentile: float = 20.0
    max_turns: int = 4
    threads: int = 2
    # The encoder every vector starts from: "" = all-MiniLM-L6-v2 (the wheel), else a sentence-transformers directory
    # (training/public.py's encoder, trained on public tools only). With one, the tool keys are that encoder's own
    # vectors of the tool texts (gate.json tool_keys = "query_encoder": the router embeds them with the gate model's
    # graph); q_epochs = 0 keeps the encoder as trained (nothing of the registry's lines in its weights) and
    # ce_epochs = 0 trains no cross-encoder (alpha 0).
    encoder: str = ""
    # The text each tool is keyed by (services.common.embedder.KEY_TEXTS; gate.json tool_text tells the router):
    # "" = the encoder's own document form when it names one (training.public encoders learnt tools as tool_doc,
    # parameters included: public_meta.json "doc"), else "name-desc" (tool_text, "name: description").
    tool_text: str = ""


# The shipped gate model (training/recipes.py): built on the router's encoder (``make train`` passes its directory as
# ``encoder``), whose weights it keeps, with no cross-encoder. Only the SLB's calibration is fitted here.
SHIPPED_GATE = GateHyperParams(q_epochs=0, ce_epochs=0)


def base_encoder_path(hp: GateHyperParams) -> Path:
    """The directory every vector of a gate model starts from (``GateHyperParams.encoder``)."""
    from services.common.models import resolve_embedder

    return resolve_embedder(hp.encoder)


def hp_dict(hp: GateHyperParams) -> dict[str, Any]:
    """The hyper-parameters as hashed: a switch at its default stays out (models trained before it existed keep
    their hash, and the shipped recipe its key)."""
    return {k: v for k, v in asdict(hp).items() if not (k in ("ce_extra", "encoder", "tool_text") and not v)}


@dataclass(frozen=True)
class Example:
    """One training line: the request text (query + pruned history) and its label (+ equivalent labels)."""

    id: str
    text: str
    tool: str
    positives: frozenset[str]




def warmup_linear(opt, total_steps: int, warm_fraction: float = 0.1):
    """The learning-rate schedule of the fine-tunes here: linear warm-up over the first ``warm_fraction`` of
    ``total_steps`` (at least one step), then linear decay to 0."""
    import torch

    total = max(1, total_steps)
    warm = max(1, int(warm_fraction * total))
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * max(0.0, (total - s) / total))


def _optimizer_step(opt, sched, loss, losses: list[float], bar) -> None:
    """One optimisation step of either tower: backward, step, schedule, and the progress bar's loss."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    losses.append(float(loss.detach()))
    bar.update(1)
    bar.set_postfix(loss=f"{np.mean(losses[-10:]):.3f}")

def make_examples(lines: Sequence[Any], tool_names: set[str], equivalents: Callable[[str], frozenset[str]],
                  max_turns: int = 4) -> list[Example]:
    """Examples from query lines (objects with ``id, tool, query, history``) whose tool is registered."""
    out = []
    for ln in lines:
        if ln.tool not in tool_names:
            continue
        out.append(Example(ln.id, routing_text(ln.query, list(ln.history), max_turns=max_turns), ln.tool,
                           frozenset(equivalents(ln.tool)) & tool_names | {ln.tool}))
    return out


def key_form(hp: GateHyperParams) -> str:
    """The text form the tool keys embed (``GateHyperParams.tool_text``, resolved)."""
    if hp.tool_text:
        key_text(hp.tool_text)  # an unknown form fails here, before any training
        return hp.tool_text
    meta = Path(hp.encoder) / "public_meta.json" if hp.encoder else None
    doc = json.loads(meta.read_text()).get("doc") if meta is not None and meta.is_file() else None
    return str(doc) if doc in KEY_TEXTS else NAME_DESC


def data_hash(examples: Sequence[Example], tools: Sequence[Tool], hp: GateHyperParams, base_fp: str,
              extra: Sequence[Example] = ()) -> str:
    h = hashlib.sha256()
    h.update(TRAINING_VERSION.encode())
    h.update(base_fp.encode())
    if key_form(hp) != NAME_DESC:  # keys of another text (the default's hash stays what it was)
        h.update(f"keys:{key_form(hp)}".encode())
    # a switch at its default stays out of the hash (models trained before it existed keep their cache)
    h.update(json.dumps(hp_dict(hp), sort_keys=True).encode())
    for e in sorted(examples, key=lambda e: e.id):
        h.update(json.dumps([e.id, e.text, e.tool, sorted(e.positives)]).encode())
    for t in sorted(tools, key=lambda t: t.name):
        h.update(t.schema_hash.encode())
    if extra:  # fit-only lines (absent: the hash of a model trained without any stays what it was)
        h.update(b"extra")
        for e in sorted(extra, key=lambda e: e.id):
            h.update(json.dumps([e.id, e.text, e.tool, sorted(e.positives)]).encode())
    return h.hexdigest()


def split_examples(examples: Sequence[Example], val_fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Seeded split by line: ``(fit, val)``."""
    ids = sorted(e.id for e in examples)
    rng = random.Random(seed)
    rng.shuffle(ids)
    n_val = int(round(len(ids) * val_fraction)) if len(ids) > 1 else 0
    val_ids = set(ids[:n_val])
    return [e for e in examples if e.id not in val_ids], [e for e in examples if e.id in val_ids]


def _seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", disable=not enabled, file=sys.stderr, leave=True)


def _encode_train(model, texts: list[str]):
    import torch.nn.functional as F

    feats = model.preprocess(texts) if hasattr(model, "preprocess") else model.tokenize(texts)
    feats = {k: v for k, v in feats.items() if hasattr(v, "to")}
    return F.normalize(model(feats)["sentence_embedding"], dim=-1)


def _encode_eval(model, texts: list[str], bs: int = 64) -> np.ndarray:
    v = model.encode(texts, batch_size=bs, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
    return np.ascontiguousarray(v, np.float32)


def _positive_mask(examples: Sequence[Example], names: list[str]) -> np.ndarray:
    pos = {n: i for i, n in enumerate(names)}
    m = np.zeros((len(examples), len(names)), bool)
    for r, e in enumerate(examples):
        for p in e.positives:
            if p in pos:
                m[r, pos[p]] = True
    return m


def slb_rank(index: SemanticIndex, qvecs: np.ndarray, k: int) -> list[list[tuple[str, float]]]:
    return [index.search(q, k) for q in qvecs]


def pooled_scores(q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Query-tool scores: cosine against ``keys`` ``(n_tools, d)``, or the max over a tool's keys when
    ``keys`` is ``(n_variants, n_tools, d)`` (several texts per tool, as the SLB scores them)."""
    if keys.ndim == 2:
        return q @ keys.T
    return np.max(np.einsum("nd,vtd->vnt", q, keys), axis=0)


def train_query_encoder(fit: list[Example], val: list[Example], names: list[str], keys: np.ndarray,
                        hp: GateHyperParams, progress: bool) -> tuple[Any, dict[str, Any]]:
    """Fine-tune all-MiniLM-L6-v2 as the query side of an asymmetric retriever against fixed tool keys
    (``(n_tools, d)``, or ``(n_variants, n_tools, d)``: a tool scores the max over its keys, see
    ``pooled_scores``); keeps the epoch with the best validation top-1."""
    import torch
    from sentence_transformers import SentenceTransformer

    _seed_all(hp.seed)
    model = SentenceTransformer(str(base_encoder_path(hp)), device="cpu")
    model.max_seq_length = hp.q_max_len
    K = torch.tensor(keys)
    pos_fit = torch.tensor(_positive_mask(fit, names))
    pos_val = _positive_mask(val, names)
    opt = torch.optim.AdamW(model.parameters(), lr=hp.q_lr, weight_decay=0.01)
    total = max(1, hp.q_epochs * ((len(fit) + hp.q_batch - 1) // hp.q_batch))
    sched = warmup_linear(opt, total)

    def val_top1() -> float:
        if not val:
            return float("nan")
        model.eval()
        s = pooled_scores(_encode_eval(model, [e.text for e in val]), keys)
        return float(pos_val[np.arange(len(val)), s.argmax(1)].mean())

    history = [{"epoch": 0, "val_slb_top1": val_top1()}]
    best = (history[0]["val_slb_top1"], 0, copy.deepcopy(model.state_dict()))
    order = list(range(len(fit)))
    with _progress(total, "query encoder", progress) as bar:
        for ep in range(hp.q_epochs):
            random.Random(hp.seed * 1000 + ep).shuffle(order)
            model.train()
            losses = []
            for b in range(0, len(order), hp.q_batch):
                idx = order[b : b + hp.q_batch]
                q = _encode_train(model, [fit[i].text for i in idx])
                logits = (q @ K.T if K.dim() == 2 else torch.einsum("nd,vtd->vnt", q, K).amax(0)) / hp.q_temp
                pm = pos_fit[idx]
                # several equivalent tools may all be right: maximise the probability mass on them
                loss = (torch.logsumexp(logits, 1) - torch.logsumexp(logits.masked_fill(~pm, -1e4), 1)).mean()
                _optimizer_step(opt, sched, loss, losses, bar)
            acc = val_top1()
            history.append({"epoch": ep + 1, "loss": float(np.mean(losses)), "val_slb_top1": acc})
            if not val or acc > best[0] or np.isnan(best[0]):
                best = (acc, ep + 1, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[2])
    model.eval()
    return model, {"history": history, "best_epoch": best[1], "val_slb_top1": best[0]}


class ListwiseCrossEncoder:
    """A CrossEncoder from the all-MiniLM-L6-v2 weights with a new one-logit head, ready to train: AdamW (the head at
    ``lr * head_lr_mult``) under the warmup-linear schedule of ``total_steps``, seeded by ``seed`` before the head
    is drawn. ``logits(pairs, grad)`` scores (request, tool text) pairs as one padded batch."""

    def __init__(self, max_len: int, lr: float, head_lr_mult: float, total_steps: int, seed: int):
        import torch
        from sentence_transformers import CrossEncoder

        _seed_all(seed)
        self.max_len = max_len
        self.ce = CrossEncoder(str(default_embedder_path()), num_labels=1, max_length=max_len, device="cpu")
        self.hf = self.ce[0].model if hasattr(self.ce[0], "model") else self.ce.model
        self.tok = self.ce[0].tokenizer if hasattr(self.ce[0], "tokenizer") else self.ce.tokenizer
        # The classification head is new (random init): a larger learning rate lets it catch up within one
        # epoch instead of leaving the logits near zero (measured: loss stuck at ln(1+negatives)).
        head = [p for n, p in self.hf.named_parameters() if n.startswith("classifier")]
        body = [p for n, p in self.hf.named_parameters() if not n.startswith("classifier")]
        self.opt = torch.optim.AdamW([{"params": body, "lr": lr}, {"params": head, "lr": lr * head_lr_mult}],
                                     weight_decay=0.01)
        self.sched = warmup_linear(self.opt, max(1, total_steps))

    def logits(self, pairs: Sequence[tuple[str, str]], grad: bool):
        import torch

        enc = self.tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, truncation="longest_first",
                       max_length=self.max_len, return_tensors="pt")
        with torch.set_grad_enabled(grad):
            return self.hf(**enc).logits.view(-1)


def train_cross_encoder(fit: list[Example], val: list[Example], fit_cands: list[list[tuple[str, float]]],
                        val_cands: list[list[tuple[str, float]]], ce_texts: dict[str, str], hp: GateHyperParams,
                        progress: bool) -> tuple[Any, dict[str, Any]]:
    """Fine-tune a CrossEncoder from the all-MiniLM-L6-v2 weights with a listwise loss over the positive and
    SLB-mined hard negatives; per epoch, validate re-ranking of the top ``ce_top_k`` fused with the SLB
    score over ``alpha_grid``; keep the best (epoch, alpha)."""
    import torch

    groups: list[tuple[str, list[str]]] = []
    for e, cands in zip(fit, fit_cands, strict=True):
        negs = [n for n, _ in cands if n not in e.positives][: hp.ce_negatives]
        groups.append((e.text, [ce_texts[e.tool]] + [ce_texts[n] for n in negs]))
    total = max(1, hp.ce_epochs * ((len(groups) + hp.ce_batch_groups - 1) // hp.ce_batch_groups))
    lce = ListwiseCrossEncoder(hp.ce_max_len, hp.ce_lr, hp.ce_head_lr_mult, total, hp.seed)
    ce, hf, opt, sched, logits_of = lce.ce, lce.hf, lce.opt, lce.sched, lce.logits

    val_pos = [e.positives for e in val]

    def validate() -> dict[str, Any]:
        if not val:
            return {"alpha": 0.0, "val_rerank_acc": float("nan"), "by_alpha": {}}
        hf.eval()
        ce_logits = []
        with torch.inference_mode():
            for e, cands in zip(val, val_cands, strict=True):
                ce_logits.append(logits_of([(e.text, ce_texts[n]) for n, _ in cands], False).numpy())
        by_alpha = {}
        for a in hp.alpha_grid:
            ok = 0
            for cands, lg, pos in zip(val_cands, ce_logits, val_pos, strict=True):
                f = fuse(np.array([s for _, s in cands]), lg, a)
                ok += cands[int(np.argmax(f))][0] in pos
            by_alpha[str(a)] = ok / len(val)
        best_a = max(hp.alpha_grid, key=lambda a: (by_alpha[str(a)], -a))
        ce_only = float(np.mean([c[int(np.argmax(lg))][0] in p for c, lg, p in zip(val_cands, ce_logits, val_pos,
                                                                                   strict=True)]))
        return {"alpha": best_a, "val_rerank_acc": by_alpha[str(best_a)], "by_alpha": by_alpha,
                "val_ce_only_acc": ce_only}

    history = []
    best: tuple[float, int, dict[str, Any], dict[str, Any]] | None = None
    order = list(range(len(groups)))
    with _progress(total, "cross-encoder", progress) as bar:
        for ep in range(hp.ce_epochs):
            random.Random(hp.seed * 1000 + 7 + ep).shuffle(order)
            hf.train()
            losses = []
            for b in range(0, len(order), hp.ce_batch_groups):
                batch = [groups[i] for i in order[b : b + hp.ce_batch_groups]]
                pairs = [(q, t) for q, ts in batch for t in ts]
                lg = logits_of(pairs, True)
                loss = lg.new_zeros(())
                at = 0
                for _, ts in batch:  # listwise softmax: the positive is element 0 of its group
                    g = lg[at : at + len(ts)]
                    loss = loss + (torch.logsumexp(g, 0) - g[0])
                    at += len(ts)
                loss = loss / len(batch)
                _optimizer_step(opt, sched, loss, losses, bar)
            v = validate()
            history.append({"epoch": ep + 1, "loss": float(np.mean(losses)) if losses else float("nan"), **v})
            if best is None or v["val_rerank_acc"] > best[0]:
                best = (v["val_rerank_acc"], ep + 1, v, copy.deepcopy(hf.state_dict()))
    assert best is not None
    hf.load_state_dict(best[3])
    hf.eval()
    return ce, {"history": history, "best_epoch": best[1], **best[2]}


def write_exemplars(out: Path, examples: Sequence[Example], vecs: np.ndarray) -> None:
    """``exemplars.jsonl`` (id, tool, text per row) and ``exemplars.npy`` (the rows' query-encoder vectors, float32),
    each replaced atomically."""
    if len(examples) != len(vecs):
        raise ValueError(f"{len(examples)} exemplars but {len(vecs)} vectors")
    tmp = out / ".exemplars.jsonl.tmp"
    tmp.write_text("".join(json.dumps({"id": e.id, "tool": e.tool, "text": e.text}) + "\n" for e in examples))
    os.replace(tmp, out / "exemplars.jsonl")
    with open(out / ".exemplars.npy.tmp", "wb") as f:
        np.save(f, np.asarray(vecs, np.float32))
    os.replace(out / ".exemplars.npy.tmp", out / "exemplars.npy")


def calibration_hash(calibration: Sequence[Example]) -> str:
    """Fingerprint of a calibration set (ids, labels, texts; order-free): a cached model calibrated on another set
    is calibrated again in place. ``""`` for none."""
    if not calibration:
        return ""
    rows = sorted((e.id, e.tool, e.text) for e in calibration)
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def calibrate_slb(qenc, ce, val: Sequence[Example], tools: Sequence[Tool], hp: GateHyperParams,
                  keys: np.ndarray | None = None, exemplars: Sequence[Example] = (),
                  exemplar_vecs: np.ndarray | None = None, calibration: Sequence[Example] = ()) -> dict[str, Any]:
    """Choose the SLB scoring on the validation split (plus the ``calibration`` lines: requests the model never
    trained on and never keys on, e.g. ``data/routing_calibration``): the description key plus ``w`` times the pooled
    exemplar keys (``exemplars``: requests that route to the tool, never a validation line; their query-encoder
    vectors ``exemplar_vecs``), ``w`` in ``EXEMPLAR_GRID``, pooled at a temperature in ``EXEMPLAR_TEMPERATURES``;
    or, at ``w = 0``, the description key alone or the max with the alternate key (``keys.alt_tool_text``), plus
    ``l`` times the lexical score, ``l`` in ``LEXICAL_GRID``. Best val
    top-1 over the whole registry; ties go to the better mean reciprocal rank, then to the simpler setting. With
    exemplars, the gap that stands in for a new tool's missing ones is measured too (``exemplar_gap``), and a per-tool
    bias is fitted on the exemplar requests (``fit_tool_bias`` at each strength of ``TOOL_BIAS_MU``) and kept when it
    beats none (top-1, then MRR; ``tool_bias``, ``tool_bias_mu``, ``by_tool_bias``). Then tau
    (margin percentile) and the cross-encoder weight alpha are re-chosen under that scoring, as ``train_gate``
    does. Every choice is made on the validation and calibration lines together (``cal``); ~100 validation lines
    alone chose noisy weights (docs/experiments/routing_experiments.md §15-16)."""
    import torch
    from sentence_transformers import SentenceTransformer

    names = [t.name for t in tools]
    by_name = {t.name: t for t in tools}
    base = SentenceTransformer(str(base_encoder_path(hp)), device="cpu")
    if keys is None:
        keys = _encode_eval(base, [key_text(key_form(hp))(by_name[n]) for n in names])
    alt = _encode_eval(base, [alt_tool_text(by_name[n]) for n in names])
    del base
    if exemplar_vecs is None:
        exemplar_vecs = _encode_eval(qenc, [e.text for e in exemplars]) if exemplars else np.zeros((0, keys.shape[1]))
    val_ids = {e.id for e in val}
    if any(e.id in val_ids for e in exemplars):
        raise ValueError("a validation line is among the exemplar keys: the exemplar weight would be chosen in-sample")
    ex_ids = {e.id for e in exemplars}
    clash = sorted(e.id for e in calibration if e.id in ex_ids or e.id in val_ids)
    if clash:
        raise ValueError(f"calibration lines must be held out of training and validation; {len(clash)} are not "
                         f"(e.g. {clash[0]})")
    cal = [*val, *calibration]
    ex_keys = exemplar_groups([e.tool for e in exemplars], exemplar_vecs)
    ex_grid = EXEMPLAR_GRID if ex_keys else (0.0,)
    def slb_index(use_alt: bool, wx: float, temp: float, gap: float = 0.0,
                  bias: Mapping[str, float] | None = None) -> SemanticIndex:
        index = SemanticIndex(keys.shape[1], exemplar_weight=wx, exemplar_gap=gap, exemplar_temperature=temp)
        if wx:
            index.set_exemplars(ex_keys)
        if use_alt:
            index.set_alt_keys({n: alt[i] for i, n in enumerate(names)})
        if bias:
            index.set_tool_bias(bias)
        index.replace_all({n: keys[i] for i, n in enumerate(names)})
        return index

    def ranks_of(index: SemanticIndex, w: float) -> tuple[float, float]:
        """Top-1 and MRR@MRR_DEPTH over ``cal`` (validation + calibration lines)."""
        ranks = [_first_hit([n for n, _ in index.search(q, MRR_DEPTH, bonus=w * lx)], e.positives)
                 for q, lx, e in zip(qv, lex, cal, strict=True)]
        return (float(np.mean([r == 1 for r in ranks])), float(np.mean([1.0 / r if r else 0.0 for r in ranks])))

    # in order of simplicity (ties keep the first): text keys, then exemplar keys by weight, max pooling first;
    # exemplar keys go with the description key alone (see EXEMPLAR_GRID)
    settings = [(use_alt, wx, temp) for use_alt in (False, True) for wx in ex_grid
                for temp in (EXEMPLAR_TEMPERATURES if wx else (0.0,)) if not (wx and use_alt)]
    lexical = LexicalIndex.of_tools([by_name[n] for n in names])
    counts = {"n_exemplars": len(exemplars), "n_exemplar_tools": len(ex_keys), "n_val": len(val),
              "n_calibration": len(calibration), "calibration_hash": calibration_hash(calibration)}
    if not cal:
        return {"version": SLB_CALIBRATION_VERSION, "alt_key": ALT_KEY_VERSION, "alt_keys": False,
                "lexical_weight": 0.0, "exemplar_weight": 0.0, **counts}
    qv = _encode_eval(qenc, [e.text for e in cal])
    lex = [lexical.scores(query_part(e.text)) for e in cal]
    by_setting: dict[str, float] = {}
    by_setting_mrr: dict[str, float] = {}
    best: tuple[float, float, bool, float, float, float] | None = None
    for use_alt, wx, temp in settings:
        index = slb_index(use_alt, wx, temp)
        for w in LEXICAL_GRID if not wx else (0.0,):
            acc, mrr = ranks_of(index, w)
            by_setting[setting_name(use_alt, w, wx, temp)] = acc
            by_setting_mrr[setting_name(use_alt, w, wx, temp)] = mrr
            # top-1 first; among equals (common on ~100 lines) the better mean reciprocal rank, then the simpler
            if best is None or (acc, mrr) > best[:2]:
                best = (acc, mrr, use_alt, w, wx, temp)
    assert best is not None
    _, _, use_alt, w, wx, temp = best
    gap = exemplar_gap(qv, cal, keys, alt if use_alt else None, names, ex_keys, temp) if wx else 0.0
    index = slb_index(use_alt, wx, temp, gap)
    # a score addend per tool, fitted on the exemplar requests (each left out of its own tool's keys), kept only when
    # it beats none on the same lines
    tool_bias: dict[str, float] = {}
    bias_mu: float | None = None
    by_bias: dict[str, float] = {}
    pos = {n: i for i, n in enumerate(names)}
    rows = [i for i, e in enumerate(exemplars) if e.tool in pos]
    if wx and rows:
        row_tool = np.array([pos[exemplars[i].tool] for i in rows])
        loo = float_tool_scores(exemplar_vecs[rows], keys, exemplar_vecs[rows], row_tool, wx, temp, gap,
                                leave_out=np.arange(len(rows)))
        right = np.zeros(loo.shape, bool)
        for r, i in enumerate(rows):
            right[r, [pos[n] for n in exemplars[i].positives | {exemplars[i].tool} if n in pos]] = True
        base_key = ranks_of(index, 0.0)
        by_bias["none"] = base_key[0]
        for mu in TOOL_BIAS_MU:
            b = fit_tool_bias(loo, right, mu)
            cand = {n: round(float(b[j]), 6) for j, n in enumerate(names) if b[j] != 0.0}
            got = ranks_of(slb_index(use_alt, wx, temp, gap, cand), 0.0)
            by_bias[f"{mu:g}"] = got[0]
            if got > base_key:
                base_key, bias_mu, tool_bias = got, mu, cand
        if tool_bias:
            index = slb_index(use_alt, wx, temp, gap, tool_bias)
    cands = [index.search(q, max(hp.ce_top_k, 2), bonus=w * lx) for q, lx in zip(qv, lex, strict=True)]
    margins = np.array([c[0][1] - c[1][1] for c in cands if len(c) > 1], np.float32)
    tau = float(np.percentile(margins, hp.tau_percentile)) if len(margins) else 0.0
    ce_texts = {n: ce_tool_text(by_name[n]) for n in names}
    if ce is None:  # no cross-encoder: every weight but 0 scores as 0 (it cannot change a decision)
        logits = [np.zeros(len(c[: hp.ce_top_k]), np.float32) for c in cands]
    else:
        with torch.inference_mode():
            logits = [ce.predict([(e.text, ce_texts[n]) for n, _ in c[: hp.ce_top_k]], show_progress_bar=False,
                                 activation_fn=torch.nn.Identity(), convert_to_numpy=True)
                      for e, c in zip(cal, cands, strict=True)]
    by_alpha = {}
    for a in hp.alpha_grid:
        ok = 0
        for e, c, lg in zip(cal, cands, logits, strict=True):
            top = c[: hp.ce_top_k]
            ok += top[int(np.argmax(fuse(np.array([s for _, s in top]), lg, a)))][0] in e.positives
        by_alpha[str(a)] = ok / len(cal)
    alpha = choose_alpha(by_alpha, hp.alpha_grid)
    gated_ok = escalated = 0
    for e, c, lg in zip(cal, cands, logits, strict=True):
        pick = c[0][0]
        if len(c) > 1 and c[0][1] - c[1][1] < tau and alpha > 0:
            escalated += 1
            top = c[: hp.ce_top_k]
            pick = top[int(np.argmax(fuse(np.array([s for _, s in top]), lg, alpha)))][0]
        gated_ok += pick in e.positives
    # the chosen scoring's top-1 on the real validation lines alone (the first len(val) of cal), for comparison
    real_top1 = float(np.mean([c[0][0] in e.positives for e, c in zip(val, cands, strict=False)])) if val else None
    return {"version": SLB_CALIBRATION_VERSION, "alt_key": ALT_KEY_VERSION, "alt_keys": bool(use_alt),
            "lexical_weight": float(w), "exemplar_weight": float(wx), "exemplar_gap": gap,
            "exemplar_temperature": float(temp), "tool_bias": tool_bias, "tool_bias_mu": bias_mu,
            "by_tool_bias": by_bias, **counts,
            "val_slb_top1": best[0], "val_slb_mrr": best[1], "val_slb_top1_real_lines": real_top1,
            "by_setting": by_setting, "by_setting_mrr": by_setting_mrr,
            "tau": tau, "alpha": float(alpha), "by_alpha": by_alpha, "ce_min_gain": CE_MIN_GAIN,
            "val_gated_accuracy": gated_ok / len(cal), "val_escalation_rate": escalated / len(cal)}


def float_tool_scores(q: np.ndarray, keys: np.ndarray, ex_v: np.ndarray, tool_of_row: np.ndarray, w: float,
                      temp: float, gap: float, leave_out: np.ndarray | None = None) -> np.ndarray:
    """The SLB's scores in float (queries x tools): ``key + w * pooled exemplar sims``, pooled by
    ``slb.pool_exemplars`` at ``temp`` (``tool_of_row``: each exemplar row's tool index); a tool without exemplars
    scores ``key + w * (key + gap)``. ``leave_out``: per query the exemplar row to drop (-1: none), as if that
    request had never been a key. The INT8 scan differs in the third decimal."""
    order = np.argsort(tool_of_row, kind="stable")
    tools, starts, counts = np.unique(tool_of_row[order], return_index=True, return_counts=True)
    key = q @ keys.T
    sims = (q @ ex_v.T)[:, order]
    best = key + gap
    if leave_out is None:
        best[:, tools] = pool_exemplars(sims, starts, temp, counts)
        return (key + w * best).astype(np.float32)
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    for r in range(len(q)):  # per query: its own row out of its tool's group (the group shrinks by one)
        i = int(leave_out[r])
        if i < 0:
            best[r, tools] = pool_exemplars(sims[r], starts, temp, counts)
            continue
        j = inv[i]
        keep = np.ones(len(order), bool)
        keep[j] = False
        c = counts.copy()
        c[int(np.searchsorted(starts, j, side="right") - 1)] -= 1
        live = c > 0  # a tool whose only exemplar left scores as a tool without exemplars
        best[r, tools[live]] = pool_exemplars(sims[r, keep], np.concatenate([[0], np.cumsum(c[live])[:-1]]), temp,
                                              c[live])
    return (key + w * best).astype(np.float32)


def fit_tool_bias(scores: np.ndarray, right: np.ndarray, mu: float, beta: float = TOOL_BIAS_BETA, steps: int = 300,
                  lr: float = 0.05) -> np.ndarray:
    """A score addend per tool: ``b`` maximising mean log P(right) under softmax(beta * (scores + b)) - mu * |b|^2
    (Adam, from 0). ``scores``: requests x tools; ``right``: requests x tools, True for every right tool of a
    request. A tool no request belongs to keeps 0 (it has no evidence either way)."""
    m = scores.shape[1]
    b = np.zeros(m, np.float64)
    mom, vel = np.zeros(m), np.zeros(m)
    seen = right.any(axis=0)
    for it in range(1, steps + 1):
        z = beta * (scores + b)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        pr = np.where(right, p, 0.0)
        post = pr / np.maximum(pr.sum(axis=1, keepdims=True), 1e-30)  # the right tools' share of P(right)
        grad = -beta * (post - p).mean(axis=0) + 2 * mu * b
        mom = 0.9 * mom + 0.1 * grad
        vel = 0.999 * vel + 0.001 * grad**2
        b -= lr * (mom / (1 - 0.9**it)) / (np.sqrt(vel / (1 - 0.999**it)) + 1e-8)
        b[~seen] = 0.0
    return b.astype(np.float32)


def _first_hit(ranked: Sequence[str], positives: frozenset[str]) -> int:
    """1-based rank of the first correct tool in ``ranked``, 0 when none is."""
    return next((i + 1 for i, n in enumerate(ranked) if n in positives), 0)


def exemplar_gap(qv: np.ndarray, val: Sequence[Example], keys: np.ndarray, alt: np.ndarray | None,
                 names: Sequence[str], ex_keys: Mapping[str, np.ndarray], temperature: float = 0.0) -> float:
    """The exemplar score a tool without exemplars gets, as an offset from its key score: the median over the
    validation lines of (pooled exemplar sim - key sim) of the line's own tool, pooled as the SLB pools them
    (``slb.pool_exemplars`` at ``temperature``). A tool registered after training
    then competes as a typical tool with exemplars would for a request that is meant for it."""
    pos = {n: i for i, n in enumerate(names)}
    gaps = []
    for q, e in zip(qv, val, strict=True):
        if e.tool not in ex_keys or e.tool not in pos:
            continue
        key = float(keys[pos[e.tool]] @ q)
        if alt is not None:
            key = max(key, float(alt[pos[e.tool]] @ q))
        sims = (ex_keys[e.tool] @ q).astype(np.float32)
        gaps.append(float(pool_exemplars(sims, np.zeros(1, np.int64), temperature)[0]) - key)
    return float(np.median(gaps)) if gaps else 0.0


def setting_name(alt_keys: bool, lexical_weight: float, exemplar_weight: float, temperature: float = 0.0) -> str:
    """The key of one SLB scoring in ``by_setting``: ``desc|max2 + lexical weight + ex exemplar weight`` and, for a
    log-mean-exp pooling, ``+T temperature``."""
    pooling = f"+T{temperature}" if temperature else ""
    return f"{'max2' if alt_keys else 'desc'}+{lexical_weight}+ex{exemplar_weight}{pooling}"


def choose_alpha(by_alpha: dict[str, float], grid: Sequence[float], min_gain: float = CE_MIN_GAIN) -> float:
    """The best validation weight of the cross-encoder (the smallest among equals), or 0 when it does not beat
    the SLB alone (alpha = 0) by ``min_gain``: escalation must earn its latency."""
    best = max(grid, key=lambda a: (by_alpha[str(a)], -a))
    base = by_alpha.get(str(0.0))
    if base is not None and by_alpha[str(best)] - base < min_gain - 1e-9:
        return 0.0
    return float(best)


def _apply_calibration(doc: dict[str, Any], cal: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the calibrated tau / alpha in force (the uncalibrated ones kept under ``slb.before``)."""
    doc = dict(doc)
    before = doc.get("slb", {}).get("before") or {k: doc[k] for k in ("tau", "alpha", "val_gated_accuracy",
                                                                     "val_escalation_rate")}
    doc["slb"] = {**cal, "before": before}
    if cal.get("n_val") or cal.get("n_calibration"):
        doc.update(tau=cal["tau"], alpha=cal["alpha"], val_gated_accuracy=cal["val_gated_accuracy"],
                   val_escalation_rate=cal["val_escalation_rate"])
    return doc


def exemplar_examples(fit: Sequence[Example], extra: Sequence[Example]) -> list[Example]:
    """The exemplar keys of a model: its fit lines (never validation) and the extra lines, in id order."""
    return sorted([*fit, *extra], key=lambda e: e.id)


def _calibrate_existing(out: Path, doc: dict[str, Any], examples: Sequence[Example], tools: Sequence[Tool],
                        hp: GateHyperParams, extra: Sequence[Example] = (),
                        calibration: Sequence[Example] = ()) -> dict[str, Any]:
    from sentence_transformers import CrossEncoder, SentenceTransformer

    val_ids = set(doc.get("val_ids") or [])
    val = [e for e in examples if e.id in val_ids]
    qenc = SentenceTransformer(str(out / "query_encoder"), device="cpu")
    ce = (CrossEncoder(str(out / "cross_encoder"), device="cpu", max_length=hp.ce_max_len)
          if (out / "cross_encoder").is_dir() else None)
    _seed_all(hp.seed)
    exemplars = exemplar_examples([e for e in examples if e.id not in val_ids], extra)
    ex_vecs = _encode_eval(qenc, [e.text for e in exemplars])
    doc = _apply_calibration(doc, calibrate_slb(qenc, ce, val, tools, hp, exemplars=exemplars, exemplar_vecs=ex_vecs,
                                                calibration=calibration))
    write_exemplars(out, exemplars, ex_vecs)
    tmp = out / ".gate.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
    os.replace(tmp, out / "gate.json")
    log.info("gate model %s calibrated: alt keys %s, lexical weight %s, exemplar weight %s (pooling temperature %s), "
             "tau %.4f, alpha %s", out, doc["slb"]["alt_keys"], doc["slb"]["lexical_weight"],
             doc["slb"]["exemplar_weight"], doc["slb"].get("exemplar_temperature", 0.0), doc["tau"], doc["alpha"])
    return doc


def train_gate(lines: Sequence[Any], tools: Sequence[Tool], out: str | Path, hp: GateHyperParams = GateHyperParams(),
               equivalents: Callable[[str], frozenset[str]] | None = None, progress: bool = True,
               force: bool = False, extra: Sequence[Any] = (), calibration: Sequence[Any] = ()) -> dict[str, Any]:
    """Train a gate model on ``lines`` over the registry ``tools`` and write it to ``out`` (atomically).
    ``extra`` lines (e.g. ``data/routing_augment``) join the query encoder's fit split only: the
    cross-encoder, validation, tau and every calibrated weight stay on real ``lines``. ``calibration`` lines
    (e.g. ``data/routing_calibration``) are never trained on: they join the validation lines of the SLB
    calibration (``calibrate_slb``), outside the data hash. Skips training (returns the existing gate.json) when
    ``out`` already holds a model of the same data hash, unless ``force``; a cached model whose calibration is of
    another version or calibration set is calibrated again in place."""
    from sentence_transformers import SentenceTransformer

    if equivalents is None:
        def equivalents(t: str) -> frozenset[str]:
            return frozenset({t})

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    set_threads(hp.threads)
    out = Path(out)
    names = [t.name for t in tools]
    by_name = {t.name: t for t in tools}
    examples = make_examples(lines, set(names), equivalents, hp.max_turns)
    if not examples:
        raise ValueError("no training line routes to a tool of the registry")
    extra_examples = make_examples(extra, set(names), equivalents, hp.max_turns)
    calib_examples = make_examples(calibration, set(names), equivalents, hp.max_turns)
    base_fp = dir_fingerprint(base_encoder_path(hp))
    digest = data_hash(examples, tools, hp, base_fp, extra_examples)
    existing = out / "gate.json"
    if existing.is_file() and not force:
        doc = json.loads(existing.read_text())
        if doc.get("data_hash") == digest and (out / "query_encoder").is_dir() and (
                (out / "cross_encoder").is_dir() or not hp.ce_epochs):
            log.info("gate model %s is up to date (hash %s); skipping training", out, digest[:12])
            slb = doc.get("slb", {})
            if (slb.get("version") != SLB_CALIBRATION_VERSION
                    or slb.get("calibration_hash", "") != calibration_hash(calib_examples)):
                doc = _calibrate_existing(out, doc, examples, tools, hp, extra_examples, calib_examples)
            if doc.get("tool_schemas") != tool_schemas(tools):  # a model from before artifacts were keyed by schema
                doc["tool_schemas"] = tool_schemas(tools)
                tmp = out / ".gate.json.tmp"
                tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
                os.replace(tmp, existing)
            if not onnx_path(out / "query_encoder").is_file():  # a model trained before the ONNX export
                export_query_onnx(out / "query_encoder")
            elif int8_method(out / "query_encoder") != INT8_METHOD:  # ... or before its INT8 graph's method
                quantize_query_onnx(out / "query_encoder")
            return doc
    t0 = time.time()
    fit_real, val = split_examples(examples, hp.val_fraction, hp.seed)
    fit = fit_real + extra_examples
    base = SentenceTransformer(str(base_encoder_path(hp)), device="cpu")
    keys = _encode_eval(base, [key_text(key_form(hp))(by_name[n]) for n in names])
    del base
    qenc, q_report = train_query_encoder(fit, val, names, keys, hp, progress)

    index = SemanticIndex(keys.shape[1])
    index.replace_all({n: keys[i] for i, n in enumerate(names)})
    # by default the cross-encoder learns from the real lines only (extra lines teach the query encoder
    # paraphrases; ~550 groups keep it cheap); the fused gate is re-chosen on validation either way
    ce_fit = fit_real + list(extra_examples) if hp.ce_extra else fit_real
    fit_vecs = _encode_eval(qenc, [e.text for e in ce_fit])
    val_vecs = _encode_eval(qenc, [e.text for e in val]) if val else np.zeros((0, keys.shape[1]), np.float32)
    fit_cands = slb_rank(index, fit_vecs, hp.ce_negatives + 3)
    val_cands = slb_rank(index, val_vecs, hp.ce_top_k)
    # tau: the calibration split's top-2 margins over the whole registry (the adversarial pair of each query
    # is its two best-scoring tools); the q-th percentile makes ~q % of such decisions escalate.
    margins = np.array([c[0][1] - c[1][1] for c in slb_rank(index, val_vecs, 2) if len(c) > 1], np.float32)
    tau = float(np.percentile(margins, hp.tau_percentile)) if len(margins) else 0.0
    ce_texts = {n: ce_tool_text(by_name[n]) for n in names}
    ce, ce_report = (train_cross_encoder(ce_fit, val, fit_cands, val_cands, ce_texts, hp, progress) if hp.ce_epochs
                     else (None, {"alpha": 0.0, "best_epoch": 0, "trained": False}))

    # validation of the whole gated decision (the rule the router applies)
    gated_ok, escalated = 0, 0
    if val:
        import torch

        with torch.inference_mode():
            for e, cands in zip(val, val_cands, strict=True):
                margin = cands[0][1] - cands[1][1] if len(cands) > 1 else float("inf")
                pick = cands[0][0]
                if margin < tau and ce is not None:
                    escalated += 1
                    lg = ce.predict([(e.text, ce_texts[n]) for n, _ in cands], show_progress_bar=False,
                                    activation_fn=torch.nn.Identity(), convert_to_numpy=True)
                    pick = cands[int(np.argmax(fuse(np.array([s for _, s in cands]), lg, ce_report["alpha"])))][0]
                gated_ok += pick in e.positives
    doc = {
        "format": GATE_FORMAT,
        "training_version": TRAINING_VERSION,
        "data_hash": digest,
        "base_embedder_fingerprint": base_fp,
        "tau": tau,
        "tau_percentile": hp.tau_percentile,
        "alpha": float(ce_report["alpha"]),
        "ce_top_k": hp.ce_top_k,
        "ce_max_len": hp.ce_max_len,
        "max_turns": hp.max_turns,
        "hyperparams": asdict(hp),
        "n_tools": len(names),
        # whose vectors the tool text keys are: the base embedder's (the compiler stores them), or the gate model's
        # own query encoder's (a model built on a given encoder: the router embeds the tool texts with it)
        "tool_keys": "query_encoder" if hp.encoder else "base",
        "tool_text": key_form(hp),  # the text of each tool's key (services.common.embedder.KEY_TEXTS)
        # what each trained tool *is*: the router gives a registered tool the exemplar keys and bias of the trained
        # tool with its schema hash, never of one that merely shares its name
        "tool_schemas": tool_schemas(tools),
        "n_fit": len(fit),
        "n_fit_extra": len(extra_examples),
        "n_val": len(val),
        "val_ids": sorted(e.id for e in val),
        "calibration": {"n": int(len(margins)), "margin_p20": tau,
                        "margin_quantiles": {str(q): float(np.percentile(margins, q)) for q in (5, 10, 20, 50, 80)}
                        if len(margins) else {}},
        "query_encoder": q_report,
        "cross_encoder": ce_report,
        "val_gated_accuracy": gated_ok / len(val) if val else None,
        "val_escalation_rate": escalated / len(val) if val else None,
        "train_seconds": round(time.time() - t0, 1),
    }
    exemplars = exemplar_examples(fit_real, extra_examples)
    ex_vecs = _encode_eval(qenc, [e.text for e in exemplars])
    doc = _apply_calibration(doc, calibrate_slb(qenc, ce, val, tools, hp, keys, exemplars, ex_vecs, calib_examples))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        qenc.save(str(tmp / "query_encoder"))
        export_query_onnx(tmp / "query_encoder", qenc)
        if ce is not None:
            ce.save(str(tmp / "cross_encoder"))
        (tmp / "gate.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
        # the exemplar keys of the SLB (weight chosen on validation, slb.exemplar_weight): fit + extra requests
        write_exemplars(tmp, exemplars, ex_vecs)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("gate model written to %s in %.0fs (tau %.4f, alpha %s)", out, doc["train_seconds"], tau, doc["alpha"])
    return doc


def tool_schemas(tools: Sequence[Tool]) -> dict[str, str]:
    """``{tool name: schema hash}`` of the tools a model was trained over (gate.json ``tool_schemas``)."""
    return {t.name: t.schema_hash for t in tools}


def default_gate_dir(lines: Sequence[Any], tools: Sequence[Tool], hp: GateHyperParams, root: str = "var/models",
                     equivalents: Callable[[str], frozenset[str]] | None = None, extra: Sequence[Any] = ()) -> Path:
    """``<root>/gate-<hash of data + seed + hyper-parameters>``: the cache location of a training run."""
    eq = equivalents or (lambda t: frozenset({t}))
    names = {t.name for t in tools}
    digest = data_hash(make_examples(lines, names, eq, hp.max_turns), tools, hp,
                       dir_fingerprint(base_encoder_path(hp)), make_examples(extra, names, eq, hp.max_turns))
    return Path(root) / f"gate-{digest[:16]}"
