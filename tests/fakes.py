"""A scripted engine for fast unit tests of the turn loop and the judge (the real engine is tested too)."""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Sequence
from types import SimpleNamespace

from diagsafe_local.engines.base import Completion, EngineBase, EngineInfo, GenerationRequest
from diagsafe_local.judging.canary import CANARY_SCHEMA, CANARY_VALUE


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


def canary_reply(request: GenerationRequest) -> Completion | None:
    """What an engine that applies schemas answers the grammar canary (None: not the canary)."""
    if request.json_schema != CANARY_SCHEMA:
        return None
    text = json.dumps({"canary": CANARY_VALUE, "digits": "042042"})
    return Completion(text=text, finish_reason="stop", prompt_tokens=20, completion_tokens=14)


class ScriptedEngine(EngineBase):
    """Implements the Engine interface with a Python function per request. It applies the grammar canary's
    schema as a real engine does (its responder is never asked), unless `ignores_schema`."""

    def __init__(
        self,
        responder: Callable[[GenerationRequest], Completion] = default_responder,
        model: str = "scripted",
        ignores_schema: bool = False,
    ) -> None:
        self.responder = responder
        self.calls = 0
        self.batches: list[list[GenerationRequest]] = []
        self.closed = False
        self.ignores_schema = ignores_schema
        self.info = EngineInfo(kind="scripted", model=model, versions={"scripted": "1"})

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.calls += 1
        self.batches.append(list(requests))
        return [self._answer(r) for r in requests]

    def _answer(self, request: GenerationRequest) -> Completion:
        if self.ignores_schema and request.json_schema == CANARY_SCHEMA:
            return Completion(text="Sunny, with a light breeze.", finish_reason="stop")
        return canary_reply(request) or self.responder(request)

    def close(self) -> None:
        self.closed = True


class SteppedEngine(ScriptedEngine):
    """A scripted engine with its own request stream, where a request finishes `cost(request)` polls after it
    went in (the way a real engine finishes short answers before long ones); `log` lists (poll, event, text)."""

    def __init__(self, responder=default_responder, cost: Callable[[GenerationRequest], int] = lambda r: 1) -> None:
        super().__init__(responder)
        self.cost = cost
        self.polls = 0
        self.log: list[tuple[int, str, str]] = []

    def open_stream(self) -> SteppedStream:
        return SteppedStream(self)


class SteppedStream:
    def __init__(self, engine: SteppedEngine) -> None:
        self.engine = engine
        self.running: list[list] = []  # [polls left, key, request]

    def submit(self, key, request: GenerationRequest) -> None:
        self.engine.log.append((self.engine.polls, "submit", request.messages[-1].content))
        self.running.append([self.engine.cost(request), key, request])

    def poll(self):
        self.engine.polls += 1
        done = []
        for entry in self.running:
            entry[0] -= 1
            if entry[0] <= 0:
                completion = self.engine.responder(entry[2])
                self.engine.log.append((self.engine.polls, "finish", entry[2].messages[-1].content))
                done.append((entry[1], completion))
        self.running = [e for e in self.running if e[0] > 0]
        return done

    @property
    def pending(self) -> int:
        return len(self.running)

    def close(self) -> None:
        self.running = []


class FakeNvml(types.ModuleType):
    """NVML (`pynvml`) as its documentation describes it, for a GPU node this machine is not: GPUs by index or
    UUID, memory in bytes (`free` may be a function: memory given back between reads), the driver's version, and
    the CUDA version it supports as an integer (12020 for 12.2)."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[dict], driver: str = "535.104.05", cuda: int = 12020) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.driver = driver
        self.cuda = cuda

    def nvmlInit(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict:
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> dict:
        for gpu in self.gpus:
            if gpu["uuid"] == uuid:
                return gpu
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetMemoryInfo(self, handle: dict) -> SimpleNamespace:
        free = handle["free"]() if callable(handle["free"]) else handle["free"]
        return SimpleNamespace(total=handle["total"], free=free, used=handle["total"] - free)

    def nvmlDeviceGetCudaComputeCapability(self, handle: dict) -> tuple[int, int]:
        return handle["capability"]

    def nvmlDeviceGetName(self, handle: dict) -> str:
        return handle["name"]

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda


def fake_gpu(k: int, total_gib: float = 80, free_gib: float | Callable[[], int] = 79, capability=(9, 0)) -> dict:
    free = free_gib if callable(free_gib) else int(free_gib * 1024**3)
    return {
        "uuid": f"GPU-{k:04d}",
        "name": "NVIDIA H100 80GB HBM3",
        "total": int(total_gib * 1024**3),
        "free": free,
        "capability": capability,
    }
