"""`nexus eval models`: the engine's default model chosen by measurement (issue 51, item 3).

    nexus eval models --model <GGUF or models/gguf.json name> [--limit 120] [--latency-lines 24] \
        --json reports/models.json

One run measures one model and writes its entry into the combined report (the other models' entries are kept), so
the models are compared side by side on the same held-out lines (``select_lines``: same split, limit and seed):

- **first start**: every tool of the registry compiled into its KV block, as ``make run`` does on a fresh machine
  (seconds per tool summed, the blocks' bytes: the store's size);
- **memory**: the engine's resident memory, loaded and warm (RSS after minus before; one model per process);
- **arguments**: the production turn (``Engine.generate``: the model's profile, the spliced KV block, the grammar)
  with the gold tool, per stated argument; **end to end**: the same, counted only where the default router picked
  the gold tool (the router does not depend on the model); JSON schema validity;
- **first argument latency** on ``--latency-lines`` of those lines (every k-th), interleaved per line: the
  production turn, the full-schema re-prefill (the whole JSON schema in the engine's prompt, no cache) and the
  prefix-cached arm (the server's schemas at the head of a second context, warm in llama.cpp's prefix cache).

Lines and compiled tools are checkpointed (``<json>.<model>.jsonl``, keyed by model fingerprint and code version):
a killed run resumes. The report's ``verdict`` names the model with the best end-to-end argument accuracy among
those meeting the latency targets (first argument >= 2.5x sooner than the full-schema re-prefill, no slower than
the prefix-cached arm: a target is missed when the 95 % interval of the paired ratio lies wholly on the wrong side)
and the first-start budget; the README's model table is read from it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from evals.args import SYSTEM_ALL, default_router, is_json, run_generation, schema_view, select_lines
from evals.checkpoint import load_rows, write_report
from evals.rules import arg_results
from evals.stats import bootstrap_median_ci, bootstrap_ratio_ci, median, paired, wilson

VERSION = 1  # bump when what a checkpointed line means changes
FIRST_START_BUDGET_S = 300.0
SPEEDUP_TARGET = 2.5


def rss_mb() -> float:
    """This process's resident memory, MB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def summarize(lines: list[dict[str, Any]], compiled: dict[str, dict]) -> dict[str, Any]:
    flat = [x for ln in lines for x in ln["args"]]
    e2e = [x and ln["route_ok"] for ln in lines for x in ln["args"]]
    lat = [ln["latency"] for ln in lines if ln.get("latency")]
    out: dict[str, Any] = {
        "lines": len(lines), "args": len(flat),
        "arg_accuracy_gold_tool": sum(flat) / max(1, len(flat)), "gold_tool_wilson95": list(wilson(sum(flat),
                                                                                                      len(flat))),
        "arg_accuracy_e2e": sum(e2e) / max(1, len(e2e)), "e2e_wilson95": list(wilson(sum(e2e), len(e2e))),
        "routing_accuracy": sum(ln["route_ok"] for ln in lines) / max(1, len(lines)),
        "schema_valid": sum(ln["valid"] for ln in lines) / max(1, len(lines)),
        "json_valid": sum(ln["json"] for ln in lines) / max(1, len(lines)),
        "first_arg_ms_engine_all_lines": median([ln["first_arg_ms"] for ln in lines]) if lines else None,
        "compile": {"tools": len(compiled), "seconds": round(sum(c["seconds"] for c in compiled.values()), 1),
                    "store_mb": round(sum(c["bytes"] for c in compiled.values()) / 2 ** 20, 1)},
        "latency_lines": len(lat)}
    for arm in ("engine", "full_schema", "prefix_cached"):
        vals = [x[arm] for x in lat if x.get(arm) is not None]
        out[f"first_arg_ms_{arm}"] = median(vals) if vals else None
        out[f"first_arg_ms_{arm}_ci95"] = list(bootstrap_median_ci(vals)) if len(vals) > 1 else None
    # ratios of medians over the lines that ran both arms, with the 95 % interval of paired resamples
    for name, num, den in (("speedup_vs_full_schema", "full_schema", "engine"),
                           ("engine_over_prefix_cached", "engine", "prefix_cached")):
        both = [x for x in lat if x.get(num) is not None and x.get(den) is not None]
        a, b = [x[num] for x in both], [x[den] for x in both]
        out[name] = median(a) / median(b) if both else None
        out[f"{name}_ci95"] = list(bootstrap_ratio_ci(a, b)) if len(both) > 1 else None
    return out


