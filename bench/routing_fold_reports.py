"""Held-out figures of the second stage over all folds, from one bench/routing_arg_evidence.py report per fold run.

The fold runs of a reader are separate processes (~1 h each: the fold's gate model, its reader, the routing), so
their reports are separate files. This pools them: per grid (a set of reports, e.g. the product's alpha grid vs a
wider one) and arm, each fold's top-1 with and without the stage, the lines-weighted pool, the (line, draw) pairs
fixed and broken and a two-sided sign test on them, and which grid a leave-one-fold-out choice would have made
(each fold judged at the grid and arm the other folds' held-out lines liked best: what choosing on held-out lines
would really give).

    bench/routing_fold_reports.py --grid "alpha <= 0.2=a0.json,a1.json,a2.json" --grid "alpha <= 1=b01.json,b2.json" \
        --json reports/routing_late_reader_folds.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evals.stats import sign_test  # noqa: E402  (the benches' paired test; its home is services/evals)

SIZES = ("10", "250", "all")


def load_grid(paths: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``{"folds": {fold: {"n", "report", "arms": {arm: {"alpha", "feature", size: {"none", "top1",
    "escalation_rate"}}}}}, "paired": {arm: {size: [fixed, broken]}}}`` over the reports of one grid (a report's
    paired counts already sum its own folds); a fold in two reports is refused."""
    folds: dict[str, dict[str, Any]] = {}
    paired: dict[str, dict[str, list[int]]] = {}
    for p in paths:
        doc = json.loads(Path(p).read_text())
        for fold, v in doc["per_fold"].items():
            if fold in folds:
                raise ValueError(f"fold {fold} is in two reports of one grid ({p})")
            folds[fold] = {"n": int(v["n"]), "report": str(p), "arms": {
                arm: {"alpha": a["alpha"], "feature": a["feature"],
                      **{s: {"none": a["sizes"][s]["top1_none"], "top1": a["sizes"][s]["top1"],
                             "escalation_rate": a["sizes"][s]["escalation_rate"]} for s in SIZES if s in a["sizes"]}}
                for arm, a in v["arms"].items()}}
        for arm, by_size in doc["paired_vs_none_line_draws"].items():
            for s, x in by_size.items():
                fb = paired.setdefault(arm, {}).setdefault(s, [0, 0])
                fb[0] += int(x["fixed"])
                fb[1] += int(x["broken"])
    return {"folds": folds, "paired": paired}


def pool(grid: dict[str, Any], arm: str, size: str, folds: Sequence[str]) -> dict[str, float]:
    """Lines-weighted top-1 without and with the stage over ``folds``."""
    n = sum(grid["folds"][f]["n"] for f in folds)
    w = {f: grid["folds"][f]["n"] / n for f in folds}
    row = {k: sum(w[f] * grid["folds"][f]["arms"][arm][size][k] for f in folds)
           for k in ("none", "top1", "escalation_rate")}
    return {**row, "gain": row["top1"] - row["none"], "n": n}


def summarize(grids: dict[str, dict[str, Any]], size: str = "250", only: Sequence[str] = ()) -> dict[str, Any]:
    """Per grid and arm the pooled figures at every size, and the leave-one-fold-out choice at ``size`` (among the
    arms ``only`` names, or all: each option more is one more chance to fit the folds' noise)."""
    folds = sorted(set.intersection(*[set(g["folds"]) for g in grids.values()]))
    if not folds:
        raise ValueError("the grids share no fold")
    arms = sorted(set.intersection(*[set(g["folds"][folds[0]]["arms"]) for g in grids.values()]))
    unknown = sorted(set(only) - set(arms))
    if unknown:
        raise ValueError(f"no arm {unknown[0]!r} in every grid (arms: {', '.join(arms)})")
    table: dict[str, dict[str, Any]] = {}
    for name, g in grids.items():
        table[name] = {}
        for arm in arms:
            row: dict[str, Any] = {"per_fold": {f: {s: g["folds"][f]["arms"][arm][s] for s in SIZES}
                                                for f in folds},
                                   "chosen": {f: [g["folds"][f]["arms"][arm]["feature"],
                                                  g["folds"][f]["arms"][arm]["alpha"]] for f in folds}}
            for s in SIZES:
                fb = g["paired"].get(arm, {}).get(s, [0, 0])
                row[s] = {**pool(g, arm, s, folds), "fixed": fb[0], "broken": fb[1],
                          "sign_test_p": round(sign_test(*fb), 4)}
            table[name][arm] = row
    options = [(name, arm) for name in grids for arm in (only or arms)]
    lofo = {}
    for f in folds:
        rest = [x for x in folds if x != f]
        best = max(options, key=lambda o: pool(grids[o[0]], o[1], size, rest)["gain"]) if rest else options[0]
        got = grids[best[0]]["folds"][f]["arms"][best[1]][size]
        lofo[f] = {"grid": best[0], "arm": best[1], "none": got["none"], "top1": got["top1"]}
    lines = {f: grids[options[0][0]]["folds"][f]["n"] for f in folds}  # the same held-out lines in every grid
    lofo_gain = sum(lines[f] * (v["top1"] - v["none"]) for f, v in lofo.items()) / sum(lines.values())
    return {"folds": folds, "arms": arms, "size": size, "table": table,
            "leave_one_fold_out": {"options": [list(o) for o in options], "per_fold": lofo, "gain": lofo_gain}}


