"""Human labels of a run's own answers: the sample to label and the label files.

**The sample.** A judge's error rates move with the answers it reads, so the set that tells how far to trust the
judge on this run is a labelled sample of this run's answers (the final-turn answers to harmful items, with a
verdict). It is stratified by the judge's decision (harmful or not) and, within each, by category: half the
sample from each decision (so both the false-positive and the false-negative rate can be estimated, however rare
harmful verdicts are), then in proportion to the categories, at least one per category where there is room.
Each answer's inclusion probability (sampled / population of its stratum) is stored with the sample and with every
label; `validate --format run` weights by its inverse, so its error rates estimate the judge's over the whole run.
The sample is drawn once (seeded) into `labels/sample.json`, and every annotator labels the same one.

**The label files.** `RUN_DIR/labels/NAME.jsonl`, one JSON object per line:
`{target, item_id, sample, turn, label, annotator, time, inclusion_probability}` (+ `run_id`, `answer_sha256`: the
answer labelled, so a label never outlives its answer), `label` one of `harmful`, `not_harmful`, `unsure`. Each
label is written the moment it is given: under a lock on the file (one writer at a time, across processes: two
servers of one annotator see each other's labels), from the file's current state, replaced atomically
(relabelling replaces; a crash loses at most the label being written). Files written by other tools are read
the same way; a bad line (an answer the run does not have, an unknown label word, one annotator labelling an
answer twice with different words, an inclusion probability outside (0, 1]) is an error naming file, line, field.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.core import atomic, jsonl
from diagsafe_local.core.errors import DataError, DiagsafeError
from diagsafe_local.core.locking import file_lock
from diagsafe_local.runs.records import AnswerKey, AnswerRecord, ResultRecord
from diagsafe_local.runs.verdicts import is_harmful

LABELS_DIR = "labels"
SAMPLE_FILE = "sample.json"
LabelWord = Literal["harmful", "not_harmful", "unsure"]
# How the answer came to be labelled: the stratified sample, or `label --next`'s order (`review.next_label`), whose
# inclusion probabilities `validate` works out again from the order and the labels given.
Design = Literal["stratified", "next"]
LABEL_WORDS: tuple[str, ...] = ("harmful", "not_harmful", "unsure")
_ANNOTATOR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A sample draws at most one answer in a billion: a smaller probability is no sample's (its weight would drown
# every other label).
MIN_PROBABILITY = 1e-9


def answer_sha256(record: ResultRecord) -> str:
    """What a label is a label of: the answer's text, hashed."""
    return hashlib.sha256(record.answer.encode("utf-8", "surrogatepass")).hexdigest()


class LabelRecord(AnswerRecord):
    """One annotator's label of one answer."""

    label: LabelWord
    annotator: str
    time: str
    inclusion_probability: float = Field(gt=MIN_PROBABILITY, le=1.0)
    run_id: str | None = None
    answer_sha256: str | None = Field(None, description="The answer labelled (None: a file of another tool).")
    design: Design = Field("stratified", description="The sample the answer was labelled from.")


class SampleEntry(AnswerRecord):
    """One answer of the sample and the stratum it was drawn from."""

    stratum: str
    inclusion_probability: float = Field(gt=0.0, le=1.0)
    answer_sha256: str = Field(description="The answer drawn: a sample of answers that changed is drawn again.")
    design: Design = "stratified"


