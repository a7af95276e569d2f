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