def paired_models(models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each pair of models on the same stated arguments, gold tool: gained / lost per argument and the sign test."""
    out = {}
    names = [n for n in models if models[n].get("per_line")]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ids = sorted(models[a]["per_line"])
            if ids != sorted(models[b]["per_line"]):
                continue
            out[f"{b} vs {a}"] = paired([x for k in ids for x in models[b]["per_line"][k]["args"]],
                                        [x for k in ids for x in models[a]["per_line"][k]["args"]])
    return out


def verdict(models: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The default by measurement: best end-to-end accuracy among the models that meet the latency targets and the
    first-start budget (each model's misses listed)."""
    misses: dict[str, list[str]] = {}
    for name, m in models.items():
        miss = []
        # a latency target is missed when the paired interval says so, not when a median of ~24 lines wavers
        lo, hi = m.get("speedup_vs_full_schema_ci95") or [m.get("speedup_vs_full_schema") or 0] * 2
        if hi < SPEEDUP_TARGET:
            miss.append(f"first argument {m.get('speedup_vs_full_schema') or 0:.2f}x [{lo:.2f}, {hi:.2f}] sooner than "
                        f"the full-schema re-prefill (target {SPEEDUP_TARGET}x)")
        lo, hi = m.get("engine_over_prefix_cached_ci95") or [m.get("engine_over_prefix_cached") or 0] * 2
        if lo > 1.0:
            miss.append(f"first argument {m['engine_over_prefix_cached']:.2f}x [{lo:.2f}, {hi:.2f}] the prefix-cached "
                        f"arm's (slower)")
        if m["compile"]["seconds"] > FIRST_START_BUDGET_S:
            miss.append(f"first start {m['compile']['seconds']:.0f} s (budget {FIRST_START_BUDGET_S:.0f} s)")
        misses[name] = miss
    ok = [n for n in models if not misses[n]]
    pool = ok or list(models)
    best = max(pool, key=lambda n: (models[n]["arg_accuracy_e2e"], models[n]["arg_accuracy_gold_tool"]))
    return {"default": best, "meets_targets": bool(ok), "misses": misses,
            "rule": "best end-to-end argument accuracy among the models meeting the latency targets and the "
                    "first-start budget (else among all)"}


def evaluate(queries: str, tools: str, out_json: str, *, model: str = "", limit: int = 120, seed: int = 0,
             split: str = "heldout", latency_lines: int = 24, n_ctx: int = 8192, warm_max_tokens: int = 2048,
             workdir: str = "var/eval-models", progress: bool = True) -> dict[str, Any]:
    from dataclasses import replace

    from tqdm import tqdm

    from services.common.models import file_fingerprint, gguf_manifest, resolve_gguf
    from services.common.store import LocalStore
    from services.compiler.kvblock import BlockCompiler
    from services.compiler.signature import signature
    from services.engine.config import EngineConfig
    from services.engine.engine import Engine, Result
    from services.runtime.prompt import Turn, build_messages
    from training.data import is_correct, load_queries, load_registry

    path = resolve_gguf(model)
    manifest = gguf_manifest()
    fingerprint = file_fingerprint(path)
    name = next((k for k, v in manifest.items() if v["file"] == path.name), path.stem)
    registry = load_registry(tools)
    by_name = registry.by_name()
    lines = select_lines([ln for ln in load_queries(queries) if ln.tool in by_name and ln.args], split, limit, seed)
    every = max(1, len(lines) // latency_lines) if latency_lines > 0 else 0
    timed = {ln.id for i, ln in enumerate(sorted(lines, key=lambda x: x.id)) if every and i % every == 0
             and i // every < latency_lines}
    key = {"model": fingerprint, "version": VERSION, "n_ctx": n_ctx}
    ckpt = Path(f"{out_json}.{name}.jsonl")
    saved = load_rows(ckpt, key)
    done = {i: r for i, r in saved.items() if r["kind"] == "line"}
    compiled = {i: r for i, r in saved.items() if r["kind"] == "compile"}
    t0 = time.time()
    store = LocalStore(str(Path(workdir) / fingerprint[:16]))  # kept: its blocks are this model's first start
    store.registry_put(list(registry.tools))
    cfg = replace(EngineConfig(), model_path=str(path), n_ctx=n_ctx, store_url=str(store.root))
    with ckpt.open("a") as out:
        todo = [t for t in registry.tools if f"compile/{t.name}" not in compiled]
        if todo:
            blocks = BlockCompiler(str(path), n_threads=cfg.n_threads)
            for tool in tqdm(todo, desc=f"compile {name}", unit="tool", disable=not progress):
                tc = time.perf_counter()
                data, meta = blocks.compile(signature(tool))
                store.put(blocks.key(tool), data, meta)
                row = {"key": key, "kind": "compile", "id": f"compile/{tool.name}", "seconds": time.perf_counter() - tc,
                       "bytes": len(data)}
                out.write(json.dumps(row) + "\n")
                out.flush()
                compiled[row["id"]] = row
            blocks.close()
        rss0 = rss_mb()
        engine = Engine(cfg, store)
        engine.warmup()
        memory = {"engine_rss_mb": round(rss_mb() - rss0, 1), "n_ctx": n_ctx}
        warm = None
        route = None
        try:
            for ln in tqdm([x for x in lines if x.id not in done], desc=f"eval {name}", unit="line",
                           disable=not progress):
                if route is None:
                    route = default_router(store)
                hist = [Turn(r, c) for r, c in ln.history]
                arms = ["engine"]
                if ln.id in timed:
                    arms = ["engine", "full_schema", "prefix_cached"]
                    k = len(done) % 3  # rotate which arm goes first
                    arms = arms[k:] + arms[:k]
                lat: dict[str, float | None] = {}
                res = None
                arts = engine.artifacts(ln.tool)
                window = engine.window(hist)
                source = "\n".join([t.content for t in window] + [ln.query])
                for arm in arms:
                    if arm == "engine":
                        res = next(e for e in engine.generate(ln.query, ln.tool, hist) if isinstance(e, Result))
                        lat[arm] = res.first_arg_token_ms
                    elif arm == "full_schema":
                        toks = engine.tokenize_messages(build_messages(schema_view(arts.tool), ln.query, window))
                        lat[arm] = run_generation(engine, toks, arts, reuse_prefix=False, source=source,
                                                  request=ln.query).first_arg_token_ms
                    else:
                        if warm is None:
                            warm = Engine(cfg, store)
                        head = SYSTEM_ALL.format(tools="\n".join(
                            schema_view(by_name[n]) for n in registry.servers()[registry.server_of[ln.tool]]))
                        msgs = ([{"role": "system", "content": head}]
                                + [{"role": t.role, "content": t.content} for t in window])
                        wt = warm.tokenize_messages(msgs + [{"role": "user", "content": f"Tool: {ln.tool}\n"
                                                                                         f"{ln.query}"}])
                        lat[arm] = None
                        if len(wt) <= warm_max_tokens and len(wt) + cfg.default_max_tokens <= warm.n_ctx:
                            # the server's schemas warmed by another request first (the cache a practitioner's
                            # server holds), then the measured turn
                            other = warm.tokenize_messages(msgs + [{"role": "user", "content": "Tool: -\n-"}])
                            run_generation(warm, other, arts, reuse_prefix=True, source=source, request=ln.query)
                            lat[arm] = run_generation(warm, wt, arts, reuse_prefix=True, source=source,
                                                      request=ln.query).first_arg_token_ms
                assert res is not None
                routed = route(ln)
                row = {"key": key, "kind": "line", "id": ln.id, "tool": ln.tool, "routed": routed,
                       "route_ok": is_correct(routed, ln.tool), "gold": ln.args, "arguments": res.arguments_json,
                       "args": arg_results(res.arguments_json, ln.args), "valid": res.schema_valid,
                       "json": is_json(res.arguments_json), "first_arg_ms": res.first_arg_token_ms,
                       "path": res.path, "latency": lat if len(arms) > 1 else None}
                out.write(json.dumps(row) + "\n")
                out.flush()
                done[ln.id] = row
        finally:
            engine.close()
            if warm is not None:
                warm.close()
    rows = [done[ln.id] for ln in lines]
    entry = {"model": {"name": name, "path": str(path), "sha256": fingerprint, "bytes": path.stat().st_size},
             "profile": {"family": engine.profile.family, "rules_off": list(engine.profile.off)},
             "memory": memory, **summarize(rows, compiled),
             "per_line": {r["id"]: {"args": r["args"], "route_ok": r["route_ok"], "arguments": r["arguments"]}
                          for r in rows},
             "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "seconds_this_run": round(time.time() - t0, 1)}
    report = json.loads(Path(out_json).read_text()) if Path(out_json).is_file() else {}
    report.update({"what": __doc__.split("\n\n")[0].strip("` "),
                   "protocol": {"queries": queries, "tools": tools, "split": split, "limit": limit, "seed": seed,
                                "latency_lines": latency_lines, "n_ctx": n_ctx},
                   "targets": {"speedup_vs_full_schema": SPEEDUP_TARGET, "first_start_s": FIRST_START_BUDGET_S,
                               "arg_accuracy_gold_tool": 0.90, "arg_accuracy_e2e": 0.85}})
    if report.get("protocol_lines") not in (None, [ln.id for ln in lines]):
        raise ValueError(f"{out_json} holds models measured on other lines: use another --json")
    report["protocol_lines"] = [ln.id for ln in lines]
    models = {**report.get("models", {}), name: entry}
    report["models"] = models
    report["paired"] = paired_models(models)
    report["verdict"] = verdict(models)
    write_report(out_json, report, plot)
    return report


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    names = list(models)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    x = range(len(names))
    w = 0.38
    for off, k, label, color in ((-w / 2, "arg_accuracy_gold_tool", "gold tool", "#264653"),
                                 (w / 2, "arg_accuracy_e2e", "end to end", "#2a9d8f")):
        vals = [100 * models[n][k] for n in names]
        axes[0].bar([i + off for i in x], vals, w, label=label, color=color)
        for i, v in zip(x, vals, strict=True):
            axes[0].text(i + off, v + 1, f"{v:.1f}", ha="center", fontsize=7)
    axes[0].axhline(90, color="#e76f51", ls="--", lw=0.8)
    axes[0].set_ylim(0, 105)
    axes[0].set_ylabel("stated arguments right, %")
    axes[0].legend(fontsize=7, loc="lower right")
    for j, (arm, color) in enumerate((("engine", "#264653"), ("prefix_cached", "#e9c46a"),
                                      ("full_schema", "#e76f51"))):
        vals = [models[n].get(f"first_arg_ms_{arm}") or 0 for n in names]
        axes[1].bar([i + (j - 1) * 0.27 for i in x], vals, 0.27, label=arm.replace("_", " "), color=color)
    axes[1].set_ylabel("first argument, ms (median)")
    axes[1].legend(fontsize=7)
    axes[2].bar([i - w / 2 for i in x], [models[n].get("compile", {}).get("seconds", 0) for n in names], w,
                label="first start: compile s", color="#8d99ae")
    axes[2].bar([i + w / 2 for i in x], [models[n].get("memory", {}).get("engine_rss_mb", 0) for n in names], w,
                label="engine RSS MB", color="#6d597a")
    axes[2].axhline(FIRST_START_BUDGET_S, color="#e76f51", ls="--", lw=0.8)
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, fontsize=7, rotation=10)
    v = report["verdict"]
    fig.suptitle(f"engine models on {len(report['protocol_lines'])} held-out lines: default by measurement = "
                 f"{v['default']}" + ("" if v["meets_targets"] else " (no model meets every target)"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_models_eval_parser(sub) -> None:
    p = sub.add_parser("models", help="one engine model measured into the side-by-side report (default by measurement)")
    p.add_argument("--queries", default="data/queries/train.jsonl")
    p.add_argument("--tools", default="data/mcp_tools")
    p.add_argument("--json", required=True, dest="out")
    p.add_argument("--model", default="", help="GGUF path, a models/gguf.json name, or 'default' (the engine's)")
    p.add_argument("--limit", type=int, default=120, help="lines to sample (stratified by server; 0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=("heldout", "tune", "all"), default="heldout")
    p.add_argument("--latency-lines", type=int, default=24, help="lines that also run the two latency arms")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    def run(args) -> int:
        rep = evaluate(args.queries, args.tools, args.out, model=args.model, limit=args.limit, seed=args.seed,
                       split=args.split, latency_lines=args.latency_lines, progress=not args.quiet)
        print(json.dumps({"verdict": rep["verdict"], "models": {n: {k: m[k] for k in (
            "arg_accuracy_gold_tool", "arg_accuracy_e2e", "schema_valid", "first_arg_ms_engine",
            "speedup_vs_full_schema", "engine_over_prefix_cached", "compile", "memory")}
            for n, m in rep["models"].items()}}, indent=2))
        return 0

    p.set_defaults(fn=run)


__all__ = ["add_models_eval_parser", "evaluate", "summarize", "verdict"]
