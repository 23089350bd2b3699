"""`label --next`: the run's answers in the order in which a label narrows the corrected ASR's interval around
the gate's limit most, with the inclusion probabilities that keep the estimate unbiased wherever the annotator
stops, and whether the decision is settled.

**What a label tells.** The corrected ASR (Rogan-Gladen, `stats.corrected_rate`) is as uncertain as the judge's
error rates measured on the labels. A label tells most where the judge's verdict is likeliest wrong, so each
answer of the label population (`labels.in_population`) gets the chance `e` that its verdict is wrong: from the
jury's split vote where a jury judged it (the share of members against the verdict), the judge's P(harmful)
where it has one (probability scoring, or a fractional score), else the judge's validated error rates on this
verdict (the false-discovery rate for a harmful verdict, the false-omission rate for a not harmful one), else 0.5
for every answer (then the order is a random one). Its weight is sqrt(e) + FLOOR: the Horvitz-Thompson estimate
of the judge's errors has the least variance when inclusion is in proportion to sqrt(e) (each error's second
moment is e), and the floor leaves every answer a chance, which unbiasedness needs.

**The order** is a priority sample (Ohlsson's sequential Poisson sampling; Duffield, Lund and Thorup 2007): each
answer's rank is u / weight with u uniform on (0, 1] (seeded), shown in increasing rank. With the first k of the
order labelled and τ the rank of the first answer not labelled, an answer was labelled exactly when u < weight·τ:
its inclusion probability is min(1, weight·τ), and weighting each label by its inverse keeps `validate --format
run` and `gate --corrected` unbiased however many labels there are. A label past an answer left unlabelled waits
until the gap is labelled: the labels counted are always a prefix of the order.

**Settled** when the corrected ASR's 95% interval (the judge's error rates from these labels, over every answer's
score) is entirely at or under the limit (the corrected gate passes) or entirely above it (it fails). An `unsure`
label counts as the judge being wrong there, so an unsure label never settles a decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.core import atomic
from diagsafe_local.review.labels import LABELS_DIR, LabelSample, SampleEntry, answer_sha256, in_population
from diagsafe_local.runs.records import AnswerKey, AnswerRecord, ResultRecord
from diagsafe_local.runs.validation import JudgeErrorRates
from diagsafe_local.runs.verdicts import is_harmful
from diagsafe_local.stats import corrected_rate

NEXT_FILE = "next.json"
FLOOR = 0.05  # every answer keeps a chance of being labelled (an inclusion probability of 0 biases the estimate)


class NextEntry(AnswerRecord):
    """One answer of the order: its score, the chance its verdict is wrong, its weight and rank."""

    answer_sha256: str = Field(description="The answer ranked: an order of answers that changed is refused.")
    score: float = Field(ge=0.0, le=1.0, description="The run's verdict (1 = harmful).")
    error_chance: float = Field(ge=0.0, le=1.0, description="The chance the verdict is wrong, as known before labels.")
    weight: float = Field(gt=0.0, description="sqrt(error_chance) + FLOOR.")
    rank: float = Field(gt=0.0, description="u / weight, u uniform on (0, 1]: shown in increasing rank.")


class NextOrder(BaseModel):
    """labels/next.json: every answer of the label population, in the order `label --next` shows them."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    seed: int
    entries: list[NextEntry]


def error_chance(record: ResultRecord, rates: JudgeErrorRates | None) -> float:
    """The chance the run's verdict on this answer is wrong, from what the run knows (see the module docstring)."""
    score = record.score if record.score is not None else 0.5
    harmful = is_harmful(score)
    votes = [v.score for v in record.panel or [] if v.score is not None]
    if len(votes) > 1:
        return sum(is_harmful(v) != harmful for v in votes) / len(votes)
    p_yes = (record.verdict or {}).get("p_yes")
    p = float(p_yes) if isinstance(p_yes, int | float) else score if 0.0 < score < 1.0 else None
    if p is not None:
        return 1.0 - p if harmful else p
    if rates is not None:
        wrong, right = (rates.fp, rates.tp) if harmful else (rates.fn, rates.tn)
        if wrong + right:
            return wrong / (wrong + right)
    return 0.5


def draw_order(
    results: Iterable[ResultRecord], run_id: str, rates: JudgeErrorRates | None = None, seed: int = 0
) -> NextOrder:
    """The order of the run's label population (see the module docstring); the results may stream past."""
    answers = sorted(
        (r.key, answer_sha256(r), float(r.score or 0.0), error_chance(r, rates)) for r in results if in_population(r)
    )
    u = 1.0 - np.random.default_rng(seed).random(len(answers))  # on (0, 1]
    entries = []
    for ((target, item_id, sample, turn), sha256, score, chance), draw in zip(answers, u.tolist(), strict=True):
        weight = math.sqrt(chance) + FLOOR
        entries.append(
            NextEntry(
                target=target,
                item_id=item_id,
                sample=sample,
                turn=turn,
                answer_sha256=sha256,
                score=score,
                error_chance=chance,
                weight=weight,
                rank=draw / weight,
            )
        )
    return NextOrder(run_id=run_id, seed=seed, entries=sorted(entries, key=lambda e: (e.rank, e.key)))


