"""Confidence intervals for rates: Wilson score intervals, honest at small n and at 0% or 100%."""

from __future__ import annotations


def wilson(successes: float, n: int) -> tuple[float | None, float | None]:
    """95% Wilson score interval (statsmodels) for a share of `n`: honest at small n and at 0% or 100%, where
    a percentile bootstrap collapses to a point (4 answers all harmful: [51%, 100%], not [100%, 100%]).
    `successes` may be a sum of scores in [0, 1]: such a score's variance is at most p(1 - p), so the
    interval is conservative for them."""
    if n == 0:
        return None, None
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(successes, n, alpha=0.05, method="wilson")
    return max(0.0, float(low)), min(1.0, float(high))
