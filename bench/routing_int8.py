"""The query encoder at INT8: how much faster is a Route, and what does it cost in held-out routing? (issue 4)

    nice -n 19 .venv/bin/python bench/routing_int8.py --json reports/routing_int8.json

Each fold's gate model (the evaluation's, trained once and cached under ``--models-root``) is opened as the product
opens it, in process, in three arms: ``fp32`` (``query_encoder_precision = fp32``: the ONNX graph whose vectors are
the torch vectors), ``int8`` (the product's INT8 graph, ``services/router/onnx_encoder.quantize``: block-wise int8
weights and activations of every MatMul, int8 embedding rows) and ``int8-dynamic`` (onnxruntime's dynamic
quantization: per-channel int8 weights, activations per tensor, §27's graph, made here in a temporary copy of the
model). The SLB's keys stay as trained. Every held-out line of the fold is routed by every arm, interleaved line by
line with the arm order rotating, over every size and ``--draws`` draws of distractors (the evaluation's
registries; the stage off, as the product ships). Written: held-out top-1 per size pooled over lines x draws
(bootstrap CI over lines), the (line, draw) pairs each INT8 arm fixed and broke against fp32 (and int8 against
int8-dynamic) with an exact sign test, per-fold top-1, the router's own ``route_ms`` percentiles per arm (embedding +
scan; one thread) and their ratios, and a PNG.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evals.routing_models import prepare_training_env  # noqa: E402
from evals.stats import sign_test  # noqa: E402

ARMS = ("fp32", "int8", "int8-dynamic")
PRECISION = {"fp32": "fp32", "int8": "int8", "int8-dynamic": "int8"}
QUANTILES = [x / 2 for x in range(201)]  # the latency CDF as written: every half percentile


def dynamic_copy(gate: Path, dst: Path) -> Path:
    """A copy of the gate model ``gate`` at ``dst`` (every file a link) whose INT8 graph is onnxruntime's dynamic
    quantization of its fp32 export (per-channel int8 weights, per-tensor activations; §27). The model itself is
    left alone."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from services.router.onnx_encoder import onnx_path

    shutil.copytree(gate.resolve(), dst, copy_function=os.symlink)
    out = onnx_path(dst / "query_encoder", "int8")
    out.unlink()  # the link only: a file is written in its place
    pre = dst / "pre.onnx"
    quant_pre_process(str(onnx_path(dst / "query_encoder")), str(pre), skip_symbolic_shape=True)
    quantize_dynamic(str(pre), str(out), per_channel=True, weight_type=QuantType.QInt8)
    return dst


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from evals.routing import draw_arms

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = list(report["pooled"]["fp32"])
    draw_arms(ax, {arm: [report["pooled"][arm][s] for s in sizes] for arm in ARMS}, [f"N = {s}" for s in sizes],
              "routing accuracy by query encoder", ci="bootstrap 95 % CI over lines")
    for arm in ARMS:
        lat = report["latency"][arm]
        bx.plot(report["route_ms_quantiles"][arm], np.asarray(QUANTILES) / 100,
                label=f"{arm}: p50 {lat['p50']:.1f}, p99 {lat['p99']:.1f} ms")
    bx.set_xscale("log")
    bx.xaxis.set_major_locator(matplotlib.ticker.FixedLocator([2, 3, 5, 10, 20, 30, 50, 100]))
    bx.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    bx.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    bx.set_xlabel("route_ms in process (embedding + SLB scan), log scale")
    bx.set_ylabel("fraction of routes")
    bx.set_title(f"route latency: int8 {report['latency']['p50_ratio_fp32_over_int8']:.2f}x faster at p50")
    bx.legend(loc="lower right", fontsize=8)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    from evals.routing import checked_folds, held_out_parser

    ap = held_out_parser(__doc__, "reports/routing_int8.json", sizes="10,250,all")
    a = ap.parse_args(argv)
    folds, given = checked_folds(ap, a)
    prepare_training_env()

    from tqdm import tqdm

    from evals.routing import (
        _open_router,
        held_out_models,
        pool_line_draws,
        pooled_top1,
        route_lines,
        write_report,
    )
    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.router.onnx_encoder import INT8_METHOD, int8_method

    t0 = time.time()
    proto, dirs = held_out_models(a, folds, given)
    regs = {(s, d): r[s] for d, r in enumerate(proto.draw_regs) for s in proto.sizes}
    hits: dict[str, dict[str, dict[str, bool]]] = {arm: {s: {} for s in proto.sizes} for arm in ARMS}
    ms: dict[str, list[float]] = {arm: [] for arm in ARMS}
    per_fold = {}
    embedder = Embedder("")
    with tempfile.TemporaryDirectory(prefix="nexus-int8-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(proto.registry.tools))
        for f in folds:
            if int8_method(Path(dirs[f]) / "query_encoder") != INT8_METHOD:
                raise RuntimeError(f"fold {f} ({dirs[f]}): its INT8 graph is not of {INT8_METHOD}; run "
                                   "`make models` (or `nexus train-gate` on its data) to write it")
            arm_dirs = {"fp32": dirs[f], "int8": dirs[f], "int8-dynamic": dynamic_copy(Path(dirs[f]), Path(tmp) / str(f))}
            routers = {arm: _open_router(store, embedder, arm_dirs[arm], precision=PRECISION[arm]) for arm in ARMS}
            got = {arm: getattr(routers[arm].gate.onnx, "precision", None) for arm in ARMS}
            if got != PRECISION:
                raise RuntimeError(f"fold {f} ({dirs[f]}): the arms embed at {got}; run `make models` (or "
                                   "`nexus train-gate`) to write the INT8 graph")
            idxs = [i for i, g in enumerate(proto.fold_of) if g == f][: a.limit or None]
            fold_hits = {arm: {s: [] for s in proto.sizes} for arm in ARMS}
            for j, i in enumerate(tqdm(idxs, desc=f"fold {f}", file=sys.stderr)):
                for arm in ARMS[j % len(ARMS):] + ARMS[:j % len(ARMS)]:
                    for (s, d), recs in route_lines(routers[arm], proto.lines, regs, [i]).items():
                        r = recs[0]
                        hits[arm][s][f"{r['id']}#{d}"] = r["correct"]
                        fold_hits[arm][s].append(r["correct"])
                        ms[arm].append(r["route_ms"])
            per_fold[str(f)] = {"model": str(dirs[f]), "n": len(idxs),
                                "top1": {arm: {s: float(np.mean(v)) for s, v in fold_hits[arm].items()}
                                         for arm in ARMS}}
            print(f"fold {f}: " + "; ".join(f"{arm} " + ", ".join(f"N={s} {100 * np.mean(v):.2f}"
                                                                  for s, v in fold_hits[arm].items())
                                            for arm in ARMS), flush=True)
            del routers
    pooled, paired = pool_line_draws(hits, "fp32")
    paired["int8_vs_int8-dynamic"] = pool_line_draws({k: hits[k] for k in ("int8-dynamic", "int8")},
                                                     "int8-dynamic")[1]["int8"]
    for by_size in paired.values():
        for c in by_size.values():
            c["sign_test_p"] = sign_test(c["fixed"], c["broken"])
    lat = {arm: {f"p{q}": float(np.percentile(v, q)) for q in (50, 90, 99)} | {"n": len(v)} for arm, v in ms.items()}
    for arm in ARMS[1:]:
        lat[f"p50_ratio_fp32_over_{arm}"] = lat["fp32"]["p50"] / lat[arm]["p50"]
        lat[f"p99_ratio_fp32_over_{arm}"] = lat["fp32"]["p99"] / lat[arm]["p99"]
    report = {
        "bench": "bench/routing_int8.py", "folds": folds, "draws": a.draws, "sizes": proto.sizes,
        "interleaved": "line by line, arm order alternating", "threads": 1, "cpus": os.cpu_count(),
        "load_avg_1m_at_end": os.getloadavg()[0], "seconds": round(time.time() - t0, 1),
        "held_out": not given, "models": {str(f): str(d) for f, d in dirs.items()},
        "pooled": pooled, "paired_vs_fp32": paired, "per_fold": per_fold, "latency": lat,
        "route_ms_quantiles": {arm: [round(float(x), 3) for x in np.percentile(v, QUANTILES)]
                               for arm, v in ms.items()},
    }
    write_report(a.json, report, plot, echo=[pooled_top1(pooled), paired, {k: v for k, v in lat.items()}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
