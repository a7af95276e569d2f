"""Single-request query embedding latency of the gate model: torch vs onnxruntime, same requests, same vectors.

    .venv/bin/python bench/embed_latency.py --gate var/models/gate --queries ../shared/data/queries/train.jsonl

Embeds ``--n`` requests (seeded sample of the query lines, as the router builds them: query + pruned
history) ``--repeats`` times with ``GateModel.embed_query_torch`` and ``GateModel.embed_query`` (onnxruntime),
interleaved per request with the first arm alternating, so load from other processes on the shared cores
falls on both arms alike. Reports p50/p90/p99 per arm, the torch/ORT ratios and the minimum cosine between
the arms' vectors; ``--threads`` is the gate's thread count (the router's ``torch_threads``, default 1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def percentiles(samples_s: list[float]) -> dict[str, float]:
    a = np.asarray(samples_s) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "n": int(a.size)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gate", default="var/models/gate")
    ap.add_argument("--queries", default=str(ROOT.parent / "shared" / "data" / "queries" / "train.jsonl"))
    ap.add_argument("--n", type=int, default=200, help="requests sampled from --queries")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="gate threads (torch and onnxruntime intra-op)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="/tmp/embed_latency.json", help="report path (a .png is written beside it)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import onnxruntime
    import torch

    from services.router.context import routing_text
    from services.router.gate import GateModel
    from services.training.data import load_queries

    gate = GateModel(args.gate, threads=args.threads)
    if gate.onnx is None:
        print(f"{args.gate}: no usable ONNX query encoder (see the log); run `nexus train-gate` to export it",
              file=sys.stderr)
        return 2
    lines = load_queries(args.queries)
    lines = random.Random(args.seed).sample(lines, min(args.n, len(lines)))
    texts = [routing_text(ln.query, list(ln.history), max_turns=gate.info.max_turns) for ln in lines]
    arms = {"torch": gate.embed_query_torch, "onnxruntime": gate.embed_query}
    for text in texts[:10]:  # warm-up: first-call allocations and thread pools
        for embed in arms.values():
            embed(text)

    samples: dict[str, list[float]] = {name: [] for name in arms}
    vectors: dict[str, list[np.ndarray]] = {name: [] for name in arms}
    load_start = os.getloadavg()[0]
    for rep in range(args.repeats):
        for i, text in enumerate(texts):
            order = list(arms) if (rep + i) % 2 == 0 else list(reversed(arms))
            for name in order:
                t0 = time.perf_counter()
                v = arms[name](text)
                samples[name].append(time.perf_counter() - t0)
                if rep == 0:
                    vectors[name].append(v)
    cos = np.einsum("nd,nd->n", np.stack(vectors["torch"]), np.stack(vectors["onnxruntime"]))
    stats = {name: percentiles(s) for name, s in samples.items()}
    tok, max_len = gate.query_encoder.tokenizer, gate.query_encoder.max_seq_length
    paired = np.asarray(samples["torch"]) / np.asarray(samples["onnxruntime"])
    report = {
        "gate_model": str(Path(args.gate).resolve()),
        "onnx_file": str(gate.onnx.path.resolve()),
        "n_requests": len(texts), "repeats": args.repeats, "threads": args.threads,
        "tokens_p50": float(np.median([len(tok(t, truncation=True, max_length=max_len)["input_ids"]) for t in texts])),
        "arms": stats,
        "ratio_p50_torch_over_ort": stats["torch"]["p50_ms"] / stats["onnxruntime"]["p50_ms"],
        "ratio_p90_torch_over_ort": stats["torch"]["p90_ms"] / stats["onnxruntime"]["p90_ms"],
        "paired_ratio_p50": float(np.median(paired)),
        "min_cosine": float(cos.min()),
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
                     "python": platform.python_version()},
        "cpus": os.cpu_count(), "load_avg_1m_start": load_start, "load_avg_1m_end": os.getloadavg()[0],
    }
    for name, s in stats.items():
        print(f"{name:12s} p50 {s['p50_ms']:6.2f} ms  p90 {s['p90_ms']:6.2f} ms  p99 {s['p99_ms']:6.2f} ms  (n={s['n']})")
    print(f"torch/ORT p50 ratio {report['ratio_p50_torch_over_ort']:.2f} (paired per request "
          f"{report['paired_ratio_p50']:.2f}); min cosine {report['min_cosine']:.7f}; "
          f"load {load_start:.2f} -> {report['load_avg_1m_end']:.2f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    plot(samples, report, str(Path(args.json).with_suffix(".png")))
    print(f"wrote {args.json} and its .png")
    return 0


def plot(samples: dict[str, list[float]], report: dict, path: str) -> None:
    """Latency CDF of both arms (log x), the p50s marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, s in samples.items():
        a = np.sort(np.asarray(s) * 1e3)
        ax.plot(a, np.arange(1, len(a) + 1) / len(a), label=f"{name}: p50 {report['arms'][name]['p50_ms']:.1f} ms, "
                                                            f"p99 {report['arms'][name]['p99_ms']:.1f} ms")
    ax.set_xscale("log")
    ax.set_xlabel("single-request embed latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"Query encoder, one request, {report['threads']} thread(s): torch / ORT p50 = "
                 f"{report['ratio_p50_torch_over_ort']:.2f}x, min cosine {report['min_cosine']:.6f}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
