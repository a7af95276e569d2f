"""Training the argument-evidence stage's late reader (services/router/late_reader.py) and writing it for the router
(issue 4; `nexus train-late-reader`, run by `make setup`).

The reader is a small head over the gate model's own query-encoder states (late_reader.py says what it reads and
computes). It is trained for one gate model, since it reads that model's encoder:

1. **Spans** (``train_head``): the slot reader's examples cut from the augment lines (``routing_examples``: the
   routing text the router encodes as the context), start/end cross-entropy as the slot reader's, ``epochs`` passes
   in batches of like length (``length_batches``), each distinct question and request encoded once per batch
   (``logits``). Its stated threshold is chosen on the slot examples of the query file's tune split.
2. **Decisions** (``route_tune``): the stage's own decision on each augment line as if it were new (``route_groups``:
   the SLB's top 4 with the line's exemplar row left out), a listwise loss over the candidates of the SLB score plus
   the two features the stage chooses between, with a span batch every other step so the head keeps its answers.
3. **Export** (``export``): the head and both states graphs (fp32 and INT8) written beside the target and swapped in
   whole, the stage calibrated for the reader (``argevidence.calibrate`` on the gate model's choosing lines: its
   validation + calibration lines over the full registry, read through the INT8 graph a router at the default
   precision runs). The calibration keeps no feature (the stage off) unless it gains ``MIN_GAIN``.

Heads are cached per gate model by what they are trained on (``head_for``); an export records its key
(``export_key``: the settings, gate.json, the data and the code that makes it) and is kept while the key matches.
Nothing trains on the query file's lines or the calibration lines. The research around it (distillation, reading
time, the held-out routing figures) was the retired bench/routing_late_reader.py's (docs/experiments/README.md); docs/experiments/routing_experiments.md §21-§34.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.router.argevidence import CLIP
from services.router.late_reader import (
    FORMAT,
    HEAD_VERSION,
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
# (N = 250, 3 folds x 3 draws: 44 fixed / 15 broken vs 45 / 10; docs/experiments/routing_experiments.md §33).
TRAINER = "length-batches-v1"

# 8 span + 2 route epochs: 3 + 1 (~9 min) gained 0.3 points on the production model's choosing lines, under
# MIN_GAIN, so the stage stayed off; 8 + 2 gains 1.3 (cross-fit 82.34 vs 81.82 %; docs/experiments/routing_experiments.md §34)
EPOCHS = 8
ROUTE_EPOCHS = 2
# the late reader's scores saturate at 2 in the stage's features, not argevidence.CLIP (10): past a couple of logits a
# score is the head's confidence, not more evidence, and at 10 a tool that states one parameter very confidently beat
# one that states two. Held out on all three folds: +0.62 instead of +0.35 points at N = 250 (§26)
EXPORT_CLIP = 2.0
# and reads enum parameters the request names in words as stated (argevidence.enum_stated): +1.11 instead of +0.62
# (§28)
EXPORT_ENUM_WORDS = True

# what an exported late reader is made from, beside its inputs' bytes, in its export key: a change retrains or
# recalibrates it, an unchanged input keeps it (`make setup` runs the export on every fresh clone)
EXPORT_SOURCES = ("services/training/late_reader.py", "services/router/late_reader.py",
                  "services/router/argevidence.py", "services/training/stages.py",
                  "services/training/slots.py")
REPO = Path(__file__).resolve().parents[2]
# cached heads are safetensors: loading one runs no code (nothing under services/ unpickles)
HEAD_SUFFIX = ".safetensors"


def save_weights(module, path: Path) -> None:
    """``module``'s weights to ``path`` (safetensors), written beside it and renamed into place."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file({k: v.detach().contiguous() for k, v in module.state_dict().items()}, str(tmp))
    os.replace(tmp, path)


def load_weights(module, path: Path) -> None:
    from safetensors.torch import load_file

    module.load_state_dict(load_file(str(path)))


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

    from services.training.slots import adamw_schedule, optimizer_step

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

    from services.training.slots import adamw_schedule, optimizer_step

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
    SLB's top 4, the retired bench/routing_stated_probe.py's teacher_pairs): smooth L1 from the head's score (``span_stated``) to the
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
    from services.router.argevidence import shared_names
    from services.router.router import routing_text
    from services.training.data import equivalents
    from services.training.gate import _encode_eval, tool_text
    from services.training.stages import load_scorer

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
    reader.transformer = transformer  # what export_states_graph and export write out
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
    from services.router.router import routing_text
    from services.training.slots import SlotHyperParams, make_examples

    return make_examples(lines, by_name, SlotHyperParams(),
                         source=lambda ln: routing_text(ln.query, list(ln.history), 4))


