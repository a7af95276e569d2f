"""How many new requests should the argument-evidence stage take? Held-out accuracy against escalation (issue 4)

    nice -n 19 .venv/bin/python bench/routing_escalation.py --json reports/routing_escalation.json

The stage escalates a request when the SLB's top-1 - top-2 margin is under ``tau``, chosen by the calibration as a
quantile (0.1 / 0.2 / 0.3) of the margins of the model's choosing lines (validation + calibration lines over the
full registry). Those lines are harder than new requests: held out the default router escalates 13.5 % at N = 250
(docs/experiments/routing_experiments.md §35) against the issue's 15-25 %. This bench routes the evaluation's held-out lines
with each fold model and its own late reader (`nexus eval routing`'s, cached under ``--models-root/late-readers``,
built when missing; ``--late-seed`` k: the head trained with seed k, bench/routing_late_seeds.py's) with ``tau``
scaled by each of ``--scales`` (0: the stage off; 1: as calibrated), everything else as calibrated, interleaved line
by line with the arm order rotating, over ``--sizes`` x ``--draws`` draws of distractors. Written: held-out top-1
per scale and size (bootstrap CI over lines), the share escalated, the (line, draw) pairs each scale fixed and broke
against the calibrated one (exact sign test), and a PNG of accuracy against escalation. It measures where the
held-out optimum lies; it does not choose tau (held-out lines never do).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from services.evals.routing_models import prepare_training_env  # noqa: E402


def arm_name(scale: float) -> str:
    return "off" if scale == 0 else "calibrated" if scale == 1 else f"tau x{scale:g}"


def plot(report: dict, path: str) -> None:
    """Held-out top-1 against the share escalated, one line per registry size, each point a tau scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for s in report["sizes"]:
        arms = list(report["pooled"])
        xs = [100 * report["escalation_rate"][a][s] for a in arms]
        ys = [100 * report["pooled"][a][s]["accuracy"] for a in arms]
        lo = [y - 100 * report["pooled"][a][s]["ci95"][0] for a, y in zip(arms, ys, strict=True)]
        hi = [100 * report["pooled"][a][s]["ci95"][1] - y for a, y in zip(arms, ys, strict=True)]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", capsize=3, label=f"N = {s}")
        for a, x, y in zip(arms, xs, ys, strict=True):
            ax.annotate(a, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axvspan(15, 25, color="#2a9d8f", alpha=0.12, label="issue's 15-25 % band")
    ax.set_xlabel("held-out requests escalated to the stage (%)")
    ax.set_ylabel("held-out top-1 (%), 95 % CI bootstrap over lines")
    seed = report.get("late_seed", 0)
    ax.set_title("Default router, each fold with its own late reader" + (f" (head seed {seed})" if seed else "")
                 + ": tau scaled", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    from services.evals.routing import checked_folds, held_out_parser

    ap = held_out_parser(__doc__, "reports/routing_escalation.json")
    ap.add_argument("--scales", default="0,0.5,1,1.5,2,3", help="tau multipliers (0: the stage off, 1: calibrated)")
    ap.add_argument("--late-seed", type=int, default=0, help="the late readers' head seed (0: the evaluation's)")
    a = ap.parse_args(argv)
    folds, given = checked_folds(ap, a)
    scales = [float(x) for x in a.scales.split(",") if x]
    if 1.0 not in scales or any(x < 0 for x in scales):
        ap.error(f"--scales: non-negative multipliers including 1 (the calibrated tau), got {a.scales!r}")
    if a.late_seed < 0:
        ap.error(f"--late-seed: a non-negative integer, got {a.late_seed}")
    prepare_training_env()

    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.evals.routing import (
        _open_router,
        held_out_late_readers,
        held_out_models,
        pooled_top1,
        route_stage_arms,
        stage_arm_figures,
        write_report,
    )

    t0 = time.time()
    proto, dirs = held_out_models(a, folds, given)
    readers = held_out_late_readers(a, proto, dirs, [a.late_seed])
    arms = [arm_name(x) for x in scales]
    hits: dict[str, dict[str, dict[str, bool]]] = {}
    esc: dict[str, dict[str, list[bool]]] = {}
    per_fold = {}
    embedder = Embedder("")
    with tempfile.TemporaryDirectory(prefix="nexus-escalation-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(proto.registry.tools))
        for f in folds:
            late = readers[f][a.late_seed][0]
            router = _open_router(store, embedder, dirs[f], late_reader=late, precision="int8")
            if router.arg_evidence is None:
                raise RuntimeError(f"fold {f}: the router did not take the late reader at {late} (its log says why)")
            calibrated = router.arg_evidence
            stages = {arm: dataclasses.replace(calibrated, tau=calibrated.tau * x) for arm, x in zip(arms, scales,
                                                                                                       strict=True)}
            idxs = [i for i, g in enumerate(proto.fold_of) if g == f][: a.limit or None]
            route_stage_arms(router, proto, idxs, stages, hits, esc, desc=f"fold {f}")
            per_fold[str(f)] = {"model": str(dirs[f]), "late_reader": str(late), "n": len(idxs),
                                "feature": calibrated.feature, "alpha": calibrated.alpha, "tau": calibrated.tau}
    pooled, paired, rates = stage_arm_figures(hits, esc, "calibrated")
    report = {
        "bench": "bench/routing_escalation.py", "folds": folds, "draws": a.draws, "sizes": proto.sizes,
        "late_seed": a.late_seed,
        "scales": dict(zip(arms, scales, strict=True)), "interleaved": "line by line, arm order rotating",
        "held_out": not given, "per_fold": per_fold, "pooled": pooled, "escalation_rate": rates,
        "paired_vs_calibrated": paired, "cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0],
        "seconds": round(time.time() - t0, 1),
    }
    write_report(a.json, report, plot, echo=[pooled_top1(pooled), rates, paired])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
