"""Unseen tools for every encoder: MetaTool's 199 ChatGPT plugins, which no model of this repo trained on.

    .venv/bin/python bench/routing_metatool.py --json reports/routing_metatool.json     (make eval, ~1 min)

Each plugin is keyed by ``name as words: description`` (training.public.name_words + metatool_plugin_des.json); up
to ``--per-tool`` of its requests (metatool_queries.csv, seeded sample) are scored by cosine over all plugins
(N = 199). Arms: ``--encoder LABEL=DIR`` (sentence-transformers directories), by default the wheel's MiniLM, the
public-only encoder (make train-encoder) and the router's encoder with the previous gate's encoder if their
directories exist. Written: top-1 / top-3 with a bootstrap 95 % interval over requests, JSON + PNG.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CACHE = Path.home() / ".cache" / "nexus" / "models"
DEFAULT_ENCODERS = {"public encoder (Seal only)": CACHE / "public_encoder",
                    "router encoder (Seal + written + ours, shipped)": CACHE / "router_encoder"}


def load(root: Path, per_tool: int, seed: int) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """(plugin names, their documents, (request, plugin) pairs): at most ``per_tool`` requests a plugin."""
    from training.public import name_words

    des = json.loads((root / "metatool_plugin_des.json").read_text())
    lower = {k.lower(): k for k in des}
    by: dict[str, list[str]] = collections.defaultdict(list)
    with open(root / "metatool_queries.csv", newline="") as f:
        for row in csv.DictReader(f):
            name = lower.get(row["Tool"].lower())
            if name:
                by[name].append(row["Query"])
    rng = random.Random(seed)
    pairs = [(q, k) for k, v in sorted(by.items()) for q in rng.sample(v, min(per_tool, len(v)))]
    names = sorted(des)
    return names, [f"{name_words(n)}: {des[n]}" for n in names], pairs


def score(path: str, names: list[str], docs: list[str], pairs: list[tuple[str, str]], seed: int) -> dict:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu")
    dv = model.encode(docs, normalize_embeddings=True, batch_size=64)
    qv = model.encode([q for q, _ in pairs], normalize_embeddings=True, batch_size=64)
    s = qv @ dv.T
    gold = np.array([names.index(k) for _, k in pairs])
    rank = (s > s[np.arange(len(pairs)), gold][:, None]).sum(1)
    rng = np.random.default_rng(seed)
    boot = [float((rank[rng.integers(0, len(rank), len(rank))] == 0).mean()) for _ in range(1000)]
    return {"path": path, "top1": float((rank == 0).mean()), "top3": float((rank < 3).mean()),
            "top1_bootstrap95": [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]}


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = report["arms"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    y = range(len(arms))
    for metric, color in (("top3", "#9ecae1"), ("top1", "#3182bd")):
        ax.barh(list(y), [100 * a[metric] for a in arms.values()], color=color, label=metric)
    for i, a in enumerate(arms.values()):
        lo, hi = a["top1_bootstrap95"]
        ax.plot([100 * lo, 100 * hi], [i, i], color="black", lw=1.5)
    ax.set_yticks(list(y), list(arms), fontsize=8)
    ax.set_xlabel("%")
    ax.set_title(f"MetaTool: {report['requests']} requests over {report['tools']} plugins no model trained on "
                 "(N = all)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--encoder", action="append", default=[], metavar="LABEL=DIR",
                    help="an arm (repeatable); default: base MiniLM and the cached public / router encoders")
    ap.add_argument("--data", default=str(REPO / "data" / "public_tools"))
    ap.add_argument("--per-tool", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(REPO / "reports" / "routing_metatool.json"))
    a = ap.parse_args(argv)
    from services.common.models import default_embedder_path
    from training.data import prepare_training_env

    prepare_training_env()
    encoders = dict(x.split("=", 1) for x in a.encoder) if a.encoder else {
        "base all-MiniLM-L6-v2": str(default_embedder_path()),
        **{k: str(v) for k, v in DEFAULT_ENCODERS.items() if (v / "config.json").is_file()}}
    bad = [f"{k}={v}" for k, v in encoders.items() if not (Path(v) / "config.json").is_file()]
    if bad:
        ap.error(f"not a sentence-transformers directory: {', '.join(bad)}")
    t0 = time.time()
    names, docs, pairs = load(Path(a.data), a.per_tool, a.seed)
    arms = {}
    for label, path in encoders.items():
        arms[label] = score(path, names, docs, pairs, a.seed)
        print(f"{label:45s} top-1 {100 * arms[label]['top1']:.1f} % top-3 {100 * arms[label]['top3']:.1f} %",
              file=sys.stderr, flush=True)
    report = {"what": "MetaTool plugins as unseen tools: dense cosine, request vs 'name words: description'",
              "tools": len(names), "requests": len(pairs), "per_tool": a.per_tool, "seed": a.seed,
              "arms": arms, "seconds": round(time.time() - t0, 1)}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    plot(report, str(Path(a.json).with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
