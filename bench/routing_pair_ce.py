"""Can a cross-encoder earn escalation by comparing the request with *exemplar requests*? (issue 4, escalation)

    nice -n 19 .venv/bin/python bench/routing_pair_ce.py --fold 0 --json reports/routing_pair_ce.json

The gate's cross-encoder scores (request, tool text) pairs and never beat the exemplar-keyed SLB on validation
(reports/routing_experiments.md §9, §12, §15), so the margin gate escalates nothing. This experiment gives the
cross-encoder another job: for each of the top-k SLB candidates it reads the request beside that tool's nearest
exemplar request (same register as the request, `tool name: exemplar`), a paraphrase-identification task.

For one fold of the routing evaluation's 3-fold protocol (same folds, registries and seed as ``nexus eval
routing``), with the fold's cached gate model (``train_cached``: trained on the other folds + augment lines):

* training groups: each exemplar row (fit + augment request) as the query, its own row left out; candidates from
  the SLB score the router uses (key + w x best exemplar) with that row left out, so the negatives are the
  confusions an unseen request meets; listwise softmax over [positive, negatives], from all-MiniLM-L6-v2;
* the fused weight alpha is chosen on the model's validation lines under the router's rule (escalate when the
  top-2 margin < tau, the model's 20th percentile; ``choose_alpha`` with ``CE_MIN_GAIN``);
* the fold's held-out lines are routed at each size: SLB only vs gated, escalation rate, lines fixed / broken.

Also written: the test-set accuracy at every alpha (for insight only; the chosen alpha is the validation one),
the cross-encoder's latency for k pairs on one thread, and a PNG of top-1 against alpha beside the JSON.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evals.routing_models import prepare_training_env  # noqa: E402


def tool_words(name: str) -> str:
    return name.replace("_", " ")


def loo_candidates(q_rows, keys, vecs, row_tool, names, w, gap, k):
    """For each exemplar row (as a request), the top-``k`` tools under key + w x best exemplar with the row itself
    left out; a tool left without exemplars scores key + w (key + gap), as in the router."""
    import numpy as np

    n_tools = len(names)
    pos = {n: i for i, n in enumerate(names)}
    tool_idx = np.array([pos[t] for t in row_tool])
    out = []
    for i in q_rows:
        q = vecs[i]
        key = keys @ q
        ex = vecs @ q
        ex[i] = -np.inf
        best = np.full(n_tools, -np.inf, np.float32)
        np.maximum.at(best, tool_idx, ex)
        best = np.where(np.isfinite(best), best, key + gap)
        score = key + w * best
        top = np.argsort(-score)[:k]
        out.append([(names[j], float(score[j])) for j in top])
    return out


def plot(report: dict, path: str) -> None:
    """Top-1 against the fused weight alpha: validation (which chooses alpha) and, for insight only, each size's
    held-out lines; alpha = 0 is the SLB alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    alphas = [float(x) for x in report["val"]["by_alpha"]]
    xs = range(len(alphas))
    ax.plot(xs, [100 * v for v in report["val"]["by_alpha"].values()], "k-o", label=f"validation ({report['val']['n']} "
            f"lines; chooses alpha = {report['val']['alpha']})")
    for h in report["held_out"].values():
        ax.plot(xs, [100 * v for v in h["test_by_alpha_insight_only"].values()], "--.",
                label=f"held-out N = {h['registry_size']} (escalated {100 * h['escalation_rate']:.0f} %)")
    ax.set_xticks(list(xs), [f"{a:g}" for a in alphas], fontsize=8)
    ax.set_xlabel("alpha (escalated lines: SLB score + alpha x pair cross-encoder logit)")
    ax.set_ylabel("top-1 (%)")
    ax.set_title(f"Exemplar-pair cross-encoder on the margin gate's escalations, fold {report['fold']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap)
    ap.add_argument("--exclude", default="", help="glob of augment file names to leave out (e.g. a new batch)")
    ap.add_argument("--fold", type=int, default=0)
    ap.add_argument("--groups", type=int, default=3000, help="training groups sampled from the exemplar rows")
    ap.add_argument("--negatives", type=int, default=3)
    ap.add_argument("--top-k", type=int, default=3, help="candidates the cross-encoder re-ranks")
    ap.add_argument("--max-len", type=int, default=96)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--head-lr-mult", type=float, default=20.0)
    ap.add_argument("--batch-groups", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="reports/routing_pair_ce.json")
    a = ap.parse_args()

    prepare_training_env()
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from services.common.embedder import Embedder, tool_text
    from services.common.models import default_embedder_path
    from services.common.store import LocalStore
    from services.evals.routing import _open_router, _size_n, load_protocol, write_report
    from services.evals.routing_models import train_cached
    from services.evals.stats import wilson
    from services.router.context import routing_text
    from services.router.gate import fuse
    from services.training.data import equivalents, is_correct, load_queries
    from services.training.gate import (
        GateHyperParams,
        ListwiseCrossEncoder,
        _encode_eval,
        _optimizer_step,
        _progress,
        choose_alpha,
        make_examples,
    )

    t0 = time.time()
    torch.set_num_threads(2)
    proto = load_protocol(a.queries, a.tools, a.sizes)
    registry, lines, sizes, regs = proto.registry, proto.lines, proto.sizes, proto.regs
    names = list(registry.names)
    name_set = set(names)
    files = [f for f in sorted(Path(a.augment).glob("*.jsonl")) if not (a.exclude and fnmatch.fnmatch(f.name, a.exclude))]
    extra = [ln for f in files for ln in load_queries(f) if ln.tool in name_set]
    train, idxs = proto.split(a.fold)
    hp = GateHyperParams(seed=0)
    gdir = train_cached(train, registry, hp, a.models_root, False, label=f"fold {a.fold}", extra=extra)
    doc = json.loads((gdir / "gate.json").read_text())
    w, gap, tau = doc["slb"]["exemplar_weight"], doc["slb"].get("exemplar_gap", 0.0), doc["tau"]
    rows = [json.loads(x) for x in (gdir / "exemplars.jsonl").read_text().splitlines() if x.strip()]
    vecs = np.load(gdir / "exemplars.npy").astype(np.float32)
    row_tool = [r["tool"] for r in rows]
    by_tool: dict[str, list[int]] = {}
    for i, t in enumerate(row_tool):
        by_tool.setdefault(t, []).append(i)
    base = SentenceTransformer(str(default_embedder_path()), device="cpu")
    by_name = {t.name: t for t in registry.tools}
    keys = _encode_eval(base, [tool_text(by_name[n]) for n in names])
    del base
    print(f"model {gdir.name}: w {w}, gap {gap:.3f}, tau {tau:.4f}, {len(rows)} exemplar rows", flush=True)

    def partner(q: np.ndarray, tool: str, skip: int = -1) -> int | None:
        cand = [j for j in by_tool.get(tool, []) if j != skip]
        if not cand:
            return None
        return cand[int(np.argmax(vecs[cand] @ q))]

    def cand_text(tool: str, j: int | None) -> str:
        return f"{tool_words(tool)}: {rows[j]['text']}" if j is not None else tool_words(tool)

    # training groups: every exemplar row whose tool has another row, sampled
    rng = random.Random(a.seed)
    eligible = [i for i, t in enumerate(row_tool) if len(by_tool[t]) > 1]
    sample = sorted(rng.sample(eligible, min(a.groups, len(eligible))))
    cands = loo_candidates(sample, keys, vecs, row_tool, names, w, gap, a.negatives + 4)
    groups = []
    loo_top1 = 0
    for i, cs in zip(sample, cands, strict=True):
        t = row_tool[i]
        pos = equivalents(t) | {t}
        loo_top1 += cs[0][0] in pos
        negs = [n for n, _ in cs if n not in pos][: a.negatives]
        texts = [cand_text(t, partner(vecs[i], t, skip=i))] + [cand_text(n, partner(vecs[i], n)) for n in negs]
        groups.append((rows[i]["text"], texts))
    print(f"{len(groups)} groups; leave-one-out SLB top-1 on them {100 * loo_top1 / len(groups):.1f} %", flush=True)

    steps = a.epochs * ((len(groups) + a.batch_groups - 1) // a.batch_groups)
    lce = ListwiseCrossEncoder(a.max_len, a.lr, a.head_lr_mult, steps, a.seed)
    hf, opt, sched, logits_of = lce.hf, lce.opt, lce.sched, lce.logits

    t_train = time.time()
    losses: list[float] = []
    order = list(range(len(groups)))
    with _progress(steps, "pair cross-encoder", True) as bar:
        for ep in range(a.epochs):
            random.Random(a.seed * 1000 + ep).shuffle(order)
            hf.train()
            for b in range(0, len(order), a.batch_groups):
                batch = [groups[i] for i in order[b : b + a.batch_groups]]
                lg = logits_of([(q, t) for q, ts in batch for t in ts], True)
                loss = lg.new_zeros(())
                at = 0
                for _, ts in batch:
                    g = lg[at : at + len(ts)]
                    loss = loss + (torch.logsumexp(g, 0) - g[0])
                    at += len(ts)
                _optimizer_step(opt, sched, loss / len(batch), losses, bar)
    hf.eval()
    train_s = time.time() - t_train
    print(f"trained in {train_s:.0f} s, last-100 loss {np.mean(losses[-100:]):.3f}", flush=True)

    # routing: the fold's router (the product's SLB + margin), the pair cross-encoder on escalated lines
    import tempfile

    with tempfile.TemporaryDirectory(prefix="nexus-pair-ce-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(registry.tools))
        router = _open_router(store, Embedder(""), gdir)
        pos_of = {n: i for i, n in enumerate(router.index.names())}
        cache: dict[tuple[str, str], float] = {}

        def ce_logits(text: str, q: np.ndarray, tools: list[str]) -> np.ndarray:
            need = [t for t in tools if (text, t) not in cache]
            if need:
                with torch.inference_mode():
                    lg = logits_of([(text, cand_text(t, partner(q, t))) for t in need], False).numpy()
                cache.update({(text, t): float(x) for t, x in zip(need, lg, strict=True)})
            return np.array([cache[text, t] for t in tools], np.float32)

        def decisions(text: str, positives: frozenset[str], allowed=None):
            q = router.embed_request(text)
            slb = router.index.search(q, max(a.top_k, 2), allowed=allowed)
            margin = slb[0][1] - slb[1][1]
            top = slb[: a.top_k]
            esc = margin < tau
            lg = ce_logits(text, q, [n for n, _ in top]) if esc else None
            return {"slb": [n for n, _ in top], "scores": [s for _, s in top], "esc": esc, "lg": lg,
                    "pos": positives}

        def pick(d, alpha):
            if not d["esc"] or alpha <= 0:
                return d["slb"][0]
            return d["slb"][int(np.argmax(fuse(np.array(d["scores"]), d["lg"], alpha)))]

        val_ids = set(doc["val_ids"])
        val = [e for e in make_examples(train, name_set, equivalents, hp.max_turns) if e.id in val_ids]
        vdec = [decisions(e.text, e.positives) for e in val]
        grid = hp.alpha_grid
        by_alpha = {str(al): float(np.mean([pick(d, al) in d["pos"] for d in vdec])) for al in grid}
        alpha = choose_alpha(by_alpha, grid)
        esc_val = float(np.mean([d["esc"] for d in vdec]))
        print(f"validation ({len(val)} lines, escalated {100 * esc_val:.1f} %): "
              + ", ".join(f"{al}: {100 * v:.1f}" for al, v in by_alpha.items()) + f" -> alpha {alpha}", flush=True)

        held: dict[str, dict] = {}
        for s in sizes:
            decs = []
            for i in idxs:
                ln = lines[i]
                mask = np.zeros(len(pos_of), bool)
                mask[[pos_of[n] for n in regs[s][i]]] = True
                text = routing_text(ln.query, list(ln.history), router._max_turns())
                d = decisions(text, frozenset(), allowed=mask)
                d["tool"] = ln.tool
                decs.append(d)
            ok_slb = [is_correct(d["slb"][0], d["tool"]) for d in decs]
            ok_gate = [is_correct(pick(d, alpha), d["tool"]) for d in decs]
            esc = [d["esc"] for d in decs]
            ok_esc_slb = sum(o for o, e in zip(ok_slb, esc, strict=True) if e)
            ok_esc_gate = sum(o for o, e in zip(ok_gate, esc, strict=True) if e)
            held[s] = {
                "registry_size": _size_n(s, registry), "n": len(decs),
                "slb_top1": float(np.mean(ok_slb)), "slb_top1_ci95": list(wilson(sum(ok_slb), len(decs))),
                "gated": float(np.mean(ok_gate)), "gated_ci95": list(wilson(sum(ok_gate), len(decs))),
                "escalation_rate": float(np.mean(esc)),
                "escalated_slb_correct": ok_esc_slb, "escalated_gated_correct": ok_esc_gate,
                "escalated_top_k_has_right": sum(any(is_correct(n, d["tool"]) for n in d["slb"])
                                                 for d in decs if d["esc"]),
                "fixed": sum(1 for o, g in zip(ok_slb, ok_gate, strict=True) if g and not o),
                "broken": sum(1 for o, g in zip(ok_slb, ok_gate, strict=True) if o and not g),
                "test_by_alpha_insight_only": {str(al): float(np.mean([is_correct(pick(d, al), d["tool"])
                                                                       for d in decs])) for al in grid},
            }
            h = held[s]
            print(f"N={s:>4}: SLB {100 * h['slb_top1']:.1f} % -> gated {100 * h['gated']:.1f} % "
                  f"(escalated {100 * h['escalation_rate']:.1f} %: right in top-{a.top_k} "
                  f"{h['escalated_top_k_has_right']}, SLB right {ok_esc_slb}, gated right {ok_esc_gate}; "
                  f"fixed {h['fixed']}, broken {h['broken']})", flush=True)

        # latency of one escalation (top-k pairs, 1 thread), the router's setting
        torch.set_num_threads(1)
        texts = [lines[i] for i in idxs[:40]]
        ms = []
        with torch.inference_mode():
            for ln in texts:
                t1 = time.perf_counter()
                logits_of([(ln.query, cand_text(n, by_tool[n][0])) for n in names[: a.top_k]], False)
                ms.append((time.perf_counter() - t1) * 1e3)
    report = {
        "fold": a.fold, "model": gdir.name, "exemplar_weight": w, "tau": tau, "n_groups": len(groups),
        "hyperparams": {k: v for k, v in vars(a).items() if k not in ("json",)},
        "train_seconds": round(train_s, 1), "val": {"n": len(val), "escalation_rate": esc_val,
                                                    "by_alpha": by_alpha, "alpha": alpha},
        "held_out": held, "ce_ms_p50": float(np.percentile(ms, 50)), "ce_ms_p90": float(np.percentile(ms, 90)),
        "seconds": round(time.time() - t0, 1),
    }
    write_report(a.json, report, plot)
    print(f"cross-encoder, {a.top_k} pairs, 1 thread: p50 {report['ce_ms_p50']:.1f} ms, p90 {report['ce_ms_p90']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
