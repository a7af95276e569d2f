"""`nexus eval formats`: does the model's own tool-call format beat the engine's prompt? (issue 51, item 5)

    nexus eval formats --model <Qwen GGUF> [--limit 120] [--split heldout] --json reports/formats_<model>.json

Qwen2.5's chat template has a native tool-call format: the tools are listed in a ``# Tools`` section of the system
turn, inside ``<tools></tools>``, and the assistant answers ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>``. The engine's prompt (services/runtime/prompt.py) instead writes ``Function: <compact signature>``
and ``Request: ...`` in the user turn after a worked example, and the assistant's answer is the arguments object
alone. Arms, on the same held-out lines, with the gold tool, each a full text prefill of its own prompt and the
same grammar-constrained greedy decode from the arguments' first ``{``:

- ``engine prompt``: today's prompt with the compact signature (the args evaluation's "hybrid" arm);
- ``native + signature``: Qwen's format, the compact signature as the ``<tools>`` entry;
- ``native + schema``: Qwen's format exactly as its template writes a tool (the OpenAI function object, JSON);

both native arms keep the engine's system instruction and start the answer with the call's head
(``<tool_call>\\n{"name": "<tool>", "arguments": ``), so the model writes only the arguments, as in the engine.
Each stated argument is a paired trial against ``engine prompt`` (gained / lost, sign test). Lines are
checkpointed to ``<json>.lines.jsonl`` and resume. Written: the JSON report and a PNG.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from evals.args import run_generation, select_lines
from evals.checkpoint import load_rows, write_report
from evals.rules import arg_results
from evals.stats import paired, wilson
from services.runtime.prompt import SYSTEM, Turn, build_messages

BASE = "engine prompt"
FORMATS = (BASE, "native + signature", "native + schema")

# Qwen2.5's tools section, word for word as its chat template writes it around the tool entries
TOOLS_HEAD = ("\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\n</tool_call>")


def openai_function(tool) -> dict[str, Any]:
    """The tool as an OpenAI ``tools`` entry (what Qwen's template writes as JSON)."""
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.input_schema}}


def native_system(entries: list[str], system: str = SYSTEM) -> str:
    """The system turn of Qwen's tool-call format with ``entries`` (one line each) inside ``<tools>``."""
    return system + TOOLS_HEAD + "".join("\n" + e for e in entries) + TOOLS_TAIL


def call_head(name: str) -> str:
    """The assistant's answer up to the arguments object, in Qwen's format."""
    return '<tool_call>\n{"name": "' + name + '", "arguments": '


def native_messages(entries: list[str], query: str, window: list[Turn]) -> list[dict[str, str]]:
    return ([{"role": "system", "content": native_system(entries)}]
            + [{"role": t.role, "content": t.content} for t in window] + [{"role": "user", "content": query}])


def format_prompt(template, fmt: str, tool, signature: str, query: str, window: list[Turn]) -> str:
    """The rendered prompt of arm ``fmt`` (module docstring), up to where the arguments object starts."""
    if fmt == BASE:
        return template.render(build_messages(signature, query, window))
    entry = signature if fmt == "native + signature" else json.dumps(openai_function(tool), ensure_ascii=False)
    return template.render(native_messages([entry], query, window)) + call_head(tool.name)


def supports_native(template) -> bool:
    """Whether the chat template writes tools in Qwen's format (the native arms are Qwen's)."""
    return "<tool_call>" in template.source and "<tools>" in template.source


