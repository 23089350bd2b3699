"""What `compare` holds per answer (issue 48: `compare --json` at a million answers under 0.3 GB): a run's column
keeps a row's offset in 4 bytes and its answer's hash in 8, the disagreements are kept in 4-byte numbers, and
none of it changes what is read back or written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from test_paired import record

from diagsafe_local.core import jsonl
from diagsafe_local.runs.agreement import agreement, answers_column
from diagsafe_local.runs.pairing import Column
from diagsafe_local.runs.records import ResultRecord


def test_rows_past_4_gib_are_read_back_from_their_places(tmp_path):
    """A column keeps each row's offset as its low 32 bits and the high bits once per run of rows sharing them:
    rows of a sparse file past 4 GiB and 8 GiB (a gap of over 4 GiB between two rows too) read back as written."""
    path = tmp_path / "results.jsonl"
    places = [0, 4096, (5 << 30) + 7, (5 << 30) + 9000, (9 << 30) + 3, (13 << 30) + 1]
    records = [record("t", f"i{k}", k % 2) for k in range(len(places))]
    with open(path, "wb") as handle:  # sparse: the gaps take no disk
        for place, one in zip(places, records):
            handle.seek(place)
            handle.write(one.model_dump_json().encode() + b"\n")
    column = Column(path)
    with open(path, "rb") as handle:
        for place, one in zip(places, records):
            handle.seek(place)
            raw = handle.readline()
            column.add(one.item_id, jsonl.Line(number=1, offset=place, raw=raw, record=one))
    assert column.offsets(np.arange(len(places))).tolist() == places
    assert [column.read(row).item_id for row in range(len(places))] == [r.item_id for r in records]
    rows = np.array([4, 1, 5, 2])
    assert [(k, r.item_id) for k, r in column.read_rows(rows)] == [(1, "i1"), (3, "i2"), (0, "i4"), (2, "i5")]


def _agreement_of(tmp_path: Path, sides: list[list[ResultRecord]]) -> list[dict]:
    columns = []
    for name, records in zip("ab", sides):
        jsonl.write(tmp_path / f"{name}.jsonl", records)
        columns.append(answers_column(tmp_path / f"{name}.jsonl"))
    return agreement(*columns).disagreements


def test_disagreements_are_held_in_under_30_bytes_each(tmp_path):
    """Each disagreement is kept as 4-byte numbers (its target's and item's codes, sample, turn, its rows in A and
    B, its place in the key order): 28 bytes, where 8-byte ones took 52. They are written in key order."""
    sides = [[record("t", f"i{k}", float((k + flip) % 2)) for k in range(3000)] for flip in (0, 1)]
    held = _agreement_of(tmp_path, sides)
    assert len(held) == 3000
    assert held.nbytes / len(held) < 30, held.nbytes / len(held)
    expected = sorted((r.item_id, r.score, b.score) for r, b in zip(*sides))
    assert [(d["key"][1], d["score_a"], d["score_b"]) for d in held.rows()] == expected


def test_a_sample_or_turn_past_32_bits_is_written_as_it_is(tmp_path):
    """No run that verifies has one (its samples and turns are the config's and the dataset's), yet a column of
    any results file keeps it whole: the disagreements' numbers widen to 8 bytes where it comes."""
    big = {"sample": 2**40, "turn": 2**33}
    sides = [
        [record("t", f"i{k}", float((k + flip) % 2)).model_copy(update=big if k == 7 else {}) for k in range(20)]
        for flip in (0, 1)
    ]
    rows = list(_agreement_of(tmp_path, sides).rows())
    keys = [["t", f"i{k}", *((2**40, 2**33) if k == 7 else (0, 1))] for k in range(20)]
    assert [d["key"] for d in rows] == sorted(keys)


def test_identical_answers_are_counted_by_their_64_bit_hashes(tmp_path):
    """The identical answers' count (the one figure that reads the answers' hashes) counts equal answers of a key
    and no others, answers differing in one character or only past their first 8 bytes among them."""
    answers = ["same", "differs at the end.", "x" * 50 + "a", "ünïcode ☃"]
    others = ["same", "differs at the end!", "x" * 50 + "b", "ünïcode ☃"]
    columns = []
    for name, texts in (("a", answers), ("b", others)):
        path = tmp_path / f"{name}.jsonl"
        jsonl.write(path, [record("t", f"i{k}", 1.0, answer=text) for k, text in enumerate(texts)])
        columns.append(answers_column(path))
    figures = agreement(*columns).figures
    assert (figures.shared, figures.identical_answers) == (4, 2)
    assert json.loads(figures.model_dump_json())["identical_answers"] == 2


