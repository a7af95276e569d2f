"""Tuning harness for argument generation (issue 6): gold tool, the engine's production turn, tune split only.

    .venv/bin/python bench/args_tune.py --limit 40 [--set copy_span=false ...] [--show]

Prints per-line output vs the stated arguments and the argument accuracy with a Wilson CI. Every prompt,
IR and decoding choice is tuned here on the tune split (``services.evals.args.tune_split``); the reported
figure comes from ``nexus eval args --split heldout``."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import fields, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.common.store import LocalStore  # noqa: E402
from services.engine.config import EngineConfig  # noqa: E402
from services.engine.engine import Engine, Result, Turn  # noqa: E402
from services.evals.args import arg_hits, sample_lines, tune_split  # noqa: E402
from services.evals.stats import wilson  # noqa: E402
from services.training.data import load_queries, load_registry  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _coerce(cfg: EngineConfig, kv: str) -> EngineConfig:
    key, _, val = kv.partition("=")
    types = {f.name: f.type for f in fields(cfg)}
    if key not in types:
        raise SystemExit(f"unknown engine setting {key!r}")
    cur = getattr(cfg, key)
    if isinstance(cur, bool):
        v: object = val.lower() in ("1", "true", "yes", "on")
    elif isinstance(cur, int):
        v = int(val)
    elif isinstance(cur, float):
        v = float(val)
    else:
        v = val
    return replace(cfg, **{key: v})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", default=str(DATA / "queries" / "train.jsonl"))
    ap.add_argument("--tools", default=str(DATA / "mcp_tools"))
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--split", choices=("tune", "heldout"), default="tune")
    ap.add_argument("--set", action="append", default=[], help="engine setting key=value (repeatable)")
    ap.add_argument("--show", action="store_true", help="print every line, not only the misses")
    ap.add_argument("--json", default="", help="write per-line rows here")
    ap.add_argument("--ids", default="", help="comma-separated line ids of the split to run (instead of a sample)")
    args = ap.parse_args()

    registry = load_registry(args.tools)
    by_name = registry.by_name()
    lines = [ln for ln in load_queries(args.queries) if ln.tool in by_name]
    tune, heldout = tune_split(lines)
    pool = tune if args.split == "tune" else heldout
    if args.ids:
        want = args.ids.split(",")
        lines = [ln for ln in pool if ln.id in want]
        if len(lines) != len(want):
            raise SystemExit(f"not in the {args.split} split: {sorted(set(want) - {ln.id for ln in lines})}")
    else:
        lines = sample_lines(pool, args.limit, args.seed)
    tmp = tempfile.TemporaryDirectory(prefix="args-tune-")  # the run's own store, removed at the end
    store = LocalStore(tmp.name)
    store.registry_put(list(registry.tools))
    cfg = replace(EngineConfig(), store_url=str(store.root), n_ctx=4096)
    for kv in args.set:
        cfg = _coerce(cfg, kv)
    engine = Engine(cfg, store)
    engine.warmup()
    hit = tot = 0
    rows = []
    t0 = time.perf_counter()
    for ln in lines:
        res = next(e for e in engine.generate(ln.query, ln.tool, [Turn(r, c) for r, c in ln.history])
                   if isinstance(e, Result))
        h, n = arg_hits(res.arguments_json, ln.args)
        hit, tot = hit + h, tot + n
        rows.append({"id": ln.id, "tool": ln.tool, "query": ln.query, "gold": ln.args,
                     "got": res.arguments_json, "hits": h, "stated": n, "valid": res.schema_valid})
        if args.show or h < n or not res.schema_valid:
            print(f"{ln.id} {ln.tool} {h}/{n}{'' if res.schema_valid else ' SCHEMA-INVALID'}\n  Q: {ln.query[:160]}\n  gold: {json.dumps(ln.args)[:200]}\n"
                  f"  got:  {res.arguments_json[:200]}", flush=True)
    lo, hi = wilson(hit, tot)
    print(f"\nargs {hit}/{tot} = {100 * hit / max(tot, 1):.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]  "
          f"valid {sum(r['valid'] for r in rows)}/{len(rows)}  {time.perf_counter() - t0:.0f} s  settings {args.set}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": args.set, "hits": hit, "stated": tot, "rows": rows},
                                              indent=1))
    engine.close()
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
