"""Routing evaluation: ``nexus eval routing --queries FILE --tools DIR --sizes 10,50,100,250,all --json OUT``.

Protocol (also written into the report as ``protocol``):

* Held-out scoring. The query lines are split into k folds (default 3) per tool: each tool's lines (slots)
  are mapped to folds by a seeded permutation, so a fold holds at most one line of a tool and mixes the
  three wording styles. For fold f a gate model (query encoder, cross-encoder, tau, alpha, and the
  exemplar keys with their weight) is trained on the other folds' lines only; fold f's lines are routed by it. Every
  line is thus scored exactly once, by a model that never saw it (nor used it for calibration/validation).
* Registries. For size N a line's registry is its target plus N-1 distractors: the target's own server
  first (drawn at random if it alone exceeds N-1), then other servers' tools, drawn with ``--seed``;
  ``all`` is the whole directory. The router scans its full index restricted to that registry. Each size is
  seeded by the seed and the size itself. With ``--draws K`` every line is routed over K independent draws of its
  distractors per size: rates are over all (line, draw) pairs, the 95 % intervals are bootstraps over lines of
  each line's mean over its draws, and ``accuracy_by_draw`` shows what the draw alone moves (1.4 points at N = 10
  between two draws in docs/experiments/routing_experiments.md §17). The untrained baseline and concat-all use the first draw.
* Second stage: none beyond the gate model's own (its cross-encoder, fused only when calibration gives it a
  weight alpha > 0), as the router's default.
* Correctness counts the equivalence groups of queries/README.md as correct.
* Latency ``route_ms`` is measured per routed request inside the router (query embedding + INT8 scan +
  gate + cross-encoder when escalated), in-process; gRPC latency is bench/routing_grpc.py.
* Generalization: a model trained with one server's lines removed routes that server's lines.
* concat-all: the engine model (SmolLM2-135M GGUF) reads every schema of the registry in its prompt and
  names a tool under a grammar that only allows the registry's names, for a bounded sample of lines, at
  the sizes whose prompts fit its training context.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from evals.stats import bootstrap_mean_ci, percentile, wilson
from training.data import (
    QueryLine,
    Registry,
    assign_folds,
    equivalents,
    is_correct,
    load_queries,
    load_registry,
    parse_sizes,
    query_registry,
)
from training.gate import GateHyperParams, default_gate_dir, train_gate

log = logging.getLogger("nexus.evals.routing")


def train_cached(lines: Sequence[QueryLine], registry: Registry, hp: GateHyperParams, models_root: str,
                 progress: bool = True, label: str = "", extra: Sequence[QueryLine] = (),
                 calibration: Sequence[QueryLine] = ()) -> Path:
    """The gate model of ``lines`` + ``extra`` under ``models_root`` (trained once per data hash), calibrated on
    its validation lines + ``calibration`` (a cached model is recalibrated in place when that set changed)."""
    out = default_gate_dir(lines, registry.tools, hp, root=models_root, equivalents=equivalents, extra=extra)
    if label:
        log.info("gate model for %s: %s", label, out)
    train_gate(lines, registry.tools, out, hp, equivalents=equivalents, progress=progress, extra=extra,
               calibration=calibration)
    return out


def fold_models(lines: Sequence[QueryLine], folds: Sequence[int], k: int, registry: Registry,
                hp: GateHyperParams, models_root: str, progress: bool = True,
                extra: Sequence[QueryLine] = (), calibration: Sequence[QueryLine] = ()) -> list[Path]:
    out = []
    for f in range(k):
        train = [ln for ln, g in zip(lines, folds, strict=True) if g != f]
        out.append(train_cached(train, registry, hp, models_root, progress, label=f"fold {f}", extra=extra,
                                calibration=calibration))
    return out


def holdout_model(lines: Sequence[QueryLine], server: str, registry: Registry, hp: GateHyperParams,
                  models_root: str, progress: bool = True, extra: Sequence[QueryLine] = (),
                  calibration: Sequence[QueryLine] = ()) -> Path:
    """Trained and calibrated without any line of ``server`` (its augment and calibration lines included): tools
    the router never saw."""
    train = [ln for ln in lines if registry.server_of.get(ln.tool) != server]
    extra = [ln for ln in extra if registry.server_of.get(ln.tool) != server]
    calibration = [ln for ln in calibration if registry.server_of.get(ln.tool) != server]
    return train_cached(train, registry, replace(hp), models_root, progress, label=f"held-out server {server}",
                        extra=extra, calibration=calibration)


def _size_n(size: str, registry: Registry) -> int:
    return len(registry.tools) if size == "all" else min(int(size), len(registry.tools))


def registries_for(lines: Sequence[QueryLine], sizes: Sequence[str], registry: Registry,
                   seed: int, draw: int = 0) -> dict[str, list[list[str]]]:
    """Per size, each line's registry (in line order). Each size has its own generator, seeded by the seed, the
    size itself (not its place in ``sizes``) and the draw (``draw`` > 0: another independent draw of distractors),
    so a size draws the same registries whatever else is evaluated."""
    out = {}
    for size in sizes:
        rng = random.Random(f"registries:{seed}:{size}" + (f":{draw}" if draw else ""))
        out[size] = [query_registry(ln.tool, size, registry, rng) for ln in lines]
    return out


@dataclass(frozen=True)
class Protocol:
    """The evaluation's data for one seed: the registry, its query lines, each line's fold, each size's registries
    (``regs``: the first draw; ``draw_regs``: every draw of distractors, the first included)."""

    registry: Registry
    lines: list[QueryLine]
    sizes: list[str]
    fold_of: list[int]
    regs: dict[str, list[list[str]]]
    draw_regs: tuple[dict[str, list[list[str]]], ...] = ()

    def extra_lines(self, path: str | Path) -> list[QueryLine]:
        """The lines of ``path`` (augment or calibration lines: a JSONL file or a directory of them, '' = none)
        whose tool is in the registry."""
        from training.data import load_augment

        known = set(self.registry.names)
        return [ln for ln in load_augment(path) if ln.tool in known]

    def split(self, fold: int) -> tuple[list[QueryLine], list[int]]:
        """The training lines of ``fold``'s model (the other folds) and the indexes of its held-out lines."""
        train = [ln for ln, g in zip(self.lines, self.fold_of, strict=True) if g != fold]
        return train, [i for i, g in enumerate(self.fold_of) if g == fold]


