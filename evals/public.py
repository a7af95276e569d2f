"""The public protocol: the shipped registry as unseen tools for an encoder trained on public tools only (issue 50).

    nexus eval routing --protocol public --encoder ~/.cache/nexus/models/encoder --gate var/models/gate \
        --json reports/routing_public.json                                            (make eval-public, minutes)

An encoder from ``training/public.py`` never saw a shipped tool or request, so every one of the 962
requests of data/queries/train.jsonl is a request over unseen tools for it: one model, no folds. Each request is
routed over registries drawn as the evaluation draws them (``evals.routing.registries_for``: its gold tool,
its own server's tools first, then other servers' tools at random; N = 10, 50, 100, 250, all; ``--draws`` draws),
and scored on the exact tool name (the registry's equivalence groups count as one, ``training.data``).

Arms, all in one run over the same registries, every tool embedded as ``training.public.tool_doc``:

* ``base dense`` / ``public dense`` (unseen): cosine between the request and the tool document, with the wheel's
  all-MiniLM-L6-v2 / the public-trained encoder;
* ``... + bm25`` (unseen): the same + 0.3 x BM25 (``services.router.keys.LexicalIndex`` over the registry's tools,
  the request's query part) divided by the best BM25 score in the request's drawn registry;
* ``... + exemplar keys`` (SEEN: labelled so): each shipped tool is also keyed by its hand-written requests of the
  same file, a tool scoring the max cosine over its document and its requests; the request being scored is never
  a key (nor any request of identical text): leave-the-request-out. This is the "seen protocol with exemplar keys"
  of the issue: the shipped tools' requests are data a user may supply for their own tools, not a trained-on tool.
  Caveat: the file's requests for one server share entities and wording (``session:user:4821`` under redis get,
  set and list), so a sibling tool's request is often nearer than the tool's own remaining one or two: with max
  pooling these arms fall below dense (of the public encoder's 572 top-1 errors at N = all, 541 are won by another
  tool's request key, 489 by a tool of the same server);
* ``..., new requests`` (with ``--new-queries``, default data/routing_calibration: requests written apart from the
  query file, never keys): dense, and keyed by every request of the query file (seen), the issue's "shipped tools,
  new requests, exemplar keys on".

* ``... + derived keys`` / ``... + derived centroid`` (unseen, with ``--derived``, default data/derived/requests.jsonl):
  each tool also keyed by the requests the derive generator (services/compiler/derive.py, an instruct model reading
  the tool's schema alone) wrote for it, what a user's tool gets at registration with derived keys on: scored by
  the max cosine over its document and its derived requests (Re-Invoke), or by the cosine to the mean of their
  vectors (Tool2Vec). No hand-written request is a key, so these stay unseen-tools figures.

* ``public + cross-encoder`` (unseen, with ``--cross-encoder``): the second stage trained on Seal-Tools only
  (``training.public_ce``) re-ranks the public encoder's best ``top_k``: cosine + alpha x its logit, alpha chosen on
  Seal's validation requests; ``... alone``: its logit alone orders them.

* ``router (..., tools as new)`` (with ``--gate``): the production router (services/router, the gate model's INT8
  graph, its calibrated alternate key and lexical weight, the SLB scan) with no exemplar key and no tool bias: every
  shipped tool scored as a user's newly registered tool is. Labelled unseen when the gate model's encoder never
  trained on the registry's lines (built on the public encoder with q_epochs 0), else seen (today's fine-tuned
  models trained on train.jsonl).

Per arm and size: top-1 and top-3 with Wilson 95 % intervals over the line-draws (at N = all every draw is the
same registry, so one draw counts), and the bootstrap interval over lines (a line's draws are not independent
trials, so that one is the honest width); top-1 per server; fixed/broken line-draws against the base arm of the same
scoring with a sign test. Written: JSON + PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ENCODER = Path.home() / ".cache" / "nexus" / "models" / "encoder"
LEXICAL_WEIGHT = 0.3


def encode(path: str, texts: Sequence[str], batch_size: int = 64) -> tuple[np.ndarray, dict[str, Any]]:
    """Unit-norm vectors of ``texts`` with the sentence-transformers directory ``path`` ('' = the wheel's MiniLM)."""
    from sentence_transformers import SentenceTransformer

    from services.common.models import resolve_embedder

    p = resolve_embedder(path)
    model = SentenceTransformer(str(p), device="cpu")
    t0 = time.time()
    vecs = model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                        show_progress_bar=False)
    info = {"path": str(p), "max_seq_length": int(model.max_seq_length), "encode_seconds": round(time.time() - t0, 1)}
    meta = p / "public_meta.json"
    if meta.is_file():
        info["public_meta"] = json.loads(meta.read_text())
    return np.ascontiguousarray(vecs, np.float32), info


