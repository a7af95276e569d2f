"""A reader on the router's own encoding: can the argument-evidence stage fit the latency budget? (issue 4)

    nice -n 19 .venv/bin/python bench/routing_late_reader.py --json reports/routing_late_reader.json
    nice -n 19 .venv/bin/python bench/routing_late_reader.py --distill --routing-json '' \
        --json reports/routing_late_reader_distilled.json

The argument-evidence stage (services/router/argevidence.py, reports/routing_experiments.md §19) gains ~0.6 points at
N = 250, but its slot reader cross-encodes every (parameter question, request) pair: ~250 ms per escalated request on
one thread. The late-interaction probe of §20 reads in ~20 ms, but only because it drops the cross-attention, and
without it the gain is gone. Most of the probe's 20 ms is one MiniLM pass over the request, and the router has already
made that pass: its query encoder runs over the same routing text to embed it. This reader reuses it:

* the request's token states are the router's query encoder's hidden states (all ``LAYERS``, the embeddings and each
  of its 6 layers; the ONNX graph can output them beside the sentence vector, measured below), frozen;
* each parameter question is encoded by the same frozen encoder once per registry, and cached;
* a learned mix of the layers is projected to ``D`` dimensions, and ``K`` small pre-norm transformer layers run over
  [question; request]. The request's tokens attend to the question's and their own; the question's tokens attend to
  themselves only. Their states therefore depend on the question alone, and their keys and values are cached per
  question as well. What an escalation computes is the K small layers over the request's tokens, once per question;
* a start/end head as the slot reader's. "Not stated" is the request's [CLS] token, and a question's score is its best
  span's logit minus that (``services.engine.slots.top_spans``).

It is trained like the slot reader, on the slot reader's examples from the augment lines (``slot_training.make_examples``,
with the routing text as the context the router encodes), for the gate model whose encoder it reads: one head per fold
model (``--folds``) and one for the production model (``--gate``). Cached in ``--out`` per gate model. ``--layers``
sets K. ``--distill`` then matches the slot reader itself where the stage reads: its scores of every span parameter of
the production SLB's top 4 on each augment line (``teacher_for``; the same targets for every head), a span batch every
other step so the head keeps its answers (``distill_head``).

Measured:
* stated-vs-unstated on the slot reader's validation examples (train.jsonl's tune split), the slot reader beside it;
* what each reader's best setting gains on the production model's choosing lines (its validation + calibration lines,
  ranked over the full registry: what ``make models`` calibrates the stage on), and whether it clears ``MIN_GAIN``:
  the criterion to choose a reader by (§21: the stated AUC is not);
* the routing gain, by bench/routing_arg_evidence.py with each fold's head as its reader (``--routing-json``);
* the reading time per escalated request of the production router on ``--calibration``, one thread: the head alone
  (question states cached, the request's states handed over as the router would), and what it costs the router's ONNX
  pass to also output the hidden states.
Nothing trains on train.jsonl or the calibration lines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from services.evals.routing_models import prepare_training_env  # noqa: E402
from services.router.late_reader import MAX_LEN, D, K, LateReader, export_states_graph  # noqa: E402
from services.training.late_reader import (  # noqa: E402
    EPOCHS,
    ROUTE_EPOCHS,
    head_for,
    int8_reader,
    route_groups,
    routing_examples,
)


def teacher_for(lines, tools, gate: str, slots: str, out: Path, progress: bool = True) -> list:
    """bench/routing_stated_probe.teacher_pairs of ``lines`` under ``gate``'s SLB and the slot reader at ``slots``
    (~12 min on 2 cores), cached in ``out`` by what they depend on."""
    from routing_stated_probe import teacher_pairs

    h = hashlib.sha256(json.dumps([[ln.id, ln.query, list(ln.history)] for ln in lines]).encode())
    h.update((Path(gate) / "gate.json").read_bytes())
    h.update((Path(slots) / "slots.json").read_bytes())
    path = out / f"teacher-{h.hexdigest()[:16]}.json"
    if path.is_file():
        return [tuple(t) for t in json.loads(path.read_text())]
    pairs = teacher_pairs(lines, tools, gate, slots, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(pairs))
    return pairs




def time_onnx(graphs: dict[str, Path], tokenizer, texts: Sequence[str], repeats: int = 3) -> dict[str, dict[str, float]]:
    """Each graph's single-request pass (one thread) over ``texts``, per request, fastest of ``repeats``; the graphs
    interleaved request by request and repeat by repeat, so the machine's noise falls on both alike."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    sessions = {name: ort.InferenceSession(str(g), opts, providers=["CPUExecutionProvider"])
                for name, g in graphs.items()}
    lat: dict[str, list[float]] = {name: [] for name in graphs}
    for text in texts:
        feats = tokenizer([text], return_tensors="np", truncation=True, max_length=MAX_LEN)
        best = dict.fromkeys(graphs, math.inf)
        for _ in range(repeats):
            for name, sess in sessions.items():
                feed = {i.name: feats[i.name].astype(np.int64) for i in sess.get_inputs()}
                t = time.perf_counter()
                sess.run(None, feed)
                best[name] = min(best[name], time.perf_counter() - t)
        for name in graphs:
            lat[name].append(1000 * best[name])
    out = {}
    for name, v in lat.items():
        p = np.percentile(v, [50, 95, 99])
        out[name] = {"n": len(v), "p50": float(p[0]), "p95": float(p[1]), "p99": float(p[2])}
    return out