def head_for(gate_dir: Path, train, val, out: Path, epochs: int, retrain: bool, progress: bool = True, k: int = K,
             teacher: Sequence[tuple[str, list[str], list[float]]] = (), distill_epochs: int = 2,
             groups: Sequence[dict[str, Any]] = (), route_epochs: int = 2, seed: int = 0
             ) -> tuple[LateReader, dict[str, Any], dict[str, LateReader]]:
    """The head trained for ``gate_dir``'s query encoder (cached in ``out``/<gate>), as a reader, and its record:
    ``k`` layers, trained on the span examples ``train``, then distilled from ``teacher`` when given (``distill_head``),
    then trained on the stage's decisions over ``groups`` when given (``route_tune``); its threshold and stated
    figures from ``val``. Third: the head after each earlier step ("span", "distilled") when a later one followed,
    from the same encoded states. ``seed``: the head's initialisation and every step's batch order (0: the product's,
    whose cache keys predate it)."""
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gate_dir / "query_encoder"), device="cpu")
    transformer, tok = st[0].auto_model.eval(), st.tokenizer
    t0 = time.time()
    cs = encode_states(transformer, tok, [e.context for e in train + val] + [c for c, _, _ in teacher]
                       + [g["context"] for g in groups])
    qs = encode_states(transformer, tok, [e.question for e in train + val] + [q for _, qq, _ in teacher for q in qq]
                       + [q for g in groups for qq in g["questions"] for q, _ in qq])
    enc_s = round(time.time() - t0, 1)
    h = hashlib.sha256(json.dumps([HEAD_VERSION, TRAINER, D, k, epochs, len(train)] + ([seed] if seed else [])).encode())
    h.update((gate_dir / "query_encoder" / "model.safetensors").read_bytes()[:1 << 20])
    key = h.hexdigest()[:16]
    path = out / gate_dir.name / f"head-{key}{HEAD_SUFFIX}"
    torch.manual_seed(seed)
    head = build_head(k=k)
    rec: dict[str, Any] = {"gate": gate_dir.name, "layers": k, "seed": seed, "encode_seconds": enc_s}
    if path.is_file() and not retrain:
        load_weights(head, path)
        rec["reused"] = str(path)
    else:
        t = time.time()
        losses = train_head(head, train, qs, cs, epochs=epochs, seed=seed, progress=progress,
                            label=f"late reader {gate_dir.name}")
        save_weights(head, path)
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
            load_weights(head, at)
            rec[name] = {"reused": str(at)}
        else:
            t = time.time()
            got = fit()
            save_weights(head, at)
            rec[name] = {"seconds": round(time.time() - t, 1), **got}
        head.eval()
        return stated_figures(stated_scores(head, val, qs, cs), labels)

    if teacher:
        keep("span")
        d = hashlib.sha256(json.dumps([key, distill_epochs, list(teacher)]).encode()).hexdigest()[:16]
        path = out / gate_dir.name / f"head-{key}-distill-{d}{HEAD_SUFFIX}"

        def distill() -> dict[str, Any]:
            losses = distill_head(head, teacher, train, qs, cs, epochs=distill_epochs, seed=seed, progress=progress,
                                  label=f"late reader {gate_dir.name} (distill)")
            return {"epochs": distill_epochs, "pairs": sum(len(qq) for _, qq, _ in teacher),
                    "loss_last": float(np.mean(losses[-50:]))}

        fig = step("distill", path, distill)
    if groups:
        keep("distilled" if teacher else "span")
        r = hashlib.sha256(json.dumps([path.stem, route_epochs, fig["threshold"],
                                       [[g["id"], g["cand"], g["slb"]] for g in groups]]).encode()).hexdigest()[:16]
        path = out / gate_dir.name / f"{path.stem}-route-{r}{HEAD_SUFFIX}"
        threshold = fig["threshold"]

        def route() -> dict[str, Any]:
            losses, weights = route_tune(head, groups, train, qs, cs, threshold, epochs=route_epochs, seed=seed,
                                         progress=progress, label=f"late reader {gate_dir.name} (route)")
            return {"epochs": route_epochs, "groups": len(groups),
                    "questions": sum(len(qq) for g in groups for qq in g["questions"]),
                    "loss_first": float(np.mean(losses[:50])), "loss_last": float(np.mean(losses[-50:])), **weights}

        fig = step("route", path, route)
    rec["stated"] = fig
    rec["mix"] = [round(float(x), 3) for x in torch.softmax(head.mix.detach(), 0)]
    meta = {"format": FORMAT, "data_hash": path.stem, "path": str(path)}
    return torch_reader(head, transformer, tok, fig["threshold"], meta), rec, earlier


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


