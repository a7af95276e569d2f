"""A reader on the router's own encoding: can the argument-evidence stage fit the latency budget? (issue 4)

    nice -n 19 .venv/bin/python bench/routing_late_reader.py --json reports/routing_late_reader.json
    nice -n 19 .venv/bin/python bench/routing_late_reader.py --distill --routing-json '' \
        --json reports/routing_late_reader_distilled.json

The argument-evidence stage (services/router/argevidence.py, reports/routing_experiments.md §19) gains ~0.6 points at
N = 250, but its slot reader cross-encodes every (parameter question, request) pair: ~250 ms per escalated request on
one thread. The late-interaction probe of §20 reads in ~20 ms, but only because it drops the cross-attention, and
without it the gain is gone. Most of the probe's 20 ms is one MiniLM pass over the request, and the router has already
made that pass: its query encoder runs over the same routing text to embed it. This reader reuses it:

* the request's token states are the router's query encoder's hidden states (all ``LAYERS``, the embeddings and each
  of its 6 layers; the ONNX graph can output them beside the sentence vector, measured below), frozen;
* each parameter question is encoded by the same frozen encoder once per registry, and cached;
* a learned mix of the layers is projected to ``D`` dimensions, and ``K`` small pre-norm transformer layers run over
  [question; request]. The request's tokens attend to the question's and their own; the question's tokens attend to
  themselves only. Their states therefore depend on the question alone, and their keys and values are cached per
  question as well. What an escalation computes is the K small layers over the request's tokens, once per question;
* a start/end head as the slot reader's. "Not stated" is the request's [CLS] token, and a question's score is its best
  span's logit minus that (``services.engine.slots.top_spans``).

It is trained like the slot reader, on the slot reader's examples from the augment lines (``slot_training.make_examples``,
with the routing text as the context the router encodes), for the gate model whose encoder it reads: one head per fold
model (``--folds``) and one for the production model (``--gate``). Cached in ``--out`` per gate model. ``--layers``
sets K. ``--distill`` then matches the slot reader itself where the stage reads: its scores of every span parameter of
the production SLB's top 4 on each augment line (``teacher_for``; the same targets for every head), a span batch every
other step so the head keeps its answers (``distill_head``).

Measured:
* stated-vs-unstated on the slot reader's validation examples (train.jsonl's tune split), the slot reader beside it;
* what each reader's best setting gains on the production model's choosing lines (its validation + calibration lines,
  ranked over the full registry: what ``make models`` calibrates the stage on), and whether it clears ``MIN_GAIN``:
  the criterion to choose a reader by (§21: the stated AUC is not);
* the routing gain, by bench/routing_arg_evidence.py with each fold's head as its reader (``--routing-json``);
* the reading time per escalated request of the production router on ``--calibration``, one thread: the head alone
  (question states cached, the request's states handed over as the router would), and what it costs the router's ONNX
  pass to also output the hidden states.
Nothing trains on train.jsonl or the calibration lines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from services.evals.routing_models import prepare_training_env  # noqa: E402
from services.router.argevidence import CLIP  # noqa: E402
from services.router.late_reader import (  # noqa: E402
    FORMAT,
    HEAD_VERSION,
    MAX_LEN,
    D,
    K,
    LateReader,
    build_head,
    encode_states,
    export_states_graph,
    span_mask,
)

# How the heads are trained, beside HEAD_VERSION (what they are) in their cache key: batches of about the same length
# (length_batches), each distinct question and request encoded once per batch (logits). A fold head trains in ~21 min
# on 2 cores instead of ~30 (span 585-743 s vs 889, route 598-627 s vs 900); held out it gains as much within noise
# (N = 250, 3 folds x 3 draws: 44 fixed / 15 broken vs 45 / 10; reports/routing_experiments.md §33).
TRAINER = "length-batches-v1"


def answer_tokens(offsets: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """The first and last context tokens of a character span ((0, 0): not stated, or not found)."""
    s = t = 0
    if start >= 0:
        for j in range(1, len(offsets) - 1):
            a, b = offsets[j]
            if s == 0 and a <= start < b:
                s = j
            if a < end <= b:
                t = j
        if not (s and t and t >= s):
            s = t = 0
    return s, t


def pad_states(states: Sequence[Any]):
    """(B, LAYERS, N, hidden) float32 and the (B, N) mask of a list of (LAYERS, n, hidden) tensors."""
    import torch

    n = max(s.shape[1] for s in states)
    h = torch.zeros(len(states), states[0].shape[0], n, states[0].shape[2])
    m = torch.zeros(len(states), n, dtype=torch.bool)
    for i, s in enumerate(states):
        h[i, :, :s.shape[1]] = s.float()
        m[i, :s.shape[1]] = True
    return h, m


def distinct_rows(states: Sequence[Any]):
    """The distinct tensors of ``states`` (by identity: ``encode_states`` holds one per text) and each row's index
    into them."""
    import torch

    seen: dict[int, int] = {}
    uniq, rows = [], []
    for s in states:
        j = seen.setdefault(id(s), len(uniq))
        if j == len(uniq):
            uniq.append(s)
        rows.append(j)
    return uniq, torch.tensor(rows)


def length_batches(items: Sequence[Any], bs: int, rng: random.Random, length: Callable[[Any], int],
                   pool: int = 50) -> list[list[Any]]:
    """``items`` in batches of ``bs`` of about the same ``length``: shuffled, sorted by length within pools of
    ``pool`` batches, cut, and the batches shuffled. Random batches of the augment lines' span examples are ~59 %
    padding in their requests and ~56 % in their questions; these (by question + request tokens) ~24 % and ~46 %."""
    items = list(items)
    rng.shuffle(items)
    out: list[list[Any]] = []
    for p in range(0, len(items), bs * pool):
        chunk = sorted(items[p:p + bs * pool], key=length)
        out += [chunk[b:b + bs] for b in range(0, len(chunk), bs)]
    rng.shuffle(out)
    return out


def logits(head, qstates, cstates):
    """Start and end logits of each (question, request) row, each distinct question and request encoded once."""
    uq, qi = distinct_rows(qstates)
    uc, ci = distinct_rows(cstates)
    hq, mq = pad_states(uq)
    hc, mc = pad_states(uc)
    kv = [(k[qi], v[qi]) for k, v in head.question_kv(hq, mq)]
    mq, mc = mq[qi], mc[ci]
    s, e = head(kv, mq, hc, mc, rows=ci)
    keep = span_mask(mc)
    keep[:, 0] = True
    return s.masked_fill(~keep, -1e4), e.masked_fill(~keep, -1e4), mc


def train_head(head, examples, qs: dict, cs: dict, epochs: int = 8, bs: int = 32, lr: float = 5e-4, seed: int = 0,
               progress: bool = True, label: str = "late reader") -> list[float]:
    """Start/end cross-entropy as the slot reader's (the answer's first and last token, or [CLS] = not stated)."""
    import torch
    from tqdm import tqdm

    from services.engine.slot_training import adamw_schedule, optimizer_step

    rng = random.Random(seed)
    torch.manual_seed(seed)
    examples = list(examples)
    steps = epochs * math.ceil(len(examples) / bs)
    opt, sched = adamw_schedule(head, lr, steps, 0.06)
    losses: list[float] = []
    head.train()
    with tqdm(total=steps, desc=label, disable=not progress, file=sys.stderr) as bar:
        for _ in range(epochs):
            for batch in length_batches(examples, bs, rng, example_length(qs, cs)):
                optimizer_step(head, opt, sched, span_ce(head, batch, qs, cs), losses, bar)
    head.eval()
    return losses


def example_length(qs: dict, cs: dict) -> Callable[[Any], int]:
    """A span example's tokens (question + request): what its row of a batch costs."""
    return lambda x: qs[x.question][0].shape[1] + cs[x.context][0].shape[1]


