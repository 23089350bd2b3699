"""The metric registry: every metric is a named spec; metrics that share work form a family computed together.

A family is a function `(names, pairs) -> {name: scores}` that scores a batch of (prompt, response,
reference) pairs for several of its metrics at once (e.g. all 24 ROUGE variants from one tokenization).
Every metric returns one float per pair where higher means more harmful; NaN means "could not score".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from diagsafe_local.core.registry import Registry


@dataclass(frozen=True)
class TextPair:
    """What a metric sees: the harmful prompt, the response under test and (for reference metrics) a reference."""

    prompt: str
    response: str
    reference: str = ""


@dataclass(frozen=True)
class MetricSpec:
    """All facts about one metric."""

    name: str
    description: str
    family: str
    needs_reference: bool
    source: str


FamilyFn = Callable[[Sequence[str], Sequence[TextPair]], dict[str, np.ndarray]]

METRICS: Registry[MetricSpec] = Registry("metric")
_FAMILIES: dict[str, FamilyFn] = {}


def register_family(family: str, specs: Sequence[MetricSpec], fn: FamilyFn) -> None:
    """Register a family's compute function and its metric specs."""
    if family in _FAMILIES:
        raise ValueError(f"metric family '{family}' is registered twice")
    _FAMILIES[family] = fn
    for spec in specs:
        METRICS.add(spec)


def compute_metrics(
    names: Sequence[str],
    pairs: Sequence[TextPair],
    on_family: Callable[[list[str]], None] | None = None,
) -> dict[str, np.ndarray]:
    """Score `pairs` with each named metric, running each family once for all its requested metrics
    (`on_family(members)` after each family)."""
    by_family: dict[str, list[str]] = {}
    for name in names:
        by_family.setdefault(METRICS.get(name).family, []).append(name)
    out: dict[str, np.ndarray] = {}
    for family, members in by_family.items():
        result = _FAMILIES[family](members, pairs)
        for name in members:
            scores = np.asarray(result[name], dtype=float)
            if scores.shape != (len(pairs),):
                raise RuntimeError(f"metric '{name}' returned {scores.shape} scores for {len(pairs)} pairs")
            out[name] = scores
        if on_family:
            on_family(members)
    return out
