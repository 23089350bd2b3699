"""Draw verdicts from a judge engine through a request stream: each verdict is retried the moment its reply
comes back unparseable, without waiting for the rest of a batch.

A sampled reply is parsed only if it finished with `stop`; a truncated or unparseable reply is retried with twice
the token budget, up to `max_attempts`, and then kept as a parse failure with no score. The doubled budget never
runs past the judge's context: it is cut to what the prompt leaves, and when nothing is left the verdict stays a
parse failure that says so (prompt and context lengths), rather than a request vLLM would cut anyway. A judge that
reasons first (`Judge.reasons`) makes two requests per verdict: the free reasoning phase, bounded by
`reasoning_max_tokens` and stopped at its closing marker, then the same conversation continued past the
reasoning with the verdict constrained (retries repeat only this part). An engine
error is not retried here (the engines retry transient faults themselves; a rerun retries it). A judge that
needs no model (`refusal-keywords`, a metric judge) decides at once. The pipeline's judge step, its controls, `bench --judge`
and `validate --judge` all draw their verdicts here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from diagsafe_local.core.hashing import request_seed
from diagsafe_local.engines.base import Completion, Engine
from diagsafe_local.engines.streams import open_stream
from diagsafe_local.judging.base import Decoding, Judge, JudgeInput, ModelFreeJudge, ParseOutcome
from diagsafe_local.runs.records import ReasoningTrace


@dataclass(frozen=True)
class Verdict:
    """The last attempt's completion (None when no model was asked: a model-free judge's verdict, a panel's
    combination, an input that could not be judged), its parse, and the model calls used."""

    completion: Completion | None
    outcome: ParseOutcome
    attempts: int
    reasoning: ReasoningTrace | None = None

    @property
    def reply(self) -> str | None:
        """What a pass records as the judge's reply (`judge_raw`): the completion's text, else why there was none."""
        return self.completion.text if self.completion else self.outcome.error


@dataclass(frozen=True)
class _Call:
    judge: Judge
    judged: JudgeInput
    seed_key: tuple
    attempt: int
    budget: int
    reasoning: ReasoningTrace | None = None
    thinking: bool = False  # this request is the reasoning phase


class VerdictStream:
    """Verdicts in, as a stream: `submit` a (judge, input, seed key), `poll` for the verdicts that are final."""

    def __init__(
        self, engine: Engine | None, decoding: Decoding, seed: int, max_attempts: int, max_batch: int = 256
    ) -> None:
        # At most `max_batch` requests in flight; the rest wait here and go in as others finish (no barrier).
        self.max_in_flight = max_batch
        self._backlog: deque[tuple[Hashable, _Call]] = deque()
        self.engine = engine
        self.stream = open_stream(engine, max_batch) if engine is not None else None
        self.context: int | None = engine.info.context_length if engine is not None else None
        self.decoding = decoding
        self.seed = seed
        self.max_attempts = max_attempts
        self._ready: list[tuple[Any, Verdict]] = []
        self._calls: dict[Any, _Call] = {}

    def submit(self, key: Hashable, judge: Judge, judged: JudgeInput, seed_key: tuple) -> None:
        """Ask for one verdict; seeds depend on `seed_key` and the attempt only (not on what else is in flight)."""
        if judge.needs_reference and not judged.references:
            error = ParseOutcome(status="error", error=f"judge '{judge.name}' needs a reference answer")
            self._ready.append((key, Verdict(None, error, 0)))
        elif isinstance(judge, ModelFreeJudge):
            self._ready.append((key, Verdict(None, judge.decide(judged), 0)))
        elif self.stream is None:
            raise ValueError(f"judge '{judge.name}' needs a model engine")
        else:
            thinking = judge.reasons(self.decoding)
            judged = judge.prepare(judged, self.engine)  # type: ignore[arg-type]
            self._send(key, _Call(judge, judged, seed_key, 1, self.decoding.max_tokens, thinking=thinking))

    def _send(self, key: Hashable, call: _Call) -> None:
        if len(self._calls) >= self.max_in_flight:
            self._backlog.append((key, call))
            return
        seed = request_seed(self.seed, *call.seed_key, call.attempt)
        if call.thinking:
            request = call.judge.reasoning_request(call.judged, self.decoding, seed)
        else:
            request = call.judge.request(call.judged, self.decoding, call.budget, seed, call.reasoning)
        self.stream.submit(key, request)  # type: ignore[union-attr]
        self._calls[key] = call

    def poll(self) -> list[tuple[Any, Verdict]]:
        """The verdicts that became final in one step of the engine."""
        done, self._ready = self._ready, []
        if self.stream is None or not self.stream.pending:
            return done
        for key, completion in self.stream.poll():
            call = self._calls.pop(key)
            if call.thinking and completion.error is None:
                # The reasoning is in (closed by the model, or by us when its budget ran out): now the verdict,
                # the same conversation continued under the constraint (its prefix is cached by vLLM).
                trace = ReasoningTrace(
                    text=completion.text,
                    tokens=completion.completion_tokens,
                    closed_by_budget=completion.finish_reason == "length",
                )
                self._send(key, replace(call, thinking=False, reasoning=trace))
                continue
            outcome = call.judge.parse(completion, self.decoding.probability)
            if outcome.status in ("truncated", "invalid") and call.attempt < self.max_attempts:
                budget = call.budget * 2
                if self.context is not None and completion.prompt_tokens + budget > self.context:
                    budget = self.context - completion.prompt_tokens
                if budget > call.budget:
                    self._send(key, replace(call, attempt=call.attempt + 1, budget=budget))
                    continue
                outcome = outcome.model_copy(
                    update={
                        "error": f"{outcome.error}; the judge's context is full ({completion.prompt_tokens} prompt "
                        f"tokens + {call.budget} for the verdict of a {self.context}-token context): no longer retry fits"
                    }
                )
            done.append((key, Verdict(completion, outcome, call.attempt, call.reasoning)))
        while self._backlog and len(self._calls) < self.max_in_flight:
            self._send(*self._backlog.popleft())
        return done

    @property
    def pending(self) -> int:
        return len(self._ready) + len(self._calls) + len(self._backlog)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


def draw_verdicts(
    engine: Engine | None,
    calls: Sequence[tuple[Judge, JudgeInput, tuple]],
    decoding: Decoding,
    seed: int,
    max_attempts: int,
) -> list[Verdict]:
    """A verdict for each (judge, input, seed key), in order."""
    stream = VerdictStream(engine, decoding, seed, max_attempts, max_batch=max(1, len(calls)))
    try:
        for k, (judge, judged, seed_key) in enumerate(calls):
            stream.submit(k, judge, judged, seed_key)
        verdicts: dict[int, Verdict] = {}
        while stream.pending:
            verdicts.update(stream.poll())
        return [verdicts[k] for k in range(len(calls))]
    finally:
        stream.close()
