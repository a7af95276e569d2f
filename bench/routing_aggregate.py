"""How should a tool's exemplar similarities combine? The SLB's best exemplar (max) vs smoother poolings.

    nice -n 19 .venv/bin/python bench/routing_aggregate.py --folds 0,1,2 --draws 2 --json reports/routing_aggregate.json

The SLB scores a tool ``key_sim + w * max(exemplar sims)`` (services/router/slb.py). Max listens to one exemplar:
a single stray request of a neighbour can win a line. Arms, each with its parameters chosen per fold on the
model's validation lines + data/routing_calibration (full-registry top-1, ties to the better MRR@10, as
``calibrate_slb`` chooses), never on the held-out lines:

* ``max`` — the product's scoring, ``w`` from ``W_GRID`` (a grid to 5: the calibration lines favour large w);
* ``log-mean-exp`` — ``T * log(mean(exp(sims / T)))``: max as T -> 0, the mean as T grows;
* ``log-sum-exp`` — ``T * log(sum(exp(sims / T)))``: also rewards several close exemplars;
* ``top-2 mean`` — the mean of the two best exemplars;
* ``max + kNN vote`` — max plus ``v`` times the tool's share of the K nearest exemplar rows.

For each fold of the routing evaluation (same folds, registries, seed), the fold's cached gate model
(``train_cached``; trained if missing) embeds the lines with its query encoder; its exemplar rows are its own
(``exemplars.npy``). Scores are float cosines: the router's INT8 scan differs in the third decimal, so ``max`` here
is the product's ranking up to INT8 ties. Written: per fold and arm the chosen parameters and their calibration
top-1, held-out top-1 per size over ``--draws`` draws of distractors (bootstrap CI over lines), the paired
difference against ``max``, and a PNG.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evals.routing_models import prepare_training_env  # noqa: E402

W_GRID = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0)
ARMS: dict[str, list[tuple[str, float]]] = {  # name -> [(pooling, its parameter)]
    "max": [("max", 0.0)],
    "log-mean-exp": [("lme", t) for t in (0.01, 0.02, 0.03, 0.05, 0.08)],
    "log-sum-exp": [("lse", t) for t in (0.01, 0.02, 0.03, 0.05)],
    "top-2 mean": [("top", 2)],
    "max + kNN vote": [(f"vote{k}", v) for k in (5, 10, 20) for v in (0.05, 0.1, 0.2, 0.3)],
}


def pool(sims: np.ndarray, tool_of_row: np.ndarray, n_tools: int, kind: str, param: float) -> np.ndarray:
    """Per query and tool, the pooled similarity of the tool's exemplar rows (``sims``: queries x rows;
    ``tool_of_row``: each row's tool index); ``-inf`` for a tool without rows. ``kind``: ``max``, ``lme``
    (log-mean-exp at temperature ``param``), ``lse`` (log-sum-exp), ``top`` (mean of the ``param`` best)."""
    from services.router.slb import pool_exemplars

    if kind not in ("max", "lme", "lse", "top"):
        raise ValueError(f"unknown pooling {kind!r}")
    out = np.full((sims.shape[0], n_tools), -np.inf, np.float32)
    order = np.argsort(tool_of_row, kind="stable")
    tools, starts, counts = np.unique(tool_of_row[order], return_index=True, return_counts=True)
    s = np.ascontiguousarray(sims[:, order], np.float32)
    if kind == "top":
        for t, a, c in zip(tools, starts, counts, strict=True):
            k = min(int(param), c)
            out[:, t] = -np.sort(-s[:, a : a + c], 1)[:, :k].mean(1)
        return out
    # the router's pooling (max, or log-mean-exp); log-sum-exp is log-mean-exp + T log(count)
    out[:, tools] = pool_exemplars(s, starts, 0.0 if kind == "max" else param, counts)
    if kind == "lse":
        out[:, tools] += np.float32(param) * np.log(counts).astype(np.float32)
    return out


def knn_vote(sims: np.ndarray, tool_of_row: np.ndarray, n_tools: int, k: int) -> np.ndarray:
    """Per query, each tool's share of the ``k`` most similar exemplar rows (rows sum to 1)."""
    k = min(k, sims.shape[1])
    top = np.argpartition(-sims, k - 1, 1)[:, :k]
    out = np.zeros((sims.shape[0], n_tools), np.float32)
    np.add.at(out, (np.repeat(np.arange(sims.shape[0]), k), tool_of_row[top].ravel()), 1.0 / k)
    return out


def arm_scores(key: np.ndarray, sims: np.ndarray, tool_of_row: np.ndarray, kind: str, param: float,
               w: float) -> np.ndarray:
    """``key + w * pooled exemplar sim`` (``vote<K>``: ``key + w * max + param * kNN vote share``); a tool without
    exemplar rows pools to its key sim."""
    n_tools = key.shape[1]
    if kind.startswith("vote"):
        best = pool(sims, tool_of_row, n_tools, "max", 0.0)
        extra = param * knn_vote(sims, tool_of_row, n_tools, int(kind[4:]))
    else:
        best, extra = pool(sims, tool_of_row, n_tools, kind, param), 0.0
    return key + w * np.where(np.isfinite(best), best, key) + extra


