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

import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.core.jsonl import Line
from diagsafe_local.runs.pairing import Column, Rows, match
from diagsafe_local.runs.records import AnswerKey, ResultRecord
from diagsafe_local.runs.summary import BREAKDOWNS
from diagsafe_local.runs.validation import JudgeErrorRates
from diagsafe_local.runs.verdicts import HARMFUL_ABOVE
from diagsafe_local.stats import (
    corrected_difference,
    holm,
    mcnemar_p,
    min_detectable_increase,
    newcombe_paired,
    paired_bootstrap,
)

_LABELLED = operator.attrgetter("target", *BREAKDOWNS)  # the column's label order


def prompt_key(record: ResultRecord) -> str:
    """What the target was asked: its user turns (not a system prompt, not its own earlier answers), hashed."""
    return record.asked()


def sides(
    path: Path,
    lines: Iterable[Line[ResultRecord]],
    targets: Iterable[str],
    verdicts: Mapping[AnswerKey, dict[str, Any] | None] | None = None,
) -> dict[str, Rows]:
    """Each named target's final-turn answers to harmful items, read in one pass, as rows paired by (item id,
    sample, prompt), with the breakdown labels the groups are formed by (`verdicts`: see `RunColumns`)."""
    wanted = set(targets)
    columns = RunColumns(path, answers=False, targets=wanted, verdicts=verdicts)
    for line in lines:
        columns.add(line)
    return {target: columns.side(target) for target in wanted}


class RunColumns:
    """What `compare` needs of one run, gathered line by line (`add`) in the pass that verifies it: one column
    of every answer (of `targets`, default all), keyed by (item, sample, turn) for `runs.agreement` and, for the
    final-turn answers to harmful items, by (item, sample, prompt) for the paired comparison (`sides`, one view
    a target). With `answers=False` only the paired comparison's rows are kept, and no answer hashes nor keys
    (a paired comparison alone, as the series report makes, never reads them). `verdicts`: the verdict an
    answer's score came from where another judge than results.jsonl's gave it (`passes.decided_verdicts`), what a
    side's record read back carries."""

    def __init__(
        self,
        path: Path,
        answers: bool = True,
        targets: set[str] | None = None,
        verdicts: Mapping[AnswerKey, dict[str, Any] | None] | None = None,
    ) -> None:
        self.column = Column(path, ("target", *BREAKDOWNS), answers=answers, pairs=True, keys=answers)
        self.answers_kept = answers
        self._targets = targets
        self.verdicts = verdicts or {}
        self._seen: dict[str, None] = {}  # every target with a row, in the order first seen (one in no pair too)
        self._labels: dict[tuple[str, ...], tuple[str, ...]] = {}  # a record's (target, *BREAKDOWNS) -> its labels
        self._sides: tuple[tuple[int, int], dict[str, Rows]] | None = None  # `sides`, with the counts it was made at

    def add(self, line: Line[ResultRecord], prompt: str | None = None) -> None:
        """A result line, with its `prompt_key` where the caller has it (`verify_run`'s observer)."""
        r = line.record
        if self._targets is not None and r.target not in self._targets:
            return
        self._seen[r.target] = None
        pair = (
            (r.item_id, r.sample, prompt_key(r) if prompt is None else prompt)
            if r.final_turn and not r.benign
            else None
        )
        if pair is None and not self.answers_kept:
            return  # in no pair, and no agreement reads it
        values = _LABELLED(r)  # a run has a few combinations of them: each labelled once
        labels = self._labels.get(values)
        if labels is None:
            labels = self._labels[values] = (values[0], *[value or "(none)" for value in values[1:]])
        self.column.add((r.item_id, r.sample, r.turn), line, labels, pair=pair)

    def side(self, target: str) -> Rows:
        """A target's final-turn answers to harmful items, paired by (item id, sample, prompt)."""
        rows = self.column.rows(pairs=True, target=target)
        return Side(rows.column, rows.pairs, rows.rows, self.verdicts) if self.verdicts else rows

    @property
    def sides(self) -> dict[str, Rows]:
        """Every target's `side`, made once for the rows gathered so far: a series compares each run two or three
        times (its reference, with each checkpoint), and a side keeps its key order once made (`Rows.by_key`). The
        rows and targets only grow, so their counts say whether what was made still holds."""
        gathered = (len(self.column), len(self._seen))
        if self._sides is None or self._sides[0] != gathered:
            self._sides = (gathered, {target: self.side(target) for target in self._seen})
        return self._sides[1]

    @property
    def answers(self) -> Rows:
        """Every answer, keyed by (item, sample, turn), with its target."""
        return self.column.rows()


