"""Splice envelope evals (issue 5): fidelity (KL / top-1 vs full prefill), TTFT (splice + repair vs
prefill) and the reference-free drift gate (per-head context K-variance vs true per-head drift).

Protocol shared by all three (one SpliceContext, SmolLM2-135M by default, n_threads=1):
  prelude P = a system header; schema S = a real MCP tool's canonical JSON (data/mcp_tools); the block is
  compiled once under P (anchor m0 = |P|). A placement Δpos puts the block at n_past = m0 + Δpos after a
  context C = P + the first Δpos tokens of other tools' schemas (a different server per schema). The
  context KV is computed once per schema (the longest context, in a spare sequence) and each arm starts
  from a copy of its first n_past cells, so every arm sees bit-identical context KV.
  reference = text prefill of S then the query Q on top of C (what path B computes);
  arms: anchored  block compiled under C itself (from the reference's own cells), no repair: the splice
                  mechanics alone -> must be bit-identical;
        bare      block compiled under P, reanchored to n_past, no repair;
        no_reanchor  as bare, positions relabelled but K not rotated;
        scattered re-decode the FIRST ceil(S*R(n)/100) block tokens (EPIC / LegoLink style);
        suffix    re-decode the contiguous trailing ceil(S*R(n)/100) tokens (the design);
        exact     R = 100 %.
  Fidelity = KL(reference || arm) in nats and top-1 agreement of Q's next-token distribution.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.runtime.splice import SCRATCH_SEQ, SpliceContext, kl_divergence, recompute_fraction

BASE_SEQ = 2  # the cached context
REF_SEQ = 3  # the reference (text prefill)
LIVE = 0

DELTAS = (0, 16, 64, 256, 512, 1024, 2048)
QUICK_DELTAS = (0, 64, 512, 2048)
ARMS = ("anchored", "bare", "no_reanchor", "scattered", "suffix", "exact")
PRELUDE = "<|im_start|>system\nYou are a tool-calling assistant. Available tools:\n"
DEFAULT_TOOLS = str(Path(__file__).resolve().parents[1] / "data" / "mcp_tools")


@dataclass
class Case:
    name: str
    server: str
    schema: list[int]
    filler: list[int]
    query: list[int]


def build_cases(sc: SpliceContext, tools_dir: str, n_schemas: int, max_delta: int,
                min_tokens: int = 30, max_tokens: int = 240, n_contexts: int = 0) -> list[Case]:
    """One tool per server (servers in name order, round-robin), min-max schema tokens; the context of
    each is other servers' schemas, rotated so each case gets a different one (n_contexts > 0: only that
    many distinct contexts, cases sharing one are adjacent so its KV is computed once - a CPU-time
    saving on this box)."""
    from services.common.tools import load_registry_dir

    by_server: dict[str, list[Any]] = {}
    for f in sorted(Path(tools_dir).glob("*.json")):
        tools = load_registry_dir_file(f, load_registry_dir)
        if tools:
            by_server[f.stem] = tools
    servers = sorted(by_server)
    picked: list[tuple[str, Any]] = []
    depth = 0
    while len(picked) < n_schemas and depth < 50:
        for srv in servers:
            tools = by_server[srv]
            if depth < len(tools):
                t = tools[depth]
                n = len(sc.tokenize(t.canonical_json() + "\n"))
                if min_tokens <= n <= max_tokens:
                    picked.append((srv, t))
                    if len(picked) == n_schemas:
                        break
        depth += 1
    cases = []
    for i, (srv, tool) in enumerate(picked):
        filler: list[int] = []
        j = (i % n_contexts if n_contexts else i) + 1
        while len(filler) < max_delta:
            other = servers[j % len(servers)]
            j += 1
            if other == srv:
                continue
            for t in by_server[other]:
                filler += sc.tokenize(t.canonical_json() + "\n")
                if len(filler) >= max_delta:
                    break
        query = sc.tokenize(f"<|im_end|>\n<|im_start|>user\nCall {tool.name} for me.<|im_end|>\n"
                            "<|im_start|>assistant\n{")
        cases.append(Case(tool.name, srv, sc.tokenize(tool.canonical_json() + "\n"), filler[:max_delta], query))
    if n_contexts:
        cases.sort(key=lambda c: c.filler)
    return cases


def load_registry_dir_file(path: Path, loader) -> list[Any]:
    """load_registry_dir works on directories: load one server file through a temp dir view."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        os.symlink(path, os.path.join(d, path.name))
        return loader(d)