def first_hits(scores: np.ndarray, positives: list[np.ndarray], mask: np.ndarray | None = None,
               depth: int = 10) -> np.ndarray:
    """1-based rank of the first right tool within ``depth`` (0 = none) per row; ``mask`` restricts the tools."""
    s = scores if mask is None else np.where(mask, scores, -np.inf)
    top = np.argsort(-s, 1, kind="stable")[:, :depth]
    return np.array([next((j + 1 for j, t in enumerate(row) if pos[t]), 0) for row, pos in zip(top, positives,
                                                                                              strict=True)])


def plot(report: dict, path: str) -> None:
    from services.evals.routing import plot_pooled

    n, draws = report["n"], report["draws"]
    plot_pooled(path, report["pooled"], f"Exemplar pooling chosen on calibration lines ({n} held-out lines x "
                                        f"{draws} draws)")


def main() -> int:
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap, sizes="10,250,all", calibration=True, draws=1)
    ap.add_argument("--json", default="reports/routing_aggregate.json")
    a = ap.parse_args()

    prepare_training_env()

    from services.evals.routing import pool_line_draws, pooled_top1, write_report
    from services.evals.routing_models import float_bench

    t0 = time.time()
    fb = float_bench(a)
    proto, names, pos, keys, calib = fb.proto, fb.names, fb.pos, fb.keys, fb.calib
    lines, sizes = proto.lines, proto.sizes

    def pos_rows(tools_or_sets) -> list[np.ndarray]:
        out = []
        for p in tools_or_sets:
            row = np.zeros(len(names), bool)
            row[[pos[n] for n in p]] = True
            out.append(row)
        return out

    folds = [int(f) for f in a.folds.split(",")]
    per_fold: dict[str, dict] = {}
    hits: dict[str, dict[str, dict[str, bool]]] = {arm: {s: {} for s in sizes} for arm in ARMS}  # per (line, draw)
    for f in folds:
        fm = fb.fold(f, a.models_root)
        gdir, idxs, cal, held_ex = fm.dir, fm.idxs, fm.choose, fm.held
        cq, hq = fm.embed([e.text for e in cal]), fm.embed([e.text for e in held_ex])
        ex_v, tool_of_row = fm.ex_v, fm.tool_of_row
        cpos, hpos = pos_rows([e.positives for e in cal]), pos_rows([e.positives for e in held_ex])
        ck, hk, cs, hs = cq @ keys.T, hq @ keys.T, cq @ ex_v.T, hq @ ex_v.T
        masks = {(s, d): np.array(pos_rows([regs[s][i] for i in idxs]))
                 for d, regs in enumerate(proto.draw_regs) for s in sizes}
        per_fold[str(f)] = {"model": gdir.name, "n": len(idxs), "n_choose": len(cal), "arms": {}}
        for arm, settings in ARMS.items():
            best = None
            for (kind, param), w in itertools.product(settings, W_GRID):
                r = first_hits(arm_scores(ck, cs, tool_of_row, kind, param, w), cpos)
                key = (float(np.mean(r == 1)), float(np.mean(np.where(r > 0, 1.0 / np.maximum(r, 1), 0.0))))
                if best is None or key > best[0]:
                    best = (key, kind, param, w)
            assert best is not None
            (top1, mrr), kind, param, w = best
            hscore = arm_scores(hk, hs, tool_of_row, kind, param, w)
            row = {"pooling": kind, "param": param, "w": w, "choose_top1": top1, "choose_mrr": mrr, "sizes": {}}
            for s in sizes:
                ok = []
                for d in range(len(proto.draw_regs)):
                    got = first_hits(hscore, hpos, masks[s, d], depth=1) == 1
                    ok.append(got)
                    hits[arm][s].update({f"{lines[i].id}#{d}": bool(g) for i, g in zip(idxs, got, strict=True)})
                row["sizes"][s] = float(np.mean(ok))
            per_fold[str(f)]["arms"][arm] = row
            print(f"fold {f} {arm:16s} {kind}:{param} w {w}: choose {100 * top1:.1f} | "
                  + " ".join(f"N={s} {100 * v:.1f}" for s, v in row["sizes"].items()), flush=True)

    pooled, paired = pool_line_draws(hits, "max")
    report = {"folds": folds, "n": sum(v["n"] for v in per_fold.values()), "draws": a.draws, "w_grid": list(W_GRID),
              "arms": {k: [list(x) for x in v] for k, v in ARMS.items()},
              "calibration": {"source": a.calibration, "n_lines": len(calib)}, "per_fold": per_fold,
              "pooled": pooled, "paired_vs_max_line_draws": paired, "seconds": round(time.time() - t0, 1),
              "protocol": "the evaluation's folds and registries (seed 0, --draws draws); each arm's parameters chosen "
                          "per fold on the model's validation + calibration lines; float cosine scores"}
    write_report(a.json, report, plot, echo=(pooled_top1(pooled), paired))
    return 0


if __name__ == "__main__":
    sys.exit(main())
