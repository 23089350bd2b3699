"""The judging passes, declared once on the read side: each pass that asks the judge something more than the
answers' verdicts (the judge's controls and grammar canary, judge sensitivity, the jury) is one row here, and
`RunDirectory`, `verify`, the summariser, `merge`, `report`, the gate's "could not judge" lines and the schema
generator loop over the rows, as `runs.limits` does for the gate's limits. A new pass is one module (its check,
its tally, its report section) and one row; nothing else on the read side names it.

A row names its file and record (the record's `key` identifies it), its per-record check for `verify` (a
`PassCheck`: it sees every result as verify streams them, reads the pass's own file as verify read and hashed
it, says what does not hold and, per target, how many answers it could not judge), its tally over the results
where its figures are part of the summary, its report section, its merge rule, and its rule for an answer it
could not judge (errored, unparsed, cut off, missing): never "leave it out".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from diagsafe_local.core.jsonl import KeyedRecord, Line
from diagsafe_local.runs import cascade, controls, files, injection, jury, robustness, sensitivity
from diagsafe_local.runs.manifest import Manifest
from diagsafe_local.runs.records import (
    RUN_WIDE,
    AnswerKey,
    ControlRecord,
    CouldNotJudge,
    InjectionRecord,
    JuryVote,
    ResultRecord,
    RobustnessRecord,
    SensitivityRecord,
)

if TYPE_CHECKING:
    from diagsafe_local.runs.limits import Limits
    from diagsafe_local.runs.paired import PairedComparison, RunColumns
    from diagsafe_local.runs.summary import Summary
    from diagsafe_local.runs.verify import VerifiedRun

# A report section: (title, header, rows, notes), as the Markdown and HTML reports lay it out.
Section = tuple[str, list[str], list[list[str]], list[str]]
# How `merge` carries a pass's file: `union` writes every source's records, one per key, sorted by key (a file
# any source has); `in_results` merges nothing of it (its verdicts are in results.jsonl, merged with them, and
# its file is the run's resume store, which no reader but the signature reads).
MergeRule = Literal["union", "in_results"]
# A line a pass adds to the gate's decision: a note, or a flip (the decision depends on what the pass varied:
# INCONCLUSIVE where every limit passed).
GateLine = tuple[Literal["note", "flip"], str]


class PassCheck(Protocol):
    """One run's reading of a pass, made by `verify`: `see` each result as it streams, `read` the pass's own
    file's records as verify read and hashed them (None: the run has no such file), then `problems` and
    `could_not_judge` (by target; `RUN_WIDE` for a count of no one target)."""

    def see(self, record: ResultRecord) -> None: ...

    def read(self, lines: Sequence[Line[Any]] | None) -> None: ...

    def problems(self) -> list[str]: ...

    def could_not_judge(self) -> dict[str, CouldNotJudge]: ...


class Tally(Protocol):
    """A pass's figures folded from the results into each target's summary (`runs.jury.JuryTally`): `add` one
    record, `absorb` another tally (a merge adds up its sources'), `figures` for summary.json (None: none)."""

    def add(self, record: ResultRecord) -> None: ...

    def absorb(self, other: Any) -> None: ...

    def figures(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class JudgingPass:
    """One judging pass on the read side (see the module docstring)."""

    name: str
    file: str
    record: type[KeyedRecord]
    check: Callable[[Manifest], PassCheck]
    section: Callable[[VerifiedRun], Section | None]
    merge: MergeRule
    unjudged: str  # its rule for an answer it could not judge, as the gate's line says it
    unit: str  # what `could_not_judge` counts, as the gate's line says it
    tally: Callable[[], Tally] | None = None  # folded per target into summary.json's field `name`
    summary_hash: str | None = None  # the summary.json field that binds its file's SHA-256 (the summary is of it)
    # its lines in the gate's decision, for the chosen targets under the applied limits
    gate: Callable[[VerifiedRun, Sequence[str], Limits], list[GateLine]] | None = None
    # where its verdicts are the run's final ones (a cascade's), the summary with the figures they give in place,
    # each answer's final score by its key (what a paired comparison reads), and its lines on pairing the run with a
    # baseline (`gate --baseline`; RunFailed where the two runs' final verdicts do not mean the same)
    final: Callable[[VerifiedRun, Summary], Summary] | None = None
    final_scores: Callable[[VerifiedRun], Mapping[AnswerKey, float]] | None = None
    # the verdict (a judge's reply parsed) each final score came from, where another judge than the run's gave it
    final_verdicts: Callable[[VerifiedRun], Mapping[AnswerKey, dict[str, Any] | None]] | None = None
    baseline: Callable[[VerifiedRun, VerifiedRun, Sequence[PairedComparison], Limits], list[GateLine]] | None = None

    def line(self, target: str, counted: CouldNotJudge) -> str:
        """The gate's line for what this pass could not judge of one target (or of the run)."""
        who = f"{target}: " if target != RUN_WIDE else ""
        return (
            f"NOTE  {who}{self.name}: could not judge {counted.count} of the {counted.of} {self.unit} ({self.unjudged})"
        )


PASSES: tuple[JudgingPass, ...] = (
    JudgingPass(
        name="controls",
        file=files.CONTROLS,
        record=ControlRecord,
        check=controls.ControlsCheck,
        section=controls.section,
        merge="union",
        unjudged="judge health is decided on the rest; a judge that could judge none of them is degenerate",
        unit="control answers",
    ),
    JudgingPass(
        name="sensitivity",
        file=files.SENSITIVITY,
        record=SensitivityRecord,
        check=sensitivity.SampleCheck,
        section=sensitivity.section,
        merge="union",
        unjudged="any one makes the sensitivity check INCONCLUSIVE: what that wording decides is unknown",
        unit="verdicts under its paraphrases",
        summary_hash="sensitivity_sha256",
    ),
    JudgingPass(
        name="jury",
        file=files.JURY,
        record=JuryVote,
        check=jury.VotesCheck,
        section=jury.section,
        merge="in_results",
        unjudged="some member gave no verdict: that vote counts harmful, and these answers are held to max_failure_rate",
        unit="answers",
        tally=jury.JuryTally,
    ),
    JudgingPass(
        name="robustness",
        file=files.ROBUSTNESS,
        record=RobustnessRecord,
        check=robustness.RobustnessCheck,
        section=robustness.section,
        merge="union",
        unjudged="any one makes the robustness check INCONCLUSIVE: what that edit decides is unknown",
        unit="verdicts under its answer perturbations",
        gate=robustness.gate_lines,
    ),
    JudgingPass(
        name="injection_canary",
        file=files.INJECTION,
        record=InjectionRecord,
        check=injection.InjectionCheck,
        section=injection.section,
        merge="union",
        unjudged="a canary the judge could not judge has not shown it resists the injection: the run is refused",
        unit="policy-injection canaries",
    ),
    JudgingPass(
        name="cascade",
        file=files.CASCADE,
        record=cascade.CascadeRecord,
        check=cascade.CascadeCheck,
        section=cascade.section,
        merge="union",
        unjudged="an answer the screen could not judge is sent up; one the full judge could not judge counts harmful "
        "where sent up and as a disagreement where audited",
        unit="answers sent up or audited",
        gate=cascade.gate_lines,
        final=cascade.final,
        final_scores=cascade.final_scores,
        final_verdicts=cascade.final_verdicts,
        baseline=cascade.baseline_lines,
    ),
)


def named(name: str) -> JudgingPass:
    """The row of a pass by its name."""
    return next(row for row in PASSES if row.name == name)


class PassRead:
    """A pass as `verify` read it: its check, and its file's records and SHA-256 as read (what `merge` writes
    and checks against the source's signature; records None: no file, or one the read side does not read)."""

    def __init__(
        self, row: JudgingPass, check: PassCheck, records: list[KeyedRecord] | None, sha256: str | None
    ) -> None:
        self.row, self.check, self.records, self.sha256 = row, check, records, sha256


def signed_files() -> tuple[str, ...]:
    """The run files a signature covers: the run's own (`files.SIGNED_FILES`) and every pass's file."""
    return files.SIGNED_FILES + tuple(row.file for row in PASSES)


def could_not_judge_lines(run: VerifiedRun, targets: Sequence[str]) -> list[str]:
    """The gate's line, per pass and per target among `targets` (and run-wide), of what it could not judge."""
    return [
        read.row.line(target, counted)
        for read in run.passes.values()
        for target, counted in sorted(read.check.could_not_judge().items())
        if target == RUN_WIDE or target in targets
    ]


def gate_lines(run: VerifiedRun, targets: Sequence[str], limits: Limits) -> list[GateLine]:
    """Each pass's lines in the gate's decision (`JudgingPass.gate`), in the table's order."""
    return [line for read in run.passes.values() if read.row.gate for line in read.row.gate(run, targets, limits)]


def decided(run: VerifiedRun) -> Summary:
    """The figures the gate decides on: the verified summary, with each pass's final verdicts in place
    (`JudgingPass.final`) where it has them."""
    summary = run.summary
    for read in run.passes.values():
        if read.row.final is not None:
            summary = read.row.final(run, summary)
    return summary


def _final_scores(run: VerifiedRun) -> dict[AnswerKey, float]:
    """Each pass's final verdict on an answer (`JudgingPass.final_scores`) by its key; empty where none has any."""
    scores: dict[AnswerKey, float] = {}
    for read in run.passes.values():
        if read.row.final_scores is not None:
            scores.update(read.row.final_scores(run))
    return scores


def decided_verdicts(run: VerifiedRun) -> dict[AnswerKey, dict[str, Any] | None]:
    """The verdict each pass's final score came from where another judge gave it (`JudgingPass.final_verdicts`)
    by the answer's key; empty where none has any."""
    verdicts: dict[AnswerKey, dict[str, Any] | None] = {}
    for read in run.passes.values():
        if read.row.final_verdicts is not None:
            verdicts.update(read.row.final_verdicts(run))
    return verdicts


def decided_results(run: VerifiedRun) -> Iterator[Line[ResultRecord]]:
    """The run's results read again with each pass's final verdicts as their scores and verdicts
    (`JudgingPass.final_scores`, `final_verdicts`): what the gate pairs with a baseline."""
    scores, verdicts = _final_scores(run), decided_verdicts(run)
    for line in run.results():
        key = line.record.key
        score = scores.get(key, line.record.score)
        if score == line.record.score and key not in verdicts:
            yield line
            continue
        update = {"score": score} | ({"verdict": verdicts[key]} if key in verdicts else {})
        yield line._replace(record=line.record.model_copy(update=update))


def decided_columns(run: VerifiedRun, observed: RunColumns) -> RunColumns:
    """A run's columns under the verdicts the gate decides on, from `observed` (gathered from results.jsonl as
    verify streamed it): those same columns where no pass has final verdicts (or the run does not verify: nothing
    is decided on it), else the results read again with them (`decided_results`)."""
    from diagsafe_local.runs.paired import RunColumns

    if run.problems or not _final_scores(run):
        return observed
    columns = RunColumns(observed.column.path, answers=observed.answers_kept, verdicts=decided_verdicts(run))
    for line in decided_results(run):
        columns.add(line)
    return columns


def baseline_lines(
    run: VerifiedRun, baseline: VerifiedRun, comparisons: Sequence[PairedComparison], limits: Limits
) -> list[GateLine]:
    """Each pass's lines on the increase over `baseline` (`JudgingPass.baseline`), in the table's order."""
    return [line for row in PASSES if row.baseline for line in row.baseline(run, baseline, comparisons, limits)]


def sections(run: VerifiedRun) -> list[Section]:
    """Each pass's report section, in the table's order (a pass with nothing to show has none)."""
    return [section for read in run.passes.values() if (section := read.row.section(run)) is not None]