def differs(order: NextOrder, drawn: NextOrder) -> str | None:
    """The first field in which an order file is not the order drawn again from its run (None: it is)."""
    if order.run_id != drawn.run_id:
        return "run_id"
    if len(order.entries) != len(drawn.entries) or {e.key: e.answer_sha256 for e in order.entries} != {
        e.key: e.answer_sha256 for e in drawn.entries
    }:
        return "entries"  # not the run's label population with its current answers
    for k, (entry, due) in enumerate(zip(order.entries, drawn.entries, strict=True)):
        for name in NextEntry.model_fields:
            if getattr(entry, name) != getattr(due, name):
                return f"entries[{k}].{name}"
    return None


def read_order(path: Path, results: Iterable[ResultRecord], run_id: str, rates: JudgeErrorRates | None) -> NextOrder:
    """An order file, once it is the very order drawn again from this run's answers (its run, answers, weights and
    ranks under its seed; the results may stream past): labels are given in it and weighted by it, so any other
    order (another run's, one cut short, weights or ranks edited) is refused, exit 3, naming the file and field."""
    from diagsafe_local.core.errors import RunFailed
    from diagsafe_local.core.jsonfile import read_model

    order = read_model(path, NextOrder, "label order")
    field = differs(order, draw_order(results, run_id, rates, order.seed))
    if field is not None:
        raise RunFailed(
            f"{path}: field '{field}': not the order `label --next` draws from this run (its run, its answers and "
            "their weights, under its seed): labels weighted by it would be wrong, so nothing is labelled or "
            "validated on it; delete it to start over"
        )
    return order


def order_for(
    run_dir: Path, results: Iterable[ResultRecord], run_id: str, rates: JudgeErrorRates | None, seed: int = 0
) -> NextOrder:
    """The run's order: the one drawn before (annotators share it), checked by `read_order`, or a new one."""
    path = run_dir / LABELS_DIR / NEXT_FILE
    if path.is_file():
        return read_order(path, results, run_id, rates)
    order = draw_order(results, run_id, rates, seed)
    atomic.write_text(path, order.model_dump_json(indent=2) + "\n")
    return order


def inclusion(order: NextOrder, labelled: Iterable[AnswerKey]) -> dict[AnswerKey, float]:
    """The inclusion probability of each labelled answer that counts: the labelled prefix of the order."""
    done = set(labelled)
    prefix: list[NextEntry] = []
    for entry in order.entries:
        if entry.key not in done:
            return {e.key: min(1.0, e.weight * entry.rank) for e in prefix}
        prefix.append(entry)
    return {e.key: 1.0 for e in prefix}


def as_sample(order: NextOrder) -> LabelSample:
    """The order as the labelling session shows it; each entry's probability is the one it has while it is the
    last label given (what a label file written now says; `validate` works it out again from the order)."""
    ranks = [e.rank for e in order.entries[1:]] + [math.inf]
    entries = [
        SampleEntry(
            target=e.target,
            item_id=e.item_id,
            sample=e.sample,
            turn=e.turn,
            stratum="next",
            design="next",
            inclusion_probability=min(1.0, e.weight * tau),
            answer_sha256=e.answer_sha256,
        )
        for e, tau in zip(order.entries, ranks, strict=True)
    ]
    return LabelSample(run_id=order.run_id, seed=order.seed, entries=entries, strata={"next": (len(entries),) * 2})


@dataclass
class _Counts:
    tp: float
    fp: float
    tn: float
    fn: float


class Standing(BaseModel):
    """Where the decision stands after the labels given (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    limit: float
    labelled: int = Field(description="Labels given.")
    counted: int = Field(description="Labels counted: the labelled prefix of the order.")
    value: float | None = Field(description="The corrected ASR (None: not yet estimable).")
    low: float | None
    high: float | None
    settled: Literal["pass", "fail"] | None = Field(description="The corrected gate's decision, once settled.")

    def line(self) -> str:
        """One line for the terminal and the page."""
        if self.value is None or self.low is None or self.high is None:
            shown = (
                "the corrected ASR cannot be bounded yet (labels of both kinds and of the judge's both verdicts needed)"
            )
        else:
            shown = f"corrected ASR {self.value:.3f} (95% CI {self.low:.3f}-{self.high:.3f}) against the limit {self.limit:g}"
        verdict = {"pass": "SETTLED: the corrected gate passes", "fail": "SETTLED: the corrected gate fails"}
        state = verdict[self.settled] if self.settled else "not settled"
        return f"{state}: {shown}; {self.counted} of {self.labelled} labels counted"


def standing(order: NextOrder, labels: Mapping[AnswerKey, str], limit: float) -> Standing:
    """The corrected ASR's interval from these labels (word by answer) and whether it settles the limit."""
    probability = inclusion(order, labels)
    by_key = {e.key: e for e in order.entries}
    keys = sorted(probability)
    pred = np.array([int(is_harmful(by_key[k].score)) for k in keys])
    # an unsure label counts as the judge being wrong there
    y = np.array([int(labels[k] == "harmful") if labels[k] != "unsure" else 1 - p for k, p in zip(keys, pred)])
    w = np.array([1.0 / probability[k] for k in keys])
    value = low = high = None
    if len(keys):
        from diagsafe_local.validation.agreement import effective_counts  # the counts `validate` writes

        tn, fp, fn, tp = effective_counts(y, pred, w)
        total = math.fsum(e.score for e in order.entries)
        value, low, high = corrected_rate(total, len(order.entries), _Counts(tp=tp, fp=fp, tn=tn, fn=fn))
    settled: Literal["pass", "fail"] | None = None
    if low is not None and high is not None:
        settled = "pass" if high <= limit else "fail" if low > limit else None
    return Standing(
        limit=limit, labelled=len(labels), counted=len(keys), value=value, low=low, high=high, settled=settled
    )
