"""`compare --json` streams its disagreements: the document is the one `json.dump(..., indent=2)` writes of the
whole comparison, byte for byte, and the memory it takes does not grow with the number of disagreements."""

from __future__ import annotations

import contextlib
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from test_adversarial import cli, config_file, scripted, write_items
from test_paired import harmful_on, two_runs

from diagsafe_local.cli import app
from diagsafe_local.core import jsonl
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.verdicts import score_class


def expected_disagreements(run_a: Path, run_b: Path) -> list[dict]:
    """Every answer of both runs (the last record of a key) whose classes differ, in key order, worked out
    from the results files directly."""
    sides = [
        {
            (r.target, r.item_id, r.sample, r.turn): r
            for r in (line.record for line in jsonl.stream(run / "results.jsonl", ResultRecord))
        }
        for run in (run_a, run_b)
    ]
    found = []
    for key in sorted(sides[0].keys() & sides[1].keys()):
        a, b = sides[0][key].score, sides[1][key].score
        if a is not None and b is not None and score_class(a) != score_class(b):
            found.append({"key": list(key), "a": score_class(a), "b": score_class(b), "score_a": a, "score_b": b})
    return found


def test_the_streamed_document_is_the_whole_document_json_dump_writes(tmp_path, monkeypatch):
    prod, new = two_runs(tmp_path, monkeypatch, candidate_words=("q2 ", "q3 ", "q10 ", "q11 "))
    result = cli("compare", prod, new, "--json", "--out", tmp_path / "cmp")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    disagreements = expected_disagreements(prod, new)
    assert [d["key"][1] for d in disagreements] == ["i1", "i10", "i11", "i2", "i3"]  # key order, as strings sort
    whole = {**printed, "agreement": {**printed["agreement"], "disagreements": disagreements}}
    assert list(printed) == ["paired", "pairs", "agreement"] and list(printed["agreement"])[-1] == "disagreements"
    assert result.output == json.dumps(whole, indent=2) + "\n"  # byte for byte, key order included
    written = (tmp_path / "cmp" / "comparison.json").read_text()
    assert written == json.dumps({"paired": printed["paired"], "agreement": whole["agreement"]}, indent=2) + "\n"
    assert not [p.name for p in (tmp_path / "cmp").iterdir() if p.name not in ("comparison.json", "flips.jsonl")]

    text = cli("compare", prod, new)  # the text output lists the first ten, as before
    assert text.exit_code == 0, text.output
    listed = [line.strip() for line in text.output.splitlines() if line.startswith("  (")]
    assert listed == [f"{tuple(d['key'])}: {d['a']} vs {d['b']}" for d in disagreements]


