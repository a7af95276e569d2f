"""The public protocol by server folds: encoders trained on public tools *plus our requests*, each scored on the
shipped servers it never saw (issue 50; DESIGN §7's shipped recipe, measured as unseen).

    python -m evals.public_folds --split 2                      # print the folds' servers (training's holdouts)
    python -m training.public <ROUTER_RECIPE> --holdout-servers <fold i's servers> --out DIR_i   (per fold)
    python -m evals.public_folds --fold DIR_0 --fold DIR_1 [--base DIR] [--gates] \
        --json reports/routing_public_folds.json

An encoder trained on Seal-Tools alone never saw a shipped tool, so one model scores the whole registry
(``evals.public``). One trained on Seal plus the shipped tools' own requests (``--with-shipped``) has seen them: its
honest figure for a user's new tools comes from folds. Each fold's encoder held out some servers' tools and
requests (``holdout_servers`` in its ``public_meta.json``) and scores only those servers' requests
(``evals.public.evaluate(score_servers=...)``) over registries of every shipped tool, drawn as the public protocol
draws them. The folds' figures are pooled: per arm and size, top-1/top-3 over all line-draws (Wilson 95 %
intervals), per server, and the paired fixed/broken counts summed with a sign test.

In the pooled report ``public`` names the fold encoders (public + ours, unseen servers) and ``base`` the ``--base``
encoder (default ``''``: plain all-MiniLM-L6-v2, which every machine has; ``--base`` the Seal-only encoder of
``make train-encoder`` to see what our requests add for tools the encoder never saw). The ``(seen)`` arms key each
scored tool by its hand-written requests too (the data a user may supply at registration), never by the scored
request.

``--gates``: the router as it serves, per fold. Each fold's gate model is built on the fold's encoder as the shipped
one is built on the shipped encoder (``training.gate.SHIPPED_GATE``: encoder kept, no cross-encoder, the SLB's
exemplar keys and weights calibrated), from the other fold's servers only (``evals.unseen.fold_gate``: their tools,
requests, augment and calibration lines; a few minutes a fold, cached by data hash). Its arms, named ``router`` in
every fold: ``router (unseen, tools as new)``, every tool keyed by its text as a new registration is, and, on the
new requests, ``router (unseen, as it serves)``: the other fold's tools keyed by their requests, the scored ones new,
as a user's tools sit beside the shipped ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASE = ""  # plain all-MiniLM-L6-v2
DEFAULT_GATES_ROOT = Path.home() / ".cache/nexus/models/public-fold-gates"


def fold_servers(tools: str = str(REPO / "data/mcp_tools"), k: int = 2, seed: int = 0) -> list[list[str]]:
    """The shipped servers in ``k`` folds balanced by tool count (``evals.unseen.server_folds``)."""
    from evals.unseen import server_folds
    from training.data import load_registry

    folds = server_folds(load_registry(tools), k, seed)
    return [sorted(s for s, g in folds.items() if g == i) for i in range(k)]


def holdout_of(encoder: str | Path) -> list[str]:
    """The servers ``encoder`` (a training.public directory) never trained on."""
    meta_path = Path(encoder) / "public_meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path} missing: not a finished training.public run")
    meta = json.loads(meta_path.read_text())
    held = [s for s in str(meta.get("holdout_servers") or "").split(",") if s]
    if not held:
        raise ValueError(f"{encoder} held out no server: it saw every shipped tool, so it has no unseen fold")
    return held


def pool(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per arm (present in every fold) and size: the folds' top-1/top-3 pooled over their line-draws, per-server
    top-1 merged, and the paired counts summed."""
    from evals.stats import sign_test, wilson

    arms: dict[str, Any] = {}
    common = [a for a in reports[0]["arms"] if all(a in r["arms"] for r in reports)]
    for arm in common:
        by_size: dict[str, Any] = {}
        for size in reports[0]["arms"][arm]["by_size"]:
            rows = [r["arms"][arm]["by_size"][size] for r in reports]
            n = sum(x["n_line_draws"] for x in rows)
            k1 = round(sum(x["top1"] * x["n_line_draws"] for x in rows))
            k3 = round(sum(x["top3"] * x["n_line_draws"] for x in rows))
            by_server: dict[str, float] = {}
            for x in rows:
                by_server.update(x["top1_by_server"])
            by_size[size] = {"n_line_draws": n, "n_lines": sum(x["n_lines"] for x in rows),
                             "top1": k1 / n if n else 0.0, "top3": k3 / n if n else 0.0,
                             "top1_wilson95": list(wilson(k1, n)), "top3_wilson95": list(wilson(k3, n)),
                             "top1_by_fold": [x["top1"] for x in rows], "top1_by_server": by_server}
        first = reports[0]["arms"][arm]
        arms[arm] = {"protocol": first["protocol"], "lines": first["lines"], "lexical_weight": first["lexical_weight"],
                     "by_size": by_size}
    paired: dict[str, Any] = {}
    for key in (k for k in reports[0]["paired"] if all(k in r["paired"] for r in reports)):
        paired[key] = {}
        for size in reports[0]["paired"][key]:
            fixed = sum(r["paired"][key][size]["fixed"] for r in reports)
            broken = sum(r["paired"][key][size]["broken"] for r in reports)
            paired[key][size] = {"fixed": fixed, "broken": broken, "sign_test_p": sign_test(fixed, broken)}
    return {"arms": arms, "paired": paired}


