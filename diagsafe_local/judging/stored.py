"""Judge a list of items through an engine with a resumable verdict store: shared by `bench --judge` (the
HarmMetric Eval responses) and `validate --judge` (a gold set's items).

Each item is judged `samples` times; each verdict is saved to the store (JSONL) batch by batch, keyed by
the content of the judge's input and every setting that changes its output (the judge model by content
hash, not by folder name; adapter; judge; scoring mode; sampling), so a second run into the same store with
another dataset, model or setting never reuses a verdict it should not. Errored verdicts are retried.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from diagsafe_local.core.hashing import content_key
from diagsafe_local.core.jsonl import JsonlStore, KeyedRecord
from diagsafe_local.engines.base import Engine
from diagsafe_local.judging.base import JUDGES, Decoding, JudgeInput
from diagsafe_local.judging.verdicts import draw_verdicts
from diagsafe_local.runs.records import ReasoningTrace


class StoredJudgment(KeyedRecord):
    """One sampled verdict on one item, keyed by what it was made from (`input_key`). `metric` names the
    judge as its output table does; `response_id` is the item's id."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    response_id: str
    sample: int
    raw: str
    status: str
    score: float | None
    attempts: int
    input_key: str
    verdict: dict[str, Any] | None = None
    reasoning: ReasoningTrace | None = None

    @property
    def key(self) -> str:
        return self.input_key


def verdict_key(engine: Engine | None, judge: str, decoding: Decoding, judged: JudgeInput, sample: int) -> str:
    """Everything that changes a cached verdict: the judge model by content (not its folder name), its adapter,
    the judge and its scoring mode and sampling, the conversation, the answer, the references, the sample."""
    model: dict[str, Any] = {"kind": "none"}
    if engine is not None:
        info = engine.info
        model = {
            "kind": info.kind,
            "model": info.model if info.model_hash is None else None,
            "hash": info.model_hash,
            "lora": info.lora,
            "revision": info.revision,
        }
    return content_key(model, judge, decoding, judged, sample)


def judge_items(
    engine: Engine | None,
    judge_name: str,
    metric: str,
    items: Sequence[tuple[str, JudgeInput]],
    store_path: Path,
    samples: int = 1,
    decoding: Decoding | None = None,
    max_attempts: int = 3,
    batch_size: int = 256,
    seed: int = 0,
    on_batch: Callable[[int, int], None] | None = None,
) -> dict[str, list[StoredJudgment]]:
    """Every item's verdicts (one per sample, in order), from the store where current, judged otherwise."""
    judge = JUDGES.get(judge_name)
    decoding = decoding or Decoding()
    if judge.uses_probability(decoding.probability):
        samples = 1  # P(Yes) is deterministic: more samples would repeat it
    store = JsonlStore(store_path, StoredJudgment)
    keys = {
        (item_id, s): verdict_key(engine, judge.name, decoding, judged, s)
        for item_id, judged in items
        for s in range(samples)
    }
    # A cached verdict is reused only for the same content and settings; an errored one is tried again.
    todo = [
        (item_id, judged, s)
        for item_id, judged in items
        for s in range(samples)
        if (cached := store.get(keys[(item_id, s)])) is None or cached.status == "error"
    ]
    if on_batch:
        on_batch(0, len(todo))  # starts the clock of the rate shown
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        calls = [(judge, judged, (metric, item_id, s)) for item_id, judged, s in batch]
        verdicts = draw_verdicts(engine, calls, decoding, seed, max_attempts)
        store.append(
            StoredJudgment(
                metric=metric,
                response_id=item_id,
                sample=s,
                raw=v.completion.text if v.completion else "",
                status=v.outcome.status,
                score=v.outcome.score,
                attempts=v.attempts,
                input_key=keys[(item_id, s)],
                verdict=v.outcome.verdict,
                reasoning=v.reasoning,
            )
            for (item_id, _, s), v in zip(batch, verdicts)
        )
        if on_batch:
            on_batch(min(start + batch_size, len(todo)), len(todo))
    return {item_id: [_stored(store, keys[(item_id, s)]) for s in range(samples)] for item_id, _ in items}


def _stored(store: JsonlStore[StoredJudgment], key: str) -> StoredJudgment:
    record = store.get(key)
    assert record is not None  # every key was judged and appended above
    return record