def test_an_agreement_without_disagreements_writes_an_empty_list(tmp_path, monkeypatch):
    prod, new = two_runs(tmp_path, monkeypatch, candidate_words=("q1 ",))
    result = cli("compare", prod, new, "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["agreement"]["disagreements"] == [] and '"disagreements": []\n  }\n}\n' in result.output


N = 4000  # answers a side


def _runs(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    """Three runs of the same N items: `base` and `same` call every answer harmful, `flipped` none."""
    items = write_items(tmp_path / "items.jsonl", N, prompt=lambda k: f"q{k}")
    runs = {}
    for name, word in (("base", "q"), ("same", "q"), ("flipped", "no such word")):
        scripted(monkeypatch, judge=harmful_on((word,)))
        result = cli("run", config_file(tmp_path, items, name))
        assert result.exit_code == 0, result.output
        runs[name] = tmp_path / name
    return runs


def _peak_bytes(run_a: Path, run_b: Path, out: Path) -> tuple[int, dict]:
    """The traced peak of `compare --json`, its stdout a file (as a user redirects it; the test runner would hold
    the whole output in memory), and the agreement it printed."""
    with open(out, "w", encoding="utf-8") as handle, contextlib.redirect_stdout(handle):
        tracemalloc.start()
        try:
            app(["compare", str(run_a), str(run_b), "--json"], standalone_mode=False)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return peak, json.loads(out.read_text())["agreement"]


@pytest.mark.slow
def test_compare_json_memory_does_not_grow_with_the_disagreements(tmp_path, monkeypatch):
    runs, out = _runs(tmp_path, monkeypatch), tmp_path / "out.json"
    _peak_bytes(runs["base"], runs["same"], out)  # imports and first-call caches, outside the measurement
    agreeing, figures = _peak_bytes(runs["base"], runs["same"], out)
    assert figures["shared"] == N and figures["disagreements"] == []
    disagreeing, figures = _peak_bytes(runs["base"], runs["flipped"], out)
    assert figures["shared"] == N and len(figures["disagreements"]) == N
    # Measured: before, ~3,300 bytes a disagreement (the list of dicts, and sklearn's arrays of label strings for
    # kappa); streamed, ~40 (a few numbers each in compact arrays).
    assert disagreeing - agreeing < 150 * N, (agreeing, disagreeing)


def test_the_agreement_figures_are_sklearns_on_the_classes_of_the_scores(tmp_path):
    """Kappa and label agreement, worked out on class codes, equal sklearn's on the class names to the last bit
    (the figures `compare` printed before)."""
    from sklearn.metrics import cohen_kappa_score
    from test_paired import record

    from diagsafe_local.runs.agreement import agreement, answers_column

    rng = np.random.default_rng(7)
    choices = [0.0, 0.2, 0.5, 0.5, 0.9, 1.0, None]
    for case in range(30):
        n = int(rng.integers(20, 3000))
        scores = [[choices[k] for k in rng.integers(len(choices), size=n)] for _ in range(2)]
        columns = []
        for name, side in zip("ab", scores):
            path = tmp_path / f"{case}{name}.jsonl"
            jsonl.write(path, [record("t", f"i{k}", score) for k, score in enumerate(side)])
            columns.append(answers_column(path))
        figures = agreement(*columns).figures
        both = [(x, y) for x, y in zip(*scores) if x is not None and y is not None]
        labels_a, labels_b = [score_class(x) for x, _ in both], [score_class(y) for _, y in both]
        assert figures.both_scored == len(both) and figures.cohen_kappa_note is None
        assert figures.label_agreement == sum(x == y for x, y in zip(labels_a, labels_b)) / len(both)
        assert figures.cohen_kappa == cohen_kappa_score(labels_a, labels_b), case


def test_mcnemar_is_scipys_exact_binomial_test_without_statsmodels(monkeypatch):
    """McNemar's exact test is the two-sided binomial test of the discordant pairs, worked out without
    statsmodels (its import took 126 MB of `compare`'s memory), at the sizes of a million-answer comparison too."""
    import sys

    from scipy.stats import binomtest

    from diagsafe_local.stats import mcnemar_p

    for name in ("statsmodels", "statsmodels.stats", "statsmodels.stats.contingency_tables"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises
    cases = [(0, 0), (5, 1), (0, 9), (12, 12), (30, 14), (400, 460), (0, 2000), (300_000, 301_000), (250, 499_750)]
    for b, c in cases:
        expected = binomtest(b, b + c, 0.5).pvalue if b + c else 1.0
        assert mcnemar_p(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-300), (b, c)


def test_a_runs_columns_hold_under_80_bytes_an_answer():
    """What `compare` keeps of each run while it verifies it (`RunColumns`: one column for the paired comparison
    and the agreement both) takes under 80 bytes an answer, the arrays' spare room included (72 without: key and
    pair key 16 bytes each, line digest 16, answer hash 8, score 8, offset 4, label code 4; 84 before, two
    columns ~140)."""
    import sys

    from test_paired import record

    from diagsafe_local.runs.paired import RunColumns

    one = record("t", "i", 1.0)
    raw = one.model_dump_json().encode() + b"\n"
    rows = 20_000
    columns = RunColumns(Path("results.jsonl"))
    for k in range(rows):
        columns.add(jsonl.Line(number=k + 1, offset=k * len(raw), raw=raw, record=one))
    held = sum(sys.getsizeof(value) for value in vars(columns.column).values())  # its buffers, as allocated
    assert len(columns.answers) == rows and len(columns.side("t")) == rows
    assert held < 80 * rows, held / rows


def test_keys_sharing_one_half_are_paired_by_the_other():
    """Pairing looks keys up one 64-bit half at a time: keys that share a half (made on purpose: 2^32 tries) are
    told apart by the other, each side keeping the last row of a repeated key."""
    from diagsafe_local.runs.pairing import _KEY, match

    def keys(pairs: list[tuple[int, int]]) -> np.ndarray:
        return np.array(pairs, dtype=_KEY)

    a = keys([(7, 1), (7, 2), (7, 3), (5, 9), (7, 2)])  # row 4 repeats row 1's key: the later row is kept
    b = keys([(7, 3), (7, 2), (7, 4), (5, 8), (6, 1)])
    pairs = match(a, b)
    assert (pairs.keys_a, pairs.keys_b) == (4, 5)
    assert list(zip(pairs.a.tolist(), pairs.b.tolist())) == [(2, 0), (4, 1)]


def test_a_paired_comparison_alone_keeps_only_the_rows_it_pairs(tmp_path):
    """The series report's columns (`answers=False`) keep only the rows a paired comparison reads (final-turn
    answers to harmful items) and hash no key the agreement would need, yet give each target the same side as the
    full columns, a target with no such answer too (an empty side)."""
    from test_paired import record

    from diagsafe_local.runs.paired import RunColumns

    records = [record("t", str(k), k % 3 / 2, category=f"c{k % 2}") for k in range(6)]
    records += [record("t", "b1", 1.0, benign=True), record("t", "e1", 1.0, final_turn=False)]
    records += [record("u", "b2", 0.0, benign=True)]  # a target with benign answers only
    path = tmp_path / "results.jsonl"
    jsonl.write(path, records)
    full, paired_only = RunColumns(path), RunColumns(path, answers=False)
    for line in jsonl.stream(path, ResultRecord):
        full.add(line)
        paired_only.add(line)
    assert len(full.column) == 9 and len(paired_only.column) == 6
    assert set(paired_only.sides) == set(full.sides) == {"t", "u"}
    for target, side in full.sides.items():
        kept = paired_only.sides[target]
        assert (kept.keys() == side.keys()).all() and (kept.scores == side.scores).all()
        assert [record.item_id for _, record in kept.column.read_rows(kept.rows)] == [
            record.item_id for _, record in side.column.read_rows(side.rows)
        ]
    assert len(paired_only.sides["u"]) == 0