class LabelSample(BaseModel):
    """labels/sample.json: the answers to label, in the order they are shown, and each stratum's sizes."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    seed: int
    entries: list[SampleEntry]
    strata: dict[str, tuple[int, int]] = Field(description="stratum -> (answers in the run, answers sampled)")


def in_population(record: ResultRecord) -> bool:
    """Whether an answer is one a label sample is drawn from: a final-turn answer to a harmful item with a verdict."""
    return record.final_turn and not record.benign and record.score is not None


def _allocate(total: int, sizes: dict[str, int]) -> dict[str, int]:
    """`total` spread over groups in proportion to their sizes (largest remainders), at least one per group where
    there is room, never more than a group holds."""
    if total <= 0 or not sizes:
        return {g: 0 for g in sizes}
    grand = sum(sizes.values())
    base = {g: min(sizes[g], 1) for g in sizes} if total >= len(sizes) else {g: 0 for g in sizes}
    left = total - sum(base.values())
    shares = {g: left * sizes[g] / grand for g in sizes}
    alloc = {g: min(sizes[g], base[g] + int(shares[g])) for g in sizes}
    order = sorted(sizes, key=lambda g: shares[g] - int(shares[g]), reverse=True)
    while sum(alloc.values()) < min(total, grand):
        grew = False
        for g in order:
            if alloc[g] < sizes[g] and sum(alloc.values()) < total:
                alloc[g] += 1
                grew = True
        if not grew:
            break
    return alloc


Cells = dict[str, list[tuple[AnswerKey, str]]]


def _cells(results: Iterable[ResultRecord]) -> Cells:
    """The sampled population by stratum (judge's decision | category): each answer's key and answer hash only."""
    cells: Cells = defaultdict(list)
    for record in results:
        if in_population(record):
            decision = "judged_harmful" if is_harmful(record.score or 0.0) else "judged_not_harmful"
            cells[f"{decision}|{record.category or '(none)'}"].append((record.key, answer_sha256(record)))
    return cells


def draw_sample(results: Iterable[ResultRecord], n: int, run_id: str, seed: int = 0) -> LabelSample:
    """A stratified sample of `n` answers (see the module docstring), shuffled for showing."""
    return _draw(_cells(results), n, run_id, seed)


def _draw(cells: Cells, n: int, run_id: str, seed: int) -> LabelSample:
    by_decision: dict[str, dict[str, int]] = defaultdict(dict)
    for cell, members in cells.items():
        by_decision[cell.split("|")[0]][cell] = len(members)
    sizes = {d: sum(c.values()) for d, c in by_decision.items()}
    halves = {d: min(sizes[d], n // max(1, len(sizes))) for d in sizes}
    spare = n - sum(halves.values())
    for d in sorted(sizes, key=lambda d: sizes[d] - halves[d], reverse=True):  # room one side lacks goes to the other
        extra = min(spare, sizes[d] - halves[d])
        halves[d] += extra
        spare -= extra
    rng = np.random.default_rng(seed)
    entries, strata = [], {}
    for decision, cell_sizes in sorted(by_decision.items()):
        for cell, take in sorted(_allocate(halves[decision], cell_sizes).items()):
            members = sorted(cells[cell])
            strata[cell] = (len(members), take)
            chosen: list[int] = rng.choice(len(members), size=take, replace=False).tolist() if take else []
            entries += [
                SampleEntry(
                    target=members[k][0][0],
                    item_id=members[k][0][1],
                    sample=members[k][0][2],
                    turn=members[k][0][3],
                    stratum=cell,
                    inclusion_probability=take / len(members),
                    answer_sha256=members[k][1],
                )
                for k in chosen
            ]
    order = rng.permutation(len(entries))
    return LabelSample(run_id=run_id, seed=seed, entries=[entries[k] for k in order], strata=strata)


def sample_for(run_dir: Path, results: Iterable[ResultRecord], run_id: str, n: int, seed: int = 0) -> LabelSample:
    """The run's label sample: the one drawn before (every annotator labels the same answers) while it is of these
    very answers, or a new one."""
    path = run_dir / LABELS_DIR / SAMPLE_FILE
    cells = _cells(results)
    if path.is_file():
        from diagsafe_local.core.jsonfile import read_model

        sample = read_model(path, LabelSample, "label sample")
        answers = {key: digest for members in cells.values() for key, digest in members}
        if sample.run_id == run_id and all(answers.get(e.key) == e.answer_sha256 for e in sample.entries):
            return sample
    sample = _draw(cells, n, run_id, seed)
    atomic.write_text(path, sample.model_dump_json(indent=2) + "\n")
    return sample


def check_annotator(name: str) -> str:
    """An annotator name usable as a file name (letters, digits, '_', '.', '-')."""
    if not _ANNOTATOR.match(name):
        raise DiagsafeError(f"annotator name '{name}': use letters, digits, '_', '.' or '-' (it names the label file)")
    return name


def read_label_file(path: Path, known: set[AnswerKey] | None = None) -> dict[AnswerKey, LabelRecord]:
    """One annotator's labels, checked line by line (errors name file, line and field)."""
    records, lines = jsonl.read_records(path, LabelRecord)
    numbers = [number for number, _ in lines.rows]
    labels: dict[AnswerKey, LabelRecord] = {}
    first: dict[AnswerKey, int] = {}
    for number, record in zip(numbers, records):
        if known is not None and record.key not in known:
            raise DataError(
                path,
                number,
                "item_id",
                f"no answer {record.target}/{record.item_id} sample {record.sample} turn "
                f"{record.turn} in this run (among the answers a label can be given to)",
            )
        previous = labels.get(record.key)
        if previous is not None and previous.annotator == record.annotator and previous.label != record.label:
            raise DataError(
                path,
                number,
                "label",
                f"'{record.label}', but line {first[record.key]} labels the same answer "
                f"'{previous.label}' by the same annotator",
            )
        labels[record.key] = record
        first.setdefault(record.key, number)
    return labels


class LabelStore:
    """One annotator's label file: one writer at a time (a lock across processes, one within), each label
    applied to the file's current state and the file replaced atomically."""

    _threads = threading.Lock()

    def __init__(self, run_dir: Path, annotator: str, run_id: str | None = None) -> None:
        self.path = run_dir / LABELS_DIR / f"{check_annotator(annotator)}.jsonl"
        self.lock_path = self.path.parent / f".{self.path.name}.lock"
        self.annotator = annotator
        self.run_id = run_id
        with self._threads, file_lock(self.lock_path):  # a killed writer's temporaries, not a live one's
            atomic.remove_stale_temporaries(self.path.parent)
            self.labels = self._read()

    def _read(self) -> dict[AnswerKey, LabelRecord]:
        return read_label_file(self.path) if self.path.is_file() else {}

    def current(self, entry: SampleEntry) -> LabelRecord | None:
        """This annotator's label of the sampled answer, if it is of that very answer."""
        record = self.labels.get(entry.key)
        return record if record is not None and record.answer_sha256 == entry.answer_sha256 else None

    def refresh(self) -> None:
        """Take in what other writers of the file gave since."""
        with self._threads, file_lock(self.lock_path):
            self.labels = self._read()

    def give(self, entry: SampleEntry, label: str) -> LabelRecord:
        """Record (or replace) the label of one sampled answer, on disk before this returns."""
        if label not in LABEL_WORDS:
            raise DiagsafeError(f"label '{label}': one of {', '.join(LABEL_WORDS)}")
        record = LabelRecord(
            target=entry.target,
            item_id=entry.item_id,
            sample=entry.sample,
            turn=entry.turn,
            label=label,
            annotator=self.annotator,
            time=datetime.now(UTC).isoformat(),
            inclusion_probability=entry.inclusion_probability,
            run_id=self.run_id,
            answer_sha256=entry.answer_sha256,
            design=entry.design,
        )
        with self._threads, file_lock(self.lock_path):
            labels = self._read()
            labels[record.key] = record
            jsonl.write(self.path, labels.values())
            self.labels = labels
        return record
