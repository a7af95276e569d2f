"""Does the cross-encoder earn its place when it also trains on the augment lines? (issue 4, escalation 0 %)

    .venv/bin/python bench/routing_ce_extra.py --fold 0 [--json /tmp/ce_extra.json]

For one fold of the routing evaluation's 3-fold protocol (same folds, registries and seed as
``nexus eval routing``), two gate models trained on the other folds' lines + data/routing_augment, the
production recipe (cross-encoder on the real fit lines only) and ``ce_extra`` (cross-encoder on real + augment
lines), route the fold's held-out lines at each size with the router's own decision rule. Printed and written:
accuracy with a Wilson CI, the validation-chosen alpha and tau, and the escalation rate.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evals.routing_models import prepare_training_env  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
AUGMENT = Path(__file__).resolve().parents[1] / "data" / "routing_augment"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", default=str(DATA / "queries" / "train.jsonl"))
    ap.add_argument("--tools", default=str(DATA / "mcp_tools"))
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--sizes", default="50,250")
    ap.add_argument("--models-root", default="var/models")
    ap.add_argument("--json", default="/tmp/ce_extra.json")
    a = ap.parse_args()

    prepare_training_env()
    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.evals.routing import _open_router, _size_n, registries_for, route_lines, summarize
    from services.evals.routing_models import load_augment, train_cached
    from services.training.data import assign_folds, load_queries, load_registry, parse_sizes
    from services.training.gate import GateHyperParams

    registry = load_registry(a.tools)
    lines = [ln for ln in load_queries(a.queries) if ln.tool in set(registry.names)]
    sizes = parse_sizes(a.sizes)
    fold_of = assign_folds(lines, 3, 0)
    regs = registries_for(lines, sizes, registry, 0)
    extra = [ln for ln in load_augment(AUGMENT) if ln.tool in set(registry.names)]
    train = [ln for ln, g in zip(lines, fold_of, strict=True) if g != a.fold]
    idxs = [i for i, g in enumerate(fold_of) if g == a.fold]
    hp = GateHyperParams(seed=0)
    arms = {"production (CE on real lines)": hp, "ce_extra (CE on real + augment lines)": replace(hp, ce_extra=True)}
    out: dict[str, dict] = {}
    embedder = Embedder("")
    with tempfile.TemporaryDirectory(prefix="nexus-ce-extra-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(registry.tools))
        for label, h in arms.items():
            gdir = train_cached(train, registry, h, a.models_root, label=f"fold {a.fold} {label}", extra=extra)
            router = _open_router(store, embedder, gdir)
            recs = route_lines(router, lines, regs, idxs)
            meta = router.gate.info.meta
            out[label] = {"model": str(gdir), "alpha": meta["alpha"], "tau": meta["tau"],
                          "val_gated_accuracy": meta["val_gated_accuracy"],
                          "val_escalation_rate": meta["val_escalation_rate"],
                          "sizes": {s: summarize(sorted(recs[s], key=lambda r: r["i"]), _size_n(s, registry))
                                    for s in sizes}}
            for s in sizes:
                r = out[label]["sizes"][s]
                print(f"{label:40s} N={s:>4}: top-1 {100 * r['accuracy']:.1f} % [{100 * r['ci95'][0]:.1f}, "
                      f"{100 * r['ci95'][1]:.1f}], escalation {100 * r['escalation_rate']:.1f} %, "
                      f"alpha {meta['alpha']}", flush=True)
    Path(a.json).write_text(json.dumps({"fold": a.fold, "n": len(idxs), "arms": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
