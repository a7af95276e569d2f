"""Is the late reader's gain a property of the recipe or of one training run? Held-out routing over head seeds (issue 4)

    nice -n 19 .venv/bin/python bench/routing_late_seeds.py --seeds 0,1,2 --json reports/routing_late_seeds.json

Each fold model of `nexus eval routing` gets a late reader per seed of ``--seeds``, built exactly as the evaluation
builds seed 0's (``late_training.fold_late_reader``: the head trained on the augment lines with that seed's
initialisation and batch order, its threshold on the fold's tune split, the stage calibrated on the fold model's
choosing lines; cached under ``--models-root/late-readers/<model>[-seed<k>]``; ~20 min per new reader on 2 cores).
The evaluation's held-out lines are then routed with the stage off and with each seed's stage, interleaved line by
line with the arm order rotating, over ``--sizes`` x ``--draws`` draws of distractors. Written: held-out top-1 per
arm and size (bootstrap CI over lines), the share escalated, each seed's (line, draw) pairs fixed and broken against
the stage off (exact sign test), the spread of the gain over seeds, what each seed's calibration chose, and a PNG.

With two seeds or more it also reports an ensemble of the heads, fixed before it was measured: ``vote``, the tool
that more than half of the seeds' stages pick, else the stage off's pick (no new calibration; a read per head per
escalation), as one more arm; and, as a ceiling rather than a router, ``hindsight``: the share of line-draws that
at least one seed's stage gets right.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from services.evals.routing_models import prepare_training_env  # noqa: E402

OFF = "off"
VOTE = "vote"


def arm_name(seed: int) -> str:
    return f"seed {seed}"


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: distinct non-negative integers, in order; ValueError otherwise."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds: comma-separated integers, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: distinct non-negative integers, got {text!r}")
    return seeds


def vote_hits(picks: dict[str, dict[str, dict[str, str]]], seeds: Sequence[int], labels: dict[str, str],
              correct: Callable[[str, str], bool]) -> tuple[dict[str, dict[str, bool]], dict[str, dict[str, bool]]]:
    """From ``route_stage_arms``' picks (``picks[arm][size]["<line id>#<draw>"]``, arms ``off`` and each seed's) and
    each line id's label: per size and line-draw, whether the majority vote of the seeds' stages is right (the tool
    more than half of them pick, else the stage off's pick), and whether any seed's stage is right (hindsight)."""
    vote: dict[str, dict[str, bool]] = {}
    anyone: dict[str, dict[str, bool]] = {}
    for size, off in picks[OFF].items():
        vote[size], anyone[size] = {}, {}
        for key, off_pick in off.items():
            label = labels[key.rsplit("#", 1)[0]]
            got = [picks[arm_name(k)][size][key] for k in seeds]
            top, n = Counter(got).most_common(1)[0]
            vote[size][key] = correct(top if 2 * n > len(seeds) else off_pick, label)
            anyone[size][key] = any(correct(g, label) for g in got)
    return vote, anyone


def spread(pooled: dict, seeds: Sequence[int], sizes: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per size, each seed's held-out gain over the stage off (points) and their mean, min, max and sample sd."""
    out = {}
    for s in sizes:
        gains = [100 * (pooled[arm_name(k)][s]["accuracy"] - pooled[OFF][s]["accuracy"]) for k in seeds]
        out[s] = {"gain_pts": dict(zip(map(str, seeds), [round(g, 3) for g in gains], strict=True)),
                  "mean": round(float(np.mean(gains)), 3), "min": round(min(gains), 3), "max": round(max(gains), 3),
                  "sd": round(float(np.std(gains, ddof=1)), 3) if len(gains) > 1 else 0.0}
    return out


def choice_figures(reader_dir: str | Path) -> dict[str, float]:
    """What a late reader's calibration measured on its choosing lines (kept in its directory): top-1 without and
    with the stage, and the stage's cross-fit top-1."""
    from services.router.late_reader import META_FILE

    section = json.loads((Path(reader_dir) / META_FILE).read_text())["arg_evidence"]
    return {"choose_top1_slb": section["choose_top1_slb"], "choose_top1": section["choose_top1"],
            "choose_top1_crossfit": section["crossfit"]["top1"]}


def plot(report: dict, path: str) -> None:
    """Held-out top-1 per arm (the stage off, then each seed), one panel per registry size, with the gain over off."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["sizes"]
    arms = list(report["pooled"])
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes) + 1, 4.2), squeeze=False)
    for ax, s in zip(axes[0], sizes, strict=True):
        ys = [100 * report["pooled"][a][s]["accuracy"] for a in arms]
        lo = [y - 100 * report["pooled"][a][s]["ci95"][0] for a, y in zip(arms, ys, strict=True)]
        hi = [100 * report["pooled"][a][s]["ci95"][1] - y for a, y in zip(arms, ys, strict=True)]
        colors = ["#999999" if a == OFF else "#e76f51" if a == VOTE else "#2a9d8f" for a in arms]
        ax.bar(range(len(arms)), ys, yerr=[lo, hi], capsize=3, color=colors)
        bottom = min(ys) - 4
        for x, (a, y) in enumerate(zip(arms, ys, strict=True)):
            text = f"{y:.2f} %"
            if a != OFF:  # the paired figure: line-draws this seed's stage fixed and broke against the stage off
                c = report.get("paired_vs_off", {}).get(a, {}).get(s, {})
                text += f"\n{y - ys[0]:+.2f} pts" + (f"\n{c['fixed']} fixed\n{c['broken']} broken" if c else "")
            ax.text(x, bottom + 0.3, text, ha="center", va="bottom", fontsize=7, color="white")
        ax.set_xticks(range(len(arms)), arms, fontsize=8)
        # a ceiling, not a router: some seed's stage right
        ceiling = 100 * report["hindsight"][s]["accuracy"] if report.get("hindsight") else None
        ax.set_ylim(bottom, min(100, max(ys + [ceiling or 0]) + 3))
        if ceiling is not None:
            ax.axhline(ceiling, color="#e76f51", ls=":", lw=1)
            ax.text(-0.45, ceiling + 0.1, f"any seed right (hindsight) {ceiling:.2f} %", ha="left", va="bottom",
                    fontsize=7)
        ax.set_title(f"N = {s}: gain sd over seeds {report['spread'][s]['sd']:.2f} pts", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("held-out top-1 (%), 95 % CI bootstrap over lines")
    fig.suptitle(f"Late reader per head seed, folds {report['folds']}, {report['draws']} draws", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    from services.evals.routing import checked_folds, held_out_parser

    ap = held_out_parser(__doc__, "reports/routing_late_seeds.json")
    ap.add_argument("--seeds", default="0,1,2", help="head seeds (0: the evaluation's own readers)")
    a = ap.parse_args(argv)
    folds, given = checked_folds(ap, a)
    try:
        seeds = parse_seeds(a.seeds)
    except ValueError as e:
        ap.error(str(e))
    prepare_training_env()

    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.evals.routing import (
        _open_router,
        held_out_late_readers,
        held_out_models,
        pool_line_draws,
        pooled_top1,
        route_stage_arms,
        stage_arm_figures,
        write_report,
    )
    from services.training.data import is_correct

    t0 = time.time()
    proto, dirs = held_out_models(a, folds, given)
    hits: dict[str, dict[str, dict[str, bool]]] = {}
    esc: dict[str, dict[str, list[bool]]] = {}
    picks: dict[str, dict[str, dict[str, str]]] = {}
    per_fold: dict[str, dict] = {}
    t_build = time.time()
    readers = held_out_late_readers(a, proto, dirs, seeds)  # every reader first, then the routing
    build_s = round(time.time() - t_build, 1)
    embedder = Embedder("")
    with tempfile.TemporaryDirectory(prefix="nexus-late-seeds-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(proto.registry.tools))
        for f in folds:
            stages, chose = {}, {}
            router = None
            for k in seeds:
                out, summary = readers[f][k]
                r = _open_router(store, embedder, dirs[f], late_reader=out, precision="int8")
                if r.arg_evidence is None:
                    raise RuntimeError(f"fold {f}, seed {k}: the router did not take the late reader at {out} "
                                       "(its log says why)")
                stages[arm_name(k)] = r.arg_evidence
                router = router or r
                chose[str(k)] = {"late_reader": str(out), "feature": r.arg_evidence.feature,
                                 "alpha": r.arg_evidence.alpha, "tau": r.arg_evidence.tau,
                                 "built": not summary.get("kept"), **choice_figures(out)}
            # off: the same router whose stage never escalates (the SLB's scan of the reader's own pass, as in
            # bench/routing_escalation.py), so the arms differ in the stage alone
            stages = {OFF: dataclasses.replace(stages[arm_name(seeds[0])], tau=0.0), **stages}
            idxs = proto.split(f)[1][: a.limit or None]
            route_stage_arms(router, proto, idxs, stages, hits, esc, desc=f"fold {f}", picks=picks)
            per_fold[str(f)] = {"model": str(dirs[f]), "n": len(idxs), "seeds": chose}
    hindsight = None
    if len(seeds) > 1:
        hits[VOTE], anyone = vote_hits(picks, seeds, {ln.id: ln.tool for ln in proto.lines}, is_correct)
        esc[VOTE] = {s: [any(e) for e in zip(*(esc[arm_name(k)][s] for k in seeds), strict=True)] for s in esc[OFF]}
        hindsight = pool_line_draws({"any": anyone}, "any")[0]["any"]
    pooled, paired, rates = stage_arm_figures(hits, esc, OFF)
    report = {
        "bench": "bench/routing_late_seeds.py", "folds": folds, "draws": a.draws, "sizes": proto.sizes,
        "seeds": seeds, "interleaved": "line by line, arm order rotating", "held_out": not given,
        "per_fold": per_fold, "pooled": pooled, "escalation_rate": rates, "paired_vs_off": paired,
        "spread": spread(pooled, seeds, proto.sizes), "hindsight": hindsight, "build_seconds": build_s,
        "cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0], "seconds": round(time.time() - t0, 1),
    }
    write_report(a.json, report, plot, echo=[pooled_top1(pooled), report["spread"], per_fold])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
