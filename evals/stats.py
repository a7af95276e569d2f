"""Small statistics shared by the evaluations: Wilson intervals, bootstrap CIs of medians, percentiles, the exact
sign test of paired changes."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95 % interval of a proportion."""
    if n <= 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, center - half), min(1.0, center + half))


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def bootstrap_median_ci(values: Sequence[float], iters: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap 95 % interval of the median."""
    if not values:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(median([values[rng.randrange(n)] for _ in range(n)]) for _ in range(iters))
    return (meds[int(0.025 * iters)], meds[int(0.975 * iters) - 1])


def bootstrap_mean_ci(values: Sequence[float], iters: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap 95 % interval of the mean (e.g. of per-line accuracies averaged over repeated draws,
    where the draws of one line are not independent trials and a Wilson interval over all of them is too narrow)."""
    if not len(values):
        return (float("nan"), float("nan"))
    import numpy as np

    v = np.asarray(values, np.float64)
    means = np.sort(v[np.random.default_rng(seed).integers(0, len(v), (iters, len(v)))].mean(1))
    return (float(means[int(0.025 * iters)]), float(means[int(0.975 * iters) - 1]))


def bootstrap_ratio_ci(num: Sequence[float], den: Sequence[float], iters: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """95 % interval of median(num)/median(den), resampling paired observations."""
    if not num or len(num) != len(den):
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(num)
    out = []
    for _ in range(iters):
        idx = [rng.randrange(n) for _ in range(n)]
        d = median([den[i] for i in idx])
        out.append(median([num[i] for i in idx]) / d if d else float("nan"))
    out.sort()
    return (out[int(0.025 * iters)], out[int(0.975 * iters) - 1])


def sign_test(fixed: int, broken: int) -> float:
    """Two-sided exact binomial p of ``fixed`` vs ``broken`` changed pairs under "the stage changes nothing on
    average" (ties, the unchanged pairs, carry no information)."""
    n = fixed + broken
    if n == 0:
        return 1.0
    k = min(fixed, broken)
    p = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * p)


def paired(arm: Sequence[bool], base: Sequence[bool], alpha: float = 0.05) -> dict[str, Any]:
    """Paired trials (the same items, right or not, under ``arm`` and ``base``): how many only ``arm`` gets right
    (gained), only ``base`` (lost), the sign test's two-sided p, and the verdict (``gains`` / ``loses`` at p <
    ``alpha``, else ``no evidence``)."""
    if len(arm) != len(base):
        raise ValueError(f"paired trials of unequal length: {len(arm)} vs {len(base)}")
    gained = sum(1 for a, b in zip(arm, base, strict=True) if a and not b)
    lost = sum(1 for a, b in zip(arm, base, strict=True) if b and not a)
    p = sign_test(gained, lost)
    verdict = "gains" if gained > lost and p < alpha else "loses" if lost > gained and p < alpha else "no evidence"
    return {"gained": gained, "lost": lost, "net": gained - lost, "sign_test_p": p, "verdict": verdict}
