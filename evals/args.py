"""`nexus eval args`: argument generation quality and first-argument latency, three arms in one run.

For each query line: route it end to end (the real router domain over the whole registry) and generate
its arguments for the routed tool; generate with the gold tool too (the routed-correct view). Latency arms,
interleaved per query, same model, same queries:

* ``hybrid``        system + compact signature (IR) + window + query, re-prefilled every turn;
* ``full_schema``   the same prompt with the tool's whole JSON schema instead of the IR, re-prefilled;
* ``prefix_cached`` what a practitioner does instead: all schemas of the query's server at the head of the
  prompt, llama.cpp's prefix cache warm (a second context, so the other arms never evict it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evals.stats import bootstrap_median_ci, bootstrap_ratio_ci, median, percentile, wilson
from services.common.errors import InvalidArgument
from services.common.store import LocalStore
from services.compiler.grammar import compile_grammar
from services.compiler.signature import signature
from services.engine.config import EngineConfig
from services.engine.engine import Engine, Result
from services.runtime.prompt import Turn, build_messages
from training.data import QueryLine, is_correct, load_queries, load_registry, tune_split

log = logging.getLogger("nexus.eval.args")

PLACEHOLDER_RE = re.compile(r"^(<[^>]*>|\{\{.*\}\}|string|example|placeholder|todo|xxx+|your[_ -].*|\.\.\.)$", re.I)

SYSTEM_ALL = (
    "You fill in the arguments of a tool call. You have these tools:\n{tools}\n"
    "Reply with one JSON object of arguments for the tool the user names. Copy values exactly as the user wrote them."
)


def schema_view(tool) -> str:
    """The tool as a full-schema prompt shows it: name, description, JSON Schema."""
    return f"{tool.name}: {tool.description}\nJSON Schema: {json.dumps(tool.input_schema, separators=(',', ':'))}"


def view_token_stats(tools, tokenize) -> dict[str, Any]:
    """Tokens of the tool's part of the prompt (the compact signature vs the full schema view) over a registry:
    the share of the main context the tool itself takes, without the constant system prompt both arms share."""
    sig = [len(tokenize(signature(t))) for t in tools]
    full = [len(tokenize(schema_view(t))) for t in tools]
    per_tool = [1 - a / b for a, b in zip(sig, full, strict=True) if b]
    return {"tool_view_tokens_signature_median": median(sig), "tool_view_tokens_full_schema_median": median(full),
            "tool_view_token_saving_median": median(per_tool),
            "tool_view_token_saving_total": 1 - sum(sig) / sum(full)}


def values_match(got: Any, want: Any) -> bool:
    """Strings compare after trimming; numbers and booleans by value; containers structurally."""
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(got, bool) and isinstance(want, bool) and got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return float(got) == float(want)
    if isinstance(want, str) and isinstance(got, str):
        return got.strip() == want.strip()
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(values_match(a, b) for a, b in zip(got, want, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return set(got) == set(want) and all(values_match(got[k], want[k]) for k in want)
    return got == want


def arg_hits(arguments_json: str, gold: dict[str, Any]) -> tuple[int, int]:
    """(correct, total) over the arguments the query states."""
    try:
        got = json.loads(arguments_json)
    except ValueError:
        return 0, len(gold)
    if not isinstance(got, dict):
        return 0, len(gold)
    return sum(1 for k, v in gold.items() if k in got and values_match(got[k], v)), len(gold)


def placeholder_count(arguments_json: str) -> int:
    try:
        got = json.loads(arguments_json)
    except ValueError:
        return 0
    stack, n = [got], 0
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, str) and PLACEHOLDER_RE.match(v.strip()):
            n += 1
    return n


def run_generation(engine: Engine, tokens: list[int], arts, reuse_prefix: bool, source: str = "",
                   request: str = "") -> Result:
    res = None
    for ev in engine.generate_tokens(tokens, arts, engine.config.default_max_tokens, reuse_prefix=reuse_prefix,
                                     source=source, request=request):
        if isinstance(ev, Result):
            res = ev
    assert res is not None
    return res


@dataclass
class Row:
    id: str
    tool: str
    routed: str
    route_ok: bool
    gold_args: dict
    hybrid: Result
    full_schema: Result
    prefix_cached: Result | None
    routed_result: Result
    prefix_cached_prompt_tokens: int = 0
    engine: Result | None = None  # the production turn: warm prelude + spliced KV block (path A)


def sample_lines(lines: Sequence[QueryLine], limit: int, seed: int) -> list[QueryLine]:
    """A seeded sample, stratified by server so every server is represented."""
    if limit <= 0 or limit >= len(lines):
        return list(lines)
    rng = random.Random(seed)
    by_server: dict[str, list[QueryLine]] = {}
    for ln in lines:
        by_server.setdefault(ln.server or "?", []).append(ln)
    for v in by_server.values():
        rng.shuffle(v)
    out: list[QueryLine] = []
    while len(out) < limit:
        for k in sorted(by_server):
            if by_server[k] and len(out) < limit:
                out.append(by_server[k].pop())
    return out


def select_lines(lines: Sequence[QueryLine], split: str, limit: int, seed: int,
                 exclude: Sequence[str] = ()) -> list[QueryLine]:
    """The lines an evaluation scores: the split's (``tune``, ``heldout`` or ``all``), without the ``exclude``
    ids, then a seeded server-stratified sample of ``limit`` (``sample_lines``)."""
    if split != "all":
        tune, heldout = tune_split(lines)
        lines = tune if split == "tune" else heldout
    if exclude:
        drop = set(exclude)
        lines = [ln for ln in lines if ln.id not in drop]
        if not lines:
            raise InvalidArgument("every line of the split is excluded")
    return sample_lines(lines, limit, seed)


def evaluate(queries: str, tools: str, out_json: str, *, limit: int = 120, seed: int = 0, model_path: str = "",
             n_ctx: int = 8192, workdir: str = "var/eval-args", progress: bool = True,
             router_factory=None, split: str = "heldout",
             warm_max_tokens: int = 2048, max_tokens: int = 0, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """Run the evaluation and write ``out_json`` (+ a PNG beside it). ``router_factory(store) -> route_fn``
    overrides how queries are routed (tests); default: the real router domain over the whole registry.
    ``exclude``: line ids left out before sampling (the lines of an earlier report, for a fresh sample)."""
    from tqdm import tqdm

    registry = load_registry(tools)
    by_name = registry.by_name()
    lines = [ln for ln in load_queries(queries) if ln.tool in by_name]
    if not lines:
        raise InvalidArgument("no query line names a tool of the registry")
    lines = select_lines(lines, split, limit, seed, exclude)
    # a fresh store per run: artifacts left by an earlier version of the code must not leak into this one
    import shutil
    import tempfile

    Path(workdir).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(Path(workdir) / "store", ignore_errors=True)
    store = LocalStore(tempfile.mkdtemp(prefix="store-", dir=workdir))
    store.registry_put(list(registry.tools))
    cfg = replace(EngineConfig(), model_path=model_path, n_ctx=n_ctx, store_url=str(store.root))
    if max_tokens > 0:  # budget before the closing bias winds the JSON down (engine default: 256)
        cfg = replace(cfg, default_max_tokens=max_tokens)
    engine = Engine(cfg, store)
    warm = Engine(cfg, store)  # the prefix-cached arm's own context
    route_fn = (router_factory or default_router)(store)

    ir_tokens = [len(engine.llm.tokenize(signature(t).encode(), add_bos=False)) for t in registry.tools]
    # the production arm needs the sampled tools' KV blocks, as the compiler would have made them
    from services.compiler.kvblock import BlockCompiler

    blocks = BlockCompiler(model_path, n_threads=cfg.n_threads)
    for name in sorted({ln.tool for ln in lines}):
        tool = by_name[name]
        if not store.exists(blocks.key(tool)):
            data, meta = blocks.compile(signature(tool))
            store.put(blocks.key(tool), data, meta)
    blocks.close()
    engine.warmup()
    rows: list[Row] = []
    # group by server so the prefix-cached arm's head (the server's schemas) stays warm across its queries
    lines.sort(key=lambda ln: (ln.server, ln.id))
    for ln in tqdm(lines, desc="eval args", unit="query", disable=not progress):
        hist = [Turn(r, c) for r, c in ln.history]
        arts = engine.artifacts(ln.tool)
        window = engine.window(hist)
        source = "\n".join([t.content for t in window] + [ln.query])  # what the copy bias copies from
        # the engine's own prompt (constant system + examples prefix, then window + view + request); the
        # full-schema arm differs only in showing the whole JSON schema where the hybrid shows the IR
        msgs = build_messages(arts.signature, ln.query, window)
        msgs_full = build_messages(schema_view(arts.tool), ln.query, window)
        # interleave the re-prefill arms and the production turn, rotating which goes first
        arms = ("hybrid", "full", "engine")
        k = len(rows) % len(arms)
        got: dict[str, Result] = {}
        for arm in arms[k:] + arms[:k]:
            if arm == "engine":
                got[arm] = next(e for e in engine.generate(ln.query, ln.tool, hist) if isinstance(e, Result))
                continue
            toks = engine.tokenize_messages(msgs if arm == "hybrid" else msgs_full)
            got[arm] = run_generation(engine, toks, arts, reuse_prefix=False, source=source, request=ln.query)
        # prefix-cached arm: the server's schemas at the head, the tool named in the user turn
        server_tools = [by_name[n] for n in registry.servers()[registry.server_of[ln.tool]]]
        head = SYSTEM_ALL.format(tools="\n".join(schema_view(t) for t in server_tools))
        msgs_warm = [{"role": "system", "content": head}]
        msgs_warm += [{"role": t.role, "content": t.content} for t in window]
        msgs_warm.append({"role": "user", "content": f"Tool: {ln.tool}\n{ln.query}"})
        warm_toks = warm.tokenize_messages(msgs_warm)
        warm_res = None
        # the cold prefill of a large head costs minutes on a shared 2-core host: heads above
        # ``warm_max_tokens`` are not run (their context use is still reported by registry size)
        if len(warm_toks) <= warm_max_tokens and len(warm_toks) + cfg.default_max_tokens <= warm.n_ctx:
            warm_res = run_generation(warm, warm_toks, arts, reuse_prefix=True, source=source, request=ln.query)
        routed = route_fn(ln)
        if routed == ln.tool:
            routed_res = got["hybrid"]
        else:
            r_arts = engine.artifacts(routed)
            r_msgs = build_messages(r_arts.signature, ln.query, window)
            routed_res = run_generation(engine, engine.tokenize_messages(r_msgs), r_arts, reuse_prefix=False,
                                        source=source, request=ln.query)
        rows.append(Row(ln.id, ln.tool, routed, is_correct(routed, ln.tool), ln.args, got["hybrid"], got["full"],
                        warm_res, routed_res, len(warm_toks), got["engine"]))
    report = summarize(rows, ir_tokens, registry, engine)
    report["protocol"] = {"queries": str(queries), "tools": str(tools), "limit": limit, "seed": seed, "excluded_lines": len(exclude),
                          "split": split, "max_tokens": cfg.default_max_tokens, "prefix_cached_arm_run_only_for_heads_up_to_tokens": warm_max_tokens,
                          "split_rule": "tune = lines whose id number is divisible by 4 (all prompt/IR/decoding "
                                        "tuning used only these, seed 1); heldout = all other lines",
                          "model": str(engine.model_path), "n_ctx": n_ctx,
                          "profile": {"family": engine.profile.family, "rules_off": list(engine.profile.off),
                                      "evidence": engine.profile.evidence},
                          "slot_reader": None if engine._slots is None else {
                              "path": cfg.slot_model, "hint_bias": cfg.slot_hint_bias,
                              **{k: engine._slots.meta.get(k) for k in ("data_hash", "threshold", "n_train_lines",
                                                                        "val_stated_exact", "val_hint_precision")},
                              "trained_on": "data/routing_augment only; threshold on the tune split"},
                          "note": "prefix_cached rows are grouped by server; the first query of each server "
                                  "pays the cold prefill and is excluded from its latency median"}
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(report, indent=2))
    plot(report, str(Path(out_json).with_suffix(".png")))
    engine.close()
    warm.close()
    shutil.rmtree(store.root, ignore_errors=True)
    return report


def default_router(store):
    from services.common.embedder import Embedder
    from services.router.config import RouterConfig
    from services.router.router import HistoryTurn, Router

    router = Router(RouterConfig(store_url=str(store.root)), store, Embedder())
    asyncio.run(router.sync(force=True))

    def route(ln: QueryLine) -> str:
        return router.route(ln.query, [HistoryTurn(r, c) for r, c in ln.history]).tool

    return route


def summarize(rows: list[Row], ir_tokens: list[int], registry, engine: Engine) -> dict[str, Any]:
    n = len(rows)
    gens = [r.hybrid for r in rows] + [r.routed_result for r in rows if not r.route_ok]
    json_ok = sum(1 for g in gens if is_json(g.arguments_json))
    schema_ok = sum(1 for g in gens if g.schema_valid)
    routed_hits = [arg_hits(r.hybrid.arguments_json, r.gold_args) for r in rows]
    e2e_hits = [arg_hits(r.routed_result.arguments_json, r.gold_args) if r.route_ok else (0, len(r.gold_args))
                for r in rows]
    rc, rt = sum(h for h, _ in routed_hits), sum(t for _, t in routed_hits)
    ec, et = sum(h for h, _ in e2e_hits), sum(t for _, t in e2e_hits)
    route_ok = sum(r.route_ok for r in rows)
    fa_h = [r.hybrid.first_arg_token_ms for r in rows]
    fa_f = [r.full_schema.first_arg_token_ms for r in rows]
    eng = [r.engine for r in rows if r.engine is not None]
    fa_e = [g.first_arg_token_ms for g in eng]
    eng_hits = [arg_hits(r.engine.arguments_json, r.gold_args) for r in rows if r.engine is not None]
    seen_servers: set[str] = set()
    fa_w, warm_tokens = [], []
    for r in rows:
        server = registry.server_of[r.tool]
        if r.prefix_cached is not None:
            warm_tokens.append(r.prefix_cached_prompt_tokens)
            if server in seen_servers:
                fa_w.append(r.prefix_cached.first_arg_token_ms)
        seen_servers.add(server)
    tok_h = [r.hybrid.prompt_tokens for r in rows]
    tok_f = [r.full_schema.prompt_tokens for r in rows]
    saving = [1 - h / f for h, f in zip(tok_h, tok_f, strict=True) if f]
    # context use of all schemas at the head, by registry size (in registry order)
    sizes = {}
    all_tools = list(registry.tools)
    for size in (10, 50, 100, 250, len(all_tools)):
        head = SYSTEM_ALL.format(tools="\n".join(schema_view(t) for t in all_tools[:size]))
        toks = len(engine.llm.tokenize(head.encode(), add_bos=False))
        sizes[str(size)] = {"head_tokens": toks, "fits": toks + 512 <= engine.n_ctx_train}
    fits = [int(k) for k, v in sizes.items() if v["fits"]]
    return {
        "n": n,
        "routing_accuracy": route_ok / n,
        "routing_ci95": wilson(route_ok, n),
        "json_valid_rate": json_ok / len(gens),
        "schema_valid_rate": schema_ok / len(gens),
        "arg_accuracy_routed": rc / rt if rt else None,
        "arg_accuracy_routed_ci95": wilson(rc, rt),
        "arg_accuracy_e2e": ec / et if et else None,
        "arg_accuracy_e2e_ci95": wilson(ec, et),
        "args_stated": rt,
        "placeholder_leaks": sum(placeholder_count(g.arguments_json) for g in gens),
        # a property of the compiler over the registry (1 s), not of the engine's cache
        "grammar_fallbacks": sum(1 for t in registry.tools if compile_grammar(t).fallback),
        "ir_tokens_median": median(ir_tokens),
        "ir_tokens_p99": percentile(ir_tokens, 99),
        "first_arg_ms_hybrid": median(fa_h),
        "first_arg_ms_hybrid_ci95": bootstrap_median_ci(fa_h),
        "first_arg_ms_full_schema": median(fa_f),
        "first_arg_ms_full_schema_ci95": bootstrap_median_ci(fa_f),
        "first_arg_speedup": median(fa_f) / median(fa_h),
        "first_arg_speedup_ci95": bootstrap_ratio_ci(fa_f, fa_h),
        "first_arg_ms_engine": median(fa_e) if fa_e else None,
        "first_arg_ms_engine_ci95": bootstrap_median_ci(fa_e) if fa_e else None,
        "first_arg_speedup_engine": median(fa_f) / median(fa_e) if fa_e else None,
        "first_arg_speedup_engine_ci95": bootstrap_ratio_ci(fa_f, fa_e) if fa_e else None,
        "engine_paths": {p: sum(1 for g in eng if g.path == p) for p in sorted({g.path for g in eng})},
        "engine_arg_accuracy_routed": (sum(h for h, _ in eng_hits) / sum(t for _, t in eng_hits)
                                       if eng_hits and sum(t for _, t in eng_hits) else None),
        "engine_schema_valid_rate": sum(g.schema_valid for g in eng) / len(eng) if eng else None,
        "prompt_tokens_hybrid_median": median(tok_h),
        "prompt_tokens_full_schema_median": median(tok_f),
        "main_context_token_saving": sum(saving) / len(saving),
        "first_arg_ms_prefix_cached": median(fa_w) if fa_w else None,
        "first_arg_ms_prefix_cached_ci95": bootstrap_median_ci(fa_w) if fa_w else None,
        "prompt_tokens_prefix_cached_median": median(warm_tokens) if warm_tokens else None,
        "prefix_cached_context_by_registry_size": sizes,
        **view_token_stats(registry.tools, lambda text: engine.llm.tokenize(text.encode(), add_bos=False)),
        "prefix_cached_max_registry_size_that_fits": max(fits) if fits else 0,
        "context_window": engine.n_ctx_train,
        "lines": [line_record(r) for r in rows],
    }


def line_record(r: Row) -> dict[str, Any]:
    """One evaluated line as the report lists it: what each arm wrote and how many stated arguments it hit, so
    a miss can be read without re-running the evaluation."""
    def arm(res: Result | None) -> dict[str, Any] | None:
        if res is None:
            return None
        hits, _ = arg_hits(res.arguments_json, r.gold_args)
        return {"arguments": res.arguments_json, "hits": hits, "schema_valid": res.schema_valid}

    return {"id": r.id, "tool": r.tool, "routed": r.routed, "route_ok": r.route_ok, "gold": r.gold_args,
            "stated": len(r.gold_args), "hybrid": arm(r.hybrid), "engine": arm(r.engine),
            "e2e": arm(r.routed_result) if r.route_ok is False else None}


def is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    arms = [("hybrid (IR)", "first_arg_ms_hybrid"), ("engine (splice)", "first_arg_ms_engine"),
            ("full schema", "first_arg_ms_full_schema"),
            ("prefix cached", "first_arg_ms_prefix_cached")]
    vals = [report.get(k) or 0 for _, k in arms]
    errs = []
    for (_, k), v in zip(arms, vals, strict=True):
        ci = report.get(k + "_ci95") or (v, v)
        errs.append([max(0, v - ci[0]), max(0, ci[1] - v)])
    b0 = axes[0].bar([a for a, _ in arms], vals, yerr=list(zip(*errs, strict=True)),
                     color=["#2a9d8f", "#264653", "#e76f51", "#8d99ae"], capsize=4)
    axes[0].bar_label(b0, labels=[f"{v:.0f}" if v else "not run" for v in vals], padding=2)
    axes[0].set_ylabel("first argument token, ms (median, 95% CI)")
    engine_x = report.get("first_arg_speedup_engine")
    axes[0].set_title("vs full schema: " + (f"engine (splice) {engine_x:.2f}x, " if engine_x else "")
                      + f"hybrid (IR) {report['first_arg_speedup']:.2f}x", fontsize=10)
    toks = [report["prompt_tokens_hybrid_median"], report["prompt_tokens_hybrid_median"],
            report["prompt_tokens_full_schema_median"], report.get("prompt_tokens_prefix_cached_median") or 0]
    b1 = axes[1].bar([a for a, _ in arms], toks, color=["#2a9d8f", "#264653", "#e76f51", "#8d99ae"])
    axes[1].bar_label(b1, labels=[f"{v:.0f}" for v in toks], padding=2)
    axes[1].set_xlabel(f"all {max(int(k) for k in report['prefix_cached_context_by_registry_size'])} schemas at the "
                       f"head: {report['prefix_cached_context_by_registry_size'][str(max(int(k) for k in report['prefix_cached_context_by_registry_size']))]['head_tokens']} tokens; "
                       f"fits {report['context_window']} up to {report['prefix_cached_max_registry_size_that_fits']} tools",
                       fontsize=8)
    axes[1].set_ylabel("prompt tokens (median)")
    title = f"prompt-token saving {100 * report['main_context_token_saving']:.0f}%"
    if report.get("tool_view_token_saving_total") is not None:
        title += f" (tool view: {100 * report['tool_view_token_saving_total']:.0f}%)"
    axes[1].set_title(title)
    names = ["JSON valid", "schema valid", "args (routed)", "args (e2e)", "routing"]
    keys = ["json_valid_rate", "schema_valid_rate", "arg_accuracy_routed", "arg_accuracy_e2e", "routing_accuracy"]
    b2 = axes[2].bar(names, [100 * (report.get(k) or 0) for k in keys], color="#264653")
    axes[2].bar_label(b2, fmt="%.0f", padding=2)
    axes[2].set_ylim(0, 105)
    axes[2].set_ylabel("%")
    axes[2].set_title(f"n = {report['n']} held-out queries, {report['args_stated']} stated args"
                      if report.get("protocol", {}).get("split") == "heldout" else f"n = {report['n']} queries")
    axes[2].tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_args_eval_parser(sub) -> None:
    p = sub.add_parser("args", help="argument generation quality and first-argument latency")
    p.add_argument("--queries", required=True)
    p.add_argument("--tools", required=True)
    p.add_argument("--json", required=True, dest="out")
    p.add_argument("--limit", type=int, default=120, help="queries to sample (stratified by server; 0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="", help="GGUF path (default SmolLM2-135M-Instruct)")
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--warm-max-tokens", type=int, default=2048,
                   help="run the prefix-cached arm only where the server's schema head is at most this long")
    p.add_argument("--max-tokens", type=int, default=0, help="generation budget per call (0 = engine default)")
    p.add_argument("--split", choices=("heldout", "tune", "all"), default="heldout",
                   help="heldout (default): lines never used for tuning; tune: the tuning lines")
    p.add_argument("--exclude-from", default="", metavar="REPORT.json",
                   help="leave out the lines an earlier report of this evaluation scored (a fresh sample)")

    def run(args) -> int:
        t0 = time.time()
        exclude: list[str] = []
        if args.exclude_from:
            try:
                exclude = [ln["id"] for ln in json.loads(Path(args.exclude_from).read_text())["lines"]]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"--exclude-from {args.exclude_from}: not a report of `nexus eval args` "
                                 f"({e})") from None
        rep = evaluate(args.queries, args.tools, args.out, limit=args.limit, seed=args.seed, model_path=args.model,
                       n_ctx=args.n_ctx, split=args.split, warm_max_tokens=args.warm_max_tokens,
                       max_tokens=args.max_tokens, exclude=exclude)
        keys = ("n", "routing_accuracy", "json_valid_rate", "schema_valid_rate", "arg_accuracy_routed",
                "arg_accuracy_e2e", "first_arg_speedup", "main_context_token_saving", "ir_tokens_median")
        print(json.dumps({k: rep[k] for k in keys} | {"seconds": round(time.time() - t0)}, indent=2))
        return 0

    p.set_defaults(fn=run)