def evaluate_folds(folds: Sequence[str], out_json: str, *, base: str = DEFAULT_BASE,
                   queries: str = str(REPO / "data/queries/train.jsonl"), tools: str = str(REPO / "data/mcp_tools"),
                   sizes: str = "10,50,100,250,all", draws: int = 3, seed: int = 0,
                   new_queries: str = str(REPO / "data/routing_calibration"), servers: Sequence[str] = (),
                   gates: bool = False, augment: str = str(REPO / "data/routing_augment"),
                   calibration: str = str(REPO / "data/routing_calibration"),
                   gates_root: str = str(DEFAULT_GATES_ROOT), gate_tool_text: str | None = None,
                   cross_encoders: Sequence[str] = (), plot_png: bool = True) -> dict[str, Any]:
    """Score each fold encoder on its held-out servers (``evals.public.evaluate``) and pool them (module
    docstring); writes ``out_json`` (+ PNG) and returns the report. ``servers``: restrict the registry (tests).
    ``gates``: add each fold's router arms (module docstring), its gate model built from ``queries``, ``augment``
    and ``calibration`` lines of the other folds' servers under ``gates_root``, keying tools by ``gate_tool_text``
    (``GateHyperParams.tool_text``; None = the shipped gate's). ``cross_encoders``: one ``training.public_ce``
    directory per fold, trained with the same servers held out, the second stage's arms."""
    from evals.public import evaluate, plot

    t0 = time.time()
    held = [holdout_of(f) for f in folds]
    seen: set[str] = set()
    for f, h in zip(folds, held, strict=True):
        if seen & set(h):
            raise ValueError(f"{f} holds out {sorted(seen & set(h))}, already another fold's")
        seen |= set(h)
    if cross_encoders:
        if len(cross_encoders) != len(folds):
            raise ValueError(f"{len(cross_encoders)} cross-encoders for {len(folds)} folds: give one per fold")
        for ce, h in zip(cross_encoders, held, strict=True):
            ce_held = json.loads((Path(ce) / "public_ce.json").read_text()).get("holdout_servers") or ""
            if sorted(x for x in ce_held.split(",") if x) != sorted(h):
                raise ValueError(f"{ce} held out {ce_held or 'nothing'}, its fold {','.join(h)}")
    from training.data import load_registry

    registry = load_registry(tools)
    if servers:
        registry = registry.subset([n for n in registry.names if registry.server_of[n] in set(servers)])
    runs, gate_dirs = [], []
    with tempfile.TemporaryDirectory(prefix="public-folds-") as tmp:
        for i, (f, h) in enumerate(zip(folds, held, strict=True)):
            print(f"[folds] fold {i}: {f} on {len(h)} held-out servers", file=sys.stderr, flush=True)
            gate = ""
            if gates:
                gate = str(fold_gate_model(f, h, registry, queries, augment, calibration, gates_root, seed,
                                           tool_text=gate_tool_text))
                gate_dirs.append(gate)
            runs.append(evaluate(str(f), str(Path(tmp) / f"fold{i}.json"), base=base, queries=queries, tools=tools,
                                 sizes=sizes, draws=draws, seed=seed, new_queries=new_queries, score_servers=h, servers=servers,
                                 derived="", gate=gate, router_tag="router", plot_png=False,
                                 cross_encoder=cross_encoders[i] if cross_encoders else ""))
    registered = set(registry.servers())
    pooled = pool(runs)
    report = {
        "protocol": {**runs[0]["protocol"], "name": "public-folds",
                     "what": "encoders trained on public tools plus the shipped tools' requests of the other "
                             "folds, each scoring only the servers it never saw; 'public' = the fold encoders, "
                             "'base' = --base; '(seen)' arms key the scored tools by their hand-written requests "
                             "(never the scored one)",
                     "lines": sum(r["protocol"]["lines"] for r in runs),
                     "new_lines": sum(r["protocol"]["new_lines"] for r in runs),
                     "scored_servers": sorted(seen), "unscored_servers": sorted(registered - seen)},
        "folds": [{"encoder": str(f), "holdout_servers": h, "encoder_meta": r["encoders"]["public"],
                   "lines": r["protocol"]["lines"], "router": (r["routers"] or [None])[0],
                   **({"cross_encoder": r["cross_encoder"]} if r.get("cross_encoder") else {})}
                  for f, h, r in zip(folds, held, runs, strict=True)],
        "base": runs[0]["encoders"]["base"],
        **pooled,
        "seconds": round(time.time() - t0, 1),
    }
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(report, indent=2) + "\n")
    if plot_png:
        for a in report["arms"].values():  # the plot's bands: Wilson intervals (no line bootstrap across folds)
            for row in a["by_size"].values():
                row["top1_bootstrap95_lines"], row["top3_bootstrap95_lines"] = row["top1_wilson95"], row["top3_wilson95"]
        plot(report, str(Path(out_json).with_suffix(".png")),
             title=f"{len(folds)} fold encoders (public tools + the other folds' requests), each on its unseen servers")
    return report


