"""Put a judge on the HarmMetric Eval leaderboard: score every benchmark response with a registered judge
through the same engines as the pipeline (batched, resumable through `judging.stored`, parse failures counted).

Each response is judged `samples` times (the paper averages 3 sampled verdicts) and its score is the
mean of the judged samples; a response none of whose samples parsed has no score (NaN), and the
benchmark's missing-score policy decides what that means. Judgments are saved to `judgments.jsonl`
(see `judging.stored`), so an interrupted bench resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagsafe_local.benchmark.dataset import BenchDataset
from diagsafe_local.benchmark.runner import response_frame
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Engine
from diagsafe_local.judging.base import JudgeInput
from diagsafe_local.judging.stored import judge_items


def judge_metric_name(judge: str, model: str | None, probability: bool | None = None) -> str:
    """The leaderboard name of a judge (and its model); a scoring mode other than the judge's default is named."""
    mode = "" if probability is None else ("/p" if probability else "/sampled")
    return f"judge:{judge}{mode}" + (f"@{Path(model.rstrip('/')).name}" if model else "")


def judge_benchmark(
    dataset: BenchDataset, engine: Engine | None, judge_name: str, metric: str, store_path: Path, **options: Any
) -> pd.DataFrame:
    """Per-response scores of the judge, in the layout of `score_responses` (metric = `metric`)."""
    responses = [(p, r) for p in dataset.prompts for r in p.responses]
    inputs = [
        (
            r.response_id,
            JudgeInput(conversation=(Message(role="user", content=p.prompt),), answer=r.text, references=p.references),
        )
        for p, r in responses
    ]
    verdicts = judge_items(engine, judge_name, metric, inputs, store_path, **options)  # see judge_items' options
    scores = np.array([_mean([v.score for v in verdicts[r.response_id]]) for _, r in responses])
    return response_frame(responses, {metric: scores})


def _mean(values: Sequence[float | None]) -> float:
    judged = [v for v in values if v is not None]
    return float(np.mean(judged)) if judged else float("nan")