def exemplar_scores(qv: np.ndarray, texts: Sequence[str], tool_of_line: Sequence[int], n_tools: int,
                    keys: tuple[np.ndarray, Sequence[str], Sequence[int]] | None = None) -> np.ndarray:
    """``(lines, tools)``: each tool's best cosine over its request keys, never counting a key of the same text as
    the scored request. The keys are the scored requests themselves (``qv``, ``texts``, ``tool_of_line``: each
    request left out of its own keys) unless ``keys`` = (vectors, texts, tool of each) is given; -inf where a tool has
    no key left."""
    kv, ktexts, ktool = keys if keys is not None else (qv, texts, tool_of_line)
    sim = qv @ kv.T
    sim[np.asarray(texts, dtype=object)[:, None] == np.asarray(ktexts, dtype=object)[None, :]] = -np.inf
    out = np.full((len(qv), n_tools), -np.inf, np.float32)
    tol = np.asarray(ktool)
    for t in np.unique(tol):
        out[:, t] = sim[:, tol == t].max(1)
    return out


def derived_keys(path: str, names: Sequence[str], by_name: Mapping[str, Any]) -> tuple[list[str], list[int]]:
    """The derived requests of ``path`` for the registry's tools (a row whose schema hash is not the registered
    tool's, or whose tool is not registered, keys nothing) and the tool index of each."""
    from services.compiler.derive import read_requests_file

    pos = {by_name[n].schema_hash: i for i, n in enumerate(names)}
    _, rows = read_requests_file(path)
    texts, tool = [], []
    for h, reqs in rows.items():
        if h in pos:
            texts += reqs
            tool += [pos[h]] * len(reqs)
    return texts, tool


def centroid_scores(qv: np.ndarray, dv: np.ndarray, kv: np.ndarray, ktool: Sequence[int]) -> np.ndarray:
    """``(lines, tools)``: the cosine to the unit mean of each tool's document vector and its key vectors."""
    sums = dv.astype(np.float64).copy()
    np.add.at(sums, np.asarray(ktool, np.int64), kv)
    cent = sums / np.linalg.norm(sums, axis=1, keepdims=True)
    return (qv @ cent.T.astype(np.float32)).astype(np.float32)


def rank_hits(scores: np.ndarray, lex: np.ndarray | None, weight: float, lines, regs_by_draw, size: str,
              pos: Mapping[str, int], names: Sequence[str], rerank=None) -> dict[str, tuple[bool, bool]]:
    """``{"<line id>#<draw>": (top-1 right, top-3 right)}``: each line ranked within its drawn registry, scored
    ``scores`` (+ ``weight`` x BM25 scaled by the registry's best BM25 score when ``lex``); ``rerank(line index,
    tool indices, their scores) -> new scores`` re-orders the best ``rerank.top_k`` (a second stage)."""
    from training.data import is_correct

    out = {}
    draws = regs_by_draw[:1] if size == "all" else regs_by_draw  # every draw of "all" is the whole registry
    for d, regs in enumerate(draws):
        for i, ln in enumerate(lines):
            idx = np.fromiter((pos[n] for n in regs[size][i]), np.int64)
            s = scores[i, idx].astype(np.float64)
            if lex is not None and weight:
                lx = lex[i, idx]
                m = float(lx.max())
                if m > 0:
                    s = s + weight * lx / m
            order = np.argsort(-s, kind="stable")
            if rerank is not None:
                head = order[: rerank.top_k]
                fused = rerank(i, idx[head], s[head])
                order = np.concatenate([head[np.argsort(-fused, kind="stable")], order[rerank.top_k:]])
            top = idx[order[:3]]
            got = [names[j] for j in top]
            out[f"{ln.id}#{d}"] = (is_correct(got[0], ln.tool), any(is_correct(n, ln.tool) for n in got))
    return out


