"""The project's statistics, in one place: intervals for rates, paired differences and corrected rates.

- Wilson score intervals for a share of n (honest at small n and at 0% or 100%, where a percentile bootstrap
  collapses to a point), and `rate`, the summaries' rate record built on it;
- Newcombe's hybrid score interval for a paired difference of proportions (1998, method 10), a paired
  bootstrap for fractional scores, McNemar's exact test, the power of that test (Connor 1987) and the pairs a
  non-inferiority comparison needs;
- Rogan-Gladen's correction of a rate for a judge's measured error rates, with an interval that carries the
  uncertainty of the run and of the validation (Jeffreys draws), for one rate and for a paired difference;
- a percentile bootstrap over items for composite figures (balanced accuracy, F1, kappa, AUROC, ...).

Every figure here is tested against an independent reference (statsmodels, scipy, a hand computation).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist
from typing import Any, Protocol

import numpy as np

Z95 = 1.959963984540054  # the 97.5th percentile of the standard normal
ALPHA = 0.05
POWER = 0.8
BOOTSTRAP = 2000
SEED = 0


def wilson(successes: float, n: int) -> tuple[float | None, float | None]:
    """95% Wilson score interval for a share of `n` (the formula statsmodels' `proportion_confint(method="wilson")`
    computes, here in closed form: it is called for every group of every summary). `successes` may be a sum of
    scores in [0, 1]: such a score's variance is at most p(1 - p), so the interval is conservative for them."""
    if n == 0:
        return None, None
    p = successes / n
    z2 = Z95 * Z95
    denominator = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denominator
    half = Z95 / denominator * math.sqrt(max(0.0, p * (1 - p) / n + z2 / (4 * n * n)))
    return bracket(p, center - half, center + half)


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


# -- paired differences --------------------------------------------------------------------------------------


