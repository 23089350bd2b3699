"""summary.json: each target's figures, overall and by category, source and attack method (computed by
`runs.summarize`; the gate recomputes them and treats this file as a cache that must agree).

The JSON Schema ships as `diagsafe_local/schemas/summary.schema.json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from diagsafe_local.core import atomic
from diagsafe_local.core.cache import file_sha256
from diagsafe_local.core.jsonfile import read_model
from diagsafe_local.runs.files import RESULTS, SUMMARY
from diagsafe_local.runs.jury import JuryAgreement
from diagsafe_local.runs.records import SCHEMA_VERSION, Record
from diagsafe_local.runs.validation import JudgeValidation


class Rate(Record):
    """A share of `n` with its 95% Wilson interval (None where n is 0)."""

    rate: float | None
    ci_low: float | None
    ci_high: float | None
    n: int


class Interval(Record):
    """A mean score with its 95% interval (None where n is 0)."""

    value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int


class EarlierTurns(Record):
    """Judged turns before a conversation's last: reported apart, never in ASR."""

    n: int
    harmful_rate: Rate


class ReasoningStats(Record):
    """A reasoning judge's phases over one group of answers."""

    n: int
    mean_tokens: float
    n_closed_by_budget: int = Field(description="Phases that ran out of judge.reasoning_max_tokens and were closed.")


class GroupStats(Record):
    """Counts and rates of one group of answers (a target, or one category, source or attack method of it)."""

    n_answers: int
    n_harmful_items: int
    n_benign_items: int
    n_judged: int
    n_parse_failures: int
    n_errors: int
    failure_rate: float
    asr: Interval
    harmful_rate: Rate
    refusal_rate: Rate
    over_refusal_rate: Rate
    truncated: Rate
    earlier_turns: EarlierTurns
    corrected_asr: Interval | None = Field(
        None,
        description="ASR (mean score, uncertain = 0.5) corrected for the judge's validated FPR/FNR (Rogan-Gladen), with its 95% CI.",
    )
    reasoning: ReasoningStats | None = Field(None, description="The judge's reasoning phases, where it reasoned.")


class AttackGroup(Record):
    """An adaptive attack's figures over a group of goals (a target's, or one category's)."""

    n_goals: int
    n_broken: int
    attack_success_rate: Rate = Field(description="Goals broken within the budget (a goal counts once).")
    n_queries: int = Field(description="Target queries spent.")
    n_errors: int = Field(description="Steps that ended their chain with an attacker or target error.")
    n_attacked: int = Field(
        description="Goals with at least one judged target answer; a goal whose every chain failed before that was "
        "never attacked, and the gate does not count it as safe."
    )
    n_steps: int = Field(description="Attack steps recorded.")
    n_unjudged: int = Field(
        description="Steps without a verdict: the attacker wrote no prompt, the target failed, or the judge did "
        "(counted against the gate's max_failure_rate)."
    )
    queries_to_success_median: float | None = Field(
        description="Median target queries (over all the goal's chains) until its first break."
    )
    queries_to_success: dict[str, int] = Field(description="Broken goals by queries to their first break.")
    broken_by_depth: dict[str, float] = Field(
        description="Share of goals broken by each depth (pair) or turn (crescendo), cumulative."
    )

    def broken_within(self, queries: int) -> float:
        """Share of the goals broken within `queries` target queries (0 without goals)."""
        broken = sum(n for q, n in self.queries_to_success.items() if int(q) <= queries)
        return broken / self.n_goals if self.n_goals else 0.0


class AttackSummary(AttackGroup):
    """A target's adaptive attack, overall and by category."""

    strategy: str
    success_threshold: float
    query_budget: int = Field(description="Target queries each goal could spend.")
    by_category: dict[str, AttackGroup]


class JudgeHealth(Record):
    """Whether the judge looks at what it judges (see `evaluation.health`)."""

    n_verdicts: int
    identical_verdict_share: float | None
    copied_rationale_share: float | None
    control_mean_score: float | None
    n_controls: int
    label_entropy_by_category: dict[str, float | None]
    degenerate: bool
    flags: list[str]


class Tokens(Record):
    target_completion: int
    judge_prompt: int
    judge_cached: int


Breakdown = Literal["category", "source", "attack_method"]
BREAKDOWNS: tuple[Breakdown, ...] = ("category", "source", "attack_method")


class TargetSummary(GroupStats):
    """One target's summary: its overall stats, breakdowns, judge health, tokens and throughput."""

    by_category: dict[str, GroupStats]
    by_source: dict[str, GroupStats]
    by_attack_method: dict[str, GroupStats]
    judge_health: JudgeHealth
    tokens: Tokens
    throughput: dict[str, float] | None = None
    attack: AttackSummary | None = Field(None, description="The adaptive attack on its harmful items (attack:).")
    jury: JuryAgreement | None = Field(None, description="How the jury's members agreed (judge.jury).")

    def breakdown(self, field: Breakdown) -> dict[str, GroupStats]:
        """The groups of one breakdown: by category, source or attack method."""
        return {"category": self.by_category, "source": self.by_source, "attack_method": self.by_attack_method}[field]


class Summary(Record):
    """summary.json."""

    schema_version: int = SCHEMA_VERSION
    targets: dict[str, TargetSummary]
    run_id: str | None = None
    reused: dict[str, int] | None = Field(None, description="Answers and verdicts reused from an earlier run.")
    results_sha256: str | None = Field(None, description="SHA-256 of the results.jsonl this summary summarises.")
    judge_validation: JudgeValidation | None = Field(
        None, description="The judge's error counts measured by `validate` (judge.validation), if given."
    )


def read_summary(run_dir: Path) -> Summary:
    """A run directory's summary.json as the typed record (a file of another version is a clear error)."""
    return read_model(run_dir / SUMMARY, Summary, "run summary")


def write_summary(run_dir: Path, summary: Summary) -> Summary:
    """summary.json, bound to the results it summarises by their SHA-256; returns what was written."""
    results = run_dir / RESULTS
    bound = summary.model_copy(update={"results_sha256": file_sha256(results) if results.is_file() else None})
    atomic.write_text(run_dir / SUMMARY, bound.model_dump_json(indent=2) + "\n")
    return bound
