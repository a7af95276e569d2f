"""bench/routing_lexical_stage.py: the stage's decision, the classifier on a tiny corpus, the nested choice of alpha and
the plot (its held-out figures need the fold models and are the bench's)."""

import numpy as np

from tests.conftest import load_bench

NAMES = ["git_diff_staged", "git_diff_unstaged", "pods_list"]


def test_decide_reranks_only_near_ties_and_only_among_known_tools():
    ls = load_bench("routing_lexical_stage")
    sc = np.array([3.0, 2.95, -np.inf], np.float32)
    lex = np.array([0.0, 4.0, 1.0], np.float32)
    assert ls.decide(sc, lex, tau=0.1, alpha=0.1, k=2) == 1  # margin 0.05 < tau: 2.95 + 0.1 * 0 beats 3.0 - 0.4
    assert ls.decide(sc, lex, tau=0.01, alpha=0.1, k=2) == 0  # a clear margin: the SLB decides
    assert ls.decide(sc, lex, tau=0.1, alpha=0.0, k=2) == 0  # no weight: the SLB decides
    assert ls.decide(sc, lex, tau=0.1, alpha=0.01, k=2) == 0  # too small a weight to flip it
    # a candidate without a class (registered after training): the SLB's order stands
    assert ls.decide(sc, np.array([0.0, np.nan, 1.0], np.float32), tau=0.1, alpha=1.0, k=2) == 0


def test_classifier_reads_the_query_not_its_history():
    ls = load_bench("routing_lexical_stage")
    texts = ["show the staged changes", "diff of what is staged for commit", "show the unstaged changes",
             "what is not yet staged", "list the pods", "which pods are running"]
    clf = ls.LexicalClassifier(texts, [0, 0, 1, 1, 2, 2], len(NAMES), c=10.0)
    logits = clf.logits(["list pods in the cluster", "list pods\n[context] user: show the staged changes"])
    assert logits.shape == (2, 3)
    assert np.argmax(logits[0]) == 2 and np.argmax(logits[1]) == 2  # the history's words do not count
    partial = ls.LexicalClassifier(texts[:4], [0, 0, 1, 1], len(NAMES), c=10.0)
    assert np.isnan(partial.logits(["list the pods"])[0, 2])  # no class for a tool it never saw


def test_nested_choice_takes_each_folds_alpha_from_the_other_folds():
    ls = load_bench("routing_lexical_stage")
    a_small, a_big = ls.ALPHAS[0], ls.ALPHAS[-1]
    # folds 0 and 1: the big alpha fixes one line each; fold 2: the big alpha breaks two
    none = {"250": {"x#0": False, "y#0": False, "z#0": True, "w#0": True}}
    grid = {f: {al: {"250": {}} for al in ls.ALPHAS} for f in range(3)}
    for f, key, fixed in ((0, "x#0", True), (1, "y#0", True)):
        for al in ls.ALPHAS:
            grid[f][al]["250"][key] = fixed if al == a_big else False
    for al in ls.ALPHAS:
        grid[2][al]["250"].update({"z#0": al != a_big, "w#0": al != a_big})
    got = ls.nested_choice(grid, none, "250")
    # fold 0 sees folds 1 (+1) and 2 (-2) at the big alpha: -1, so the smallest alpha (0); likewise fold 1;
    # fold 2 sees +2 from folds 0 and 1 at the big alpha
    assert got == {0: a_small, 1: a_small, 2: a_big}


def test_plot_writes_a_png(tmp_path):
    ls = load_bench("routing_lexical_stage")
    size = {"accuracy": 0.9, "ci95": [0.87, 0.92]}
    cell = {"n": 100, "fixed": 3, "broken": 2}
    report = {"pooled": {arm: {"10": size, "250": size} for arm in ("none", "lexical stage (choose)")},
              "per_fold": {"0": {"held_out_grid": {"250": {str(a): cell for a in ls.ALPHAS}}}}}
    ls.plot(report, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