def add_protocol_args(ap, sizes: str = "10,250,all", calibration: bool = False, draws: int = 0,
                      folds: str = "0,1,2") -> None:
    """The arguments every one-fold routing bench shares: the evaluation's data (the query file and registry in the
    checkout's data/), sizes and the gate-model cache; with ``calibration``, the held-out calibration lines
    (``data/routing_calibration``) the bench chooses its parameters on; with ``draws`` > 0 (the float benches of
    ``routing_models.float_bench``), ``--folds`` (default ``folds``) and ``--draws`` (default ``draws``)."""
    data = Path(__file__).resolve().parents[1] / "data"
    ap.add_argument("--queries", default=str(data / "queries" / "train.jsonl"))
    ap.add_argument("--tools", default=str(data / "mcp_tools"))
    ap.add_argument("--augment", default=str(data / "routing_augment"))
    if calibration:
        ap.add_argument("--calibration", default=str(data / "routing_calibration"))
    ap.add_argument("--sizes", default=sizes)
    ap.add_argument("--models-root", default="var/models")
    if draws > 0:
        ap.add_argument("--folds", default=folds)
        ap.add_argument("--draws", type=int, default=draws)


def add_fold_model_args(ap) -> None:
    """``--limit`` and ``--gates``: the arguments of the benches that route the evaluation's held-out lines with its
    fold models (``fold_model_dirs``)."""
    ap.add_argument("--limit", type=int, default=0, help="held-out lines per fold (0 = all; a quick look)")
    ap.add_argument("--gates", default="", metavar="DIR[,DIR...]",
                    help="gate models for --folds, in order, instead of the evaluation's cached fold models (the "
                         "mechanics only: a model trained on a fold's lines does not score them held out)")


