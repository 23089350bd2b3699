"""The one JSONL reader and writer of the project.

Lines are split on `\\n` only. JSON strings may hold U+2028, U+2029, U+0085, form feeds and the other
characters that `str.splitlines()` treats as line breaks: they are content, and a reader that splits on
them breaks valid files. A record is one line ending in `\\n`; `\\r\\n` files read the same.

A last line without its newline that does not parse is a line torn by a crash. Only a resuming store
(`JsonlStore`) accepts it: it reports it and truncates it; every other reader raises a file:line error, as for
any other bad line.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError

from diagsafe_local.core import atomic
from diagsafe_local.core.errors import DataError, DiagsafeError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def decode(path: Path, raw: bytes, encoding: str = "utf-8") -> str:
    """The text of a file's bytes (UTF-8 unless told; a leading BOM dropped); bytes that are not valid in the
    encoding are an error naming the line, never mojibake."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise DiagsafeError(f"unknown encoding '{encoding}' (e.g. utf-8, latin-1, mac_roman, cp1252)") from None
    try:
        return raw.decode(encoding).removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        if encoding == "utf-8":
            hint = " (a file saved in another encoding? name it with --encoding where offered, e.g. mac_roman)"
            raise DataError(path, line, None, f"invalid UTF-8 at byte {exc.start}{hint}") from None
        raise DataError(path, line, None, f"invalid {encoding} at byte {exc.start}") from None


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def loads(path: Path, number: int, line: str) -> Any:
    """One JSON value of a file's line; values that cannot be text (a lone surrogate such as `\\ud800`, which
    no UTF-8 file can hold) or that nest without bound are errors naming the line."""
    try:
        value = json.loads(line)
    except RecursionError:
        raise DataError(path, number, None, "JSON nested too deeply") from None
    if _ESCAPED_SURROGATE.search(line):  # only an escape can make a lone surrogate; pairs are combined
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise DataError(path, number, None, "a string holds a lone surrogate (\\ud800-\\udfff escape)") from None
    return value


@dataclass
class Lines:
    """The parsed lines of a JSONL file."""

    rows: list[tuple[int, Any]]


def parse_lines(path: Path, raw: bytes) -> Lines:
    """(line number, JSON value) of every non-blank line, split on `\\n` only."""
    text = decode(path, raw)
    lines = text.split("\n")
    rows: list[tuple[int, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, loads(path, number, line)))
        except json.JSONDecodeError as exc:
            raise _invalid_json(path, number, exc, number == len(lines)) from None  # the last: no newline after it
    return Lines(rows)


def _invalid_json(path: Path, number: int, exc: json.JSONDecodeError, last: bool) -> DataError:
    hint = " (a line torn by an interrupted write?)" if last else ""
    return DataError(path, number, None, f"invalid JSON: {exc.msg} (column {exc.colno}){hint}")


