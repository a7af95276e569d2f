"""Which lines should choose the SLB's exemplar weight? Validation only vs validation + data/routing_calibration.

    nice -n 19 .venv/bin/python bench/routing_calibration.py --folds 0,1 --json reports/routing_calibration.json

For each fold of the routing evaluation's 3-fold protocol (same folds, registries and seed as ``nexus eval
routing``), the fold's cached gate model (``train_cached``: the other folds' lines + data/routing_augment; trained
if missing) is calibrated again, in a copy, under each arm, and routes the fold's held-out lines with the router's
own decision rule:

* ``validation``: the model's ~100 validation lines choose (the calibration of reports/routing.json);
* ``validation + calibration``: the held-out calibration lines (1,352, never trained on) join them;
* ``... (w grid to 5)``: the same with the weight grid extended past 1.5 (two folds chose its edge).

The arms pin session 10's scoring (max pooling, weights to 1.5 or 5): the product's grids have grown since
(``slb-cal-v7``: pooling temperatures, weights to 5; bench/routing_aggregate.py).

Written: the chosen weight, gap and tau per fold and arm, the calibration lines' top-1 at each weight, held-out
top-1 per size (per fold and pooled, Wilson CI), the paired difference against ``validation``, and a PNG.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evals.routing_models import prepare_training_env  # noqa: E402

NARROW_GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)
WIDE_GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
ARMS = {  # name -> (use the calibration lines, exemplar weight grid); max pooling throughout
    "validation": (False, NARROW_GRID),
    "validation + calibration": (True, NARROW_GRID),
    "validation (w grid to 5)": (False, WIDE_GRID),
    "validation + calibration (w grid to 5)": (True, WIDE_GRID),
}


def plot(report: dict, path: str) -> None:
    from services.evals.routing import plot_arms

    pooled = report["pooled"]
    sizes = list(next(iter(pooled.values())))
    plot_arms(path, {arm: [p[s] for s in sizes] for arm, p in pooled.items()}, [f"N = {s}" for s in sizes],
              f"Exemplar weight chosen on which lines? folds {report['folds']}, {report['n']} held-out lines")


def main() -> int:
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap, sizes="10,250,all", calibration=True)
    ap.add_argument("--folds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated arm names (default: all)")
    ap.add_argument("--json", default="reports/routing_calibration.json")
    ap.add_argument("--reuse", action="append", default=[], help="an earlier report of this script (repeatable): "
                    "its folds are taken as they are (same arms), only the other folds run")
    a = ap.parse_args()

    prepare_training_env()
    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.evals.routing import (
        _open_router,
        _size_n,
        load_protocol,
        pooled_top1,
        route_lines,
        summarize,
        write_report,
    )
    from services.evals.routing_models import train_cached
    from services.evals.stats import wilson
    from services.training import gate as training
    from services.training.data import equivalents
    from services.training.gate import GateHyperParams, _calibrate_existing, make_examples

    t0 = time.time()
    proto = load_protocol(a.queries, a.tools, a.sizes)
    registry, lines, sizes, regs = proto.registry, proto.lines, proto.sizes, proto.regs
    names = set(registry.names)
    extra, calib = proto.extra_lines(a.augment), proto.extra_lines(a.calibration)
    folds = [int(f) for f in a.folds.split(",")]
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"unknown arm(s) {unknown}; known: {list(ARMS)}")
    hp = GateHyperParams(seed=0)
    product_grid, product_temps = training.EXEMPLAR_GRID, training.EXEMPLAR_TEMPERATURES
    per_fold: dict[str, dict] = {}
    for path in a.reuse:
        old = json.loads(Path(path).read_text())
        if old["arms"] != arms:
            raise SystemExit(f"{path} has arms {old['arms']}, not {arms}")
        per_fold |= {f: v for f, v in old["per_fold"].items() if int(f) in folds}
    embedder = Embedder("")
    with tempfile.TemporaryDirectory(prefix="nexus-calibration-") as tmp:
        store = LocalStore(Path(tmp) / "store")
        store.registry_put(list(registry.tools))
        for f in folds:
            if str(f) in per_fold:
                print(f"fold {f}: reused from {', '.join(a.reuse)}", flush=True)
                continue
            train, idxs = proto.split(f)
            gdir = train_cached(train, registry, hp, a.models_root, False, label=f"fold {f}", extra=extra)
            examples = make_examples(train, names, equivalents, hp.max_turns)
            extra_ex = make_examples(extra, names, equivalents, hp.max_turns)
            per_fold[str(f)] = {"model": gdir.name, "n": len(idxs), "arms": {}}
            for arm in arms:
                use_cal, grid = ARMS[arm]
                copy = Path(tmp) / f"fold{f}-{len(per_fold[str(f)]['arms'])}"
                shutil.copytree(gdir, copy)
                training.EXEMPLAR_GRID, training.EXEMPLAR_TEMPERATURES = grid, (0.0,)
                try:
                    doc = _calibrate_existing(copy, json.loads((copy / "gate.json").read_text()), examples,
                                              registry.tools, hp, extra_ex,
                                              make_examples(calib, names, equivalents, hp.max_turns) if use_cal else ())
                finally:
                    training.EXEMPLAR_GRID, training.EXEMPLAR_TEMPERATURES = product_grid, product_temps
                router = _open_router(store, embedder, copy)
                recs = route_lines(router, lines, regs, idxs)
                slb = doc["slb"]
                row = {"exemplar_weight": slb["exemplar_weight"], "exemplar_gap": slb["exemplar_gap"], "tau": slb["tau"],
                       "alpha": slb["alpha"], "n_val": slb["n_val"], "n_calibration": slb["n_calibration"],
                       "chosen_on_top1": slb["val_slb_top1"], "real_validation_top1": slb["val_slb_top1_real_lines"],
                       "top1_by_weight": {k.split("+ex")[1]: v for k, v in slb["by_setting"].items()
                                          if k.startswith("desc+0.0+")},
                       "sizes": {}}
                for s in sizes:
                    rs = sorted(recs[s], key=lambda r: r["i"])
                    row["sizes"][s] = summarize(rs, _size_n(s, registry))
                    row["sizes"][s]["lines"] = [[r["id"], bool(r["correct"])] for r in rs]
                    print(f"fold {f} {arm:40s} w {slb['exemplar_weight']:<4} N={s:>4}: top-1 "
                          f"{100 * row['sizes'][s]['accuracy']:.1f} %", flush=True)
                per_fold[str(f)]["arms"][arm] = row
                shutil.rmtree(copy, ignore_errors=True)
    def pooled_lines(arm: str, s: str) -> dict[str, bool]:
        return {i: ok for v in per_fold.values() for i, ok in v["arms"][arm]["sizes"][s]["lines"]}

    pooled = {}
    for arm in arms:
        pooled[arm] = {}
        for s in sizes:
            got = pooled_lines(arm, s)
            ok = sum(got.values())
            pooled[arm][str(_size_n(s, registry))] = {"n": len(got), "accuracy": ok / len(got),
                                                      "ci95": list(wilson(ok, len(got)))}
    paired = {}
    if "validation" in arms:
        for arm in arms:
            if arm == "validation":
                continue
            paired[arm] = {}
            for s in sizes:
                base, got = pooled_lines("validation", s), pooled_lines(arm, s)
                paired[arm][str(_size_n(s, registry))] = {
                    "fixed": sum(1 for i, ok in got.items() if ok and not base[i]),
                    "broken": sum(1 for i, ok in got.items() if not ok and base[i])}
    report = {"folds": sorted(int(f) for f in per_fold), "n": sum(v["n"] for v in per_fold.values()), "arms": arms,
              "calibration": {"source": a.calibration, "n_lines": len(calib)}, "per_fold": per_fold,
              "pooled": pooled, "paired_vs_validation": paired, "seconds": round(time.time() - t0, 1),
              "protocol": "the evaluation's folds and registries (seed 0); each arm recalibrates a copy of the "
                          "fold's cached model (no training); held-out lines are never trained or calibrated on"}
    write_report(a.json, report, plot, echo=(pooled_top1(pooled), paired))
    return 0


if __name__ == "__main__":
    sys.exit(main())
