"""Argument-level evidence as the gate's second stage: does the slot reader separate the twins the SLB confuses?
(issue 4)

    nice -n 19 .venv/bin/python bench/routing_arg_evidence.py --folds 0,1,2 --draws 3 \
        --json reports/routing_arg_evidence.json

The data's close neighbours differ in what the request states, not in what it is about
(shared/data/queries/README.md): ``pods_list`` vs ``pods_list_in_namespace`` (a namespace), ``git_*`` vs GitHub
(a local path), ``puppeteer_*`` vs ``browser_*`` (a CSS selector vs a snapshot ref), get vs list (an id). Six
cross-encoders read name + description and stayed at chance on the lines the gate escalates (§18). This bench
asks the engine's slot reader (``services/engine/slots.py``: MiniLM with a span head, trained on the augment lines
only, never on train.jsonl or the calibration lines) for each of the SLB's top ``--top-k`` candidates: how
strongly does the request state each of its parameters? A candidate's feature:

* ``req_min``: the weakest of its required parameters' scores (best-span logit minus the "not stated" logit,
  clipped to +-``CLIP`` and scaled to +-1); a tool with no required span parameter scores 0;
* ``req_mean``: their mean;
* ``stated``: how many of its span parameters (required or not) the reader finds stated (score above its
  threshold);

and on a line whose SLB margin (top-1 minus top-2, the model's float score with its tool bias) is below the
escalation threshold, the top ``--top-k`` are re-ranked by ``slb + alpha * feature``. The feature, alpha and the
threshold (a quantile of the choosing lines' margins) are chosen per fold on the model's validation + calibration
lines (full registry, top-1; none of them trained the reader); ``none`` is the SLB alone. Held out: the fold's lines at
each size over ``--draws`` draws of distractors (the evaluation's registries), the margin taken within each
registry. Written: choices, held-out top-1 per size with bootstrap CIs, escalation rates, accuracy on the
escalated lines, the paired difference against ``none``, the reader's time per escalated line, and a PNG.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from services.evals.routing_models import prepare_training_env  # noqa: E402

FEATURES = ("req_min", "req_mean", "stated")
ALPHAS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
ESCALATE_Q = (0.1, 0.2, 0.3)
CLIP = 10.0

# one candidate's reader output: (parameter, required, score) per span parameter
Reading = Sequence[tuple[str, bool, float]]


def candidate_feature(reading: Reading, kind: str, threshold: float) -> float:
    """The argument evidence of one candidate tool (see the module doc)."""
    if kind == "stated":
        return float(sum(s >= threshold for _, _, s in reading))
    req = [max(-CLIP, min(CLIP, s)) / CLIP for _, r, s in reading if r]
    if not req:
        return 0.0
    if kind == "req_min":
        return float(min(req))
    if kind == "req_mean":
        return float(np.mean(req))
    raise ValueError(f"unknown feature {kind!r}")


def rerank(slb: np.ndarray, feats: np.ndarray, alpha: float) -> int:
    """Index (into the candidates) of the pick by ``slb + alpha * feats``; ties go to the SLB's order."""
    z = np.asarray(slb, np.float64) + alpha * np.asarray(feats, np.float64)
    return int(np.argmax(z))


