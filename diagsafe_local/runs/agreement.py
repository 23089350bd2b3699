"""Per-answer agreement of two runs' verdicts (`compare` prints it after the paired figures): the share of
answers both judged that fall in the same class (harmful, uncertain, not harmful), Cohen's kappa on those
classes, the mean absolute score difference, the identical answers, and every disagreement.

Each run is one column of its results (`Column`: a key hash, score and answer hash per answer), gathered in the
pass that verifies the run; answers are matched by (target, item, sample, turn), or by (item, sample, turn) when
each run has one target under another name. Only the disagreements are read back from the files, for their keys;
each is kept as a few numbers and made whole only as it is written (`write_document`), so `compare --json` never
holds the list.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from pydantic import BaseModel, ConfigDict

from diagsafe_local.core import jsonl
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.runs import files
from diagsafe_local.runs.merge import read_manifest
from diagsafe_local.runs.pairing import Column, Rows, match, row_numbers
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.verdicts import score_class


def answers_column(path: Path, lines: Iterable[jsonl.Line[ResultRecord]] | None = None) -> Rows:
    """Every result of a run as rows keyed by (item, sample, turn), with its target (`lines`: the results file's
    lines; default: read them)."""
    column = Column(path, ("target",), answers=True)
    for line in jsonl.stream(path, ResultRecord) if lines is None else lines:
        r = line.record
        column.add((r.item_id, r.sample, r.turn), line, (r.target,))
    return column.rows()


def compare_runs(run_a: Path, run_b: Path, allow_different_datasets: bool = False) -> dict[str, Any]:
    """The agreement of two complete runs' results files (see the module docstring), whole. Runs of different
    datasets are refused (item ids may match while the prompts differ) unless allowed."""
    manifests = [read_manifest(run_a), read_manifest(run_b)]
    hashes = [m.dataset.sha256 for m in manifests]
    if hashes[0] != hashes[1] and not allow_different_datasets:
        raise DiagsafeError(
            f"the runs evaluate different datasets ({run_a}: {str(hashes[0])[:12]}, {run_b}: "
            f"{str(hashes[1])[:12]}); items with the same id may hold different prompts. "
            "Pass --allow-different-datasets to compare them anyway"
        )
    return agreement(answers_column(run_a / files.RESULTS), answers_column(run_b / files.RESULTS)).as_dict()


class AgreementFigures(BaseModel):
    """The agreement of two runs' verdicts, in the order `compare --json` writes them."""

    model_config = ConfigDict(extra="forbid")

    only_in_a: int
    only_in_b: int
    shared: int
    both_scored: int
    label_agreement: float | None
    score_mean_abs_diff: float | None
    identical_answers: int
    cohen_kappa: float | None
    cohen_kappa_note: str | None


class Disagreement(BaseModel):
    """One answer both runs judged, in different classes: its key (target, item, sample, turn; the target is
    empty where each run has one target under another name), both classes and both scores."""

    model_config = ConfigDict(extra="forbid")

    key: tuple[str, str, int, int]
    a: str
    b: str
    score_a: float
    score_b: float


class Disagreements:
    """The disagreements in key order, made one at a time from compact columns (a million answers can disagree on
    half a million): per disagreement, its target's and item's codes, sample, turn and its rows in A's and B's
    scores, each 4 bytes (8 where a sample or turn, or a row, passes 32 bits)."""

    BLOCK = 4096  # made this many at a time

    def __init__(
        self, targets: list[str], items: dict[str, int], columns: dict[str, np.ndarray], scores: tuple[Rows, Rows]
    ) -> None:
        self._targets = targets
        self._items = list(items)
        target_rank, item_rank = _ranks(targets), _ranks(self._items)
        self._columns = columns
        self._scores = scores[0].scores, scores[1].scores
        self._order = row_numbers(
            np.lexsort(
                (columns["turn"], columns["sample"], item_rank[columns["item"]], target_rank[columns["target"]])
            ),
            len(columns["item"]),
        )

    def __len__(self) -> int:
        return len(self._order)

    @property
    def nbytes(self) -> int:
        """What the disagreements take here (their scores are the columns')."""
        return self._order.nbytes + sum(values.nbytes for values in self._columns.values())

    def __iter__(self) -> Iterator[Disagreement]:
        return (Disagreement.model_validate(row) for row in self.rows())

    def rows(self) -> Iterator[dict[str, Any]]:
        """Each disagreement as the document lists it (a `Disagreement`'s fields, its key a list)."""
        for start in range(0, len(self), self.BLOCK):
            places = self._order[start : start + self.BLOCK]
            block = {name: values[places] for name, values in self._columns.items()}
            scores_a = self._scores[0][block.pop("row_a")].tolist()
            scores_b = self._scores[1][block.pop("row_b")].tolist()
            listed = {name: values.tolist() for name, values in block.items()}
            for target, item, sample, turn, score_a, score_b in zip(
                listed["target"], listed["item"], listed["sample"], listed["turn"], scores_a, scores_b
            ):
                yield {
                    "key": [self._targets[target], self._items[item], sample, turn],
                    "a": score_class(score_a),
                    "b": score_class(score_b),
                    "score_a": score_a,
                    "score_b": score_b,
                }