def held_out_parser(doc: str, json_default: str, sizes: str = "10,250"):
    """The parser of a bench that routes the evaluation's held-out lines with its fold models (its description the
    first line of ``doc``): the protocol's arguments (``sizes``, 3 draws, the calibration lines), ``--json``
    (``json_default``), ``--limit`` and ``--gates``; the bench adds its own, then calls ``checked_folds``."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_protocol_args(ap, sizes=sizes, calibration=True, draws=3)
    ap.add_argument("--json", default=json_default)
    add_fold_model_args(ap)
    return ap


def held_out_models(a, folds: Sequence[int], given: Sequence[str]) -> tuple[Protocol, dict[int, str]]:
    """A held-out bench's protocol (the evaluation's: seed 0, 3 folds, ``--draws`` draws of ``--sizes``) and the
    model of each of ``folds`` (``fold_model_dirs``: ``given``, else the evaluation's, trained when not cached)."""
    proto = load_protocol(a.queries, a.tools, a.sizes, folds=3, seed=0, draws=a.draws)
    return proto, fold_model_dirs(a, proto, folds, given)


def checked_folds(ap, a) -> tuple[list[int], list[str]]:
    """The folds of ``--folds`` (of the evaluation's three) and the models of ``--gates``, one per fold; a usage
    error (exit 2) otherwise."""
    folds = [int(x) for x in a.folds.split(",") if x]
    if not folds or any(f not in range(3) for f in folds):
        ap.error(f"--folds: of 0, 1, 2 (the evaluation's three folds), got {a.folds!r}")
    given = [g for g in a.gates.split(",") if g]
    if given and len(given) != len(folds):
        ap.error(f"--gates: {len(given)} model(s) for {len(folds)} fold(s)")
    return folds, given


def fold_model_dirs(a, proto: Protocol, folds: Sequence[int], given: Sequence[str]) -> dict[int, str]:
    """``{fold: gate model}``: the ``--gates`` models, else the evaluation's fold models (trained once and cached
    under ``--models-root``, on the augment and calibration lines as ``nexus eval routing`` trains them)."""
    from training.gate import GateHyperParams

    if given:
        return dict(zip(folds, given, strict=True))
    extra, calib = proto.extra_lines(a.augment), proto.extra_lines(a.calibration)
    return dict(enumerate(fold_models(proto.lines, proto.fold_of, 3, proto.registry, GateHyperParams(seed=0),
                                      a.models_root, extra=extra, calibration=calib)))


def draw_arms(ax, arms: dict[str, list[dict[str, Any]]], xlabels: Sequence[str], title: str,
              ci: str = "Wilson 95 % CI") -> None:
    """``plot_arms``'s bars on the axes ``ax`` (a panel of a larger figure)."""
    width = 0.8 / len(arms)
    for k, (arm, rows) in enumerate(arms.items()):
        accs = [100 * r["accuracy"] for r in rows]
        err = [[a - 100 * r["ci95"][0] for a, r in zip(accs, rows, strict=True)],
               [100 * r["ci95"][1] - a for a, r in zip(accs, rows, strict=True)]]
        xs = [i + (k - (len(arms) - 1) / 2) * width for i in range(len(xlabels))]
        ax.bar(xs, accs, width, yerr=err, capsize=3, label=arm)
        for x, a, r in zip(xs, accs, rows, strict=True):  # above the CI's whisker
            ax.text(x, 100 * r["ci95"][1] + 0.2, f"{a:.1f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(xlabels)), list(xlabels))
    ax.set_ylabel(f"held-out top-1 (%), {ci}")
    lo = min(100 * r["ci95"][0] for rows in arms.values() for r in rows)
    ax.set_ylim(max(0, lo - 5), 101)
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def plot_arms(path: str, arms: dict[str, list[dict[str, Any]]], xlabels: Sequence[str], title: str,
              ci: str = "Wilson 95 % CI") -> None:
    """Grouped bars of held-out top-1 with their CIs (``ci`` names them): one bar per arm at each x (``arms[arm][i]`` holds
    ``accuracy`` and ``ci95`` for ``xlabels[i]``), the value printed on each bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    draw_arms(ax, arms, xlabels, title, ci)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(path: str, report: dict[str, Any], plot_fn=None, echo: Sequence[Any] = ()) -> str:
    """A bench's report: the JSON at ``path`` (its folder made), ``plot_fn(report, png)`` with the PNG beside it,
    then each of ``echo`` printed as JSON (the console summary); returns the PNG's path ('' without a plot)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2))
    png = ""
    if plot_fn is not None:
        png = str(Path(path).with_suffix(".png"))
        plot_fn(report, png)
    for item in echo:
        print(json.dumps(item, indent=1))
    return png


def plot_pooled(path: str, pooled: dict[str, dict[str, dict[str, Any]]], title: str) -> None:
    """``plot_arms`` of a bench's ``pool_line_draws`` section: one bar per arm at each size, bootstrap CIs."""
    sizes = list(next(iter(pooled.values())))
    plot_arms(path, {arm: [p[s] for s in sizes] for arm, p in pooled.items()}, [f"N = {s}" for s in sizes], title,
              ci="95 % CI, bootstrap over lines")


def pooled_top1(pooled: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """``{arm: {size: accuracy %}}`` of a bench's pooled section, rounded for the console."""
    return {arm: {s: round(100 * v["accuracy"], 1) for s, v in p.items()} for arm, p in pooled.items()}


def pool_line_draws(hits: dict[str, dict[str, dict[str, bool]]], base: str) -> tuple[dict, dict]:
    """A bench's arms over lines x draws: ``hits[arm][size]["<line id>#<draw>"]`` is a right pick. Returns each arm's
    ``{size: {"n" lines, "accuracy", "ci95"}}`` (the mean of each line's draws; CI by a bootstrap over lines, a line's
    draws not being independent trials) and, for every other arm, the (line, draw) pairs it fixed and broke
    against ``base``."""

    def line_means(arm: str, size: str) -> list[float]:
        per: dict[str, list[bool]] = {}
        for key, ok in hits[arm][size].items():
            per.setdefault(key.rsplit("#", 1)[0], []).append(ok)
        return [float(np.mean(v)) for v in per.values()]

    pooled = {arm: {s: {"n": len(m := line_means(arm, s)), "accuracy": float(np.mean(m)),
                        "ci95": list(bootstrap_mean_ci(m))} for s in by_size} for arm, by_size in hits.items()}
    paired = {arm: {s: {"fixed": sum(ok and not hits[base][s][k] for k, ok in got.items()),
                        "broken": sum(not ok and hits[base][s][k] for k, ok in got.items())}
                    for s, got in by_size.items()} for arm, by_size in hits.items() if arm != base}
    return pooled, paired


def load_protocol(queries: str, tools: str, sizes: str, *, folds: int = 3, seed: int = 0, draws: int = 1) -> Protocol:
    """As ``evaluate`` builds it: lines whose tool is registered, folds and per-size registries drawn with ``seed``
    (``draws`` independent draws of them; one-fold experiments in bench/ use it to score exactly the evaluation's
    held-out lines)."""
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    registry = load_registry(tools)
    known = set(registry.names)
    lines = [ln for ln in load_queries(queries) if ln.tool in known]
    size_list = parse_sizes(sizes)
    regs = tuple(registries_for(lines, size_list, registry, seed, d) for d in range(draws))
    return Protocol(registry, lines, size_list, assign_folds(lines, folds, seed), regs[0], regs)


def _open_router(store, embedder, gate_dir: str | Path | None, threads: int = 1, exemplar_weight: float = -1.0,
                 precision: str = "fp32"):
    from services.router.config import RouterConfig
    from services.router.router import Router

    cfg = RouterConfig(store_url=str(store.root), gate_model_dir=str(gate_dir or ""), torch_threads=threads,
                       exemplar_weight=exemplar_weight, query_encoder_precision=precision)
    router = Router(cfg, store, embedder)
    asyncio.run(router.sync(force=True))
    return router


def route_lines(router, lines: Sequence[QueryLine], regs: dict[Any, list[list[str]]], idxs: Sequence[int],
                progress=None, candidates: bool = False) -> dict[Any, list[dict[str, Any]]]:
    """Route lines ``idxs`` over each registry set of ``regs`` (keyed by size, or by (size, draw)); one record per
    (key, line), with the SLB's top 3 names under ``candidates`` when asked."""
    from services.router.router import routing_text

    names = router.index.names()
    pos = {n: i for i, n in enumerate(names)}
    out: dict[Any, list[dict[str, Any]]] = {s: [] for s in regs}
    for i in idxs:
        ln = lines[i]
        text = routing_text(ln.query, list(ln.history), router._max_turns())
        for size, per_line in regs.items():
            mask = np.zeros(len(names), bool)
            mask[[pos[n] for n in per_line[i]]] = True
            d = router.decide(text, 3, allowed=mask)
            slb = [n for n, _ in d.slb_candidates[:3]]
            out[size].append({"i": i, "id": ln.id, "tool": ln.tool, "pred": d.tool, "correct": is_correct(d.tool, ln.tool),
                              "slb_top1": is_correct(slb[0], ln.tool),
                              "slb_top3": any(is_correct(n, ln.tool) for n in slb),
                              "escalated": d.escalated, "margin": d.margin, "route_ms": d.route_ms,
                              "slot": ln.slot, "multi_turn": bool(ln.history)})
            if candidates:
                out[size][-1]["candidates"] = slb
        if progress is not None:
            progress.update(1)
    return out


def summarize(records: list[dict[str, Any]], n_tools: int) -> dict[str, Any]:
    n = len(records)
    ok = sum(r["correct"] for r in records)
    ms = [r["route_ms"] for r in records]
    esc = [r for r in records if r["escalated"]]
    top1 = sum(r["slb_top1"] for r in records)
    top3 = sum(r["slb_top3"] for r in records)
    out = {
        "n": n,
        "registry_size": n_tools,
        "accuracy": ok / n if n else None,
        "ci95": list(wilson(ok, n)),
        "slb_top1": top1 / n if n else None,
        "slb_top1_ci95": list(wilson(top1, n)),
        "slb_top3": top3 / n if n else None,
        "slb_top3_ci95": list(wilson(top3, n)),
        "escalation_rate": len(esc) / n if n else None,
        "accuracy_escalated": (sum(r["correct"] for r in esc) / len(esc)) if esc else None,
        "slb_top1_escalated": (sum(r["slb_top1"] for r in esc) / len(esc)) if esc else None,
        "accuracy_auto": (sum(r["correct"] for r in records if not r["escalated"]) / (n - len(esc))) if n > len(esc) else None,
        "route_ms_p50": percentile(ms, 50) if ms else None,
        "route_ms_p99": percentile(ms, 99) if ms else None,
        "accuracy_by_slot": {},
        "accuracy_multi_turn": None,
    }
    for slot in sorted({r["slot"] for r in records}):
        rs = [r for r in records if r["slot"] == slot]
        out["accuracy_by_slot"][str(slot)] = {"n": len(rs), "accuracy": sum(r["correct"] for r in rs) / len(rs)}
    mt = [r for r in records if r["multi_turn"]]
    if mt:
        out["accuracy_multi_turn"] = {"n": len(mt), "accuracy": sum(r["correct"] for r in mt) / len(mt),
                                      "ci95": list(wilson(sum(r["correct"] for r in mt), len(mt)))}
    return out


def summarize_draws(by_draw: Sequence[list[dict[str, Any]]], n_tools: int) -> dict[str, Any]:
    """``summarize`` over several draws of distractors for the same lines (``by_draw[d]``: one record per line).
    One draw: exactly ``summarize``. Several: rates over every (line, draw); ``n`` stays the number of lines, and the
    intervals are percentile bootstraps over lines of each line's mean over the draws (a line's draws are not
    independent trials, so a Wilson interval over all of them would be too narrow); ``accuracy_by_draw`` shows the
    spread the draws alone make."""
    if len(by_draw) == 1:
        return summarize(by_draw[0], n_tools)
    if len({len(recs) for recs in by_draw}) != 1:
        raise ValueError("every draw must hold the same lines")
    out = summarize([r for recs in by_draw for r in recs], n_tools)
    per_line: dict[int, list[dict[str, Any]]] = {}
    for recs in by_draw:
        for r in recs:
            per_line.setdefault(r["i"], []).append(r)

    def line_means(key: str, rows=None) -> list[float]:
        return [float(np.mean([r[key] for r in rs])) for rs in (rows if rows is not None else per_line.values())]

    out.update(n=len(per_line), n_draws=len(by_draw),
               ci95=list(bootstrap_mean_ci(line_means("correct"))),
               slb_top1_ci95=list(bootstrap_mean_ci(line_means("slb_top1"))),
               slb_top3_ci95=list(bootstrap_mean_ci(line_means("slb_top3"))),
               accuracy_by_draw=[sum(r["correct"] for r in recs) / len(recs) if recs else None for recs in by_draw])
    mt = [rs for rs in per_line.values() if rs[0]["multi_turn"]]
    if mt:
        out["accuracy_multi_turn"] = {**out["accuracy_multi_turn"], "n": len(mt),
                                      "ci95": list(bootstrap_mean_ci(line_means("correct", mt)))}
    return out


def base_slb_summary(embedder, router, lines: Sequence[QueryLine], regs: dict[str, list[list[str]]]) -> dict[str, Any]:
    """Untrained baseline: base all-MiniLM-L6-v2 query embedding, cosine over the same text keys (INT8)."""
    from services.router.router import routing_text
    from services.router.slb import SemanticIndex

    names = router.index.names()
    pos = {n: i for i, n in enumerate(names)}
    # the text keys alone (the router's index may also hold alternate keys)
    plain = SemanticIndex(router.index.dim)
    plain.replace_all({n: router.index.vector(n) for n in names})
    qv = embedder.embed([routing_text(ln.query, list(ln.history)) for ln in lines])
    out = {}
    for size, per_line in regs.items():
        ok1 = ok3 = 0
        for i, ln in enumerate(lines):
            mask = np.zeros(len(names), bool)
            mask[[pos[n] for n in per_line[i]]] = True
            top = [n for n, _ in plain.search(qv[i], 3, allowed=mask)]
            ok1 += is_correct(top[0], ln.tool)
            ok3 += any(is_correct(n, ln.tool) for n in top)
        out[size] = {"n": len(lines), "slb_top1": ok1 / len(lines), "ci95": list(wilson(ok1, len(lines))),
                     "slb_top3": ok3 / len(lines)}
    return out


# -- concat-all baseline ---------------------------------------------------------------------------------
CONCAT_SYSTEM = ("You route a user's request to exactly one tool. These are the available tools, as JSON:\n")
CONCAT_INSTRUCTION = "\nAnswer with the name of the one tool that fulfils the user's last request."


def concat_prompt(tools: Sequence[Any], line: QueryLine) -> str:
    """ChatML prompt (SmolLM2's template) with every schema of the registry in the system turn."""
    schemas = "\n".join(json.dumps({"name": t.name, "description": t.description, "inputSchema": t.input_schema},
                                   ensure_ascii=False) for t in tools)
    parts = [f"<|im_start|>system\n{CONCAT_SYSTEM}{schemas}{CONCAT_INSTRUCTION}<|im_end|>\n"]
    for role, content in line.history:
        r = role if role in ("user", "assistant") else "user"
        body = content if role != "tool" else f"[tool result] {content}"
        parts.append(f"<|im_start|>{r}\n{body}<|im_end|>\n")
    parts.append(f"<|im_start|>user\n{line.query}<|im_end|>\n<|im_start|>assistant\n")
    return "".join(parts)


def names_grammar(names: Sequence[str]) -> str:
    """GBNF: exactly one of the names."""
    def lit(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "root ::= " + " | ".join(lit(n) for n in names) + "\n"


def concat_all(lines: Sequence[QueryLine], sizes: Sequence[str], registry: Registry, regs: dict[str, list[list[str]]],
               limit: int, seed: int, model_path: str = "", progress: bool = True) -> dict[str, Any]:
    """For each size: prompt tokens of a bounded sample of lines (real tokenizer), whether every prompt fits the
    model's training context, and, where they fit, the model's routing accuracy (greedy, names-only grammar)."""
    from llama_cpp import Llama, LlamaGrammar
    from tqdm import tqdm

    from services.common.models import resolve_gguf
    from services.compiler.tokenizer import load_tokenizer

    tokenize = load_tokenizer(model_path)
    probe = Llama(model_path=str(resolve_gguf(model_path)), n_ctx=256, n_threads=1, verbose=False)
    n_ctx_train = int(probe._model.n_ctx_train())  # the context length the model was trained with
    del probe
    by_name = registry.by_name()
    sample = sorted(random.Random(seed).sample(range(len(lines)), min(limit, len(lines))))
    answer_margin = 48
    out: dict[str, Any] = {"model": str(resolve_gguf(model_path)), "n_ctx_train": n_ctx_train, "sample": len(sample),
                           "sizes": {}}
    llm = None
    for size in sizes:
        prompts = []
        for i in sample:
            tools = [by_name[n] for n in sorted(regs[size][i], key=registry.names.index)]
            prompts.append((i, tools, concat_prompt(tools, lines[i])))
        ntok = [len(tokenize(p)) for _, _, p in prompts]
        fits = max(ntok) + answer_margin <= n_ctx_train
        entry: dict[str, Any] = {"n_tools": _size_n(size, registry),
                                 "fraction_of_prompts_fitting": sum(t + answer_margin <= n_ctx_train for t in ntok) / len(ntok),
                                 "prompt_tokens_median": statistics.median(ntok),
                                 "prompt_tokens_max": max(ntok), "prompt_tokens_min": min(ntok), "fits": fits,
                                 "accuracy": None, "ci95": None, "n": 0}
        if fits:
            if llm is None:
                llm = Llama(model_path=str(resolve_gguf(model_path)), n_ctx=n_ctx_train, n_threads=2, n_batch=512,
                            verbose=False)
            ok, ms = 0, []
            for i, tools, prompt in tqdm(prompts, desc=f"concat-all N={size}", disable=not progress):
                grammar = LlamaGrammar.from_string(names_grammar([t.name for t in tools]), verbose=False)
                t0 = time.perf_counter()
                res = llm.create_completion(prompt, max_tokens=48, temperature=0.0, top_k=1, grammar=grammar)
                ms.append((time.perf_counter() - t0) * 1e3)
                pred = res["choices"][0]["text"].strip()
                ok += is_correct(pred, lines[i].tool)
            entry.update(accuracy=ok / len(prompts), ci95=list(wilson(ok, len(prompts))), n=len(prompts),
                         route_ms_p50=percentile(ms, 50))
        out["sizes"][size] = entry
    return out


# -- plot ------------------------------------------------------------------------------------------------
def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    sizes = list(report["sizes"])
    xs = [report["sizes"][s]["registry_size"] for s in sizes]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))

    def series(vals, cis, label, style, color):
        v = np.array(vals, float) * 100
        lo = v - np.array([c[0] for c in cis]) * 100
        hi = np.array([c[1] for c in cis]) * 100 - v
        ax.errorbar(xs, v, yerr=[lo, hi], fmt=style, color=color, capsize=3, label=label)

    series([report["sizes"][s]["accuracy"] for s in sizes], [report["sizes"][s]["ci95"] for s in sizes],
           "Nexus: SLB + margin gate + second stage", "o-", "#1d3557")
    series([report["sizes"][s]["slb_top1"] for s in sizes], [report["sizes"][s]["slb_top1_ci95"] for s in sizes],
           "SLB top-1 (tuned query encoder): the router without its second stage", "s--", "#457b9d")
    series([report["sizes"][s]["slb_top3"] for s in sizes], [report["sizes"][s]["slb_top3_ci95"] for s in sizes],
           "SLB top-3", "^:", "#a8dadc")
    base = report.get("baseline_untrained_slb") or {}
    if base:
        series([base[s]["slb_top1"] for s in sizes], [base[s]["ci95"] for s in sizes],
               "untrained SLB top-1 (base MiniLM, name+description)", "x-.", "#999999")
    concat = (report.get("concat_all") or {}).get("sizes", {})
    cx = [report["sizes"][s]["registry_size"] for s in sizes if concat.get(s, {}).get("accuracy") is not None]
    if cx:
        cs = [s for s in sizes if concat.get(s, {}).get("accuracy") is not None]
        v = np.array([concat[s]["accuracy"] for s in cs]) * 100
        ax.errorbar(cx, v, yerr=[v - np.array([concat[s]["ci95"][0] for s in cs]) * 100,
                                 np.array([concat[s]["ci95"][1] for s in cs]) * 100 - v],
                    fmt="D-", color="#e63946", capsize=3, label="concat-all schemas (SmolLM2-135M)")
    over = [report["sizes"][s]["registry_size"] for s in sizes if concat.get(s) and not concat[s]["fits"]]
    if over:
        ax.scatter(over, [2] * len(over), marker="x", color="#e63946", s=60,
                   label="concat-all overflows the 8192-token context")
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x}" for x in xs])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("registry size N (tools)")
    draws = report["protocol"].get("draws", 1)
    ax.set_ylabel("routing accuracy, % (95 % CI, " + ("Wilson)" if draws == 1 else "bootstrap over lines;\n"
                                                            "first-draw baselines: Wilson)"))
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(f"Routing accuracy on held-out queries ({report['protocol']['folds']}-fold), "
                 f"n = {report['sizes'][sizes[0]]['n']}" + (f" x {draws} draws of distractors" if draws > 1 else ""),
                 fontsize=10)
    ax.legend(fontsize=7.5, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def reused_generalization(path: str | Path, seed: int, sizes: Sequence[str], draws: int, n_lines: int) -> dict:
    """The generalization section of an earlier report at ``path`` (``--generalization-from``): the held-out server's
    model routes without a second stage, so a run that changes only the stage may reuse it. Raises ValueError when
    that run's protocol (seed, sizes, draws, lines) differs or it has none."""
    doc = json.loads(Path(path).read_text())
    proto, gen = doc.get("protocol") or {}, doc.get("generalization")
    ours = {"seed": seed, "sizes": list(sizes), "draws": draws, "n_lines": n_lines}
    theirs = {k: proto.get(k) for k in ours}
    if theirs != ours:
        raise ValueError(f"--generalization-from {path}: its protocol {theirs} is not this run's {ours}")
    if not gen:
        raise ValueError(f"--generalization-from {path}: no generalization section")
    return {k: v for k, v in gen.items() if k not in ("same_lines_k_fold", "reused_from")}


# -- the evaluation ---------------------------------------------------------------------------------------
def evaluate(queries: str, tools: str, sizes: str, out_json: str, *, seed: int = 0, folds: int = 3,
             holdout_server: str = "kubernetes", concat_limit: int = 30, models_root: str = "var/models",
             exemplar_weight: float = -1.0, hp=None, progress: bool = True, plot_path: str | None = None,
             skip_concat: bool = False, model_path: str = "", concat_from: str = "",
             augment: str = "", calibration: str = "", draws: int = 1,
             precision: str | None = None, generalization_from: str = "") -> dict[str, Any]:
    from services.router.config import RouterConfig
    from training.data import prepare_training_env

    precision = precision or RouterConfig.query_encoder_precision  # the product's graph unless asked otherwise

    prepare_training_env()
    from tqdm import tqdm

    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from training.gate import GateHyperParams

    t_start = time.time()
    hp = hp or GateHyperParams(seed=seed)
    proto = load_protocol(queries, tools, sizes, folds=folds, seed=seed, draws=draws)
    registry, lines, size_list, fold_of, regs = proto.registry, proto.lines, proto.sizes, proto.fold_of, proto.regs
    # every (size, draw) registry set, routed in one pass per line
    all_regs = {(s, d): r[s] for d, r in enumerate(proto.draw_regs) for s in size_list}

    reused = reused_generalization(generalization_from, seed, size_list, draws, len(lines)) \
        if generalization_from else None  # checked before any model is trained
    extra, calib = proto.extra_lines(augment), proto.extra_lines(calibration)
    clash = {ln.id for ln in calib} & ({ln.id for ln in lines} | {ln.id for ln in extra})
    if clash:
        raise ValueError(f"{len(clash)} calibration line ids are also query or augment ids (e.g. {min(clash)})")
    fold_dirs = fold_models(lines, fold_of, folds, registry, hp, models_root, progress, extra=extra,
                            calibration=calib)
    servers = registry.servers()
    hold_dir = holdout_model(lines, holdout_server, registry, hp, models_root, progress, extra=extra,
                             calibration=calib) \
        if holdout_server and holdout_server in servers and not generalization_from else None

    embedder = Embedder("")
    records: dict[tuple[str, int], list[dict[str, Any]]] = {k: [] for k in all_regs}
    with tempfile.TemporaryDirectory(prefix="nexus-eval-store-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(registry.tools))
        fold_meta = []
        with tqdm(total=len(lines), desc="routing (held-out folds)", disable=not progress) as bar:
            for f, gdir in enumerate(fold_dirs):
                router = _open_router(store, embedder, gdir, exemplar_weight=exemplar_weight, precision=precision)
                if router.gate is None:
                    raise RuntimeError(f"gate model {gdir} did not load")
                idxs = [i for i, g in enumerate(fold_of) if g == f]
                for k, recs in route_lines(router, lines, all_regs, idxs, bar).items():
                    records[k].extend(recs)
                meta = router.gate.info.meta
                fold_meta.append({"fold": f, "model": str(gdir), "n_eval": len(idxs), "n_fit": meta["n_fit"],
                                  "query_encoder": getattr(router.gate.onnx, "precision", "torch"),
                                  "n_val": meta["n_val"], "tau": meta["tau"], "alpha": meta["alpha"],
                                  "val_gated_accuracy": meta["val_gated_accuracy"],
                                  "val_escalation_rate": meta["val_escalation_rate"],
                                  "train_seconds": meta["train_seconds"],
                                  "query_encoder_best_epoch": meta["query_encoder"]["best_epoch"],
                                  "cross_encoder_best_epoch": meta["cross_encoder"]["best_epoch"],
                                  "slb": {**{k: v for k, v in (meta.get("slb") or {}).items()
                                             if k not in ("by_setting", "tool_bias")},
                                          "n_biased_tools": len((meta.get("slb") or {}).get("tool_bias") or {})}})
        base = base_slb_summary(embedder, router, lines, regs)
        def by_draw(recs: dict[tuple[str, int], list[dict[str, Any]]], size: str, keep=lambda r: True):
            return [sorted((r for r in recs[size, d] if keep(r)), key=lambda r: r["i"]) for d in range(draws)]

        report_sizes = {s: summarize_draws(by_draw(records, s), _size_n(s, registry)) for s in size_list}
        for s in size_list:  # what the second stage changed: (line, draw) pairs it fixed and broke against the SLB
            recs = [r for d in range(draws) for r in records[s, d]]
            report_sizes[s]["second_stage_fixed"] = sum(r["correct"] and not r["slb_top1"] for r in recs)
            report_sizes[s]["second_stage_broken"] = sum(r["slb_top1"] and not r["correct"] for r in recs)

        generalization = None
        if reused is not None:  # the held-out server's routing is the earlier run's
            server = reused["server"]
            in_dist = {s: summarize_draws(by_draw(records, s, lambda r: registry.server_of[r["tool"]] == server),
                                          _size_n(s, registry)) for s in size_list}
            generalization = {**reused, "reused_from": str(generalization_from),
                              "same_lines_k_fold": {s: {k: in_dist[s][k] for k in ("n", "accuracy", "ci95", "slb_top1",
                                                                                   "slb_top3")} for s in size_list}}
        elif hold_dir is not None:
            router = _open_router(store, embedder, hold_dir, exemplar_weight=exemplar_weight, precision=precision)
            idxs = [i for i, ln in enumerate(lines) if registry.server_of[ln.tool] == holdout_server]
            held = route_lines(router, lines, all_regs, idxs)
            in_dist = {s: summarize_draws(by_draw(records, s, lambda r: registry.server_of[r["tool"]] == holdout_server),
                                          _size_n(s, registry)) for s in size_list}
            generalization = {
                "server": holdout_server, "model": str(hold_dir), "n": len(idxs),
                "note": "trained without any line of this server (real or augment); its tools stay registered with "
                        "text keys only, while every other tool also has exemplar keys",
                "sizes": {s: summarize_draws(by_draw(held, s), _size_n(s, registry)) for s in size_list},
                "same_lines_k_fold": {s: {k: in_dist[s][k] for k in ("n", "accuracy", "ci95", "slb_top1", "slb_top3")}
                                      for s in size_list},
            }
    concat = None
    if concat_from:  # concat-all reads no router state: an earlier run's section stays valid for the same data
        concat = json.loads(Path(concat_from).read_text()).get("concat_all")
        if concat is not None:
            concat = {**concat, "reused_from": str(concat_from)}
    elif not skip_concat:
        concat = concat_all(lines, size_list, registry, regs, concat_limit, seed, model_path, progress)
    report = {
        "protocol": {
            "scheme": f"{folds}-fold by per-tool query slot (seeded permutation)",
            "description": __doc__.split("Protocol (also written into the report as ``protocol``):")[1].strip(),
            "folds": folds, "seed": seed, "sizes": size_list, "draws": draws, "queries": str(queries), "tools": str(tools),
            "n_lines": len(lines), "n_tools": len(registry.tools),
            "equivalence_groups_count_as_correct": True,
            "hyperparams": asdict(hp),
            "query_encoder_precision": precision,
            "second_stage": "the gate model's cross-encoder where its alpha > 0, else none",
            "exemplar_weight": exemplar_weight if exemplar_weight >= 0 else "each model's validation-chosen weight "
                                                                            "(folds[].slb.exemplar_weight)",
            "augment": {"source": str(augment), "n_lines": len(extra),
                        "use": "fit split of every gate model only (never validation or evaluation); the held-out "
                               "server's model is trained without that server's augment lines"},
            "calibration": {"source": str(calibration), "n_lines": len(calib),
                            "use": "never trained on and never an exemplar key: joins each model's validation lines "
                                   "for the SLB calibration (exemplar weight, gap, tau, alpha); the held-out server's "
                                   "model is calibrated without that server's lines"},
        },
        "sizes": report_sizes,
        "folds": fold_meta,
        "baseline_untrained_slb": base,
        "generalization": generalization,
        "concat_all": concat,
        "seconds": round(time.time() - t_start, 1),
        "machine": {"cpus": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0],
                    "torch_threads": 1,
                    "note": "shared 2-core VM: other jobs run concurrently, latencies are upper bounds"},
    }
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(report, indent=2))
    plot_to = plot_path or str(Path(out_json).with_suffix(".png"))
    plot(report, plot_to)
    report["plot"] = plot_to
    Path(out_json).write_text(json.dumps(report, indent=2))
    return report
