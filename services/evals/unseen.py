"""Routing on tools the router never trained on: ``nexus eval routing --protocol unseen``, the headline figure.

A user's tools are tools the router never saw. So the servers of the registry are split into k folds (default 4)
by a seeded draw balanced by tool count (``server_folds``; github and github-legacy are one family and always share
a fold), and every line of a fold's servers is routed by arms that took nothing from that fold: no line, no
request written for its tools, no threshold chosen on them. Registries are drawn as in the seen protocol (the
target's own server first, then other servers' tools; ``registries_for``), over the whole registry, with
``--draws`` independent draws per size.

Arms (all on the router's INT8 SLB scoring, ``services.router.slb.SemanticIndex``, base all-MiniLM-L6-v2):

* ``dense``: the text keys alone, the untrained baseline every other arm must beat;
* ``derived``: the text keys + each tool's derived requests (services/compiler/derive.py: written by an instruct
  LLM from the tool alone) as exemplar keys, pooled as the router pools them; the weight and pooling temperature
  are chosen, per fold, on the *other* folds' lines at N = 250 (else the largest size);
* ``template``: the same with the template requests of services/router/synth.py instead (no LLM): does the LLM earn
  its place over a rule?

Each arm reports pooled top-1 / top-3 with bootstrap CIs over lines at every size, per server too, and paired
fixed / broken line-draws against ``dense`` with a sign test.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from services.evals.data import QueryLine, Registry, is_correct, load_queries, load_registry, parse_sizes
from services.evals.stats import bootstrap_mean_ci, sign_test

log = logging.getLogger("nexus.evals.unseen")

# servers that are one product family: a model must not see one while being scored on the other
FAMILIES: dict[str, str] = {"github-legacy": "github"}


def server_folds(registry: Registry, k: int = 4, seed: int = 0) -> dict[str, int]:
    """``{server: fold}``: families (``FAMILIES``) are drawn in a seeded order, largest first, each into the fold
    with the fewest tools so far (ties: the lowest fold), so the folds hold about the same number of tools."""
    if k < 2:
        raise ValueError(f"k must be >= 2, got {k}")
    fam: dict[str, list[str]] = {}
    servers = registry.servers()
    for server in servers:
        fam.setdefault(FAMILIES.get(server, server), []).append(server)
    if len(fam) < k:
        raise ValueError(f"{len(fam)} server families cannot fill {k} folds")
    size = {f: sum(len(servers[s]) for s in ss) for f, ss in fam.items()}
    order = sorted(fam)
    random.Random(f"server-folds:{seed}").shuffle(order)
    order.sort(key=lambda f: -size[f])  # stable: the draw orders families of one size
    load = [0] * k
    out: dict[str, int] = {}
    for f in order:
        g = min(range(k), key=lambda i: (load[i], i))
        load[g] += size[f]
        for s in fam[f]:
            out[s] = g
    return out


def template_requests(tools: Sequence[Any], seed: int = 0, per_tool: int = 5) -> dict[str, list[str]]:
    """``{schema hash: requests}`` of services/router/synth.py's templates (no model)."""
    from services.router.synth import synth_examples

    by_tool: dict[str, list[str]] = {}
    for name, q in synth_examples(list(tools), per_tool, seed):
        by_tool.setdefault(name, []).append(q)
    return {t.schema_hash: by_tool.get(t.name, []) for t in tools}


class Scorer:
    """The router's SLB over the whole registry for one arm: text keys, plus exemplar keys (embedded requests per
    tool) pooled with a weight and temperature; ``top3`` ranks within a line's registry mask."""

    def __init__(self, names: Sequence[str], text: np.ndarray, exemplars: Mapping[str, np.ndarray] | None = None,
                 weight: float = 0.0, temperature: float = 0.0):
        from services.router.slb import SemanticIndex

        self.names = list(names)
        self.index = SemanticIndex(text.shape[1], exemplar_weight=weight if exemplars else 0.0,
                                   exemplar_temperature=temperature)
        self.index.replace_all({n: text[i] for i, n in enumerate(self.names)}, exemplars=exemplars or {})
        self.pos = {n: i for i, n in enumerate(self.names)}

    def top3(self, qvec: np.ndarray, registry: Sequence[str]) -> list[str]:
        mask = np.zeros(len(self.names), bool)
        mask[[self.pos[n] for n in registry]] = True
        return [n for n, _ in self.index.search(qvec, 3, allowed=mask)]


