"""The summariser folds each record into one cell (its combination of category, source and attack method) and
adds the overall and breakdown groups up from the cells at the end: each group's figures are those of its own
records summarised alone, to the last bit."""

from __future__ import annotations

import random

from test_paired import record

from diagsafe_local.runs.summarize import Summarizer


def summarize(records) -> dict:
    summarizer = Summarizer()
    for r in records:
        summarizer.add(r)
    return summarizer.summary().model_dump(mode="json")


def test_every_group_is_its_own_records_summarised_alone():
    rng = random.Random(11)
    scores = [0.0, 0.5, 1.0, None, 0.1, 0.2, 0.7, 1 / 3]  # fractional: exact sums or not, the bits show
    records = [
        record(
            f"t{k % 2}",
            f"i{k}",
            rng.choice(scores),
            category=rng.choice(["c0", "c1", "c2"]),
            source=rng.choice(["s0", "s1"]),
            attack_method=rng.choice(["direct", "pair"]),
            benign=k % 7 == 0,
            answer=rng.choice(["I'm sorry, I can't.", "Sure, here it is.", f"answer {k}"]),
        )
        for k in range(400)
    ]
    whole = summarize(records)["targets"]
    for target, entry in whole.items():
        own = [r for r in records if r.target == target]
        for name in ("category", "source", "attack_method"):
            for value, figures in entry[f"by_{name}"].items():
                alone = summarize([r for r in own if (getattr(r, name) or "(none)") == value])["targets"][target]
                assert figures == {k: v for k, v in alone.items() if k in figures}, (target, name, value)


def test_a_breakdown_with_one_value_is_the_overall_group_and_one_with_two_is_not():
    """A breakdown whose records all have one value (here one source, no attack method) has the overall group as
    its group (the shortcut: the same cells added up in the same order); one with two values (a category of one
    record, another of the rest) adds up its own, each its own records summarised alone."""
    scores = [0.1, 0.2, 0.7, 1 / 3, None, 1.0]
    records = [
        record("t", f"i{k}", scores[k % 6], category="rare" if k == 3 else "c", source="s0", answer=f"answer {k}")
        for k in range(30)
    ]
    entry = summarize(records)["targets"]["t"]
    overall = {k: v for k, v in entry.items() if not k.startswith("by_") and k in entry["by_source"]["s0"]}
    assert list(entry["by_source"]) == ["s0"] and entry["by_source"]["s0"] == overall
    assert list(entry["by_attack_method"]) == ["(none)"] and entry["by_attack_method"]["(none)"] == overall
    assert sorted(entry["by_category"]) == ["c", "rare"]
    for value, figures in entry["by_category"].items():
        alone = summarize([r for r in records if r.category == value])["targets"]["t"]
        assert figures == {k: v for k, v in alone.items() if k in figures} != overall