def _start_live(sc: SpliceContext, n_past: int) -> None:
    sc.seq_rm(LIVE)
    sc.seq_cp(BASE_SEQ, LIVE, 0, n_past)


def _block_from_seq(sc: SpliceContext, seq: int, p0: int, p1: int, tokens: list[int]) -> Any:
    import nexus_native as nn

    sc.seq_rm(SCRATCH_SEQ)
    sc.seq_cp(seq, SCRATCH_SEQ, p0, p1)
    try:
        blob = sc.get_seq(SCRATCH_SEQ)
    finally:
        sc.seq_rm(SCRATCH_SEQ)
    return nn.AtbBlock.from_state(blob, sc.spec, token_hash=nn.token_hash(tokens))


def _head_k(block: Any, n_head: int, head_dim: int) -> np.ndarray:
    k = np.asarray(block.k, dtype=np.float32)  # (L, T, H*D)
    return k.reshape(k.shape[0], k.shape[1], n_head, head_dim)


def run_cases(sc: SpliceContext, cases: list[Case], deltas: tuple[int, ...], arms: tuple[str, ...],
              K: float = 4, drift: bool = False, log=print, on_case=None) -> dict[str, Any]:
    """Fidelity rows per (case, Δpos, arm), plus per-head drift vs context K-variance when drift=True."""
    spec = sc.spec
    pre = sc.tokenize(PRELUDE)
    m0 = len(pre)
    rows: list[dict[str, Any]] = []
    drift_rows: list[dict[str, Any]] = []
    base_tokens: list[int] | None = None
    for ci, case in enumerate(cases):
        t0 = time.time()
        block = sc.compile_block(pre, case.schema)
        S = len(case.schema)
        ctx_tokens = pre + case.filler[:max(deltas)]
        if ctx_tokens != base_tokens:  # the context KV, computed once per distinct context
            sc.prefill(ctx_tokens, seq=BASE_SEQ)
            base_tokens = ctx_tokens
        for d in deltas:
            n_past = m0 + d
            sc.seq_rm(REF_SEQ)
            sc.seq_cp(BASE_SEQ, REF_SEQ, 0, n_past)
            sc.decode(case.schema, n_past, REF_SEQ)
            sc.decode(case.query, n_past + S, REF_SEQ)
            ref = sc.logits()
            anchored = _block_from_seq(sc, REF_SEQ, n_past, n_past + S, case.schema)
            sc.seq_rm(REF_SEQ)
            r_pct = recompute_fraction(n_past, K=K)
            for arm in arms:
                _start_live(sc, n_past)
                if arm == "anchored":
                    sc.splice(anchored, n_past, 0.0)
                elif arm == "bare":
                    sc.splice(block, n_past, 0.0)
                elif arm == "no_reanchor":
                    sc.splice(block, n_past, 0.0, reanchor=False)
                elif arm == "scattered":
                    sc.splice(block, n_past, r_pct, schema_tokens=case.schema, repair="scattered")
                elif arm == "suffix":
                    sc.splice(block, n_past, r_pct, schema_tokens=case.schema)
                elif arm == "exact":
                    sc.splice(block, n_past, 100.0, schema_tokens=case.schema)
                sc.decode(case.query, n_past + S, LIVE)
                got = sc.logits()
                rows.append({"case": case.name, "server": case.server, "schema_tokens": S, "delta_pos": d,
                             "n_past": n_past, "arm": arm, "recompute_pct": r_pct,
                             "kl": kl_divergence(ref, got), "top1": int(np.argmax(ref) == np.argmax(got)),
                             "bit_identical": bool(np.array_equal(ref, got))})
            if drift and d > 0:
                drift_rows.append(_drift_row(sc, case, block, anchored, n_past, spec))
            sc.seq_rm(LIVE)
        log(f"[{ci + 1}/{len(cases)}] {case.server}/{case.name} S={S} {time.time() - t0:.1f}s", flush=True)
        if on_case is not None:  # partial report after every case: a long run killed early still reports
            on_case(ci + 1, {"rows": rows, "drift_rows": drift_rows})
    return {"rows": rows, "drift_rows": drift_rows}