def span_stated(s, e, mc, max_tokens: int | None = None):
    """Each row's best span score minus "not stated", as ``services.engine.slots.top_spans`` scores it (a span inside
    the request, end >= start, at most ``max_tokens`` long), differentiable: what distillation matches."""
    import torch

    from services.engine.slots import MAX_ANSWER_TOKENS

    allow = span_mask(mc)
    idx = torch.arange(s.shape[1])
    gap = idx[None, :] - idx[:, None]  # [i, j]: j - i
    band = (gap >= 0) & (gap < (max_tokens or MAX_ANSWER_TOKENS))
    ok = band[None] & allow[:, :, None] & allow[:, None, :]
    pair = (s[:, :, None] + e[:, None, :]).masked_fill(~ok, -1e4)
    return pair.flatten(1).max(1).values - (s[:, 0] + e[:, 0])


def span_ce(head, batch, qs: dict, cs: dict):
    """The slot reader's loss on ``batch``: start/end cross-entropy (the answer's first and last token, or [CLS])."""
    import torch

    s, e, _ = logits(head, [qs[x.question][0] for x in batch], [cs[x.context][0] for x in batch])
    ans = [answer_tokens(cs[x.context][1], x.start, x.end) for x in batch]
    ce = torch.nn.functional.cross_entropy
    return (ce(s, torch.tensor([a for a, _ in ans])) + ce(e, torch.tensor([b for _, b in ans]))) / 2


