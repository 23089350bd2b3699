"""The one JSONL reader and writer of the project.

Lines are split on `\\n` only. JSON strings may hold U+2028, U+2029, U+0085, form feeds and the other
characters that `str.splitlines()` treats as line breaks: they are content, and a reader that splits on
them breaks valid files. A record is one line ending in `\\n`; `\\r\\n` files read the same.

A last line without its newline that does not parse is a line torn by a crash. Only a resuming reader
(`torn="cut"`) accepts it: it reports it and the store truncates it; every other reader raises a
file:line error, as for any other bad line.
"""

from __future__ import annotations

import codecs
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from diagsafe_local.core import atomic
from diagsafe_local.core.errors import DataError, DiagsafeError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
Torn = Literal["error", "cut"]


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
    """The parsed lines of a JSONL file, and the byte length of a torn last line that was set aside."""

    rows: list[tuple[int, Any]]
    torn_bytes: int = 0
    complete_bytes: int = 0


def parse_lines(path: Path, raw: bytes, torn: Torn = "error") -> Lines:
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
            last = number == len(lines)  # no newline after it
            if last and torn == "cut":
                cut = len(line.encode("utf-8"))
                return Lines(rows, torn_bytes=cut, complete_bytes=len(raw) - cut)
            raise _invalid_json(path, number, exc, last) from None
    return Lines(rows, complete_bytes=len(raw))


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


def read_records(path: Path, model: type[M], torn: Torn = "error") -> tuple[list[M], Lines]:
    """Every line of `path` validated as `model`, with the parse details (torn tail, if `torn="cut"`)."""
    if not path.is_file():
        raise DataError(path, None, None, "no such file")
    lines = parse_lines(path, path.read_bytes(), torn)
    return [_validate(path, n, value, model) for n, value in lines.rows], lines


@dataclass(frozen=True, slots=True)
class Line(Generic[M]):
    """One record of a JSONL file as `stream` reads it: its line number, byte offset and raw bytes."""

    number: int
    offset: int
    raw: bytes
    record: M


def stream(path: Path, model: type[M], digest: Any = None) -> Iterator[Line[M]]:
    """Every line of `path` validated as `model`, one at a time (memory does not grow with the file); `digest`
    (a hashlib object) is fed every byte read, so a reader gets the file's hash from the same pass. A line that is
    not valid JSON, not UTF-8 or not a `model` is an error naming the file, line and field."""
    if not path.is_file():
        raise DataError(path, None, None, "no such file")
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):  # binary lines split on \n only
            if digest is not None:
                digest.update(raw)
            if raw.strip():
                yield Line(number, offset, raw, _validate_line(path, number, raw, model))
            offset += len(raw)


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


def cut_torn_tail(path: Path, lines: Lines) -> None:
    """Truncate a torn last line found while resuming, and say so."""
    if lines.torn_bytes:
        log.warning("%s: cut a torn last line (%d bytes) left by an interrupted run", path, lines.torn_bytes)
        with open(path, "r+b") as handle:
            handle.truncate(lines.complete_bytes)


class KeyedRecord(BaseModel):
    """A record a JsonlStore keeps by `key` (the last record of a key wins)."""

    @property
    def key(self) -> Any:
        raise NotImplementedError


R = TypeVar("R", bound=KeyedRecord)


class JsonlStore(Generic[R]):
    """Append-only JSONL of pydantic records, keyed; the last record of a key wins.

    Opening it resumes: a line torn by a crash at the end of the file is cut off (and logged).
    """

    def __init__(self, path: Path, model: type[R]) -> None:
        self.path = path
        self.model = model
        self.records: dict[Any, R] = {}
        if path.exists():
            loaded, lines = read_records(path, model, torn="cut")
            self.records = {record.key: record for record in loaded}
            cut_torn_tail(path, lines)

    def append(self, records: Iterable[R]) -> None:
        """Append and fsync a batch of records."""
        batch = list(records)
        append(self.path, batch)
        self.records.update((record.key, record) for record in batch)

    def keep(self, keys: set[Any]) -> None:
        """Forget records whose key is not in `keys` (compact() then drops them from the file)."""
        self.records = {k: r for k, r in self.records.items() if k in keys}

    def compact(self, order: Callable[[R], Any]) -> None:
        """Rewrite the file atomically: one record per key, sorted by `order`."""
        write(self.path, sorted(self.records.values(), key=order))