def _drift_row(sc: SpliceContext, case: Case, block: Any, anchored: Any, n_past: int, spec: Any) -> dict:
    """True per-head drift: |K_bare(reanchored) - K_true| (L2 per token, averaged), the reference's own
    schema keys being the truth; proxy: per-head variance of the preceding context's keys."""
    from scipy.stats import spearmanr

    H, D = spec.n_head_kv, spec.head_dim
    bare = block.copy()
    bare.reanchor(n_past)
    kb, kt = _head_k(bare, H, D), _head_k(anchored, H, D)
    drift = np.linalg.norm(kb - kt, axis=-1).mean(axis=1)  # (L, H)
    ctx_block = _block_from_seq(sc, BASE_SEQ, 0, n_past, [])
    kc = _head_k(ctx_block, H, D)
    kvar = kc.var(axis=1).mean(axis=-1)  # (L, H): variance over context tokens, mean over dims
    rho, p = spearmanr(kvar.ravel(), drift.ravel())
    return {"case": case.name, "n_past": n_past, "delta_pos": n_past - block.anchor, "rho": float(rho),
            "p": float(p), "drift_mean": float(drift.mean()), "drift_max": float(drift.max()),
            "n_heads": int(drift.size)}


def summarize_fidelity(rows: list[dict[str, Any]], arms: tuple[str, ...], deltas: tuple[int, ...]) -> dict:
    out: dict[str, list[dict[str, Any]]] = {}
    for arm in arms:
        cells = []
        for d in deltas:
            rs = [r for r in rows if r["arm"] == arm and r["delta_pos"] == d]
            if not rs:
                continue
            kls = [r["kl"] for r in rs]
            cells.append({"delta_pos": d, "kl_mean": float(np.mean(kls)), "kl_max": float(np.max(kls)),
                          "top1": float(np.mean([r["top1"] for r in rs])),
                          "bit_identical": float(np.mean([r["bit_identical"] for r in rs])),
                          "recompute_pct": rs[0]["recompute_pct"], "n": len(rs)})
        out[arm] = cells
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_fidelity(report: dict[str, Any], path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    for arm, cells in report["arms"].items():
        xs = [max(c["delta_pos"], 1) for c in cells]
        ax[0].plot(xs, [max(c["kl_mean"], 1e-7) for c in cells], marker="o", label=arm)
        ax[1].plot(xs, [c["top1"] for c in cells], marker="o", label=arm)
    ax[0].set_xscale("log")
    ax[0].set_yscale("log")
    ax[0].set_xlabel("Δpos (0 plotted at 1)")
    ax[0].set_ylabel("KL(prefill || splice), nats (mean; 0 plotted at 1e-7)")
    ax[0].set_title(f"{report['n_schemas']} schemas, {report['model']}")
    ax[1].set_xscale("log")
    ax[1].set_ylim(-0.05, 1.05)
    ax[1].set_xlabel("Δpos")
    ax[1].set_ylabel("top-1 agreement")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(report: dict[str, Any], out: str, plot) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2))
    plot(report, str(Path(out).with_suffix(".png")))


def _ctx(args) -> SpliceContext:
    return SpliceContext(args.model, n_ctx=args.n_ctx, n_batch=512, n_threads=args.threads)


def run_fidelity(args) -> dict[str, Any]:
    deltas = QUICK_DELTAS if args.quick else DELTAS
    if args.deltas:
        deltas = _parse_deltas(args.deltas)
    n_schemas = args.schemas or (4 if args.quick else 12)
    t0 = time.time()
    with _ctx(args) as sc:
        cases = build_cases(sc, args.tools, n_schemas, max(deltas), max_tokens=args.max_schema_tokens,
                            n_contexts=args.contexts)

        def report_of(done: int, res: dict[str, Any]) -> dict[str, Any]:
            return {
                "quick": bool(args.quick), "complete": done == len(cases), "model": Path(sc.model_path).name,
                "n_schemas": done, "schemas": [f"{c.server}/{c.name}" for c in cases[:done]],
                "deltas": list(deltas), "K": args.K,
            "protocol": (__doc__ or "").strip().split("\n\n")[1] if __doc__ else "",
                "n_contexts": len({tuple(c.filler) for c in cases[:done]}),
                "arms": summarize_fidelity(res["rows"], ARMS, deltas), "rows": res["rows"],
                "seconds": round(time.time() - t0, 1),
            }

        res = run_cases(sc, cases, deltas, ARMS, K=args.K,
                        on_case=lambda done, r: _write(report_of(done, r), args.out, plot_fidelity))
        sc.seq_rm(BASE_SEQ)
        report = report_of(len(cases), res)
    _write(report, args.out, plot_fidelity)
    return report