def _hits(scorer: Scorer, qv: np.ndarray, lines: Sequence[QueryLine], idxs: Sequence[int],
          regs: Sequence[Mapping[str, list[list[str]]]], size: str) -> dict[str, tuple[bool, bool]]:
    """``{"<line id>#<draw>": (top-1 right, top-3 right)}`` for lines ``idxs`` at ``size``."""
    out = {}
    for d, r in enumerate(regs):
        for i in idxs:
            top = scorer.top3(qv[i], r[size][i])
            ln = lines[i]
            out[f"{ln.id}#{d}"] = (is_correct(top[0], ln.tool), any(is_correct(n, ln.tool) for n in top))
    return out


def choose_pooling(names: Sequence[str], text: np.ndarray, exemplars: Mapping[str, np.ndarray], qv: np.ndarray,
                   lines: Sequence[QueryLine], idxs: Sequence[int], regs: Sequence[Mapping[str, list[list[str]]]],
                   size: str, weights: Sequence[float], temperatures: Sequence[float]) -> dict[str, Any]:
    """The (weight, temperature) of the best top-1 on lines ``idxs`` (the other folds' lines) at ``size``, the
    first draw; ties: the smaller weight, then the smaller temperature."""
    grid = {}
    for w in weights:
        for t in temperatures:
            h = _hits(Scorer(names, text, exemplars, w, t), qv, lines, idxs, regs[:1], size)
            grid[f"{w}/{t}"] = float(np.mean([a for a, _ in h.values()])) if h else 0.0
    best = max(grid, key=lambda k: (grid[k], -float(k.split("/")[0]), -float(k.split("/")[1])))
    w, t = (float(x) for x in best.split("/"))
    return {"weight": w, "temperature": t, "choosing_top1": grid[best], "grid": grid}


def summarize_arm(hits: Mapping[str, tuple[bool, bool]], lines_by_id: Mapping[str, QueryLine]) -> dict[str, Any]:
    """Pooled top-1 / top-3 over line-draws, CIs by bootstrap over lines of each line's mean over its draws."""
    per_line: dict[str, list[tuple[bool, bool]]] = {}
    for key, h in hits.items():
        per_line.setdefault(key.rsplit("#", 1)[0], []).append(h)
    m1 = [float(np.mean([a for a, _ in v])) for v in per_line.values()]
    m3 = [float(np.mean([b for _, b in v])) for v in per_line.values()]
    out: dict[str, Any] = {"n_lines": len(per_line), "n_line_draws": len(hits),
                           "top1": float(np.mean([a for a, _ in hits.values()])) if hits else None,
                           "top1_ci95": list(bootstrap_mean_ci(m1)) if m1 else None,
                           "top3": float(np.mean([b for _, b in hits.values()])) if hits else None,
                           "top3_ci95": list(bootstrap_mean_ci(m3)) if m3 else None}
    by_server: dict[str, list[bool]] = {}
    for key, (a, _) in hits.items():
        by_server.setdefault(lines_by_id[key.rsplit("#", 1)[0]].server, []).append(a)
    out["top1_by_server"] = {s: {"n": len(v), "top1": float(np.mean(v))} for s, v in sorted(by_server.items())}
    return out


def paired(hits: Mapping[str, tuple[bool, bool]], base: Mapping[str, tuple[bool, bool]]) -> dict[str, Any]:
    fixed = sum(1 for k, (a, _) in hits.items() if a and not base[k][0])
    broken = sum(1 for k, (a, _) in hits.items() if not a and base[k][0])
    return {"fixed": fixed, "broken": broken, "sign_test_p": sign_test(fixed, broken)}


