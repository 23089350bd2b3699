"""Pairing the records of two runs without holding them: each record kept as a column row (a 128-bit hash of its
pairing key, its score, where it lies in its file and a hash of its bytes), the rows matched by sorting the
hashes, and the few records a report shows read back from their files by place.

A 128-bit BLAKE2b key hash makes an accidental match of two different keys impossible in practice, and a crafted
one as hard as a BLAKE2b collision; a record read back whose bytes changed since it was paired stops the reader.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from diagsafe_local.core import jsonl
from diagsafe_local.core.errors import RunFailed
from diagsafe_local.runs.records import ResultRecord

_KEY = np.dtype([("hi", ">u8"), ("lo", ">u8")])


def line_digest(data: bytes) -> bytes:
    """The 128-bit BLAKE2b of a key or a line (what a line read back is checked against)."""
    return hashlib.blake2b(data, digest_size=16).digest()


class Column:
    """The rows of one side: key hashes, scores (NaN: unscored), file places and byte hashes, string-valued
    columns (`labels`) stored as small integer codes, and with `answers` a hash of each answer."""

    def __init__(self, path: Path, labels: tuple[str, ...] = (), answers: bool = False) -> None:
        self.path = path
        self.answers = answers
        self._answers = bytearray()
        self._keys = bytearray()
        self._digests = bytearray()
        self.scores = array("d")
        self.offsets = array("q")
        self.codes: dict[str, array[int]] = {name: array("I") for name in labels}
        self.names: dict[str, dict[str, int]] = {name: {} for name in labels}

    def __len__(self) -> int:
        return len(self.scores)

    def add(
        self, key: Any, line: jsonl.Line[ResultRecord], labels: dict[str, str] | None = None, digest: bytes = b""
    ) -> None:
        """One record: its pairing key (a tuple of strings and numbers: its repr is hashed), its line, its label
        values, and the line's `line_digest` where the caller has it."""
        self._keys += line_digest(repr(key).encode("utf-8", "surrogatepass"))  # repr: unambiguous, and C-fast
        self._digests += digest or line_digest(line.raw)
        if self.answers:
            self._answers += line_digest(line.record.answer.encode("utf-8", "surrogatepass"))
        score = line.record.score
        self.scores.append(float("nan") if score is None else float(score))
        self.offsets.append(line.offset)
        for name, value in (labels or {}).items():
            codes = self.names[name]
            self.codes[name].append(codes.setdefault(value, len(codes)))

    def keys(self) -> np.ndarray:
        return np.frombuffer(bytes(self._keys), dtype=_KEY)

    def label_names(self, name: str) -> list[str]:
        """The values of a label column, by code."""
        return list(self.names[name])

    def read(self, row: int) -> ResultRecord:
        """The record of one row, read again from its file; bytes that changed since stop the reader."""
        with open(self.path, "rb") as handle:
            return self._read(handle, row)

    def _read(self, handle: BinaryIO, row: int) -> ResultRecord:
        handle.seek(self.offsets[row])
        raw = handle.readline()
        if line_digest(raw) != bytes(self._digests[16 * row : 16 * row + 16]):
            raise RunFailed(f"{self.path} changed after it was read: nothing is shown from it")
        return ResultRecord.model_validate_json(raw)

    def read_rows(self, rows: np.ndarray) -> Iterator[tuple[int, ResultRecord]]:
        """(index into `rows`, record) of many rows, read one at a time through one handle, in file order."""
        order = sorted(range(len(rows)), key=lambda k: self.offsets[int(rows[k])])
        with open(self.path, "rb") as handle:
            for k in order:
                yield k, self._read(handle, int(rows[k]))

    def answer_digests(self) -> np.ndarray:
        """A hash of each row's answer (kept with `answers=True`)."""
        return np.frombuffer(bytes(self._answers), dtype="V16")


def last_of_each(keys: np.ndarray) -> np.ndarray:
    """The rows to keep when a key repeats: the last of each (a later record of a key replaces an earlier one), in
    row order."""
    rows = np.arange(len(keys))
    order = np.lexsort((rows, keys["lo"], keys["hi"]))
    ordered = keys[order]
    last = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        last[:-1] = (ordered["hi"][1:] != ordered["hi"][:-1]) | (ordered["lo"][1:] != ordered["lo"][:-1])
    return np.sort(order[last])


def match(a: np.ndarray, b: np.ndarray, rows_a: np.ndarray, rows_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows (of `rows_a`, `rows_b`: each side's rows with unique keys) whose keys are on both sides, as two
    aligned index arrays in the order of A's rows."""
    keys = np.concatenate([a[rows_a], b[rows_b]])
    side = np.concatenate([np.zeros(len(rows_a), np.uint8), np.ones(len(rows_b), np.uint8)])
    rows = np.concatenate([rows_a, rows_b])
    order = np.lexsort((side, keys["lo"], keys["hi"]))
    k, s = keys[order], side[order]
    pair = (k["hi"][1:] == k["hi"][:-1]) & (k["lo"][1:] == k["lo"][:-1]) & (s[:-1] == 0) & (s[1:] == 1)
    first, second = rows[order[:-1][pair]], rows[order[1:][pair]]
    in_a_order = np.argsort(first, kind="stable")
    return first[in_a_order], second[in_a_order]