def export(reader: LateReader, gate: Path, lines, registry, calibration, out: str, clip: float = EXPORT_CLIP,
           enum_words: bool = EXPORT_ENUM_WORDS, key: str = "") -> dict[str, Any]:
    """``reader`` (``head_for``'s, for the gate model at ``gate``) as the router's late reader at ``out``, both
    graphs, with the stage calibrated for it as ``make models`` calibrates it for the slot reader (the model's
    validation lines, drawn from ``lines``, + ``calibration``, full registry; its cross-fit beside it) on what a router
    at the default precision reads: the INT8 graph's states, at the query encoder's truncation. Written beside ``out``
    and swapped in when complete; ``key`` (``export_key``) is recorded in it. Returns the calibration's summary."""
    from services.router import late_reader
    from services.training.stages import calibrate_arg_evidence

    gate_meta = json.loads((gate / "gate.json").read_text())
    final = Path(out)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        late_reader.save(tmp, reader.head, reader.transformer, reader.tokenizer, reader.threshold,
                         {**reader.meta, "export_key": key}, gate_meta)
        late_reader.add_int8(tmp, gate)
        read8 = graph_reader(reader, tmp / late_reader.INT8_GRAPH_FILE, int(gate_meta["hyperparams"]["q_max_len"]))
        section = calibrate_arg_evidence(gate, lines, registry, calibration, "", force=True, reader=read8,
                                         write=False, clip=clip, enum_words=enum_words)
        late_reader.set_arg_evidence(tmp, section)
        swap_in(tmp, final)
    finally:  # interrupted or failed: the old reader stays, nothing half-written is left beside it
        if tmp.exists():
            shutil.rmtree(tmp)
    cf = section["crossfit"]
    return {"late_reader": out, "export_key": key, "feature": section["feature"], "alpha": section["alpha"],
            "tau": section["tau"], "choose_top1_slb": section["choose_top1_slb"],
            "choose_top1": section["choose_top1"], "choose_top1_crossfit": cf["top1"],
            "choose_escalation_rate": section["choose_escalation_rate"], "clip": section["clip"],
            "enum_words": section["enum_words"]}


