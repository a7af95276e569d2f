"""What a router costs to start: the shipped serving form of its models (models/: INT8 ONNX graphs, no torch
weights) against their training form (`make train`'s cache: torch weights, fp32 + INT8 graphs, the cross-encoder).
Each run is a fresh process that builds the production Router (the gate model, the base embedder's
text keys of the default registry), routes one request over every tool, and reports its cold start (to the first
decision), peak RSS and whether torch was imported. Arms alternate, ``--repeats`` times each.

    .venv/bin/python bench/router_footprint.py --training ~/.cache/nexus/models --json reports/router_footprint.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHILD = r"""
import asyncio, json, resource, sys, time
t0 = time.perf_counter()
from services.common.embedder import Embedder
from services.common.store import LocalStore
from services.common.tools import load_registry_dir
from services.router.config import RouterConfig
from services.router.router import Router

gate, tools, store_dir = sys.argv[1:4]
store = LocalStore(store_dir)
store.registry_put(load_registry_dir(tools))
router = Router(RouterConfig(store_url=store_dir, gate_model_dir=gate), store, Embedder(""))
asyncio.run(router.sync(force=True))
d = router.decide("list the pods in the kube-system namespace", 1000)
cold = time.perf_counter() - t0
print(json.dumps({"cold_start_s": cold, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch_imported": "torch" in sys.modules, "gate_loaded": router.gate is not None,
                  "tool": d.tool}))
"""


def run_arm(gate: Path, tools: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", CHILD, str(gate), tools, str(Path(tmp) / "store")],
                             capture_output=True, text=True, cwd=REPO, timeout=900,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    if out.returncode != 0:
        raise SystemExit(f"router_footprint: the {gate} arm failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(report: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(report["arms"])
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, key, label in ((axes[0], "cold_start_s", "cold start to the first decision (s)"),
                           (axes[1], "max_rss_mb", "peak RSS (MB)")):
        for i, arm in enumerate(arms):
            vals = [r[key] for r in report["arms"][arm]["runs"]]
            ax.scatter([i] * len(vals), vals, alpha=0.6)
            ax.bar(i, statistics.median(vals), alpha=0.3)
        ax.set_xticks(range(len(arms)), arms)
        ax.set_title(label, fontsize=9)
    fig.suptitle("router start: shipped serving form vs training form (each run a fresh process)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shipped", default=str(REPO / "models"), help="the serving form (models/)")
    ap.add_argument("--training", default="", help="a training-form cache (`make train`'s ~/.cache/nexus/models); "
                                                  "empty: the shipped arm only")
    ap.add_argument("--tools", default=str(REPO / "data" / "mcp_tools"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="reports/router_footprint.json")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    roots = {"shipped": Path(a.shipped)}
    if a.training:
        roots["training"] = Path(a.training).expanduser()
    for name, root in roots.items():
        if not (root / "gate" / "gate.json").is_file():
            ap.error(f"--{name}: no {root / 'gate' / 'gate.json'}")
    runs: dict[str, list[dict]] = {n: [] for n in roots}
    for rep in range(a.repeats):  # interleaved: the machine's drift falls on both arms
        for name, root in roots.items():
            r = run_arm(root / "gate", a.tools)
            runs[name].append(r)
            print(f"[{rep + 1}/{a.repeats}] {name}: {r['cold_start_s']:.2f} s, {r['max_rss_mb']:.0f} MB", flush=True)
    arms = {n: {"runs": rs, "cold_start_s_median": statistics.median(r["cold_start_s"] for r in rs),
                "max_rss_mb_median": statistics.median(r["max_rss_mb"] for r in rs),
                "torch_imported": all(r["torch_imported"] for r in rs),
                "gate_loaded": all(r["gate_loaded"] for r in rs)}
            for n, rs in runs.items()}
    report = {"repeats": a.repeats, "tools": a.tools, "arms": arms}
    if "training" in arms:
        report["ratio_shipped_over_training"] = {
            k: arms["shipped"][f"{k}_median"] / arms["training"][f"{k}_median"] for k in ("cold_start_s", "max_rss_mb")}
    from evals.routing import write_report

    write_report(a.json, report, plot, echo=[{n: {k: v for k, v in s.items() if k != "runs"} for n, s in arms.items()}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
