"""Do some tools attract other tools' requests? Hubness correction and per-tool biases on the SLB score (issue 4).

    nice -n 19 .venv/bin/python bench/routing_rescore.py --folds 0,1,2 --draws 3 --json reports/routing_rescore.json

The errors left at N = 250 (reports/routing_experiments.md §17) repeat a few wrong picks: ``add_comment_to_pending_review``,
``create_entities``, ``slack_add_reaction`` win requests of several other tools. In nearest-neighbour retrieval such
"hubs" are a known failure, and two cheap corrections act on the score alone (no model, an addend per tool):

* ``hubness`` (CSLS-like): ``s(q, t) - lam * r_t``, where ``r_t`` is the mean of tool t's ``K`` best SLB scores
  over the exemplar requests of *other* tools (how strongly t pulls foreign requests); computable for any tool,
  also one registered after training (the exemplar pool is the model's);
* ``bias``: a learned addend ``b_t`` per tool, fitted by L2-regularised softmax regression on the model's exemplar
  requests, each scored with its own row left out (the confusions an unseen request meets); a tool without a fit
  row keeps 0;
* ``bias + hubness``: both addends, their parameters chosen jointly.

Arms' parameters (``lam`` and ``K``; the L2 strength ``mu``) are chosen per fold on the model's validation +
data/routing_calibration lines (full-registry top-1, ties to the better MRR@10, as ``calibrate_slb`` chooses),
never on held-out lines; ``none`` is the scoring without either (description key + w x log-mean-exp exemplars at
the model's calibrated w, T, gap: slb-cal-v7; v8 adopted ``bias`` as the model's ``tool_bias``). Held out: the fold's lines at each size over ``--draws`` draws of distractors (the
evaluation's registries), float cosine scores. Written: chosen parameters, held-out top-1 per size with bootstrap
CIs, the paired difference against ``none``, the most-pulled tools, and a PNG.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from routing_aggregate import first_hits  # noqa: E402

from services.evals.routing_models import prepare_training_env  # noqa: E402

HUB_K = (5, 10, 20, 50, 100)
HUB_LAMBDA = (0.05, 0.1, 0.2, 0.3, 0.5)
BIAS_MU = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
BIAS_BETA = 10.0  # the bias fit's softmax inverse temperature (the SLB's own on fold 0's rows: 5.6)


def hub_scores(pool_scores: np.ndarray, foreign: np.ndarray, k: int) -> np.ndarray:
    """Per tool, the mean of its ``k`` best scores over the pool's requests that are not its own
    (``foreign[r, t]``: request r belongs to neither t nor an equivalent of t)."""
    s = np.where(foreign, pool_scores, -np.inf)
    top = -np.sort(-s, axis=0)[:k]
    live = np.isfinite(top)
    n = live.sum(axis=0)
    return np.where(n > 0, np.where(live, top, 0.0).sum(axis=0) / np.maximum(n, 1), 0.0).astype(np.float32)


def plot(report: dict, path: str) -> None:
    from services.evals.routing import plot_pooled

    n, draws = report["n"], report["draws"]
    plot_pooled(path, report["pooled"], f"Score corrections chosen on calibration lines ({n} held-out lines x "
                                        f"{draws} draws)")


def main() -> int:
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap, sizes="10,250,all", calibration=True, draws=3)
    ap.add_argument("--json", default="reports/routing_rescore.json")
    a = ap.parse_args()

    prepare_training_env()

    from services.evals.routing import pool_line_draws, pooled_top1, write_report
    from services.evals.routing_models import float_bench
    from services.training.data import equivalents
    from services.training.gate import (
        fit_tool_bias,
        float_tool_scores,
    )

    t0 = time.time()
    fb = float_bench(a)
    proto, names, pos, keys, calib = fb.proto, fb.names, fb.pos, fb.keys, fb.calib
    lines, sizes = proto.lines, proto.sizes

    def right_rows(sets) -> np.ndarray:
        out = np.zeros((len(sets), len(names)), bool)
        for r, p in enumerate(sets):
            out[r, [pos[n] for n in p if n in pos]] = True
        return out

    arms = ("none", "hubness", "bias", "bias + hubness")
    per_fold: dict[str, dict] = {}
    hits: dict[str, dict[str, dict[str, bool]]] = {arm: {s: {} for s in sizes} for arm in arms}
    for f in [int(x) for x in a.folds.split(",")]:
        fm = fb.fold(f, a.models_root)
        w, temp, gap, rows, ex_v, tool_of_row = fm.w, fm.temp, fm.gap, fm.rows, fm.ex_v, fm.tool_of_row
        choose, held_ex, idxs, gdir = fm.choose, fm.held, fm.idxs, fm.dir
        cs, hs = fm.scores([e.text for e in choose], keys), fm.scores([e.text for e in held_ex], keys)
        c_right, h_right = right_rows([e.positives for e in choose]), right_rows([e.positives for e in held_ex])
        # the exemplar pool as requests: every row, its own row left out
        row_right = right_rows([equivalents(r["tool"]) | {r["tool"]} for r in rows])
        loo = float_tool_scores(ex_v, keys, ex_v, tool_of_row, w, temp, gap, leave_out=np.arange(len(rows)))
        print(f"fold {f}: model {gdir.name}, w {w}, T {temp}; {len(rows)} exemplar rows, leave-one-out top-1 "
              f"{100 * np.mean(row_right[np.arange(len(rows)), loo.argmax(1)]):.1f} %", flush=True)

        candidates: dict[str, list[tuple[str, np.ndarray]]] = {"none": [("-", np.zeros(len(names), np.float32))]}
        candidates["hubness"] = []
        for k in HUB_K:
            r_t = hub_scores(loo, ~row_right, k)
            candidates["hubness"] += [(f"K {k}, lam {lam}", -lam * r_t) for lam in HUB_LAMBDA]
        candidates["bias"] = [(f"mu {mu:g}", fit_tool_bias(loo, row_right, mu, BIAS_BETA)) for mu in BIAS_MU]
        candidates["bias + hubness"] = [(f"{b}; {h}", ba + ha) for b, ba in candidates["bias"]
                                        for h, ha in candidates["hubness"]]
        fold = {"model": gdir.name, "n": len(idxs), "n_choose": len(choose), "arms": {}}
        for arm in arms:
            best = None
            for label, add in candidates[arm]:
                r = first_hits(cs + add, list(c_right))
                key = (float(np.mean(r == 1)), float(np.mean(np.where(r > 0, 1.0 / np.maximum(r, 1), 0.0))))
                if best is None or key > best[0]:
                    best = (key, label, add)
            assert best is not None
            (top1, mrr), label, add = best
            row = {"param": label, "choose_top1": top1, "choose_mrr": mrr, "sizes": {}}
            if arm != "none":
                order = np.argsort(add)
                row["most_lowered"] = [(names[j], round(float(add[j]), 4)) for j in order[:8]]
                row["most_raised"] = [(names[j], round(float(add[j]), 4)) for j in order[::-1][:5]]
            for s in sizes:
                ok = []
                for d, regs in enumerate(proto.draw_regs):
                    mask = right_rows([regs[s][i] for i in idxs])
                    got = first_hits(hs + add, list(h_right), mask, depth=1) == 1
                    ok.append(got)
                    hits[arm][s].update({f"{lines[i].id}#{d}": bool(g) for i, g in zip(idxs, got, strict=True)})
                row["sizes"][s] = float(np.mean(ok))
            fold["arms"][arm] = row
            print(f"fold {f} {arm:8s} {label:16s}: choose {100 * top1:.1f} | "
                  + " ".join(f"N={s} {100 * v:.1f}" for s, v in row["sizes"].items()), flush=True)
        per_fold[str(f)] = fold

    pooled, paired = pool_line_draws(hits, "none")
    report = {"folds": [int(x) for x in a.folds.split(",")], "n": sum(v["n"] for v in per_fold.values()),
              "draws": a.draws, "grids": {"hub_k": list(HUB_K), "hub_lambda": list(HUB_LAMBDA),
                                          "bias_mu": list(BIAS_MU), "bias_beta": BIAS_BETA},
              "calibration": {"source": a.calibration, "n_lines": len(calib)}, "per_fold": per_fold,
              "pooled": pooled, "paired_vs_none_line_draws": paired, "seconds": round(time.time() - t0, 1),
              "protocol": "the evaluation's folds and registries (seed 0, --draws draws); each arm's parameters chosen "
                          "per fold on the model's validation + calibration lines; float cosine scores"}
    write_report(a.json, report, plot, echo=(pooled_top1(pooled), paired))
    return 0


if __name__ == "__main__":
    sys.exit(main())
