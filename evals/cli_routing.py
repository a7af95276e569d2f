"""CLI wiring for routing: ``nexus eval routing`` and ``nexus train-gate``.

``cli/main.py`` wires them:

    eval_sub = sub.add_parser("eval", ...).add_subparsers(dest="eval_cmd", required=True)
    add_routing_eval_parser(eval_sub)        # -> nexus eval routing ...
    add_train_gate_parser(sub)               # -> nexus train-gate ...

Each parser sets ``fn`` (args -> exit code), the convention of ``cli.main``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _hp_from_args(args: argparse.Namespace):
    from dataclasses import replace

    from training.gate import GateHyperParams

    kw = {"seed": args.seed}
    for name in ("q_epochs", "ce_epochs", "q_lr", "ce_lr", "ce_negatives", "ce_top_k", "threads", "encoder"):
        v = getattr(args, name, None)
        if v is not None:
            kw[name] = v
    return replace(GateHyperParams(), **kw)


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _checkout_data(name: str) -> str:
    """``data/<name>`` of this checkout when it exists, else '' (none)."""
    from pathlib import Path

    d = Path(__file__).resolve().parents[1] / "data" / name
    return str(d) if d.exists() else ""


def _add_calibration_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", default=_checkout_data("routing_calibration"),
                   help="held-out calibration lines (never trained on), a JSONL file or a directory of them: they "
                        "join the validation lines of the SLB calibration (default: data/routing_calibration of "
                        "this checkout; '' = validation lines only)")


def _add_hp_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="split/shuffle/init seed (training is deterministic for it)")
    p.add_argument("--q-epochs", dest="q_epochs", type=int, help="query-encoder epochs (default 3)")
    p.add_argument("--ce-epochs", dest="ce_epochs", type=int, help="cross-encoder epochs (default 1)")
    p.add_argument("--q-lr", dest="q_lr", type=float, help="query-encoder learning rate")
    p.add_argument("--ce-lr", dest="ce_lr", type=float, help="cross-encoder learning rate")
    p.add_argument("--ce-negatives", dest="ce_negatives", type=int, help="hard negatives per query")
    p.add_argument("--ce-top-k", dest="ce_top_k", type=int, help="candidates the cross-encoder re-ranks")
    p.add_argument("--threads", type=int, help="torch threads (default 2)")
    p.add_argument("--encoder", help="build on this sentence-transformers encoder (training/public.py's; its own "
                                     "vectors key the tools) instead of all-MiniLM-L6-v2; with --q-epochs 0 "
                                     "--ce-epochs 0 it is the shipped recipe (training/recipes.py)")


def add_routing_eval_parser(subparsers) -> argparse.ArgumentParser:
    """``routing`` under the ``eval`` command's subparsers."""
    p = subparsers.add_parser("routing", help="routing accuracy vs registry size on held-out queries (+ plot)",
                              description=(__import__("evals.routing", fromlist=["x"]).__doc__ or ""),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", required=True, help="JSONL of {id, tool, query, args, history}")
    p.add_argument("--tools", required=True, help="registry directory (like data/mcp_tools)")
    p.add_argument("--sizes", default="10,50,100,250,all", help="registry sizes, comma-separated ('all' allowed)")
    p.add_argument("--json", required=True, dest="out", help="report JSON (the PNG plot is written beside it)")
    p.add_argument("--plot", default=None, help="PNG path (default: OUT with .png)")
    p.add_argument("--protocol", choices=("seen", "unseen", "public"), default="seen",
                   help="public: the whole registry as unseen tools for an encoder trained on public tools only "
                        "(--encoder; evals/public.py, the headline figure, minutes); unseen: k-fold by server, every "
                        "line routed by arms that took nothing from its server (evals/unseen.py); seen (default): "
                        "known tools, new requests")
    p.add_argument("--gate", default="",
                   help="--protocol public: comma-separated gate models, each the production router's arms (every "
                        "tool scored as a newly registered one; on the new requests also as it serves)")
    p.add_argument("--score-servers", default="",
                   help="--protocol public: score only these servers' requests (a fold whose encoder held them out)")
    p.add_argument("--new-queries", default=_checkout_data("routing_calibration"),
                   help="--protocol public: requests that are never keys, scored with every --queries request as a "
                        "key (default: data/routing_calibration; '' = none)")
    p.add_argument("--folds", type=int, default=None,
                   help="k of the held-out k-fold (default: 3 per tool line; 4 by server with --protocol unseen)")
    p.add_argument("--gate-arm", action=argparse.BooleanOptionalAction, default=True,
                   help="--protocol unseen: also route with each fold's gate model, trained as production from "
                        "nothing of the fold's servers (~10 min per fold once, cached under --models-root)")
    p.add_argument("--embedder", default="",
                   help="--protocol unseen: sentence-transformers directory for the untrained arms (default MiniLM)")
    p.add_argument("--derived", default=_checkout_data("derived/requests.jsonl"),
                   help="--protocol unseen / public: the registry's derived requests (nexus derive; '' = no derived "
                        "arm)")
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
    _add_calibration_arg(p)
    _add_hp_args(p)

    def run(args: argparse.Namespace) -> int:
        from evals.routing import evaluate

        t0 = time.time()
        if args.protocol == "public":
            from evals import public

            if not args.encoder:
                raise SystemExit("nexus eval routing --protocol public: --encoder DIR (training/public.py's encoder; "
                                 "`make train` writes ~/.cache/nexus/models/encoder)")
            rep = public.evaluate(args.encoder, args.out, queries=args.queries, tools=args.tools, sizes=args.sizes,
                                  draws=args.draws, seed=args.seed, new_queries=args.new_queries,
                                  gate=[g for g in (args.gate or "").split(",") if g],
                                  score_servers=[s for s in (args.score_servers or "").split(",") if s],
                                  derived=args.derived)
            brief = {a: {s: {k: round(v[k], 4) for k in ("top1", "top3")} for s, v in x["by_size"].items()}
                     for a, x in rep["arms"].items()}
            print(json.dumps({"arms": brief, "json": args.out, "seconds": round(time.time() - t0)}, indent=2))
            return 0
        if args.protocol == "unseen":
            from evals import unseen

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
        rep = evaluate(args.queries, args.tools, args.sizes, args.out, seed=args.seed, folds=args.folds or 3,
                       holdout_server=args.holdout_server, concat_limit=args.concat_limit,
                       models_root=args.models_root, exemplar_weight=args.exemplar_weight, hp=_hp_from_args(args),
                       progress=not args.quiet, plot_path=args.plot, skip_concat=args.no_concat, model_path=args.model,
                       concat_from=args.concat_from, augment=args.augment, calibration=args.calibration,
                       draws=args.draws, precision=args.precision, generalization_from=args.generalization_from)
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
    _add_hp_args(p)

    def run(args: argparse.Namespace) -> int:
        from evals.routing_models import prepare_training_env

        prepare_training_env()
        import logging

        from evals.routing_models import load_augment
        from training.data import equivalents, load_queries, load_registry
        from training.gate import train_gate

        logging.basicConfig(level=logging.INFO, format="%(message)s")
        lines = load_queries(args.queries)
        registry = load_registry(args.tools)
        t0 = time.time()
        calibration = load_augment(args.calibration)
        doc = train_gate(lines, registry.tools, args.out, _hp_from_args(args), equivalents=equivalents,
                         progress=not args.quiet, force=args.force, extra=load_augment(args.augment),
                         calibration=calibration)
        keys = ("tau", "alpha", "ce_top_k", "n_fit", "n_fit_extra", "n_val", "val_gated_accuracy", "val_escalation_rate",
                "train_seconds", "data_hash")
        print(json.dumps({k: doc.get(k) for k in keys} | {"out": args.out, "seconds": round(time.time() - t0)},
                         indent=2), file=sys.stdout)
        return 0

    p.set_defaults(fn=run)
    return p


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m evals.cli_routing eval routing ...`` / ``... train-gate ...``)
    for use before ``cli.main`` wires these commands."""
    from services.common.errors import NexusError

    parser = argparse.ArgumentParser(prog="nexus")
    sub = parser.add_subparsers(dest="cmd", required=True)
    ev = sub.add_parser("eval", help="offline evaluations").add_subparsers(dest="eval_cmd", required=True)
    add_routing_eval_parser(ev)
    add_train_gate_parser(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except NexusError as e:
        print(f"nexus: {type(e).__name__}: {e.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
