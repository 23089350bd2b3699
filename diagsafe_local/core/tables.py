"""The one reader of tabular input files (items, prompt sets, gold sets): CSV, TSV, Parquet and JSONL.

Rows come back as (line, {column: value}) with empty cells and nulls as None. A file that cannot be read
as a table the way its header says is an error naming the line and column, never a silently shifted row:
a duplicate or empty header name, a row with more fields than the header, a row with fewer (a truncated
row is not an unlabelled item), an unterminated quote. CSV is read with the standard `csv` module rather than
pandas, whose parser puts an extra field into an index column and renames duplicate headers.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from diagsafe_local.core.errors import DataError
from diagsafe_local.core.jsonl import decode, json_rows

TABLE_SUFFIXES = (".csv", ".tsv", ".parquet")


def table_rows(path: Path, raw: bytes | None = None, encoding: str = "utf-8") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a JSONL/JSON, CSV or TSV (header is line 1) or Parquet (rows numbered from 1) file."""
    raw = path.read_bytes() if raw is None else raw
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _parquet(path, raw)
    elif suffix in (".csv", ".tsv"):
        yield from _delimited(path, decode(path, raw, encoding), "\t" if suffix == ".tsv" else ",")
    else:
        yield from json_rows(path, raw)


def _missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def _parquet(path: Path, raw: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    import pandas as pd

    try:
        frame = pd.read_parquet(io.BytesIO(raw))
    except Exception as exc:  # pyarrow raises many kinds of error; all mean "unreadable file"
        raise DataError(path, None, None, f"cannot read as parquet: {exc}") from None
    for number, row in enumerate(frame.to_dict(orient="records"), start=1):
        yield number, {str(k): (None if _missing(v) else v) for k, v in row.items()}


def _delimited(path: Path, text: str, delimiter: str) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = next(reader, None)
        if header is None:
            return
        repeated = [name for name, n in Counter(header).items() if n > 1]
        if repeated:
            raise DataError(path, 1, repeated[0], "the header names this column more than once")
        if any(not name.strip() for name in header):
            raise DataError(path, 1, None, f"the header has an empty column name (column {header.index('') + 1})")
        line = reader.line_num + 1
        for cells in reader:
            if not cells or cells == [""]:
                line = reader.line_num + 1
                continue
            if len(cells) > len(header):
                raise DataError(
                    path, line, None, f"{len(cells)} fields, more than the header's {len(header)} (an unquoted comma?)"
                )
            if len(cells) < len(header):
                raise DataError(
                    path,
                    line,
                    header[len(cells)],
                    f"missing: the row has {len(cells)} fields, the header {len(header)} (a truncated row?)",
                )
            yield line, {name: (None if cell == "" else cell) for name, cell in zip(header, cells)}
            line = reader.line_num + 1
    except csv.Error as exc:
        raise DataError(path, reader.line_num, None, f"not valid CSV: {exc}") from None
