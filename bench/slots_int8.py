"""The shipped slot reader (models/slots: dynamic INT8 ONNX, each row run alone) against the torch reader it was
exported from (`make train`'s cache), on the validation examples its threshold was chosen on (the query file's tune
split, never the held-out lines `nexus eval args` reports): accuracy at the shipped threshold, lines fixed / broken,
the share of identical decisions, and the time each takes, the arms interleaved chunk by chunk.

    .venv/bin/python bench/slots_int8.py --trained ~/.cache/nexus/models/slots --json reports/slots_int8.json
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def sign_test(a: int, b: int) -> float:
    """Two-sided exact sign test of ``a`` against ``b`` discordant pairs."""
    n = a + b
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(a, b) + 1)) / 2 ** n)


def plot(report: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(report["arms"])
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    axes[0].bar(arms, [100 * report["arms"][a]["accuracy"] for a in arms], color=["#888", "#3a7"])
    axes[0].set_ylim(min(100 * report["arms"][a]["accuracy"] for a in arms) - 5, 100)
    axes[0].set_title(f"accuracy at threshold {report['threshold']} (n = {report['n']})", fontsize=9)
    axes[1].bar(arms, [report["arms"][a]["seconds"] for a in arms], color=["#888", "#3a7"])
    axes[1].set_title("seconds for every example (1 thread)", fontsize=9)
    fig.suptitle(f"slot reader: torch vs shipped INT8 ONNX ({report['paired']['fixed']} fixed, "
                 f"{report['paired']['broken']} broken, {100 * report['paired']['same_decision']:.1f} % same)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trained", required=True, help="the training form (a slots dir with reader/model.safetensors)")
    ap.add_argument("--shipped", default=str(REPO / "models" / "slots"))
    ap.add_argument("--queries", default=str(REPO / "data" / "queries" / "train.jsonl"))
    ap.add_argument("--tools", default=str(REPO / "data" / "mcp_tools"))
    ap.add_argument("--limit", type=int, default=0, help="validation examples (0 = all)")
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--json", default="reports/slots_int8.json")
    a = ap.parse_args(argv)
    trained, shipped = Path(a.trained).expanduser(), Path(a.shipped)
    if not (trained / "reader" / "model.safetensors").is_file():
        ap.error(f"--trained: no torch reader at {trained / 'reader'} (`make train` writes one)")
    from services.engine.slots import ONNX_FILE

    if not (shipped / "reader" / ONNX_FILE).is_file():
        ap.error(f"--shipped: no {shipped / 'reader' / ONNX_FILE}")

    from services.engine.slots import SlotModel
    from training.data import load_queries, load_registry, prepare_training_env, tune_split
    from training.slots import SlotHyperParams, _correct, make_examples, predict

    prepare_training_env()
    import torch

    torch.set_num_threads(1)
    registry = load_registry(a.tools)
    tune, _ = tune_split(load_queries(a.queries))
    val = make_examples(tune, {t.name: t for t in registry.tools}, SlotHyperParams(), negatives=True)
    val = val[:a.limit] if a.limit else val
    models = {"torch": SlotModel(trained, threads=1), "int8-onnx": SlotModel(shipped, threads=1)}
    threshold = models["int8-onnx"].threshold
    if models["torch"].threshold != threshold:
        raise SystemExit(f"the two readers have other thresholds ({models['torch'].threshold} vs {threshold}): "
                         "not the same training")
    preds: dict[str, list] = {n: [] for n in models}
    secs = dict.fromkeys(models, 0.0)
    for k in range(0, len(val), a.chunk):  # interleaved: the machine's drift falls on both arms
        for name, m in models.items():
            t0 = time.perf_counter()
            preds[name] += predict(m.model, m.tokenizer, val[k:k + a.chunk], m.max_len, bs=a.chunk)
            secs[name] += time.perf_counter() - t0
    ok = {n: [_correct(e, p, threshold) for e, p in zip(val, preds[n], strict=True)] for n in models}
    same = [(p[2] > threshold) == (q[2] > threshold) and (p[2] <= threshold or p[:2] == q[:2])
            for p, q in zip(preds["torch"], preds["int8-onnx"], strict=True)]
    fixed = sum(b and not t for t, b in zip(ok["torch"], ok["int8-onnx"], strict=True))
    broken = sum(t and not b for t, b in zip(ok["torch"], ok["int8-onnx"], strict=True))
    report = {
        "n": len(val), "threshold": threshold, "split": "tune (validation of train-slots)",
        "arms": {n: {"accuracy": sum(ok[n]) / len(val), "seconds": secs[n]} for n in models},
        "paired": {"fixed": fixed, "broken": broken, "sign_test_p": sign_test(fixed, broken),
                   "same_decision": sum(same) / len(val)},
        "bytes": {"torch": (trained / "reader" / "model.safetensors").stat().st_size,
                  "int8-onnx": (shipped / "reader" / ONNX_FILE).stat().st_size},
    }
    from evals.routing import write_report

    write_report(a.json, report, plot, echo=[report])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