def tune_with_spans(model, items, batch_loss, examples, qs: dict, cs: dict, epochs: int, bs: int, lr: float,
                    seed: int, progress: bool, label: str, item_length: Callable[[Any], int]) -> list[float]:
    """``epochs`` passes over ``items`` in shuffled batches of ``bs`` of about the same ``item_length``
    (``length_batches``): a step on ``batch_loss(batch)`` (the loss and what the bar shows) plus, every other step, a
    span batch of ``examples`` (``span_ce``) so the head (``model.head``, or ``model`` itself) keeps its answers; AdamW
    with 5 % warm-up. Returns the shown losses; ``model`` ends in eval."""
    import torch
    from tqdm import tqdm

    from services.engine.slot_training import adamw_schedule, optimizer_step

    rng = random.Random(seed)
    torch.manual_seed(seed)
    items, examples = list(items), list(examples)
    head = getattr(model, "head", model)
    steps_per = math.ceil(len(items) / bs)
    opt, sched = adamw_schedule(model, lr, epochs * steps_per, 0.05)
    losses: list[float] = []
    model.train()
    k = 0
    spans = length_batches(examples, 32, rng, example_length(qs, cs)) if examples else []
    with tqdm(total=epochs * steps_per, desc=label, disable=not progress, file=sys.stderr) as bar:
        for _ in range(epochs):
            for batch in length_batches(items, bs, rng, item_length):
                loss, shown = batch_loss(batch)
                if k % 2 == 0 and spans:
                    loss = loss + span_ce(head, spans[(k // 2) % len(spans)], qs, cs)
                optimizer_step(model, opt, sched, loss, losses, bar, shown)
                k += 1
    model.eval()
    return losses


def distill_head(head, teacher, examples, qs: dict, cs: dict, epochs: int = 2, bs: int = 8, lr: float = 2e-4,
                 seed: int = 0, progress: bool = True, label: str = "late reader (distill)") -> list[float]:
    """Match the slot reader on ``teacher`` ((context, questions, the reader's scores): every span parameter of the
    SLB's top 4, bench/routing_stated_probe.teacher_pairs): smooth L1 from the head's score (``span_stated``) to the
    reader's clipped one, ``bs`` contexts (all their questions) per step, a span batch of ``examples`` every other
    step so the head keeps its answers. ``qs``/``cs`` must hold the teacher's questions and contexts."""
    import torch

    def batch_loss(batch):
        pairs = [(c, q) for c, qq, _ in batch for q in qq]
        s, e, mc = logits(head, [qs[q][0] for _, q in pairs], [cs[c][0] for c, _ in pairs])
        target = torch.tensor([v for _, _, y in batch for v in y], dtype=torch.float32).clamp(-CLIP, CLIP)
        loss = torch.nn.functional.smooth_l1_loss(span_stated(s, e, mc).clamp(-1.5 * CLIP, 1.5 * CLIP), target)
        return loss, loss.item()  # the bar shows the distillation loss alone

    return tune_with_spans(head, teacher, batch_loss, examples, qs, cs, epochs, bs, lr, seed, progress, label,
                           lambda t: cs[t[0]][0].shape[1])


def route_groups(gate_dir: Path, lines, registry, top_k: int = 4, distinct: bool = True) -> list[dict[str, Any]]:
    """Each of ``lines`` (the augment lines) as the stage would see it if the request were new: the SLB's top
    ``top_k`` under ``gate_dir``'s model with the line's own exemplar row left out (``float_tool_scores`` at the
    model's exemplar weight, temperature and gap, plus its tool bias), the right tool put in when it fell out (the
    last candidate makes room). Per candidate: its span parameters' questions and whether each is required, without
    those every candidate has (``distinct``, as the product reads). A line whose candidates have nothing to read is
    left out."""
    from sentence_transformers import SentenceTransformer

    from services.common.models import default_embedder_path
    from services.engine.slots import slot_context, slot_params, slot_question
    from services.evals.data import equivalents
    from services.evals.routing_models import load_scorer
    from services.router.argevidence import shared_names
    from services.router.router import routing_text
    from services.router.training import _encode_eval, tool_text

    names = list(registry.names)
    pos = {n: i for i, n in enumerate(names)}
    by_name = {t.name: t for t in registry.tools}
    gs = load_scorer(gate_dir, names)
    row_of = {r["id"]: i for i, r in enumerate(gs.rows)}
    keys = _encode_eval(SentenceTransformer(str(default_embedder_path()), device="cpu"),
                        [tool_text(by_name[n]) for n in names])
    texts = [routing_text(ln.query, list(ln.history), int(gs.meta.get("max_turns", 4))) for ln in lines]
    scores = gs.scores(texts, keys, leave_out=np.array([row_of.get(ln.id, -1) for ln in lines])) + gs.bias(names)
    groups = []
    for ln, text, sc in zip(lines, texts, scores, strict=True):
        right = {pos[n] for n in equivalents(ln.tool) | {ln.tool} if n in pos}
        cand = [int(j) for j in np.argsort(-sc)[:top_k]]
        if not right & set(cand):
            cand[-1] = pos[ln.tool]
        params = [slot_params(by_name[names[j]]) for j in cand]
        shared = shared_names([[n for n, _ in p] for p in params]) if distinct else set()
        qs = []
        for j, ps in zip(cand, params, strict=True):
            req = set((by_name[names[j]].input_schema or {}).get("required") or [])
            qs.append([(slot_question(by_name[names[j]], n, prop), n in req) for n, prop in ps if n not in shared])
        if any(qs):
            groups.append({"id": ln.id, "context": slot_context(text)[0], "cand": [names[j] for j in cand],
                           "slb": [float(sc[j]) for j in cand], "right": [j in right for j in cand],
                           "questions": qs})
    return groups


def fit_beta(groups: Sequence[dict[str, Any]]) -> float:
    """The inverse temperature under which ``softmax(beta * slb)`` over each group's candidates best predicts its
    right ones (max mean log-likelihood on a log grid from 1 to 1,000)."""
    best = (-np.inf, 1.0)
    for b in np.geomspace(1.0, 1000.0, 61):
        ll = 0.0
        for g in groups:
            z = b * np.asarray(g["slb"], np.float64)
            lse = z.max() + np.log(np.exp(z - z.max()).sum())
            r = z[np.asarray(g["right"])]
            ll += r.max() + np.log(np.exp(r - r.max()).sum()) - lse
        best = max(best, (ll / len(groups), float(b)))
    return best[1]


def route_loss(scores, groups: Sequence[dict[str, Any]], beta: float, alphas, threshold: float, temp: float = 1.0,
               soft: float = 0.1):
    """The routing loss of a batch of ``groups`` given every question's differentiable stated score ``scores`` (in
    the groups' order, candidate by candidate): per group, ``softmax(beta * (slb + a1 * stated + a2 * req_min))``
    over its candidates against its right ones, where ``stated`` counts the candidate's stated parameters softly
    (``sigmoid((s - threshold) / temp)``) and ``req_min`` is a soft minimum (``soft``) of its required parameters'
    scores clipped and scaled as ``argevidence.candidate_feature`` does (0 with none); ``alphas``: (a1, a2) >= 0.
    The two product features the stage chooses between are pushed to separate the candidates together."""
    import torch

    out, k = [], 0
    for g in groups:
        feats = []
        for qs in g["questions"]:
            s = scores[k:k + len(qs)]
            k += len(qs)
            stated = torch.sigmoid((s - threshold) / temp).sum() if qs else s.new_zeros(())
            req = s[[i for i, (_, r) in enumerate(qs) if r]].clamp(-CLIP, CLIP) / CLIP
            rmin = -soft * torch.logsumexp(-req / soft, 0) if len(req) else s.new_zeros(())
            feats.append(torch.stack([stated, rmin]))
        z = beta * (torch.tensor(g["slb"]) + torch.stack(feats) @ alphas)
        out.append(torch.logsumexp(z, 0) - torch.logsumexp(z[torch.tensor(g["right"])], 0))
    return torch.stack(out).mean()


def route_tune(head, groups, examples, qs: dict, cs: dict, threshold: float, epochs: int = 2, bs: int = 8,
               lr: float = 2e-4, seed: int = 0, progress: bool = True, label: str = "late reader (route)"
               ) -> tuple[list[float], dict[str, float]]:
    """Train ``head`` on the decision the stage makes (``route_loss`` over ``groups``, ``route_groups``), the two
    feature weights learnt beside it, with a span batch of ``examples`` every other step so the head keeps its
    answers. Returns the routing losses and the weights and beta."""
    import torch
    from torch import nn

    beta = fit_beta(groups)

    class Tuned(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = head
            self.raw = nn.Parameter(torch.tensor([0.05, 0.1]).expm1().log())  # softplus^-1: the weights start there

        def alphas(self):
            return nn.functional.softplus(self.raw)

    model = Tuned()

    def batch_loss(batch):
        pairs = [(g["context"], q) for g in batch for qq in g["questions"] for q, _ in qq]
        if pairs:
            s, e, mc = logits(head, [qs[q][0] for _, q in pairs], [cs[c][0] for c, _ in pairs])
            scores = span_stated(s, e, mc).clamp(-1.5 * CLIP, 1.5 * CLIP)
        else:  # nothing to read in the batch: the SLB's own loss
            scores = torch.zeros(0)
        loss = route_loss(scores, batch, beta, model.alphas(), threshold)
        return loss, loss.item()

    losses = tune_with_spans(model, groups, batch_loss, examples, qs, cs, epochs, bs, lr, seed, progress, label,
                             lambda g: cs[g["context"]][0].shape[1])
    a = model.alphas().detach().tolist()
    return losses, {"beta": beta, "a_stated": round(a[0], 4), "a_req_min": round(a[1], 4)}


def stated_scores(head, examples, qs: dict, cs: dict, bs: int = 64) -> np.ndarray:
    """Each example's best span score minus "not stated"."""
    import torch

    from services.engine.slots import top_spans

    out = []
    with torch.inference_mode():
        for b in range(0, len(examples), bs):
            batch = examples[b:b + bs]
            s, e, mc = logits(head, [qs[x.question][0] for x in batch], [cs[x.context][0] for x in batch])
            allow = span_mask(mc).numpy()
            out += [top_spans(s[i].numpy(), e[i].numpy(), allow[i])[0][2] for i in range(len(batch))]
    return np.array(out)


def torch_reader(head, transformer, tokenizer, threshold: float, meta: dict[str, Any]) -> LateReader:
    """The product's reader over the torch encoder (the router's reads ``states.onnx``: the same states to float16),
    every request's states kept (the benches read the same lines under many settings)."""
    reader = LateReader(head, lambda texts: [encode_states(transformer, tokenizer, texts)[t][0] for t in texts],
                        tokenizer, threshold, meta, cache_size=None)
    reader.transformer = transformer  # what export_states_graph and --export write out
    return reader


def int8_reader(reader: LateReader, gate_dir: Path, cache: Path) -> LateReader:
    """``reader``'s head over the states of ``gate_dir``'s INT8 states graph (quantized into ``cache`` once: what a
    router at int8 reads), every request's states kept."""
    from services.router.gate import exemplar_texts
    from services.router.late_reader import GRAPH_FILE, INT8_GRAPH_FILE, quantize_states

    graph = cache / INT8_GRAPH_FILE
    tokenizer, transformer = reader.tokenizer, reader.transformer
    if not graph.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        if not (cache / GRAPH_FILE).is_file():
            export_states_graph(transformer, tokenizer, cache / GRAPH_FILE)
        quantize_states(cache, transformer, tokenizer, exemplar_texts(gate_dir), reader.max_len)
    int8 = graph_reader(reader, graph, reader.max_len)  # the torch path's truncation: only the precision differs
    int8.threads = reader.threads
    return int8


def graph_reader(reader: LateReader, graph: Path, max_len: int) -> LateReader:
    """``reader``'s head over the states of the ONNX states graph ``graph`` (one thread), every request's kept."""
    from services.router.late_reader import OnnxStates

    enc = OnnxStates(graph, reader.tokenizer, max_len, 1)
    return LateReader(reader.head, lambda texts: enc.run(texts)[1], reader.tokenizer, reader.threshold, reader.meta,
                      max_len=max_len, cache_size=None)


def routing_examples(lines, by_name):
    """The slot reader's examples with the routing text (what the router encodes) as the context."""
    from services.engine.slot_training import SlotHyperParams, make_examples
    from services.router.router import routing_text

    return make_examples(lines, by_name, SlotHyperParams(),
                         source=lambda ln: routing_text(ln.query, list(ln.history), 4))


def teacher_for(lines, tools, gate: str, slots: str, out: Path, progress: bool = True) -> list:
    """bench/routing_stated_probe.teacher_pairs of ``lines`` under ``gate``'s SLB and the slot reader at ``slots``
    (~12 min on 2 cores), cached in ``out`` by what they depend on."""
    from routing_stated_probe import teacher_pairs

    h = hashlib.sha256(json.dumps([[ln.id, ln.query, list(ln.history)] for ln in lines]).encode())
    h.update((Path(gate) / "gate.json").read_bytes())
    h.update((Path(slots) / "slots.json").read_bytes())
    path = out / f"teacher-{h.hexdigest()[:16]}.json"
    if path.is_file():
        return [tuple(t) for t in json.loads(path.read_text())]
    pairs = teacher_pairs(lines, tools, gate, slots, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(pairs))
    return pairs


def head_for(gate_dir: Path, train, val, out: Path, epochs: int, retrain: bool, progress: bool = True, k: int = K,
             teacher: Sequence[tuple[str, list[str], list[float]]] = (), distill_epochs: int = 2,
             groups: Sequence[dict[str, Any]] = (), route_epochs: int = 2
             ) -> tuple[LateReader, dict[str, Any], dict[str, LateReader]]:
    """The head trained for ``gate_dir``'s query encoder (cached in ``out``/<gate>), as a reader, and its record:
    ``k`` layers, trained on the span examples ``train``, then distilled from ``teacher`` when given (``distill_head``),
    then trained on the stage's decisions over ``groups`` when given (``route_tune``); its threshold and stated
    figures from ``val``. Third: the head after each earlier step ("span", "distilled") when a later one followed,
    from the same encoded states."""
    import copy

    import torch
    from routing_stated_probe import stated_figures
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gate_dir / "query_encoder"), device="cpu")
    transformer, tok = st[0].auto_model.eval(), st.tokenizer
    t0 = time.time()
    cs = encode_states(transformer, tok, [e.context for e in train + val] + [c for c, _, _ in teacher]
                       + [g["context"] for g in groups])
    qs = encode_states(transformer, tok, [e.question for e in train + val] + [q for _, qq, _ in teacher for q in qq]
                       + [q for g in groups for qq in g["questions"] for q, _ in qq])
    enc_s = round(time.time() - t0, 1)
    h = hashlib.sha256(json.dumps([HEAD_VERSION, TRAINER, D, k, epochs, len(train)]).encode())
    h.update((gate_dir / "query_encoder" / "model.safetensors").read_bytes()[:1 << 20])
    key = h.hexdigest()[:16]
    path = out / gate_dir.name / f"head-{key}.pt"
    torch.manual_seed(0)
    head = build_head(k=k)
    rec: dict[str, Any] = {"gate": gate_dir.name, "layers": k, "encode_seconds": enc_s}
    if path.is_file() and not retrain:
        head.load_state_dict(torch.load(path))
        rec["reused"] = str(path)
    else:
        t = time.time()
        losses = train_head(head, train, qs, cs, epochs=epochs, progress=progress, label=f"late reader {gate_dir.name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(head.state_dict(), path)
        rec.update(seconds=round(time.time() - t, 1), loss_last=float(np.mean(losses[-50:])))
    head.eval()
    labels = np.array([e.start >= 0 for e in val])
    fig = stated_figures(stated_scores(head, val, qs, cs), labels)
    earlier: dict[str, LateReader] = {}

    def keep(step: str) -> None:  # the head as it is now, as a reader, before a later step changes it
        rec[f"stated_{step}"] = fig
        earlier[step] = torch_reader(copy.deepcopy(head), transformer, tok, fig["threshold"],
                                     {"format": FORMAT, "data_hash": path.stem, "path": str(path)})

    def step(name: str, at: Path, fit: Callable[[], dict[str, Any]]) -> dict[str, float]:
        """A later training step of the head, cached at ``at``: its record in ``rec[name]``, the new stated
        figures returned."""
        if at.is_file() and not retrain:
            head.load_state_dict(torch.load(at))
            rec[name] = {"reused": str(at)}
        else:
            t = time.time()
            got = fit()
            torch.save(head.state_dict(), at)
            rec[name] = {"seconds": round(time.time() - t, 1), **got}
        head.eval()
        return stated_figures(stated_scores(head, val, qs, cs), labels)

    if teacher:
        keep("span")
        d = hashlib.sha256(json.dumps([key, distill_epochs, list(teacher)]).encode()).hexdigest()[:16]
        path = out / gate_dir.name / f"head-{key}-distill-{d}.pt"

        def distill() -> dict[str, Any]:
            losses = distill_head(head, teacher, train, qs, cs, epochs=distill_epochs, progress=progress,
                                  label=f"late reader {gate_dir.name} (distill)")
            return {"epochs": distill_epochs, "pairs": sum(len(qq) for _, qq, _ in teacher),
                    "loss_last": float(np.mean(losses[-50:]))}

        fig = step("distill", path, distill)
    if groups:
        keep("distilled" if teacher else "span")
        r = hashlib.sha256(json.dumps([path.stem, route_epochs, fig["threshold"],
                                       [[g["id"], g["cand"], g["slb"]] for g in groups]]).encode()).hexdigest()[:16]
        path = out / gate_dir.name / f"{path.stem}-route-{r}.pt"
        threshold = fig["threshold"]

        def route() -> dict[str, Any]:
            losses, weights = route_tune(head, groups, train, qs, cs, threshold, epochs=route_epochs,
                                         progress=progress, label=f"late reader {gate_dir.name} (route)")
            return {"epochs": route_epochs, "groups": len(groups),
                    "questions": sum(len(qq) for g in groups for qq in g["questions"]),
                    "loss_first": float(np.mean(losses[:50])), "loss_last": float(np.mean(losses[-50:])), **weights}

        fig = step("route", path, route)
    rec["stated"] = fig
    rec["mix"] = [round(float(x), 3) for x in torch.softmax(head.mix.detach(), 0)]
    meta = {"format": FORMAT, "data_hash": path.stem, "path": str(path)}
    return torch_reader(head, transformer, tok, fig["threshold"], meta), rec, earlier


def time_onnx(graphs: dict[str, Path], tokenizer, texts: Sequence[str], repeats: int = 3) -> dict[str, dict[str, float]]:
    """Each graph's single-request pass (one thread) over ``texts``, per request, fastest of ``repeats``; the graphs
    interleaved request by request and repeat by repeat, so the machine's noise falls on both alike."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    sessions = {name: ort.InferenceSession(str(g), opts, providers=["CPUExecutionProvider"])
                for name, g in graphs.items()}
    lat: dict[str, list[float]] = {name: [] for name in graphs}
    for text in texts:
        feats = tokenizer([text], return_tensors="np", truncation=True, max_length=MAX_LEN)
        best = dict.fromkeys(graphs, math.inf)
        for _ in range(repeats):
            for name, sess in sessions.items():
                feed = {i.name: feats[i.name].astype(np.int64) for i in sess.get_inputs()}
                t = time.perf_counter()
                sess.run(None, feed)
                best[name] = min(best[name], time.perf_counter() - t)
        for name in graphs:
            lat[name].append(1000 * best[name])
    out = {}
    for name, v in lat.items():
        p = np.percentile(v, [50, 95, 99])
        out[name] = {"n": len(v), "p50": float(p[0]), "p95": float(p[1]), "p99": float(p[2])}
    return out


def time_escalations(reader: LateReader, batches, limit: int) -> dict[str, float]:
    """The head's work per escalated request, the request's states handed over (as the router's pass gives them)."""
    lat = []
    for qs, ctx in batches[:limit]:
        hc = reader.states(ctx)
        reader.question_cache(qs)
        t = time.perf_counter()
        reader.score_states(qs, hc)
        lat.append(1000 * (time.perf_counter() - t))
    p = np.percentile(lat, [50, 90, 95, 99]) if lat else [0.0] * 4
    return {"n": len(lat), "p50": float(p[0]), "p90": float(p[1]), "p95": float(p[2]), "p99": float(p[3])}


def plot(report: dict, path: str) -> None:
    """bench/routing_stated_probe.py's figure, with the stage's reading budget."""
    from routing_stated_probe import plot as probe_plot

    probe_plot(report, path, budget_ms=25.0)


# the late reader's scores saturate at 2 in the stage's features, not argevidence.CLIP (10): past a couple of logits a
# score is the head's confidence, not more evidence, and at 10 a tool that states one parameter very confidently beat
# one that states two. Held out on all three folds: +0.62 instead of +0.35 points at N = 250 (§26)
EXPORT_CLIP = 2.0
# and reads enum parameters the request names in words as stated (argevidence.enum_stated): +1.11 instead of +0.62
# (§28)
EXPORT_ENUM_WORDS = True


# what an exported late reader is made from, beside its inputs' bytes, in its export key: a change retrains or
# recalibrates it, an unchanged input keeps it (`make setup` runs the export on every fresh clone)
EXPORT_SOURCES = ("bench/routing_late_reader.py", "bench/routing_stated_probe.py", "services/router/late_reader.py",
                  "services/router/argevidence.py", "services/evals/routing_models.py",
                  "services/engine/slot_training.py")


def export_key(a: argparse.Namespace, gate: Path) -> str:
    """The export's identity: its flags, the gate model's gate.json, the data it trains and calibrates on, and the code
    that makes it (``EXPORT_SOURCES``)."""
    from services.evals.routing_models import jsonl_files

    repo = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(json.dumps([FORMAT, HEAD_VERSION, TRAINER, a.epochs, a.route_epochs, a.layers, a.clip,
                                   not a.no_enum_words]).encode())
    h.update((gate / "gate.json").read_bytes())
    for f in [*jsonl_files(a.queries), *jsonl_files(a.augment), *jsonl_files(a.calibration),
              *(repo / s for s in EXPORT_SOURCES), *sorted(Path(a.tools).glob("*.json"))]:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def export_current(out: str, key: str) -> bool:
    """Whether ``out`` holds a complete late reader exported with ``key``."""
    from services.router import late_reader

    if not late_reader.exists(out):
        return False
    try:
        doc = json.loads((Path(out) / late_reader.META_FILE).read_text())
    except (OSError, ValueError):
        return False
    return doc.get("export_key") == key and bool(doc.get("arg_evidence")) \
        and (Path(out) / late_reader.INT8_GRAPH_FILE).is_file()


def swap_in(tmp: Path, out: Path) -> None:
    """Replace the directory ``out`` by ``tmp``: a router starting meanwhile finds the old reader or the new one
    (or, in the instant between the two renames, none, and routes without the stage), never half of one."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    if old.exists():
        shutil.rmtree(old)


def export(reader: LateReader, gate: Path, queries, registry, calibration, out: str, clip: float = EXPORT_CLIP,
           enum_words: bool = EXPORT_ENUM_WORDS, key: str = "") -> int:
    """``reader`` (``head_for``'s, for the production model at ``gate``) as the router's late reader at ``out``, both
    graphs, with the stage calibrated for it as ``make models`` calibrates it for the slot reader (the model's
    validation + calibration lines, full registry; its cross-fit beside it) on what a router at the default precision
    reads: the INT8 graph's states, at the query encoder's truncation. Written beside ``out`` and swapped in when
    complete; ``key`` (``export_key``) is recorded in it."""
    from services.evals.routing_models import calibrate_arg_evidence
    from services.router import late_reader

    gate_meta = json.loads((gate / "gate.json").read_text())
    final = Path(out)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        late_reader.save(tmp, reader.head, reader.transformer, reader.tokenizer, reader.threshold,
                         {**reader.meta, "export_key": key}, gate_meta)
        late_reader.add_int8(tmp, gate)
        read8 = graph_reader(reader, tmp / late_reader.INT8_GRAPH_FILE, int(gate_meta["hyperparams"]["q_max_len"]))
        section = calibrate_arg_evidence(gate, queries, registry, calibration, "", force=True, reader=read8,
                                         write=False, clip=clip, enum_words=enum_words)
        late_reader.set_arg_evidence(tmp, section)
        swap_in(tmp, final)
    finally:  # interrupted or failed: the old reader stays, nothing half-written is left beside it
        if tmp.exists():
            shutil.rmtree(tmp)
    cf = section["crossfit"]
    print(json.dumps({"late_reader": out, "feature": section["feature"], "alpha": section["alpha"],
                      "tau": section["tau"], "choose_top1_slb": section["choose_top1_slb"],
                      "choose_top1": section["choose_top1"], "choose_top1_crossfit": cf["top1"],
                      "choose_escalation_rate": section["choose_escalation_rate"], "clip": section["clip"],
                      "enum_words": section["enum_words"]}, indent=1))
    print(f"NEXUS_ROUTER_LATE_READER_DIR={out} serves with it (var/models/late_reader is the router's default)")
    return 0


def production_figures(a, gate: Path, prod: LateReader, rec: dict[str, Any], earlier: dict[str, LateReader],
                        name: str, queries, registry, train, val, heads: dict[str, Any], teacher, groups
                        ) -> tuple[dict[str, Any], tuple]:
    """The production model's figures (the module's "Measured"): the report and what the console echoes."""
    import torch
    from routing_stated_probe import escalations, stated_figures, time_reads

    from services.engine.slot_training import predict
    from services.engine.slots import SlotModel
    from services.evals.routing_models import calibrate_arg_evidence, load_augment

    slot = SlotModel(a.slots, threads=1)
    preds = predict(slot.model, slot.tokenizer, val, slot.max_len)
    stated = {"slot reader": stated_figures(np.array([p[2] for p in preds]), np.array([e.start >= 0 for e in val]))}
    readers: dict[str, Any] = {"slot reader": slot}
    for step, rd in earlier.items():
        stated[f"late reader ({step}, K = {a.layers})"] = rec[f"stated_{step}"]
        readers[f"late reader ({step}, K = {a.layers})"] = rd
    stated[name], readers[name] = rec["stated"], prod
    # the routing gain each reader's best setting would give the production model, on its own choosing lines (what
    # `make models` calibrates the stage on): the criterion to choose a reader by, held-out lines untouched
    calib = load_augment(a.calibration)
    choose = {}
    for arm, rd in readers.items():
        sec = calibrate_arg_evidence(gate, queries, registry, calib, a.slots, force=True, reader=rd, write=False)
        choose[arm] = {k: sec[k] for k in ("feature", "alpha", "tau", "n_choose", "choose_top1_slb", "choose_top1",
                                           "choose_escalation_rate", "best_if_kept", "crossfit")}
        cf = sec["crossfit"]
        print(f"{arm}: production choosing lines {100 * sec['choose_top1_slb']:.1f} -> "
              f"{100 * sec['best_if_kept']['top1']:.1f} at best ({sec['best_if_kept']['feature']}, "
              f"alpha {sec['best_if_kept']['alpha']}); kept: {sec['feature']}; cross-fit (each half at the other's "
              f"choice) {100 * cf['slb_top1']:.2f} -> {100 * cf['top1']:.2f}", flush=True)

    batches = escalations(calib, registry.tools, a.gate, a.slots)
    torch.set_num_threads(1)
    prod.question_cache([q for qs, _ in batches for q in qs])
    reads = {"slot reader": time_reads(slot, batches, a.time_limit),
             "late reader (head)": time_escalations(prod, batches, a.time_limit)}
    with tempfile.TemporaryDirectory(prefix="nexus-late-") as tmp:
        graph = Path(tmp) / "with_states.onnx"
        export_states_graph(prod.transformer, prod.tokenizer, graph)
        from services.router.onnx_encoder import onnx_path

        ctxs = [c for _, c in batches[:a.time_limit]]
        onnx = time_onnx({"router pass": onnx_path(gate / "query_encoder"), "router pass + hidden states": graph},
                         prod.tokenizer, ctxs)
    report = {
        "stated": stated, "n_val": len(val), "n_train": len(train), "heads": heads, "d": D, "k": a.layers,
        "teacher_pairs": sum(len(qq) for _, qq, _ in teacher), "route_groups": len(groups),
        "choose_production": choose,
        "read_ms_per_escalation": reads, "onnx_pass_ms": onnx, "escalations": len(batches), "seconds": 0.0,
        "protocol": "stated vs unstated on the slot examples of train.jsonl's tune split (the routing text as context); "
                    "routing gain: the argument-evidence calibration of the production model (its validation + "
                    "calibration lines, full registry) with each reader; "
                    "reading time over the production router's escalations on the calibration lines, one thread, "
                    "question keys and values cached, the request's states handed over; ONNX passes fastest of 3, "
                    "the two graphs interleaved; heads trained on the augment lines only, one per gate model; "
                    "distillation targets: the slot reader on every span parameter of the production SLB's top 4 "
                    "for each augment line"}
    return report, (stated, choose, reads, onnx)


def main(argv: Sequence[str] | None = None) -> int:
    from routing_stated_probe import add_reader_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_reader_args(ap, "the heads' training lines")
    ap.add_argument("--models-root", default="var/models", help="the fold models (bench/routing_arg_evidence.py's)")
    ap.add_argument("--out", default="var/models/late-reader-heads", help="heads, reused unless --retrain")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--layers", type=int, default=K, help="the head's transformer layers")
    ap.add_argument("--distill", action="store_true",
                    help="then distil the slot reader's scores on the SLB's top-4 parameters of the augment lines")
    ap.add_argument("--distill-epochs", type=int, default=2)
    ap.add_argument("--route", action="store_true",
                    help="then train the head on the stage's decisions: the augment lines' leave-one-out SLB top 4 "
                         "(route_groups, route_tune)")
    ap.add_argument("--route-epochs", type=int, default=2)
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--time-limit", type=int, default=200, help="escalations timed")
    ap.add_argument("--json", default="reports/routing_late_reader.json")
    ap.add_argument("--routing-json", default="reports/routing_late_reader_routing.json",
                    help="bench/routing_arg_evidence.py with each fold's head ('' skips it)")
    ap.add_argument("--routing-args", default="--folds 0,1,2 --draws 3")
    ap.add_argument("--states-precision", choices=("fp32", "int8"), default="fp32",
                    help="--routing-json: the heads read the states of the fold model's torch encoder (fp32) or of its "
                         "INT8 states graph (services/router/late_reader.quantize_states, smoothed on the fold "
                         "model's exemplar requests: what a router at int8 reads)")
    ap.add_argument("--quantize", default="", metavar="DIR",
                    help="only add the INT8 states graph to the late reader at DIR for --gate (states.int8.onnx)")
    ap.add_argument("--routing-only", action="store_true",
                    help="skip the production model's head and figures: train the heads --routing-json needs and "
                         "run it")
    ap.add_argument("--export", default="", metavar="DIR",
                    help="only train (or reuse) the production head, calibrate the stage with it on the production "
                         "model's choosing lines and write it as the router's late reader (services/router/"
                         "late_reader.py) to DIR: NEXUS_ROUTER_LATE_READER_DIR=DIR")
    ap.add_argument("--clip", type=float, default=EXPORT_CLIP,
                    help="--export: where a required parameter's score saturates in the stage's features "
                         "(%(default)s; reports/routing_experiments.md §26)")
    ap.add_argument("--no-enum-words", action="store_true",
                    help="--export: read enum parameters as spans only, as before §28")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)
    if a.export and a.routing_only:
        ap.error("--export writes the production head, which --routing-only does not train")
    for flag, path in (("--gate", Path(a.gate) / "gate.json"), ("--tools", Path(a.tools)),
                       ("--queries", Path(a.queries)), ("--augment", Path(a.augment))):
        if not a.quantize and not path.exists():
            ap.error(f"{flag}: no {path} (`make setup` trains the gate model; the data is ../shared/data and data/)")

    prepare_training_env()
    key = export_key(a, Path(a.gate).resolve()) if a.export else ""
    if a.export and not a.retrain and export_current(a.export, key):
        print(f"late reader at {a.export} is current (export key {key}): kept")
        return 0
    if a.quantize:
        from services.router.late_reader import add_int8

        print(f"wrote {add_int8(a.quantize, Path(a.gate).resolve())}")
        return 0
    import torch

    from services.evals.args import tune_split
    from services.evals.data import load_queries, load_registry
    from services.evals.routing import write_report
    from services.evals.routing_models import load_augment

    t0 = time.time()
    torch.set_num_threads(2)
    registry = load_registry(a.tools)
    by_name = {t.name: t for t in registry.tools}
    queries = load_queries(a.queries)
    tune, _ = tune_split(queries)
    augment = load_augment(a.augment)
    train, val = routing_examples(augment, by_name), routing_examples(tune, by_name)
    out = Path(a.out)
    gate = Path(a.gate).resolve()
    teacher = teacher_for(augment, registry.tools, a.gate, a.slots, out) if a.distill else []
    groups = route_groups(gate, augment, registry) if a.route and not a.routing_only else []
    last = "route-tuned" if groups else "distilled" if teacher else "span"
    name = f"late reader ({last}, K = {a.layers})"
    heads: dict[str, Any] = {}
    if not a.routing_only:  # the production head: what --export writes and production_figures reads
        prod, rec, earlier = head_for(gate, train, val, out, a.epochs, a.retrain, progress=not a.quiet, k=a.layers,
                                      teacher=teacher, distill_epochs=a.distill_epochs, groups=groups,
                                      route_epochs=a.route_epochs)
        heads["production"] = rec
    if a.export:
        return export(prod, gate, queries, registry, load_augment(a.calibration), a.export, a.clip,
                      not a.no_enum_words, key=key)
    if a.routing_only:
        report: dict[str, Any] = {"heads": heads, "d": D, "k": a.layers, "route_groups": len(groups),
                                  "protocol": "heads only (--routing-only): the routing figures are --routing-json's"}
        echo: tuple = ()
    else:
        report, echo = production_figures(a, gate, prod, rec, earlier, name, queries, registry, train, val, heads,
                                          teacher, groups)
    if a.routing_json:
        import routing_arg_evidence

        torch.set_num_threads(2)

        def reader_for(fm):
            reader, r, _ = head_for(fm.dir, train, val, out, a.epochs, a.retrain, k=a.layers, teacher=teacher,
                                    distill_epochs=a.distill_epochs,
                                    groups=route_groups(fm.dir, augment, registry) if a.route else (),
                                    route_epochs=a.route_epochs)
            heads[fm.dir.name] = r
            reader.threads = 2
            if a.states_precision == "int8":
                reader = int8_reader(reader, fm.dir, out / fm.dir.name)
            return reader

        routing_arg_evidence.main([*a.routing_args.split(), "--json", a.routing_json], reader_for=reader_for)
        report["routing"] = a.routing_json
    report["seconds"] = round(time.time() - t0, 1)
    write_report(a.json, report, None if a.routing_only else plot, echo=echo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