def time_escalations(reader: LateReader, batches, limit: int) -> dict[str, float]:
    """The head's work per escalated request, the request's states handed over (as the router's pass gives them)."""
    lat = []
    for qs, ctx in batches[:limit]:
        hc = reader.states(ctx)
        reader.question_cache(qs)
        t = time.perf_counter()
        reader.score_states(qs, hc)
        lat.append(1000 * (time.perf_counter() - t))
    p = np.percentile(lat, [50, 90, 95, 99]) if lat else [0.0] * 4
    return {"n": len(lat), "p50": float(p[0]), "p90": float(p[1]), "p95": float(p[2]), "p99": float(p[3])}


def plot(report: dict, path: str) -> None:
    """bench/routing_stated_probe.py's figure, with the stage's reading budget."""
    from routing_stated_probe import plot as probe_plot

    probe_plot(report, path, budget_ms=25.0)












def production_figures(a, gate: Path, prod: LateReader, rec: dict[str, Any], earlier: dict[str, LateReader],
                        name: str, queries, registry, train, val, heads: dict[str, Any], teacher, groups
                        ) -> tuple[dict[str, Any], tuple]:
    """The production model's figures (the module's "Measured"): the report and what the console echoes."""
    import torch
    from routing_stated_probe import escalations, stated_figures, time_reads

    from services.engine.slots import SlotModel
    from services.evals.routing_models import calibrate_arg_evidence, load_augment
    from services.training.slots import predict

    slot = SlotModel(a.slots, threads=1)
    preds = predict(slot.model, slot.tokenizer, val, slot.max_len)
    stated = {"slot reader": stated_figures(np.array([p[2] for p in preds]), np.array([e.start >= 0 for e in val]))}
    readers: dict[str, Any] = {"slot reader": slot}
    for step, rd in earlier.items():
        stated[f"late reader ({step}, K = {a.layers})"] = rec[f"stated_{step}"]
        readers[f"late reader ({step}, K = {a.layers})"] = rd
    stated[name], readers[name] = rec["stated"], prod
    # the routing gain each reader's best setting would give the production model, on its own choosing lines (what
    # `make models` calibrates the stage on): the criterion to choose a reader by, held-out lines untouched
    calib = load_augment(a.calibration)
    choose = {}
    for arm, rd in readers.items():
        sec = calibrate_arg_evidence(gate, queries, registry, calib, a.slots, force=True, reader=rd, write=False)
        choose[arm] = {k: sec[k] for k in ("feature", "alpha", "tau", "n_choose", "choose_top1_slb", "choose_top1",
                                           "choose_escalation_rate", "best_if_kept", "crossfit")}
        cf = sec["crossfit"]
        print(f"{arm}: production choosing lines {100 * sec['choose_top1_slb']:.1f} -> "
              f"{100 * sec['best_if_kept']['top1']:.1f} at best ({sec['best_if_kept']['feature']}, "
              f"alpha {sec['best_if_kept']['alpha']}); kept: {sec['feature']}; cross-fit (each half at the other's "
              f"choice) {100 * cf['slb_top1']:.2f} -> {100 * cf['top1']:.2f}", flush=True)

    batches = escalations(calib, registry.tools, a.gate, a.slots)
    torch.set_num_threads(1)
    prod.question_cache([q for qs, _ in batches for q in qs])
    reads = {"slot reader": time_reads(slot, batches, a.time_limit),
             "late reader (head)": time_escalations(prod, batches, a.time_limit)}
    with tempfile.TemporaryDirectory(prefix="nexus-late-") as tmp:
        graph = Path(tmp) / "with_states.onnx"
        export_states_graph(prod.transformer, prod.tokenizer, graph)
        from services.router.onnx_encoder import onnx_path

        ctxs = [c for _, c in batches[:a.time_limit]]
        onnx = time_onnx({"router pass": onnx_path(gate / "query_encoder"), "router pass + hidden states": graph},
                         prod.tokenizer, ctxs)
    report = {
        "stated": stated, "n_val": len(val), "n_train": len(train), "heads": heads, "d": D, "k": a.layers,
        "teacher_pairs": sum(len(qq) for _, qq, _ in teacher), "route_groups": len(groups),
        "choose_production": choose,
        "read_ms_per_escalation": reads, "onnx_pass_ms": onnx, "escalations": len(batches), "seconds": 0.0,
        "protocol": "stated vs unstated on the slot examples of train.jsonl's tune split (the routing text as context); "
                    "routing gain: the argument-evidence calibration of the production model (its validation + "
                    "calibration lines, full registry) with each reader; "
                    "reading time over the production router's escalations on the calibration lines, one thread, "
                    "question keys and values cached, the request's states handed over; ONNX passes fastest of 3, "
                    "the two graphs interleaved; heads trained on the augment lines only, one per gate model; "
                    "distillation targets: the slot reader on every span parameter of the production SLB's top 4 "
                    "for each augment line"}
    return report, (stated, choose, reads, onnx)