def plot(report: dict[str, Any], path: str) -> None:
    """Each (grid, arm)'s gain over the SLB alone per fold, at N = 10 and N = 250, the pool as a diamond."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    s = report["summary"]
    rows = [(g, a) for g in s["table"] for a in s["arms"]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.5 * len(rows) + 2.5), sharey=True)
    y = np.arange(len(rows))
    h = 0.8 / max(1, len(s["folds"]))
    for ax, size in zip(axes, ("10", "250"), strict=True):
        for j, f in enumerate(s["folds"]):
            gains = [100 * (s["table"][g][a]["per_fold"][f][size]["top1"] - s["table"][g][a]["per_fold"][f][size]["none"])
                     for g, a in rows]
            ax.barh(y - 0.4 + (j + 0.5) * h, gains, height=h, label=f"fold {f}")
        pooled = [100 * s["table"][g][a][size]["gain"] for g, a in rows]
        ax.scatter(pooled, y, color="black", marker="D", zorder=3, label="pooled")
        for yi, (g, a) in zip(y, rows, strict=True):
            r = s["table"][g][a][size]
            ax.annotate(f"{r['fixed']}/{r['broken']} p={r['sign_test_p']:.2f}", (pooled[yi], yi), xytext=(4, 6),
                        textcoords="offset points", fontsize=7)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_title(f"N = {size}: top-1 gain over the SLB alone (points)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, [f"{a}\n[{g}]" for g, a in rows], fontsize=8)
    axes[1].legend(fontsize=8, loc="lower right")
    lofo = s["leave_one_fold_out"]
    fig.suptitle(f"{report['title']}: held-out folds {', '.join(s['folds'])} (fixed/broken line-draws, sign test); "
                 f"leave-one-fold-out choice at N = {s['size']}: {100 * lofo['gain']:+.2f}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    from services.evals.routing import write_report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", action="append", required=True, metavar="NAME=REPORT[,REPORT...]",
                    help="a grid's fold reports (bench/routing_arg_evidence.py --json); repeat per grid")
    ap.add_argument("--size", default="250", help="the size the leave-one-fold-out choice ranks by")
    ap.add_argument("--arms", default="", help="comma-separated: the arms the leave-one-fold-out choice may pick "
                                               "(default: all)")
    ap.add_argument("--title", default="The argument-evidence stage")
    ap.add_argument("--json", default="reports/routing_fold_reports.json")
    a = ap.parse_args(argv)
    grids = {}
    for spec in a.grid:
        name, sep, paths = spec.rpartition("=")  # a name may hold "=" ("alpha <= 1"), a path not
        if not sep or not name or not paths:
            ap.error(f"--grid {spec!r}: expected NAME=REPORT[,REPORT...]")
        missing = [p for p in paths.split(",") if not Path(p).is_file()]
        if missing:
            ap.error(f"--grid {name}: no report at {', '.join(missing)}")
        grids[name] = load_grid(paths.split(","))
    try:
        summary = summarize(grids, a.size, [x for x in a.arms.split(",") if x])
    except ValueError as e:
        ap.error(str(e))
    report = {"title": a.title, "grids": {name: sorted({v["report"] for v in g["folds"].values()})
                                          for name, g in grids.items()}, "summary": summary}
    echo = {f"{g} | {arm}": {s: f"{100 * r[s]['none']:.2f} -> {100 * r[s]['top1']:.2f} ({r[s]['fixed']}/"
                                f"{r[s]['broken']}, p {r[s]['sign_test_p']})" for s in SIZES}
            for g, arms in summary["table"].items() for arm, r in arms.items()}
    write_report(a.json, report, plot, echo=(echo, {"leave_one_fold_out": summary["leave_one_fold_out"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
