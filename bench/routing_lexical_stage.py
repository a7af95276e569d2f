"""A supervised lexical second stage: do the request's words separate the siblings the sentence vector confuses?
(issue 4; negative)

    nice -n 19 .venv/bin/python bench/routing_lexical_stage.py --json reports/routing_lexical_stage.json

bench/routing_errors.py found most held-out errors at N = 250 decidable from a qualifier that the sentence vector
washes out ("staged" / "not yet staged", "across all namespaces", "for the acme-corp organization"). Every stage
tried so far reads the candidates' text; this one learns which words mark which tool from the requests themselves:
a tf-idf (word uni- and bigrams of the query, not its history) multinomial logistic regression over each gate
model's exemplar rows (the train.jsonl fit lines and ``data/routing_augment`` it trained on, ~13 per tool). On a
request whose SLB margin is below ``tau`` it re-ranks the top ``k`` by ``slb + alpha * (logit - max logit among
them)``; a candidate without a class (registered after training) leaves the SLB's order. It costs microseconds.

Per fold (the evaluation's fold models, float scores with their tool bias), ``(q, alpha, k)`` is chosen on two sets
the fold never holds out (``tau`` the q-th quantile of their margins):

* ``choose``: the model's validation + calibration lines (what ``train-gate`` calibrates on), classifier on every row;
* ``fit-loo``: the model's own train.jsonl fit lines, each scored without its exemplar row, the classifier trained on
  the augment rows only (so it has not seen them): lines written like the held-out ones.

Held out: the fold's lines at each size over ``--draws`` draws (the evaluation's registries). The report also has
the held-out top-1 over the alpha grid at q = 0.2, k = 3 (``held_out_grid``), and a third arm chosen from it by
nested cross-validation: each fold takes the alpha that gains most on the *other two* folds' held-out lines at the
largest size (``nested_choice``), the errors unseen requests make, never its own.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.evals.routing_models import prepare_training_env  # noqa: E402
from services.router.argevidence import margins  # noqa: E402
from services.router.keys import query_part  # noqa: E402

QUANTILES = (0.1, 0.2, 0.3, 0.5)
ALPHAS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
TOP_K = (2, 3)
RULES = ("choose", "fit-loo")
NESTED = "lexical stage (nested: other folds' held-out)"


class LexicalClassifier:
    """tf-idf (word uni- + bigrams of the query part) + multinomial logistic regression over ``names``' indices."""

    def __init__(self, texts: Sequence[str], labels: Sequence[int], n_tools: int, c: float):
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression

        self.n = n_tools
        self.vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=r"(?u)\b\w+\b")
        x = self.vec.fit_transform([query_part(t) for t in texts])
        self.clf = LogisticRegression(C=c, max_iter=300).fit(x, list(labels))

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), n_tools)`` decision values; NaN for a tool without a class."""
        d = self.clf.decision_function(self.vec.transform([query_part(t) for t in texts]))
        out = np.full((len(texts), self.n), np.nan, np.float32)
        out[:, self.clf.classes_] = d
        return out


def decide(sc: np.ndarray, lex: np.ndarray, tau: float, alpha: float, k: int) -> int:
    """The pick for one request (``sc``: SLB scores, -inf outside its registry)."""
    top = np.argsort(-sc, kind="stable")[:k]
    if alpha <= 0 or len(top) < 2 or sc[top[0]] - sc[top[1]] >= tau:
        return int(top[0])
    lx = lex[top]
    if np.isnan(lx).any():
        return int(top[0])
    return int(top[np.argsort(-(sc[top] + alpha * (lx - lx.max())), kind="stable")[0]])


def top1(scores: np.ndarray, lex: np.ndarray, positives: Sequence[frozenset[str]], names: Sequence[str],
         setting: tuple[float, float, int] | None) -> float:
    """Top-1 of a choosing set under ``setting`` (tau, alpha, k), or the SLB alone (None)."""
    tau, alpha, k = setting if setting is not None else (-1.0, 0.0, 1)
    return float(np.mean([names[decide(scores[r], lex[r], tau, alpha, k)] in positives[r]
                          for r in range(len(scores))]))


def choose(scores: np.ndarray, lex: np.ndarray, positives, names) -> dict[str, Any]:
    """The grid's best (q, alpha, k) on a choosing set (ties: the smaller quantile, then alpha, then k)."""
    m = margins(scores)
    best: dict[str, Any] = {"top1_slb": top1(scores, lex, positives, names, None)}
    best_key = None
    for q in QUANTILES:
        tau = float(np.quantile(m, q))
        for alpha in ALPHAS:
            for k in TOP_K:
                acc = top1(scores, lex, positives, names, (tau, alpha, k))
                if best_key is None or acc > best_key:
                    best_key = acc
                    best.update(q=q, tau=tau, alpha=alpha, k=k, top1=acc)
    return best


