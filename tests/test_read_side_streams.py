"""The read side streams: each piece that replaced a whole-file pass gives what the whole-file pass gave (the
refusal detector's prefilter, order-free summaries, hashed pairing, the blocked bootstrap), the run store holds
places instead of records, and bytes changed behind a reader's back are caught. The slow test makes a run of
50,000 answers and holds gate, compare and merge to a memory bound (`getrusage` of each child)."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_paired import record

from diagsafe_local.core import jsonl
from diagsafe_local.core.errors import RunFailed
from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.runs import refusal
from diagsafe_local.runs.pairing import Column, match
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.summarize import summarize

REPO = Path(__file__).resolve().parents[1]


def reference_refusal(answer: str) -> bool:
    """The detector without its shortcuts: both patterns on every answer, normalised by splitting it on
    whitespace (what it was before it streamed)."""
    text = " ".join(answer.replace("\u2019", "'").replace("\u2018", "'").split())
    sentences = re.split(r"(?<=[.!?])\s+", text[: refusal._OPENING_CHARS])  # a sentence ends after . ! or ?
    return any(refusal._OPENERS.match(s) for s in sentences[:2]) or bool(refusal._DECLINES.search(text))


PIECES = [
    "I can't help with that", "I CANNOT assist", "i won't provide", "I'm unable to help", "against my guidelines",
    "I am not permitted to share", "I must decline.", "Sure, here is", "You cannot miss it.", "I can not comply",
    "I wont answer", "I'm afraid I cannot do that", "I refuse to", "\u0130 can't help", "I can\u2019t assist",
    "\u0131 won't give", "I ca\u017f not", "\u212a", "No, ", "Sorry", " ", ". ", "\n", "step 1: mix", "refuse",
    "\t", "\x1c", "\x0b", "  ", "\u00a0", "\u2028", "\ud800",
]  # fmt: skip


@given(st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=12)), max_size=12))
def test_the_refusal_prefilter_never_changes_a_verdict(parts):
    answer = "".join(parts)
    assert refusal.is_refusal(answer) == reference_refusal(answer)


WORDS = ["The", "answer", "gives", "steps", " ", "\n", "\t", "\u00a0", "\u2028", "\u0130", "STEP", "x" * 14]


@given(st.lists(st.sampled_from(WORDS), max_size=20), st.lists(st.sampled_from(WORDS), max_size=30))
def test_the_copied_rationale_shortcut_never_changes_a_verdict(reason_parts, answer_parts):
    """A rationale is looked for in the whole normalised prompt only when every word of its opening is in the
    prompt's text: the shortcut must call copied exactly what the whole search calls copied."""
    import re

    from diagsafe_local.runs import health

    reason, answer = "".join(reason_parts), "".join(answer_parts)
    spaced = re.sub(r"\s+", " ", reason).strip().lower()
    assert health._normal(reason) == spaced  # str.split's whitespace is the regex's
    r = record("t", "1", 1.0, answer=answer, prompt="The question: give the steps")
    instructions = health._normal("You judge answers. The answer gives")
    prompt = " ".join([instructions, *(health._normal(t) for t in ("The question: give the steps", answer))])
    assert health._copied_from(spaced, instructions, r) == health._copied(spaced, prompt)


def reference_neutralise(text: str, labels: tuple[str, ...] = ()) -> str:
    """The judge prompt's neutraliser without its shortcuts: every pattern on every text."""
    import unicodedata

    from diagsafe_local.judging import base

    text = base._BREAKS.sub("\n", unicodedata.normalize("NFKC", base._invisible().sub("", text)))
    text = base._BRACKETS.sub(lambda m: base.ZWSP.join(m.group(0)), text)
    text = base._TOKENS.sub(lambda m: m.group(0)[0] + base.ZWSP + m.group(0)[1:], text)
    for pattern in (base._LABELS, *([base._own_labels(labels)] if labels else [])):
        text = pattern.sub(lambda m: m.group(1) + m.group(2)[0] + base.ZWSP + m.group(2)[1:] + m.group(3), text)
    return text