def summarize(lines: list[dict[str, Any]]) -> dict[str, Any]:
    def flat(arm: str) -> list[bool]:
        return [x for ln in lines for x in ln["arms"][arm]["args"]]

    base = flat(BASE)
    out: dict[str, Any] = {"args": len(base), "lines": len(lines), "formats": {}}
    for fmt in FORMATS:
        got = flat(fmt)
        row = {"arg_accuracy": sum(got) / max(1, len(got)), "wilson95": list(wilson(sum(got), len(got))),
               "schema_valid": sum(ln["arms"][fmt]["valid"] for ln in lines) / max(1, len(lines)),
               "prompt_tokens_median": sorted(ln["arms"][fmt]["prompt_tokens"] for ln in lines)[len(lines) // 2]
               if lines else 0}
        if fmt != BASE:
            row["vs_engine_prompt"] = paired(got, base)
        out["formats"][fmt] = row
    return out


def evaluate(queries: str, tools: str, out_json: str, *, model_path: str = "", limit: int = 120, seed: int = 0,
             split: str = "heldout", n_ctx: int = 8192, workdir: str = "var/eval-formats",
             progress: bool = True) -> dict[str, Any]:
    import shutil
    import tempfile
    from dataclasses import replace

    from tqdm import tqdm

    from services.common.models import file_fingerprint, resolve_gguf
    from services.common.store import LocalStore
    from services.engine.config import EngineConfig
    from services.engine.engine import Engine
    from training.data import load_queries, load_registry

    registry = load_registry(tools)
    by_name = registry.by_name()
    lines = select_lines([ln for ln in load_queries(queries) if ln.tool in by_name and ln.args], split, limit, seed)
    model = resolve_gguf(model_path)
    key = {"model": file_fingerprint(model), "formats": list(FORMATS), "system": SYSTEM}
    ckpt = Path(str(out_json) + ".lines.jsonl")
    done = load_rows(ckpt, key)
    todo = [ln for ln in lines if ln.id not in done]
    t0 = time.time()
    if todo:
        Path(workdir).mkdir(parents=True, exist_ok=True)
        store = LocalStore(tempfile.mkdtemp(prefix="store-", dir=workdir))
        store.registry_put(list(registry.tools))
        engine = Engine(replace(EngineConfig(), model_path=str(model), n_ctx=n_ctx, store_url=str(store.root)),
                        store)
        try:
            if not supports_native(engine.template):
                raise ValueError(f"{model.name}'s chat template has no tool-call format (<tools>, <tool_call>)")
            with ckpt.open("a") as out:
                for i, ln in enumerate(tqdm(todo, desc="eval formats", unit="line", disable=not progress)):
                    arts = engine.artifacts(ln.tool)
                    window = engine.window([Turn(r, c) for r, c in ln.history])
                    source = "\n".join([t.content for t in window] + [ln.query])
                    row: dict[str, Any] = {"key": key, "id": ln.id, "tool": ln.tool, "gold": ln.args, "arms": {}}
                    k = (len(done) + i) % len(FORMATS)  # rotate which arm goes first
                    for fmt in FORMATS[k:] + FORMATS[:k]:
                        text = format_prompt(engine.template, fmt, arts.tool, arts.signature, ln.query, window)
                        toks = engine.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
                        res = run_generation(engine, toks, arts, reuse_prefix=False, source=source,
                                             request=ln.query)
                        row["arms"][fmt] = {"arguments": res.arguments_json, "valid": res.schema_valid,
                                            "args": arg_results(res.arguments_json, ln.args),
                                            "prompt_tokens": len(toks)}
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    done[ln.id] = row
        finally:
            engine.close()
            shutil.rmtree(store.root, ignore_errors=True)
    rows = [done[ln.id] for ln in lines]
    report = {"what": "argument prompt formats, gold tool, full prefill each, per stated argument paired with the "
                      "engine's prompt",
              "model": {"path": str(model), "sha256": key["model"], "name": model.name},
              "protocol": {"queries": queries, "split": split, "limit": limit, "seed": seed, "lines": len(rows)},
              **summarize(rows), "seconds_this_run": round(time.time() - t0, 1),
              "per_line": [{k: v for k, v in r.items() if k != "key"} for r in rows]}
    write_report(out_json, report, plot)
    return report


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fm = report["formats"]
    names = list(fm)
    acc = [100 * fm[n]["arg_accuracy"] for n in names]
    lo = [a - 100 * fm[n]["wilson95"][0] for a, n in zip(acc, names, strict=True)]
    hi = [100 * fm[n]["wilson95"][1] - a for a, n in zip(acc, names, strict=True)]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars = ax.bar(names, acc, yerr=[lo, hi], capsize=4, color=["#264653", "#2a9d8f", "#e9c46a"])
    for b, n in zip(bars, names, strict=True):
        pv = fm[n].get("vs_engine_prompt")
        note = f"{fm[n]['arg_accuracy'] * 100:.1f} %"
        if pv:
            note += f"\n+{pv['gained']} / -{pv['lost']}, p {pv['sign_test_p']:.2g}"
        ax.text(b.get_x() + b.get_width() / 2, 3, note, ha="center", va="bottom", fontsize=8, color="white")
    ax.set_ylim(0, 100)
    ax.set_ylabel("stated arguments right, % (95 % CI)")
    ax.set_title(f"{report['model']['name']}: argument prompt formats ({report['args']} arguments, "
                 f"{report['lines']} held-out lines, gold tool)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_formats_eval_parser(sub) -> None:
    p = sub.add_parser("formats", help="the model's native tool-call format vs the engine's prompt (held out)")
    p.add_argument("--queries", default="data/queries/train.jsonl")
    p.add_argument("--tools", default="data/mcp_tools")
    p.add_argument("--json", required=True, dest="out")
    p.add_argument("--model", default="", help="GGUF path or models/gguf.json name of a model whose template has a tool-call format")
    p.add_argument("--limit", type=int, default=120, help="lines to sample (stratified by server; 0 = all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", choices=("heldout", "tune", "all"), default="heldout")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    def run(args) -> int:
        rep = evaluate(args.queries, args.tools, args.out, model_path=args.model, limit=args.limit, seed=args.seed,
                       split=args.split, progress=not args.quiet)
        print(json.dumps(rep["formats"], indent=2))
        return 0

    p.set_defaults(fn=run)


__all__ = ["FORMATS", "add_formats_eval_parser", "call_head", "evaluate", "format_prompt", "native_system",
           "openai_function", "summarize", "supports_native"]
