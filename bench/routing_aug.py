"""One-fold experiments behind reports/routing_experiments.md sections 5+ (issue 4, round 2).

    nice -n 19 .venv/bin/python bench/routing_aug.py --fold 0 --exp keys      # scoring variants, cached encoder
    nice -n 19 .venv/bin/python bench/routing_aug.py --fold 0 --exp train --variant synth

Held-out throughout: fold ``f``'s lines are scored by a query encoder trained on the other folds' lines
(+ optional synthetic queries generated from tool schemas only); every fusion weight is chosen on the
training split's validation lines (``split_examples``), never on the scored lines. Registries are the
evaluation's (``registries_for``, seed 0), scores are float cosines (the router's INT8 scan differs by
< 0.1 pt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from services.common.embedder import tool_text  # noqa: E402
from services.evals.routing import registries_for  # noqa: E402
from services.router.context import routing_text  # noqa: E402
from services.training.data import assign_folds, equivalents, load_queries, load_registry  # noqa: E402
from services.training.gate import (  # noqa: E402
    GateHyperParams,
    _encode_eval,
    make_examples,
    split_examples,
    train_query_encoder,
)

CACHE = Path(os.environ.get("NEXUS_AUG_CACHE", "/tmp/nexus-aug"))


def setup(fold: int, queries: str, tools: str):
    Q = load_queries(queries)
    R = load_registry(tools)
    Q = [q for q in Q if q.tool in set(R.names)]
    folds = assign_folds(Q, 3, 0)
    regs = registries_for(Q, ["250", "all"], R, 0)
    te = [i for i, g in enumerate(folds) if g == fold]
    train = [q for q, g in zip(Q, folds, strict=True) if g != fold]
    return Q, R, regs, te, train


def masks_for(Q, R, regs, idxs):
    """Per size, the registry mask of lines ``idxs``, and their equivalence (correct-answer) mask."""
    pos = {n: i for i, n in enumerate(R.names)}
    masks = {}
    for size, per in regs.items():
        m = np.zeros((len(idxs), len(pos)), bool)
        for r, i in enumerate(idxs):
            m[r, [pos[n] for n in per[i]]] = True
        masks[size] = m
    eq = np.zeros((len(idxs), len(pos)), bool)
    for r, i in enumerate(idxs):
        for e in equivalents(Q[i].tool):
            if e in pos:
                eq[r, pos[e]] = True
    return masks, eq


def metrics(S: np.ndarray, masks, eq, slots=None) -> dict[str, float]:
    out = {}
    for size, m in masks.items():
        order = np.argsort(-np.where(m, S, -1e9), axis=1, kind="stable")[:, :3]
        rows = np.arange(len(S))
        out[f"{size}_top1"] = 100 * eq[rows, order[:, 0]].mean()
        out[f"{size}_top3"] = 100 * eq[rows[:, None], order].any(1).mean()
        if size == "250" and slots is not None:
            for s in sorted(set(slots)):
                sel = slots == s
                out[f"250_slot{s}"] = 100 * eq[rows[sel], order[sel, 0]].mean()
    return out


def fmt(label: str, m: dict[str, float]) -> str:
    keys = ["250_top1", "250_top3", "all_top1", "all_top3", "250_slot0", "250_slot1", "250_slot2"]
    return f"{label:58s} " + " ".join(f"{k.replace('250_', '')}={m[k]:.1f}" for k in keys if k in m)


def encoder(variant: str, fold: int, train, R, hp: GateHyperParams, synth_fn=None, key_sets=("name_desc",)):
    """The tuned query encoder of ``variant`` for ``fold`` (cached on disk), and its training report."""
    from sentence_transformers import SentenceTransformer

    d = CACHE / f"{variant}-f{fold}"
    if (d / "report.json").is_file():
        return SentenceTransformer(str(d / "model"), device="cpu"), json.loads((d / "report.json").read_text())
    names = R.names
    examples = make_examples(train, set(names), equivalents, hp.max_turns)
    fit, val = split_examples(examples, hp.val_fraction, hp.seed)
    if synth_fn is not None:
        fit = fit + synth_fn(R)
    base = SentenceTransformer(str(_base_path()), device="cpu")
    kt = [key_texts(t) for t in R.tools]
    keys = np.stack([_encode_eval(base, [k[v] for k in kt]) for v in key_sets])
    keys = keys[0] if len(key_sets) == 1 else keys
    del base
    t0 = time.time()
    model, rep = train_query_encoder(fit, val, names, keys, hp, progress=True)
    rep["seconds"] = round(time.time() - t0, 1)
    rep["n_fit"] = len(fit)
    d.mkdir(parents=True, exist_ok=True)
    model.save(str(d / "model"))
    (d / "report.json").write_text(json.dumps(rep, indent=1))
    return model, rep


def _base_path():
    from services.common.models import default_embedder_path

    return default_embedder_path()


def first_sentence(d: str, words: int = 24) -> str:
    d = re.sub(r"\s+", " ", d or "").strip()
    return " ".join(re.split(r"(?<=[.!?])\s", d, maxsplit=1)[0].split(" ")[:words])


def key_texts(t) -> dict[str, str]:
    ns = t.name.replace("_", " ").replace("-", " ")
    params = ", ".join((t.input_schema.get("properties") or {}).keys())
    return {"name_desc": tool_text(t), "name": ns, "name_sent": f"{ns}: {first_sentence(t.description)}",
            "name_sent_params": f"{ns}: {first_sentence(t.description)} Parameters: {params}"}


_TOK = re.compile(r"[a-z0-9]+")


def tokens(text: str) -> list[str]:
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return _TOK.findall(text.lower().replace("_", " "))


class BM25:
    def __init__(self, docs: list[list[str]], k1: float = 1.2, b: float = 0.75):
        self.docs = [Counter(d) for d in docs]
        self.len = np.array([len(d) for d in docs], float)
        self.avg = self.len.mean()
        df = Counter(w for d in docs for w in set(d))
        n = len(docs)
        self.idf = {w: np.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        self.k1, self.b = k1, b

    def scores(self, q: list[str]) -> np.ndarray:
        out = np.zeros(len(self.docs))
        for w in set(q):
            if w not in self.idf:
                continue
            tf = np.array([d.get(w, 0) for d in self.docs], float)
            out += self.idf[w] * tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * self.len / self.avg))
        return out


def lexical_docs(R) -> list[list[str]]:
    out = []
    for t in R.tools:
        params = " ".join((t.input_schema.get("properties") or {}).keys())
        out.append(tokens(t.name) * 2 + tokens(params) + tokens(first_sentence(t.description, 40)))
    return out


def val_indices(Q, train, hp):
    examples = make_examples(train, {q.tool for q in Q}, equivalents, hp.max_turns)
    _, val = split_examples(examples, hp.val_fraction, hp.seed)
    ids = {e.id for e in val}
    return [i for i, q in enumerate(Q) if q.id in ids]


def texts_of(Q, idxs, max_turns=4):
    return [routing_text(Q[i].query, list(Q[i].history), max_turns=max_turns) for i in idxs]


def pick_weight(score_fn, vmasks, veq, grid=(0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)):
    """The grid weight with the best validation N=250 top-1 (ties: the smaller weight)."""
    best = max(grid, key=lambda w: (metrics(score_fn(w, "val"), vmasks, veq)["250_top1"], -w))
    return best


def exp_keys(a, hp, Q, R, regs, te, train):
    """Scoring variants over one cached tuned query encoder (no training)."""
    from sentence_transformers import SentenceTransformer

    if a.variant == "gate":
        from services.evals.routing_models import default_gate_dir

        gdir = default_gate_dir(train, R.tools, GateHyperParams(), equivalents=equivalents)
        qenc = SentenceTransformer(str(gdir / "query_encoder"), device="cpu")
    else:
        qenc, _ = encoder(a.variant, a.fold, train, R, hp)
    base = SentenceTransformer(str(_base_path()), device="cpu")
    va = val_indices(Q, train, hp)
    sets = {"val": va, "test": te}
    mk = {k: masks_for(Q, R, regs, v) for k, v in sets.items()}
    slots = np.array([Q[i].slot for i in te])
    txt = {k: texts_of(Q, v) for k, v in sets.items()}
    qt = {k: _encode_eval(qenc, t) for k, t in txt.items()}
    qb = {k: _encode_eval(base, t) for k, t in txt.items()}
    kt = [key_texts(t) for t in R.tools]
    K = {v: _encode_eval(base, [k[v] for k in kt]) for v in kt[0]}
    T = {v: {k: qt[k] @ K[v].T for k in sets} for v in K}
    B = {k: qb[k] @ K["name_desc"].T for k in sets}
    test = mk["test"]

    def show(label, S):
        print(fmt(label, metrics(S, *test, slots)), flush=True)

    show("untrained base encoder, name_desc", B["test"])
    for v in K:
        show(f"tuned encoder, key {v}", T[v]["test"])
    for other in ("name", "name_sent", "name_sent_params"):
        def f(w, k, other=other):
            return T["name_desc"][k] + w * np.maximum(T[other][k] - T["name_desc"][k], 0)
        w = pick_weight(f, *mk["val"])
        show(f"name_desc + {w} * relu({other} - name_desc)", f(w, "test"))
    Kall = np.stack([K[v] for v in K])
    for temp in (0.02, 0.05):
        def sm(k, temp=temp):
            s = np.einsum("nd,vtd->nvt", qt[k], Kall)
            return temp * np.log(np.exp(s / temp).mean(1))
        show(f"soft-max pooling over 4 keys (temp {temp})", sm("test"))

    def ens(w, k):
        return T["name_desc"][k] + w * B[k]
    w = pick_weight(ens, *mk["val"])
    show(f"ensemble tuned + {w} * base score", ens(w, "test"))
    bm = BM25(lexical_docs(R))
    L = {}
    for k, ids in sets.items():
        rows = []
        for i in ids:
            sc = bm.scores(tokens(Q[i].query))
            rows.append(sc / (sc.max() + 1e-9))
        L[k] = np.array(rows)

    def lex(w, k):
        return T["name_desc"][k] + w * L[k]
    w = pick_weight(lex, *mk["val"], grid=(0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3))
    show(f"tuned + {w} * BM25(name x2, params, first sentence) / max", lex(w, "test"))
    show("BM25 alone", L["test"])
    M2 = {k: np.maximum(T["name_desc"][k], T["name_sent_params"][k]) for k in sets}
    show("max(name_desc, name_sent_params)", M2["test"])

    def lex2(w, k):
        return M2[k] + w * L[k]
    w = pick_weight(lex2, *mk["val"], grid=(0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3))
    show(f"max(name_desc, name_sent_params) + {w} * BM25", lex2(w, "test"))
    for other in [v for v in (a.ens or "").split(",") if v]:
        enc2, _ = encoder(other, a.fold, train, R, hp)
        q2 = {k: _encode_eval(enc2, t) for k, t in txt.items()}
        E = {k: (M2[k] + np.maximum(q2[k] @ K["name_desc"].T, q2[k] @ K["name_sent_params"].T)) / 2 for k in sets}
        show(f"ensemble with {other}: mean of max2 scores", E["test"])

        def lex3(w, k, E=E):
            return E[k] + w * L[k]
        w = pick_weight(lex3, *mk["val"], grid=(0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3))
        show(f"ensemble with {other} + {w} * BM25", lex3(w, "test"))


def exp_exemplars(a, hp, Q, R, regs, te, train):
    """Exemplar keys with the tuned encoder: each tool is also keyed by the requests written for it (the fold's
    fit lines, validation lines left out, and the hand-written augment lines); a tool's exemplar score is its best
    exemplar's cosine. Fused with the key score (max, or key + w * exemplar, w on validation)."""
    from services.evals.routing_models import load_augment

    qenc, _ = encoder(a.variant, a.fold, train, R, hp)
    from sentence_transformers import SentenceTransformer

    base = SentenceTransformer(str(_base_path()), device="cpu")
    va = val_indices(Q, train, hp)
    val_ids = {Q[i].id for i in va}
    pos = {n: i for i, n in enumerate(R.names)}
    ex = [ln for ln in train if ln.id not in val_ids and ln.tool in pos]
    ex += [ln for ln in load_augment(a.augment_dir) if ln.tool in pos]
    X = _encode_eval(qenc, [routing_text(ln.query, list(ln.history), max_turns=hp.max_turns) for ln in ex])
    owner = np.array([pos[ln.tool] for ln in ex])
    K = _encode_eval(base, [key_texts(t)["name_desc"] for t in R.tools])
    sets = {"val": va, "test": te}
    mk = {k: masks_for(Q, R, regs, v) for k, v in sets.items()}
    slots = np.array([Q[i].slot for i in te])
    qt = {k: _encode_eval(qenc, texts_of(Q, v, hp.max_turns)) for k, v in sets.items()}
    T = {k: qt[k] @ K.T for k in sets}
    E = {}
    for k in sets:
        sims = qt[k] @ X.T
        e = np.full((len(sims), len(pos)), -1.0, dtype=np.float32)
        for j in range(len(pos)):
            cols = owner == j
            if cols.any():
                e[:, j] = sims[:, cols].max(1)
        E[k] = e
    print(f"exemplars: {len(ex)} ({len(X)} vectors) for {len(set(owner))} tools", flush=True)

    def show(label, S):
        print(fmt(label, metrics(S, *mk["test"], slots)), flush=True)

    show("tuned encoder, key name_desc", T["test"])
    show("exemplars alone (best exemplar per tool)", E["test"])
    show("max(key, best exemplar)", np.maximum(T["test"], E["test"]))
    for name, f in (("key + w * exemplar", lambda w, k: T[k] + w * E[k]),
                    ("key + w * relu(exemplar - key)", lambda w, k: T[k] + w * np.maximum(E[k] - T[k], 0))):
        w = pick_weight(f, *mk["val"], grid=(0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0))
        show(f"{name}, w = {w} (validation)", f(w, "test"))