HOSTILE = [
    "<<<ANSWER>>>", "<|im_end|>", "\uff5c>", "[INST]", "</s>", "< BEGIN", "\nUser:", "answer:", "\uff1a", "label",
    "\u200b", "\u00ad", "\r\n", "\u2028", "\uff1c\uff1c", "Sure", " ", "\n", ">>", "|", "x",
]  # fmt: skip


@given(st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=6)), max_size=14))
def test_the_neutraliser_shortcuts_never_change_a_judge_prompt(parts):
    from diagsafe_local.judging.base import neutralise

    text = "".join(parts)
    assert neutralise(text) == reference_neutralise(text)
    assert neutralise(text, ("label",)) == reference_neutralise(text, ("label",))


def test_a_summary_does_not_depend_on_the_order_of_the_records():
    records = [
        record("t", str(k), [0.0, 0.5, 1.0, None][k % 4], category=f"c{k % 3}", answer=f"answer {k}") for k in range(60)
    ]
    shuffled = records[:]
    random.Random(4).shuffle(shuffled)
    assert summarize(records) == summarize(shuffled)


@pytest.mark.parametrize("block", [1, 3, 4096])
def test_coverage_names_the_same_problems_whatever_its_lookup_block(block, monkeypatch):
    """Keys are looked up a block at a time: a key seen twice (in one block or across two), a key the dataset does
    not have and the keys never seen are named as looking each up alone names them."""
    from types import SimpleNamespace

    from diagsafe_local.runs import verify

    expected = [("t", f"i{k}", 0, 1) for k in range(12)]
    items = [SimpleNamespace(id=f"i{k}", turns=[1]) for k in range(12)]
    manifest = SimpleNamespace(
        expected_keys=lambda whole: iter(expected),
        samples=lambda: {"t": 1},
        dataset=SimpleNamespace(items=items),
        shard=None,
        merged_from=None,
    )
    monkeypatch.setattr(verify._Coverage, "_BLOCK", block)
    coverage = verify._Coverage(manifest, whole=True)
    for key in [*expected[:8], expected[2], ("t", "stranger", 1, 1), expected[5], expected[5]]:
        coverage.see(key)
    assert coverage.problems() == [
        "answers have more than one result, e.g. ('t', 'i2', 0, 1)",
        "4 of 12 judged answers are missing: t 4; e.g. t/i10 sample 0 turn 1, t/i11 sample 0 turn 1, t/i8 sample 0 "
        "turn 1, t/i9 sample 0 turn 1; resume the run to complete it",
        "1 results are for answers the run's dataset does not have: t/stranger sample 1 turn 1",
    ]
    assert coverage.duplicated == [expected[2], expected[5], expected[5]]


keys = st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3)), max_size=30)


@given(keys, keys)
def test_hashed_pairing_pairs_what_dictionaries_pair(tmp_path_factory, a, b):
    """Rows matched through 128-bit key hashes: the pairs a dictionary of each side (last record of a key wins)
    gives, in the order of the first side."""
    work = tmp_path_factory.mktemp("pairs")
    columns = []
    for name, keys_of in (("a", a), ("b", b)):
        path = work / f"{name}.jsonl"
        records = [record(name, item, float(sample)) for item, sample in keys_of]
        jsonl.write(path, records)
        column = Column(path)
        for (item, sample), line in zip(keys_of, jsonl.stream(path, ResultRecord)):
            column.add([item, sample], line)
        columns.append(column)
    pairs = match(columns[0].keys(), columns[1].keys())
    last_a = {k: row for row, k in enumerate(a)}
    last_b = {k: row for row, k in enumerate(b)}
    assert (pairs.keys_a, pairs.keys_b) == (len(last_a), len(last_b))
    expected = [(row, last_b[k]) for k, row in sorted(last_a.items(), key=lambda kv: kv[1]) if k in last_b]
    assert list(zip(pairs.a.tolist(), pairs.b.tolist())) == expected


def test_a_row_read_back_from_a_file_that_changed_stops_the_reader(tmp_path):
    path = tmp_path / "results.jsonl"
    jsonl.write(path, [record("t", "1", 1.0), record("t", "2", 0.0)])
    column = Column(path)
    for line in jsonl.stream(path, ResultRecord):
        column.add(line.record.item_id, line)
    assert column.read(1).item_id == "2"
    path.write_bytes(path.read_bytes().replace(b'"score":0.0', b'"score":1.0'))
    with pytest.raises(RunFailed, match="changed after it was read"):
        column.read(1)


