"""Request streams: requests go into an engine one at a time and come back as each finishes, so a caller can
submit a conversation's next turn, or an answer's verdict, the moment the previous result is in. No batch is a
barrier, and a request that fails fails alone.

A stream is `submit(key, request)` and `poll()`: one step of work, returning the (key, completion) pairs that
finished in it (possibly none while requests are in flight; never none while `pending` and the engine works).
The vLLM engine steps its own scheduler (`vllm_engine.VLLMStream`), the API engine keeps a bounded number of
requests in flight (`openai_engine.OpenAIStream`); any other engine (transformers, classifier, test fakes) gets
`BatchStream`, which runs what was submitted as batches of `generate`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any, Protocol

from diagsafe_local.engines.base import Completion, Engine, GenerationRequest


class Stream(Protocol):
    """Requests in, finished completions out, in the order they finish."""

    def submit(self, key: Hashable, request: GenerationRequest) -> None: ...

    def poll(self) -> list[tuple[Any, Completion]]: ...

    @property
    def pending(self) -> int: ...

    def close(self) -> None: ...


class BatchStream:
    """A stream over an engine with only `generate`: each poll runs up to `max_batch` submitted requests."""

    def __init__(self, engine: Engine, max_batch: int = 256) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self._queue: deque[tuple[Hashable, GenerationRequest]] = deque()

    def submit(self, key: Hashable, request: GenerationRequest) -> None:
        self._queue.append((key, request))

    def poll(self) -> list[tuple[Any, Completion]]:
        batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
        if not batch:
            return []
        return list(zip((k for k, _ in batch), self.engine.generate([r for _, r in batch])))

    @property
    def pending(self) -> int:
        return len(self._queue)

    def close(self) -> None:
        self._queue.clear()


def open_stream(engine: Engine, max_batch: int = 256) -> Stream:
    """The engine's own stream where it has one, else a `BatchStream` of `max_batch` requests per poll."""
    stream = engine.open_stream()
    return stream if stream is not None else BatchStream(engine, max_batch)


def run_all(stream: Stream, requests: Sequence[GenerationRequest]) -> list[Completion]:
    """Submit every request, poll until all are back; results in request order."""
    for k, request in enumerate(requests):
        stream.submit(k, request)
    results: dict[int, Completion] = {}
    while len(results) < len(requests):
        results.update(stream.poll())
    return [results[k] for k in range(len(requests))]
