"""Per-answer agreement of two runs' verdicts (`compare` prints it after the paired figures): the share of
answers both judged that fall in the same class (harmful, uncertain, not harmful), Cohen's kappa on those
classes, the mean absolute score difference, the identical answers, and every disagreement.

Each run is one column of its results (`Column`: a key hash, score and answer hash per answer), gathered in the
pass that verifies the run; answers are matched by (target, item, sample, turn), or by (item, sample, turn) when
each run has one target under another name. Only the disagreements are read back from the files.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from diagsafe_local.core import jsonl
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.runs import files
from diagsafe_local.runs.merge import read_manifest
from diagsafe_local.runs.pairing import Column, last_of_each, match
from diagsafe_local.runs.records import AnswerKey, ResultRecord
from diagsafe_local.runs.verdicts import score_class


def answers_column(path: Path, lines: Iterable[jsonl.Line[ResultRecord]] | None = None) -> Column:
    """Every result of a run as a column keyed by (item, sample, turn), with its target (`lines`: the results
    file's lines; default: read them)."""
    column = Column(path, ("target",), answers=True)
    for line in jsonl.stream(path, ResultRecord) if lines is None else lines:
        add_answer(column, line)
    return column


def add_answer(column: Column, line: jsonl.Line[ResultRecord], digest: bytes = b"") -> None:
    r = line.record
    column.add((r.item_id, r.sample, r.turn), line, {"target": r.target}, digest)


def compare_runs(run_a: Path, run_b: Path, allow_different_datasets: bool = False) -> dict[str, Any]:
    """The agreement of two complete runs' results files (see the module docstring). Runs of different datasets
    are refused (item ids may match while the prompts differ) unless allowed."""
    manifests = [read_manifest(run_a), read_manifest(run_b)]
    hashes = [m.dataset.sha256 for m in manifests]
    if hashes[0] != hashes[1] and not allow_different_datasets:
        raise DiagsafeError(
            f"the runs evaluate different datasets ({run_a}: {str(hashes[0])[:12]}, {run_b}: "
            f"{str(hashes[1])[:12]}); items with the same id may hold different prompts. "
            "Pass --allow-different-datasets to compare them anyway"
        )
    return agreement(answers_column(run_a / files.RESULTS), answers_column(run_b / files.RESULTS))


def agreement(a: Column, b: Column) -> dict[str, Any]:
    """The agreement figures of two runs' answer columns."""
    targets_a, targets_b = set(a.names["target"]), set(b.names["target"])
    by_target = not (len(targets_a) == len(targets_b) == 1 and targets_a != targets_b)
    keys_a, keys_b = _keyed(a, by_target), _keyed(b, by_target)
    rows_a, rows_b = last_of_each(keys_a), last_of_each(keys_b)
    left, right = match(keys_a, keys_b, rows_a, rows_b)
    scores_a, scores_b = np.asarray(a.scores)[left], np.asarray(b.scores)[right]
    scored = ~np.isnan(scores_a) & ~np.isnan(scores_b)
    both_a, both_b = scores_a[scored], scores_b[scored]
    # Agreement on what the scores mean (every judge maps to [0, 1]), not on a "label" key that only some
    # judges write: two judges without one would otherwise agree trivially ("None" == "None").
    labels_a = [score_class(x) for x in both_a.tolist()]
    labels_b = [score_class(x) for x in both_b.tolist()]
    n_scored = len(labels_a)
    agree = sum(x == y for x, y in zip(labels_a, labels_b))
    kappa, kappa_note = None, None
    if len(set(labels_a) | set(labels_b)) == 1:
        # Cohen's kappa is 0/0 when both runs use one class only: agreement beyond chance is undefined, not 1
        kappa_note = f"undefined: every verdict of both runs is '{labels_a[0]}'"
    elif n_scored:
        from sklearn.metrics import cohen_kappa_score

        kappa = float(cohen_kappa_score(labels_a, labels_b))
    differ = np.flatnonzero([x != y for x, y in zip(labels_a, labels_b)])
    rows_scored_a = left[scored][differ]
    found: list[tuple[AnswerKey, int]] = []
    for k, r in a.read_rows(rows_scored_a):  # only the disagreements are read back: they are listed, with keys
        found.append(((r.target if by_target else "", r.item_id, r.sample, r.turn), int(differ[k])))
    found.sort()
    disagreements = [
        {"key": list(key), "a": labels_a[k], "b": labels_b[k], "score_a": float(both_a[k]), "score_b": float(both_b[k])}
        for key, k in found
    ]
    del found
    shared = len(left)
    return {
        "only_in_a": len(rows_a) - shared,
        "only_in_b": len(rows_b) - shared,
        "shared": shared,
        "both_scored": n_scored,
        "label_agreement": agree / n_scored if n_scored else None,
        "score_mean_abs_diff": math.fsum(np.abs(both_a - both_b).tolist()) / n_scored if n_scored else None,
        "identical_answers": int((a.answer_digests()[left] == b.answer_digests()[right]).sum()),
        "cohen_kappa": kappa,
        "cohen_kappa_note": kappa_note,
        "disagreements": disagreements,
    }


def _keyed(column: Column, by_target: bool) -> np.ndarray:
    """The column's keys, each bound to its target where targets are compared by name (a per-target 64-bit salt
    XORed into the key hash keeps keys of one target apart and those of two targets apart)."""
    keys = column.keys().copy()
    if by_target:
        salts = np.array(
            [
                int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big")
                for t in column.names["target"]
            ],
            dtype=np.uint64,
        )
        keys["hi"] ^= salts[np.asarray(column.codes["target"], dtype=np.int64)]
    return keys
