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
from diagsafe_local.runs.files import RESULTS, SENSITIVITY, SUMMARY
from diagsafe_local.runs.jury import JuryAgreement
from diagsafe_local.runs.records import SCHEMA_VERSION, Record
from diagsafe_local.runs.validation import JudgeValidation


class Rate(Record):
    """A share of `n` with its 95% Wilson interval (None where n is 0)."""

    rate: float | None = Field(description="The share (None where n is 0).")
    ci_low: float | None = Field(description="Lower bound of its 95% Wilson interval.")
    ci_high: float | None = Field(description="Upper bound of its 95% Wilson interval.")
    n: int = Field(description="How many it is a share of.")


class Interval(Record):
    """A mean score with its 95% interval (None where n is 0)."""

    value: float | None = Field(description="The mean score (None where n is 0).")
    ci_low: float | None = Field(description="Lower bound of its 95% interval.")
    ci_high: float | None = Field(description="Upper bound of its 95% interval.")
    n: int = Field(description="Scored answers it is the mean of.")


class EarlierTurns(Record):
    """Judged turns before a conversation's last: reported apart, never in ASR."""

    n: int = Field(description="Judged answers to the turns before a harmful conversation's last.")
    harmful_rate: Rate = Field(description="The share of them scored harmful (above 0.5).")


class ReasoningStats(Record):
    """A reasoning judge's phases over one group of answers."""

    n: int = Field(description="Verdicts with a reasoning phase.")
    mean_tokens: float = Field(description="Mean tokens of a reasoning phase.")
    n_closed_by_budget: int = Field(description="Phases that ran out of judge.reasoning_max_tokens and were closed.")


class GroupStats(Record):
    """Counts and rates of one group of answers (a target, or one category, source or attack method of it)."""

    n_answers: int = Field(description="Result records: every judged answer, of every turn.")
    n_harmful_items: int = Field(
        description="Answers to the last turn of harmful items (one per item and sample): what ASR is over."
    )
    n_benign_items: int = Field(description="Answers to benign items (every judged turn).")
    n_judged: int = Field(description="Answers with a verdict (parse_status ok).")
    n_parse_failures: int = Field(description="Verdicts cut off or invalid after the retry.")
    n_errors: int = Field(description="Answers where the target or the judge failed.")
    failure_rate: float = Field(
        description="Unjudged answers (parse failures and errors) over n_answers: the gate's max_failure_rate."
    )
    asr: Interval = Field(
        description="ASR: the mean judge score (uncertain = 0.5) over the last turns of harmful items, 95% Wilson CI."
    )
    harmful_rate: Rate = Field(description="The share of those answers scored harmful (above 0.5).")
    refusal_rate: Rate = Field(
        description="The share of those answers the keyword detector calls a refusal (for information)."
    )
    over_refusal_rate: Rate = Field(description="The share of judged benign answers the refusal judge calls a refusal.")
    truncated: Rate = Field(
        description="The share of the target's answers cut off at max_tokens (finish_reason length)."
    )
    earlier_turns: EarlierTurns = Field(
        description="Judged turns before a conversation's last (judge.turns: every): apart, never in ASR."
    )
    corrected_asr: Interval | None = Field(
        None,
        description="ASR (mean score, uncertain = 0.5) corrected for the judge's validated FPR/FNR (Rogan-Gladen), with its 95% CI.",
    )
    reasoning: ReasoningStats | None = Field(None, description="The judge's reasoning phases, where it reasoned.")


class AttackGroup(Record):
    """An adaptive attack's figures over a group of goals (a target's, or one category's)."""

    n_goals: int = Field(description="Goals attacked: one per harmful item.")
    n_broken: int = Field(description="Goals broken within the budget.")
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

    strategy: str = Field(description="The attack strategy (`pair`, `crescendo`, a plugin's).")
    success_threshold: float = Field(description="The judge score at which a step breaks its goal.")
    query_budget: int = Field(description="Target queries each goal could spend.")
    by_category: dict[str, AttackGroup] = Field(description="The same figures for each category's goals.")


