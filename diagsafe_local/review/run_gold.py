"""A run's own labels as a gold set: `validate --gold RUN_DIR --format run` scores the run's stored verdicts
against the labels people gave its answers (`label`, or label files other tools wrote), without judging again.

Each labelled answer is one gold item: its label is the majority of its annotators' `harmful`/`not_harmful`
(`unsure` abstains; a tie leaves the item unlabelled, counted apart), its annotators' votes are kept for
inter-annotator agreement, and its weight is the inverse of its inclusion probability, so accuracy, FPR and FNR
estimate the judge's error rates over the whole run, not over the sample. The run's verdicts are the stored
column `run_judge`, identified as the run's judge (model by content, rubric, scoring mode): the validation
directory then works as `judge.validation` and for `gate --corrected`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from diagsafe_local.core import jsonl
from diagsafe_local.core.errors import DataError
from diagsafe_local.review.labels import (
    LABELS_DIR,
    SAMPLE_FILE,
    LabelRecord,
    answer_sha256,
    in_population,
    read_label_file,
)
from diagsafe_local.runs import files
from diagsafe_local.runs.manifest import read_manifest_file
from diagsafe_local.runs.records import AnswerKey, ResultRecord
from diagsafe_local.runs.summary import read_summary
from diagsafe_local.validation.gold import Columns, GoldFormat, GoldItem, GoldRead, Rows, Task, majority

if TYPE_CHECKING:
    from diagsafe_local.review.next_label import NextOrder

STORED = "run_judge"


def read_run(path: Path, rows: Rows, columns: Columns, task: Task | None) -> GoldRead:
    """The labelled answers of a run directory (see the module docstring)."""
    if not (path / files.RESULTS).is_file():
        raise DataError(path, None, None, f"not a run directory (no {files.RESULTS})")
    manifest = read_manifest_file(path)
    label_files = sorted(p for p in (path / LABELS_DIR).glob("*.jsonl")) if (path / LABELS_DIR).is_dir() else []
    if not label_files:
        raise DataError(
            path / LABELS_DIR, None, None, "no label files: label answers with `diagsafe-local label` first"
        )
    # the labels are few: read them first, then keep only the labelled answers as the results stream past
    label_sets = [read_label_file(label_file) for label_file in label_files]
    labelled = {key for labels in label_sets for key in labels}
    digest = hashlib.sha256()
    results: dict[AnswerKey, ResultRecord] = {}

    def population() -> Iterator[ResultRecord]:
        for line in jsonl.stream(path / files.RESULTS, ResultRecord, digest):
            if in_population(line.record):
                if line.record.key in labelled:
                    results[line.record.key] = line.record
                yield line.record

    stream = population()
    order = _drawn_again(path, stream, manifest.run_id, label_sets)
    for _ in stream:  # without `label --next`'s order the stream is read for the labelled answers alone
        pass
    answers = {key: answer_sha256(record) for key, record in results.items()}
    by_annotator: dict[str, dict[AnswerKey, LabelRecord]] = {}
    stale: dict[str, int] = {}
    for label_file in label_files:
        for key, label in read_label_file(label_file, set(results)).items():
            if (label.run_id is not None and label.run_id != manifest.run_id) or (
                label.answer_sha256 is not None and label.answer_sha256 != answers[key]
            ):
                stale[label.annotator] = stale.get(label.annotator, 0) + 1
                continue
            by_annotator.setdefault(label.annotator, {})[key] = label
    notes = tuple(
        f"{n} labels by {annotator} are of answers this run no longer has (another run, or the answer changed "
        "since it was labelled): left out; label them again with `diagsafe-local label`"
        for annotator, n in sorted(stale.items())
    )
    if not by_annotator:
        raise DataError(path / LABELS_DIR, None, None, "no label is of this run's current answers: " + " ".join(notes))
    by_annotator, notes = _as_they_came(path, by_annotator, notes, order)
    annotators = sorted(by_annotator)
    keys = sorted({k for labels in by_annotator.values() for k in labels})
    items = []
    for key in keys:
        given = [by_annotator[a].get(key) for a in annotators]
        probabilities = {round(r.inclusion_probability, 12) for r in given if r is not None}
        if len(probabilities) > 1:
            raise DataError(
                path / LABELS_DIR, None, "inclusion_probability",
                f"the annotators give {key} different inclusion probabilities {sorted(probabilities)}",
            )  # fmt: skip
        votes = tuple(None if r is None or r.label == "unsure" else int(r.label == "harmful") for r in given)
        record = results[key]
        items.append(
            GoldItem(
                id="/".join(map(str, key)),
                line=None,
                prompt=record.conversation[-1].content,
                response=record.answer,
                label=majority(votes),
                annotators=votes if len(annotators) > 1 else (),
                groups={"category": record.category or "(none)", "target": record.target},
                stored={STORED: record.score},
                weight=1.0 / probabilities.pop(),
            )
        )
    identity = {
        name: getattr(manifest.judge, name, None) for name in ("rubric", "model", "model_hash", "lora_hash", "scoring")
    }
    for label_file in label_files:
        digest.update(label_file.read_bytes())
    return GoldRead(
        items=items,
        task="harm",
        annotators=tuple(annotators) if len(annotators) > 1 else (),
        stored=(STORED,),
        stored_identities={STORED: identity},
        sha256=digest.hexdigest(),
        weighted=True,
        notes=notes,
    )


def _drawn_again(
    path: Path, population: Iterator[ResultRecord], run_id: str, label_sets: list[dict[AnswerKey, LabelRecord]]
) -> NextOrder | None:
    """`label --next`'s order, where labels were given in it, once it is the very order drawn again from this
    run's answers (its run, answers, weights and ranks under its seed): the labels' weights come from it, so any
    other order (another run's, one cut short, weights edited) is refused."""
    from diagsafe_local.review.next_label import NEXT_FILE, read_order

    order_file = path / LABELS_DIR / NEXT_FILE
    if not order_file.is_file() or all(label.design != "next" for labels in label_sets for label in labels.values()):
        return None
    return read_order(order_file, population, run_id, read_summary(path).judge_validation)


def _as_they_came(
    path: Path,
    by_annotator: dict[str, dict[AnswerKey, LabelRecord]],
    notes: tuple[str, ...],
    order: NextOrder | None,
) -> tuple[dict[str, dict[AnswerKey, LabelRecord]], tuple[str, ...]]:
    """Labels given under `label --next` with the inclusion probabilities of the labels as they are now (the
    labelled prefix of the order, `review.next_label.inclusion`); a label past an answer left unlabelled waits.
    Labels of the stratified sample are as written; the two designs are two draws, never one estimate."""
    designs = {label.design for labels in by_annotator.values() for label in labels.values()}
    if "next" not in designs:
        return by_annotator, notes
    if len(designs) > 1:
        raise DataError(
            path / LABELS_DIR, None, "design",
            "labels of both the stratified sample and `label --next`'s order: two draws with different inclusion "
            "probabilities make no one estimate; validate one of them (move the other annotators' files away)",
        )  # fmt: skip
    from diagsafe_local.review.next_label import NEXT_FILE, inclusion

    if order is None:
        raise DataError(
            path / LABELS_DIR / NEXT_FILE, None, None, "no label order: labels given in `label --next`'s order need it"
        )
    probability = inclusion(order, {key for labels in by_annotator.values() for key in labels})
    kept = {
        annotator: {
            key: label.model_copy(update={"inclusion_probability": probability[key]})
            for key, label in labels.items()
            if key in probability
        }  # fmt: skip
        for annotator, labels in by_annotator.items()
    }
    waiting = sum(len(labels) for labels in by_annotator.values()) - sum(len(labels) for labels in kept.values())
    if waiting:
        notes += (
            f"{waiting} labels given past an answer left unlabelled in `label --next`'s order wait until the gap is "
            "labelled (the labels counted are a prefix of the order, which is what makes their weights unbiased)",
        )
    if not probability:
        raise DataError(path / LABELS_DIR, None, None, "no label counts yet: " + " ".join(notes))
    return {a: labels for a, labels in kept.items() if labels}, notes


# Registered through this package's own entry point (diagsafe_local.gold_formats: run), like any plugin's: the
# format lives beside the labels it reads, a layer above the gold-set reader that uses it.
RUN_FORMAT = GoldFormat(
    "run",
    f"a run directory's own labelled answers ({LABELS_DIR}/*.jsonl, sampled by `label`; {SAMPLE_FILE}), against "
    "the run's stored verdicts, weighted by inclusion probability",
    read_run,
    tabular=False,
    directory=True,
)
