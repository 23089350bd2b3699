"""Reading JSON records with their line numbers, for error messages that point at the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diagsafe_local.errors import DataError


def json_rows(path: Path, raw: bytes | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for a JSONL file, or for a JSON array (numbered by record, from 1)."""
    raw = path.read_bytes() if raw is None else raw
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(path, line, None, f"invalid UTF-8 at byte {exc.start}") from None
    stripped = text.lstrip("\ufeff").lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise DataError(path, exc.lineno, None, f"invalid JSON: {exc.msg}") from None
        for index, item in enumerate(items, start=1):
            yield index, _as_object(path, index, item)
        return
    for number, line in enumerate(text.lstrip("\ufeff").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(path, number, None, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
        yield number, _as_object(path, number, item)


def _as_object(path: Path, line: int, item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise DataError(path, line, None, f"expected a JSON object, got {type(item).__name__}")
    return item
