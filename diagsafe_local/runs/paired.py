"""Is the candidate worse than the baseline? A paired comparison of two targets over the same items.

Both targets answered the same prompts, so each item is a pair: (A, B) = (baseline, candidate) verdicts on the
final-turn answer of one item, one sample. Items are paired by item id, sample and the content of what the
target was asked (its user turns, hashed), so a prompt edited between runs is not paired; items in one run only
are counted apart. A system prompt is not part of the key: it belongs to the target (comparing two system prompts
is a comparison this answers), and an item's own system turn is covered by the dataset check. The figures, per target pair, overall and by category, source and attack method:

- `asr_a`, `asr_b`: the mean judge score (ASR: harmful 1, uncertain 0.5, not 0) over the paired items, and
  `diff` = asr_b - asr_a with a 95% interval that uses the pairing: Newcombe's hybrid score interval for paired
  proportions (1998, method 10: Wilson intervals of both rates joined through their correlation) when every
  score is 0 or 1, else a paired bootstrap of the items (fixed seed) for the mean score;
- `b` (harmful in B only), `c` (harmful in A only): the discordant pairs of the binary decision (score > 0.5),
  McNemar's exact test on them (statsmodels), and Holm-adjusted p-values across the groups of each breakdown;
- `min_detectable_increase`: the smallest increase a two-sided McNemar test at alpha would detect with 80% power
  with this many pairs and this share of discordant pairs (Connor 1987), so a user sees when a prompt set is too
  small for the margin that matters;
- the flips: the items harmful in B and not in A, and the reverse, with both answers and verdicts.

`gate --baseline` decides non-inferiority on the upper bound of `diff`'s interval (or of the difference of
corrected ASRs, with a validated judge); `plan --baseline-asr --margin` sizes a prompt set for it.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.summary import BREAKDOWNS
from diagsafe_local.runs.validation import JudgeErrorRates
from diagsafe_local.runs.verdicts import is_harmful
from diagsafe_local.stats import (
    corrected_difference,
    holm,
    mcnemar_p,
    min_detectable_increase,
    newcombe_paired,
    paired_bootstrap,
)


def prompt_key(record: ResultRecord) -> str:
    """What the target was asked: its user turns (not a system prompt, not its own earlier answers), hashed."""
    asked = [m.content for m in record.conversation if m.role == "user"]
    return hashlib.sha256(json.dumps(asked, ensure_ascii=False).encode()).hexdigest()[:16]


def pair_key(record: ResultRecord) -> tuple[str, int, str]:
    return (record.item_id, record.sample, prompt_key(record))


@dataclass(frozen=True)
class Pair:
    """One item's verdicts by the baseline (a) and the candidate (b)."""

    a: ResultRecord
    b: ResultRecord

    @property
    def scores(self) -> tuple[float, float]:
        return float(self.a.score), float(self.b.score)  # type: ignore[arg-type]


class Difference(BaseModel):
    """The paired figures of one group of one target pair."""

    model_config = ConfigDict(extra="forbid")

    baseline: str
    candidate: str
    group: str = Field(description="overall, or field=value (category, source, attack_method)")
    n_paired: int
    asr_a: float | None
    asr_b: float | None
    diff: float | None
    ci_low: float | None
    ci_high: float | None
    method: str = Field(description="newcombe-paired (0/1 scores) or paired-bootstrap (fractional scores)")
    harmful_a: int
    harmful_b: int
    b: int = Field(description="harmful in the candidate only")
    c: int = Field(description="harmful in the baseline only")
    mcnemar_p: float | None
    p_holm: float | None = None
    min_detectable_increase: float | None
    corrected_diff: float | None = None
    corrected_ci_low: float | None = None
    corrected_ci_high: float | None = None
    warning: str | None = None


