"""The grammar canary and the judge's controls ride in the engine steps of the judge's first verdicts: on an
engine whose streams share one scheduler (vLLM's shape), a request decoded alone costs a step per token, so
the canary is sent with the first verdicts, not before them; its outcome is still recorded before any verdict."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from fakes import ScriptedEngine
from test_pipeline_unit import make_config

from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.engines.streams import run_all
from diagsafe_local.evaluation.controls import CONTROL_ANSWERS
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.judging.canary import CANARY_SCHEMA
from diagsafe_local.runs.manifest import read_manifest_file

COST = {"canary": 40, "control": 12, "verdict": 10, "answer": 3}  # tokens: the steps each request runs


def kind(request: GenerationRequest) -> str:
    if request.json_schema == CANARY_SCHEMA:
        return "canary"
    if request.json_schema is None:
        return "answer"
    judged = request.messages[-1].content
    return "control" if any(answer in judged for answer in CONTROL_ANSWERS.values()) else "verdict"


class OneScheduler(ScriptedEngine):
    """vLLM's shape: the requests of every stream in one scheduler; a step (any stream's poll) advances them all,
    and a request finishes after its kind's COST of steps. `trace` lists, per step, the kinds that ran in it."""

    def __init__(self) -> None:
        super().__init__()
        self.ids = itertools.count()
        self.running: dict[int, list] = {}  # id -> [steps left, stream, key, request]
        self.trace: list[list[str]] = []

    def open_stream(self) -> SharedStream:
        return SharedStream(self)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.calls += 1
        return run_all(self.open_stream(), requests)

    def step(self) -> None:
        self.trace.append(sorted({kind(entry[3]) for entry in self.running.values()}))
        for rid, entry in list(self.running.items()):
            entry[0] -= 1
            if entry[0] <= 0:
                del self.running[rid]
                entry[1].ready.append((entry[2], self._answer(entry[3])))


class SharedStream:
    def __init__(self, engine: OneScheduler) -> None:
        self.engine = engine
        self.ready: list[tuple[object, Completion]] = []

    def submit(self, key: object, request: GenerationRequest) -> None:
        self.engine.running[next(self.engine.ids)] = [COST[kind(request)], self, key, request]

    def _mine(self) -> int:
        return sum(entry[1] is self for entry in self.engine.running.values())

    def poll(self) -> list[tuple[object, Completion]]:
        if not self.ready and self._mine():
            self.engine.step()
        done, self.ready = self.ready, []
        return done

    @property
    def pending(self) -> int:
        return len(self.ready) + self._mine()

    def close(self) -> None:
        for rid in [rid for rid, entry in self.engine.running.items() if entry[1] is self]:
            del self.engine.running[rid]


def one_engine() -> Callable[..., OneScheduler]:
    engine = OneScheduler()
    return lambda config, **options: engine


def judging_steps(trace: list[list[str]]) -> list[list[str]]:
    """The steps from the first that ran a judge's request (the answers come before, in sequential placement)."""
    first = next(k for k, kinds in enumerate(trace) if set(kinds) - {"answer"})
    return trace[first:]


def test_the_canary_and_the_controls_ride_in_the_first_verdicts_steps(tmp_path: Path, monkeypatch) -> None:
    factory = one_engine()
    engine = factory(None)
    written: list[tuple[bool, int]] = []  # at each manifest save: canary recorded?, results written so far
    save = Run.save_manifest

    def saving(run: Run, status: str) -> None:
        results = run.dir.root / "results.jsonl"
        written.append((run.grammar is not None, len(results.read_text().splitlines()) if results.exists() else 0))
        save(run, status)  # type: ignore[arg-type]

    monkeypatch.setattr(Run, "save_manifest", saving)
    Run(make_config(tmp_path, judge={"turns": "last", "batch_size": 256}), engine_factory=factory).execute()

    judging = judging_steps(engine.trace)
    assert judging[0] == ["canary", "control", "verdict"]  # one batch: nothing is decoded alone before the verdicts
    assert len(judging) == COST["canary"]  # the longest request's steps, not the canary's plus the verdicts'
    manifest = read_manifest_file(tmp_path / "run")
    assert manifest.grammar is not None and manifest.grammar.enforced
    # the canary's outcome is in the manifest before the first verdict is written
    assert next(results for recorded, results in written if recorded) == 0
    results = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert len(results) == 4 and all(r["parse_status"] == "ok" for r in results)


def test_the_canary_of_an_engine_that_ignores_schemas_still_fails_the_run(tmp_path: Path) -> None:
    factory = one_engine()
    factory(None).ignores_schema = True
    Run(make_config(tmp_path, judge={"turns": "last", "batch_size": 256}), engine_factory=factory).execute()
    manifest = read_manifest_file(tmp_path / "run")
    assert manifest.grammar is not None and not manifest.grammar.enforced
    assert manifest.grammar.reply == "Sunny, with a light breeze."
