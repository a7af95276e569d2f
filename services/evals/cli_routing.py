"""CLI wiring for routing: ``nexus eval routing``, ``nexus train-gate`` and ``nexus train-late-reader``.

``services/cli.py`` wires them:

    eval_sub = sub.add_parser("eval", ...).add_subparsers(dest="eval_cmd", required=True)
    add_routing_eval_parser(eval_sub)        # -> nexus eval routing ...
    add_train_gate_parser(sub)               # -> nexus train-gate ...
    add_train_late_reader_parser(sub)        # -> nexus train-late-reader ...

Each parser sets ``fn`` (args -> exit code), the convention of ``services.cli``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _hp_from_args(args: argparse.Namespace):
    from dataclasses import replace

    from services.training.gate import GateHyperParams

    kw = {"seed": args.seed}
    for name in ("q_epochs", "ce_epochs", "q_lr", "ce_lr", "ce_negatives", "ce_top_k", "threads"):
        v = getattr(args, name, None)
        if v is not None:
            kw[name] = v
    return replace(GateHyperParams(), **kw)


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _nonnegative_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def _checkout_data(name: str) -> str:
    """``data/<name>`` of this checkout when it exists, else '' (none)."""
    from pathlib import Path

    d = Path(__file__).resolve().parents[2] / "data" / name
    return str(d) if d.exists() else ""


def _add_calibration_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", default=_checkout_data("routing_calibration"),
                   help="held-out calibration lines (never trained on), a JSONL file or a directory of them: they "
                        "join the validation lines of the SLB calibration (default: data/routing_calibration of "
                        "this checkout; '' = validation lines only)")


def _add_slots_arg(p: argparse.ArgumentParser, what: str, default: str) -> None:
    p.add_argument("--slots", default=default,
                   help=f"slot reader (`nexus train-slots`) whose argument evidence {what} "
                        f"(services/router/argevidence.py; default: {default or 'none'}; '' = none)")


def _check_slots(path: str) -> None:
    from services.engine.slots import SlotModel

    if path and not SlotModel.exists(path):
        raise SystemExit(f"no slot reader at {path}: train one (`make models` / `nexus train-slots`) or pass --slots ''")


def _add_hp_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="split/shuffle/init seed (training is deterministic for it)")
    p.add_argument("--q-epochs", dest="q_epochs", type=int, help="query-encoder epochs (default 3)")
    p.add_argument("--ce-epochs", dest="ce_epochs", type=int, help="cross-encoder epochs (default 1)")
    p.add_argument("--q-lr", dest="q_lr", type=float, help="query-encoder learning rate")
    p.add_argument("--ce-lr", dest="ce_lr", type=float, help="cross-encoder learning rate")
    p.add_argument("--ce-negatives", dest="ce_negatives", type=int, help="hard negatives per query")
    p.add_argument("--ce-top-k", dest="ce_top_k", type=int, help="candidates the cross-encoder re-ranks")
    p.add_argument("--threads", type=int, help="torch threads (default 2)")


def add_routing_eval_parser(subparsers) -> argparse.ArgumentParser:
    """``routing`` under the ``eval`` command's subparsers."""
    p = subparsers.add_parser("routing", help="routing accuracy vs registry size on held-out queries (+ plot)",
                              description=(__import__("services.evals.routing", fromlist=["x"]).__doc__ or ""),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", required=True, help="JSONL of {id, tool, query, args, history}")
    p.add_argument("--tools", required=True, help="registry directory (like data/mcp_tools)")
    p.add_argument("--sizes", default="10,50,100,250,all", help="registry sizes, comma-separated ('all' allowed)")
    p.add_argument("--json", required=True, dest="out", help="report JSON (the PNG plot is written beside it)")
    p.add_argument("--plot", default=None, help="PNG path (default: OUT with .png)")
    p.add_argument("--protocol", choices=("seen", "unseen"), default="seen",
                   help="unseen: k-fold by server, every line routed by arms that took nothing from its server "
                        "(services/evals/unseen.py, the headline figure); seen (default): known tools, new requests")
    p.add_argument("--folds", type=int, default=None,
                   help="k of the held-out k-fold (default: 3 per tool line; 4 by server with --protocol unseen)")
    p.add_argument("--gate-arm", action=argparse.BooleanOptionalAction, default=True,
                   help="--protocol unseen: also route with each fold's gate model, trained as production from "
                        "nothing of the fold's servers (~10 min per fold once, cached under --models-root)")
    p.add_argument("--embedder", default="",
                   help="--protocol unseen: sentence-transformers directory for the untrained arms (default MiniLM)")
    p.add_argument("--derived", default=_checkout_data("derived/requests.jsonl"),
                   help="--protocol unseen: the registry's derived requests (nexus derive; '' = no derived arm)")
    p.add_argument("--draws", type=_positive_int, default=1,
                   help="independent draws of each line's distractors per size (rates over all draws, CIs by "
                        "bootstrap over lines)")
    p.add_argument("--holdout-server", default="kubernetes", help="server held out for generalization ('' = skip)")
    p.add_argument("--concat-limit", type=int, default=30, help="lines sampled for the concat-all baseline")
    p.add_argument("--no-concat", action="store_true", help="skip the concat-all baseline")
    p.add_argument("--concat-from", default="", help="reuse the concat-all section of an earlier report JSON "
                   "(it does not depend on the router; its source is recorded)")
    p.add_argument("--generalization-from", default="",
                   help="reuse the held-out server's routing of an earlier report JSON with the same protocol (that "
                        "model has no second stage; its source is recorded, the same lines' k-fold figures are this "
                        "run's)")
    p.add_argument("--model", default="", help="engine GGUF for concat-all (default SmolLM2-135M)")
    p.add_argument("--models-root", default="var/models", help="cache directory of trained gate models")
    p.add_argument("--exemplar-weight", type=float, default=-1.0,
                   help="SLB exemplar-key weight; negative (default) = each gate model's validation-chosen weight, "
                        "0 = text keys only (ablation)")
    p.add_argument("--augment", default=_checkout_data("routing_augment"),
                   help="fit-only training lines: a JSONL file or a directory of them (default: data/routing_augment "
                        "of this checkout; '' = none)")
    p.add_argument("--precision", choices=("int8", "fp32"), default=None,
                   help="the query encoder's graph (default: the router's, query_encoder_precision)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--late-reader", action=argparse.BooleanOptionalAction, default=True,
                   help="route each fold model with its own late reader, as the default router reads (trained once "
                        "per fold model and cached under --models-root, ~20 min each; --no-late-reader: no second "
                        "stage; ignored with --slots)")
    _add_calibration_arg(p)
    _add_slots_arg(p, "each fold model's second stage is calibrated for and routes with instead of the late reader "
                      "(NEXUS_ROUTER_LATE_READER_DIR=''; the held-out server's model never has it)", "")
    _add_hp_args(p)

    def run(args: argparse.Namespace) -> int:
        from services.evals.routing import evaluate

        t0 = time.time()
        if args.protocol == "unseen":
            from services.evals import unseen

            if args.derived and not Path(args.derived).is_file():
                raise SystemExit(f"nexus eval routing: no derived requests at {args.derived} (nexus derive writes "
                                 "them; --derived '' runs without that arm)")
            rep = unseen.evaluate(args.queries, args.tools, args.out, sizes=args.sizes, k=args.folds or 4,
                                  seed=args.seed, draws=args.draws, derived=args.derived, progress=not args.quiet,
                                  gate=args.gate_arm, augment=args.augment, calibration=args.calibration,
                                  models_root=args.models_root, embedder=args.embedder)
            brief = {a: {s: {k: round(v[k], 4) for k in ("top1", "top3")} for s, v in by.items()}
                     for a, by in rep["arms"].items()}
            print(json.dumps({"arms": brief, "json": args.out, "seconds": round(time.time() - t0)}, indent=2))
            return 0
        _check_slots(args.slots)
        rep = evaluate(args.queries, args.tools, args.sizes, args.out, seed=args.seed, folds=args.folds or 3,
                       holdout_server=args.holdout_server, concat_limit=args.concat_limit,
                       models_root=args.models_root, exemplar_weight=args.exemplar_weight, hp=_hp_from_args(args),
                       progress=not args.quiet, plot_path=args.plot, skip_concat=args.no_concat, model_path=args.model,
                       concat_from=args.concat_from, augment=args.augment, calibration=args.calibration,
                       draws=args.draws, slots=args.slots, precision=args.precision,
                       late_reader=args.late_reader and not args.slots,
                       generalization_from=args.generalization_from)
        brief = {s: {k: v[k] for k in ("n", "accuracy", "ci95", "slb_top1", "slb_top3", "escalation_rate",
                                          "route_ms_p50", "route_ms_p99")} for s, v in rep["sizes"].items()}
        print(json.dumps({"sizes": brief, "json": args.out, "plot": rep["plot"],
                          "seconds": round(time.time() - t0)}, indent=2))
        return 0

    p.set_defaults(fn=run)
    return p


def add_train_gate_parser(subparsers) -> argparse.ArgumentParser:
    """``train-gate`` at the top level: train (or keep the cached) gate model the router loads."""
    p = subparsers.add_parser("train-gate", help="train the router's query encoder + cross-encoder gate")
    p.add_argument("--queries", required=True, help="training JSONL (data/queries/train.jsonl)")
    p.add_argument("--tools", required=True, help="registry directory the queries route over")
    p.add_argument("--out", default="var/models/gate",
                   help="model directory (RouterConfig.gate_model_dir); kept when its data hash matches")
    p.add_argument("--force", action="store_true", help="retrain even when the cached model matches")
    p.add_argument("--augment", default=_checkout_data("routing_augment"),
                   help="fit-only training lines: a JSONL file or a directory of them (default: data/routing_augment "
                        "of this checkout; '' = none)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_calibration_arg(p)
    _add_slots_arg(p, "the model's second stage is calibrated for (after training; kept when current; make models "
                      "passes var/models/slots)", "")
    _add_hp_args(p)

    def run(args: argparse.Namespace) -> int:
        from services.evals.routing_models import prepare_training_env

        prepare_training_env()
        import logging

        from services.evals.routing_models import calibrate_arg_evidence, load_augment
        from services.training.data import equivalents, load_queries, load_registry
        from services.training.gate import train_gate

        logging.basicConfig(level=logging.INFO, format="%(message)s")
        lines = load_queries(args.queries)
        registry = load_registry(args.tools)
        t0 = time.time()
        _check_slots(args.slots)
        calibration = load_augment(args.calibration)
        doc = train_gate(lines, registry.tools, args.out, _hp_from_args(args), equivalents=equivalents,
                         progress=not args.quiet, force=args.force, extra=load_augment(args.augment),
                         calibration=calibration)
        if args.slots:
            doc["arg_evidence"] = calibrate_arg_evidence(args.out, lines, registry, calibration, args.slots,
                                                         progress=not args.quiet)
        keys = ("tau", "alpha", "ce_top_k", "n_fit", "n_fit_extra", "n_val", "val_gated_accuracy", "val_escalation_rate",
                "train_seconds", "data_hash")
        ae = {k: v for k, v in (doc.get("arg_evidence") or {}).items()
              if k in ("feature", "alpha", "tau", "choose_top1_slb", "choose_top1", "choose_escalation_rate")}
        if ae and "crossfit" in doc["arg_evidence"]:  # a section calibrated before the cross-fit has none
            ae["choose_top1_crossfit"] = doc["arg_evidence"]["crossfit"]["top1"]
        print(json.dumps({k: doc.get(k) for k in keys} | {"arg_evidence": ae or None, "out": args.out,
                                                           "seconds": round(time.time() - t0)},
                         indent=2), file=sys.stdout)
        return 0

    p.set_defaults(fn=run)
    return p


def add_train_late_reader_parser(subparsers) -> argparse.ArgumentParser:
    """``train-late-reader`` at the top level: train (or keep the current) late reader of a gate model, the
    argument-evidence stage's reader the router loads by default (services/training/late_reader.py)."""
    from services.router.late_reader import K
    from services.training.late_reader import EPOCHS, EXPORT_CLIP, ROUTE_EPOCHS

    p = subparsers.add_parser("train-late-reader",
                              help="train the router's late reader for a gate model and calibrate its stage")
    p.add_argument("--queries", required=True,
                   help="the gate model's training JSONL (its validation lines are drawn from it; the tune split "
                        "sets the reader's threshold)")
    p.add_argument("--tools", required=True, help="registry directory the queries route over")
    p.add_argument("--gate", default="var/models/gate", help="the gate model whose query encoder the reader reads")
    p.add_argument("--out", default="var/models/late_reader",
                   help="late reader directory (RouterConfig.late_reader_dir); kept while its export key matches")
    p.add_argument("--heads", default="var/models/late-reader-heads",
                   help="cache of trained heads, per gate model (reused unless --force)")
    p.add_argument("--augment", default=_checkout_data("routing_augment"),
                   help="the lines the head trains on: a JSONL file or a directory of them (default: "
                        "data/routing_augment of this checkout)")
    p.add_argument("--calibration", default=_checkout_data("routing_calibration"),
                   help="held-out lines the stage is calibrated on beside the gate model's validation lines "
                        "(default: data/routing_calibration of this checkout)")
    p.add_argument("--epochs", type=_positive_int, default=EPOCHS, help="span epochs (%(default)s)")
    p.add_argument("--route-epochs", type=_positive_int, default=ROUTE_EPOCHS,
                   help="epochs on the stage's decisions (%(default)s)")
    p.add_argument("--layers", type=_positive_int, default=K, help="the head's transformer layers (%(default)s)")
    p.add_argument("--clip", type=float, default=EXPORT_CLIP,
                   help="where a required parameter's score saturates in the stage's features (%(default)s)")
    p.add_argument("--no-enum-words", action="store_true", help="read enum parameters as spans only")
    p.add_argument("--seed", type=_nonnegative_int, default=0,
                   help="the head's initialisation and batch order (%(default)s; training is deterministic for it)")
    p.add_argument("--force", action="store_true", help="retrain the head and re-export even when current")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    def run(args: argparse.Namespace) -> int:
        from services.training.late_reader import train_late_reader

        t0 = time.time()
        doc = train_late_reader(args.out, gate=args.gate, tools=args.tools, queries=args.queries,
                                augment=args.augment, calibration=args.calibration, heads=args.heads,
                                epochs=args.epochs, route_epochs=args.route_epochs, layers=args.layers,
                                clip=args.clip, enum_words=not args.no_enum_words, seed=args.seed,
                                retrain=args.force,
                                progress=not args.quiet)
        if doc.get("kept"):
            print(f"late reader at {args.out} is current (export key {doc['export_key']}): kept")
            return 0
        doc.pop("head", None)
        print(json.dumps({**doc, "seconds": round(time.time() - t0)}, indent=1))
        print(f"NEXUS_ROUTER_LATE_READER_DIR={args.out} serves with it (var/models/late_reader is the router's "
              "default)")
        return 0

    p.set_defaults(fn=run)
    return p


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m services.evals.cli_routing eval routing ...`` / ``... train-gate ...``)
    for use before ``services.cli`` wires these commands."""
    from services.common.errors import NexusError

    parser = argparse.ArgumentParser(prog="nexus")
    sub = parser.add_subparsers(dest="cmd", required=True)
    ev = sub.add_parser("eval", help="offline evaluations").add_subparsers(dest="eval_cmd", required=True)
    add_routing_eval_parser(ev)
    add_train_gate_parser(sub)
    add_train_late_reader_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except NexusError as e:
        print(f"nexus: {type(e).__name__}: {e.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
