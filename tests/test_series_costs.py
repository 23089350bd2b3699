"""The series report's per-record shortcuts (issue 48) give what the plain computations give: the judge-health
word cache, a comparison column that keeps no lines to read back, the figures drawn without pyplot."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_paired import record

from diagsafe_local.runs import health

WORDS = ["The", "answer", "gives", "steps", " ", "\n", "\t", "\u00a0", "\u0130", "STEP", "x" * 14, "judge", "(case"]
WORDS += ["\u03a3", "\u039f\u03a3", "\u03c3", "\u03c2", "'", ".", "\u0301", "\u212a"]  # final sigma, case-ignorables
INSTRUCTIONS = health._normal("You judge answers. The answer gives")
KNOWN: dict[str, bool] = {}  # one judge's known words, kept across every example as a tally keeps them


@given(*(st.lists(st.sampled_from(WORDS), max_size=size) for size in (20, 30, 8)))
def test_the_known_words_of_a_judge_never_change_a_copied_verdict(reason_parts, answer_parts, prompt_parts):
    """Whether a rationale's word is in the instructions, remembered from earlier rationales of the same judge,
    and whether it is in the record's texts (lowered as one), calls copied exactly what the whole search of the
    normalised prompt calls copied."""
    reason = re.sub(r"\s+", " ", "".join(reason_parts)).strip().lower()
    answer, asked = "".join(answer_parts), "".join(prompt_parts) or "q"
    r = record("t", "1", 1.0, answer=answer, prompt=asked)
    prompt = " ".join([INSTRUCTIONS, *(health._normal(t) for t in (asked, answer))])
    assert health._copied_from(reason, INSTRUCTIONS, r, KNOWN) == health._copied(reason, prompt)


def test_a_final_sigma_is_lowered_in_the_record_s_texts_as_in_each_text_alone():
    """The record's texts are lowered as one, yet as each alone (a prompt ending in a capital sigma lowers it
    to a final sigma, which a word of the rationale copied from it holds): still counted copied."""
    r = record("t", "1", 1.0, answer="\u0391\u0392\u0393\u0394\u0395 long answer", prompt="\u039f\u03a3")
    reason = "\u03bf\u03c2 \u03b1\u03b2\u03b3\u03b4\u03b5 long"
    prompt = " ".join([INSTRUCTIONS, *(health._normal(t) for t in (r.conversation[0].content, r.answer))])
    assert health._copied(reason, prompt)
    assert health._copied_from(reason, INSTRUCTIONS, r)


def test_a_judge_keeps_at_most_known_words_words_and_its_copies_are_counted(monkeypatch):
    """The cache is bounded (a million rationales of distinct words keep KNOWN_WORDS of them), and a rationale
    copied from the instructions is counted copied whether its words were known before or not."""
    monkeypatch.setattr(health, "KNOWN_WORDS", 3)
    tally = health.HealthTally()
    instructions = {"harmjudge": "Words one two three four five six seven eight nine ten eleven twelve"}
    verdicts = ["words one two three four five six seven eight", "one two three four five six seven eight nine"]
    verdicts += [f"zz{k} one two three four five six seven eight nine" for k in range(3)]  # zz{k}: nowhere
    for k, text in enumerate(verdicts * 2):
        r = record("t", str(k), 1.0, prompt="q")
        r.verdict = {"rationale": text, "label": "harmful"}
        tally.add(r, instructions)
    assert sorted(tally._prompts["harmjudge"][1]) == ["one", "two", "words"]
    assert (tally.copies, tally.rationales) == (4, 10)


def test_a_figure_drawn_without_pyplot_is_the_figure_pyplot_draws(tmp_path):
    """png_figure's bare Figure, laid out once and drawn once, writes the PNG that pyplot's figure, laid out and
    saved as before (tight_layout, then savefig's own extra draw), writes byte for byte."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from diagsafe_local.core.figures import png_figure

    def draw(ax) -> None:
        ax.plot([1, 2, 3], [0.2, 0.9, 0.4], "o-", label="a long label beside the axes")
        ax.fill_between([1, 2, 3], [0.1, 0.8, 0.3], [0.3, 1.0, 0.5], alpha=0.2)
        ax.set_title("title")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))

    with png_figure(tmp_path / "new.png", (6, 3)) as ax:
        draw(ax)
    fig, ax = plt.subplots(figsize=(6, 3))
    draw(ax)
    fig.tight_layout()
    fig.savefig(tmp_path / "old.png", format="png", dpi=120)
    plt.close(fig)
    assert (tmp_path / "new.png").read_bytes() == (tmp_path / "old.png").read_bytes()


def test_a_column_that_keeps_no_lines_pairs_as_one_that_does_and_reads_nothing_back(tmp_path):
    """The series report's columns keep no line's place nor hash: the same sides (keys, scores, labels) as
    columns that keep them, and a row read back is refused (exit 3), never taken unchecked."""
    import pytest

    from diagsafe_local.core import jsonl
    from diagsafe_local.core.errors import RunFailed
    from diagsafe_local.runs.paired import RunColumns
    from diagsafe_local.runs.records import ResultRecord

    records = [record("t", str(k), k % 3 / 2, category=f"c{k % 2}") for k in range(7)]
    path = tmp_path / "results.jsonl"
    jsonl.write(path, records)
    kept, lineless = RunColumns(path, answers=False), RunColumns(path, answers=False)
    lineless.column.keep_no_lines()
    for line in jsonl.stream(path, ResultRecord):
        kept.add(line)
        lineless.add(line)
    side, bare = kept.side("t"), lineless.side("t")
    assert (bare.keys() == side.keys()).all() and (bare.scores == side.scores).all()
    assert (bare.codes("category") == side.codes("category")).all()
    assert len(lineless.column._low) == 0 and len(kept.column._low) == 7
    with pytest.raises(RunFailed, match="without their lines"):
        bare.read(0)
    with pytest.raises(RunFailed, match="without their lines"):
        next(bare.read_rows(np.arange(2)))
    with pytest.raises(ValueError):
        kept.column.keep_no_lines()  # rows already kept with their lines


JSON_PIECES = ['{"label": "harmful", "rationale": "x\x1fy"}', "[1, 2]", '"s"', "1.5", "true", "null", " ", "\n", "\t"]
JSON_PIECES += ["{", "}", '"', ",", "\ufeff", "x", "1e400", '{"a": NaN}', "\\u00e9", "  {}", "{} {}"]


@given(st.lists(st.one_of(st.sampled_from(JSON_PIECES), st.text(max_size=6)), max_size=6))
def test_a_reply_parsed_by_the_scanner_alone_is_what_json_loads_parses(parts):
    """A recorded reply read again (`ScoreRule.read`) parses to what json.loads(strict=False) gives, and fails
    where it fails."""
    import json

    from diagsafe_local.runs import readers

    reply = "".join(parts)
    try:
        expected = json.loads(reply, strict=False)
    except ValueError:
        with pytest.raises(ValueError):
            readers.lenient_json(reply)
        return
    assert repr(readers.lenient_json(reply)) == repr(expected)  # repr: 1 is not 1.0 nor True, NaN is NaN
