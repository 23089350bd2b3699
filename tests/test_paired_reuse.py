"""A run compared several times (a series' reference, each checkpoint with its neighbours) makes its sides and
their key order once: what is made again is what the rows gathered since would change. A run's columns gathered as
it verifies take each record's prompt hash from the verification (computed once a record)."""

from __future__ import annotations

import json

import numpy as np
from test_adversarial import finished_run
from test_paired import record

from diagsafe_local.core import jsonl
from diagsafe_local.runs.paired import RunColumns, compare_targets
from diagsafe_local.runs.pairing import _KEY, Column, last_of_keys, match
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.verify import verify_run


def _columns(path, lines: list[jsonl.Line[ResultRecord]]) -> RunColumns:
    columns = RunColumns(path, answers=False)
    for line in lines:
        columns.add(line)
    return columns


def _figures(columns_a: RunColumns, columns_b: RunColumns) -> tuple:
    comparison = compare_targets("t", "t", columns_a.sides["t"], columns_b.sides["t"])
    return (
        [d.model_dump() for d in comparison.differences],
        comparison.only_in_baseline,
        comparison.only_in_candidate,
        comparison.up.tolist(),
        comparison.down.tolist(),
    )


def test_a_runs_sides_are_made_once_and_again_when_it_gathers_more_rows(tmp_path):
    """The sides of a run are the same objects while no row is added, and are made again after one is (rows that
    replace an earlier record of their key, a new target): the comparison is then the one of columns gathered
    whole. A stale side would miss the rows added (fewer pairs, the replaced scores)."""
    path_a, path_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    jsonl.write(path_a, [record("t", f"i{k}", k % 3 / 2, category=f"c{k % 2}") for k in range(40)])
    first = [record("t", f"i{k}", (k + 1) % 3 / 2, category=f"c{k % 2}") for k in range(30)]
    later = [record("t", f"i{k}", 1.0, category="c0") for k in range(20, 40)] + [record("u", "i1", 0.0)]
    jsonl.write(path_b, first + later)
    reference = _columns(path_a, list(jsonl.stream(path_a, ResultRecord)))
    lines = list(jsonl.stream(path_b, ResultRecord))
    growing = _columns(path_b, lines[: len(first)])
    sides = growing.sides
    before = _figures(reference, growing)
    assert growing.sides is sides and reference.sides["t"].by_key() is reference.sides["t"].by_key()
    assert _figures(reference, growing) == before
    for line in lines[len(first) :]:
        growing.add(line)
    assert growing.sides is not sides and set(growing.sides) == {"t", "u"}
    after = _figures(reference, growing)
    assert after == _figures(reference, _columns(path_b, lines)) != before
    assert after[0][0]["n_paired"] == 40 and before[0][0]["n_paired"] == 30


def test_the_key_order_of_all_of_a_columns_rows_follows_the_rows_added(tmp_path):
    """A view of all of a column's rows (`rows` None) may gain rows: its key order is made each time, so it is
    always the one of the keys it has now."""
    path = tmp_path / "results.jsonl"
    jsonl.write(path, [record("t", f"i{k % 5}", 1.0) for k in range(12)])
    column = Column(path)
    lines = list(jsonl.stream(path, ResultRecord))
    for line in lines[:4]:
        column.add((line.record.item_id,), line)
    view = column.rows()
    assert sorted(view.by_key().tolist()) == [0, 1, 2, 3]
    for line in lines[4:]:
        column.add((line.record.item_id,), line)
    assert sorted(view.by_key().tolist()) == [7, 8, 9, 10, 11]  # each item's last row
    assert view.by_key().tolist() == last_of_keys(view.keys()).tolist()


def test_pairs_matched_from_the_key_orders_given_are_those_matched_from_the_keys():
    """`match` given each side's `last_of_keys` pairs as it does sorting the keys itself, on keys that repeat
    (a later row replaces an earlier one) and share a half."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        a = np.array(list(map(tuple, rng.integers(0, 4, size=(int(rng.integers(0, 40)), 2)))), dtype=_KEY)
        b = np.array(list(map(tuple, rng.integers(0, 4, size=(int(rng.integers(0, 40)), 2)))), dtype=_KEY)
        sorting, given = match(a, b), match(a, b, last_of_keys(a), last_of_keys(b))
        assert (sorting.keys_a, sorting.keys_b) == (given.keys_a, given.keys_b)
        assert sorting.a.tolist() == given.a.tolist() and sorting.b.tolist() == given.b.tolist()
        assert sorting.a.dtype == given.a.dtype and sorting.b.dtype == given.b.dtype


def test_the_prompt_hash_verify_hands_its_observer_is_the_records_own(tmp_path, monkeypatch):
    """The pair keys of columns gathered by `verify_run`'s observer (the prompt hash handed with each line) are
    those of columns that hash each record's prompt themselves, a result whose prompt was edited after the run
    too: it is paired by what it asks now (as the column alone pairs it), not by what its item asks, and the
    verification still names it."""
    run_dir = finished_run(tmp_path, monkeypatch)
    path = run_dir / "results.jsonl"
    lines = path.read_text().splitlines()
    first = json.loads(lines[0])
    first["conversation"][-1]["content"] = "something the dataset never asked"
    path.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    handed, alone = RunColumns(path, answers=False), RunColumns(path, answers=False)
    run = verify_run(run_dir, observe=handed.add)
    for line in jsonl.stream(path, ResultRecord):
        alone.add(line)
    assert any("1 results answer prompts their items do not ask" in problem for problem in run.problems)
    assert set(handed.sides) == set(alone.sides) and len(handed.column) == len(alone.column) > 0
    for target, side in alone.sides.items():
        assert handed.sides[target].keys().tolist() == side.keys().tolist()