# ------------------------------------------------------------------------------------------------ TTFT

def run_ttft(args) -> dict[str, Any]:
    from evals.stats import bootstrap_median_ci, bootstrap_ratio_ci, median

    n_pasts = (256, 512, 1024, 2048) if args.quick else (64, 256, 384, 512, 768, 1024, 1536, 2048)
    if args.n_past:
        n_pasts = _parse_deltas(args.n_past)
    Ks = (2, 4, 8)
    reps = args.repeats or (3 if args.quick else 7)
    t0 = time.time()
    with _ctx(args) as sc:
        hi = min(260, args.max_schema_tokens)
        case = build_cases(sc, args.tools, 1, max(n_pasts), min_tokens=min(150, hi // 2), max_tokens=hi)[0]
        pre = sc.tokenize(PRELUDE)
        block = sc.compile_block(pre, case.schema)
        S = len(case.schema)
        sc.prefill((pre + case.filler)[:max(n_pasts)], seq=BASE_SEQ)
        cells = []
        for n_past in n_pasts:
            for K in Ks:
                r_pct = recompute_fraction(n_past, K=K)
                # the engine's policy: at R = 100 % a splice + full repair only adds work, so path A
                # prefills the text instead; the "forced" arm still splices, to show what that would cost
                policy = "text" if r_pct >= 100.0 else "splice"
                arms = ("prefill", "splice") + (("forced",) if policy == "text" else ())
                times: dict[str, list[float]] = {a: [] for a in arms}
                for rep in range(reps):
                    order = arms if rep % 2 == 0 else arms[::-1]
                    for arm in order:
                        _start_live(sc, n_past)
                        t = time.perf_counter()
                        if arm == "prefill" or (arm == "splice" and policy == "text"):
                            sc.decode(case.schema + case.query, n_past, LIVE)
                        else:
                            sc.splice(block, n_past, r_pct, schema_tokens=case.schema)
                            sc.decode(case.query, n_past + S, LIVE)
                        sc.logits()
                        times[arm].append((time.perf_counter() - t) * 1e3)
                sc.seq_rm(LIVE)
                pre_ms, spl_ms = times["prefill"], times["splice"]
                mp, ms_ = median(pre_ms), median(spl_ms)
                cell = {"n_past": n_past, "K": K, "recompute_pct": r_pct, "engine_path": policy,
                        "prefill_ms": mp, "splice_ms": ms_, "ratio": mp / ms_ if ms_ else float("nan"),
                        "ci95": list(bootstrap_ratio_ci(pre_ms, spl_ms)),
                        "prefill_ms_ci95": list(bootstrap_median_ci(pre_ms)),
                        "splice_ms_ci95": list(bootstrap_median_ci(spl_ms)),
                        "prefill_raw": pre_ms, "splice_raw": spl_ms}
                if "forced" in times:
                    mf = median(times["forced"])
                    cell.update({"forced_splice_ms": mf, "forced_ratio": mp / mf if mf else float("nan"),
                                 "forced_ci95": list(bootstrap_ratio_ci(pre_ms, times["forced"]))})
                cells.append(cell)
                print(f"n_past={n_past} K={K} R={r_pct:.1f}% [{policy}] prefill {mp:.1f} ms splice {ms_:.1f} ms "
                      f"ratio {mp / ms_:.2f}")
        # the transplant alone (reanchor + state load + seq_cp, no repair) vs prefilling the same block
        n0 = n_pasts[0]
        only_spl, only_pre = [], []
        for rep in range(max(reps, 5)):
            for arm in (("prefill", "splice") if rep % 2 == 0 else ("splice", "prefill")):
                _start_live(sc, n0)
                t = time.perf_counter()
                if arm == "prefill":
                    sc.decode(case.schema, n0, LIVE)
                else:
                    sc.splice(block, n0, 0.0)
                (only_pre if arm == "prefill" else only_spl).append((time.perf_counter() - t) * 1e3)
        sc.seq_rm(LIVE)
        transplant = {"n_past": n0, "block_tokens": S, "splice_ms": median(only_spl),
                      "prefill_ms": median(only_pre), "fraction": median(only_spl) / median(only_pre)}
        print(f"transplant of {S} tokens: {transplant['splice_ms']:.2f} ms vs prefill {transplant['prefill_ms']:.1f} ms "
              f"({100 * transplant['fraction']:.2f} %)")
        report = {"quick": bool(args.quick), "model": Path(sc.model_path).name,
                  "schema": f"{case.server}/{case.name}", "schema_tokens": S, "query_tokens": len(case.query),
                  "repeats": reps, "threads": args.threads,
                  "protocol": "context KV already cached (both arms start from a copy of the same cached "
                              "context cells); prefill arm = decode schema+query; splice arm = native "
                              "reanchor + state load + seq_cp + suffix re-decode of ceil(S*R(n)/100) "
                              "tokens + decode query; time to first-token logits; arms interleaved "
                              "(alternating order) per repeat; ratio = median(prefill)/median(splice), "
                              "ci95 = paired bootstrap of the ratio of medians",
                  "engine_policy": "cells with R(n) = 100 % are served by a text prefill (engine_path 'text'): "
                                    "both arms run the same decode there; forced_* = what a splice + full "
                                    "repair would cost",
                  "transplant": transplant,
                  "cells": cells, "seconds": round(time.time() - t0, 1)}
    _write(report, args.out, plot_ttft)
    return report


def plot_ttft(report: dict[str, Any], path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    for K in sorted({c["K"] for c in report["cells"]}):
        cs = [c for c in report["cells"] if c["K"] == K]
        xs = [c["n_past"] for c in cs]
        ax[0].errorbar(xs, [c["ratio"] for c in cs],
                       yerr=[[c["ratio"] - c["ci95"][0] for c in cs], [c["ci95"][1] - c["ratio"] for c in cs]],
                       marker="o", capsize=3, label=f"K={K}")
        ax[1].plot(xs, [c["splice_ms"] for c in cs], marker="o", label=f"splice K={K}")
    cs = [c for c in report["cells"] if c["K"] == report["cells"][0]["K"]]
    ax[1].plot([c["n_past"] for c in cs], [c["prefill_ms"] for c in cs], "k--", marker="s", label="prefill")
    ax[0].axhline(1.0, color="grey", lw=0.8)
    ax[0].set_xlabel("n_past")
    ax[0].set_ylabel("TTFT speedup prefill/splice (median, 95% CI)")
    ax[0].set_title(f"{report['schema']} ({report['schema_tokens']} tokens)")
    ax[0].legend()
    ax[1].set_xlabel("n_past")
    ax[1].set_ylabel("ms to first-token logits (median)")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------- drift

def run_drift(args) -> dict[str, Any]:
    deltas = (64, 512, 2048) if args.quick else (16, 64, 256, 512, 1024, 2048)
    if args.deltas:
        deltas = tuple(d for d in _parse_deltas(args.deltas) if d > 0)
    n_schemas = args.schemas or (3 if args.quick else 10)
    t0 = time.time()
    with _ctx(args) as sc:
        cases = build_cases(sc, args.tools, n_schemas, max(deltas), max_tokens=args.max_schema_tokens,
                            n_contexts=args.contexts)
        res = run_cases(sc, cases, (0, *deltas), ("bare",), drift=True)
        sc.seq_rm(BASE_SEQ)
        dr = res["drift_rows"]
        kl = {(r["case"], r["n_past"]): r["kl"] for r in res["rows"]}
        for r in dr:
            r["kl_bare"] = kl.get((r["case"], r["n_past"]))
        rhos = [r["rho"] for r in dr if r["rho"] == r["rho"]]
        by_delta = {d: [r["rho"] for r in dr if r["delta_pos"] == d] for d in deltas}
        report = {"quick": bool(args.quick), "model": Path(sc.model_path).name, "n_schemas": len(cases),
                  "deltas": list(deltas), "n_heads": dr[0]["n_heads"] if dr else 0,
                  "protocol": "per (schema, Δpos): true per-head drift = mean over block tokens of the L2 "
                              "distance between the bare (compiled under the prelude, reanchored) keys and "
                              "the keys a text prefill computes under the real context; proxy = per-head "
                              "variance of the preceding context's keys (over tokens, mean over dims); "
                              "Spearman rho over all n_layer x n_head_kv heads",
                  "spearman_rho_mean": float(np.mean(rhos)) if rhos else float("nan"),
                  "spearman_rho_median": float(statistics.median(rhos)) if rhos else float("nan"),
                  "spearman_rho_by_delta": {str(d): float(np.mean(v)) for d, v in by_delta.items() if v},
                  "paper_rho": 0.193, "rows": dr, "seconds": round(time.time() - t0, 1)}
    _write(report, args.out, plot_drift)
    return report


def plot_drift(report: dict[str, Any], path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.2))
    rows = report["rows"]
    ax[0].scatter([r["delta_pos"] for r in rows], [r["rho"] for r in rows], s=14)
    ax[0].axhline(report["paper_rho"], color="red", lw=0.8, label=f"paper ρ = {report['paper_rho']}")
    ax[0].axhline(0, color="grey", lw=0.6)
    ax[0].set_xscale("log")
    ax[0].set_xlabel("Δpos")
    ax[0].set_ylabel("Spearman ρ (context K-variance vs drift)")
    ax[0].set_title(f"mean ρ = {report['spearman_rho_mean']:.3f} over {len(rows)} placements")
    ax[0].legend()
    ax[1].scatter([r["drift_mean"] for r in rows], [r.get("kl_bare") or 0 for r in rows], s=14)
    ax[1].set_xlabel("mean per-head K drift (L2)")
    ax[1].set_ylabel("bare-splice KL, nats")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------- CLI

def _parse_deltas(text: str) -> tuple[int, ...]:
    return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))