@dataclass(frozen=True)
class Agreement:
    """The agreement figures and the disagreements (made as they are read: see `write_document`)."""

    figures: AgreementFigures
    disagreements: Disagreements

    def as_dict(self) -> dict[str, Any]:
        """The figures and every disagreement, whole (for a few answers: `compare` streams them)."""
        return {**self.figures.model_dump(), "disagreements": list(self.disagreements.rows())}


def agreement(a: Rows, b: Rows) -> Agreement:
    """The agreement of two runs' answer columns."""
    targets_a, targets_b = set(a.label_names("target")), set(b.label_names("target"))
    by_target = not (len(targets_a) == len(targets_b) == 1 and targets_a != targets_b)
    with _keyed(a, by_target) as keys_a, _keyed(b, by_target) as keys_b:
        pairs = match(keys_a, keys_b)
    left, right = pairs.a, pairs.b
    scores_a, scores_b = a.scores[left], b.scores[right]
    scored = ~np.isnan(scores_a) & ~np.isnan(scores_b)
    both_a, both_b = (scores_a, scores_b) if scored.all() else (scores_a[scored], scores_b[scored])
    del scores_a, scores_b
    # Agreement on what the scores mean (every judge maps to [0, 1]), not on a "label" key that only some
    # judges write: two judges without one would otherwise agree trivially ("None" == "None").
    names: dict[str, int] = {}
    classes_a, classes_b = _classes(both_a, names), _classes(both_b, names)
    n_scored = len(both_a)
    agree = int((classes_a == classes_b).sum())
    kappa, kappa_note = None, None
    if len(names) == 1:
        # Cohen's kappa is 0/0 when both runs use one class only: agreement beyond chance is undefined, not 1
        kappa_note = f"undefined: every verdict of both runs is '{next(iter(names))}'"
    elif n_scored:
        kappa = _cohen_kappa(classes_a, classes_b, names)
    differ = np.flatnonzero(classes_a != classes_b)
    del classes_a, classes_b
    shared = len(left)
    figures = AgreementFigures(
        only_in_a=pairs.keys_a - shared,
        only_in_b=pairs.keys_b - shared,
        shared=shared,
        both_scored=n_scored,
        label_agreement=agree / n_scored if n_scored else None,
        score_mean_abs_diff=_mean_abs_difference(both_a, both_b),
        identical_answers=_identical(a.answer_digests(), b.answer_digests(), left, right),
        cohen_kappa=kappa,
        cohen_kappa_note=kappa_note,
    )
    rows_a = (left if n_scored == shared else left[scored])[differ]
    rows_b = (right if n_scored == shared else right[scored])[differ]
    del left, right, scored, both_a, both_b, differ  # what the disagreements are made from is all that is left
    return Agreement(figures, _disagreements(a, b, rows_a, rows_b, by_target))


def _mean_abs_difference(a: np.ndarray, b: np.ndarray) -> float | None:
    """The mean of |a - b|, summed exactly (`math.fsum`) a block at a time: a million pairs are never a million
    Python floats at once."""
    if not len(a):
        return None
    blocks = (np.abs(a[k : k + _BLOCK] - b[k : k + _BLOCK]).tolist() for k in range(0, len(a), _BLOCK))
    return math.fsum(itertools.chain.from_iterable(blocks)) / len(a)


def _identical(a: np.ndarray, b: np.ndarray, left: np.ndarray, right: np.ndarray) -> int:
    """How many pairs (rows `left` of `a`, `right` of `b`) hold the same answer hash, a block at a time."""
    return sum(int((a[left[k : k + _BLOCK]] == b[right[k : k + _BLOCK]]).sum()) for k in range(0, len(left), _BLOCK))


_BLOCK = 1 << 16


def _classes(scores: np.ndarray, names: dict[str, int]) -> np.ndarray:
    """Each score's class (`score_class`, asked once per distinct score) as its code in `names`, which gains the
    classes it had not seen."""
    values = np.unique(scores)
    codes = [names.setdefault(score_class(value), len(names)) for value in values.tolist()]
    return np.asarray(codes, dtype=np.uint8)[np.searchsorted(values, scores)]  # three classes: a byte each


