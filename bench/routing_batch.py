"""Does a new batch of hand-written requests help routing? (issue 4: data/routing_augment batches)

    nice -n 19 .venv/bin/python bench/routing_batch.py --fold 0 --new data/routing_calibration \
        --json reports/routing_batch4.json

For one fold of the routing evaluation's 3-fold protocol (same folds, registries and seed as
``nexus eval routing``), three arms route the fold's held-out lines (lines no arm trained or calibrated on):

* ``before``: a gate model trained on the other folds' lines + the augment files *without* the new batch
  (the product as it was);
* ``before + new exemplars``: that same model, its exemplar keys rebuilt with the new batch and the exemplar
  weight re-chosen on its validation lines (``_calibrate_existing``: no training; what a deployment gets by
  adding requests to a trained model);
* ``after``: a gate model trained with the new batch too (the product once the batch lands).

Each arm uses the router's own decision rule (``Router.decide``). Written: top-1 with a Wilson CI, SLB top-3,
escalation, per size; the paired difference at each size (lines one arm fixes / breaks against ``before``); and a
PNG beside the JSON. Models are cached under ``--models-root`` by data hash, as the evaluation's are.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evals.routing_models import prepare_training_env  # noqa: E402

ARMS = ("before", "before + new exemplars", "after")


def split_batch(root: Path, new: str) -> tuple[list[Path], list[Path]]:
    """The augment files of ``root`` without and with the new batch: ``new`` is a directory of ``*.jsonl`` files
    (added to ``root``'s) or a glob on the names of ``root``'s files (taken out of them for the first list)."""
    files = sorted(root.glob("*.jsonl"))
    if Path(new).is_dir():
        added = sorted(Path(new).glob("*.jsonl"))
        if not added:
            raise SystemExit(f"{new} holds no *.jsonl file: nothing to compare")
        return files, files + added
    picked = [f for f in files if fnmatch.fnmatch(f.name, new)]
    if not picked:
        raise SystemExit(f"no file of {root} matches {new!r}: nothing to compare")
    return [f for f in files if f not in picked], files


def paired(base: list[dict], other: list[dict]) -> dict[str, int]:
    """Lines ``other`` gets right that ``base`` gets wrong (fixed), and the reverse (broken), matched by line id."""
    ok = {r["id"]: r["correct"] for r in base}
    fixed = sum(1 for r in other if r["correct"] and not ok[r["id"]])
    broken = sum(1 for r in other if not r["correct"] and ok[r["id"]])
    return {"fixed": fixed, "broken": broken, "net": fixed - broken}


def plot(report: dict, path: str) -> None:
    from services.evals.routing import plot_arms

    sizes, arms = list(report["sizes"]), report["arms"]
    first = next(iter(arms.values()))["sizes"]
    plot_arms(path, {arm: [v["sizes"][s] for s in sizes] for arm, v in arms.items()},
              [f"N = {first[s]['registry_size']}" for s in sizes],
              f"New augment batch {report['new']!r}: fold {report['fold']}, {report['n']} held-out lines")


def main() -> int:
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap)
    ap.add_argument("--new", required=True, help="the new batch: a directory of *.jsonl, or a glob of augment file "
                    "names (e.g. '*-b4.jsonl')")
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--json", default="reports/routing_batch.json")
    ap.add_argument("--arms", default=",".join(ARMS), help="arms to run (comma-separated; 'after' trains a model)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()

    prepare_training_env()
    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.evals.routing import (
        _open_router,
        _size_n,
        load_protocol,
        route_lines,
        summarize,
        write_report,
    )
    from services.evals.routing_models import train_cached
    from services.training.data import equivalents, load_queries
    from services.training.gate import GateHyperParams, _calibrate_existing, make_examples

    t0 = time.time()
    proto = load_protocol(a.queries, a.tools, a.sizes)
    registry, lines, sizes, regs = proto.registry, proto.lines, proto.sizes, proto.regs
    names = set(registry.names)
    old_files, all_files = split_batch(Path(a.augment), a.new)
    extra_old = [ln for f in old_files for ln in load_queries(f) if ln.tool in names]
    extra_all = [ln for f in all_files for ln in load_queries(f) if ln.tool in names]
    train, idxs = proto.split(a.fold)
    hp = GateHyperParams(seed=0)
    want = [x.strip() for x in a.arms.split(",") if x.strip()]
    unknown = sorted(set(want) - set(ARMS))
    if unknown:
        raise SystemExit(f"unknown arm(s) {unknown}; known: {list(ARMS)}")
    records: dict[str, dict[str, list[dict]]] = {}
    out: dict[str, dict] = {}
    embedder = Embedder("")
    with tempfile.TemporaryDirectory(prefix="nexus-batch-") as tmp:
        store = LocalStore(Path(tmp) / "store")
        store.registry_put(list(registry.tools))
        for arm in ARMS:
            if arm not in want:
                continue
            if arm == "after":
                gdir = train_cached(train, registry, hp, a.models_root, not a.quiet, label=f"fold {a.fold} {arm}",
                                    extra=extra_all)
            else:
                gdir = train_cached(train, registry, hp, a.models_root, not a.quiet, label=f"fold {a.fold} before",
                                    extra=extra_old)
                if arm == "before + new exemplars":  # a copy: the cached model keeps its own exemplars
                    copy = Path(tmp) / "with-new-exemplars"
                    shutil.copytree(gdir, copy)
                    doc = json.loads((copy / "gate.json").read_text())
                    examples = make_examples(train, names, equivalents, hp.max_turns)
                    _calibrate_existing(copy, doc, examples, registry.tools, hp,
                                        make_examples(extra_all, names, equivalents, hp.max_turns))
                    gdir = copy
            router = _open_router(store, embedder, gdir)
            recs = route_lines(router, lines, regs, idxs)
            records[arm] = {s: sorted(recs[s], key=lambda r: r["i"]) for s in sizes}
            meta = router.gate.info.meta
            out[arm] = {"model": str(gdir) if arm != "before + new exemplars" else f"{gdir.name} (copy of before)",
                        "n_fit_extra": len(extra_all if arm != "before" else extra_old),
                        "exemplar_weight": router.exemplar_weight, "alpha": meta["alpha"], "tau": meta["tau"],
                        "val_slb_top1": meta.get("slb", {}).get("val_slb_top1"),
                        "sizes": {s: summarize(records[arm][s], _size_n(s, registry)) for s in sizes}}
            for s in sizes:
                r = out[arm]["sizes"][s]
                print(f"{arm:24s} N={s:>4}: top-1 {100 * r['accuracy']:.1f} % [{100 * r['ci95'][0]:.1f}, "
                      f"{100 * r['ci95'][1]:.1f}], top-3 {100 * r['slb_top3']:.1f} %, escalation "
                      f"{100 * r['escalation_rate']:.1f} %, w {router.exemplar_weight}", flush=True)
    diffs = {arm: {s: paired(records["before"][s], records[arm][s]) for s in sizes}
             for arm in records if arm != "before" and "before" in records}
    report = {"fold": a.fold, "n": len(idxs), "new": a.new, "new_files": [str(f) for f in all_files
                                                                          if f not in old_files],
              "sizes": sizes, "arms": out, "paired_vs_before": diffs, "seconds": round(time.time() - t0, 1),
              "protocol": "3-fold by tool line (assign_folds seed 0), registries_for seed 0; the fold's lines are "
                          "never trained or calibrated on; exemplar weight chosen on each model's validation lines"}
    write_report(a.json, report, plot if out else None, echo=(diffs,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
