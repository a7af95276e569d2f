"""`nexus eval rules`: what each hand-written decoding rule is worth, per model, on held-out lines (issue 51).

    nexus eval rules [--model GGUF] [--limit 120] [--split heldout] --json reports/rules_<model>.json

The engine's decoding rules (the copy bias's terms, the slot reader's hints, enum choices:
``services.engine.profiles.RULES``, each a set of ``EngineConfig`` values that turns it off) are measured one at a
time against every rule the defaults enable (``profile = "none"``: whatever the model's profile says): for every
line, the production turn (``Engine.generate``: the gold tool, the spliced KV block, the grammar) runs with every
rule on and with each rule off, in a rotating order, on one loaded model. Each stated argument of the line is a
paired trial: a rule *gains* an argument the engine gets right with it and wrong without it, and *loses* one it
gets wrong with it and right without it. Per rule: gained, lost, the sign test's two-sided p, and the verdict
(``pays``: more gained than lost at p < 0.05; ``costs``: the reverse; else ``no evidence``). Rules that are off by
default are listed, not measured.

Lines are checkpointed to ``<json>.lines.jsonl`` as they finish (keyed by model, rules and line): a killed run
resumes where it stopped. Written: the JSON report and a PNG (net arguments gained per rule, with p).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from evals.args import select_lines, values_match
from evals.checkpoint import load_rows, write_report
from evals.stats import paired, wilson
from services.engine.config import EngineConfig
from services.engine.profiles import RULES, Rule, off_values, rule_is_on

log = logging.getLogger("nexus.eval.rules")

ALL_ON = "all rules"


def arg_results(arguments_json: str, gold: dict[str, Any]) -> list[bool]:
    """Per stated argument (in ``gold``'s order): right or not."""
    try:
        got = json.loads(arguments_json)
    except ValueError:
        got = None
    if not isinstance(got, dict):
        return [False] * len(gold)
    return [k in got and values_match(got[k], v) for k, v in gold.items()]


def summarize(lines: Sequence[dict[str, Any]], rules: Sequence[Rule]) -> dict[str, Any]:
    """Per arm: accuracy over the stated arguments; per rule: the paired comparison with every rule on."""
    def flat(arm: str) -> list[bool]:
        return [x for ln in lines for x in ln["arms"][arm]["args"]]

    base = flat(ALL_ON)
    n = len(base)
    out: dict[str, Any] = {"args": n, "lines": len(lines), "all_rules": {
        "arg_accuracy": sum(base) / n if n else 0.0, "wilson95": list(wilson(sum(base), n)),
        "schema_valid": sum(ln["arms"][ALL_ON]["valid"] for ln in lines) / max(1, len(lines))}, "rules": {}}
    for r in rules:
        off = flat(r.name)
        row = paired(base, off)  # what the rule gains over running without it
        row["verdict"] = {"gains": "pays", "loses": "costs"}.get(row["verdict"], row["verdict"])
        out["rules"][r.name] = {"what": r.what, "off": r.off, "arg_accuracy_without": sum(off) / n if n else 0.0,
                                **row,
                                "schema_valid_without": sum(ln["arms"][r.name]["valid"] for ln in lines)
                                / max(1, len(lines))}
    return out


def evaluate(queries: str, tools: str, out_json: str, *, model_path: str = "", limit: int = 120, seed: int = 0,
             split: str = "heldout", rules: Sequence[str] = (), together: Sequence[str] = (), n_ctx: int = 8192,
             workdir: str = "var/eval-rules", progress: bool = True) -> dict[str, Any]:
    """Run the comparison (module docstring) and write ``out_json`` + PNG; ``rules``: names (default all, or none
    when ``together`` is given); ``together``: names also turned off all at once, as one more arm (rules that are
    redundant with each other show nothing alone)."""
    import shutil
    import tempfile

    from tqdm import tqdm

    from services.common.models import file_fingerprint, resolve_gguf
    from services.common.store import LocalStore
    from services.compiler.kvblock import BlockCompiler
    from services.compiler.signature import signature
    from services.engine.engine import Engine, Result
    from services.runtime.prompt import Turn
    from training.data import load_queries, load_registry

    unknown = (set(rules) | set(together)) - {r.name for r in RULES}
    if unknown:
        raise ValueError(f"unknown rules {sorted(unknown)}; known: {[r.name for r in RULES]}")
    base_cfg = EngineConfig(profile="none")  # every rule the defaults enable, whatever the model's profile
    chosen = [r for r in RULES if r.name in rules or not (rules or together)]
    measured = [r for r in chosen if rule_is_on(r, base_cfg)]
    if together:
        measured.append(Rule(" + ".join(together), off_values(together), "these rules off together"))
    registry = load_registry(tools)
    by_name = registry.by_name()
    lines = select_lines([ln for ln in load_queries(queries) if ln.tool in by_name and ln.args], split, limit, seed)
    model = resolve_gguf(model_path)
    fingerprint = file_fingerprint(model)
    arms = [ALL_ON] + [r.name for r in measured]
    key = {"model": fingerprint, "arms": arms, "config": {f.name: getattr(base_cfg, f.name) for f in fields(base_cfg)
                                                           if f.name.startswith(("copy_", "slot_", "enum_"))}}
    ckpt = Path(str(out_json) + ".lines.jsonl")
    done = load_rows(ckpt, key)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(Path(workdir) / "store", ignore_errors=True)
    store = LocalStore(tempfile.mkdtemp(prefix="store-", dir=workdir))
    store.registry_put(list(registry.tools))
    cfg = replace(base_cfg, model_path=str(model), n_ctx=n_ctx, store_url=str(store.root))
    todo = [ln for ln in lines if ln.id not in done]
    t0 = time.time()
    if todo:
        blocks = BlockCompiler(str(model), n_threads=cfg.n_threads)
        for name in sorted({ln.tool for ln in todo}):
            tool = by_name[name]
            data, meta = blocks.compile(signature(tool))
            store.put(blocks.key(tool), data, meta)
        blocks.close()
        engine = Engine(cfg, store)
        engine.warmup()
        configs = {ALL_ON: cfg} | {r.name: replace(cfg, **r.off) for r in measured}
        try:
            with ckpt.open("a") as out:
                for i, ln in enumerate(tqdm(todo, desc="eval rules", unit="line", disable=not progress)):
                    hist = [Turn(r, c) for r, c in ln.history]
                    row: dict[str, Any] = {"key": key, "id": ln.id, "tool": ln.tool, "gold": ln.args, "arms": {}}
                    k = (len(done) + i) % len(arms)  # rotate which arm goes first
                    for arm in arms[k:] + arms[:k]:
                        engine.set_decoding(configs[arm])
                        res = next(e for e in engine.generate(ln.query, ln.tool, hist) if isinstance(e, Result))
                        row["arms"][arm] = {"arguments": res.arguments_json, "valid": res.schema_valid,
                                            "args": arg_results(res.arguments_json, ln.args)}
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    done[ln.id] = row
        finally:
            engine.close()
    rows = [done[ln.id] for ln in lines]
    report = {"what": "each decoding rule turned off alone vs every rule on: the production turn, gold tool, "
                      "per stated argument paired",
              "model": {"path": str(model), "sha256": fingerprint, "name": model.name},
              "protocol": {"queries": queries, "split": split, "limit": limit, "seed": seed, "lines": len(rows)},
              "not_measured_off_by_default": [r.name for r in chosen if r not in measured],
              **summarize(rows, measured), "seconds_this_run": round(time.time() - t0, 1),
              "per_line": [{k: v for k, v in r.items() if k != "key"} for r in rows]}
    write_report(out_json, report, plot)
    return report


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rules = report["rules"]
    names = list(rules)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.6))
    colors = {"pays": "#2a9d8f", "costs": "#e76f51", "no evidence": "#8d99ae"}
    y = range(len(names))
    ax.barh(list(y), [rules[n]["gained"] for n in names], color=[colors[rules[n]["verdict"]] for n in names],
            alpha=0.9, label="gained (right only with the rule)")
    ax.barh(list(y), [-rules[n]["lost"] for n in names], color="#e9c46a", label="lost (right only without it)")
    for i, n in enumerate(names):
        r = rules[n]
        ax.text(max(r["gained"], 0) + 0.5, i, f"net {r['net']:+d}, p = {r['sign_test_p']:.3g} ({r['verdict']})",
                va="center", fontsize=7)
    hi = max([rules[n]["gained"] for n in names] + [1])
    ax.set_xlim(-max([rules[n]["lost"] for n in names] + [1]) - 1, hi * 2.2 + 4)  # room for the notes
    ax.set_yticks(list(y))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=0.8)
    a = report["all_rules"]
    ax.set_xlabel(f"stated arguments (of {report['args']}, {report['lines']} held-out lines)")
    ax.set_title(f"{report['model']['name']}: each rule off alone vs all on "
                 f"({100 * a['arg_accuracy']:.1f} % with all)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_rules_eval_parser(sub) -> None:
    p = sub.add_parser("rules", help="each hand-written decoding rule off alone vs all on, per argument (held out)")
    p.add_argument("--queries", default="data/queries/train.jsonl")
    p.add_argument("--tools", default="data/mcp_tools")
    p.add_argument("--json", required=True, dest="out")
    p.add_argument("--model", default="", help="GGUF path (default: the engine's, SmolLM2-135M-Instruct)")
    p.add_argument("--limit", type=int, default=120, help="lines to sample (stratified by server; 0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=("heldout", "tune", "all"), default="heldout")
    p.add_argument("--rules", default="", help="comma-separated rule names (default: all, none with --together)")
    p.add_argument("--together", default="", help="comma-separated rule names also turned off at once (one arm)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    def run(args) -> int:
        rep = evaluate(args.queries, args.tools, args.out, model_path=args.model, limit=args.limit, seed=args.seed,
                       split=args.split, rules=[r.strip() for r in args.rules.split(",") if r.strip()],
                       together=[r.strip() for r in args.together.split(",") if r.strip()],
                       progress=not args.quiet)
        print(json.dumps({"all_rules": rep["all_rules"], "rules": {n: {k: r[k] for k in ("gained", "lost",
                                                                                         "sign_test_p", "verdict")}
                                                                   for n, r in rep["rules"].items()}}, indent=2))
        return 0

    p.set_defaults(fn=run)


__all__ = ["RULES", "Rule", "add_rules_eval_parser", "arg_results", "evaluate", "rule_is_on", "summarize"]