def fold_gate_model(encoder: str | Path, held: Sequence[str], registry, queries: str, augment: str, calibration: str,
                    gates_root: str, seed: int = 0, tool_text: str | None = None) -> Path:
    """The gate model of the fold that held out ``held``: built on its encoder as the shipped gate is on the shipped
    encoder (its tools keyed by ``tool_text`` if given), from nothing of ``held`` (``evals.unseen.fold_gate``)."""
    from dataclasses import replace

    from evals.unseen import fold_gate
    from training.data import load_queries
    from training.gate import SHIPPED_GATE

    folds = {s: 0 if s in set(held) else 1 for s in registry.servers()}
    lines = [ln for ln in load_queries(queries) if ln.tool in set(registry.names)]
    return Path(fold_gate(0, registry, lines, folds, seed, augment, calibration, gates_root, progress=False,
                          hp=replace(SHIPPED_GATE, encoder=str(encoder), seed=seed,
                                     tool_text=SHIPPED_GATE.tool_text if tool_text is None else tool_text)))


def main(argv: Sequence[str] | None = None) -> int:
    from services.common.embedder import KEY_TEXTS
    from training.data import prepare_training_env

    prepare_training_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", type=int, default=0, metavar="K", help="print the K folds' servers and stop")
    ap.add_argument("--fold", action="append", default=[], help="a fold encoder (training.public --holdout-servers)")
    ap.add_argument("--base", default=DEFAULT_BASE,
                    help="the encoder compared with (default '': all-MiniLM-L6-v2; a training.public --out DIR)")
    ap.add_argument("--queries", default=str(REPO / "data/queries/train.jsonl"))
    ap.add_argument("--tools", default=str(REPO / "data/mcp_tools"))
    ap.add_argument("--sizes", default="10,50,100,250,all")
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--new-queries", default=str(REPO / "data/routing_calibration"))
    ap.add_argument("--gates", action="store_true",
                    help="add the router's arms: a gate model per fold from the other folds' lines (minutes a fold)")
    ap.add_argument("--gate-tool-text", default=None, choices=sorted(KEY_TEXTS),
                    help="the text the fold gates key tools by (default: the fold encoder's own form, as the shipped gate)")
    ap.add_argument("--cross-encoder", action="append", default=[],
                    help="a second stage per fold, in --fold's order (training.public_ce with the same held-out servers)")
    ap.add_argument("--json", default=str(REPO / "reports/routing_public_folds.json"))
    a = ap.parse_args(argv)
    if a.split:
        for i, ss in enumerate(fold_servers(a.tools, a.split)):
            print(f"fold {i}: {','.join(ss)}")
        return 0
    if not a.fold:
        ap.error("give --fold DIR (one per fold) or --split K")
    from evals.public import print_arms

    rep = evaluate_folds(a.fold, a.json, base=a.base, queries=a.queries, tools=a.tools, sizes=a.sizes,
                         draws=a.draws, new_queries=a.new_queries, gates=a.gates, gate_tool_text=a.gate_tool_text,
                         cross_encoders=a.cross_encoder)
    print_arms(rep, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
