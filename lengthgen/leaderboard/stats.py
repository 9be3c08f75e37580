"""Statistics of the leaderboard: intervals over seeds, learned seeds, effective length.

Quantiles come from ``scipy.stats`` (the field's reference implementation) rather than a
hand-written series. With one seed there is no spread to estimate, so a cell falls back to the
run's own 95% Wilson interval over its test samples, which the harness records with every row
(``exact_match_lo`` / ``exact_match_hi``, at the same confidence level).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats as scipy_stats

#: Confidence level of every interval on the leaderboard (seed intervals and the runs' Wilson ones).
CONFIDENCE = 0.95

#: Mean exact match a factor must reach (at it and every shorter factor) for the effective length.
EFFECTIVE_THRESHOLD = 0.9

#: In-distribution (1×) test exact match at which a seed counts as having learned the task.
LEARNED_THRESHOLD = 0.9


@functools.cache
def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student-t critical value (12.706 for df 1, 2.776 for df 4 at 95%)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be ≥ 1, got {df}")
    return float(scipy_stats.t.ppf(0.5 + confidence / 2, df))


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int
    method: str  # "t", "wilson" or "none"


def is_missing(value: Any) -> bool:
    """None or NaN (pandas' missing values included)."""
    if value is None:
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return False


def stable_mean(values: Iterable[Any]) -> float:
    """Mean of the present values, independent of their order (``math.fsum`` over sorted values);
    NaN when none is present."""
    xs = sorted(float(v) for v in values if not is_missing(v))
    return math.fsum(xs) / len(xs) if xs else math.nan


def seed_interval(values: Sequence[float], wilson: tuple[float, float] | None = None) -> Interval:
    """Mean over seeds with a 95% interval, clipped to [0, 1].

    ≥ 2 seeds: Student t over the per-seed values. 1 seed: the run's Wilson interval (its samples)
    when given.
    """
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    mean = math.fsum(xs) / n
    if n == 1:
        if wilson is None or any(is_missing(v) for v in wilson):
            return Interval(mean, math.nan, math.nan, 1, "none")
        return Interval(mean, float(wilson[0]), float(wilson[1]), 1, "wilson")
    half = t_quantile(n - 1) * statistics.stdev(xs) / math.sqrt(n)
    return Interval(mean, max(0.0, mean - half), min(1.0, mean + half), n, "t")


def learned(exact_1x: Any) -> bool:
    """Whether a seed learned the task: 1× exact match ≥ the threshold (a missing value did not)."""
    return not is_missing(exact_1x) and float(exact_1x) >= LEARNED_THRESHOLD


def effective_length(means: dict[int, float], threshold: float = EFFECTIVE_THRESHOLD) -> tuple[int, bool]:
    """Largest factor f with mean ≥ threshold at every evaluated factor ≤ f (0 if 1× fails or is absent).

    Returns (f, capped): ``capped`` means every evaluated factor passed, so the true effective
    length may be longer than the longest length evaluated. NaN counts as below the threshold.
    """
    factors = sorted(means)
    if not factors or factors[0] != 1:
        return 0, False
    best = 0
    for f in factors:
        value = means[f]
        if is_missing(value) or value < threshold:
            return best, False
        best = f
    return best, True