def nested_choice(grid_hits: dict[int, dict[float, dict[str, dict[str, bool]]]], none: dict[str, dict[str, bool]],
                  size: str) -> dict[int, float]:
    """Per fold, the alpha of the held-out grid that gains most over ``none`` at ``size`` on the *other* folds'
    held-out lines (ties: the smaller alpha): choosing on errors that unseen requests make, never on the fold's own."""
    out = {}
    for f in grid_hits:
        def gain(al: float, f=f) -> int:
            return sum(int(ok) - int(none[size][k]) for g, by in grid_hits.items() if g != f
                       for k, ok in by[al][size].items())
        out[f] = max(ALPHAS, key=lambda al: (gain(al), -al))
    return out


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from services.evals.routing import draw_arms

    pooled = report["pooled"]
    sizes = list(next(iter(pooled.values())))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.4))
    draw_arms(ax, {arm: [p[s] for s in sizes] for arm, p in pooled.items()}, [f"N = {s}" for s in sizes],
              "held-out top-1: the stage as each choosing set sets it", ci="95 % CI, bootstrap over lines")
    last = sizes[-1]
    for f, fold in report["per_fold"].items():
        g = fold["held_out_grid"][last]
        bx.plot(ALPHAS, [100 * (g[str(a)]["fixed"] - g[str(a)]["broken"]) / g[str(a)]["n"] for a in ALPHAS], "o-",
                label=f"fold {f}")
    bx.axhline(0, color="k", lw=0.8)
    bx.set_xscale("log")
    bx.set_xticks(ALPHAS, [str(a) for a in ALPHAS])
    bx.minorticks_off()
    bx.set_xlabel("alpha (q 0.2, top 3)")
    bx.set_ylabel(f"held-out top-1 change at N = {last} (points)")
    bx.set_title("the same stage over its alpha grid, per fold (never used to choose)")
    bx.legend(fontsize=8)
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    from services.evals.routing import add_protocol_args

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_protocol_args(ap, sizes="10,250", calibration=True, draws=3)
    ap.add_argument("--json", default="reports/routing_lexical_stage.json")
    ap.add_argument("--c", type=float, default=4.0, help="the logistic regression's inverse regularisation")
    a = ap.parse_args(argv)
    prepare_training_env()

    from services.evals.routing import pool_line_draws, pooled_top1, write_report
    from services.evals.routing_models import float_bench
    from services.training.data import equivalents
    from services.training.gate import make_examples

    t0 = time.time()
    fb = float_bench(a)
    proto, names, pos = fb.proto, fb.names, fb.pos
    arms = ("none", *(f"lexical stage ({r})" for r in RULES))
    hits: dict[str, dict[str, dict[str, bool]]] = {arm: {s: {} for s in proto.sizes} for arm in arms}
    # the held-out grid's picks per fold: {fold: {alpha: {size: {key: right}}}}, for the nested arm
    grid_hits: dict[int, dict[float, dict[str, dict[str, bool]]]] = {}
    per_fold: dict[str, Any] = {}
    for f in [int(x) for x in a.folds.split(",")]:
        fm = fb.fold(f, a.models_root)
        bias = fm.bias(names)
        train, _ = proto.split(f)
        fit_ex = {e.id: e for e in make_examples(train, set(names), equivalents, fb.hp.max_turns)}
        t1 = time.time()
        lex_all = LexicalClassifier([r["text"] for r in fm.rows], [pos[r["tool"]] for r in fm.rows], len(names), a.c)
        fit_seconds = time.time() - t1
        aug = [r for r in fm.rows if r["id"] not in fit_ex]
        lex_aug = LexicalClassifier([r["text"] for r in aug], [pos[r["tool"]] for r in aug], len(names), a.c)
        loo = [(j, fit_ex[r["id"]]) for j, r in enumerate(fm.rows) if r["id"] in fit_ex]
        sets = {
            "choose": (fm.scores([e.text for e in fm.choose], fb.keys) + bias,
                       lex_all.logits([e.text for e in fm.choose]), [e.positives for e in fm.choose]),
            "fit-loo": (fm.scores([e.text for _, e in loo], fb.keys, leave_out=np.array([j for j, _ in loo])) + bias,
                        lex_aug.logits([e.text for _, e in loo]), [e.positives for _, e in loo]),
        }
        chosen = {rule: choose(*sets[rule], names) for rule in RULES}
        for rule, c in chosen.items():
            print(f"fold {f} {rule} ({len(sets[rule][0])} lines): {100 * c['top1_slb']:.2f} -> {100 * c['top1']:.2f} "
                  f"(q {c['q']}, alpha {c['alpha']}, k {c['k']})", flush=True)
        hs = fm.scores([e.text for e in fm.held], fb.keys) + bias
        hl = lex_all.logits([e.text for e in fm.held])
        tau_grid = float(np.quantile(margins(sets["choose"][0]), 0.2))
        grid = {s: {str(al): {"n": 0, "fixed": 0, "broken": 0} for al in ALPHAS} for s in proto.sizes}
        gh = grid_hits[f] = {al: {s: {} for s in proto.sizes} for al in ALPHAS}
        for s in proto.sizes:
            for d, regs in enumerate(proto.draw_regs):
                for r, i in enumerate(fm.idxs):
                    sc = np.full(len(names), -np.inf, np.float32)
                    idx = [pos[t] for t in regs[s][i] if t in pos]
                    sc[idx] = hs[r][idx]
                    key = f"{proto.lines[i].id}#{d}"
                    ok0 = names[int(np.argmax(sc))] in fm.held[r].positives
                    hits["none"][s][key] = ok0
                    for rule, c in chosen.items():
                        hits[f"lexical stage ({rule})"][s][key] = (
                            names[decide(sc, hl[r], c["tau"], c["alpha"], c["k"])] in fm.held[r].positives)
                    for al in ALPHAS:
                        ok = names[decide(sc, hl[r], tau_grid, al, 3)] in fm.held[r].positives
                        gh[al][s][key] = ok
                        cell = grid[s][str(al)]
                        cell["n"] += 1
                        cell["fixed"] += ok and not ok0
                        cell["broken"] += ok0 and not ok
        per_fold[str(f)] = {"model": fm.dir.name, "rows": len(fm.rows), "fit_loo_lines": len(loo),
                            "classifier_fit_seconds": round(fit_seconds, 1), "chosen": chosen,
                            "held_out_grid": grid, "held_out_grid_tau": tau_grid}
        print(f"fold {f} held out at N = {proto.sizes[-1]}, alpha grid (fixed/broken): " + ", ".join(
            f"{al}: {v['fixed']}/{v['broken']}" for al, v in grid[proto.sizes[-1]].items()), flush=True)
    nested = nested_choice(grid_hits, hits["none"], proto.sizes[-1])
    hits[NESTED] = {s: {k: v for f, al in nested.items() for k, v in grid_hits[f][al][s].items()} for s in proto.sizes}
    for f, al in nested.items():
        per_fold[str(f)]["nested_alpha"] = al
    print(f"nested: alpha per fold, chosen on the other folds' held-out lines at N = {proto.sizes[-1]}: {nested}")
    pooled, paired = pool_line_draws(hits, "none")
    report = {"folds": [int(x) for x in a.folds.split(",")], "draws": a.draws, "c": a.c,
              "grids": {"quantiles": list(QUANTILES), "alphas": list(ALPHAS), "top_k": list(TOP_K)},
              "per_fold": per_fold, "pooled": pooled, "paired_vs_none_line_draws": paired,
              "seconds": round(time.time() - t0, 1),
              "protocol": "the evaluation's folds and registries (seed 0, --draws draws); float SLB scores with the "
                          "model's tool bias; (q, alpha, k) chosen per fold on each choosing set; the classifier never "
                          "saw a held-out line; the nested arm takes each fold's alpha from the other folds' held_out_grid, "
                          "never its own"}
    write_report(a.json, report, plot, echo=(pooled_top1(pooled), paired))
    return 0


if __name__ == "__main__":
    sys.exit(main())
