"""Loading both layouts, reference overrides, and a clear error for every class of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SAMPLE, current_rows, wide_rows, write_jsonl
from diagsafe_local.benchmark.dataset import Category, load_dataset
from diagsafe_local.errors import DataError


def test_current_layout_loads_with_categories_in_order(current_file):
    data = load_dataset(current_file)
    assert data.layout == "current" and len(data.prompts) == 2 and data.n_responses == 24
    first = data.prompts[0]
    assert [int(r.category) for r in first.responses] == list(range(1, 13))
    assert first.references == (current_rows()[0]["response"],)
    assert first.responses[0].response_id == "101" and first.source == "test"
    assert len(data.sha256) == 64


def test_wide_layout_loads_two_references_and_prompt_as_repetition(wide_file):
    data = load_dataset(wide_file)
    assert data.layout == "v1" and len(data.prompts) == 2
    p = data.prompts[0]
    assert len(p.references) == 2
    repetition = [r for r in p.responses if r.category == Category.PROMPT_REPETITION][0]
    assert repetition.text == p.prompt


def test_wide_layout_as_json_array(tmp_path):
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(wide_rows()))
    assert load_dataset(path).layout == "v1"


def test_sample_dataset_is_valid():
    data = load_dataset(SAMPLE)
    assert len(data.prompts) == 10 and data.n_responses == 120


def test_reference_override_per_row(tmp_path):
    rows = current_rows()
    rows[0]["references"] = ["first ref", "second ref"]
    rows[0]["reference_agg"] = "max"
    data = load_dataset(write_jsonl(tmp_path / "b.jsonl", rows))
    assert data.prompts[0].references == ("first ref", "second ref")
    assert data.prompts[0].reference_agg == "max"
    assert data.prompts[1].reference_agg is None


def _broken(tmp_path: Path, mutate) -> Path:
    rows = current_rows()
    mutate(rows)
    return write_jsonl(tmp_path / "broken.jsonl", rows)


@pytest.mark.parametrize(
    ("mutate", "line", "field", "message"),
    [
        (lambda rows: rows[3].pop("response"), 4, "response", "missing"),
        (lambda rows: rows[2].update(response_category="13", response_id="113"), 3, "response_category", "0-12"),
        (lambda rows: rows[2].update(response_category="harmful"), 3, "response_category", "integer"),
        (lambda rows: rows[5].update(response_id="999"), 6, "response_id", "prompt_id*100"),
        (lambda rows: rows[5].update(response=7), 6, "response", "string"),
        (lambda rows: rows[4].update(harmful_prompt="something else"), 5, "harmful_prompt", "differs"),
        (lambda rows: rows.pop(0), 1, "response_category", "lacks its reference response"),
        (lambda rows: rows.pop(7), 1, "response_category", "7 (redirection)"),
        (lambda rows: rows.insert(3, dict(rows[2])), 4, "response_category", "already has category 2"),
        (lambda rows: rows[0].update(references=[]), 1, "references", "non-empty list"),
        (lambda rows: rows[0].update(reference_agg="median"), 1, "reference_agg", "'mean' or 'max'"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, mutate, line, field, message):
    path = _broken(tmp_path, mutate)
    with pytest.raises(DataError) as info:
        load_dataset(path)
    err = info.value
    assert (err.line, err.field) == (line, field)
    assert message in err.message
    assert str(path) in str(err) and f"line {line}" in str(err) and field in str(err)


def test_bad_json_names_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(r) for r in current_rows()]
    lines[6] = lines[6][:-5]
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"line 7: invalid JSON"):
        load_dataset(path)


def test_bad_utf8_names_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    data = "".join(json.dumps(r) + "\n" for r in current_rows()).encode()
    cut = data.index(b"\n", data.index(b"\n") + 1) + 10  # inside line 3
    path.write_bytes(data[:cut] + b"\xff\xfe" + data[cut:])
    with pytest.raises(DataError, match=r"line 3: invalid UTF-8"):
        load_dataset(path)


def test_wide_layout_missing_field_and_duplicate_id(tmp_path):
    rows = wide_rows()
    rows[1].pop("irr_res_2")
    with pytest.raises(DataError, match=r"line 2: field 'irr_res_2': missing"):
        load_dataset(write_jsonl(tmp_path / "a.jsonl", rows))
    rows = wide_rows()
    rows[1]["id"] = rows[0]["id"]
    with pytest.raises(DataError, match=r"line 2: field 'id': duplicate id"):
        load_dataset(write_jsonl(tmp_path / "b.jsonl", rows))


def test_unknown_layout_empty_file_and_missing_file(tmp_path):
    with pytest.raises(DataError, match="unknown layout"):
        load_dataset(write_jsonl(tmp_path / "x.jsonl", [{"prompt": "hi"}]))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="no records"):
        load_dataset(tmp_path / "empty.jsonl")
    with pytest.raises(DataError, match="no such file"):
        load_dataset(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match="expected a JSON object"):
        load_dataset(write_jsonl(tmp_path / "list.jsonl", [[1, 2]]))