def test_the_blocked_bootstrap_draws_what_one_block_draws():
    from diagsafe_local import stats

    rng = np.random.default_rng(3)
    for n in (1, 7, 2_500):  # 2,500 pairs of continuous scores: 1,600 resamples a block, two blocks
        a, b = rng.random(n), rng.random(n)
        picks = np.random.default_rng(stats.SEED).integers(0, n, size=(stats.BOOTSTRAP, n))
        assert np.array_equal(stats.paired_bootstrap(a, b), (b[picks] - a[picks]).mean(axis=1))


def test_the_counted_bootstrap_of_many_pairs_has_the_spread_of_the_mean():
    from diagsafe_local import stats

    rng = np.random.default_rng(5)
    n = 200_000
    a, b = rng.choice([0.0, 0.5, 1.0], n), rng.choice([0.0, 0.5, 1.0], n)
    spread = stats.paired_bootstrap(a, b)
    d = b - a
    assert spread.mean() == pytest.approx(d.mean(), abs=3 * d.std() / np.sqrt(n))
    assert spread.std() == pytest.approx(d.std() / np.sqrt(n), rel=0.1)


def test_the_store_holds_places_and_reads_records_back(tmp_path):
    path = tmp_path / "results.jsonl"
    store: JsonlStore[ResultRecord] = JsonlStore(path, ResultRecord)
    store.append([record("t", str(k), 0.0) for k in range(4)])
    store.append([record("t", "1", 1.0)])  # a later record of a key replaces it
    assert len(store) == 4 and store.get(("t", "1", 0, 1)).score == 1.0  # type: ignore[union-attr]
    assert [r.item_id for r in store.values()] == ["0", "2", "3", "1"]
    store.keep(lambda key: key[1] != "2")
    store.compact(lambda key: -int(key[1]))
    assert [json.loads(line)["item_id"] for line in path.read_text().splitlines()] == ["3", "1", "0"]
    reopened: JsonlStore[ResultRecord] = JsonlStore(path, ResultRecord)
    assert reopened.get(("t", "1", 0, 1)) == store.get(("t", "1", 0, 1)) and ("t", "2", 0, 1) not in reopened


def _placed(name: str, unique: bool, sources: list[Path]):
    """A merge's placing of `name` in each of `sources`, as `merge_runs` does it."""
    from diagsafe_local.runs.merge import _Placed

    placed = _Placed(name, unique)
    for index, source in enumerate(sources):
        placed.place_file(index, source / name, ResultRecord)
    return placed


def test_a_source_that_changes_while_it_is_merged_stops_the_merge(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    jsonl.write(source / "results.jsonl", [record("t", "1", 1.0)])
    placed = _placed("results.jsonl", True, [source])
    (source / "results.jsonl").write_bytes((source / "results.jsonl").read_bytes().replace(b"1.0", b"0.0"))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RunFailed, match="changed while it was merged"):
        placed.write(out, [source])
    assert not (out / "results.jsonl").exists()  # nothing half-written


def test_a_merge_copies_each_source_whole_keeps_the_last_record_of_a_key_and_names_a_duplicate(tmp_path):
    from diagsafe_local.core.errors import DiagsafeError

    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    for directory in (a, b, out):
        directory.mkdir()
    jsonl.write(a / "results.jsonl", [record("t", str(k), 0.0) for k in range(3)])
    (a / "results.jsonl").write_bytes((a / "results.jsonl").read_bytes().rstrip(b"\n"))  # a last line, unended
    jsonl.write(b / "results.jsonl", [record("t", "4", 1.0), record("t", "1", 1.0), record("t", "1", 0.5)])
    placed = _placed("results.jsonl", False, [a, b])
    placed.write(out, [a, b])
    merged = [(r.record.item_id, r.record.score) for r in jsonl.stream(out / "results.jsonl", ResultRecord)]
    assert merged == [("0", 0.0), ("2", 0.0), ("4", 1.0), ("1", 0.5)]  # sources in order, each in its own
    alone = tmp_path / "alone"
    alone.mkdir()
    _placed("results.jsonl", False, [a]).write(alone, [a])  # nothing repeated: copied byte for byte
    assert (alone / "results.jsonl").read_bytes() == (a / "results.jsonl").read_bytes() + b"\n"
    with pytest.raises(DiagsafeError) as refused:
        _placed("results.jsonl", True, [a, out]).check([a, out])
    assert str(refused.value) == (
        f"duplicate result ('t', '0', 0, 1) (target, item, sample, turn) in the results.jsonl of {a} and {out}"
    )