def test_a_verified_run_compare_and_the_gate_hold_keeps_no_tallies(tmp_path, monkeypatch):
    """What a run's summary was folded from (its tallies: a count of every distinct verdict, ~100 bytes each, a
    million in a run whose rationales all differ) is merge's alone: the run `compare` and the gate hold keeps none,
    and the summary is the same."""
    from test_paired import two_runs

    from diagsafe_local.runs.baseline import verified
    from diagsafe_local.runs.verify import verify_run

    prod, _ = two_runs(tmp_path, monkeypatch)
    whole = verify_run(prod)
    held = verified(prod, "the run")
    assert whole.tallies is not None and held.tallies is None
    assert held.summary == whole.summary and held.passes.keys() == whole.passes.keys()


def test_compare_holds_of_each_run_what_the_paired_comparison_reads(tmp_path, monkeypatch):
    """Once a run's columns are under the verdicts the gate decides on, `compare` keeps of the run what
    `compare_with_baseline` reads: its manifest without the dataset's items (14 MB a run of 10,000 items), no
    passes, no tallies; the comparison is the same."""
    from test_paired import two_runs

    from diagsafe_local.runs.baseline import comparable, compare_with_baseline, verified

    prod, new = two_runs(tmp_path, monkeypatch)
    runs = [verified(run, "the run") for run in (prod, new)]
    light = [comparable(run) for run in runs]
    for run, kept in zip(runs, light):
        assert run.manifest.dataset.items and run.passes
        assert kept.manifest.dataset.items is None and not kept.passes and kept.tallies is None
        assert kept.manifest.dataset.sha256 == run.manifest.dataset.sha256 and kept.summary == run.summary
    whole, held = compare_with_baseline(runs[1], runs[0]), compare_with_baseline(light[1], light[0])
    assert [c.differences for c in held] == [c.differences for c in whole] and held[0].flips_up == 2


def test_row_numbers_are_held_in_4_bytes(tmp_path):
    """The rows a side views, the pairs matched and the flips kept are row numbers of 4 bytes where a column
    has under 2^31 rows (8 before: 8 MB a million more for each)."""
    from diagsafe_local.runs.paired import RunColumns, compare_targets
    from diagsafe_local.runs.pairing import match

    sides = []
    for name, flip in (("a", 0), ("b", 1)):
        path = tmp_path / f"{name}.jsonl"
        jsonl.write(path, [record("t", f"i{k}", float((k + flip) % 3 == 0)) for k in range(300)])
        columns = RunColumns(path)
        for line in jsonl.stream(path, ResultRecord):
            columns.add(line)
        sides.append(columns.side("t"))
    pairs = match(sides[0].keys(), sides[1].keys())
    comparison = compare_targets("t", "t", *sides)
    assert len(pairs.a) == 300 and comparison.flips_up == comparison.flips_down == 100
    held = [sides[0].rows, pairs.a, pairs.b, comparison.up, comparison.down]
    assert [a.nbytes for a in held] == [4 * a.size for a in held]


def test_the_agreement_is_the_same_whatever_its_block(tmp_path, monkeypatch):
    """The agreement is folded a block of pairs at a time: every figure (kappa and the exact mean difference to
    the last bit) and every disagreement is the same in blocks of 7 pairs as in one block."""
    from diagsafe_local.runs import agreement as module

    rng = np.random.default_rng(11)
    choices = [0.0, 0.1, 0.5, 0.5, 0.7, 1.0, 1.0, None]
    columns = []
    for name in "ab":
        picks = rng.integers(len(choices), size=500)
        records = [
            record("t", f"i{k}", choices[pick], answer=f"answer {pick % 2}") for k, pick in enumerate(picks.tolist())
        ]
        jsonl.write(tmp_path / f"{name}.jsonl", records[: 480 if name == "a" else 500])
        columns.append(answers_column(tmp_path / f"{name}.jsonl"))
    whole = agreement(*columns)
    monkeypatch.setattr(module, "_BLOCK", 7)
    blocked = agreement(*columns)
    assert blocked.figures == whole.figures and whole.figures.shared == 480
    assert 0 < whole.figures.identical_answers < whole.figures.both_scored < 480
    assert list(blocked.disagreements.rows()) == list(whole.disagreements.rows()) != []