def json_rows(path: Path, raw: bytes | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSONL file, or of a JSON array (numbered by record, from 1)."""
    raw = path.read_bytes() if raw is None else raw
    text = decode(path, raw)
    if text.lstrip().startswith("["):
        try:
            values = loads(path, 1, text)
        except json.JSONDecodeError as exc:
            raise DataError(path, exc.lineno, None, f"invalid JSON: {exc.msg}") from None
        rows: list[tuple[int, Any]] = list(enumerate(values, start=1))
    else:
        rows = parse_lines(path, raw).rows
    for number, value in rows:
        if not isinstance(value, dict):
            raise DataError(path, number, None, f"expected a JSON object, got {type(value).__name__}")
        yield number, value


def _validate(path: Path, number: int, value: Any, model: type[M]) -> M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"]) or None
        raise DataError(path, number, field, f"invalid {model.__name__}: {error['msg']}") from None


def read_records(path: Path, model: type[M]) -> tuple[list[M], Lines]:
    """Every line of `path` validated as `model`, with their line numbers."""
    if not path.is_file():
        raise DataError(path, None, None, "no such file")
    lines = parse_lines(path, path.read_bytes())
    return [_validate(path, n, value, model) for n, value in lines.rows], lines


# `stream` reads 64 KiB at a time, not the default 8 KiB: a result's line is ~2 KB, so one read call serves ~30 lines,
# not 4 (a line read and hashed: 1.67 -> 1.30 us; 1 MiB reads no faster). The bytes read are the same.
_READ_BUFFER = 1 << 16


class Line(NamedTuple, Generic[M]):
    """One record of a JSONL file as `stream` reads it: its line number, byte offset and raw bytes. Immutable, so
    no consumer changes what was verified; a NamedTuple, not a frozen dataclass: `stream` makes one a line, and a
    frozen dataclass's __init__ (object.__setattr__ a field) costs ~0.5 us against ~0.23 (a record ~0.2 us less)."""

    number: int
    offset: int
    raw: bytes
    record: M


def stream(path: Path, model: type[M], digest: Any = None) -> Generator[Line[M], None, int]:
    """Every line of `path` validated as `model`, one at a time (memory does not grow with the file); `digest`
    (a hashlib object) is fed every byte read, so a reader gets the file's hash from the same pass, and the
    generator returns how many bytes it read (`yield from`'s value). A line that is not valid JSON, not UTF-8 or
    not a `model` is an error naming the file, line and field."""
    if not path.is_file():
        raise DataError(path, None, None, "no such file")
    offset = 0
    validate = model.__pydantic_validator__.validate_json
    with open(path, "rb", buffering=_READ_BUFFER) as handle:
        for number, raw in enumerate(handle, start=1):  # binary lines split on \n only
            if digest is not None:
                digest.update(raw)
            if not raw.isspace():  # as raw.strip() (a line is never empty), without copying the line: 81 -> 13 ns
                try:
                    record = validate(raw)
                except ValidationError:
                    record = _validate_line(path, number, raw, model)  # says why, naming the line
                yield Line(number, offset, raw, record)
            offset += len(raw)
    return offset


def _validate_line(path: Path, number: int, raw: bytes, model: type[M]) -> M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        if error["type"] != "json_invalid":
            field = ".".join(str(p) for p in error["loc"]) or None
            raise DataError(path, number, field, f"invalid {model.__name__}: {error['msg']}") from None
    try:  # not JSON: say why as the other readers do (the line's place, a torn last line, a lone surrogate)
        line = raw.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError as exc:
        raise DataError(path, number, None, f"invalid UTF-8 at byte {exc.start}") from None
    try:
        value = loads(path, number, line)
    except json.JSONDecodeError as exc:
        raise _invalid_json(path, number, exc, not raw.endswith(b"\n")) from None
    return _validate(path, number, value, model)


def dumps(record: Any) -> str:
    """One record (a pydantic model or a JSON-able dict) as one JSONL line, with its newline; non-ASCII text
    is written as is."""
    if isinstance(record, BaseModel):
        return record.model_dump_json() + "\n"
    return json.dumps(record, ensure_ascii=False) + "\n"


def append(path: Path, records: Iterable[Any]) -> int:
    """Append records and fsync; returns how many were written."""
    text = "".join(dumps(r) for r in records)
    if not text:
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8", newline="\n") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    return text.count("\n")


def write(path: Path, records: Iterable[Any]) -> None:
    """Replace `path` atomically with these records, written as they come (an iterator is never held whole)."""
    with atomic.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        for record in records:
            handle.write(dumps(record))


class KeyedRecord(BaseModel):
    """A record a JsonlStore keeps by `key` (the last record of a key wins)."""

    @property
    def key(self) -> Any:
        raise NotImplementedError


R = TypeVar("R", bound=KeyedRecord)


class JsonlStore(Generic[R]):
    """Append-only JSONL of pydantic records, keyed; the last record of a key wins.

    It holds each key's place in the file, not its record, so memory stays a few hundred bytes per record
    however large the records: `get` reads one record back, `values` streams them. Opening it resumes: a line torn
    by a crash at the end of the file is cut off (and logged).
    """

    def __init__(self, path: Path, model: type[R]) -> None:
        self.path = path
        self.model = model
        self._places: dict[Any, int] = {}  # key -> byte offset of its line
        self._size = 0
        if path.exists():
            self._load()

    def _load(self) -> None:
        good = 0
        with open(self.path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if not raw.endswith(b"\n"):  # a last line without its newline: complete, or torn by a crash
                    try:
                        json.loads(raw)
                    except ValueError:
                        log.warning(
                            "%s: cut a torn last line (%d bytes) left by an interrupted run", self.path, len(raw)
                        )
                        with open(self.path, "r+b") as cut:
                            cut.truncate(good)
                        break
                    with open(self.path, "ab") as ending:  # so the next append starts a line of its own
                        ending.write(b"\n")
                    raw += b"\n"
                    record = _validate_line(self.path, number, raw, self.model)
                elif not raw.strip():
                    good += len(raw)
                    continue
                else:
                    record = _validate_line(self.path, number, raw, self.model)
                self._places[_interned(record.key)] = good
                good += len(raw)
        self._size = good

    def __len__(self) -> int:
        return len(self._places)

    def __contains__(self, key: Any) -> bool:
        return key in self._places

    def keys(self) -> Iterator[Any]:
        return iter(list(self._places))

    def get(self, key: Any) -> R | None:
        """The current record of `key`, read back from the file (None: none)."""
        offset = self._places.get(key)
        if offset is None:
            return None
        with open(self.path, "rb") as handle:
            handle.seek(offset)
            return _validate_line(self.path, 0, handle.readline(), self.model)

    def values(self) -> Iterator[R]:
        """The current record of every key, in file order, read one at a time."""
        if not self._places:
            return
        current = set(self._places.values())
        for line in stream(self.path, self.model):
            if line.offset in current:
                yield line.record

    def append(self, records: Iterable[R]) -> None:
        """Append and fsync a batch of records."""
        batch = list(records)
        lines = [dumps(r).encode("utf-8") for r in batch]
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as handle:
            handle.write(b"".join(lines))
            handle.flush()
            os.fsync(handle.fileno())
        offset = self._size
        for record, line in zip(batch, lines):
            self._places[_interned(record.key)] = offset
            offset += len(line)
        self._size = offset

    def keep(self, wanted: Callable[[Any], bool]) -> None:
        """Forget the records whose key is not `wanted` (compact() then drops them from the file)."""
        self._places = {k: offset for k, offset in self._places.items() if wanted(k)}

    def compact(self, order: Callable[[Any], Any] | None = None) -> None:
        """Rewrite the file atomically: one line per key (its current one, byte for byte), sorted by `order` of
        the key (default: the key)."""
        keys = sorted(self._places, key=order)
        places: dict[Any, int] = {}
        offset = 0
        with atomic.atomic_path(self.path) as tmp, open(tmp, "wb") as sink:
            if keys:
                with open(self.path, "rb") as source:
                    for key in keys:
                        source.seek(self._places[key])
                        raw = source.readline()
                        sink.write(raw)
                        places[key] = offset
                        offset += len(raw)
        self._places, self._size = places, offset


def _interned(key: Any) -> Any:
    """A key whose strings are shared with every other key holding them (a store holds millions of keys over a
    few thousand items and targets)."""
    if isinstance(key, tuple):
        return tuple(sys.intern(part) if isinstance(part, str) else part for part in key)
    return key