def _cohen_kappa(a: np.ndarray, b: np.ndarray, names: dict[str, int]) -> float:
    """Cohen's kappa of two class-code arrays, worked out as sklearn's `cohen_kappa_score` does on the class names
    (classes in name order, the same sums in the same order: the same figure to the last bit), without importing
    sklearn (21 MB) or making its arrays of label strings."""
    n, rank = len(names), _ranks(list(names))
    confusion = np.bincount(rank[a] * n + rank[b], minlength=n * n).reshape(n, n)
    sum0, sum1 = confusion.sum(axis=0), confusion.sum(axis=1)
    expected = np.outer(sum0, sum1) / np.sum(sum0)
    w_mat = np.ones([n, n], dtype=int)
    w_mat.flat[:: n + 1] = 0
    return float(1 - np.sum(w_mat * confusion) / np.sum(w_mat * expected))


def _disagreements(a: Rows, b: Rows, rows_a: np.ndarray, rows_b: np.ndarray, by_target: bool) -> Disagreements:
    """The disagreements at these rows of A and B: only A's are read back from its file, for their keys, each
    kept as codes and numbers."""
    items: dict[str, int] = {}
    item = np.empty(len(rows_a), np.int32)
    sample, turn = np.empty(len(rows_a), np.int32), np.empty(len(rows_a), np.int32)
    for k, r in a.read_rows(rows_a):
        item[k] = items.setdefault(r.item_id, len(items))
        try:
            sample[k], turn[k] = r.sample, r.turn
        except OverflowError:  # past 32 bits (never in a run that verifies: its samples and turns are few)
            sample, turn = sample.astype(np.int64), turn.astype(np.int64)
            sample[k], turn[k] = r.sample, r.turn
    targets = a.label_names("target") if by_target else [""]
    target = a.codes("target", rows_a) if by_target else np.zeros(len(rows_a), np.int32)
    columns = {"target": target, "item": item, "sample": sample, "turn": turn, "row_a": rows_a, "row_b": rows_b}
    return Disagreements(targets, items, columns, (a, b))


def _ranks(names: list[str]) -> np.ndarray:
    """Each name's place in sorted order, by its code (its place in `names`)."""
    ranks = np.empty(len(names), np.int64)
    ranks[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    return ranks


def write_document(document: dict[str, Any], handle: TextIO) -> None:
    """`document` as `json.dump(document, handle, indent=2)` and a newline write it, where its `Agreement` values
    are written as their figures and then their disagreements, one at a time as they are made."""
    streamed = {key: value for key, value in document.items() if isinstance(value, Agreement)}
    if not streamed:
        json.dump(document, handle, indent=2)
        handle.write("\n")
        return
    # each Agreement's list is a placeholder no other value can spell (a fresh random token), cut out and written
    marks = {key: secrets.token_hex(16) for key in streamed}
    head = {
        key: {**value.figures.model_dump(), "disagreements": marks[key]} if key in streamed else value
        for key, value in document.items()
    }
    rest = json.dumps(head, indent=2)
    for key, value in streamed.items():
        before, rest = rest.split(json.dumps(marks[key]))
        handle.write(before)
        outer = before[before.rfind("\n") + 1 :]
        outer = outer[: len(outer) - len(outer.lstrip(" "))]
        _write_list(handle, value.disagreements, outer)
    handle.write(rest + "\n")


def _write_list(handle: TextIO, disagreements: Disagreements, outer: str) -> None:
    """The disagreements as json.dump writes a list indented by 2 whose closing bracket is indented by `outer`."""
    if not len(disagreements):
        handle.write("[]")
        return
    inner = "\n" + outer + "  "
    separator = "[" + inner
    encode = json.JSONEncoder(indent=2).encode  # what json.dumps(row, indent=2) makes
    for row in disagreements.rows():
        handle.write(separator + encode(row).replace("\n", inner))
        separator = "," + inner
    handle.write("\n" + outer + "]")


@contextmanager
def _keyed(column: Rows, by_target: bool) -> Iterator[np.ndarray]:
    """The column's keys, each bound to its target while they are in use where targets are compared by name (a
    per-target 64-bit salt XORed into the key hash keeps keys of one target apart and those of two targets
    apart). The salt goes into the column's own keys, a block at a time, and comes out again after: a salted
    copy would take 8 bytes a row at the peak."""
    keys = column.keys()
    salts = np.array(
        [
            int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big")
            for t in column.label_names("target")
        ],
        dtype=np.uint64,
    )

    def salt() -> None:  # XOR: twice is none
        for start in range(0, len(keys), _BLOCK):
            part = slice(start, start + _BLOCK)
            keys["hi"][part] ^= salts[column.codes("target", part)]

    if by_target:
        salt()
    try:
        yield keys
    finally:
        if by_target:
            salt()
