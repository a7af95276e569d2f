"""A late-interaction "is this parameter stated?" probe: can a cheaper reader carry the argument-evidence stage?
(issue 4)

    nice -n 19 .venv/bin/python bench/routing_stated_probe.py --distill \\
        --json reports/routing_stated_probe.json

The argument-evidence stage (services/router/argevidence.py, reports/routing_experiments.md §19) gains ~0.6 points
at N = 250 but reads ~10 (question, request) pairs through the slot reader, a MiniLM cross-encoder: ~230 ms per
escalated request on one thread, so p99 becomes the stage's latency. This bench trains a reader whose cost does not
grow with the questions: the request is encoded once (MiniLM token states, projected to ``DIM``), each parameter
question once per registry (mean-pooled, projected; cached), and a question's logit over the request's tokens is
their dot product; its score is the best token's logit minus the [CLS] ("not stated") logit, as the slot reader's
is the best span's minus "not stated".

* span phase: the slot reader's own examples (``slot_training.make_examples`` over the augment lines: the line's
  parameters, its answer's first token or [CLS], two unstated parameters per line), cross-entropy over the
  request's tokens, from the all-MiniLM-L6-v2 weights;
* ``--distill``: then one pass over teacher pairs: each augment line's routing text with every span parameter of the
  production router's SLB top 4 (the neighbours the stage must tell apart), the slot reader's score as the target
  (smooth L1, clipped to +-10), a span batch every other step.

Measured: stated-vs-unstated on the slot reader's validation examples (train.jsonl's tune split; AUC and accuracy at
the best threshold, the slot reader's beside it); the reading time per escalated request of the production router on
``--queries`` (every escalation's questions, question vectors cached, one thread; the slot reader's beside it); and
the routing gain, by bench/routing_arg_evidence.py with the probe as its reader (``--routing-json``). The
trained weights are kept in ``--out`` and reused (``--retrain`` trains again). Nothing trains on train.jsonl or the
calibration lines.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from services.evals.routing_models import prepare_training_env  # noqa: E402

DIM = 128
CTX_LEN = 160
Q_LEN = 64
CLIP = 10.0


def build_probe(base: str):
    import torch
    from transformers import AutoModel

    class Probe(torch.nn.Module):
        """MiniLM shared by both sides; a projection per side."""

        def __init__(self) -> None:
            super().__init__()
            self.enc = AutoModel.from_pretrained(base)
            self.pc = torch.nn.Linear(self.enc.config.hidden_size, DIM)
            self.pq = torch.nn.Linear(self.enc.config.hidden_size, DIM)

        def ctx(self, enc):
            return self.pc(self.enc(**enc).last_hidden_state)

        def q(self, enc):
            h = self.enc(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).float()
            return self.pq((h * m).sum(1) / m.sum(1))

    return Probe()


def probe_logits(model, tok, contexts: Sequence[str], questions: Sequence[Sequence[str]]):
    """Per question (flattened over contexts): its logit at each token of its context ([SEP] and padding masked),
    and the context encoding (offsets kept)."""
    import torch

    cenc = tok(list(contexts), truncation=True, max_length=CTX_LEN, padding=True, return_offsets_mapping=True,
               return_tensors="pt")
    offsets = cenc.pop("offset_mapping")
    qenc = tok([q for qs in questions for q in qs], truncation=True, max_length=Q_LEN, padding=True,
               return_tensors="pt")
    c, q = model.ctx(cenc), model.q(qenc)
    owner = torch.tensor([i for i, qs in enumerate(questions) for _ in qs])
    logits = torch.einsum("nld,nd->nl", c[owner], q) / math.sqrt(DIM)
    keep = cenc["attention_mask"][owner].bool() & (cenc["input_ids"][owner] != tok.sep_token_id)
    cenc["offset_mapping"] = offsets
    return logits.masked_fill(~keep, -1e4), cenc


def stated_score(logits):
    """Best token's logit minus [CLS]'s."""
    return logits[:, 1:].max(1).values - logits[:, 0]


def span_targets(cenc, groups) -> list[int]:
    """Each example's answer's first token in its context (0 = [CLS]: not stated, or truncated away)."""
    out = []
    offsets = cenc["offset_mapping"].tolist()
    for i, (_, exs) in enumerate(groups):
        seq = cenc.sequence_ids(i)
        for e in exs:
            t = 0
            if e.start >= 0:
                t = next((j for j, (a, b) in enumerate(offsets[i]) if seq[j] == 0 and a <= e.start < b), 0)
            out.append(t)
    return out


def span_loss(model, tok, groups):
    import torch

    logits, cenc = probe_logits(model, tok, [c for c, _ in groups], [[e.question for e in x] for _, x in groups])
    return torch.nn.functional.cross_entropy(logits, torch.tensor(span_targets(cenc, groups))), logits, cenc


def by_context(examples) -> list[tuple[str, list]]:
    g: dict[str, list] = {}
    for e in examples:
        g.setdefault(e.context, []).append(e)
    return list(g.items())


def train_span(model, tok, groups, epochs: int = 2, bs: int = 16, lr: float = 5e-5, seed: int = 0,
               progress: bool = True) -> list[float]:
    from tqdm import tqdm

    from services.training.slots import adamw_schedule, optimizer_step

    rng = random.Random(seed)
    groups = list(groups)
    steps = epochs * math.ceil(len(groups) / bs)
    opt, sched = adamw_schedule(model, lr, steps, 0.1)
    losses: list[float] = []
    model.train()
    with tqdm(total=steps, desc="probe (span)", disable=not progress, file=sys.stderr) as bar:
        for _ in range(epochs):
            rng.shuffle(groups)
            for b in range(0, len(groups), bs):
                optimizer_step(model, opt, sched, span_loss(model, tok, groups[b:b + bs])[0], losses, bar)
    model.eval()
    return losses


def teacher_pairs(lines, tools, gate: str, slots: str, progress: bool = True) -> list[tuple[str, list[str], list[float]]]:
    """(request context, questions, the slot reader's scores): every span parameter of the production router's SLB
    top 4 on each line's routing text."""
    from tqdm import tqdm

    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.engine.slots import SlotModel, slot_context, slot_params, slot_question
    from services.evals.routing import _open_router
    from services.router.router import routing_text

    by_name = {t.name: t for t in tools}
    reader = SlotModel(slots, threads=2)
    out = []
    with tempfile.TemporaryDirectory(prefix="nexus-probe-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(tools))
        router = _open_router(store, Embedder(""), gate, slots="")
        for ln in tqdm(lines, desc="teacher (slot reader)", disable=not progress, file=sys.stderr):
            text = routing_text(ln.query, list(ln.history), router._max_turns())
            top = [n for n, _ in router.decide(text, 4).slb_candidates[:4]]
            ctx, _ = slot_context(text)
            qs = sorted({slot_question(by_name[n], p, prop) for n in top for p, prop in slot_params(by_name[n])})
            if qs:
                out.append((ctx, qs, [s[0][2] if s else -CLIP for s in reader.score(qs, ctx)]))
    return out


def distill(model, tok, teacher, groups, bs: int = 16, lr: float = 3e-5, seed: int = 0,
            progress: bool = True) -> list[float]:
    """One pass over ``teacher`` (smooth L1 to the reader's clipped score), a span batch every other step."""
    import torch
    from tqdm import tqdm

    from services.training.slots import adamw_schedule, optimizer_step

    rng = random.Random(seed)
    teacher, groups = list(teacher), list(groups)
    rng.shuffle(teacher)
    rng.shuffle(groups)
    steps = math.ceil(len(teacher) / bs)
    opt, sched = adamw_schedule(model, lr, steps, 0.05)
    losses: list[float] = []
    model.train()
    with tqdm(total=steps, desc="probe (distill)", disable=not progress, file=sys.stderr) as bar:
        for k in range(steps):
            batch = teacher[k * bs:(k + 1) * bs]
            logits, _ = probe_logits(model, tok, [c for c, _, _ in batch], [q for _, q, _ in batch])
            target = torch.tensor([v for _, _, y in batch for v in y]).clamp(-CLIP, CLIP)
            loss = torch.nn.functional.smooth_l1_loss(stated_score(logits).clamp(-1.5 * CLIP, 1.5 * CLIP), target)
            shown = loss.item()  # the distillation loss alone
            if k % 2 == 0:
                loss = loss + span_loss(model, tok, groups[(k // 2) * bs % len(groups):][:bs])[0]
            optimizer_step(model, opt, sched, loss, losses, bar, shown)
    model.eval()
    return losses


def stated_figures(scores: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """AUC and the best accuracy over thresholds of stated-vs-unstated scores."""
    from sklearn.metrics import roc_auc_score

    acc, thr = max((float(np.mean((scores > t) == labels)), float(t)) for t in np.unique(np.round(scores, 2)))
    return {"auc": float(roc_auc_score(labels, scores)), "accuracy": acc, "threshold": thr}


def probe_val_scores(model, tok, val) -> tuple[np.ndarray, np.ndarray]:
    import torch

    scores, labels = [], []
    with torch.inference_mode():
        groups = by_context(val)
        for b in range(0, len(groups), 32):
            g = groups[b:b + 32]
            _, logits, _ = span_loss(model, tok, g)
            scores += stated_score(logits).tolist()
            labels += [e.start >= 0 for _, x in g for e in x]
    return np.array(scores), np.array(labels)


class ProbeReader:
    """The probe behind the slot reader's interface (what argevidence.read and bench/routing_arg_evidence.py use):
    ``score`` gives each question one answer, (0, 0, score); question vectors are cached."""

    def __init__(self, model, tok, threshold: float, meta: dict[str, Any], threads: int = 1):
        self.model, self.tokenizer, self.threshold, self.meta = model, tok, threshold, meta
        self.max_len, self.threads = CTX_LEN, threads
        self._q: dict[str, Any] = {}

    def _qvecs(self, questions: Sequence[str]):
        import torch

        new = [q for q in dict.fromkeys(questions) if q not in self._q]
        if new:
            enc = self.tokenizer(new, truncation=True, max_length=Q_LEN, padding=True, return_tensors="pt")
            self._q.update(zip(new, self.model.q(enc), strict=True))
        return torch.stack([self._q[q] for q in questions])

    def score(self, questions: list[str], context: str, k: int = 1) -> list[list[tuple[int, int, float]]]:
        import torch

        if not questions:
            return []
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            q = self._qvecs(questions)
            enc = self.tokenizer([context], truncation=True, max_length=CTX_LEN, return_tensors="pt")
            c = self.model.ctx(enc)[0][:-1]  # the final [SEP] dropped
            s = stated_score((q @ c.T) / math.sqrt(DIM))
        return [[(0, 0, float(x))] for x in s]


def escalations(lines, tools, gate: str, slots: str) -> list[tuple[list[str], str]]:
    """(questions, context) the production router's stage reads on each escalated line (its slot reader)."""
    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.evals.routing import _open_router
    from services.router.router import routing_text

    seen: list[tuple[list[str], str]] = []
    with tempfile.TemporaryDirectory(prefix="nexus-probe-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(tools))
        router = _open_router(store, Embedder(""), gate, slots=slots)
        if router.arg_evidence is None:
            raise SystemExit(f"{gate} has no argument-evidence stage for {slots}: `make models` calibrates it")
        rd = router.arg_evidence.reader
        real = rd.score

        def spy(qs, ctx, k=1):
            seen.append((list(qs), ctx))
            return real(qs, ctx, k)

        rd.score = spy
        for ln in lines:
            router.decide(routing_text(ln.query, list(ln.history), router._max_turns()), 3)
        rd.score = real
    return seen


def time_reads(reader, batches, limit: int) -> dict[str, float]:
    lat = []
    for qs, ctx in batches[:limit]:
        t = time.perf_counter()
        reader.score(qs, ctx)
        lat.append(1000 * (time.perf_counter() - t))
    p = np.percentile(lat, [50, 90, 95, 99]) if lat else [0.0] * 4
    return {"n": len(lat), "p50": float(p[0]), "p90": float(p[1]), "p95": float(p[2]), "p99": float(p[3])}


def plot(report: dict, path: str, budget_ms: float | None = None) -> None:
    """AUC per reader beside its reading cost per escalation; ``budget_ms``: a line at the stage's p95 budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(report["stated"])
    choose = report.get("choose_production") or {}
    fig, axes = plt.subplots(1, 3 if choose else 2, figsize=(15 if choose else 10, 4))
    a1, a2 = axes[0], axes[1]
    a1.bar(arms, [report["stated"][a]["auc"] for a in arms], color="tab:blue")
    a1.set_ylim(0.8, 1.0)
    a1.set_xticks(range(len(arms)), arms, rotation=15, ha="right")
    a1.set_title("stated vs unstated (validation), AUC")
    lat = report["read_ms_per_escalation"]
    x = np.arange(len(lat))
    for j, q in enumerate(("p50", "p95", "p99")):
        a2.bar(x + 0.27 * (j - 1), [lat[a][q] for a in lat], 0.27, label=q)
    if budget_ms is not None:
        a2.axhline(budget_ms, color="k", ls=":", lw=1, label="stage budget at p95")
    a2.set_xticks(x, list(lat))
    a2.set_yscale("log")
    a2.set_ylabel("ms per escalated request (one thread)")
    a2.legend()
    a2.set_title("reading cost")
    if choose:
        # what each reader's best setting gains on the production model's choosing lines, and what the calibration
        # keeps (below MIN_GAIN: no stage)
        x = np.arange(len(choose))
        best = [100 * (c["best_if_kept"]["top1"] - c["choose_top1_slb"]) for c in choose.values()]
        kept = [100 * (c["choose_top1"] - c["choose_top1_slb"]) for c in choose.values()]
        # with the cross-fit (each half scored at the other half's choice): a third bar, the honest one
        cf = [c.get("crossfit") for c in choose.values()]
        w = 0.27 if all(cf) else 0.4
        axes[2].bar(x - w / 2 * (2 if all(cf) else 1), best, w, label="best setting")
        axes[2].bar(x + (0 if all(cf) else w / 2), kept, w, label="kept (gain >= MIN_GAIN)")
        if all(cf):
            axes[2].bar(x + w, [100 * (c["top1"] - c["slb_top1"]) for c in cf], w,
                        label="cross-fit: each half at the other's choice")
        axes[2].axhline(0, color="k", lw=0.5)
        axes[2].set_xticks(x, list(choose), rotation=15, ha="right")
        axes[2].set_ylabel("top-1 gain over the SLB, points")
        axes[2].set_title("production model's choosing lines")
        axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_reader_args(ap, augment_help: str) -> None:
    """The data and model flags a stated-reader bench shares (this one, bench/routing_late_reader.py)."""
    ap.add_argument("--queries", default="../shared/data/queries/train.jsonl", help="validation: its tune split")
    ap.add_argument("--tools", default="../shared/data/mcp_tools")
    ap.add_argument("--augment", default="data/routing_augment", help=augment_help)
    ap.add_argument("--calibration", default="data/routing_calibration", help="lines whose escalations are timed")
    ap.add_argument("--gate", default="var/models/gate")
    ap.add_argument("--slots", default="var/models/slots")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_reader_args(ap, "the probe's training lines")
    ap.add_argument("--out", default="var/models/stated-probe", help="weights, reused unless --retrain")
    ap.add_argument("--distill", action="store_true", help="also distil from the slot reader (the probe read)")
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--time-limit", type=int, default=200, help="escalations timed per reader")
    ap.add_argument("--json", default="reports/routing_stated_probe.json")
    ap.add_argument("--routing-json", default="", help="also run bench/routing_arg_evidence.py with the probe")
    ap.add_argument("--routing-args", default="--folds 0,1,2 --draws 3", help="its protocol flags")
    a = ap.parse_args(argv)

    prepare_training_env()
    import torch
    from transformers import AutoTokenizer

    from services.common.models import resolve_embedder
    from services.engine.slots import SlotModel
    from services.evals.args import tune_split
    from services.evals.routing import write_report
    from services.evals.routing_models import load_augment
    from services.training.data import load_queries, load_registry
    from services.training.slots import SlotHyperParams, make_examples, predict

    t0 = time.time()
    torch.manual_seed(0)
    random.seed(0)
    registry = load_registry(a.tools)
    by_name = {t.name: t for t in registry.tools}
    augment = load_augment(a.augment)
    tune, _ = tune_split(load_queries(a.queries))
    train, val = make_examples(augment, by_name, SlotHyperParams()), make_examples(tune, by_name, SlotHyperParams())
    base = str(resolve_embedder(""))
    tok = AutoTokenizer.from_pretrained(base)
    model = build_probe(base)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    span_w, dist_w = out / "span.pt", out / "distill.pt"
    log: dict[str, Any] = {}
    if span_w.is_file() and not a.retrain:
        model.load_state_dict(torch.load(span_w))
        log["span"] = {"reused": str(span_w)}
    else:
        t = time.time()
        losses = train_span(model, tok, by_context(train), epochs=a.epochs)
        torch.save(model.state_dict(), span_w)
        log["span"] = {"seconds": round(time.time() - t, 1), "loss_last": float(np.mean(losses[-20:]))}
    model.eval()
    arms = {"probe (span)": probe_val_scores(model, tok, val)}
    if a.distill:
        if dist_w.is_file() and not a.retrain:
            model.load_state_dict(torch.load(dist_w))
            log["distill"] = {"reused": str(dist_w)}
        else:
            t = time.time()
            teacher = teacher_pairs(augment, registry.tools, a.gate, a.slots)
            losses = distill(model, tok, teacher, by_context(train))
            torch.save(model.state_dict(), dist_w)
            log["distill"] = {"seconds": round(time.time() - t, 1), "pairs": sum(len(q) for _, q, _ in teacher),
                              "loss_last": float(np.mean(losses[-20:]))}
        model.eval()
        arms["probe (distilled)"] = probe_val_scores(model, tok, val)
    slot = SlotModel(a.slots, threads=1)
    preds = predict(slot.model, slot.tokenizer, val, slot.max_len)
    arms["slot reader"] = (np.array([p[2] for p in preds]), np.array([e.start >= 0 for e in val]))
    stated = {arm: stated_figures(*v) for arm, v in arms.items()}
    probe_arm = "probe (distilled)" if a.distill else "probe (span)"
    probe = ProbeReader(model, tok, stated[probe_arm]["threshold"],
                        {"format": f"stated-probe/{probe_arm}", "data_hash": f"{out.resolve()}", "path": str(out)})

    batches = escalations(load_augment(a.calibration), registry.tools, a.gate, a.slots)
    probe._qvecs([q for qs, _ in batches for q in qs])  # registry-time work: every question's vector
    reads = {"slot reader": time_reads(slot, batches, a.time_limit), probe_arm: time_reads(probe, batches,
                                                                                          a.time_limit)}
    report = {"stated": stated, "n_val": len(val), "n_train": len(train), "training": log,
              "read_ms_per_escalation": reads, "escalations": len(batches), "dim": DIM, "seconds": 0.0,
              "protocol": "stated vs unstated on the slot examples of train.jsonl's tune split; reading time over the "
                          "production router's escalations on the calibration lines, one thread, question vectors "
                          "cached; the probe trained on the augment lines only"}
    if a.routing_json:
        import routing_arg_evidence

        routing_arg_evidence.main([*a.routing_args.split(), "--json", a.routing_json], reader=probe)
        report["routing"] = a.routing_json
    report["seconds"] = round(time.time() - t0, 1)
    write_report(a.json, report, plot, echo=(stated, reads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