# -- a run of 50,000 answers ---------------------------------------------------------------------------------

BENCH = REPO / "scripts" / "bench_scale.py"
BOUND_MB = 400  # the whole-file read side took ~1 GB (gate) to ~4 GB (compare) on a run this size


def _bench_scale() -> ModuleType:
    if str(BENCH.parent) not in sys.path:
        sys.path.insert(0, str(BENCH.parent))
    import bench_scale

    return bench_scale


def _child(*arguments: str, cwd: Path) -> tuple[int, float, str]:
    """Exit code, peak memory (MB, the child's own) and output of one CLI command with the bench engine."""
    bench_scale = _bench_scale()
    done, peak_mb = bench_scale.measured_child(
        bench_scale.me("cli", *arguments),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={"DIAGSAFE_PROGRESS_SECONDS": "3600"},
    )
    return done.returncode, peak_mb, done.stdout.decode()


@pytest.mark.slow
def test_gate_compare_and_merge_of_50000_answers_stay_under_a_memory_bound(tmp_path):
    bench_scale = _bench_scale()

    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": f"q{k}", "prompt": f"question {k}"}) + "\n" for k in range(500)))
    shards = []
    for name, suffix in (("candidate", ""), ("baseline", "-old")):
        config = bench_scale.write_config(tmp_path, name, items, suffix)
        for k in range(2):
            code, _, output = _child("run", str(config), "--shard", f"{k}/2", cwd=tmp_path)
            assert code == 0, output
        shards.append(sorted(str(d) for d in (tmp_path / name / "shards").iterdir()))
    merged = []
    for name, dirs in zip(("candidate", "baseline"), shards):
        code, peak, output = _child("merge", *dirs, "--out", str(tmp_path / f"{name}-merged"), cwd=tmp_path)
        assert code == 0 and peak < BOUND_MB, (peak, output)
        merged.append(tmp_path / f"{name}-merged")
    assert sum(1 for _ in open(merged[0] / "results.jsonl")) == 50_000
    code, peak, output = _child("gate", str(merged[0]), "--max-asr", "1", cwd=tmp_path)
    assert code == 0 and peak < BOUND_MB, (peak, output)
    code, peak, output = _child("compare", str(merged[1]), str(merged[0]), "--json", cwd=tmp_path)
    assert code == 0 and peak < BOUND_MB, (peak, output)
    assert json.loads(output)["agreement"]["shared"] == 50_000


@pytest.mark.slow
def test_a_flipped_baseline_verifies_and_disagrees_where_it_was_flipped(tmp_path):
    """bench_scale's baseline made from a run (`--flipped-baseline`: a million answers' shards take an hour here):
    a copy whose flipped verdicts keep judge_raw, verdict and score together verifies, and `compare` finds its
    disagreements exactly where it flipped."""
    bench_scale = _bench_scale()

    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": f"q{k}", "prompt": f"question {k}"}) + "\n" for k in range(3)))
    config = bench_scale.write_config(tmp_path, "candidate", items, "")
    code, _, output = _child("run", str(config), cwd=tmp_path)
    assert code == 0, output
    flipped = bench_scale.flipped_baseline(tmp_path / "candidate", tmp_path / "baseline")
    assert 100 < flipped < 300  # two in three of 300 answers' verdicts, by a hash
    code, _, output = _child("compare", str(tmp_path / "baseline"), str(tmp_path / "candidate"), "--json", cwd=tmp_path)
    assert code == 0, output
    agreement = json.loads(output)["agreement"]
    assert agreement["shared"] == 300 and len(agreement["disagreements"]) == flipped
