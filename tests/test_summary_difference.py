"""verify's summary comparison: equal summaries skip the walk, and say what the walk says whatever they hold."""

from __future__ import annotations

import copy

from diagsafe_local.runs.verify import _first_difference, _summary_difference


def _summary(rate: float, asr: float = 0.5, category: str = "cyber") -> dict:
    return {
        "run_id": "r",
        "targets": {"t": {"asr": {"value": asr}, "by_category": {category: {"n": 3}}, "throughput": {"rate": rate}}},
    }


def test_equal_summaries_take_the_shortcut_and_agree_with_the_walk():
    stored = _summary(2.5)
    recomputed = copy.deepcopy(stored)
    assert _summary_difference(stored, recomputed) is None
    assert _first_difference(stored, recomputed) is None


def test_a_nan_both_summaries_hold_as_one_object_is_walked():
    # the throughput is copied from the stored summary, so both dumps may hold its very float: == takes a NaN for
    # equal to itself, the walk's isclose does not (and says so)
    nan = float("nan")
    stored, recomputed = _summary(nan), _summary(nan)
    assert stored == recomputed
    said = "targets.t.throughput.rate is nan in summary.json, nan recomputed"
    assert _first_difference(stored, recomputed) == said
    assert _summary_difference(stored, recomputed) == said


def test_unequal_summaries_are_walked():
    close = _summary(2.5, asr=0.1 + 0.2), _summary(2.5, asr=0.3)  # not ==, but close: the walk finds nothing
    assert _summary_difference(*close) is None
    apart = _summary(2.5, asr=0.0), _summary(2.5, asr=0.5)
    assert _summary_difference(*apart) == "targets.t.asr.value is 0.0 in summary.json, 0.5 recomputed"
    named = _summary(2.5, category="NaN"), _summary(2.5, category="NaN")  # "NaN" in a string: walked, equal
    assert _summary_difference(*named) is None


def test_a_summary_that_does_not_serialise_is_walked_not_a_crash():
    # summary.json read by json.loads may hold a lone surrogate (pydantic's parser refuses it, the fallback reader
    # does not), which JSON serialisation refuses: equal summaries holding one are walked, as before the shortcut
    stored = _summary(2.5, category="\udc80")
    assert _summary_difference(stored, copy.deepcopy(stored)) is None
    assert _summary_difference(_summary(2.5, asr=0.0, category="\ud800"), _summary(2.5, category="\ud800")) == (
        "targets.t.asr.value is 0.0 in summary.json, 0.5 recomputed"
    )
