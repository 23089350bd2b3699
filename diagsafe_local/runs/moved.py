"""Which of the gate's ASR limits a judging pass's evidence could decide otherwise: the gate reads one ASR (overall,
or of a category), and a pass (the cascade's audit, an answer perturbation) says the figure may be anywhere in an
interval instead. Every ASR limit that decides is weighed (`moved`), so a pass cannot be stepped around by giving
the same limit under another name.

An absolute limit (max_asr, max_asr_category) is moved where the figure read and the interval do not all fall on
one side of it. An increase limit (max_asr_increase, max_relative_increase overall; max_asr_increase_category for
its categories) reads the paired increase over a baseline, on the same verdicts (a cascade's: `passes.decided_results`),
which the pass bounds as a level, not as a difference: it is moved wherever the figure may move at all (fail closed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diagsafe_local.runs.limits import Limits


def groups(limits: Limits) -> list[str | None]:
    """The groups an ASR limit decides on: None (the whole target) and each category a limit names."""
    named: set[str] = set()
    for name in ("max_asr_category", "max_asr_increase_category"):
        named.update(limits.value(name) or {})
    return [None, *sorted(named)]


def moved(
    limits: Limits, group: str | None, read: float | None, low: float | None, high: float | None
) -> list[tuple[str, float]]:
    """The ASR limits on `group` (None: overall) whose decision may differ when the figure the gate reads, `read`
    (None: unknown), may be anywhere in [`low`, `high`] (None: unknown): each limit's name and value."""
    figures = (read, low, high)
    out: list[tuple[str, float]] = []
    if figures == (None, None, None):  # a group the pass has no answer of: nothing it says moves it
        return out
    name = "max_asr" if group is None else "max_asr_category"
    absolute = _value(limits, name, group)
    if absolute is not None and (None in figures or len({f <= absolute for f in figures if f is not None}) > 1):
        out.append((name, absolute))
    if None in figures or len(set(figures)) > 1:
        increases = ("max_asr_increase", "max_relative_increase") if group is None else ("max_asr_increase_category",)
        out += [(n, v) for n in increases if (v := _value(limits, n, group)) is not None]
    return out


def is_increase(name: str) -> bool:
    """Whether a limit `moved` names reads the increase over a baseline."""
    return name not in ("max_asr", "max_asr_category")


def _value(limits: Limits, name: str, group: str | None) -> float | None:
    value = limits.value(name)
    return value if group is None or value is None else value.get(group)
