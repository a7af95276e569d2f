"""Routing on tools the router never trained on: ``nexus eval routing --protocol unseen``, the headline figure.

A user's tools are tools the router never saw. So the servers of the registry are split into k folds (default 4)
by a seeded draw balanced by tool count (``server_folds``; github and github-legacy are one family and always share
a fold), and every line of a fold's servers is routed by arms that took nothing from that fold: no line, no
request written for its tools, no threshold chosen on them. Registries are drawn as in the seen protocol (the
target's own server first, then other servers' tools; ``registries_for``), over the whole registry, with
``--draws`` independent draws per size.

Arms (all on the router's INT8 SLB scoring, ``services.router.slb.SemanticIndex``, base all-MiniLM-L6-v2 unless
``--embedder``):

* ``dense``: the text keys alone, the untrained baseline every other arm must beat;
* ``derived``: the text keys + each tool's derived requests (services/compiler/derive.py: written by an instruct
  LLM from the tool alone) as exemplar keys, pooled as the router pools them; the weight and pooling temperature
  are chosen, per fold, on the *other* folds' lines at N = 250 (else the largest size);
* ``template``: the same with the template requests of training/synth.py instead (no LLM): does the LLM earn
  its place over a rule?
* ``lexical``, ``alt_key``, ``alt_key+lexical``: the BM25 addend (weight chosen on the other folds) and the router's
  alternate key (services/router/keys.py); ``alt_key+lexical(derived doc)``: the same with each tool's derived
  requests appended to its BM25 document (doc2query as its authors used it: document expansion for lexical search);
* with ``--gate-arm`` (the default), ``gate``, ``gate+lexical`` and ``gate+derived``: each fold's gate model trained
  as production from nothing of its servers, routing through the real router (``_gate_arms``).

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

from evals.stats import bootstrap_mean_ci, sign_test
from training.data import QueryLine, Registry, is_correct, load_queries, load_registry, parse_sizes

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
    """``{schema hash: requests}`` of training/synth.py's templates (no model)."""
    from training.synth import synth_examples

    by_tool: dict[str, list[str]] = {}
    for name, q in synth_examples(list(tools), per_tool, seed):
        by_tool.setdefault(name, []).append(q)
    return {t.schema_hash: by_tool.get(t.name, []) for t in tools}


class Scorer:
    """The router's SLB over the whole registry for one arm: text keys, plus exemplar keys (embedded requests per
    tool) pooled with a weight and temperature; ``top3`` ranks within a line's registry mask."""

    def __init__(self, names: Sequence[str], text: np.ndarray, exemplars: Mapping[str, np.ndarray] | None = None,
                 weight: float = 0.0, temperature: float = 0.0, alt: Mapping[str, np.ndarray] | None = None,
                 lexical: np.ndarray | None = None, lexical_weight: float = 0.0):
        """``alt``: a second key per tool (the tool scores the max of the two, as the router's alternate keys);
        ``lexical``: per line (rows, in line order) the BM25 score of every tool (``names`` order), added times
        ``lexical_weight``."""
        from services.router.slb import SemanticIndex

        self.names = list(names)
        self.index = SemanticIndex(text.shape[1], exemplar_weight=weight if exemplars else 0.0,
                                   exemplar_temperature=temperature)
        if alt:
            self.index.set_alt_keys(alt)
        self.index.replace_all({n: text[i] for i, n in enumerate(self.names)}, exemplars=exemplars or {})
        self.pos = {n: i for i, n in enumerate(self.names)}
        self.lexical = lexical if lexical_weight > 0 else None
        self.lexical_weight = np.float32(lexical_weight)

    def top3(self, qvec: np.ndarray, registry: Sequence[str], line: int = -1) -> list[str]:
        mask = np.zeros(len(self.names), bool)
        mask[[self.pos[n] for n in registry]] = True
        bonus = self.lexical_weight * self.lexical[line] if self.lexical is not None else None
        return [n for n, _ in self.index.search(qvec, 3, allowed=mask, bonus=bonus)]


def _hits(scorer: Scorer, qv: np.ndarray, lines: Sequence[QueryLine], idxs: Sequence[int],
          regs: Sequence[Mapping[str, list[list[str]]]], size: str) -> dict[str, tuple[bool, bool]]:
    """``{"<line id>#<draw>": (top-1 right, top-3 right)}`` for lines ``idxs`` at ``size``."""
    out = {}
    for d, r in enumerate(regs):
        for i in idxs:
            top = scorer.top3(qv[i], r[size][i], i)
            ln = lines[i]
            out[f"{ln.id}#{d}"] = (is_correct(top[0], ln.tool), any(is_correct(n, ln.tool) for n in top))
    return out


