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