def synth_fn(per_tool: int, seed: int = 0):
    from services.training.gate import Example
    from services.training.synth import synth_examples

    def make(R):
        return [Example(f"synth-{i:05d}", text, tool, frozenset(equivalents(tool)) & set(R.names) | {tool})
                for i, (tool, text) in enumerate(synth_examples(R.tools, per_tool, seed))]
    return make


AUGMENT_DIR = Path(__file__).resolve().parents[1] / "data" / "routing_augment"


def augment_fn(exclude_server: str = "", batches: tuple[str, ...] = ("a-",), folder: str | Path = AUGMENT_DIR):
    """The hand-written paraphrase lines of data/routing_augment (written from the schemas only, never from
    the evaluation's train.jsonl), as extra fit examples: the batches whose ids start with ``batches``
    (``a-`` = session 3's 1,352 lines, ``b-`` = session 5's, ``c-`` = session 6's)."""
    from services.evals.routing_models import load_augment
    from services.training.gate import make_examples

    def make(R):
        keep = [ln for ln in load_augment(folder) if ln.id.startswith(batches) and ln.server != exclude_server]
        return make_examples(keep, set(R.names), equivalents)
    return make


# variant -> (synthetic queries per tool, GateHyperParams overrides, tool keys trained against (max-pooled))
MK2 = ("name_desc", "name_sent_params")
VARIANTS: dict[str, tuple[int, dict, tuple[str, ...]]] = {
    "base": (0, {}, ("name_desc",)),
    "synth4": (4, {}, ("name_desc",)),
    "synth2": (2, {}, ("name_desc",)),
    "ep5": (0, {"q_epochs": 5}, ("name_desc",)),
    "temp03": (0, {"q_temp": 0.03}, ("name_desc",)),
    "temp10": (0, {"q_temp": 0.1}, ("name_desc",)),
    "mk2": (0, {}, MK2),
    "mk2ep5": (0, {"q_epochs": 5}, MK2),
    "mk2synth2": (2, {}, MK2),
    "aug": (-1, {}, ("name_desc",)),  # -1: the hand-written augment lines instead of templates
    "aug2": (-2, {}, ("name_desc",)),  # -2: both hand-written batches
    "aug3": (-3, {}, ("name_desc",)),  # -3: three hand-written batches
    "aug3ep2": (-3, {"q_epochs": 2}, ("name_desc",)),
}