class CrossEncoderStage:
    """The public cross-encoder (``training.public_ce``) as a second stage: ``alpha`` x its logit for (request, tool
    document) added to the first stage's score of each of the ``top_k`` candidates; logits cached per (line, tool)
    since the registries of every size and draw share most candidates."""

    def __init__(self, path: str | Path, docs: Sequence[str]):
        from sentence_transformers import CrossEncoder

        meta = json.loads((Path(path) / "public_ce.json").read_text())
        self.meta = {k: meta[k] for k in ("recipe", "alpha", "top_k", "max_len", "val_encoder_top1",
                                          "val_rerank_top1", "val_ce_only_top1", "data_hash")}
        self.alpha, self.top_k = float(meta["alpha"]), int(meta["top_k"])
        self.model = CrossEncoder(str(Path(path) / "cross_encoder"), max_length=int(meta["max_len"]), device="cpu")
        self.docs = docs
        self.cache: dict[tuple[str, int, int], float] = {}
        self.pairs_scored = 0

    def logits(self, key: str, i: int, text: str, tools: np.ndarray) -> np.ndarray:
        import torch

        todo = [int(j) for j in tools if (key, i, int(j)) not in self.cache]
        if todo:
            got = self.model.predict([(text, self.docs[j]) for j in todo], activation_fn=torch.nn.Identity(),
                                     batch_size=32, show_progress_bar=False)
            self.pairs_scored += len(todo)
            for j, v in zip(todo, np.atleast_1d(got), strict=True):
                self.cache[(key, i, j)] = float(v)
        return np.array([self.cache[(key, i, int(j))] for j in tools])

    def for_lines(self, key: str, texts: Sequence[str], alpha: float | None = None):
        a = self.alpha if alpha is None else alpha

        def rerank(i: int, tools: np.ndarray, s: np.ndarray) -> np.ndarray:
            return s + a * self.logits(key, i, texts[i], tools)

        rerank.top_k = self.top_k
        return rerank


def summarize(hits: Mapping[str, tuple[bool, bool]], by_id) -> dict[str, Any]:
    from evals.stats import wilson
    from evals.unseen import summarize_arm

    s = summarize_arm(hits, by_id)
    n = len(hits)
    k1 = sum(a for a, _ in hits.values())
    k3 = sum(b for _, b in hits.values())
    return {"n_line_draws": n, "n_lines": s["n_lines"], "top1": s["top1"], "top3": s["top3"],
            "top1_wilson95": list(wilson(k1, n)), "top3_wilson95": list(wilson(k3, n)),
            "top1_bootstrap95_lines": s["top1_ci95"], "top3_bootstrap95_lines": s["top3_ci95"],
            "top1_by_server": s["top1_by_server"]}


