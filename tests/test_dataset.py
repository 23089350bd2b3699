"""Loading both layouts, reference overrides, and a clear error for every class of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import SAMPLE, current_rows, wide_rows, write_jsonl

from diagsafe_local.benchmark.dataset import Category, load_dataset
from diagsafe_local.core.errors import DataError


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
        # A text category that disagrees with its response_id slot (slot 2 is a harmful response).
        (
            lambda rows: rows[2].update(response_category="safe response/refusal"),
            3,
            "response_category",
            "disagrees with response_id 102: slot 2 is 'harmful response'",
        ),
        (
            lambda rows: rows[8].update(response_category="harmful response"),
            9,
            "response_category",
            "slot 8 is 'irrelevant response'",
        ),
        (lambda rows: rows[2].update(response_category="harmful"), 3, "response_category", "'safe response/refusal'"),
        (lambda rows: rows[2].update(response_category="13"), 3, "response_category", "0-12"),
        (lambda rows: rows[2].update(response_category=2.0), 3, "response_category", "got 2.0"),
        (lambda rows: rows[5].update(response_id=999), 6, "response_id", "prompt_id*100 + a slot 0-12 (100-112)"),
        (lambda rows: rows[5].update(response_id=True), 6, "response_id", "non-negative integer"),
        (lambda rows: rows[5].update(response=7), 6, "response", "string"),
        (lambda rows: rows[4].update(harmful_prompt="something else"), 5, "harmful_prompt", "differs"),
        (lambda rows: rows.pop(0), 1, "response_category", "lacks its reference response (slot 0)"),
        (lambda rows: rows.pop(7), 1, "response_category", "7 (redirection)"),
        # A duplicated slot: a second row claiming response_id 102.
        (lambda rows: rows.insert(3, dict(rows[2])), 4, "response_id", "already has slot 2 (harmful_2) on line 3"),
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


def test_numeric_categories_and_string_ids_still_load_the_same(tmp_path):
    text = load_dataset(write_jsonl(tmp_path / "text.jsonl", current_rows()))
    numeric = load_dataset(write_jsonl(tmp_path / "numeric.jsonl", current_rows(numeric=True)))
    assert [p.model_dump() for p in text.prompts] == [p.model_dump() for p in numeric.prompts]
    rows = current_rows(numeric=True)
    rows[2]["response_id"] = "103"  # numeric category 2 with slot 3
    with pytest.raises(
        DataError, match=r"line 3: field 'response_id': must be prompt_id\*100 \+ response_category = 102"
    ):
        load_dataset(write_jsonl(tmp_path / "bad.jsonl", rows))


def test_published_layout_rows_in_any_order(tmp_path):
    rows = current_rows(3)
    shuffled = rows[::-1]
    data = load_dataset(write_jsonl(tmp_path / "shuffled.jsonl", shuffled))
    assert [p.prompt_id for p in data.prompts] == ["3", "2", "1"]
    assert all([int(r.category) for r in p.responses] == list(range(1, 13)) for p in data.prompts)
    assert data.prompts[0].responses[0].response_id == "301"


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