def stated_figures(scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """AUC and the best accuracy over thresholds of stated-vs-unstated scores."""
    from sklearn.metrics import roc_auc_score

    acc, thr = max((float(np.mean((scores > t) == labels)), float(t)) for t in np.unique(np.round(scores, 2)))
    return {"auc": float(roc_auc_score(labels, scores)), "accuracy": acc, "threshold": thr}


def export_key(gate: Path, files: Sequence[Path], settings: Sequence[Any], extra: bytes = b"") -> str:
    """An export's identity: ``settings`` (epochs, layers, clip, ...), the gate model's gate.json, the bytes of
    ``files`` (the data it trains and calibrates on), the code that makes it (``EXPORT_SOURCES``) and ``extra``."""
    h = hashlib.sha256(json.dumps([FORMAT, HEAD_VERSION, TRAINER, *settings]).encode())
    h.update((Path(gate) / "gate.json").read_bytes())
    for f in [*files, *(REPO / s for s in EXPORT_SOURCES)]:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    h.update(extra)
    return h.hexdigest()[:16]


def build(gate: str | Path, registry, lines, augment, calibration, out: str | Path, heads: str | Path, *,
          key: str, epochs: int = EPOCHS, route_epochs: int = ROUTE_EPOCHS, layers: int = K,
          clip: float = EXPORT_CLIP, enum_words: bool = EXPORT_ENUM_WORDS, seed: int = 0, retrain: bool = False,
          progress: bool = True) -> dict[str, Any]:
    """The late reader of the gate model at ``gate`` written to ``out`` (``export``) unless ``out`` already holds the
    export ``key``: its head trained on ``augment``'s span examples (threshold on those of ``lines``' tune split),
    then on the stage's decisions over ``augment`` (``head_for``, cached in ``heads``), the stage calibrated on the
    model's validation lines (drawn from ``lines``, what it was trained on) + ``calibration``; ``seed``: the head's
    (``head_for``). Returns the export's summary (``{"kept": True, ...}`` when ``out`` was current)."""
    from services.training.data import prepare_training_env, tune_split

    if not retrain and export_current(out, key):
        return {"kept": True, "late_reader": str(out), "export_key": key}
    prepare_training_env()
    import torch

    torch.set_num_threads(2)
    gate = Path(gate).resolve()
    by_name = {t.name: t for t in registry.tools}
    tune, _ = tune_split(lines)
    train, val = routing_examples(augment, by_name), routing_examples(tune, by_name)
    groups = route_groups(gate, augment, registry)
    reader, rec, _ = head_for(gate, train, val, Path(heads), epochs, retrain, progress=progress, k=layers,
                              groups=groups, route_epochs=route_epochs, seed=seed)
    summary = export(reader, gate, lines, registry, calibration, str(out), clip, enum_words, key=key)
    return {**summary, "seed": seed, "head": rec}


def fold_late_reader(gate_dir: str | Path, registry, lines, augment, calibration, root: str | Path,
                     progress: bool = True, **settings: Any) -> tuple[Path, dict[str, Any]]:
    """The late reader of one of `nexus eval routing`'s fold models, built as `make setup` builds the production one
    but from the fold's data only: its head's threshold on the tune split of the fold's training ``lines``, the stage
    calibrated on the fold model's validation lines (drawn from ``lines``) + ``calibration``; ``augment`` as
    production. Written to ``root``/late-readers/<model> (<model>-seed<k> for a ``seed`` k other than 0; heads in ``root``/late-reader-heads),
    kept while its key (the lines, the registry, the model, the code) matches.
    ``settings``: ``build``'s. Returns the directory and ``build``'s summary."""
    gate_dir = Path(gate_dir)
    s = {"epochs": EPOCHS, "route_epochs": ROUTE_EPOCHS, "layers": K, "clip": EXPORT_CLIP,
         "enum_words": EXPORT_ENUM_WORDS, "seed": 0, **settings}
    out = Path(root) / "late-readers" / (gate_dir.name + (f"-seed{s['seed']}" if s["seed"] else ""))
    data = json.dumps([[[ln.id, ln.tool, ln.query, ln.args, list(ln.history)] for ln in part]
                       for part in (lines, augment, calibration)] + [t.canonical_json() for t in registry.tools],
                      sort_keys=True).encode()
    key = export_key(gate_dir, [], seed_settings([s[k] for k in ("epochs", "route_epochs", "layers", "clip",
                                                                 "enum_words")], s["seed"]),
                     extra=hashlib.sha256(data).digest())
    summary = build(gate_dir, registry, lines, augment, calibration, out, Path(root) / "late-reader-heads", key=key,
                    progress=progress, **s)
    return out, summary


def seed_settings(settings: Sequence[Any], seed: int) -> list[Any]:
    """An export key's settings with the head's ``seed`` when it is not the product's 0 (so 0's keys are as before)."""
    return [*settings, *([{"seed": seed}] if seed else [])]


def files_key(gate: str | Path, tools: str | Path, queries: str | Path, augment: str | Path,
              calibration: str | Path, settings: Sequence[Any]) -> str:
    """``export_key`` of `nexus train-late-reader`'s inputs: the query, augment and calibration JSONL files (or
    directories of them) and the registry directory's tool files."""
    from services.training.data import jsonl_files

    files = [*jsonl_files(queries), *jsonl_files(augment), *jsonl_files(calibration),
             *sorted(Path(tools).glob("*.json"))]
    return export_key(Path(gate), files, settings)


def train_late_reader(out: str | Path, *, gate: str | Path, tools: str | Path, queries: str | Path,
                      augment: str | Path, calibration: str | Path, heads: str | Path, epochs: int = EPOCHS,
                      route_epochs: int = ROUTE_EPOCHS, layers: int = K, clip: float = EXPORT_CLIP,
                      enum_words: bool = EXPORT_ENUM_WORDS, seed: int = 0, retrain: bool = False,
                      progress: bool = True) -> dict[str, Any]:
    """`nexus train-late-reader`: ``build`` from files (the query JSONL the gate model was trained on, the augment
    and calibration JSONL files or directories, the registry directory ``tools``), keyed by their bytes. Raises
    InvalidArgument naming a missing input before loading anything."""
    from services.common.errors import InvalidArgument
    from services.training.data import load_augment, load_queries, load_registry

    for what, path in (("gate model", Path(gate) / "gate.json"), ("tools", Path(tools)), ("queries", Path(queries)),
                       ("augment lines", Path(augment)), ("calibration lines", Path(calibration))):
        if not path.exists():
            raise InvalidArgument(f"{what}: no {path} (`make setup` trains the gate model; the data is "
                                  f"data/)")
    key = files_key(gate, tools, queries, augment, calibration,
                    seed_settings([epochs, route_epochs, layers, clip, enum_words], seed))
    if not retrain and export_current(out, key):
        return {"kept": True, "late_reader": str(out), "export_key": key}
    return build(gate, load_registry(str(tools)), load_queries(str(queries)), load_augment(str(augment)),
                 load_augment(str(calibration)), out, heads, key=key, epochs=epochs, route_epochs=route_epochs,
                 layers=layers, clip=clip, enum_words=enum_words, seed=seed, retrain=retrain, progress=progress)