def evaluate(encoder: str, out_json: str, *, base: str = "", queries: str = str(REPO / "data/queries/train.jsonl"),
             tools: str = str(REPO / "data/mcp_tools"), sizes: str = "10,50,100,250,all", draws: int = 3,
             seed: int = 0, lexical_weight: float = LEXICAL_WEIGHT, servers: Sequence[str] = (),
             new_queries: str = "", gate: str | Sequence[str] = (), score_servers: Sequence[str] = (),
             derived: str = "", cross_encoder: str = "", router_tag: str = "", plot_png: bool = True
             ) -> dict[str, Any]:
    """Run the probe (module docstring); ``new_queries``: requests over the shipped tools that are not keys (a JSONL
    file or a directory, e.g. data/routing_calibration; '' = none), scored with all of ``queries`` as exemplar keys.
    ``gate``: gate models, each the production router's arms. ``score_servers``: score only these servers' requests
    (over registries of every tool): a fold whose encoder held them out. ``derived``: a derived-requests file
    (services.compiler.derive) whose requests key their tools ('' = no derived arms). ``cross_encoder``: a
    ``training.public_ce`` directory, the second stage's arms ('' = none). ``router_tag``: the name of the one
    gate model's arms (default ``router <its directory>``)."""
    from evals.routing import registries_for
    from evals.unseen import paired
    from services.router.context import routing_text
    from services.router.keys import LexicalIndex, query_part
    from training.data import QueryLine, load_augment, load_queries, load_registry, parse_sizes
    from training.public import DOC_VERSION, tool_doc

    t0 = time.time()
    registry = load_registry(tools)
    if servers:
        registry = registry.subset([n for n in registry.names if registry.server_of[n] in set(servers)])
    names = list(registry.names)
    pos = {n: i for i, n in enumerate(names)}
    by_name = registry.by_name()
    size_list = parse_sizes(sizes)
    index = LexicalIndex.of_tools([by_name[n] for n in names])

    def line_set(raw: Sequence[QueryLine]) -> dict[str, Any]:
        ls = [ln if ln.server else QueryLine(**{**ln.__dict__, "server": registry.server_of[ln.tool]})
              for ln in raw if ln.tool in pos]
        if score_servers:
            ls = [ln for ln in ls if ln.server in set(score_servers)]
        texts = [routing_text(ln.query, list(ln.history)) for ln in ls]
        lex = (np.vstack([index.scores(query_part(t)) for t in texts]).astype(np.float32) if ls
               else np.zeros((0, len(names)), np.float32))
        return {"lines": ls, "texts": texts, "lex": lex, "tool": [pos[ln.tool] for ln in ls],
                "regs": [registries_for(ls, size_list, registry, seed, d) for d in range(draws)]}

    sets = {"queries": line_set(load_queries(queries))}
    if new_queries:
        sets["new"] = line_set(load_augment(new_queries))
        ids = {ln.id for ln in sets["queries"]["lines"]}
        clash = [ln.id for ln in sets["new"]["lines"] if ln.id in ids]
        if clash:
            raise ValueError(f"{new_queries} shares line ids with {queries} (e.g. {clash[0]}): not new requests")
    docs = [tool_doc(by_name[n]) for n in names]
    q = sets["queries"]
    dtexts, dtool = derived_keys(derived, names, by_name) if derived else ([], [])

    encoders: dict[str, dict[str, Any]] = {}
    scores: dict[str, np.ndarray] = {}
    for label, path in (("base", base), ("public", encoder)):
        vecs, info = encode(path, [*docs, *(t for ls in sets.values() for t in ls["texts"]), *dtexts])
        encoders[label] = info
        dv, at = vecs[: len(docs)], len(docs)
        qv = {}
        for key, ls in sets.items():
            qv[key], at = vecs[at: at + len(ls["texts"])], at + len(ls["texts"])
        for key in sets if dtexts else ():  # every line set, the derived requests as keys (none is a scored line)
            kv = vecs[at:]
            scores[f"{label} derived|{key}"] = np.maximum(
                qv[key] @ dv.T, exemplar_scores(qv[key], sets[key]["texts"], sets[key]["tool"], len(names),
                                                keys=(kv, dtexts, dtool)))
            scores[f"{label} centroid|{key}"] = centroid_scores(qv[key], dv, kv, dtool)
        # the scored requests of the file, each left out of its own tool's keys
        scores[f"{label} dense|queries"] = qv["queries"] @ dv.T
        scores[f"{label} keys|queries"] = np.maximum(
            scores[f"{label} dense|queries"], exemplar_scores(qv["queries"], q["texts"], q["tool"], len(names)))
        if "new" in sets:  # new requests, keyed by every request of the file
            n = sets["new"]
            scores[f"{label} dense|new"] = qv["new"] @ dv.T
            scores[f"{label} keys|new"] = np.maximum(
                scores[f"{label} dense|new"],
                exemplar_scores(qv["new"], n["texts"], n["tool"], len(names), keys=(qv["queries"], q["texts"],
                                                                                    q["tool"])))
    arms: dict[str, dict[str, Any]] = {}
    for label in ("base", "public"):
        arms[f"{label} dense"] = {"protocol": "unseen", "scores": f"{label} dense|queries", "lexical_weight": 0.0}
        arms[f"{label} + bm25"] = {"protocol": "unseen", "scores": f"{label} dense|queries",
                                   "lexical_weight": lexical_weight}
    for label in ("base", "public") if dtexts else ():
        for key in sets:
            tail = ", new requests" if key == "new" else ""
            arms[f"{label} + derived keys{tail}"] = {"protocol": "unseen", "scores": f"{label} derived|{key}",
                                                     "lexical_weight": 0.0}
            arms[f"{label} + derived keys + bm25{tail}"] = {"protocol": "unseen", "scores": f"{label} derived|{key}",
                                                            "lexical_weight": lexical_weight}
            arms[f"{label} + derived centroid{tail}"] = {"protocol": "unseen", "scores": f"{label} centroid|{key}",
                                                         "lexical_weight": 0.0}
    for label in ("base", "public"):
        arms[f"{label} + exemplar keys (seen)"] = {"protocol": "seen", "scores": f"{label} keys|queries",
                                                   "lexical_weight": 0.0}
        arms[f"{label} + exemplar keys + bm25 (seen)"] = {"protocol": "seen", "scores": f"{label} keys|queries",
                                                          "lexical_weight": lexical_weight}
    if "new" in sets:
        for label in ("base", "public"):
            arms[f"{label} dense, new requests"] = {"protocol": "unseen", "scores": f"{label} dense|new",
                                                    "lexical_weight": 0.0}
            arms[f"{label} + exemplar keys, new requests (seen)"] = {"protocol": "seen", "scores": f"{label} keys|new",
                                                                     "lexical_weight": 0.0}
        arms["public + exemplar keys + bm25, new requests (seen)"] = {"protocol": "seen", "scores": "public keys|new",
                                                                      "lexical_weight": lexical_weight}
    stage = CrossEncoderStage(cross_encoder, docs) if cross_encoder else None
    for key in sets if stage else ():
        tail = ", new requests" if key == "new" else ""
        # the fused re-rank (alpha chosen on Seal's validation requests) and the cross-encoder's order alone
        arms[f"public + cross-encoder{tail}"] = {"protocol": "unseen", "scores": f"public dense|{key}",
                                                 "lexical_weight": 0.0, "rerank": None}
        arms[f"public + cross-encoder alone{tail}"] = {"protocol": "unseen", "scores": f"public dense|{key}",
                                                       "lexical_weight": 0.0, "rerank": 1e6}
    for c in arms.values():
        c["lines"] = c["scores"].rsplit("|", 1)[1]
    hits = {a: {s: rank_hits(scores[c["scores"]], sets[c["lines"]]["lex"], c["lexical_weight"],
                             sets[c["lines"]]["lines"], sets[c["lines"]]["regs"], s, pos, names,
                             rerank=stage.for_lines(c["lines"], sets[c["lines"]]["texts"], c["rerank"])
                             if "rerank" in c else None)
                for s in size_list} for a, c in arms.items()}
    gates = [gate] if isinstance(gate, str) else list(gate)
    routers = [router_arms(g, registry, sets, size_list, draws, arms, hits, score_servers,
                           tag=router_tag if len(gates) == 1 else "") for g in gates if g]
    by_id = {ln.id: ln for ls in sets.values() for ln in ls["lines"]}
    # (arm, what it is compared with, on the same lines): the training's gain per scoring, BM25's, the keys'
    against = [("public dense", "base dense"), ("public + bm25", "base + bm25"), ("base + bm25", "base dense"),
               ("public + bm25", "public dense"),
               ("public + derived keys", "public dense"), ("public + derived centroid", "public dense"),
               ("public + derived keys + bm25", "public + bm25"), ("public + derived keys", "base + derived keys"),
               ("public + exemplar keys (seen)", "base + exemplar keys (seen)"),
               ("public + exemplar keys + bm25 (seen)", "base + exemplar keys + bm25 (seen)"),
               ("public + exemplar keys (seen)", "public dense"),
               ("public dense, new requests", "base dense, new requests"),
               ("public + exemplar keys, new requests (seen)", "base + exemplar keys, new requests (seen)"),
               ("public + exemplar keys, new requests (seen)", "public dense, new requests"),
               ("public + cross-encoder", "public dense"), ("public + cross-encoder alone", "public dense"),
               ("public + cross-encoder, new requests", "public dense, new requests")]
    against += [(a, "public dense, new requests" if a.endswith("new requests") else "public dense")
                for r in routers for a in arms if a.startswith(f"{r['arm']} (")]
    against += [(a, a.replace(" + examples", "")) for a in arms if "as it serves + examples" in a]
    lines_of = {"queries": os.path.relpath(queries, REPO), "new": os.path.relpath(new_queries, REPO) if new_queries
                else None}
    report: dict[str, Any] = {
        "protocol": {"name": "public", "what": "shipped registry as unseen tools for an encoder trained on public "
                     "tools only; '(seen)' arms key each shipped tool by its hand-written requests too: the "
                     "requests of the query file, each left out of its own keys, or, for 'new requests', every "
                     "request of the query file keying requests that are not in it",
                     "lines": len(q["lines"]), "new_lines": len(sets["new"]["lines"]) if "new" in sets else 0,
                     "tools": len(names), "sizes": size_list, "draws": draws, "seed": seed,
                     "queries": lines_of["queries"], "new_queries": lines_of["new"],
                     "registry": os.path.relpath(tools, REPO), "servers": sorted(servers) or "all",
                     "scored_servers": sorted(score_servers) or "all",
                     "tool_doc": DOC_VERSION, "lexical_weight": lexical_weight,
                     "derived": os.path.relpath(derived, REPO) if derived else None, "derived_keys": len(dtexts),
                     "derived_tools": len(set(dtool)),
                     "registries": "evals.routing.registries_for (own server first)"},
        "encoders": encoders,
        "cross_encoder": {**stage.meta, "path": str(cross_encoder), "pairs_scored": stage.pairs_scored}
        if stage else None,
        "routers": routers,
        "arms": {a: {"protocol": c["protocol"], "lines": lines_of[c["lines"]], "lexical_weight": c["lexical_weight"],
                     "by_size": {s: summarize(hits[a][s], by_id) for s in size_list}} for a, c in arms.items()},
        "paired": {f"{a} vs {b}": {s: paired(hits[a][s], hits[b][s]) for s in size_list} for a, b in against
                   if a in hits and b in hits},
        "seconds": round(time.time() - t0, 1),
    }
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(report, indent=2) + "\n")
    if plot_png:
        plot(report, str(Path(out_json).with_suffix(".png")))
    return report


