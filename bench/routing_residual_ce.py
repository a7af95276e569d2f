"""Can a cross-encoder trained as a *residual* of the SLB earn escalation? (issue 4, escalation and flatness)

    nice -n 19 .venv/bin/python bench/routing_residual_ce.py --folds 0 --draws 3 --json reports/routing_residual_ce.json

Every cross-encoder so far (reports/routing_experiments.md §2, §9, §12, §16) was trained to rank tools on its own
and then fused with the SLB score: alone it is 30 points below the exemplar-keyed SLB, and no weight of it helped on
the lines that choose. The errors left are near-ties between twins of one server (issue vs pull request,
``git_diff_staged`` vs ``git_diff_unstaged``, ``resources_get`` vs ``resources_list``) whose descriptions differ
in a word. This arm trains the cross-encoder on the job the gate gives it, with the SLB in the loss:

* groups: each exemplar row of the fold's model (fit + augment requests) as the request, its own row left out of its
  tool's exemplars; candidates are the top ``--top-k`` tools under the product's scoring (description key + w x
  log-mean-exp pooled exemplars at the model's w, T, gap), the right tool always among them;
* loss: listwise softmax over ``beta * slb + ce`` (``beta`` fitted on the groups so that ``softmax(beta * slb)``
  alone is the SLB's best calibrated guess): the cross-encoder only has to learn what the SLB gets wrong;
  ``--offset 0`` trains the same groups without the SLB term (the old recipe, for comparison);
* the cross-encoder reads ``gate.ce_tool_text`` (name as words + the description's first sentence);
* routing: the margin gate of the model (escalate when top-1 - top-2 < tau), then ``slb + alpha * ce`` over the top
  k; alpha chosen on the model's validation lines + data/routing_calibration (``choose_alpha``, the product's rule
  with ``CE_MIN_GAIN``), never on held-out lines;
* held out: the fold's lines at each size over ``--draws`` draws of distractors (the evaluation's registries).

Scores are float cosines (the router's INT8 scan differs in the third decimal). Written: per fold the fitted beta,
training loss, the choosing lines' accuracy by alpha, held-out SLB vs gated top-1 per size, escalation rate, lines
fixed / broken, the cross-encoder's latency for k pairs on one thread, pooled CIs, and a PNG.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evals.routing_models import prepare_training_env  # noqa: E402

BETAS = np.geomspace(1.0, 1000.0, 61)


def fit_beta(groups: list[dict]) -> float:
    """The inverse temperature under which ``softmax(beta * slb)`` over each group's candidates best predicts the
    right one (max mean log-likelihood over ``BETAS``)."""
    best = (-np.inf, 1.0)
    for b in BETAS:
        ll = 0.0
        for g in groups:
            z = b * np.asarray(g["scores"], np.float64)
            ll += z[0] - (z.max() + np.log(np.exp(z - z.max()).sum()))
        best = max(best, (ll / len(groups), float(b)))
    return best[1]


def plot(report: dict, path: str) -> None:
    """Left: accuracy of the choosing lines against alpha (per fold). Right: held-out top-1 per size, SLB vs gated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.4))
    for f, pf in report["per_fold"].items():
        al = [float(x) for x in pf["choose_by_alpha"]]
        ax.plot(range(len(al)), [100 * v for v in pf["choose_by_alpha"].values()], "-o", ms=3,
                label=f"fold {f} (beta {pf['beta']:.0f}; alpha {pf['alpha']:g})")
        ax.set_xticks(range(len(al)), [f"{x:.3g}" for x in al], fontsize=7, rotation=45)
    ax.set_xlabel("alpha (escalated lines: slb + alpha x ce)")
    ax.set_ylabel("top-1 on validation + calibration lines (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    pooled = report["pooled"]
    sizes = list(pooled["slb"])
    x = np.arange(len(sizes))
    for k, (arm, lab) in enumerate((("slb", "SLB (alpha 0)"), ("gated", "gated, alpha chosen"))):
        acc = [100 * pooled[arm][s]["accuracy"] for s in sizes]
        lo = [100 * (pooled[arm][s]["accuracy"] - pooled[arm][s]["ci95"][0]) for s in sizes]
        hi = [100 * (pooled[arm][s]["ci95"][1] - pooled[arm][s]["accuracy"]) for s in sizes]
        bx.bar(x + (k - 0.5) * 0.38, acc, 0.38, yerr=[lo, hi], capsize=3, label=lab)
    bx.set_xticks(x, [f"N = {s}" for s in sizes])
    bx.set_ylim(70, 100)
    bx.set_ylabel("held-out top-1 (%), 95 % CI (bootstrap over lines)")
    bx.legend(fontsize=8)
    bx.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Residual cross-encoder on the margin gate's escalations ({report['n']} held-out lines x "
                 f"{report['draws']} draws; offset {report['hyperparams']['offset']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap, sizes="10,250,all", calibration=True, draws=3, folds="0")
    ap.add_argument("--groups", type=int, default=3000, help="training groups sampled from the exemplar rows")
    ap.add_argument("--top-k", type=int, default=4, help="candidates per training group and per escalation")
    ap.add_argument("--offset", type=float, default=1.0, help="1: the SLB in the loss (residual); 0: without")
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--head-lr-mult", type=float, default=20.0)
    ap.add_argument("--batch-groups", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calib-train", type=float, default=0.0,
                    help="fraction of the calibration lines (by tool, seeded) that become training groups instead of "
                         "choosing alpha: unseen, hard requests where the SLB errs more often than on exemplar rows")
    ap.add_argument("--json", default="reports/routing_residual_ce.json")
    a = ap.parse_args()

    prepare_training_env()
    import torch

    from services.evals.routing import pool_line_draws, write_report
    from services.evals.routing_models import float_bench, load_fold
    from services.router.gate import ce_tool_text
    from services.training.data import equivalents
    from services.training.gate import (
        ListwiseCrossEncoder,
        _optimizer_step,
        _progress,
        choose_alpha,
        float_tool_scores,
    )

    t0 = time.time()
    torch.set_num_threads(2)
    fb = float_bench(a)
    proto, names, pos, by_name, keys, hp = fb.proto, fb.names, fb.pos, fb.by_name, fb.keys, fb.hp
    lines, sizes = proto.lines, proto.sizes
    extra, calib, calib_all = fb.extra, fb.calib, fb.calib_ex
    ce_texts = [ce_tool_text(by_name[n]) for n in names]
    crng = random.Random(f"calib-train:{a.seed}")
    calib_train = {e.id for e in calib_all if crng.random() < a.calib_train}
    calib_ex = [e for e in calib_all if e.id not in calib_train]
    calib_fit = [e for e in calib_all if e.id in calib_train]
    k = a.top_k

    per_fold: dict[str, dict] = {}
    hits: dict[str, dict[str, dict[str, bool]]] = {arm: {s: {} for s in sizes} for arm in ("slb", "gated")}
    esc_rate: dict[str, list[bool]] = {s: [] for s in sizes}
    ms: list[float] = []

    def one_fold(f: int) -> dict:
        """Train the fold's cross-encoder, choose alpha, route the held-out lines (into ``hits``)."""
        fm = load_fold(proto, f, hp, a.models_root, extra, calib, calib_ex)
        w, temp, gap, tau = fm.w, fm.temp, fm.gap, fm.meta["tau"]
        gdir, idxs, rows, ex_v, tool_of_row = fm.dir, fm.idxs, fm.rows, fm.ex_v, fm.tool_of_row
        n_of_tool = np.bincount(tool_of_row, minlength=len(names))
        print(f"fold {f}: model {gdir.name}, w {w}, T {temp}, gap {gap:.3f}, tau {tau:.3f}, {len(rows)} exemplar rows",
              flush=True)

        # training groups: leave-one-out exemplar rows, candidates from the product's scoring
        rng = random.Random(a.seed)
        eligible = [i for i in range(len(rows)) if n_of_tool[tool_of_row[i]] > 1]
        sample = np.array(sorted(rng.sample(eligible, min(a.groups, len(eligible)))))
        loo = float_tool_scores(ex_v[sample], keys, ex_v, tool_of_row, w, temp, gap, leave_out=sample)
        groups, loo_top1 = [], 0
        for r, i in enumerate(sample):
            t = rows[i]["tool"]
            right = {pos[n] for n in equivalents(t) | {t} if n in pos}
            top = [int(j) for j in np.argsort(-loo[r])[: k + len(right)]]
            loo_top1 += top[0] in right
            negs = [j for j in top if j not in right][: k - 1]
            cand = [pos[t]] + negs
            groups.append({"text": rows[i]["text"], "cand": cand, "scores": [float(loo[r, j]) for j in cand]})
        if calib_fit:  # unseen requests: full scores (no row to leave out)
            cf = fm.scores([e.text for e in calib_fit], keys)
            for e, sc in zip(calib_fit, cf, strict=True):
                right = {pos[n] for n in e.positives if n in pos}
                negs = [int(j) for j in np.argsort(-sc)[: k + len(right)] if j not in right][: k - 1]
                cand = [pos[e.tool]] + negs
                groups.append({"text": e.text, "cand": cand, "scores": [float(sc[j]) for j in cand]})
        beta = fit_beta(groups) if a.offset else 0.0

        def slb_loss(gs: list[dict]) -> float:
            z = [beta * np.asarray(g["scores"], np.float64) for g in gs]
            return float(np.mean([np.log(np.exp(x - x.max()).sum()) + x.max() - x[0] for x in z]))

        print(f"{len(groups)} groups ({len(calib_fit)} calibration lines); leave-one-out SLB top-1 "
              f"{100 * loo_top1 / len(sample):.1f} %; beta {beta:.1f}; SLB-only loss {slb_loss(groups):.3f}", flush=True)

        steps = a.epochs * ((len(groups) + a.batch_groups - 1) // a.batch_groups)
        lce = ListwiseCrossEncoder(a.max_len, a.lr, a.head_lr_mult, steps, a.seed)
        hf, opt, sched, logits_of = lce.hf, lce.opt, lce.sched, lce.logits

        t_train = time.time()
        losses: list[float] = []
        order = list(range(len(groups)))
        with _progress(steps, f"residual cross-encoder, fold {f}", True) as bar:
            for ep in range(a.epochs):
                random.Random(a.seed * 1000 + ep).shuffle(order)
                hf.train()
                for b in range(0, len(order), a.batch_groups):
                    batch = [groups[i] for i in order[b : b + a.batch_groups]]
                    lg = logits_of([(g["text"], ce_texts[j]) for g in batch for j in g["cand"]], True)
                    off = torch.tensor([beta * a.offset * s for g in batch for s in g["scores"]], dtype=lg.dtype)
                    z = lg + off
                    loss = z.new_zeros(())
                    at = 0
                    for g in batch:  # listwise softmax; the right tool is element 0 of its group
                        zz = z[at : at + len(g["cand"])]
                        loss = loss + (torch.logsumexp(zz, 0) - zz[0])
                        at += len(g["cand"])
                    _optimizer_step(opt, sched, loss / len(batch), losses, bar)
        hf.eval()
        train_s = time.time() - t_train
        print(f"trained in {train_s:.0f} s, last-100 loss {np.mean(losses[-100:]):.3f}", flush=True)

        cache: dict[tuple[str, int], float] = {}

        def ce_of(text: str, cand: list[int]) -> np.ndarray:
            need = [j for j in cand if (text, j) not in cache]
            if need:
                with torch.inference_mode():
                    lg = logits_of([(text, ce_texts[j]) for j in need], False).numpy()
                cache.update({(text, j): float(x) for j, x in zip(need, lg, strict=True)})
            return np.array([cache[text, j] for j in cand], np.float32)

        def route(text: str, s: np.ndarray) -> dict:
            top = [int(j) for j in np.argsort(-s, kind="stable")[: max(k, 2)]]
            esc = bool(s[top[0]] - s[top[1]] < tau)
            top = top[:k]
            return {"top": top, "s": s[top], "esc": esc, "ce": ce_of(text, top) if esc else None}

        def pick(d: dict, alpha: float) -> int:
            if not d["esc"] or alpha <= 0:
                return d["top"][0]
            return d["top"][int(np.argmax(d["s"] + alpha * d["ce"]))]

        # alpha on the model's validation + calibration lines (full registry), as calibrate_slb chooses it
        choose = fm.choose
        cs = fm.scores([e.text for e in choose], keys)
        cdec = [route(e.text, s) for e, s in zip(choose, cs, strict=True)]
        scale = 1.0 / beta if beta else 1.0
        grid = sorted({0.0, *(round(scale * m, 5) for m in (0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0))})
        by_alpha = {str(al): float(np.mean([names[pick(d, al)] in e.positives for d, e in zip(cdec, choose,
                                                                                                    strict=True)]))
                    for al in grid}
        alpha = choose_alpha(by_alpha, grid)
        alpha_key = str(alpha)
        esc_choose = float(np.mean([d["esc"] for d in cdec]))
        print(f"choosing lines ({len(choose)}, escalated {100 * esc_choose:.1f} %): "
              + ", ".join(f"{al}: {100 * v:.1f}" for al, v in by_alpha.items()) + f" -> alpha {alpha_key}", flush=True)
        best_al = max(grid, key=lambda x: (by_alpha[str(x)], -x))
        esc_lines = [(d, e) for d, e in zip(cdec, choose, strict=True) if d["esc"]]
        esc_slb = float(np.mean([names[d["top"][0]] in e.positives for d, e in esc_lines]))
        esc_ce = float(np.mean([names[d["top"][int(np.argmax(d["ce"]))]] in e.positives for d, e in esc_lines]))
        esc_any = float(np.mean([any(names[j] in e.positives for j in d["top"]) for d, e in esc_lines]))
        print(f"escalated choosing lines ({len(esc_lines)}): SLB top-1 {100 * esc_slb:.1f} %, cross-encoder alone "
              f"{100 * esc_ce:.1f} %, right tool in the top {k}: {100 * esc_any:.1f} %", flush=True)

        held_ex = fm.held
        hs = fm.scores([e.text for e in held_ex], keys)
        fold_sizes: dict[str, dict] = {}
        for s in sizes:
            ok_slb, ok_gate, ok_best, esc = [], [], [], []
            for d_i, regs in enumerate(proto.draw_regs):
                for r, i in enumerate(idxs):
                    mask = np.full(len(names), -np.inf, np.float32)
                    mask[[pos[n] for n in regs[s][i]]] = 0.0
                    d = route(held_ex[r].text, hs[r] + mask)
                    key = f"{lines[i].id}#{d_i}"
                    hits["slb"][s][key] = names[pick(d, 0.0)] in held_ex[r].positives
                    hits["gated"][s][key] = names[pick(d, alpha)] in held_ex[r].positives
                    ok_slb.append(hits["slb"][s][key])
                    ok_gate.append(hits["gated"][s][key])
                    ok_best.append(names[pick(d, best_al)] in held_ex[r].positives)
                    esc.append(d["esc"])
            esc_rate[s].extend(esc)
            fold_sizes[s] = {"slb": float(np.mean(ok_slb)), "gated": float(np.mean(ok_gate)),
                             "escalation_rate": float(np.mean(esc)),
                             "fixed": int(sum(g and not o for o, g in zip(ok_slb, ok_gate, strict=True))),
                             "broken": int(sum(o and not g for o, g in zip(ok_slb, ok_gate, strict=True))),
                             "at_best_choosing_alpha_insight": float(np.mean(ok_best))}
            v = fold_sizes[s]
            print(f"  N={s:>4}: SLB {100 * v['slb']:.1f} -> gated {100 * v['gated']:.1f} % (escalated "
                  f"{100 * v['escalation_rate']:.1f} %, fixed {v['fixed']}, broken {v['broken']}; at alpha "
                  f"{best_al:.3g}: {100 * v['at_best_choosing_alpha_insight']:.1f})", flush=True)
        out = {"model": gdir.name, "n": len(idxs), "w": w, "temperature": temp, "tau": tau,
               "n_groups": len(groups), "n_calibration_groups": len(calib_fit),
               "loo_slb_top1": loo_top1 / len(sample), "beta": beta,
               "slb_only_loss": slb_loss(groups) if beta else None,
               "train_seconds": round(train_s, 1), "last100_loss": float(np.mean(losses[-100:])),
               "n_choose": len(choose), "choose_escalation_rate": esc_choose, "choose_by_alpha": by_alpha,
               "escalated_choose": {"n": len(esc_lines), "slb_top1": esc_slb, "ce_alone_top1": esc_ce,
                                    "top_k_has_right": esc_any},
               "alpha": alpha, "best_choosing_alpha": best_al, "sizes": fold_sizes}
        torch.set_num_threads(1)
        with torch.inference_mode():
            for e in held_ex[:40]:
                t1 = time.perf_counter()
                logits_of([(e.text, ce_texts[j]) for j in range(k)], False)
                ms.append((time.perf_counter() - t1) * 1e3)
        torch.set_num_threads(2)
        return out

    for f in [int(x) for x in a.folds.split(",")]:
        per_fold[str(f)] = one_fold(f)

    pooled, fixed = pool_line_draws(hits, "slb")
    paired = {s: {**fixed["gated"][s], "escalation_rate": float(np.mean(esc_rate[s]))} for s in sizes}
    report = {"n": sum(v["n"] for v in per_fold.values()), "draws": a.draws,
              "hyperparams": {key: v for key, v in vars(a).items() if key != "json"}, "per_fold": per_fold,
              "pooled": pooled, "paired_line_draws": paired, "ce_ms_p50": float(np.percentile(ms, 50)),
              "ce_ms_p90": float(np.percentile(ms, 90)), "seconds": round(time.time() - t0, 1),
              "protocol": "the evaluation's folds and registries (seed 0, --draws draws); alpha chosen per fold on the "
                          "model's validation + calibration lines under the product's rule; float cosine scores"}
    write_report(a.json, report, plot, echo=(pooled, paired))
    print(f"cross-encoder, {k} pairs, 1 thread: p50 {report['ce_ms_p50']:.1f} ms, p90 {report['ce_ms_p90']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
