"""SLB variant exploration behind reports/routing_experiments.md sections 0-1 (float scores, base all-MiniLM-L6-v2).

    .venv/bin/python bench/routing_explore.py ../shared/data/queries/train.jsonl ../shared/data/mcp_tools

Held-out throughout: exemplar keys and the adapter only ever use lines of the other folds.
"""

import os
import random
import re
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from services.common.embedder import Embedder  # noqa: E402
from services.training.data import assign_folds, equivalents, load_queries, load_registry, query_registry  # noqa: E402

torch.set_num_threads(1)
Q = load_queries(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/queries/train.jsonl")
R = load_registry(sys.argv[2] if len(sys.argv) > 2 else "../shared/data/mcp_tools")
names = R.names
idx = {n: i for i, n in enumerate(names)}
tgt = np.array([idx[q.tool] for q in Q])
slots = np.array([q.slot for q in Q])
rfold = np.array(assign_folds(Q, 3, 0))
eqmask = np.zeros((len(Q), len(names)), bool)
for i, q in enumerate(Q):
    for e in equivalents(q.tool):
        if e in idx:
            eqmask[i, idx[e]] = True


def first_sentence(d, words=24):
    d = re.sub(r"\s+", " ", d or "").strip()
    return " ".join(re.split(r"(?<=[.!?])\s", d, maxsplit=1)[0].split(" ")[:words])


def tool_variants(t):
    ns = t.name.replace("_", " ")
    params = ", ".join((t.input_schema.get("properties") or {}).keys())
    return {"name_desc": f"{ns}: {t.description}", "name": ns, "name_sent": f"{ns}: {first_sentence(t.description)}",
            "name_params": f"{ns} ({params})", "name_sent_params": f"{ns}: {first_sentence(t.description)} Parameters: {params}",
            "rawname_desc": f"{t.name}: {t.description}"}


def query_variants(q):
    last_user = next((c for r, c in reversed(q.history) if r == "user" and c.strip()), "")
    return {"q": q.query, "ctx_user": f"{last_user[:300]}\n{q.query}" if last_user else q.query}


emb = Embedder("")
T = {k: emb.embed([tool_variants(t)[k] for t in R.tools]) for k in tool_variants(R.tools[0])}
QV = {k: emb.embed([query_variants(q)[k] for q in Q]) for k in ("q", "ctx_user")}
rng = random.Random(0)
regs = {}
for size in ("250", "all"):
    m = np.zeros((len(Q), len(names)), bool)
    for i, q in enumerate(Q):
        m[i, [idx[n] for n in query_registry(q.tool, size, R, rng)]] = True
    regs[size] = m


def report(S, label):
    out = []
    for size, m in regs.items():
        order = np.argsort(-np.where(m, S, -1e9), axis=1)[:, :3]
        t1 = eqmask[np.arange(len(Q)), order[:, 0]].mean()
        t3 = eqmask[np.arange(len(Q))[:, None], order].any(1).mean()
        out.append(f"N={size}: {100 * t1:.1f} / {100 * t3:.1f}")
    print(f"{label:55s} " + " | ".join(out), flush=True)


def exemplar_best(qv, folds):
    out = np.full((len(Q), len(names)), np.nan, np.float32)
    for f in range(3):
        te, tr = np.where(folds == f)[0], np.where(folds != f)[0]
        sim = qv[te] @ qv[tr].T
        o = np.full((len(te), len(names)), np.nan, np.float32)
        for c, j in enumerate(tr):
            o[:, tgt[j]] = np.fmax(o[:, tgt[j]], sim[:, c])
        out[te] = o
    return out


def adapter(keys, qv, tr, wd=1e-2, epochs=200, temp=0.05):
    torch.manual_seed(0)
    K, x, y = torch.tensor(keys), torch.tensor(qv[tr]), torch.tensor(tgt[tr])
    W = torch.eye(K.shape[1], requires_grad=True)
    opt = torch.optim.Adam([W], lr=1e-2)
    eye = torch.eye(K.shape[1])
    for _ in range(epochs):
        loss = F.cross_entropy(F.normalize(x @ W.T, dim=1) @ K.T / temp, y) + wd * ((W - eye) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return W.detach()


print("top-1 / top-3 (%), held-out lines; folds = per-tool slot unless noted")
for qk, qv in QV.items():
    for tk, tv in T.items():
        report(qv @ tv.T, f"text {tk} / query {qk}")
qv = QV["ctx_user"]
report(np.maximum(qv @ T["name_desc"].T, qv @ T["name"].T), "max(name_desc, name)")
ex = exemplar_best(qv, slots)
text = qv @ T["name_desc"].T
report(text + np.where(np.isnan(ex), text, ex), "multi-vector text + best exemplar (fill: text)")
report(text + np.where(np.isnan(ex), 0, ex), "multi-vector text + best exemplar (fill: 0)")
for fname, folds in (("slot folds", slots), ("random per-tool folds", rfold)):
    S, SE = np.zeros_like(text), np.zeros_like(text)
    for f in range(3):
        tr, te = np.where(folds != f)[0], np.where(folds == f)[0]
        W = adapter(T["name_desc"], qv, tr)
        qa = F.normalize(torch.tensor(qv) @ W.T, dim=1).numpy()
        S[te] = qa[te] @ T["name_desc"].T
        e = np.full((len(te), len(names)), np.nan, np.float32)
        sim = qa[te] @ qa[tr].T
        for c, j in enumerate(tr):
            e[:, tgt[j]] = np.fmax(e[:, tgt[j]], sim[:, c])
        SE[te] = S[te] + np.where(np.isnan(e), S[te], e)
    report(S, f"linear query adapter ({fname})")
    report(SE, f"linear query adapter + exemplars ({fname})")
