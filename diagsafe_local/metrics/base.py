"""The metric registry: every metric is a named spec; metrics that share work form a family computed together.

A family is a function `(names, pairs) -> {name: scores}` that scores a batch of (prompt, response,
reference) pairs for several of its metrics at once (e.g. all 24 ROUGE variants from one tokenization).
Every metric returns one float per pair where higher means more harmful; NaN means "could not score".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from diagsafe_local.core.errors import DiagsafeError
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

PluginMetric = Callable[[list[str], list[str], list[list[str]]], Sequence[float]]
_FAMILIES: dict[str, FamilyFn] = {}


def _plugin_metric(fn: PluginMetric, name: str) -> list[MetricSpec]:
    """A `diagsafe_local.metrics` entry point: a callable `(prompts, responses, references) -> scores` (higher =
    more harmful; `references` holds each pair's reference answers, empty for reference-free use). It may say
    `needs_reference = True`, and its docstring's first line describes it."""
    if not callable(fn):
        raise TypeError(f"expected a callable (prompts, responses, references) -> scores, got {type(fn).__name__}")

    def family(names: Sequence[str], pairs: Sequence[TextPair]) -> dict[str, np.ndarray]:
        scores = list(
            fn(
                [p.prompt for p in pairs],
                [p.response for p in pairs],
                [[p.reference] if p.reference else [] for p in pairs],
            )
        )
        bad = next((s for s in scores if isinstance(s, bool) or not isinstance(s, int | float | np.number)), None)
        if bad is not None or not np.isfinite(np.asarray(scores, dtype=float)).all():
            shown = bad if bad is not None else next(s for s in scores if not np.isfinite(s))
            raise DiagsafeError(
                f"metric '{name}' (a plugin: {getattr(fn, '__module__', '?')}) returned {shown!r}: a metric returns "
                "one finite number per pair"
            )
        return {name: np.asarray(scores, dtype=float)}

    doc = (getattr(fn, "__doc__", None) or "").strip().splitlines()
    spec = MetricSpec(
        name=name,
        description=doc[0] if doc else "a plugin metric",
        family=f"plugin:{name}",
        needs_reference=bool(getattr(fn, "needs_reference", False)),
        source=getattr(fn, "__module__", "a plugin"),
    )
    _FAMILIES[spec.family] = family
    return [spec]


METRICS: Registry[MetricSpec] = Registry("metric", plugin_group="diagsafe_local.metrics", adapt=_plugin_metric)


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
                origin = METRICS.origin(name)
                raise DiagsafeError(
                    f"metric '{name}' (from {origin}) returned {scores.shape[0] if scores.ndim else 'no list of'} "
                    f"scores for {len(pairs)} pairs: it must return one score per pair"
                )
            out[name] = scores
        if on_family:
            on_family(members)
    return out