@dataclass(frozen=True)
class Side(Rows):
    """A side's rows whose records read back carry the verdict their score came from (`RunColumns.verdicts`)."""

    verdicts: Mapping[AnswerKey, dict[str, Any] | None] = field(default_factory=dict)

    def read(self, row: int) -> ResultRecord:
        record = super().read(row)
        key = record.key
        return record.model_copy(update={"verdict": self.verdicts[key]}) if key in self.verdicts else record


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
    a: np.ndarray,
    b: np.ndarray,
    rates: JudgeErrorRates | None = None,
    warning: str | None = None,
) -> Difference:
    """The paired figures of one group, from the baseline's and the candidate's scores of its pairs."""
    n = len(a)
    flags_a, flags_b = a > HARMFUL_ABOVE, b > HARMFUL_ABOVE
    both = int(np.count_nonzero(flags_a & flags_b))
    b_only = int(np.count_nonzero(flags_b & ~flags_a))
    a_only = int(np.count_nonzero(flags_a & ~flags_b))
    binary = bool(n) and bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    low = high = diff = None
    if n:
        diff = float(b.mean() - a.mean())
        if binary:
            low, high = newcombe_paired(both, b_only, a_only, n - both - b_only - a_only)
        else:
            # both tails in one call: numpy takes each q's order statistics and interpolates them alike, so the
            # same floats as a call for each (checked bit for bit on 40,000 quantiles)
            tails = np.percentile(paired_bootstrap(a, b), (2.5, 97.5)).tolist()
            low, high = min(diff, tails[0]), max(diff, tails[1])
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


Direction = Literal["up", "down"]


@dataclass(frozen=True)
class PairedComparison:
    """Every figure of one target pair: overall and per breakdown group, what could not be paired, and the flips
    (held as rows of the two sides; `flips()` reads their records back)."""

    baseline: str
    candidate: str
    differences: list[Difference]
    only_in_baseline: int
    only_in_candidate: int
    unscored: int  # pairs left out because one verdict has no score (parse failure, error)
    side_a: Rows = field(repr=False)
    side_b: Rows = field(repr=False)
    up: np.ndarray = field(repr=False)  # (row in A, row in B): harmful in B only
    down: np.ndarray = field(repr=False)  # harmful in A only

    @property
    def overall(self) -> Difference:
        return self.differences[0]

    @property
    def flips_up(self) -> int:
        return len(self.up)

    @property
    def flips_down(self) -> int:
        return len(self.down)

    def group(self, name: str) -> Difference | None:
        return next((d for d in self.differences if d.group == name), None)

    def flips(self, direction: Direction, limit: int | None = None) -> Iterator[tuple[ResultRecord, ResultRecord]]:
        """(baseline, candidate) records of the flips one way, in the baseline's order, read back one at a time,
        each with the score it was paired by and the verdict that score came from (a cascade's full judge's,
        where the record holds the screen's)."""
        rows = self.up if direction == "up" else self.down
        for row_a, row_b in rows[:limit]:
            yield _paired_record(self.side_a, int(row_a)), _paired_record(self.side_b, int(row_b))


def _paired_record(side: Rows, row: int) -> ResultRecord:
    record, score = side.read(row), float(side.scores[row])  # a flip's score is never NaN: both sides scored
    return record if record.score == score else record.model_copy(update={"score": score})


def compare_targets(
    baseline: str,
    candidate: str,
    side_a: Rows,
    side_b: Rows,
    rates: JudgeErrorRates | None = None,
    warning: str | None = None,
    breakdowns: bool = True,
) -> PairedComparison:
    """Pair the final-turn answers to harmful items of two targets (see `side`) and compare them (see the module
    docstring; `breakdowns=False`: overall only). Memory grows by a few dozen bytes per answer, never by the
    records."""
    matched = match(side_a.keys(), side_b.keys(), side_a.by_key(), side_b.by_key())  # the last record of a key
    paired_a, paired_b = matched.a, matched.b
    scores_a, scores_b = side_a.scores[paired_a], side_b.scores[paired_b]
    scored = ~np.isnan(scores_a) & ~np.isnan(scores_b)
    a, b = scores_a[scored], scores_b[scored]
    overall = difference(baseline, candidate, "overall", a, b, rates, warning)
    differences = [overall.model_copy(update={"p_holm": overall.mcnemar_p})]  # one test: nothing to adjust
    for name in BREAKDOWNS if breakdowns else ():
        codes = side_b.codes(name)[paired_b[scored]]
        labels = side_b.label_names(name)
        rows = [
            difference(baseline, candidate, f"{name}={label}", a[codes == code], b[codes == code], rates, warning)
            for label, code in sorted((label, code) for code, label in enumerate(labels) if (codes == code).any())
        ]
        tested = [k for k, row in enumerate(rows) if row.mcnemar_p is not None]
        if tested:
            adjusted = holm([rows[k].mcnemar_p for k in tested])  # type: ignore[misc]
            for k, p in zip(tested, adjusted):
                rows[k] = rows[k].model_copy(update={"p_holm": p})
        differences += rows
    pairs = np.stack([paired_a[scored], paired_b[scored]], axis=1)
    harmful_a, harmful_b = a > HARMFUL_ABOVE, b > HARMFUL_ABOVE
    n_shared = len(paired_a)
    return PairedComparison(
        baseline=baseline,
        candidate=candidate,
        differences=differences,
        only_in_baseline=matched.keys_a - n_shared,
        only_in_candidate=matched.keys_b - n_shared,
        unscored=n_shared - len(a),
        side_a=side_a,
        side_b=side_b,
        up=pairs[harmful_b & ~harmful_a],
        down=pairs[harmful_a & ~harmful_b],
    )