def _wilson_arrays(k: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`wilson` over arrays (n > 0), each interval containing its point."""
    p = k / n
    z2 = Z95 * Z95
    denominator = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denominator
    half = Z95 / denominator * np.sqrt(np.maximum(0.0, p * (1 - p) / n + z2 / (4 * n * n)))
    return np.minimum(p, np.maximum(0.0, center - half)), np.maximum(p, np.minimum(1.0, center + half))


def newcombe_arrays(
    both: np.ndarray, b_only: np.ndarray, a_only: np.ndarray, neither: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """95% intervals for p_B - p_A from paired binary counts (Newcombe 1998, method 10), over arrays of pair
    counts: `both` harmful in A and B, `b_only` in B only, `a_only` in A only, `neither`. Wilson intervals of
    both proportions, joined through the continuity-corrected correlation phi of the pairs."""
    both, b_only, a_only, neither = (np.asarray(x, dtype=float) for x in (both, b_only, a_only, neither))
    n = both + b_only + a_only + neither
    p_b, p_a = (both + b_only) / n, (both + a_only) / n
    l_b, u_b = _wilson_arrays(both + b_only, n)
    l_a, u_a = _wilson_arrays(both + a_only, n)
    cross = both * neither - b_only * a_only
    cross = np.where(cross > 0, np.maximum(cross - n / 2, 0.0), cross)
    margins = (both + b_only) * (a_only + neither) * (both + a_only) * (b_only + neither)
    phi = np.divide(cross, np.sqrt(margins), out=np.zeros_like(cross), where=margins > 0)
    diff = p_b - p_a
    lower = np.sqrt(np.maximum(0.0, (p_b - l_b) ** 2 - 2 * phi * (p_b - l_b) * (u_a - p_a) + (u_a - p_a) ** 2))
    upper = np.sqrt(np.maximum(0.0, (u_b - p_b) ** 2 - 2 * phi * (u_b - p_b) * (p_a - l_a) + (p_a - l_a) ** 2))
    return np.maximum(-1.0, np.minimum(diff, diff - lower)), np.minimum(1.0, np.maximum(diff, diff + upper))


def newcombe_paired(both: int, b_only: int, a_only: int, neither: int) -> tuple[float, float]:
    """`newcombe_arrays` for one set of pair counts."""
    low, high = newcombe_arrays(*(np.array([x]) for x in (both, b_only, a_only, neither)))
    return float(low[0]), float(high[0])


_DRAWN_AT_ONCE = 4_000_000  # resampled pair indices held at a time
_COUNTED_ABOVE = 500  # pairs beyond which few distinct differences are resampled as counts


def paired_bootstrap(a: np.ndarray, b: np.ndarray, draws: int = BOOTSTRAP, seed: int = SEED) -> np.ndarray:
    """Mean differences b - a over `draws` resamples of the pairs (the same pairs drawn for both), drawn a block
    of resamples at a time (memory stays bounded; the draws are those of one call). Beyond `_COUNTED_ABOVE` pairs
    whose differences take few values (rubric scores: at most nine), each resample is drawn as multinomial
    counts of those values: the same bootstrap distribution at a cost that does not grow with the pairs."""
    rng = np.random.default_rng(seed)
    n = len(a)
    differences = b - a
    values, counts = np.unique(differences, return_counts=True)
    if n > _COUNTED_ABOVE and len(values) <= 256:
        drawn = rng.multinomial(n, counts / n, size=draws)
        return (drawn @ values) / n
    rows = max(1, _DRAWN_AT_ONCE // max(1, n))
    means = [
        differences[rng.integers(0, n, size=(min(rows, draws - start), n))].mean(axis=1)
        for start in range(0, draws, rows)
    ]
    return np.concatenate(means)


def mcnemar_p(b: int, c: int) -> float:
    """McNemar's exact test on the discordant pairs: the two-sided binomial test of b vs c, 2 P(X <= min(b, c))
    for X ~ Binomial(b + c, 1/2), capped at 1 (statsmodels' `mcnemar(exact=True)`, whose import took 126 MB).
    The tail is summed from its largest term down, each term the one above times k / (n - k + 1), until the
    terms no longer change the sum: at most min(b, c) terms, a few thousand at a million pairs."""
    n, m = b + c, min(b, c)
    if n == 0:
        return 1.0
    log_top = math.lgamma(n + 1) - math.lgamma(m + 1) - math.lgamma(n - m + 1) - n * math.log(2)
    total, term = 1.0, 1.0
    for k in range(m, 0, -1):
        term *= k / (n - k + 1)
        total += term
        if term < total * 1e-17:
            break
    return min(1.0, 2 * math.exp(log_top) * total)


def holm(p_values: list[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given: the k-th smallest times (m - k + 1), made monotone, capped at
    1. Written out rather than statsmodels' `multipletests(method="holm")`, which calls `gc.collect()` each time:
    measured at 44 ms a call with a comparison's columns alive, 1.3 s of a 100,000-answer `compare` (30 calls).
    tests/test_paired.py checks it equals statsmodels'."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda k: p_values[k])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


_NORMAL = NormalDist()  # the standard normal of the stdlib: a power search calls it ~120 times, scipy's costs
# ~70 us a call there (argument checks and broadcasting), which made a gate with a baseline spend most of its time
# on the minimum detectable increase of each group


def _power(delta: float, n: int, discordance: float, z: float) -> float:
    """Power of the two-sided McNemar test to detect p_B - p_A = delta with n pairs (Connor 1987); `z`: the test's
    critical value, `_NORMAL.inv_cdf(1 - alpha / 2)` (the same float for every delta of a search: found once)."""
    psi = max(discordance, delta)  # at least |delta| of the pairs must be discordant
    if psi <= 0 or n <= 0:
        return 0.0
    spread = math.sqrt(max(psi - delta**2, 1e-12))
    return _NORMAL.cdf((delta * math.sqrt(n) - z * math.sqrt(psi)) / spread)


def min_detectable_increase(n: int, discordance: float, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The smallest increase of the harmful rate detected with `power` at `alpha` (two-sided) with `n` pairs of
    which a share `discordance` disagree; None when no increase up to 1 is (n too small)."""
    z = _NORMAL.inv_cdf(1 - alpha / 2)
    if n == 0 or _power(1.0, n, discordance, z) < power:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection: power grows with delta
        mid = (low + high) / 2
        low, high = (mid, high) if _power(mid, n, discordance, z) < power else (low, mid)
    return high


# -- a judge's error rates -----------------------------------------------------------------------------------


class ConfusionCounts(Protocol):
    """A validated judge's confusion counts on a gold set (positive = harmful)."""

    tp: float
    fp: float
    tn: float
    fn: float


def rogan_gladen(p: float, se: float, sp: float) -> float | None:
    """The corrected prevalence (p + sp - 1) / (se + sp - 1) (Rogan and Gladen, 1978), clipped to [0, 1]; None
    when the judge is no better than chance."""
    if se + sp - 1 <= 0:
        return None
    return float(np.clip((p + sp - 1) / (se + sp - 1), 0.0, 1.0))


def _jeffreys(counts: ConfusionCounts, rng: np.random.Generator, draws: int) -> tuple[np.ndarray, np.ndarray]:
    """Draws of sensitivity and specificity from their Jeffreys Beta(k + 1/2, n - k + 1/2) posteriors."""
    se = rng.beta(counts.tp + 0.5, counts.fn + 0.5, draws)
    sp = rng.beta(counts.tn + 0.5, counts.fp + 0.5, draws)
    return se, sp


def corrected_rate(
    k: float, n: int, counts: ConfusionCounts, draws: int = 4000, seed: int = SEED
) -> tuple[float | None, float | None, float | None]:
    """(corrected rate, 95% low, 95% high) for k of n answers judged harmful by a judge with these confusion
    counts; `k` may be a sum of scores in [0, 1] (ASR with uncertain = 0.5). p, se and sp are drawn from their
    Jeffreys posteriors (a parametric bootstrap that stays honest when a count is 0 or n); the interval always
    contains the estimate, and is None when the judge is too often no better than chance to bound it."""
    positives, negatives = counts.tp + counts.fn, counts.tn + counts.fp
    if n == 0 or positives == 0 or negatives == 0:
        return None, None, None
    value = rogan_gladen(k / n, counts.tp / positives, counts.tn / negatives)
    if value is None:
        return None, None, None
    rng = np.random.default_rng(seed)
    p = rng.beta(k + 0.5, n - k + 0.5, draws)
    se, sp = _jeffreys(counts, rng, draws)
    informative = se + sp - 1 > 0
    corrected = np.clip((p + sp - 1)[informative] / (se + sp - 1)[informative], 0.0, 1.0)
    if informative.mean() < 0.975:  # too often no better than chance to bound it
        return value, None, None
    # a draw where the judge is no better than chance bounds nothing: it counts as the worst case
    corrected = np.concatenate([corrected, np.ones(int((~informative).sum()))])
    low, high = bracket(value, float(np.percentile(corrected, 2.5)), float(np.percentile(corrected, 97.5)))
    return value, low, high


def corrected_difference(
    scores_a: np.ndarray, scores_b: np.ndarray, counts: ConfusionCounts, draws: int = BOOTSTRAP
) -> tuple[float | None, float | None, float | None]:
    """The difference of corrected ASRs (Rogan-Gladen of each, so the difference is diff / (se + sp - 1)), with
    a 95% interval from paired resamples and Jeffreys draws of se and sp."""
    positives, negatives = counts.tp + counts.fn, counts.tn + counts.fp
    if not positives or not negatives:
        return None, None, None
    youden = counts.tp / positives + counts.tn / negatives - 1
    if youden <= 0:
        return None, None, None
    value = float(scores_b.mean() - scores_a.mean()) / youden
    se, sp = _jeffreys(counts, np.random.default_rng(SEED + 1), draws)
    informative = se + sp - 1 > 0
    if informative.mean() < 0.975:
        return value, None, None
    spread = paired_bootstrap(scores_a, scores_b, draws)[informative] / (se + sp - 1)[informative]
    low, high = float(np.percentile(spread, 2.5)), float(np.percentile(spread, 97.5))
    return value, min(low, value), max(high, value)


# -- composite figures ---------------------------------------------------------------------------------------


def bootstrap(
    n: int, statistic: Callable[[np.ndarray], dict[str, float]], resamples: int, seed: int
) -> dict[str, tuple[float, float]]:
    """Percentile 95% CI of every figure `statistic(indices)` returns, over `resamples` resamples of n items
    (NaN-valued resamples, e.g. AUROC of a one-class resample, are left out)."""
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {}
    for _ in range(resamples):
        for name, value in statistic(rng.integers(0, n, n)).items():
            draws.setdefault(name, []).append(value)
    intervals = {}
    for name, values in draws.items():
        array = np.array(values, dtype=float)
        array = array[np.isfinite(array)]
        intervals[name] = (
            (float(np.percentile(array, 2.5)), float(np.percentile(array, 97.5))) if len(array) else (np.nan, np.nan)
        )
    return intervals


def null_pairs(baseline_asr: float, discordance: float | None = None) -> np.ndarray:
    """Shares of (both harmful, candidate only, baseline only, neither) among pairs when the candidate is exactly
    as safe as a baseline at `baseline_asr`, with a share `discordance` of the pairs disagreeing (default: that
    of unrelated verdicts, 2p(1 - p); it can be no more than 2 min(p, 1 - p))."""
    p = baseline_asr
    psi = 2 * p * (1 - p) if discordance is None else min(discordance, 2 * min(p, 1 - p))
    return np.array([p - psi / 2, psi / 2, psi / 2, 1 - p - psi / 2]).clip(0.0, 1.0)


def non_inferiority_power(
    n: int, baseline_asr: float, margin: float, discordance: float | None = None, draws: int = 2000, seed: int = SEED
) -> float:
    """The share of `draws` simulated comparisons of n pairs, with the candidate as safe as the baseline, whose
    paired 95% upper bound (Newcombe, as the gate computes it) stays at or under `margin`: the chance such a
    candidate passes the gate."""
    shares = null_pairs(baseline_asr, discordance)
    counts = np.random.default_rng(seed).multinomial(n, shares / shares.sum(), size=draws)
    _, high = newcombe_arrays(*counts.T)
    return float((high <= margin).mean())


def items_needed(
    baseline_asr: float, margin: float, discordance: float | None = None, power: float = POWER, limit: int = 10**7
) -> int | None:
    """Pairs a non-inferiority comparison needs: the fewest n for which a candidate as safe as the baseline passes
    the gate (Newcombe's paired upper bound under `margin`) in at least `power` of simulated comparisons. Sized
    on the interval the gate uses, so it holds at a baseline ASR of 0 too, where an interval of zero width would
    say one pair is enough. None when even `limit` pairs are too few."""
    if non_inferiority_power(limit, baseline_asr, margin, discordance) < power:
        return None
    low, high = 0, 1
    while non_inferiority_power(high, baseline_asr, margin, discordance) < power:
        low, high = high, high * 2
    while high - low > 1:  # the smallest n whose simulated power reaches `power` (the same draws for every n)
        mid = (low + high) // 2
        low, high = (mid, high) if non_inferiority_power(mid, baseline_asr, margin, discordance) < power else (low, mid)
    return high


def exact_add(partials: list[float], value: float) -> None:
    """Shewchuk's exact running sum (the partials `math.fsum` takes): a mean over a million scores loses no digit,
    and a summary is the same whatever order its records come in (runs, merges and shards agree)."""
    i = 0
    for y in partials:
        if abs(value) < abs(y):
            value, y = y, value
        high = value + y
        low = y - (high - value)
        if low:
            partials[i] = low
            i += 1
        value = high
    partials[i:] = [value]