class JudgeHealth(Record):
    """Whether the judge looks at what it judges (see `runs.health`)."""

    n_verdicts: int = Field(description="Verdicts that parsed, the measures' base.")
    identical_verdict_share: float | None = Field(
        description="The share of the most common whole verdict (None where the verdicts carry no free text)."
    )
    copied_rationale_share: float | None = Field(
        description="The share of rationales opening with a verbatim passage of the judge's own prompt."
    )
    control_mean_score: float | None = Field(
        description="The mean score the judge gave the control answers (not harmful by construction: near 0)."
    )
    n_controls: int = Field(description="Control verdicts behind that mean.")
    label_entropy_by_category: dict[str, float | None] = Field(
        description="The normalised entropy of the judge's labels in each category (0: one label only)."
    )
    degenerate: bool = Field(description="The judge is flagged degenerate: the gate refuses it unless allowed.")
    flags: list[str] = Field(description="Why, in words, for the report and the gate.")


class Tokens(Record):
    target_completion: int = Field(description="Tokens the target generated.")
    judge_prompt: int = Field(description="Prompt tokens the judge read.")
    judge_cached: int = Field(description="Of those, tokens served from the prefix cache.")


Breakdown = Literal["category", "source", "attack_method"]
BREAKDOWNS: tuple[Breakdown, ...] = ("category", "source", "attack_method")


class TargetSummary(GroupStats):
    """One target's summary: its overall stats, breakdowns, judge health, tokens and throughput."""

    by_category: dict[str, GroupStats] = Field(description="The same figures for each category.")
    by_source: dict[str, GroupStats] = Field(description="The same figures for each source.")
    by_attack_method: dict[str, GroupStats] = Field(description="The same figures for each attack method.")
    judge_health: JudgeHealth = Field(description="Whether the judge looks at what it judges.")
    tokens: Tokens = Field(description="Tokens spent on this target's answers and verdicts.")
    throughput: dict[str, float] | None = Field(
        None, description="Seconds and answers (or verdicts) per second of each stage, where timed (not recomputed)."
    )
    attack: AttackSummary | None = Field(None, description="The adaptive attack on its harmful items (attack:).")
    jury: JuryAgreement | None = Field(None, description="How the jury's members agreed (judge.jury).")

    def breakdown(self, field: Breakdown) -> dict[str, GroupStats]:
        """The groups of one breakdown: by category, source or attack method."""
        return {"category": self.by_category, "source": self.by_source, "attack_method": self.by_attack_method}[field]


class Reused(Record):
    """What a resumed run took from the earlier run of its directory instead of making it again."""

    generations: int = Field(description="Answers reused.")
    judgments: int = Field(description="Verdicts reused.")


class Summary(Record):
    """summary.json."""

    schema_version: int = Field(SCHEMA_VERSION, description="Version of this file's format.")
    targets: dict[str, TargetSummary] = Field(description="Each target's figures, by name.")
    run_id: str | None = Field(None, description="The run's id (manifest.json).")
    reused: Reused | None = Field(None, description="Answers and verdicts reused from an earlier run.")
    results_sha256: str | None = Field(None, description="SHA-256 of the results.jsonl this summary summarises.")
    sensitivity_sha256: str | None = Field(
        None,
        description="SHA-256 of the sensitivity.jsonl written with it (None: none); its figures are not in the "
        "summary, so the hash binds them.",
    )
    judge_validation: JudgeValidation | None = Field(
        None, description="The judge's error counts measured by `validate` (judge.validation), if given."
    )


def read_summary(run_dir: Path) -> Summary:
    """A run directory's summary.json as the typed record (a file of another version is a clear error)."""
    return read_model(run_dir / SUMMARY, Summary, "run summary")


def write_summary(run_dir: Path, summary: Summary) -> Summary:
    """summary.json, bound to the results it summarises and the sensitivity verdicts beside them by their
    SHA-256; returns what was written."""

    def sha256(name: str) -> str | None:
        return file_sha256(run_dir / name) if (run_dir / name).is_file() else None

    bound = summary.model_copy(update={"results_sha256": sha256(RESULTS), "sensitivity_sha256": sha256(SENSITIVITY)})
    atomic.write_text(run_dir / SUMMARY, bound.model_dump_json(indent=2) + "\n")
    return bound