def choose(build, grid: Sequence[dict[str, float]], qv: np.ndarray, lines: Sequence[QueryLine],
           idxs: Sequence[int], regs: Sequence[Mapping[str, list[list[str]]]], size: str) -> dict[str, Any]:
    """The setting of ``grid`` whose scorer (``build(**setting)``) has the best top-1 on lines ``idxs`` (the other
    folds' lines) at ``size``, the first draw; ties: the first in grid order (the grids go from weak to strong)."""
    scores = []
    for setting in grid:
        h = _hits(build(**setting), qv, lines, idxs, regs[:1], size)
        scores.append(float(np.mean([a for a, _ in h.values()])) if h else 0.0)
    best = int(np.argmax(scores))
    return {"setting": dict(grid[best]), "choosing_top1": scores[best],
            "grid": [{**g, "top1": sc} for g, sc in zip(grid, scores, strict=True)]}


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


DERIVED_PAIRS = (("derived", "dense"), ("derived+alt+lexical", "alt_key+lexical"),
                 ("alt_key+lexical(derived doc)", "alt_key+lexical"), ("gate+derived", "gate"))


def evaluate(queries: str, tools: str, out_json: str, *, sizes: str = "10,50,100,250,all", k: int = 4,
             seed: int = 0, draws: int = 3, derived: str = "",
             weights: Sequence[float] = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
             temperatures: Sequence[float] = (0.0, 0.05, 0.2), choose_size: str = "",
             progress: bool = True, gate: bool = False, augment: str = "", calibration: str = "",
             models_root: str = "var/models", hp: Any = None, embedder: str = "") -> dict[str, Any]:
    """Run the unseen-tools protocol (module docstring) and write the report JSON + PNG; returns the report.
    ``embedder``: the sentence-transformers directory the untrained arms embed with ('' = all-MiniLM-L6-v2)."""
    from evals.routing import registries_for
    from services.common.embedder import Embedder, tool_text
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
    emb = Embedder(embedder)
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

    from services.router.keys import LexicalIndex, alt_tool_text, query_part

    alt_mat = emb.embed([alt_tool_text(by_name[n]) for n in names])
    alt = {n: alt_mat[i] for i, n in enumerate(names)}
    lex_index = LexicalIndex.of_tools([by_name[n] for n in names])
    lexical = np.vstack([lex_index.scores(query_part(routing_text(ln.query, list(ln.history)))) for ln in lines])
    pooling = [{"weight": w, "temperature": t} for w in weights for t in temperatures]
    lex_grid = [{"lexical_weight": x} for x in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)]
    # each arm: the grid its setting is chosen from (on the other folds' lines) and how it scores
    arms: dict[str, tuple[list[dict[str, float]], Any]] = {
        "dense": ([{}], lambda: Scorer(names, text)),
        "alt_key": ([{}], lambda: Scorer(names, text, alt=alt)),
        "lexical": (lex_grid, lambda lexical_weight: Scorer(names, text, lexical=lexical,
                                                            lexical_weight=lexical_weight)),
        "alt_key+lexical": (lex_grid, lambda lexical_weight: Scorer(names, text, alt=alt, lexical=lexical,
                                                                    lexical_weight=lexical_weight)),
    }
    template = keys_of(template_requests(registry.tools, seed))
    arms["template"] = (pooling, lambda weight, temperature: Scorer(names, text, template, weight, temperature))
    derived_info: dict[str, Any] = {}
    if derived:
        from services.compiler.derive import read_requests_file

        header, reqs = read_requests_file(derived)
        missing = [n for n in names if by_name[n].schema_hash not in reqs]
        if missing:
            raise ValueError(f"{derived} has no derived requests for {len(missing)} tools (e.g. {missing[0]}): "
                             f"complete it with `nexus derive --tools {tools} --out {derived}`")
        dkeys = keys_of(reqs)
        arms["derived"] = (pooling, lambda weight, temperature: Scorer(names, text, dkeys, weight, temperature))
        arms["derived+alt+lexical"] = (
            [{**p, **x} for p in pooling for x in lex_grid],
            lambda weight, temperature, lexical_weight: Scorer(names, text, dkeys, weight, temperature, alt=alt,
                                                               lexical=lexical, lexical_weight=lexical_weight))
        # doc2query proper: the derived requests' words join the tool's BM25 document (not its dense keys)
        from services.router.keys import lexical_doc, tokens

        lex_d = LexicalIndex([lexical_doc(by_name[n]) + tokens(" ".join(reqs.get(by_name[n].schema_hash, [])))
                              for n in names])
        lexical_d = np.vstack([lex_d.scores(query_part(routing_text(ln.query, list(ln.history)))) for ln in lines])
        arms["alt_key+lexical(derived doc)"] = (
            lex_grid, lambda lexical_weight: Scorer(names, text, alt=alt, lexical=lexical_d,
                                                    lexical_weight=lexical_weight))
        derived_info = {"file": derived, "generator": header,
                        "requests_per_tool": float(np.mean([len(reqs[by_name[n].schema_hash]) for n in names]))}
    fold_of_line = [folds[ln.server] for ln in lines]
    hits: dict[str, dict[str, dict[str, tuple[bool, bool]]]] = {a: {s: {} for s in size_list} for a in arms}
    chosen: dict[str, dict[str, Any]] = {a: {} for a in arms}
    from tqdm import tqdm

    bar = tqdm(total=k * len(arms), desc="unseen protocol", unit="fold-arm", file=sys.stderr, disable=not progress)
    for f in range(k):
        held = [i for i, g in enumerate(fold_of_line) if g == f]
        other = [i for i, g in enumerate(fold_of_line) if g != f]
        for arm, (grid, build) in arms.items():
            c = choose(build, grid, qv, lines, other, regs, choose_size) if len(grid) > 1 else {"setting": {}}
            chosen[arm][str(f)] = c
            scorer = build(**c["setting"])
            for s in size_list:
                hits[arm][s].update(_hits(scorer, qv, lines, held, regs, s))
            bar.update(1)
    bar.close()
    gate_meta: list[dict[str, Any]] = []
    if gate:
        gate_meta = _gate_arms(hits, registry, lines, folds, regs, size_list, seed, augment, calibration,
                               models_root, derived, progress, hp, choose_size)
    by_id = {ln.id: ln for ln in lines}
    report: dict[str, Any] = {
        "protocol": {"name": "unseen", "k": k, "seed": seed, "draws": draws, "sizes": size_list,
                     "folds": {str(g): sorted(s for s, x in folds.items() if x == g) for g in range(k)},
                     "fold_tools": {str(g): sum(len(registry.servers()[s]) for s, x in folds.items() if x == g)
                                    for g in range(k)},
                     "lines": len(lines), "queries": queries, "tools": tools, "choose_size": choose_size,
                     "weights": list(weights), "temperatures": list(temperatures),
                     "embedder": embedder or "all-MiniLM-L6-v2 (base)", "gate_arms": gate,
                     "derived": bool(derived)},
        "arms": {a: {s: summarize_arm(hits[a][s], by_id) for s in size_list} for a in hits},
        "paired_vs_dense": {a: {s: paired(hits[a][s], hits["dense"][s]) for s in size_list} for a in hits
                            if a != "dense"},
        # what the derived requests add over the same arm without them
        "paired_derived": {f"{a} vs {b}": {s: paired(hits[a][s], hits[b][s]) for s in size_list}
                           for a, b in DERIVED_PAIRS if a in hits and b in hits},
        "chosen": chosen,
        "derived": derived_info,
        "gate_folds": gate_meta,
        "seconds": round(time.time() - t0, 1),
    }
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(report, indent=2, sort_keys=True))
    plot(report, str(Path(out_json).with_suffix(".png")))
    return report