def gate_protocol(gate: str | Path, servers: Sequence[str] = ()) -> str:
    """"unseen" when the gate model's encoder never trained on a line or tool of ``servers`` (every shipped server
    when empty): built on a training.public encoder with q_epochs 0 that was trained on public tools only, or with
    those servers held out; else "seen"."""
    hp = json.loads((Path(gate) / "gate.json").read_text()).get("hyperparams") or {}
    if not hp.get("encoder") or hp.get("q_epochs"):
        return "seen"
    meta_file = Path(hp["encoder"]) / "public_meta.json"
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    if not meta.get("with_shipped"):
        return "unseen"
    held = {x for x in str(meta.get("holdout_servers") or "").split(",") if x}
    return "unseen" if servers and set(servers) <= held else "seen"


def router_arms(gate: str, registry, sets: dict[str, Any], size_list: Sequence[str], draws: int,
                arms: dict[str, dict[str, Any]], hits: dict[str, Any], score_servers: Sequence[str] = (),
                tag: str = "") -> dict[str, Any]:
    """The production router's arms (module docstring), added to ``arms`` and ``hits``; what the gate model is.
    Every tool scored as a new one (no exemplar key, no bias) on each line set, and, on the new requests, the router
    as it serves (the gate model's own exemplar keys and weight): a seen figure, unless the gate model's encoder and
    keys took nothing of the scored servers (a fold's gate: the scored tools are new beside keyed ones, as a user's
    tools are beside the shipped ones). ``tag``: the arms' name (default ``router <gate directory>``)."""
    import tempfile

    from evals.routing import _open_router, route_lines
    from services.common.embedder import Embedder
    from services.common.store import LocalStore

    meta = json.loads((Path(gate) / "gate.json").read_text())
    label = gate_protocol(gate, score_servers)
    tag = tag or f"router {Path(gate).name}"
    scored = {n for n in registry.names if not score_servers or registry.server_of[n] in set(score_servers)}
    keyed = scored & set(meta.get("tool_schemas") or {})
    passes = [(0.0, "tools as new", label, tuple(sets))]
    if "new" in sets:
        passes.append((-1.0, "as it serves", "seen" if keyed else label, ("new",)))

    def route_arm(router, arm: str, protocol: str, key: str) -> None:
        ls = sets[key]
        regs = {(s, d): ls["regs"][d][s] for s in size_list for d in range(1 if s == "all" else draws)}
        recs = route_lines(router, ls["lines"], regs, range(len(ls["lines"])))
        arms[arm] = {"protocol": protocol, "lines": key, "lexical_weight": router.lexical_weight}
        hits[arm] = {s: {f"{r['id']}#{d}": (r["correct"], r["slb_top3"]) for (s2, d), rs in recs.items()
                         if s2 == s for r in rs} for s in size_list}

    with tempfile.TemporaryDirectory(prefix="nexus-public-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(registry.tools))
        for weight, what, protocol, keys in passes:
            router = _open_router(store, Embedder(""), gate, exemplar_weight=weight, precision="int8")
            if router.gate is None:
                raise ValueError(f"the gate model at {gate} did not load")
            for key in keys:
                arm = f"{tag} ({label}, {what})" if key == "queries" else f"{tag} ({protocol}, {what}), new requests"
                route_arm(router, arm, protocol, key)
        if "new" in sets and not keyed and "queries" in sets:
            # the scored servers' hand-written requests registered as their tools' examples (what a user may
            # supply, RegisterToolsRequest.examples), scored on the new requests
            from services.router.router import MAX_EXAMPLES_PER_TOOL

            examples: dict[str, list[str]] = {}
            for ln in sets["queries"]["lines"]:
                if ln.tool in scored and len(examples.setdefault(ln.tool, [])) < MAX_EXAMPLES_PER_TOOL:
                    examples[ln.tool].append(ln.query)
            router = _open_router(store, Embedder(""), gate, exemplar_weight=-1.0, precision="int8")
            router.store_examples(registry.by_name(), examples)
            asyncio.run(router.sync(force=True))
            route_arm(router, f"{tag} ({label}, as it serves + examples), new requests", label, "new")
    return {"gate": str(gate), "arm": tag, "tool_keys": meta.get("tool_keys", "base"),
            "tool_text": meta.get("tool_text") or "name: description", "protocol": label,
            "alt_keys": bool((meta.get("slb") or {}).get("alt_keys")), "lexical_weight": router.lexical_weight,
            "exemplar_weight": float((meta.get("slb") or {}).get("exemplar_weight") or 0.0), "precision": "int8"}


def plot(report: dict[str, Any], path: str, title: str = "encoder trained on public tools only") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = report["protocol"]
    sizes = p["sizes"]
    groups = [(p["queries"], f"{p['queries']} ({p['lines']} requests)")]
    if p.get("new_queries"):
        groups.append((p["new_queries"], f"new requests: {p['new_queries']} ({p['new_lines']})"))
    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 4.4 * len(groups)), squeeze=False)
    for row, (lines, title) in enumerate(groups):
        for ax, metric in zip(axes[row], ("top1", "top3"), strict=True):
            for arm, a in report["arms"].items():
                if a["lines"] != lines:
                    continue
                y = [100 * a["by_size"][s][metric] for s in sizes]
                ci = [a["by_size"][s][f"{metric}_bootstrap95_lines"] for s in sizes]
                (line,) = ax.plot(sizes, y, marker="o", ls="--" if a["protocol"] == "seen" else "-", label=arm)
                ax.fill_between(sizes, [100 * c[0] for c in ci], [100 * c[1] for c in ci], alpha=0.12,
                                color=line.get_color())
            target = 80 if metric == "top1" else 93
            ax.axhline(target, color="grey", ls=":", lw=1, label=f"issue 50 unseen target at 250 ({target} %)")
            ax.set_xlabel("registry size N")
            ax.set_ylabel(f"{metric} %")
            ax.set_title(f"{title}: {metric} (dashed: seen, exemplar keys)", fontsize=9)
            ax.grid(alpha=0.3)
        axes[row][0].legend(fontsize=7)
    fig.suptitle(f"{title}; {p['tools']} shipped tools as unseen, {p['draws']} draws",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_arms(rep: dict[str, Any], path: str) -> None:
    """One line per arm: top-1/top-3 % at every size."""
    for arm, x in rep["arms"].items():
        row = "  ".join(f"N={s}: {100 * v['top1']:.1f}/{100 * v['top3']:.1f}" for s, v in x["by_size"].items())
        print(f"{arm:52s} {row}")
    print(f"written {path} ({rep['seconds']} s)")


def main(argv: Sequence[str] | None = None) -> int:
    from training.data import prepare_training_env

    prepare_training_env()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--encoder", default=str(DEFAULT_ENCODER), help="the public-trained sentence-transformers dir")
    ap.add_argument("--base", default="", help="the baseline encoder ('' = the wheel's all-MiniLM-L6-v2)")
    ap.add_argument("--queries", default=str(REPO / "data/queries/train.jsonl"))
    ap.add_argument("--tools", default=str(REPO / "data/mcp_tools"))
    ap.add_argument("--sizes", default="10,50,100,250,all")
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lexical-weight", type=float, default=LEXICAL_WEIGHT)
    ap.add_argument("--servers", default="", help="comma-separated servers to restrict the registry to (tests)")
    ap.add_argument("--new-queries", default=str(REPO / "data/routing_calibration"),
                    help="requests that are not keys, scored with every --queries request as a key ('' = none)")
    ap.add_argument("--derived", default=str(REPO / "data/derived/requests.jsonl"),
                    help="derived requests keying their tools: the derived-keys arms ('' = none)")
    ap.add_argument("--gate", default="", help="comma-separated gate models: the production router's arms")
    ap.add_argument("--score-servers", default="", help="comma-separated: score only these servers' requests")
    ap.add_argument("--cross-encoder", default="", help="a training.public_ce directory: the second stage's arms")
    ap.add_argument("--json", default=str(REPO / "reports/routing_public.json"))
    a = ap.parse_args(argv)
    rep = evaluate(a.encoder, a.json, base=a.base, queries=a.queries, tools=a.tools, sizes=a.sizes, draws=a.draws,
                   seed=a.seed, lexical_weight=a.lexical_weight,
                   servers=[s for s in a.servers.split(",") if s], new_queries=a.new_queries,
                   gate=[g for g in a.gate.split(",") if g], score_servers=[s for s in a.score_servers.split(",") if s],
                   derived=a.derived, cross_encoder=a.cross_encoder)
    print_arms(rep, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
