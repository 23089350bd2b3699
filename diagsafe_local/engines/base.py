"""The one engine interface every backend implements: a batch of requests in, completions out, same order.

Backends sort, chunk and parallelise for themselves; a failed request comes back as a Completion with
`finish_reason="error"` and the error text, never as an exception that loses the rest of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.items import Message


class GenerationRequest(BaseModel):
    """One conversation to continue."""

    model_config = ConfigDict(frozen=True)

    messages: tuple[Message, ...]
    max_tokens: int = Field(ge=1)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    json_schema: dict[str, Any] | None = None


class Completion(BaseModel):
    """What the engine produced for one request."""

    model_config = ConfigDict(frozen=True)

    text: str
    finish_reason: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[float] | None = None
    error: str | None = None


class EngineInfo(BaseModel):
    """How an engine is described in manifests and records (never secrets)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    model: str
    revision: str | None = None
    lora: str | None = None
    model_hash: str | None = None
    chat_template_hash: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)


class Engine(Protocol):
    """A chat model behind one batch method."""

    info: EngineInfo
    calls: int

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Complete every request; results in request order."""
        ...

    def close(self) -> None:
        """Free the engine's memory (GPU or CPU)."""
        ...


def error_completion(message: str) -> Completion:
    return Completion(text="", finish_reason="error", error=message)


class BorrowedEngine:
    """A view of an engine shared by several runs: counts its own calls; close() leaves the engine loaded."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.info = engine.info
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.calls += 1
        return self._engine.generate(requests)

    def close(self) -> None:
        """Leave the shared engine to its owner."""