def fold_gate(f: int, registry: Registry, lines: Sequence[QueryLine], folds: Mapping[str, int], seed: int,
              augment: str, calibration: str, models_root: str, progress: bool, hp: Any = None) -> Any:
    """The gate model of fold ``f`` as production trains it (training/gate.py, its default
    hyper-parameters unless ``hp``) from nothing of the fold's servers: their tools are not in its registry, and none of their
    lines (real, augment, calibration) reaches it; cached under ``models_root`` by its data hash."""
    from evals.routing_models import load_augment, train_cached
    from training.gate import GateHyperParams

    held = {s for s, g in folds.items() if g == f}
    sub = registry.subset([n for n in registry.names if registry.server_of[n] not in held])
    keep = set(sub.names)
    train = [ln for ln in lines if ln.tool in keep]
    extra = [ln for ln in load_augment(augment) if ln.tool in keep]
    calib = [ln for ln in load_augment(calibration) if ln.tool in keep]
    return train_cached(train, sub, hp or GateHyperParams(seed=seed), models_root, progress=progress,
                        label=f"unseen fold {f} (without {', '.join(sorted(held))})", extra=extra, calibration=calib)


LEXICAL_GATE_GRID = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5)


def _gate_arms(hits, registry: Registry, lines: Sequence[QueryLine], folds: Mapping[str, int], regs,
               size_list: Sequence[str], seed: int, augment: str, calibration: str, models_root: str, derived: str,
               progress: bool, hp: Any = None, choose_size: str = "250") -> list[dict[str, Any]]:
    """The arms of each fold's gate model (``fold_gate``), through the real router without a second stage:

    * ``gate``: the production SLB (fine-tuned query encoder, the trained tools' exemplar keys and biases, the
      model's own lexical weight);
    * ``gate+lexical``: the same with the BM25 weight ``RouterConfig.lexical_weight`` chosen for fold f on the
      other folds, each routed by its own model (nested: no line of f, and no line a choosing model trained on);
    * with ``derived``, ``gate+derived``: the router reading every untrained tool's derived requests from the
      store, as in production."""
    import asyncio
    import tempfile

    from evals.routing import route_lines
    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.router.config import RouterConfig
    from services.router.router import Router

    header, reqs = ({}, {})
    if derived:
        from services.compiler.derive import derived_key, encode_derived, read_requests_file

        header, reqs = read_requests_file(derived)
    k = max(folds.values()) + 1
    all_regs = {(s, d): r[s] for d, r in enumerate(regs) for s in size_list}
    fold_of_line = [folds[ln.server] for ln in lines]
    idxs = {f: [i for i, g in enumerate(fold_of_line) if g == f] for f in range(k)}
    embedder = Embedder("")
    gdirs = [fold_gate(f, registry, lines, folds, seed, augment, calibration, models_root, progress, hp)
             for f in range(k)]
    meta = []
    with tempfile.TemporaryDirectory(prefix="nexus-unseen-store-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(registry.tools))
        if derived:
            for t in registry.tools:
                store.put(derived_key(t, header["fingerprint"]), encode_derived(t, reqs.get(t.schema_hash, []),
                                                                                header))

        def router(f: int, derived_keys: bool = False, lexical_weight: float = -1.0) -> Router:
            cfg = RouterConfig(store_url=tmp, gate_model_dir=str(gdirs[f]), torch_threads=1,
                               derived_keys=derived_keys, derived_fingerprint=header.get("fingerprint", ""),
                               lexical_weight=lexical_weight)
            r = Router(cfg, store, embedder)
            asyncio.run(r.sync(force=True))
            if r.gate is None:
                raise RuntimeError(f"gate model {gdirs[f]} did not load")
            return r

        def route(arm: str, r: Router, f: int) -> None:
            for (s, d), recs in route_lines(r, lines, all_regs, idxs[f]).items():
                for rec in recs:
                    hits.setdefault(arm, {x: {} for x in size_list})[s][f"{rec['id']}#{d}"] = (rec["correct"],
                                                                                             rec["slb_top3"])

        # each fold model's top-1 on its own (unseen) lines at every lexical weight, at the choosing size
        choose_regs = {(choose_size, 0): regs[0][choose_size]}
        by_weight: dict[int, dict[float, float]] = {}
        for f in range(k):
            by_weight[f] = {}
            for lw in LEXICAL_GATE_GRID:
                recs = route_lines(router(f, lexical_weight=lw), lines, choose_regs, idxs[f])[(choose_size, 0)]
                by_weight[f][lw] = float(np.mean([r["correct"] for r in recs]))
        for f in range(k):
            r = router(f)
            route("gate", r, f)
            m = r.gate.info.meta
            others = [g for g in range(k) if g != f]
            lw = max(LEXICAL_GATE_GRID, key=lambda x: (np.mean([by_weight[g][x] for g in others]), -x))
            route("gate+lexical", router(f, lexical_weight=lw), f)
            if derived:
                route("gate+derived", router(f, derived_keys=True), f)
            meta.append({"fold": f, "model": str(gdirs[f]), "n_tools": m["n_tools"], "n_fit": m["n_fit"],
                         "train_seconds": m["train_seconds"], "lexical_weight_chosen": lw,
                         "own_top1_by_lexical_weight": {str(x): v for x, v in by_weight[f].items()},
                         "slb": {x: (m.get("slb") or {}).get(x) for x in ("exemplar_weight", "exemplar_temperature",
                                                                          "exemplar_gap", "tool_bias_mu", "alt_keys",
                                                                          "lexical_weight")}})
    return meta


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
