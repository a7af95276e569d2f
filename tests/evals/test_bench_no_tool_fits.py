"""bench/no_tool_fits.py's arithmetic on known scores: what a threshold sends to text, and the AUC."""

import numpy as np
import pytest

from tests.conftest import load_bench


def test_rates_and_auc_of_a_threshold():
    bench = load_bench("no_tool_fits")
    s = {"fits": np.array([0.1, 0.5, 0.6, 0.9]), "right": np.array([True, False, True, True]),
         "none": np.array([0.05, 0.2, 0.55, 0.7])}
    assert bench.rates(s, 0.3) == {"fitting_sent_to_text": 0.25, "right_calls_lost": 0.25,
                                   "nothing_fits_sent_to_text": 0.5}
    # pairs (fit, none) with fit > none: 0.1 > 0.05; 0.5 > 0.05, 0.2; 0.6 > 0.05, 0.2, 0.55; 0.9 > all four
    assert bench.auc(s) == pytest.approx(10 / 16)
    assert bench.auc({"fits": s["fits"], "none": s["fits"] - 1}) == 1.0


def test_the_rank_mean_puts_two_scorers_on_one_scale():
    bench = load_bench("no_tool_fits")
    a = np.array([0.9, 0.1, 0.5, 0.3])  # fits: 0.9, 0.1; none: 0.5, 0.3
    b = np.array([10.0, 30.0, 20.0, 0.0])
    fit, none = bench.rank_mean(a, b)
    # ranks of a: 1, 0, 2/3, 1/3; of b: 1/3, 1, 2/3, 0
    assert fit.tolist() == pytest.approx([2 / 3, 1 / 2]) and none.tolist() == pytest.approx([2 / 3, 1 / 6])


@pytest.mark.integration
def test_the_models_verdict_is_a_probability_and_the_cache_does_not_change_it():
    bench = load_bench("no_tool_fits")
    probe = bench.FitProbe("qwen2.5-coder-0.5b")
    sigs = ["brave_web_search(query: str) - Performs a web search", "get_current_time(timezone: str) - The time"]
    first = probe("what time is it in Tokyo", sigs)
    other = probe("write a poem about cats", sigs[:1])  # shares the system text only
    assert 0.0 < first < 1.0 and 0.0 < other < 1.0 and first != other
    assert probe("what time is it in Tokyo", sigs) == pytest.approx(first, abs=0.02)  # from the cache (batching moves the float sums)