def exp_train(a, hp, Q, R, regs, te, train):
    per_tool, over, key_sets = VARIANTS[a.variant]
    hp = replace(hp, **over)
    batches = ("a-", "b-", "c-")[:-per_tool] if per_tool < 0 else ()
    extra = augment_fn(batches=batches, folder=a.augment_dir) if per_tool < 0 else synth_fn(per_tool, hp.seed) if per_tool else None
    _, rep = encoder(a.variant, a.fold, train, R, hp, extra, key_sets)
    print(f"{a.variant}: {rep['seconds']} s, n_fit {rep['n_fit']}, best epoch {rep['best_epoch']}, "
          f"val {[round(h['val_slb_top1'], 3) for h in rep['history']]}", flush=True)
    exp_keys(a, hp, Q, R, regs, te, train)


EXPERIMENTS: dict = {"keys": exp_keys, "train": exp_train, "exemplars": exp_exemplars}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--exp", default="train")
    ap.add_argument("--variant", default="base")
    ap.add_argument("--queries", default="../shared/data/queries/train.jsonl")
    ap.add_argument("--tools", default="../shared/data/mcp_tools")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ens", default="", help="other cached variants to average scores with (keys exp)")
    ap.add_argument("--hp", default="{}", help="JSON overrides of GateHyperParams")
    ap.add_argument("--augment-dir", default=str(AUGMENT_DIR), help="hand-written lines (a staging folder)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    hp = replace(GateHyperParams(threads=a.threads), **json.loads(a.hp))
    EXPERIMENTS[a.exp](a, hp, *setup(a.fold, a.queries, a.tools))


if __name__ == "__main__":
    main()