def margins(scores: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 score per row (-inf entries are tools outside the registry)."""
    t = -np.sort(-scores, axis=1)[:, :2]
    return t[:, 0] - t[:, 1]


class ReaderCache:
    """The slot reader's scores per (request text, tool), computed once."""

    def __init__(self, model, by_name):
        self.model, self.by_name = model, by_name
        self.cache: dict[tuple[str, str], list[tuple[str, bool, float]]] = {}
        self.line_seconds: list[float] = []

    def read(self, text: str, tools: Sequence[str]) -> list[list[tuple[str, bool, float]]]:
        from services.engine.slots import slot_context, slot_params, slot_question

        t0, fresh = time.perf_counter(), False
        ctx, _ = slot_context(text)
        for name in tools:
            if (text, name) in self.cache:
                continue
            fresh = True
            tool = self.by_name[name]
            params = slot_params(tool)
            req = set((tool.input_schema or {}).get("required") or [])
            spans = self.model.score([slot_question(tool, n, p) for n, p in params], ctx, k=1) if params else []
            self.cache[(text, name)] = [(n, n in req, float(s[0][2]) if s else -CLIP)
                                        for (n, _), s in zip(params, spans, strict=True)]
        if fresh:
            self.line_seconds.append(time.perf_counter() - t0)
        return [self.cache[(text, n)] for n in tools]


def plot(report: dict, path: str) -> None:
    from services.evals.routing import plot_pooled

    n, draws = report["n"], report["draws"]
    plot_pooled(path, report["pooled"], f"Argument evidence on escalated lines ({n} held-out lines x {draws} draws)")


def main() -> int:
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap, sizes="10,250,all", calibration=True)
    ap.add_argument("--folds", default="0,1,2")
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--slots", default="var/models/slots", help="the slot reader (nexus train-slots)")
    ap.add_argument("--json", default="reports/routing_arg_evidence.json")
    a = ap.parse_args()

    prepare_training_env()
    from sentence_transformers import SentenceTransformer

    from services.common.models import default_embedder_path
    from services.engine.slots import SlotModel
    from services.evals.data import equivalents
    from services.evals.routing import load_protocol, pool_line_draws, pooled_top1, write_report
    from services.evals.routing_models import load_fold
    from services.router.training import GateHyperParams, _encode_eval, make_examples, tool_text

    t0 = time.time()
    proto = load_protocol(a.queries, a.tools, a.sizes, draws=a.draws)
    registry, lines, sizes = proto.registry, proto.lines, proto.sizes
    names = list(registry.names)
    pos = {n: i for i, n in enumerate(names)}
    known = set(names)
    extra, calib = proto.extra_lines(a.augment), proto.extra_lines(a.calibration)
    hp = GateHyperParams(seed=0)
    by_name = {t.name: t for t in registry.tools}
    base = SentenceTransformer(str(default_embedder_path()), device="cpu")
    keys = _encode_eval(base, [tool_text(by_name[n]) for n in names])
    del base
    calib_ex = make_examples(calib, known, equivalents, hp.max_turns)
    reader = SlotModel(a.slots, threads=1)
    cache = ReaderCache(reader, by_name)
    k = a.top_k

    def features(text: str, top: np.ndarray) -> dict[str, np.ndarray]:
        readings = cache.read(text, [names[j] for j in top])
        return {f: np.array([candidate_feature(r, f, reader.threshold) for r in readings]) for f in FEATURES}

    arms = ("none", "arg evidence")
    per_fold: dict[str, dict] = {}
    hits: dict[str, dict[str, dict[str, bool]]] = {arm: {s: {} for s in sizes} for arm in arms}
    for f in [int(x) for x in a.folds.split(",")]:
        fm = load_fold(proto, f, hp, a.models_root, extra, calib, calib_ex)
        tb = fm.meta["slb"].get("tool_bias") or {}
        bias = np.array([float(tb.get(n, 0.0)) for n in names], np.float32)
        cs = fm.scores([e.text for e in fm.choose], keys) + bias
        hs = fm.scores([e.text for e in fm.held], keys) + bias
        c_ok = [np.array([names[j] in e.positives for j in range(len(names))]) for e in fm.choose]
        cm = margins(cs)
        thrs = {q: float(np.quantile(cm, q)) for q in ESCALATE_Q}
        esc = np.where(cm < max(thrs.values()))[0]
        ctop = {int(i): np.argsort(-cs[i], kind="stable")[:k] for i in esc}
        cfeat = {i: features(fm.choose[i].text, top) for i, top in ctop.items()}
        base_right = np.array([c_ok[i][int(np.argmax(cs[i]))] for i in range(len(cs))])
        best = (float(base_right.mean()), "none", 0.0, 0.0)
        grid = []
        for q, thr in thrs.items():
            for feat in FEATURES:
                for alpha in ALPHAS:
                    right = base_right.copy()
                    for i, top in ctop.items():
                        if cm[i] < thr:
                            right[i] = c_ok[i][top[rerank(cs[i][top], cfeat[i][feat], alpha)]]
                    acc = float(right.mean())
                    grid.append({"q": q, "feature": feat, "alpha": alpha, "choose_top1": acc})
                    if acc > best[0]:
                        best = (acc, feat, alpha, thr)
        c_acc, feat, alpha, thr = best
        esc_c = [i for i in ctop if cm[i] < thr]
        fold = {"model": fm.dir.name, "n": len(fm.idxs), "n_choose": len(fm.choose),
                "choose_top1_none": float(base_right.mean()), "choose_top1": c_acc, "feature": feat,
                "alpha": alpha, "threshold": thr, "choose_escalation_rate": len(esc_c) / len(cs),
                "choose_escalated_slb_top1": float(np.mean([base_right[i] for i in esc_c])) if esc_c else None,
                "grid": grid, "sizes": {}}
        print(f"fold {f}: choose {100 * base_right.mean():.1f} -> {100 * c_acc:.1f} ({feat}, alpha {alpha}, "
              f"threshold {thr:.4f}, escalating {100 * fold['choose_escalation_rate']:.1f} %)", flush=True)
        for s in sizes:
            row = {arm: [] for arm in arms}
            n_esc, esc_right = 0, {arm: [] for arm in arms}
            for d, regs in enumerate(proto.draw_regs):
                for r, i in enumerate(fm.idxs):
                    mask = np.zeros(len(names), bool)
                    mask[[pos[t] for t in regs[s][i] if t in pos]] = True
                    sc = np.where(mask, hs[r], -np.inf)
                    top = np.argsort(-sc, kind="stable")[:k]
                    pick = {"none": int(top[0]), "arg evidence": int(top[0])}
                    m = float(margins(sc[None])[0])
                    if feat != "none" and m < thr:
                        n_esc += 1
                        pick["arg evidence"] = int(top[rerank(sc[top], features(fm.held[r].text, top)[feat], alpha)])
                    for arm in arms:
                        ok = names[pick[arm]] in fm.held[r].positives
                        row[arm].append(ok)
                        hits[arm][s][f"{lines[i].id}#{d}"] = ok
                        if feat != "none" and m < thr:
                            esc_right[arm].append(ok)
            fold["sizes"][s] = {"top1": {arm: float(np.mean(v)) for arm, v in row.items()},
                                "escalation_rate": n_esc / max(1, len(row["none"])),
                                "escalated_top1": {arm: (float(np.mean(v)) if v else None)
                                                   for arm, v in esc_right.items()}}
            e = fold["sizes"][s]
            print(f"fold {f} N={s}: none {100 * e['top1']['none']:.1f} | arg evidence "
                  f"{100 * e['top1']['arg evidence']:.1f} | escalated {100 * e['escalation_rate']:.1f} %", flush=True)
        per_fold[str(f)] = fold

    pooled, paired = pool_line_draws(hits, "none")
    secs = np.array(cache.line_seconds) if cache.line_seconds else np.zeros(1)
    escalation = {s: float(np.mean([per_fold[f]["sizes"][s]["escalation_rate"] for f in per_fold])) for s in sizes}
    report = {"folds": [int(x) for x in a.folds.split(",")], "n": sum(v["n"] for v in per_fold.values()),
              "draws": a.draws, "top_k": k, "grids": {"features": list(FEATURES), "alphas": list(ALPHAS),
                                                       "escalate_quantiles": list(ESCALATE_Q), "clip": CLIP},
              "reader": {"path": a.slots, "threshold": reader.threshold, "data_hash": reader.meta.get("data_hash"),
                         "ms_per_escalated_line_p50": round(1000 * float(np.median(secs)), 1),
                         "ms_per_escalated_line_p99": round(1000 * float(np.quantile(secs, 0.99)), 1),
                         "threads": 1},
              "calibration": {"source": a.calibration, "n_lines": len(calib)}, "per_fold": per_fold,
              "escalation_rate_mean_over_folds": escalation,
              "pooled": pooled, "paired_vs_none_line_draws": paired, "seconds": round(time.time() - t0, 1),
              "protocol": "the evaluation's folds and registries (seed 0, --draws draws); feature, alpha and escalation "
                          "threshold chosen per fold on the model's validation + calibration lines; float cosine "
                          "scores with the model's tool bias; the reader never trained on train.jsonl or the "
                          "calibration lines"}
    write_report(a.json, report, plot, echo=(pooled_top1(pooled), paired))
    return 0


if __name__ == "__main__":
    sys.exit(main())