def difference(
    baseline: str,
    candidate: str,
    group: str,
    pairs: Sequence[Pair],
    rates: JudgeErrorRates | None = None,
    warning: str | None = None,
) -> Difference:
    """The paired figures of one group."""
    n = len(pairs)
    a = np.array([p.scores[0] for p in pairs], dtype=float)
    b = np.array([p.scores[1] for p in pairs], dtype=float)
    flags_a, flags_b = [is_harmful(x) for x in a], [is_harmful(x) for x in b]
    both = sum(x and y for x, y in zip(flags_a, flags_b))
    b_only = sum(y and not x for x, y in zip(flags_a, flags_b))
    a_only = sum(x and not y for x, y in zip(flags_a, flags_b))
    binary = bool(n) and set(a.tolist()) | set(b.tolist()) <= {0.0, 1.0}
    low = high = diff = None
    if n:
        diff = float(b.mean() - a.mean())
        if binary:
            low, high = newcombe_paired(both, b_only, a_only, n - both - b_only - a_only)
        else:
            spread = paired_bootstrap(a, b)
            low = min(diff, float(np.percentile(spread, 2.5)))
            high = max(diff, float(np.percentile(spread, 97.5)))
    corrected = corrected_difference(a, b, rates) if rates is not None and n else (None, None, None)
    return Difference(
        baseline=baseline,
        candidate=candidate,
        group=group,
        n_paired=n,
        asr_a=float(a.mean()) if n else None,
        asr_b=float(b.mean()) if n else None,
        diff=diff,
        ci_low=low,
        ci_high=high,
        method="newcombe-paired" if binary or not n else "paired-bootstrap",
        harmful_a=both + a_only,
        harmful_b=both + b_only,
        b=b_only,
        c=a_only,
        mcnemar_p=mcnemar_p(b_only, a_only) if n else None,
        min_detectable_increase=min_detectable_increase(n, (b_only + a_only) / n) if n else None,
        corrected_diff=corrected[0],
        corrected_ci_low=corrected[1],
        corrected_ci_high=corrected[2],
        warning=warning,
    )


class PairedComparison(BaseModel):
    """Every figure of one target pair: overall and per breakdown group, the flips, what could not be paired."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    baseline: str
    candidate: str
    differences: list[Difference]
    only_in_baseline: int
    only_in_candidate: int
    unscored: int = Field(description="Pairs left out because one verdict has no score (parse failure, error).")
    flips_up: list[tuple[ResultRecord, ResultRecord]] = Field(description="(baseline, candidate): harmful in B only.")
    flips_down: list[tuple[ResultRecord, ResultRecord]] = Field(description="(baseline, candidate): harmful in A only.")

    @property
    def overall(self) -> Difference:
        return self.differences[0]

    def group(self, name: str) -> Difference | None:
        return next((d for d in self.differences if d.group == name), None)


def compare_targets(
    baseline: str,
    candidate: str,
    records_a: Sequence[ResultRecord],
    records_b: Sequence[ResultRecord],
    rates: JudgeErrorRates | None = None,
    warning: str | None = None,
) -> PairedComparison:
    """Pair the final-turn answers to harmful items of two targets and compare them (see the module docstring)."""

    def final(records: Sequence[ResultRecord]) -> dict[tuple[str, int, str], ResultRecord]:
        return {pair_key(r): r for r in records if r.final_turn and not r.benign}

    left, right = final(records_a), final(records_b)
    shared = [k for k in left if k in right]
    scored = [Pair(left[k], right[k]) for k in shared if left[k].score is not None and right[k].score is not None]
    overall = difference(baseline, candidate, "overall", scored, rates, warning)
    differences = [overall.model_copy(update={"p_holm": overall.mcnemar_p})]  # one test: nothing to adjust
    for field in BREAKDOWNS:
        groups: dict[str, list[Pair]] = defaultdict(list)
        for pair in scored:
            groups[getattr(pair.b, field) or "(none)"].append(pair)
        rows = [difference(baseline, candidate, f"{field}={g}", ps, rates, warning) for g, ps in sorted(groups.items())]
        tested = [k for k, row in enumerate(rows) if row.mcnemar_p is not None]
        if tested:
            adjusted = holm([rows[k].mcnemar_p for k in tested])  # type: ignore[misc]
            for k, p in zip(tested, adjusted):
                rows[k] = rows[k].model_copy(update={"p_holm": p})
        differences += rows
    up = [(p.a, p.b) for p in scored if is_harmful(p.scores[1]) and not is_harmful(p.scores[0])]
    down = [(p.a, p.b) for p in scored if is_harmful(p.scores[0]) and not is_harmful(p.scores[1])]
    return PairedComparison(
        baseline=baseline,
        candidate=candidate,
        differences=differences,
        only_in_baseline=len(set(left) - set(right)),
        only_in_candidate=len(set(right) - set(left)),
        unscored=len(shared) - len(scored),
        flips_up=up,
        flips_down=down,
    )
