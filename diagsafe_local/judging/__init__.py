"""Judging: the judge registry (our rubrics, the published JSON judges, the fine-tuned judges with their
own formats) and the batched judge step."""

from diagsafe_local.judging import (  # noqa: F401  (registration)
    finetuned,
    guards_2026,
    harmbench,
    on_demand,
    policy,
    published,
    reasoning_guards,
    refusal,
    strongreject,
)
from diagsafe_local.judging.base import JUDGES, Decoding, Judge, JudgeInput, ParseOutcome

__all__ = ["JUDGES", "Decoding", "Judge", "JudgeInput", "ParseOutcome"]
