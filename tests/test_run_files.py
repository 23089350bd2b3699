"""`RunFiles.model` parses a run's JSON file in one pass over its bytes (pydantic's own JSON parser), and reads
exactly what the standard library's parser and the record's validation read: the same record, the same refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from diagsafe_local.core import signing
from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.jsonfile import read_model
from diagsafe_local.runs import files
from diagsafe_local.runs.summary import Summary

EMPTY = b'{"targets": {}, "run_id": "r1"}'


@pytest.mark.parametrize(
    "raw",
    [
        EMPTY,
        b'{"targets": {}, "run_id": "r1", "run_id": "r2"}',  # a key twice: the last one, as json.loads takes it
        b'{"targets": {}, "run_id": "\\ud800"}',  # an escape only the standard library's parser takes
        b'{"targets": {}, "run_id": NaN}',
        b'{"targets": {}, "run_id": "r1"} x',
        b'{"targets": {}, "run_id": "\xff"}',
        b'["targets"]',
        b'{"targets": {}, "run_id": 7}',
        b"\xef\xbb\xbf" + EMPTY,
    ],
)
def test_a_run_file_reads_as_the_json_reader_and_the_records_validation_read_it(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / files.SUMMARY).write_bytes(raw)
    try:
        expected: Summary | str = read_model(tmp_path / files.SUMMARY, Summary, "run summary", raw)
    except DiagsafeError as exc:
        expected = f"refused, {files.SUMMARY} does not read: {exc}"
    try:
        read: Summary | str | None = files.RunFiles(tmp_path).model(files.SUMMARY, Summary, "run summary")
    except RunFailed as exc:
        read = str(exc)
    assert read == expected


def test_a_streamed_run_file_is_recorded_by_every_byte_read(tmp_path: Path) -> None:
    """What a signature is checked against: the SHA-256 and length of the whole file as streamed, blank lines and a
    last line without its newline included."""
    raw = b'{"key": 1, "text": "a"}\n\n  \n{"key": 2, "text": "\xc3\xa9"}\r\n{"key": 3, "text": "c"}'
    (tmp_path / files.RESULTS).write_bytes(raw)

    class Row(BaseModel):
        key: int
        text: str

    held = files.RunFiles(tmp_path)
    assert [line.record.key for line in held.stream(files.RESULTS, Row)] == [1, 2, 3]
    assert held.read[files.RESULTS] == signing.digest_of(raw)