def _common(p, default_out: str) -> None:
    p.add_argument("--json", dest="out", default=default_out)
    p.add_argument("--tools", default=DEFAULT_TOOLS, help="directory of MCP registry files")
    p.add_argument("--model", default="", help="GGUF path (default SmolLM2-135M-Instruct)")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=1, help="ggml threads (1 is fastest on a shared 2-core box)")
    p.add_argument("--quick", action="store_true", help="small run (fewer schemas / depths / repeats)")
    p.add_argument("--max-schema-tokens", type=int, default=240, help="skip longer schemas")
    p.add_argument("--contexts", type=int, default=0,
                   help="distinct preceding contexts shared by the schemas (0 = one per schema)")


def add_fidelity_parser(sub) -> None:
    p = sub.add_parser("fidelity", help="splice fidelity: KL / top-1 vs prefill by Δpos and arm")
    _common(p, "reports/splice_fidelity.json")
    p.add_argument("--schemas", type=int, default=0, help="number of schemas (default 12, quick 4)")
    p.add_argument("--K", type=float, default=4, help="R(n) multiple for the suffix/scattered arms")
    p.add_argument("--deltas", default="", help="comma-separated Δpos list (overrides the default)")

    def run(args) -> int:
        rep = run_fidelity(args)
        print(json.dumps({a: [(c["delta_pos"], round(c["kl_mean"], 5), c["top1"]) for c in cells]
                          for a, cells in rep["arms"].items()}))
        return 0

    p.set_defaults(fn=run)


