"""Argument-level evidence as the gate's second stage: does the slot reader separate the twins the SLB confuses?
(issue 4)

    nice -n 19 .venv/bin/python bench/routing_arg_evidence.py --folds 0,1,2 --draws 3 \
        --json reports/routing_arg_evidence.json

The data's close neighbours differ in what the request states, not in what it is about
(shared/data/queries/README.md): ``pods_list`` vs ``pods_list_in_namespace`` (a namespace), ``git_*`` vs GitHub
(a local path), ``puppeteer_*`` vs ``browser_*`` (a CSS selector vs a snapshot ref), get vs list (an id). Six
cross-encoders read name + description and stayed at chance on the lines the gate escalates (§18). This bench
asks the engine's slot reader (``services/engine/slots.py``: MiniLM with a span head, trained on the augment lines
only, never on train.jsonl or the calibration lines) for each of the SLB's top 4 (or 2) candidates: how
strongly does the request state each of its parameters? A candidate's feature:

* ``req_min``: the weakest of its required parameters' scores (best-span logit minus the "not stated" logit,
  clipped to +-``CLIP`` and scaled to +-1); a tool with no required span parameter scores 0;
* ``req_mean``: their mean;
* ``stated``: how many of its span parameters (required or not) the reader finds stated (score above its
  threshold);

and on a line whose SLB margin (top-1 minus top-2, the model's float score with its tool bias) is below the
escalation threshold, the top candidates are re-ranked by ``slb + alpha * feature``. The feature, alpha and the
threshold (a quantile of the choosing lines' margins) are chosen per fold on the model's validation + calibration
lines (full registry, top-1; none of them trained the reader); ``none`` is the SLB alone. Held out: the fold's lines at
each size over ``--draws`` draws of distractors (the evaluation's registries), the margin taken within each
registry. Arms (``VARIANTS``): every parameter read; only the parameters not every candidate has (``distinct``, the
product's reading); and two cheaper ones, required parameters only (``req_*`` features) over the top 4 or top 2.
Written: choices, held-out top-1 per size with bootstrap CIs, escalation rates, accuracy on the escalated lines,
the paired difference against ``none``, questions and padded reader tokens per escalation (the reader's cost:
~0.3 ms per token on one thread of this VM), and a PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from services.evals.routing_models import prepare_training_env  # noqa: E402
from services.router.argevidence import (  # noqa: E402
    ALPHAS,
    CLIP,
    ESCALATE_Q,
    FEATURES,
    MIN_GAIN,
    REQUIRED_FEATURES,
    calibrate,
    candidate_feature,
    drop_shared,
    margins,
    read,
    rerank,
)

# arm -> features over what tells the candidates apart only (parameters every candidate has are not read)
# arm -> (distinct reading, candidates re-ranked, features the calibration chooses from): every parameter, distinct
# ones (the product), and the cheaper required-only ones, each escalation's cost counted in padded reader tokens
VARIANTS: dict[str, tuple[bool, int, tuple[str, ...]]] = {
    "arg evidence": (False, 4, FEATURES),
    "arg evidence (distinct)": (True, 4, FEATURES),
    "required, top 4": (True, 4, REQUIRED_FEATURES),
    "required, top 2": (True, 2, REQUIRED_FEATURES),
}

__all__ = ["ALPHAS", "CLIP", "ESCALATE_Q", "FEATURES", "ReaderCache", "candidate_feature", "margins", "rerank"]


class ReaderCache:
    """The slot reader's scores per (request text, tool), computed once, and each question's token count (question +
    request context, as the reader's batch holds it)."""

    def __init__(self, model, by_name):
        self.model, self.by_name = model, by_name
        self.cache: dict[tuple[str, str], list[tuple[str, bool, float]]] = {}
        self.tokens: dict[tuple[str, str, str], int] = {}
        self.line_seconds: list[float] = []

    def read(self, text: str, tools: Sequence[str]) -> list[list[tuple[str, bool, float]]]:
        from services.engine.slots import slot_context, slot_params, slot_question

        t0, fresh = time.perf_counter(), [n for n in tools if (text, n) not in self.cache]
        for name in fresh:
            self.cache[(text, name)] = read(self.model, text, [self.by_name[name]], required_only=False)[0]
        if fresh:
            self.line_seconds.append(time.perf_counter() - t0)
            ctx, _ = slot_context(text)
            for name in fresh:
                tool = self.by_name[name]
                qs = [(p, slot_question(tool, p, prop)) for p, prop in slot_params(tool)]
                if qs:
                    enc = self.model.tokenizer([q for _, q in qs], [ctx] * len(qs), truncation="only_second",
                                               max_length=self.model.max_len)
                    self.tokens.update({(text, name, p): len(ids) for (p, _), ids in zip(qs, enc["input_ids"],
                                                                                         strict=True)})
        return [self.cache[(text, n)] for n in tools]

    def padded_tokens(self, text: str, tools: Sequence[str], readings: Sequence[Sequence[tuple[str, bool, float]]],
                      required_only: bool) -> int:
        """Tokens of the one batch that reads ``readings`` (questions x the longest): the reader's cost."""
        lens = [self.tokens[(text, n, p)] for n, rd in zip(tools, readings, strict=True) for p, r, _ in rd
                if r or not required_only]
        return len(lens) * max(lens) if lens else 0


def plot(report: dict, path: str) -> None:
    from services.evals.routing import plot_pooled

    n, draws = report["n"], report["draws"]
    plot_pooled(path, report["pooled"], f"Argument evidence on escalated lines ({n} held-out lines x {draws} draws)")


def main(argv: Sequence[str] | None = None, reader=None, reader_for=None) -> int:
    """``reader``: a reader object to use instead of the slot reader at ``--slots`` (``score``, ``threshold``,
    ``meta``, ``tokenizer``, ``max_len`` as services.engine.slots.SlotModel has them; bench/routing_stated_probe.py
    passes its probe); ``reader_for(fold_model)``: a reader per fold model instead (bench/routing_late_reader.py's
    read the fold's own query encoder)."""
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap, sizes="10,250,all", calibration=True, draws=3)
    ap.add_argument("--slots", default="var/models/slots", help="the slot reader (nexus train-slots)")
    ap.add_argument("--json", default="reports/routing_arg_evidence.json")
    ap.add_argument("--alphas", default=",".join(str(x) for x in ALPHAS),
                    help="the grid alpha is chosen from (the product's: %(default)s)")
    ap.add_argument("--dump-escalations", default="", metavar="FILE",
                    help="write every escalated held-out (line, draw) as JSON lines: its candidates, their SLB scores "
                         "and features, and both picks per arm (what an error analysis reads)")
    ap.add_argument("--clip", type=float, default=CLIP,
                    help="where a required parameter's score saturates in req_min / req_mean (the product's: "
                         "%(default)s)")
    ap.add_argument("--enum-words", action="store_true",
                    help="enum parameters whose values the request's words name read as stated "
                         "(argevidence.ENUM_WORDS; reports/routing_experiments.md §28)")
    a = ap.parse_args(argv)
    alphas = [float(x) for x in a.alphas.split(",")]
    if a.enum_words:
        from services.router import argevidence

        argevidence.ENUM_WORDS = True
    dump = open(a.dump_escalations, "w") if a.dump_escalations else None  # closed after the folds

    prepare_training_env()

    from services.engine.slots import SlotModel
    from services.evals.routing import pool_line_draws, pooled_top1, write_report
    from services.evals.routing_models import float_bench

    t0 = time.time()
    fb = float_bench(a)
    proto, names, pos, by_name, keys, calib = fb.proto, fb.names, fb.pos, fb.by_name, fb.keys, fb.calib
    lines, sizes = proto.lines, proto.sizes
    if reader_for is None:
        reader = reader if reader is not None else SlotModel(a.slots, threads=1)
    k = max(t for _, t, _ in VARIANTS.values())
    secs_all: list[float] = []

    arms = ("none", *VARIANTS)
    per_fold: dict[str, dict] = {}
    hits: dict[str, dict[str, dict[str, bool]]] = {arm: {s: {} for s in sizes} for arm in arms}
    for f in [int(x) for x in a.folds.split(",")]:
        fm = fb.fold(f, a.models_root)
        if reader_for is not None:
            reader = reader_for(fm)
        cache = ReaderCache(reader, by_name)

        def features(text: str, top: np.ndarray, distinct: bool, cache=cache, reader=reader
                     ) -> tuple[dict[str, np.ndarray], list]:
            readings = cache.read(text, [names[j] for j in top])
            readings = drop_shared(readings) if distinct else readings
            return ({f: np.array([candidate_feature(r, f, reader.threshold, a.clip) for r in readings])
                     for f in FEATURES},
                    readings)

        def read_all(text: str, tools: list[str], cache=cache) -> list:
            return cache.read(text, tools)

        bias = fm.bias(names)
        cs = fm.scores([e.text for e in fm.choose], keys) + bias
        hs = fm.scores([e.text for e in fm.held], keys) + bias
        row_of = {e.text: r for r, e in enumerate(fm.choose)}

        def decide(text: str, n: int, cs=cs, row_of=row_of) -> list[tuple[str, float]]:
            top = np.argsort(-cs[row_of[text]], kind="stable")[:n]
            return [(names[j], float(cs[row_of[text]][j])) for j in top]

        fold = {"model": fm.dir.name, "n": len(fm.idxs), "n_choose": len(fm.choose), "arms": {}}
        chosen = {}
        for arm, (distinct, top_k, feats_of_arm) in VARIANTS.items():
            sec = calibrate(decide, fm.choose, by_name.get, reader, fm.meta, top_k=top_k, distinct=distinct,
                            features=feats_of_arm, read_all=read_all, alphas=alphas, clip=a.clip)
            chosen[arm] = sec
            fold["arms"][arm] = {key: sec[key] for key in ("feature", "alpha", "tau", "quantile", "choose_top1_slb",
                                                         "choose_top1", "choose_escalation_rate", "best_if_kept")}
            fold["arms"][arm]["sizes"] = {}
            print(f"fold {f} {arm}: choose {100 * sec['choose_top1_slb']:.1f} -> {100 * sec['choose_top1']:.1f} "
                  f"({sec['feature']}, alpha {sec['alpha']}, tau {sec['tau']:.4f}, escalating "
                  f"{100 * sec['choose_escalation_rate']:.1f} %)", flush=True)
        for s in sizes:
            row = {arm: [] for arm in arms}
            n_esc = {arm: 0 for arm in VARIANTS}
            esc_right = {arm: {"none": [], "arm": []} for arm in VARIANTS}
            reads = {arm: [] for arm in VARIANTS}
            tokens = {arm: [] for arm in VARIANTS}
            for d, regs in enumerate(proto.draw_regs):
                for r, i in enumerate(fm.idxs):
                    mask = np.zeros(len(names), bool)
                    mask[[pos[t] for t in regs[s][i] if t in pos]] = True
                    sc = np.where(mask, hs[r], -np.inf)
                    top = np.argsort(-sc, kind="stable")[:k]
                    m = float(margins(sc[None])[0])
                    pick = {arm: int(top[0]) for arm in arms}
                    for arm, (distinct, top_k, _) in VARIANTS.items():
                        sec = chosen[arm]
                        if sec["feature"] != "none" and m < sec["tau"]:
                            cand = top[:top_k]
                            feats, readings = features(fm.held[r].text, cand, distinct)
                            pick[arm] = int(cand[rerank(sc[cand], feats[sec["feature"]], sec["alpha"])[0]])
                            n_esc[arm] += 1
                            req_only = sec["feature"] != "stated"
                            reads[arm].append(sum(len([x for x in rd if not req_only or x[1]]) for rd in readings))
                            tokens[arm].append(cache.padded_tokens(fm.held[r].text, [names[j] for j in cand],
                                                                   readings, req_only))
                            esc_right[arm]["none"].append(names[top[0]] in fm.held[r].positives)
                            esc_right[arm]["arm"].append(names[pick[arm]] in fm.held[r].positives)
                            if dump is not None:
                                dump.write(json.dumps({
                                    "fold": f, "size": s, "draw": d, "id": lines[i].id, "tool": lines[i].tool,
                                    "text": fm.held[r].text, "arm": arm, "feature": sec["feature"],
                                    "alpha": sec["alpha"], "margin": m, "candidates": [names[j] for j in cand],
                                    "slb": [float(sc[j]) for j in cand],
                                    "features": [float(x) for x in feats[sec["feature"]]],
                                    "readings": [[list(x) for x in rd] for rd in readings],
                                    "pick_none": names[top[0]], "pick": names[pick[arm]],
                                    "right_none": names[top[0]] in fm.held[r].positives,
                                    "right": names[pick[arm]] in fm.held[r].positives}) + "\n")
                    for arm in arms:
                        ok = names[pick[arm]] in fm.held[r].positives
                        row[arm].append(ok)
                        hits[arm][s][f"{lines[i].id}#{d}"] = ok
            for arm in VARIANTS:
                fold["arms"][arm]["sizes"][s] = {
                    "top1_none": float(np.mean(row["none"])), "top1": float(np.mean(row[arm])),
                    "escalation_rate": n_esc[arm] / max(1, len(row["none"])),
                    "escalated_top1_none": float(np.mean(esc_right[arm]["none"])) if n_esc[arm] else None,
                    "escalated_top1": float(np.mean(esc_right[arm]["arm"])) if n_esc[arm] else None,
                    "questions_per_escalation_mean": float(np.mean(reads[arm])) if reads[arm] else None,
                    "padded_tokens_per_escalation_p50": float(np.median(tokens[arm])) if tokens[arm] else None,
                    "padded_tokens_per_escalation_p99": float(np.quantile(tokens[arm], 0.99)) if tokens[arm] else None}
            print(f"fold {f} N={s}: none {100 * np.mean(row['none']):.1f} | " + " | ".join(
                f"{arm} {100 * np.mean(row[arm]):.1f} (escalated {100 * n_esc[arm] / len(row['none']):.1f} %, "
                f"{np.mean(reads[arm]) if reads[arm] else 0:.1f} questions, "
                f"{np.median(tokens[arm]) if tokens[arm] else 0:.0f} tokens)" for arm in VARIANTS), flush=True)
        per_fold[str(f)] = fold
        secs_all.extend(cache.line_seconds)

    if dump is not None:
        dump.close()
    pooled, paired = pool_line_draws(hits, "none")
    secs = np.array(secs_all) if secs_all else np.zeros(1)
    escalation = {arm: {s: float(np.mean([per_fold[f]["arms"][arm]["sizes"][s]["escalation_rate"] for f in per_fold]))
                        for s in sizes} for arm in VARIANTS}
    questions = {arm: {s: float(np.mean([per_fold[f]["arms"][arm]["sizes"][s]["questions_per_escalation_mean"] or 0
                                         for f in per_fold])) for s in sizes} for arm in VARIANTS}
    report = {"folds": [int(x) for x in a.folds.split(",")], "n": sum(v["n"] for v in per_fold.values()),
              "draws": a.draws, "top_k": k, "variants": {arm: {"distinct": d, "top_k": t, "features": list(fs)}
                                                         for arm, (d, t, fs) in VARIANTS.items()},
              "grids": {"features": list(FEATURES), "alphas": alphas,
                                                       "escalate_quantiles": list(ESCALATE_Q), "clip": a.clip,
                                                       "enum_words": a.enum_words,
                                                       "min_gain": MIN_GAIN},
              "reader": {"path": reader.meta.get("path", a.slots), "threshold": reader.threshold, "data_hash": reader.meta.get("data_hash"),
                         "ms_per_uncached_line_all_params_p50": round(1000 * float(np.median(secs)), 1),
                         "threads": 1},
              "escalation_rate_mean_over_folds": escalation, "questions_per_escalation_mean_over_folds": questions,
              "calibration": {"source": a.calibration, "n_lines": len(calib)}, "per_fold": per_fold,
              "pooled": pooled, "paired_vs_none_line_draws": paired, "seconds": round(time.time() - t0, 1),
              "protocol": "the evaluation's folds and registries (seed 0, --draws draws); feature, alpha and escalation "
                          "threshold chosen per fold on the model's validation + calibration lines; float cosine "
                          "scores with the model's tool bias; the reader never trained on train.jsonl or the "
                          "calibration lines"}
    write_report(a.json, report, plot, echo=(pooled_top1(pooled), paired))
    return 0


if __name__ == "__main__":
    sys.exit(main())
