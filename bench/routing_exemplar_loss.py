"""Train the query encoder for the score the router uses: key + w * best (leave-one-out) exemplar.

    nice -n 19 .venv/bin/python bench/routing_exemplar_loss.py --fold 0 --json reports/routing_exemplar_loss.json

``train_query_encoder`` fits the query side against the fixed tool keys alone (softmax over ``q . key``), while the
router then scores ``q . key + w * max(q . exemplar)`` over the fit + augment requests, embedded by that same
encoder. This bench trains a second encoder on the same fit lines, seed and schedule, but with the router's score
in the softmax: every tool's best exemplar among a bank of the fit requests (re-embedded after every epoch,
without gradient), the request's own row left out; temperature scaled by ``1 + w`` to keep the logits' range.
The epoch with the best validation top-1 under that score is kept.

Both encoders are then scored the same way: exemplar rows re-embedded by each, ``w`` (up to ``--w-max``) chosen on
the model's validation lines + data/routing_calibration, held-out top-1 of the fold's lines per size (float
cosines), paired counts. The product's encoder is the fold's cached gate model (``train_cached``).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evals.routing_models import prepare_training_env  # noqa: E402

W_GRID = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


def exemplar_logits(q, keys, bank, bank_tool, w: float, self_rows=None):
    """Router scores as torch logits: ``q . key + w * (best bank row of the tool, or q . key when it has none)``.
    ``q``: (b, d); ``keys``: (T, d); ``bank``: (R, d); ``bank_tool``: (R,) tool index per row; ``self_rows``: the
    bank row of each query (left out), or None."""
    import torch

    s = q @ bank.T
    if self_rows is not None:
        s = s.clone()
        s[torch.arange(len(self_rows)), torch.as_tensor(self_rows)] = float("-inf")
    best = torch.full((q.shape[0], keys.shape[0]), float("-inf"), dtype=s.dtype)
    best = best.scatter_reduce(1, bank_tool.expand(q.shape[0], -1), s, reduce="amax", include_self=True)
    k = q @ keys.T
    return k + w * torch.where(torch.isinf(best), k, best)


def train_encoder(fit, val, names, keys, hp, w: float, progress: bool = True):
    """``train_query_encoder``'s loop (same seed, optimiser, schedule, positives) with ``exemplar_logits``."""
    import torch
    from sentence_transformers import SentenceTransformer

    from services.common.models import default_embedder_path
    from services.training.gate import (
        _encode_eval,
        _encode_train,
        _optimizer_step,
        _positive_mask,
        _progress,
        _seed_all,
        warmup_linear,
    )

    _seed_all(hp.seed)
    model = SentenceTransformer(str(default_embedder_path()), device="cpu")
    model.max_seq_length = hp.q_max_len
    K = torch.tensor(keys)
    pos = {n: i for i, n in enumerate(names)}
    bank_tool = torch.tensor([pos[e.tool] for e in fit]).unsqueeze(0)
    pos_fit = torch.tensor(_positive_mask(fit, names))
    pos_val = _positive_mask(val, names)
    opt = torch.optim.AdamW(model.parameters(), lr=hp.q_lr, weight_decay=0.01)
    total = hp.q_epochs * ((len(fit) + hp.q_batch - 1) // hp.q_batch)
    sched = warmup_linear(opt, total)
    temp = hp.q_temp * (1 + w)

    def embed_bank():
        model.eval()
        return torch.tensor(_encode_eval(model, [e.text for e in fit]))

    def val_top1(bank) -> float:
        qv = torch.tensor(_encode_eval(model, [e.text for e in val]))
        s = exemplar_logits(qv, K, bank, bank_tool, w).numpy()
        return float(pos_val[np.arange(len(val)), s.argmax(1)].mean())

    bank = embed_bank()
    history = [{"epoch": 0, "val_top1": val_top1(bank)}]
    best = (history[0]["val_top1"], 0, copy.deepcopy(model.state_dict()))
    order = list(range(len(fit)))
    with _progress(total, "query encoder (router score)", progress) as bar:
        for ep in range(hp.q_epochs):
            random.Random(hp.seed * 1000 + ep).shuffle(order)
            model.train()
            losses: list[float] = []
            for b in range(0, len(order), hp.q_batch):
                idx = order[b : b + hp.q_batch]
                q = _encode_train(model, [fit[i].text for i in idx])
                logits = exemplar_logits(q, K, bank, bank_tool, w, self_rows=idx) / temp
                pm = pos_fit[idx]
                loss = (torch.logsumexp(logits, 1) - torch.logsumexp(logits.masked_fill(~pm, -1e4), 1)).mean()
                _optimizer_step(opt, sched, loss, losses, bar)
            bank = embed_bank()
            acc = val_top1(bank)
            history.append({"epoch": ep + 1, "loss": float(np.mean(losses)), "val_top1": acc})
            if acc > best[0]:
                best = (acc, ep + 1, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[2])
    model.eval()
    return model, {"history": history, "best_epoch": best[1]}


def plot(report: dict, path: str) -> None:
    from services.evals.routing import plot_arms

    arms = report["arms"]
    sizes = list(next(iter(arms.values()))["sizes"])
    plot_arms(path, {arm: [v["sizes"][s] for s in sizes] for arm, v in arms.items()}, [f"N = {s}" for s in sizes],
              f"Query encoder trained for the router's score? fold {report['fold']}, {report['n']} held-out lines")


def main() -> int:
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap, sizes="10,250,all", calibration=True)
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--w-train", type=float, default=1.5, help="exemplar weight inside the training softmax")
    ap.add_argument("--w-max", type=float, default=1.5, help="largest scoring weight the calibration may choose")
    ap.add_argument("--json", default="reports/routing_exemplar_loss.json")
    a = ap.parse_args()

    prepare_training_env()
    from sentence_transformers import SentenceTransformer

    from services.common.models import default_embedder_path
    from services.evals.routing import load_protocol, write_report
    from services.evals.routing_models import train_cached
    from services.evals.stats import wilson
    from services.training.data import equivalents
    from services.training.gate import (
        GateHyperParams,
        _encode_eval,
        exemplar_examples,
        make_examples,
        set_threads,
        split_examples,
        tool_text,
    )

    t0 = time.time()
    proto = load_protocol(a.queries, a.tools, a.sizes)
    registry, lines, sizes = proto.registry, proto.lines, proto.sizes
    names = registry.names
    known, pos = set(names), {n: i for i, n in enumerate(names)}
    hp = GateHyperParams(seed=0)
    set_threads(hp.threads)
    extra, calib = proto.extra_lines(a.augment), proto.extra_lines(a.calibration)
    train, idxs = proto.split(a.fold)
    gdir = train_cached(train, registry, hp, a.models_root, False, label=f"fold {a.fold}", extra=extra,
                        calibration=calib)
    fit_real, val = split_examples(make_examples(train, known, equivalents, hp.max_turns), hp.val_fraction, hp.seed)
    if sorted(e.id for e in val) != json.loads((gdir / "gate.json").read_text())["val_ids"]:
        raise SystemExit("the validation split differs from the cached model's: not the same protocol")
    extra_ex = make_examples(extra, known, equivalents, hp.max_turns)
    by_name = {t.name: t for t in registry.tools}
    base = SentenceTransformer(str(default_embedder_path()), device="cpu")
    keys = _encode_eval(base, [tool_text(by_name[n]) for n in names])
    del base
    t_train = time.time()
    trained, info = train_encoder(fit_real + extra_ex, val, names, keys, hp, a.w_train)
    info["train_seconds"] = round(time.time() - t_train, 1)

    choose = val + make_examples(calib, known, equivalents, hp.max_turns)
    held = make_examples([lines[i] for i in idxs], known, equivalents, hp.max_turns)
    exemplars = exemplar_examples(fit_real, extra_ex)
    ex_tool = np.array([pos[e.tool] for e in exemplars])

    def tool_mask(name_sets) -> np.ndarray:
        m = np.zeros((len(name_sets), len(names)), bool)
        for r, ns in enumerate(name_sets):
            m[r, [pos[n] for n in ns]] = True
        return m

    cpos, hpos = tool_mask([e.positives for e in choose]), tool_mask([e.positives for e in held])
    masks = {s: tool_mask([proto.regs[s][i] for i in idxs]) for s in sizes}

    def router_scores(enc, texts, ex_v, w):
        q = _encode_eval(enc, texts)
        best = np.full((len(q), len(names)), -np.inf, np.float32)
        np.maximum.at(best.T, ex_tool, (q @ ex_v.T).T)
        k = q @ keys.T
        return k + w * np.where(np.isfinite(best), best, k)

    arms = {}
    hits = {}
    for arm, enc in (("product encoder (key softmax)", SentenceTransformer(str(gdir / "query_encoder"), device="cpu")),
                     (f"router-score softmax (w {a.w_train})", trained)):
        ex_v = _encode_eval(enc, [e.text for e in exemplars])
        grid = [w for w in W_GRID if w <= a.w_max]
        by_w = {w: float(np.mean(cpos[np.arange(len(choose)), router_scores(enc, [e.text for e in choose], ex_v,
                                                                            w).argmax(1)])) for w in grid}
        w = max(grid, key=lambda x: (by_w[x], -x))
        hs = router_scores(enc, [e.text for e in held], ex_v, w)
        row = {"w": w, "choose_top1_by_w": by_w, "sizes": {}}
        for s in sizes:
            ok = hpos[np.arange(len(held)), np.where(masks[s], hs, -np.inf).argmax(1)]
            hits[arm, s] = ok
            row["sizes"][s] = {"n": len(ok), "accuracy": float(ok.mean()), "ci95": list(wilson(int(ok.sum()), len(ok)))}
        arms[arm] = row
        print(arm, "w", w, {s: round(100 * v["accuracy"], 1) for s, v in row["sizes"].items()}, flush=True)
    a0, a1 = list(arms)
    paired = {s: {"fixed": int((hits[a1, s] & ~hits[a0, s]).sum()), "broken": int((~hits[a1, s] & hits[a0, s]).sum())}
              for s in sizes}
    report = {"fold": a.fold, "n": len(idxs), "model": gdir.name, "w_train": a.w_train, "w_max": a.w_max,
              "training": info, "arms": arms, "paired": paired, "seconds": round(time.time() - t0, 1),
              "protocol": "the evaluation's fold and registries (seed 0, first draw); the same fit + augment lines, "
                          "seed and schedule for both encoders; w chosen on validation + calibration lines"}
    write_report(a.json, report, plot, echo=(paired,))
    return 0


if __name__ == "__main__":
    sys.exit(main())
