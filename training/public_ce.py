"""A second stage trained on the world's tools: a cross-encoder over the public encoder's candidates (issue 50, item 4).

    python -m training.public_ce --encoder ~/.cache/nexus/models/public_encoder \
        --out ~/.cache/nexus/models/public_ce [--limit-pairs N] [training.public's data switches]

The design card's cross-encoder reads the request with each of a few candidate tools and can tell apart siblings of
one server, where most of the unseen protocol's errors are. It is trained here as the gate's is
(``training.gate.train_cross_encoder``: all-MiniLM-L6-v2 weights and a new one-logit head, a listwise loss over the
positive and hard negatives), on Seal-Tools (the overlap filter of ``training.public``: no shipped tool, none close
to one) and whatever ``training.public``'s data switches add (``--with-written``, ``--with-shipped
--holdout-servers``: a fold's second stage, whose held-out servers' tools are not even negatives): each request's
candidates are the encoder's nearest tool documents (``tool_doc``) among every tool in that pool; the weight ``alpha`` that fuses its logit with the encoder's cosine (``score = cosine + alpha x logit``,
``services.router.gate.fuse``) is chosen on a validation split of Seal requests, never on a shipped line. Written:
``OUT/cross_encoder`` (sentence-transformers CrossEncoder) and ``OUT/public_ce.json`` (alpha, validation, data hash).
The public protocol scores it with ``python -m evals.public --cross-encoder OUT``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from training.public import Pair, add_data_args, assemble, tool_doc

RECIPE = "public-ce-listwise-v1"


def candidates(encoder: str, pairs: Sequence[Pair], docs: dict[str, str], k: int,
               batch_size: int = 64) -> list[list[tuple[str, float]]]:
    """Each pair's ``k`` nearest tool documents (name, cosine) under ``encoder``, best first."""
    from sentence_transformers import SentenceTransformer

    from services.common.models import resolve_embedder

    model = SentenceTransformer(str(resolve_embedder(encoder)), device="cpu")
    names = list(docs)
    dv = model.encode([docs[n] for n in names], batch_size=batch_size, normalize_embeddings=True,
                      convert_to_numpy=True, show_progress_bar=False)
    qv = model.encode([p.query for p in pairs], batch_size=batch_size, normalize_embeddings=True,
                      convert_to_numpy=True, show_progress_bar=False)
    sim = qv @ dv.T
    top = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    return [[(names[j], float(sim[i, j])) for j in row] for i, row in enumerate(top)]


def split(pairs: Sequence[Pair], val_fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """Fit and validation pairs, split by request (a request's pairs stay together)."""
    ids = sorted({p.request_id for p in pairs})
    val_ids = set(random.Random(seed).sample(ids, max(1, int(len(ids) * val_fraction))))
    return [p for p in pairs if p.request_id not in val_ids], [p for p in pairs if p.request_id in val_ids]


def train(pairs: Sequence[Pair], tools: dict[str, Any], encoder: str, out: str | Path, *, epochs: int = 1,
          val_fraction: float = 0.1, seed: int = 0, progress: bool = True,
          extra_meta: dict[str, Any] | None = None) -> dict[str, Any]:
    from training.data import prepare_training_env
    from training.gate import Example, GateHyperParams, train_cross_encoder

    prepare_training_env()
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    hp = replace(GateHyperParams(), ce_epochs=epochs, seed=seed)
    docs = {n: tool_doc(t) for n, t in tools.items()}
    fit, val = split(pairs, val_fraction, seed)
    t0 = time.time()
    cands = candidates(encoder, [*fit, *val], docs, max(hp.ce_top_k, hp.ce_negatives + 1))
    fit_cands, val_cands = cands[: len(fit)], [c[: hp.ce_top_k] for c in cands[len(fit):]]

    def examples(ps: Sequence[Pair]) -> list[Example]:
        return [Example(p.request_id, p.query, p.tool, frozenset({p.tool})) for p in ps]

    mined = time.time() - t0
    ce, report = train_cross_encoder(examples(fit), examples(val), fit_cands, val_cands, docs, hp, progress)
    ce.save(str(out / "cross_encoder"))
    h = hashlib.sha256(json.dumps([[p.request_id, p.query, p.tool, docs[p.tool]] for p in pairs]).encode())
    val_top1 = float(np.mean([c[0][0] == p.tool for p, c in zip(val, val_cands, strict=True)])) if val else None
    meta = {"recipe": RECIPE, "encoder": str(encoder), "alpha": report["alpha"], "top_k": hp.ce_top_k,
            "max_len": hp.ce_max_len, "fit_pairs": len(fit), "val_pairs": len(val),
            "val_encoder_top1": val_top1, "val_rerank_top1": report["val_rerank_acc"],
            "val_ce_only_top1": report.get("val_ce_only_acc"), "by_alpha": report["by_alpha"],
            "history": report["history"], "data_hash": h.hexdigest(),
            "hp": {k: v for k, v in asdict(hp).items() if k.startswith("ce_") or k in ("seed", "alpha_grid")},
            "mining_seconds": round(mined, 1), "seconds": round(time.time() - t0, 1), **(extra_meta or {})}
    (out / "public_ce.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.public_ce", description=__doc__.split("\n\n")[0])
    ap.add_argument("--encoder", required=True, help="the public-trained encoder whose candidates are re-ranked")
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--limit-pairs", type=int, default=0, help="a seeded random subset of N pairs (timing)")
    ap.add_argument("--seed", type=int, default=0)
    add_data_args(ap)
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    pairs, tools, report = assemble(a)
    if a.limit_pairs and a.limit_pairs < len(pairs):
        pairs = sorted(random.Random(a.seed).sample(pairs, a.limit_pairs), key=lambda p: (p.request_id, p.tool))
    print(f"[public_ce] {len(pairs)} pairs, {len(tools)} candidate tools ({report['n_dropped']} Seal tools dropped as "
          f"close to shipped ones)", file=sys.stderr, flush=True)
    meta = train(pairs, tools, a.encoder, a.out, epochs=a.epochs, seed=a.seed, progress=not a.no_progress,
                 extra_meta={"holdout_servers": a.holdout_servers, "with_shipped": a.with_shipped is not None,
                             "with_written": a.with_written})
    print(json.dumps({k: v for k, v in meta.items() if k not in ("history", "by_alpha")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
