"""Pearson's chi-square goodness of fit, with the critical value computed here (no SciPy)."""

from __future__ import annotations

import math
from collections import Counter


def critical_value(df: int, significance: float) -> float:
    """Upper quantile of chi-square(df): Wilson-Hilferty's cube-root normal approximation,
    within about 1% of the exact quantile for df >= 5."""
    z = _normal_upper_quantile(significance)
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def _normal_upper_quantile(p: float) -> float:
    """z with P(Z > z) = p, by bisection on erfc (accurate to 1e-10)."""
    lo, hi = -10.0, 10.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(mid / math.sqrt(2)) > p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def goodness_of_fit(counts: Counter, expected_probs: dict, min_expected: float = 5.0) -> tuple[float, int]:
    """(statistic, degrees of freedom) for observed `counts` of outcomes against exact
    probabilities. Outcomes expected fewer than `min_expected` times are pooled into one bin
    (with anything observed that the law says is impossible), so the chi-square
    approximation holds."""
    n = sum(counts.values())
    statistic, bins = 0.0, 0
    pooled_expected, pooled_observed = 0.0, 0
    for outcome, p in expected_probs.items():
        e = n * p
        if e >= min_expected:
            statistic += (counts.get(outcome, 0) - e) ** 2 / e
            bins += 1
        else:
            pooled_expected += e
            pooled_observed += counts.get(outcome, 0)
    pooled_observed += sum(c for o, c in counts.items() if o not in expected_probs)
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        bins += 1
    elif pooled_observed:
        return math.inf, max(bins - 1, 1)
    return statistic, bins - 1