def evaluate(queries: str, tools: str, out_json: str, *, sizes: str = "10,50,100,250,all", k: int = 4,
             seed: int = 0, draws: int = 3, derived: str = "", weights: Sequence[float] = (0.5, 1.0, 2.0, 5.0),
             temperatures: Sequence[float] = (0.0, 0.05, 0.2), choose_size: str = "",
             progress: bool = True) -> dict[str, Any]:
    """Run the unseen-tools protocol (module docstring) and write the report JSON + PNG; returns the report."""
    from services.common.embedder import Embedder, tool_text
    from services.evals.routing import registries_for
    from services.router.router import routing_text

    t0 = time.time()
    registry = load_registry(tools)
    known = set(registry.names)
    lines = [ln for ln in load_queries(queries) if ln.tool in known]
    lines = [ln if ln.server else QueryLine(**{**ln.__dict__, "server": registry.server_of[ln.tool]}) for ln in lines]
    size_list = parse_sizes(sizes)
    choose_size = choose_size or ("250" if "250" in size_list else size_list[-1])
    if choose_size not in size_list:
        raise ValueError(f"the choosing size {choose_size} is not among the sizes {size_list}")
    folds = server_folds(registry, k, seed)
    regs = [registries_for(lines, size_list, registry, seed, d) for d in range(draws)]
    emb = Embedder("")
    names = list(registry.names)
    by_name = registry.by_name()
    text = emb.embed([tool_text(by_name[n]) for n in names])
    qv = emb.embed([routing_text(ln.query, list(ln.history)) for ln in lines])

    def keys_of(reqs_by_hash: Mapping[str, list[str]]) -> dict[str, np.ndarray]:
        texts = [(n, r) for n in names for r in reqs_by_hash.get(by_name[n].schema_hash, [])]
        mat = emb.embed([r for _, r in texts])
        out: dict[str, list[np.ndarray]] = {}
        for (n, _), v in zip(texts, mat, strict=True):
            out.setdefault(n, []).append(v)
        return {n: np.vstack(v) for n, v in out.items()}

    arm_keys: dict[str, dict[str, np.ndarray]] = {"template": keys_of(template_requests(registry.tools, seed))}
    derived_info: dict[str, Any] = {}
    if derived:
        from services.compiler.derive import read_requests_file

        header, reqs = read_requests_file(derived)
        missing = [n for n in names if by_name[n].schema_hash not in reqs]
        if missing:
            raise ValueError(f"{derived} has no derived requests for {len(missing)} tools (e.g. {missing[0]}): "
                             f"complete it with `nexus derive --tools {tools} --out {derived}`")
        arm_keys["derived"] = keys_of(reqs)
        derived_info = {"file": derived, "generator": header,
                        "requests_per_tool": float(np.mean([len(reqs[by_name[n].schema_hash]) for n in names]))}
    fold_of_line = [folds[ln.server] for ln in lines]
    hits: dict[str, dict[str, dict[str, tuple[bool, bool]]]] = {a: {s: {} for s in size_list}
                                                               for a in ["dense", *arm_keys]}
    chosen: dict[str, dict[str, Any]] = {a: {} for a in arm_keys}
    dense = Scorer(names, text)
    from tqdm import tqdm

    bar = tqdm(total=k * len(size_list) * (1 + len(arm_keys)), desc="unseen protocol", file=sys.stderr,
               disable=not progress)
    for f in range(k):
        held = [i for i, g in enumerate(fold_of_line) if g == f]
        other = [i for i, g in enumerate(fold_of_line) if g != f]
        for s in size_list:
            hits["dense"][s].update(_hits(dense, qv, lines, held, regs, s))
            bar.update(1)
        for arm, ex in arm_keys.items():
            c = choose_pooling(names, text, ex, qv, lines, other, regs, choose_size, weights, temperatures)
            chosen[arm][str(f)] = c
            scorer = Scorer(names, text, ex, c["weight"], c["temperature"])
            for s in size_list:
                hits[arm][s].update(_hits(scorer, qv, lines, held, regs, s))
                bar.update(1)
    bar.close()
    by_id = {ln.id: ln for ln in lines}
    report: dict[str, Any] = {
        "protocol": {"name": "unseen", "k": k, "seed": seed, "draws": draws, "sizes": size_list,
                     "folds": {str(g): sorted(s for s, x in folds.items() if x == g) for g in range(k)},
                     "fold_tools": {str(g): sum(len(registry.servers()[s]) for s, x in folds.items() if x == g)
                                    for g in range(k)},
                     "lines": len(lines), "queries": queries, "tools": tools, "choose_size": choose_size,
                     "weights": list(weights), "temperatures": list(temperatures),
                     "embedder": "all-MiniLM-L6-v2 (base), INT8 SLB"},
        "arms": {a: {s: summarize_arm(hits[a][s], by_id) for s in size_list} for a in hits},
        "paired_vs_dense": {a: {s: paired(hits[a][s], hits["dense"][s]) for s in size_list} for a in arm_keys},
        "chosen_pooling": chosen,
        "derived": derived_info,
        "seconds": round(time.time() - t0, 1),
    }
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(report, indent=2, sort_keys=True))
    plot(report, str(Path(out_json).with_suffix(".png")))
    return report


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["protocol"]["sizes"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric in zip(axes, ("top1", "top3"), strict=True):
        for arm, by_size in report["arms"].items():
            y = [100 * by_size[s][metric] for s in sizes]
            lo = [100 * by_size[s][f"{metric}_ci95"][0] for s in sizes]
            hi = [100 * by_size[s][f"{metric}_ci95"][1] for s in sizes]
            ax.plot(sizes, y, marker="o", label=arm)
            ax.fill_between(sizes, lo, hi, alpha=0.15)
        ax.axhline(85 if metric == "top1" else 95, color="grey", ls=":", lw=1, label="target")
        ax.set_xlabel("registry size N")
        ax.set_ylabel(f"{metric} %")
        ax.set_title(f"unseen tools: {metric}")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"k = {report['protocol']['k']} folds by server, {report['protocol']['lines']} lines x "
                 f"{report['protocol']['draws']} draws")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
