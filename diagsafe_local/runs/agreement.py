"""Per-answer agreement of two runs' verdicts (`compare` prints it after the paired figures): the share of
answers both judged that fall in the same class (harmful, uncertain, not harmful), Cohen's kappa on those
classes, the mean absolute score difference, the identical answers, and every disagreement.

Each run is one column of its results (`Column`: a key hash, score and answer hash per answer), gathered in the
pass that verifies the run; answers are matched by (target, item, sample, turn), or by (item, sample, turn) when
each run has one target under another name. Only the disagreements are read back from the files, for their keys;
each is kept as a few numbers and made whole only as it is written (`runs.flips.write_document`), so `compare --json` never
holds the list.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    """The agreement figures and the disagreements (made as they are read: see `runs.flips.write_document`)."""

    figures: AgreementFigures
    disagreements: Disagreements

    def as_dict(self) -> dict[str, Any]:
        """The figures and every disagreement, whole (for a few answers: `compare` streams them)."""
        return {**self.figures.model_dump(), "disagreements": list(self.disagreements.rows())}


def agreement(a: Rows, b: Rows) -> Agreement:
    """The agreement of two runs' answer columns, folded a block of pairs at a time (`_Tally`): a million pairs'
    scores and classes are never held at once."""
    targets_a, targets_b = set(a.label_names("target")), set(b.label_names("target"))
    by_target = not (len(targets_a) == len(targets_b) == 1 and targets_a != targets_b)
    with _keyed(a, by_target) as keys_a, _keyed(b, by_target) as keys_b:
        pairs = match(keys_a, keys_b)
    tally = _Tally()
    total = math.fsum(itertools.chain.from_iterable(tally.differences(a, b, pairs.a, pairs.b)))
    names, n_scored = tally.names, tally.scored
    kappa, kappa_note = None, None
    if len(names) == 1:
        # Cohen's kappa is 0/0 when both runs use one class only: agreement beyond chance is undefined, not 1
        kappa_note = f"undefined: every verdict of both runs is '{next(iter(names))}'"
    elif n_scored:
        kappa = _cohen_kappa(tally.confusion, names)
    shared = len(pairs.a)
    agree = sum(count for (x, y), count in tally.confusion.items() if x == y)
    figures = AgreementFigures(
        only_in_a=pairs.keys_a - shared,
        only_in_b=pairs.keys_b - shared,
        shared=shared,
        both_scored=n_scored,
        label_agreement=agree / n_scored if n_scored else None,
        score_mean_abs_diff=total / n_scored if n_scored else None,
        identical_answers=tally.identical,
        cohen_kappa=kappa,
        cohen_kappa_note=kappa_note,
    )
    rows_a, rows_b = (
        np.concatenate([side[:0], *kept]) for side, kept in ((pairs.a, tally.rows_a), (pairs.b, tally.rows_b))
    )
    del pairs, tally  # what the disagreements are made from is all that is left
    return Agreement(figures, _disagreements(a, b, rows_a, rows_b, by_target))


@dataclass
class _Tally:
    """The agreement's figures, folded a block of pairs at a time by `differences`: the classes of the scores
    (every judge maps to [0, 1]; not a "label" key only some judges write, which two judges without one would
    agree on trivially) by code in `names`, the pairs of codes counted, and the rows where they differ."""

    names: dict[str, int] = field(default_factory=dict)
    confusion: Counter[tuple[int, int]] = field(default_factory=Counter)  # (code in A, code in B): pairs
    scored: int = 0
    identical: int = 0  # pairs holding the same answer hash
    rows_a: list[np.ndarray] = field(default_factory=list)
    rows_b: list[np.ndarray] = field(default_factory=list)

    def differences(self, a: Rows, b: Rows, left: np.ndarray, right: np.ndarray) -> Iterator[list[float]]:
        """Fold the pairs (rows `left` of A, `right` of B) in blocks, yielding each block's absolute score
        differences of the pairs both scored: `math.fsum` sums them exactly only as one iterable."""
        scores_a, scores_b = a.scores, b.scores
        digests_a, digests_b = a.answer_digests(), b.answer_digests()
        for start in range(0, len(left), _BLOCK):
            rows_a, rows_b = left[start : start + _BLOCK], right[start : start + _BLOCK]
            self.identical += int((digests_a[rows_a] == digests_b[rows_b]).sum())
            block_a, block_b = scores_a[rows_a], scores_b[rows_b]
            scored = ~np.isnan(block_a) & ~np.isnan(block_b)
            if not scored.all():
                rows_a, rows_b, block_a, block_b = rows_a[scored], rows_b[scored], block_a[scored], block_b[scored]
            classes_a, classes_b = _classes(block_a, self.names), _classes(block_b, self.names)
            self.scored += len(block_a)
            codes, counts = np.unique(classes_a.astype(np.uint16) << 8 | classes_b, return_counts=True)
            for code, count in zip(codes.tolist(), counts.tolist()):
                self.confusion[code >> 8, code & 0xFF] += count
            differ = classes_a != classes_b
            self.rows_a.append(rows_a[differ])
            self.rows_b.append(rows_b[differ])
            yield np.abs(block_a - block_b).tolist()


_BLOCK = 1 << 16


def _classes(scores: np.ndarray, names: dict[str, int]) -> np.ndarray:
    """Each score's class (`score_class`, asked once per distinct score) as its code in `names`, which gains the
    classes it had not seen."""
    values = np.unique(scores)
    codes = [names.setdefault(score_class(value), len(names)) for value in values.tolist()]
    return np.asarray(codes, dtype=np.uint8)[np.searchsorted(values, scores)]  # three classes: a byte each


def _cohen_kappa(pairs: Counter[tuple[int, int]], names: dict[str, int]) -> float:
    """Cohen's kappa of the pairs of class codes counted, worked out as sklearn's `cohen_kappa_score` does on the
    class names (classes in name order, the same sums in the same order: the same figure to the last bit),
    without importing sklearn (21 MB) or making its arrays of label strings."""
    n, rank = len(names), _ranks(list(names))
    confusion = np.zeros((n, n), dtype=np.int64)
    for (x, y), count in pairs.items():
        confusion[rank[x], rank[y]] = count
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
    ranks = np.empty(len(names), np.int32)
    ranks[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
    return ranks


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
