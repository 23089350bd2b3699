"""The one JSONL reader and writer: `\\n` is the only line break, torn lines only where a run resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from diagsafe_local.core import jsonl
from diagsafe_local.core.errors import DataError
from diagsafe_local.core.jsonl import JsonlStore, KeyedRecord
from diagsafe_local.runs.records import GenerationRecord

# Characters that str.splitlines() treats as line breaks, all legal inside a JSON string.
SPLITLINES_BREAKS = "\u2028\u2029\u0085\x0b\x0c\x1c\x1d\x1e\r"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.sampled_from(list(SPLITLINES_BREAKS)),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.dictionaries(st.text(), json_values, max_size=5), max_size=6))
def test_any_unicode_round_trips_through_write_and_read(tmp_path: Path, records: list[dict]) -> None:
    path = tmp_path / "round.jsonl"
    jsonl.write(path, records)
    assert [row for _, row in jsonl.json_rows(path)] == records
    assert path.read_bytes().count(b"\n") == len(records)


def test_splitlines_characters_inside_strings_are_content(tmp_path):
    text = "a" + SPLITLINES_BREAKS + "b"
    path = tmp_path / "breaks.jsonl"
    path.write_text(
        json.dumps({"response": text}, ensure_ascii=False) + "\n" + json.dumps({"response": "x"}) + "\n",
        encoding="utf-8",
    )
    assert len(path.read_text(encoding="utf-8").splitlines()) > 2  # what a splitlines() reader would see
    assert [(n, r["response"]) for n, r in jsonl.json_rows(path)] == [(1, text), (2, "x")]


class Row(BaseModel):
    key: int
    text: str


class Keyed(KeyedRecord):
    id: int
    text: str

    @property
    def key(self) -> int:
        return self.id


def test_torn_last_line_is_an_error_except_where_a_run_resumes(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": 1, "text": "a"}\n{"id": 2, "tex', encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: invalid JSON.*torn"):
        jsonl.read_records(path, Keyed)
    store = JsonlStore(path, Keyed)
    assert [r.key for r in store.values()] == [1] and path.read_bytes() == b'{"id": 1, "text": "a"}\n'
    # A bad line that is not the last one is never taken for a torn line.
    path.write_text('{"id": 1, "tex\n{"id": 2, "text": "b"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="line 1: invalid JSON"):
        JsonlStore(path, Keyed)
    # nor is a complete last line that is not a record: that is bad data, not a crash
    path.write_text('{"id": 1, "text": "a"}\n{"id": "x", "text": "b"}', encoding="utf-8")
    with pytest.raises(DataError, match="line 2"):
        JsonlStore(path, Keyed)


def test_invalid_record_names_line_and_field(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"key": 1, "text": "a"}\n\n{"key": "x", "text": "b"}\n', encoding="utf-8")
    with pytest.raises(DataError) as info:
        jsonl.read_records(path, Row)
    assert (info.value.line, info.value.field) == (3, "key")


def test_resuming_store_cuts_and_reports_the_torn_line(tmp_path, caplog):
    path = tmp_path / "generations.jsonl"
    store = JsonlStore(path, GenerationRecord)
    record = GenerationRecord(target="t", item_id="i\u2028d", sample=0, turn=1, answer="ok\u2029", finish_reason="stop")
    store.append([record])
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"target": "t", "item_id": "j"')
    with caplog.at_level("WARNING"):
        reopened = JsonlStore(path, GenerationRecord)
    assert list(reopened.values()) == [record] and reopened.get(record.key) == record
    assert path.read_bytes().endswith(b"\n") and "torn last line" in caplog.text
    from diagsafe_local.runs.records import read_results

    results = tmp_path / "results.jsonl"
    results.write_text('{"schema_version": 1', encoding="utf-8")
    with pytest.raises(DataError, match="line 1"):  # a finished run's reader never guesses
        read_results(results)


def test_a_streamed_line_cannot_be_changed_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"key": 1, "text": "a"}\n \t\r\n\x0b\x0c\n\n{"key": 2, "text": "\xc2\x85"}\n')
    lines = list(jsonl.stream(path, Row))
    assert [(line.number, line.offset, line.record.key) for line in lines] == [(1, 0, 1), (5, 32, 2)]
    with pytest.raises(AttributeError):
        lines[0].record = Row(key=3, text="b")  # type: ignore[misc]  # what was verified stays what was read
    changed = lines[0]._replace(record=Row(key=3, text="b"))
    assert (changed.record.key, lines[0].record.key, changed.raw) == (3, 1, lines[0].raw)
