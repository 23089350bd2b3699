"""Pairing the records of two runs without holding them: each record kept as a column row (a 128-bit hash of its
pairing key, its score, where it lies in its file and a hash of its bytes), the rows matched by sorting the
hashes, and the few records a report shows read back from their files by place.

A 128-bit BLAKE2b key hash makes an accidental match of two different keys impossible in practice, and a crafted
one as hard as a BLAKE2b collision; a record read back whose bytes changed since it was paired stops the reader
(a 128-bit digest of its line). An answer's hash is 64 bits: it only counts the identical answers `compare`
prints, which nothing decides on (two different answers of one key share it with probability 2^-64).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from diagsafe_local.core import jsonl
from diagsafe_local.core.errors import RunFailed
from diagsafe_local.runs.records import ResultRecord

_KEY = np.dtype([("hi", ">u8"), ("lo", ">u8")])


def line_digest(data: bytes) -> bytes:
    """A 128-bit digest of a line (what a line read back is checked against): SHA-256's first half (with the
    CPU's SHA extensions, twice BLAKE2b's speed on a line of a results file)."""
    return hashlib.sha256(data).digest()[:16]


def answer_digest(answer: str) -> bytes:
    """A 64-bit digest of an answer (the identical answers' count alone reads it): SHA-256's first quarter."""
    return hashlib.sha256(answer.encode("utf-8", "surrogatepass")).digest()[:8]


class Column:
    """The rows of one run, gathered line by line (`add`): per row a key hash, its score (NaN: unscored), where
    it lies in its file and a hash of its bytes, its string-valued columns (`labels`) as one small integer code
    of their combination, with `answers` a hash of its answer, and with `pairs` a second key hash (the key a
    paired comparison matches by; a row without one is in no pair). Held compactly, 72 bytes a row with
    everything (its offset as its low 32 bits, the high ones kept once for each run of rows that share them);
    `rows` views a part of it under either key (with `keys=False`, under its pair key only: the key is not
    hashed). `keep_no_lines`: no place nor hash of a line (20 bytes a row less), no row read back."""

    def __init__(
        self, path: Path, labels: tuple[str, ...] = (), answers: bool = False, pairs: bool = False, keys: bool = True
    ) -> None:
        self.path = path
        self.answers = answers
        self.labels = labels
        self._keys = bytearray() if keys else None
        self._pairs = bytearray() if pairs else None
        self._answers = bytearray()
        self._digests: bytearray | None = bytearray()  # None: no lines kept (`keep_no_lines`)
        self.scores = array("d")
        self._low = array("I")  # each row's offset, its low 32 bits
        self._high_rows, self._high = [0], [0]  # from row _high_rows[k] on, the offsets' high bits are _high[k]
        self._combos: dict[tuple[str, ...], int] = {}
        self._combo = array("I")

    def __len__(self) -> int:
        return len(self.scores)

    def keep_no_lines(self) -> None:
        """Keep of the rows added from now on neither where they lie nor their bytes' hash, so that no row can be
        read back (`read` refuses): for a comparison that shows no record, only figures (the series report's),
        which then spends no SHA-256 of each line. Call it before the first row."""
        if len(self):
            raise ValueError("keep_no_lines: the column already has rows")
        self._digests = None

    def add(
        self,
        key: Any,
        line: jsonl.Line[ResultRecord],
        labels: tuple[str, ...] | None = None,
        digest: bytes = b"",
        pair: Any = None,
    ) -> None:
        """One record: its key (a tuple of strings and numbers: its repr is hashed), its line, its label values
        (one for each of `labels`, in their order), the line's `line_digest` where the caller has it, and its pair
        key (None: none; a tuple of strings and integers, a record's validated fields: see `_pair_hashed`)."""
        if self._keys is not None:
            self._keys += _hashed(key)
        if self._digests is not None:
            self._digests += digest or line_digest(line.raw)
            if line.offset >> 32 != self._high[-1]:
                self._high_rows.append(len(self._low))
                self._high.append(line.offset >> 32)
            self._low.append(line.offset & 0xFFFFFFFF)
        if self.answers:
            self._answers += answer_digest(line.record.answer)
        if self._pairs is not None:
            self._pairs += _pair_hashed(pair) if pair is not None else _NONE
        score = line.record.score
        self.scores.append(float("nan") if score is None else float(score))
        if self.labels:
            values = labels or ("",) * len(self.labels)
            self._combo.append(self._combos.setdefault(values, len(self._combos)))

    def keys(self) -> np.ndarray:
        return self.rows().keys()

    def rows(self, pairs: bool = False, **where: str) -> Rows:
        """The rows whose labels have these values (all rows with none), under the key (`pairs=False`) or the
        pair key (only the rows that have one)."""
        keep: np.ndarray | None = None
        if pairs:
            held = np.frombuffer(self._pairs if self._pairs is not None else b"", dtype=_KEY)
            keep = (held["hi"] != 0) | (held["lo"] != 0)
        for name, value in where.items():
            k = self.labels.index(name)
            combos = [code for values, code in self._combos.items() if values[k] == value]
            matches = np.isin(np.frombuffer(self._combo, dtype=np.uint32), combos)
            keep = matches if keep is None else keep & matches
        return Rows(self, pairs, None if keep is None else row_numbers(np.flatnonzero(keep), len(self)))

    def label_names(self, name: str) -> list[str]:
        """The values a label column takes, by code (see `Rows.codes`)."""
        k = self.labels.index(name)
        return list(dict.fromkeys(values[k] for values in self._combos))

    def offsets(self, rows: np.ndarray) -> np.ndarray:
        """Where these rows lie in the file."""
        self._lines()
        high = np.asarray(self._high, dtype=np.int64)[np.searchsorted(self._high_rows, rows, "right") - 1]
        return (high << 32) | np.frombuffer(self._low, dtype=np.uint32)[rows]

    def _lines(self) -> bytearray:
        """The lines' digests (a column that kept none refuses: no row of it is read back)."""
        if self._digests is None:
            raise RunFailed(f"{self.path}: its rows were gathered without their lines (keep_no_lines): none is read")
        return self._digests

    def read(self, row: int) -> ResultRecord:
        """The record of one row, read again from its file; bytes that changed since stop the reader."""
        with open(self.path, "rb") as handle:
            return self._read(handle, row)

    def _read(self, handle: BinaryIO, row: int) -> ResultRecord:
        digests = self._lines()
        handle.seek((self._high[bisect.bisect_right(self._high_rows, row) - 1] << 32) | self._low[row])
        raw = handle.readline()
        if line_digest(raw) != bytes(digests[16 * row : 16 * row + 16]):
            raise RunFailed(f"{self.path} changed after it was read: nothing is shown from it")
        return ResultRecord.model_validate_json(raw)

    def read_rows(self, rows: np.ndarray) -> Iterator[tuple[int, ResultRecord]]:
        """(index into `rows`, record) of many rows, read one at a time through one handle, in file order."""
        order = np.argsort(self.offsets(rows), kind="stable")
        with open(self.path, "rb") as handle:
            for k in order.tolist():
                yield k, self._read(handle, int(rows[k]))


_NONE = bytes(16)  # no pair key (a BLAKE2b hash of zero bits is as likely as a match of two keys)


def _hashed(key: Any) -> bytes:
    """A key's 128-bit BLAKE2b (faster than SHA-256 on a few dozen bytes)."""
    return hashlib.blake2b(repr(key).encode("utf-8", "surrogatepass"), digest_size=16).digest()  # repr: unambiguous


# The runs of a series or a comparison pair the same keys (one dataset's items, samples and prompts): the last
# 4,096 pair keys' hashes are kept, so each is hashed once a process, not once a run. A kept digest is the key's own:
# a pair key is a tuple of `str` and `int` (a validated record's item id, sample and prompt hash), and two such
# tuples are equal only where their reprs, the bytes hashed, are (not so of any key: 1 == 1.0 == True).
_pair_hashed = functools.lru_cache(maxsize=4096)(_hashed)


@dataclass(frozen=True)
class Rows:
    """Some rows of a column (`rows`: their row numbers in it, in order; None: all), under its key or its pair
    key: what a paired comparison or an agreement reads. A row here is a place in `rows`."""

    column: Column
    pairs: bool
    rows: np.ndarray | None

    @property
    def path(self) -> Path:
        return self.column.path

    def __len__(self) -> int:
        return len(self.column) if self.rows is None else len(self.rows)

    def _take(self, values: np.ndarray) -> np.ndarray:
        return values if self.rows is None else values[self.rows]

    def keys(self) -> np.ndarray:
        held = self.column._pairs if self.pairs else self.column._keys
        if held is None and not self.pairs:
            raise ValueError("a column of pair keys only has no keys")
        return self._take(np.frombuffer(held if held is not None else b"", dtype=_KEY))

    def by_key(self) -> np.ndarray:
        """`last_of_keys` of these rows' keys, made once where the rows are fixed (a side, which a series compares
        with two or more others): a column's rows only grow, so a view of given rows always has the same keys; a
        view of all of them (`rows` None) may have more each time, and sorts them each time."""
        if self.rows is None:
            return last_of_keys(self.keys())
        made: np.ndarray | None = self.__dict__.get("_by_key")
        if made is None:
            made = last_of_keys(self.keys())
            object.__setattr__(self, "_by_key", made)  # frozen: a cache, no field (not compared, not shown)
        return made

    @property
    def scores(self) -> np.ndarray:
        return self._take(np.frombuffer(self.column.scores, dtype=np.float64))

    def codes(self, name: str, part: slice | np.ndarray = slice(None)) -> np.ndarray:
        """Each row's value of a label column (of the rows at `part`) as its place in `label_names(name)`."""
        k = self.column.labels.index(name)
        place = {value: n for n, value in enumerate(self.column.label_names(name))}
        lookup = np.array([place[values[k]] for values in self.column._combos], dtype=np.int32)
        combos = np.frombuffer(self.column._combo, dtype=np.uint32)
        return lookup[combos[part] if self.rows is None else combos[self.rows[part]]]

    def label_names(self, name: str) -> list[str]:
        return self.column.label_names(name)

    def answer_digests(self) -> np.ndarray:
        """A hash of each row's answer (`answer_digest`; a column made with `answers=True`)."""
        return self._take(np.frombuffer(self.column._answers, dtype=np.uint64))

    def read(self, row: int) -> ResultRecord:
        return self.column.read(row if self.rows is None else int(self.rows[row]))

    def read_rows(self, rows: np.ndarray) -> Iterator[tuple[int, ResultRecord]]:
        return self.column.read_rows(rows if self.rows is None else self.rows[rows])


@dataclass(frozen=True)
class Pairs:
    """The rows of two sides whose keys match, as two aligned index arrays in the order of A's rows (of a key that
    repeats, the last row: a later record of a key replaces an earlier one), and how many distinct keys each side
    has."""

    a: np.ndarray
    b: np.ndarray
    keys_a: int
    keys_b: int


_BLOCK = 1 << 16  # A's keys looked up this many at a time


def match(
    a: np.ndarray, b: np.ndarray, by_key_a: np.ndarray | None = None, by_key_b: np.ndarray | None = None
) -> Pairs:
    """Pair the rows of two sides by key. B's rows are sorted by key, and A's looked up in them in row order, a
    block at a time, one half of the key after the other (of a repeated key, each side keeps its last row): no
    copy of both sides' keys is made, and the row numbers kept are `row_numbers`, so the peak is about 25 bytes
    a row besides the columns. `by_key_a`, `by_key_b`: each side's `last_of_keys` where the caller has it."""
    rows = np.sort(last_of_keys(a) if by_key_a is None else by_key_a)  # A's rows to look up, in row order
    unique_b = last_of_keys(b) if by_key_b is None else by_key_b
    hi_b = b["hi"][unique_b]
    at = np.full(len(rows), -1, dtype=unique_b.dtype)  # each A row's place in unique_b, -1: none
    for start in range(0, len(rows), _BLOCK):
        hi, lo = a["hi"][rows[start : start + _BLOCK]], a["lo"][rows[start : start + _BLOCK]]
        first, last = np.searchsorted(hi_b, hi, "left"), np.searchsorted(hi_b, hi, "right")
        one = np.flatnonzero(last - first == 1)
        same = b["lo"][unique_b[first[one]]] == lo[one]
        at[start + one[same]] = first[one[same]]
        # a half shared by several of B's keys (a 64-bit coincidence, or made on purpose): the other half decides
        for k in np.flatnonzero(last - first > 1).tolist():
            place = np.flatnonzero(b["lo"][unique_b[first[k] : last[k]]] == lo[k])
            if len(place):
                at[start + k] = first[k] + place[0]
    keys_a, keys_b = len(rows), len(unique_b)
    del hi_b
    found = at >= 0
    at = at[found]
    rows_b = unique_b[at]
    del unique_b, at
    return Pairs(rows[found], rows_b, keys_a, keys_b)


def row_numbers(rows: np.ndarray, length: int) -> np.ndarray:
    """Row numbers into `length` rows, 4 bytes each where they fit (a million rows' take 4 MB, not 8)."""
    return rows.astype(np.int32) if length < 2**31 else rows


def last_of_keys(keys: np.ndarray) -> np.ndarray:
    """Of each key, its last row (a later record of a key replaces an earlier one), in key order, as
    `row_numbers`."""
    order = _by_key(keys)
    return row_numbers(order[_last_in_runs(keys, order)], len(keys))


def _by_key(keys: np.ndarray) -> np.ndarray:
    """The rows in key order, a key's rows in row order (lexsort is stable)."""
    return np.lexsort((keys["lo"], keys["hi"]))


def _last_in_runs(keys: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Of the rows in key order, those the next row does not share its key with (the last of each key),
    compared one half at a time."""
    same = np.ones(max(0, len(order) - 1), dtype=bool)
    for half in ("hi", "lo"):
        ordered = keys[half][order]
        same &= ordered[1:] == ordered[:-1]
        del ordered
    return np.append(~same, True) if len(order) else np.zeros(0, dtype=bool)
