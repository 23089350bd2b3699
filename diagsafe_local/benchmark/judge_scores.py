"""Put a judge on the HarmMetric Eval leaderboard: score every benchmark response with a judge rubric
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
from diagsafe_local.engines.base import Engine, GenerationRequest
from diagsafe_local.generation import request_seed
from diagsafe_local.items import Message
from diagsafe_local.judging.rubrics import RUBRICS
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


def judge_metric_name(rubric: str, model: str) -> str:
    return f"judge:{rubric}@{Path(model.rstrip('/')).name}"


def judge_benchmark(
    dataset: BenchDataset, engine: Engine, rubric_name: str, metric: str, store_path: Path,
    samples: int = 1, temperature: float = 0.0, max_tokens: int = 400, max_attempts: int = 3,
    batch_size: int = 256, seed: int = 0, on_batch: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Per-response scores of the judge, in the layout of `score_responses` (metric = `metric`)."""
    rubric = RUBRICS.get(rubric_name)
    store = JsonlStore(store_path, BenchJudgment)
    responses = [(p, r) for p in dataset.prompts for r in p.responses]
    todo = [(p, r, s) for p, r in responses for s in range(samples) if (metric, r.response_id, s) not in store.records]
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        pending = list(range(len(batch)))
        done: dict[int, BenchJudgment] = {}
        budget = max_tokens
        for attempt in range(1, max_attempts + 1):
            if not pending:
                break
            requests = [
                GenerationRequest(
                    messages=rubric.messages((Message(role="user", content=batch[k][0].prompt),), batch[k][1].text),
                    max_tokens=budget, temperature=temperature,
                    seed=request_seed(seed, metric, batch[k][1].response_id, batch[k][2], attempt),
                    json_schema=rubric.schema,
                )
                for k in pending
            ]
            retry = []
            for k, completion in zip(pending, engine.generate(requests)):
                outcome = rubric.parse(completion.text, completion.finish_reason)
                status = "error" if completion.error else outcome.status
                done[k] = BenchJudgment(metric=metric, response_id=batch[k][1].response_id, sample=batch[k][2],
                                        raw=completion.text, status=status, score=outcome.score, attempts=attempt)
                if status != "ok":
                    retry.append(k)
            pending = retry
            budget *= 2
        store.append(done[k] for k in range(len(batch)))
        if on_batch:
            on_batch(min(start + batch_size, len(todo)), len(todo))
    scores = np.array([
        _mean([store.records[(metric, r.response_id, s)].score for s in range(samples)]) for _, r in responses
    ])
    return response_frame(responses, metric, scores)


def _mean(values: Sequence[float | None]) -> float:
    judged = [v for v in values if v is not None]
    return float(np.mean(judged)) if judged else float("nan")