def main(argv: Sequence[str] | None = None) -> int:
    from routing_stated_probe import add_reader_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_reader_args(ap, "the heads' training lines")
    ap.add_argument("--models-root", default="var/models", help="the fold models (bench/routing_arg_evidence.py's)")
    ap.add_argument("--out", default="var/models/late-reader-heads", help="heads, reused unless --retrain")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--layers", type=int, default=K, help="the head's transformer layers")
    ap.add_argument("--distill", action="store_true",
                    help="then distil the slot reader's scores on the SLB's top-4 parameters of the augment lines")
    ap.add_argument("--distill-epochs", type=int, default=2)
    ap.add_argument("--route", action="store_true",
                    help="then train the head on the stage's decisions: the augment lines' leave-one-out SLB top 4 "
                         "(route_groups, route_tune)")
    ap.add_argument("--route-epochs", type=int, default=ROUTE_EPOCHS)
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--time-limit", type=int, default=200, help="escalations timed")
    ap.add_argument("--json", default="reports/routing_late_reader.json")
    ap.add_argument("--routing-json", default="reports/routing_late_reader_routing.json",
                    help="bench/routing_arg_evidence.py with each fold's head ('' skips it)")
    ap.add_argument("--routing-args", default="--folds 0,1,2 --draws 3")
    ap.add_argument("--states-precision", choices=("fp32", "int8"), default="fp32",
                    help="--routing-json: the heads read the states of the fold model's torch encoder (fp32) or of its "
                         "INT8 states graph (services/router/late_reader.quantize_states, smoothed on the fold "
                         "model's exemplar requests: what a router at int8 reads)")
    ap.add_argument("--quantize", default="", metavar="DIR",
                    help="only add the INT8 states graph to the late reader at DIR for --gate (states.int8.onnx)")
    ap.add_argument("--routing-only", action="store_true",
                    help="skip the production model's head and figures: train the heads --routing-json needs and "
                         "run it")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)
    for flag, path in (("--gate", Path(a.gate) / "gate.json"), ("--tools", Path(a.tools)),
                       ("--queries", Path(a.queries)), ("--augment", Path(a.augment))):
        if not a.quantize and not path.exists():
            ap.error(f"{flag}: no {path} (`make setup` trains the gate model; the data is ../shared/data and data/)")

    prepare_training_env()
    if a.quantize:
        from services.router.late_reader import add_int8

        print(f"wrote {add_int8(a.quantize, Path(a.gate).resolve())}")
        return 0
    import torch

    from services.evals.args import tune_split
    from services.evals.routing import write_report
    from services.evals.routing_models import load_augment
    from services.training.data import load_queries, load_registry

    t0 = time.time()
    torch.set_num_threads(2)
    registry = load_registry(a.tools)
    by_name = {t.name: t for t in registry.tools}
    queries = load_queries(a.queries)
    tune, _ = tune_split(queries)
    augment = load_augment(a.augment)
    train, val = routing_examples(augment, by_name), routing_examples(tune, by_name)
    out = Path(a.out)
    gate = Path(a.gate).resolve()
    teacher = teacher_for(augment, registry.tools, a.gate, a.slots, out) if a.distill else []
    groups = route_groups(gate, augment, registry) if a.route and not a.routing_only else []
    last = "route-tuned" if groups else "distilled" if teacher else "span"
    name = f"late reader ({last}, K = {a.layers})"
    heads: dict[str, Any] = {}
    if not a.routing_only:  # the production head: what `nexus train-late-reader` writes, production_figures reads
        prod, rec, earlier = head_for(gate, train, val, out, a.epochs, a.retrain, progress=not a.quiet, k=a.layers,
                                      teacher=teacher, distill_epochs=a.distill_epochs, groups=groups,
                                      route_epochs=a.route_epochs)
        heads["production"] = rec
    if a.routing_only:
        report: dict[str, Any] = {"heads": heads, "d": D, "k": a.layers, "route_groups": len(groups),
                                  "protocol": "heads only (--routing-only): the routing figures are --routing-json's"}
        echo: tuple = ()
    else:
        report, echo = production_figures(a, gate, prod, rec, earlier, name, queries, registry, train, val, heads,
                                          teacher, groups)
    if a.routing_json:
        import routing_arg_evidence

        torch.set_num_threads(2)

        def reader_for(fm):
            reader, r, _ = head_for(fm.dir, train, val, out, a.epochs, a.retrain, k=a.layers, teacher=teacher,
                                    distill_epochs=a.distill_epochs,
                                    groups=route_groups(fm.dir, augment, registry) if a.route else (),
                                    route_epochs=a.route_epochs)
            heads[fm.dir.name] = r
            reader.threads = 2
            if a.states_precision == "int8":
                reader = int8_reader(reader, fm.dir, out / fm.dir.name)
            return reader

        routing_arg_evidence.main([*a.routing_args.split(), "--json", a.routing_json], reader_for=reader_for)
        report["routing"] = a.routing_json
    report["seconds"] = round(time.time() - t0, 1)
    write_report(a.json, report, None if a.routing_only else plot, echo=echo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
