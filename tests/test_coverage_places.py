"""verify's coverage (`verify._Coverage`) says exactly which answers the results miss, hold twice or do not belong
to, whatever the keys: checked against a plain count of the keys, on a run of two targets (one and three samples),
items with several judged turns, a shard's share, and keys next to expected ones (one sample too many, a turn not
judged, another target's sample count, an item of another shard, unknown names)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from test_verify_reads import finished  # noqa: F401 (the module's finished run)

from diagsafe_local.runs.manifest import Shard, read_manifest_file
from diagsafe_local.runs.records import SHOWN
from diagsafe_local.runs.verify import _Coverage


def expected_problems(manifest, whole: bool, keys: list) -> list[str]:
    """What the coverage must say, from a plain count (its own wording, built here independently)."""
    expected = list(manifest.expected_keys(whole))
    wanted, counts = set(expected), Counter()
    duplicated, extra = [], []
    for key in keys:
        if key not in wanted:
            extra.append(key)
            continue
        counts[key] += 1
        if counts[key] == 2 and len(duplicated) < SHOWN:
            duplicated.append(key)
    missing = [k for k in expected if not counts[k]]
    return [
        duplicated[0] if duplicated else None,
        len(missing),
        sorted(missing)[:SHOWN],
        len(extra),
        sorted(extra[:SHOWN]),
    ]


def said(coverage: _Coverage) -> list:
    problems = coverage.problems()
    duplicated = next((p for p in problems if "more than one result" in p), None)
    return [
        coverage.duplicated[0] if duplicated else None,
        int((~coverage.seen).sum()),
        sorted(coverage._missing())[:SHOWN],
        len(coverage.extra),
        sorted(coverage.extra[:SHOWN]),
    ]


@pytest.mark.parametrize("whole", [True, False])
def test_coverage_names_exactly_the_missing_duplicated_and_foreign_answers(finished, whole):  # noqa: F811
    base = read_manifest_file(finished)
    items = [item.model_copy(update={"turns": [1, 3] if k % 2 else [2]}) for k, item in enumerate(base.dataset.items)]
    [(name, target)] = base.targets.items()
    manifest = base.model_copy(
        update={
            "dataset": base.dataset.model_copy(update={"items": items}),
            "targets": {name: target, "u": target.model_copy(update={"samples": 3})},
            "shard": None if whole else Shard(index=0, count=2),
        }
    )
    expected = list(manifest.expected_keys(whole))
    ids = [item.id for item in items]
    near = [
        (t, i, s, k)
        for t in (name, "u", "v")
        for i in [*ids, "zz"]
        for s in range(5)
        for k in range(5)
        if (t, i, s, k) not in set(expected)
    ]
    rng = random.Random(48)
    for _ in range(150):
        keys = rng.sample(expected, rng.randrange(len(expected) + 1)) + rng.choices(expected, k=rng.randrange(3))
        keys += rng.choices(near, k=rng.randrange(4))
        rng.shuffle(keys)
        coverage = _Coverage(manifest, whole)
        coverage._BLOCK = rng.choice([1, 3, 8192])  # looked up a block at a time: blocks of any size
        for key in keys:
            coverage.see(key)
        assert said(coverage) == expected_problems(manifest, whole, keys), keys
