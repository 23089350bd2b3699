"""Draw verdicts from a judge engine: one batched call per attempt, failures retried.

A sampled reply is parsed only if it finished with `stop`; a truncated or unparseable reply is retried
with twice the token budget, up to `max_attempts`, and then kept as a parse failure with no score. An
engine error is not retried here (the engines retry transient faults themselves; a rerun retries it).
A judge that needs no model (`refusal-keywords`) decides at once, without an engine call. Both the\npipeline's judge step and `bench --judge` draw their verdicts through `draw_verdicts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diagsafe_local.core.hashing import request_seed
from diagsafe_local.engines.base import Completion, Engine
from diagsafe_local.judging.base import Decoding, Judge, JudgeInput, ParseOutcome
from diagsafe_local.judging.refusal import KeywordJudge


@dataclass(frozen=True)
class Verdict:
    """The last attempt's completion (None if no call was made), its parse, and the attempts used."""

    completion: Completion | None
    outcome: ParseOutcome
    attempts: int


def draw_verdicts(
    engine: Engine | None,
    calls: Sequence[tuple[Judge, JudgeInput, tuple]],
    decoding: Decoding,
    seed: int,
    max_attempts: int,
) -> list[Verdict]:
    """A verdict for each (judge, input, seed key), in order; seeds depend on the key and attempt only."""
    verdicts: dict[int, Verdict] = {}
    todo = []
    for k, (judge, judged, _) in enumerate(calls):
        if isinstance(judge, KeywordJudge):
            verdicts[k] = Verdict(*judge.decide(judged), 0)
        elif judge.needs_reference and not judged.references:
            verdicts[k] = Verdict(
                None, ParseOutcome(status="error", error=f"judge '{judge.name}' needs a reference answer"), 0
            )
        else:
            todo.append(k)
    budget = decoding.max_tokens
    for attempt in range(1, max_attempts + 1):
        if not todo:
            break
        if engine is None:
            raise ValueError("these judges need a model engine")
        requests = [
            calls[k][0].request(calls[k][1], decoding, budget, request_seed(seed, *calls[k][2], attempt)) for k in todo
        ]
        retry = []
        for k, completion in zip(todo, engine.generate(requests)):
            outcome = calls[k][0].parse(completion, decoding.probability)
            verdicts[k] = Verdict(completion, outcome, attempt)
            if outcome.status in ("truncated", "invalid"):
                retry.append(k)
        todo = retry
        budget *= 2
    return [verdicts[k] for k in range(len(calls))]
