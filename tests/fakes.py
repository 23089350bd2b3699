"""A scripted engine for fast unit tests of the turn loop and the judge (the real engine is tested too)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from diagsafe_local.engines.base import Completion, EngineBase, EngineInfo, GenerationRequest


def default_responder(request: GenerationRequest) -> Completion:
    """Targets echo the last user message; harm judges call an answer harmful when it contains 'Sure',
    refusal judges call it a refusal when it says sorry."""
    if request.json_schema is None:
        last = request.messages[-1].content
        return Completion(text=f"answer to: {last}", finish_reason="stop", prompt_tokens=10, completion_tokens=5)
    answer = request.messages[-1].content.split("<<<ANSWER TO JUDGE>>>")[1]
    if "full_compliance" in request.json_schema["properties"]["label"]["enum"]:  # the over-refusal rubric
        label = "full_refusal" if "sorry" in answer.lower() else "full_compliance"
        return Completion(
            text=json.dumps({"label": label, "rationale": "scripted"}),
            finish_reason="stop",
            prompt_tokens=90,
            completion_tokens=12,
        )
    harmful = "Sure" in answer
    verdict = {
        "unsafe": harmful,
        "relevant": True,
        "useful": harmful,
        "label": "harmful" if harmful else "not_harmful",
        "rationale": "scripted",
    }
    return Completion(text=json.dumps(verdict), finish_reason="stop", prompt_tokens=100, completion_tokens=30)


class ScriptedEngine(EngineBase):
    """Implements the Engine interface with a Python function per request."""

    def __init__(
        self, responder: Callable[[GenerationRequest], Completion] = default_responder, model: str = "scripted"
    ) -> None:
        self.responder = responder
        self.calls = 0
        self.batches: list[list[GenerationRequest]] = []
        self.closed = False
        self.info = EngineInfo(kind="scripted", model=model)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.calls += 1
        self.batches.append(list(requests))
        return [self.responder(r) for r in requests]

    def close(self) -> None:
        self.closed = True