def add_ttft_parser(sub) -> None:
    p = sub.add_parser("ttft", help="TTFT of splice + repair vs prefill by n_past and K")
    _common(p, "reports/splice_ttft.json")
    p.add_argument("--repeats", type=int, default=0, help="repeats per cell (default 7, quick 3)")
    p.add_argument("--n-past", default="", help="comma-separated n_past list (overrides the default)")

    def run(args) -> int:
        rep = run_ttft(args)
        print(json.dumps([(c["n_past"], c["K"], round(c["ratio"], 2)) for c in rep["cells"]]))
        return 0

    p.set_defaults(fn=run)


def add_drift_parser(sub) -> None:
    p = sub.add_parser("drift", help="reference-free drift gate: Spearman ρ of context K-variance vs drift")
    _common(p, "reports/splice_drift.json")
    p.add_argument("--schemas", type=int, default=0, help="number of schemas (default 10, quick 3)")
    p.add_argument("--deltas", default="", help="comma-separated Δpos list (overrides the default)")

    def run(args) -> int:
        rep = run_drift(args)
        print(json.dumps({k: rep[k] for k in ("spearman_rho_mean", "spearman_rho_median", "spearman_rho_by_delta")}))
        return 0

    p.set_defaults(fn=run)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (until wired into `nexus eval`): python -m evals.splice_fidelity fidelity ..."""
    import argparse

    ap = argparse.ArgumentParser(prog="splice_fidelity")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_fidelity_parser(sub)
    add_ttft_parser(sub)
    add_drift_parser(sub)
    args = ap.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    raise SystemExit(main())
