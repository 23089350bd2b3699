"""Put a judge on the HarmMetric Eval leaderboard: score every benchmark response with a registered judge
through the same engines as the pipeline (batched, resumable, parse failures counted).

Each response is judged `samples` times (the paper averages 3 sampled verdicts) and its score is the
mean of the judged samples; a response none of whose samples parsed has no score (NaN), and the
benchmark's missing-score policy decides what that means. Judgments are saved to `judgments.jsonl`
batch by batch, so an interrupted bench resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from diagsafe_local.benchmark.dataset import BenchDataset
from diagsafe_local.benchmark.runner import response_frame
from diagsafe_local.engines.base import Engine
from diagsafe_local.items import Message
from diagsafe_local.judging.base import JUDGES, Decoding, JudgeInput
from diagsafe_local.judging.verdicts import draw_verdicts
from diagsafe_local.records import JsonlStore


class BenchJudgment(BaseModel):
    """One sampled verdict on one benchmark response."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    response_id: str
    sample: int
    raw: str
    status: str
    score: float | None
    attempts: int

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.metric, self.response_id, self.sample)


def judge_metric_name(judge: str, model: str, probability: bool | None = None) -> str:
    """The leaderboard name of a judge; a scoring mode other than the judge's default is named."""
    mode = "" if probability is None else ("/p" if probability else "/sampled")
    return f"judge:{judge}{mode}@{Path(model.rstrip('/')).name}"


def judge_benchmark(
    dataset: BenchDataset, engine: Engine, judge_name: str, metric: str, store_path: Path,
    samples: int = 1, decoding: Decoding | None = None, max_attempts: int = 3,
    batch_size: int = 256, seed: int = 0, on_batch: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Per-response scores of the judge, in the layout of `score_responses` (metric = `metric`)."""
    judge = JUDGES.get(judge_name)
    decoding = decoding or Decoding()
    if judge.uses_probability(decoding.probability):
        samples = 1  # P(Yes) is deterministic: more samples would repeat it
    store = JsonlStore(store_path, BenchJudgment)
    responses = [(p, r) for p in dataset.prompts for r in p.responses]
    todo = [(p, r, s) for p, r in responses for s in range(samples) if (metric, r.response_id, s) not in store.records]
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        calls = [(judge, JudgeInput(conversation=(Message(role="user", content=p.prompt),), answer=r.text,
                                    references=p.references), (metric, r.response_id, s)) for p, r, s in batch]
        verdicts = draw_verdicts(engine, calls, decoding, seed, max_attempts)
        store.append(
            BenchJudgment(metric=metric, response_id=r.response_id, sample=s,
                          raw=v.completion.text if v.completion else "", status=v.outcome.status,
                          score=v.outcome.score, attempts=v.attempts)
            for (_, r, s), v in zip(batch, verdicts)
        )
        if on_batch:
            on_batch(min(start + batch_size, len(todo)), len(todo))
    scores = np.array([
        _mean([store.records[(metric, r.response_id, s)].score for s in range(samples)]) for _, r in responses
    ])
    return response_frame(responses, metric, scores)


def _mean(values: Sequence[float | None]) -> float:
    judged = [v for v in values if v is not None]
    return float(np.mean(judged)) if judged else float("nan")
