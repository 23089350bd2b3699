"""Put a judge on the HarmMetric Eval leaderboard: score every benchmark response with a registered judge
through the same engines as the pipeline (batched, resumable, parse failures counted).

Each response is judged `samples` times (the paper averages 3 sampled verdicts) and its score is the
mean of the judged samples; a response none of whose samples parsed has no score (NaN), and the
benchmark's missing-score policy decides what that means. Judgments are saved to `judgments.jsonl`
batch by batch, so an interrupted bench resumes where it stopped. Each cached verdict is keyed by the content
of the judge's input and every setting that changes its output (the judge model by content hash, not by
folder name; adapter; judge; scoring mode; sampling), so a second bench into the same `--out` with another
dataset, model or setting never reuses a verdict it should not; errored verdicts are retried.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ConfigDict

from diagsafe_local.benchmark.dataset import BenchDataset, BenchPrompt
from diagsafe_local.benchmark.runner import response_frame
from diagsafe_local.core.hashing import content_key
from diagsafe_local.core.jsonl import JsonlStore, KeyedRecord
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Engine
from diagsafe_local.judging.base import JUDGES, Decoding, JudgeInput
from diagsafe_local.judging.verdicts import draw_verdicts


class BenchJudgment(KeyedRecord):
    """One sampled verdict on one benchmark response, keyed by what it was made from (`input_key`)."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    response_id: str
    sample: int
    raw: str
    status: str
    score: float | None
    attempts: int
    input_key: str

    @property
    def key(self) -> str:
        return self.input_key


def verdict_key(engine: Engine, judge: str, decoding: Decoding, prompt: BenchPrompt, text: str, sample: int) -> str:
    """Everything that changes a cached verdict: the judge model by content (not its folder name), its adapter,
    the judge and its scoring mode and sampling, the prompt, the response, the references, the sample."""
    info = engine.info
    model = {
        "kind": info.kind,
        "model": info.model if info.model_hash is None else None,
        "hash": info.model_hash,
        "lora": info.lora,
        "revision": info.revision,
    }
    return content_key(model, judge, decoding, prompt.prompt, text, list(prompt.references), sample)


def judge_metric_name(judge: str, model: str, probability: bool | None = None) -> str:
    """The leaderboard name of a judge; a scoring mode other than the judge's default is named."""
    mode = "" if probability is None else ("/p" if probability else "/sampled")
    return f"judge:{judge}{mode}@{Path(model.rstrip('/')).name}"


def judge_benchmark(
    dataset: BenchDataset,
    engine: Engine,
    judge_name: str,
    metric: str,
    store_path: Path,
    samples: int = 1,
    decoding: Decoding | None = None,
    max_attempts: int = 3,
    batch_size: int = 256,
    seed: int = 0,
    on_batch: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Per-response scores of the judge, in the layout of `score_responses` (metric = `metric`)."""
    judge = JUDGES.get(judge_name)
    decoding = decoding or Decoding()
    if judge.uses_probability(decoding.probability):
        samples = 1  # P(Yes) is deterministic: more samples would repeat it
    store = JsonlStore(store_path, BenchJudgment)
    responses = [(p, r) for p in dataset.prompts for r in p.responses]
    keys = {
        (r.response_id, s): verdict_key(engine, judge.name, decoding, p, r.text, s)
        for p, r in responses
        for s in range(samples)
    }
    # A cached verdict is reused only for the same content and settings; an errored one is tried again.
    todo = [
        (p, r, s)
        for p, r in responses
        for s in range(samples)
        if (cached := store.records.get(keys[(r.response_id, s)])) is None or cached.status == "error"
    ]
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        calls = [
            (
                judge,
                JudgeInput(
                    conversation=(Message(role="user", content=p.prompt),), answer=r.text, references=p.references
                ),
                (metric, r.response_id, s),
            )
            for p, r, s in batch
        ]
        verdicts = draw_verdicts(engine, calls, decoding, seed, max_attempts)
        store.append(
            BenchJudgment(
                metric=metric,
                response_id=r.response_id,
                sample=s,
                raw=v.completion.text if v.completion else "",
                status=v.outcome.status,
                score=v.outcome.score,
                attempts=v.attempts,
                input_key=keys[(r.response_id, s)],
            )
            for (_, r, s), v in zip(batch, verdicts)
        )
        if on_batch:
            on_batch(min(start + batch_size, len(todo)), len(todo))
    scores = np.array(
        [_mean([store.records[keys[(r.response_id, s)]].score for s in range(samples)]) for _, r in responses]
    )
    return response_frame(responses, metric, scores)


def _mean(values: Sequence[float | None]) -> float:
    judged = [v for v in values if v is not None]
    return float(np.mean(judged)) if judged else float("nan")
