"""Confidence intervals for rates: Wilson score intervals, honest at small n and at 0% or 100%."""

from __future__ import annotations

from typing import Any


def wilson(successes: float, n: int) -> tuple[float | None, float | None]:
    """95% Wilson score interval (statsmodels) for a share of `n`: honest at small n and at 0% or 100%, where
    a percentile bootstrap collapses to a point (4 answers all harmful: [51%, 100%], not [100%, 100%]).
    `successes` may be a sum of scores in [0, 1]: such a score's variance is at most p(1 - p), so the
    interval is conservative for them."""
    if n == 0:
        return None, None
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(successes, n, alpha=0.05, method="wilson")
    return bracket(successes / n, float(low), float(high))


def rate(successes: int, n: int) -> dict[str, Any]:
    """`successes` of `n` as a summary's rate record: the share (None when n = 0) with its Wilson 95% interval."""
    low, high = wilson(successes, n)
    return {"rate": successes / n if n else None, "ci_low": low, "ci_high": high, "n": n}


def bracket(point: float, low: float, high: float) -> tuple[float, float]:
    """An interval clamped to [0, 1] that contains its own point estimate exactly. Wilson's formula in floating
    point gives 2.8e-17 for 0 of 7 and 0.9999999999999999 for 7 of 7: an interval that excludes its estimate
    (and negative error bars in a chart)."""
    point = min(1.0, max(0.0, point))
    return min(point, max(0.0, low)), max(point, min(1.0, high))
