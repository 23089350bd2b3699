"""The judging passes, execution side (`evaluation.passes`): a new pass is one module and one row of `PASSES`,
and the run schedules it with no change of its own: started with the judge's engine, told as each target's
verdicts come in, drained on the judge's engine where it serves the pass's seat, else on a model of its own
loaded once after the others, finished once every engine is closed; the canary asks every engine it judges on."""

from __future__ import annotations

from fakes import ScriptedEngine, default_responder
from test_jury import RESPONDERS, Factory, config

from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation import pipeline
from diagsafe_local.evaluation.config import TargetConfig
from diagsafe_local.evaluation.passes import JUDGE, PASSES, JudgingPass, Runner, Seat
from diagsafe_local.evaluation.passes.base import Poll
from diagsafe_local.judging.canary import CANARY_SCHEMA
from diagsafe_local.judging.config import JudgeConfig


class Echo(JudgingPass):
    """A pass of a test's own: a seat on the judge's engine and one on model 'e'; each event is logged."""

    name = "echo"
    log: list[tuple[str, ...]] = []
    factory: Factory

    def __init__(self) -> None:
        self.done: set[str] = set()

    def start(self, run: Runner, seat: Seat, engine: Engine | None) -> Poll | None:
        self.log.append(("start", seat.label, engine.info.model if engine else "none"))
        return None

    def target_judged(self, run: Runner, engine: Engine | None, target: TargetConfig) -> None:
        self.log.append(("target", target.label, engine.info.model if engine else "none"))

    def seats(self, run: Runner) -> list[Seat]:
        return [Seat("echo:own", "own", JudgeConfig(model="e")), Seat("echo:judge", "on-judge", run.config.judge)]

    def pending(self, run: Runner, seat: Seat) -> object:
        return None if seat.label in self.done else [seat.label]

    def drain(self, run: Runner, seat: Seat, engine: Engine | None, work: object) -> None:
        self.done.add(seat.label)
        self.log.append(("drain", seat.label, engine.info.model if engine else "none"))

    def finish(self, run: Runner) -> None:
        self.log.append(("finish", str(all(e.closed for e in self.factory.made))))


def test_a_new_pass_is_one_module_and_one_row(tmp_path, monkeypatch):
    factory = Factory()
    Echo.log, Echo.factory = [], factory
    monkeypatch.setattr(pipeline, "PASSES", (*PASSES, Echo))
    pipeline.Run(config(tmp_path), engine_factory=factory).execute()
    assert factory.loaded() == ["t", "j", "a", "b", "c", "e"]  # its own model after the jury's, once
    drains = [e for e in Echo.log if e[0] in ("drain", "target", "finish")]
    assert drains == [
        ("target", "t", "j"),
        ("drain", "on-judge", "j"),  # on the judge's engine while it is loaded: j is not loaded again
        ("drain", "own", "e"),
        ("finish", "True"),
    ]
    starts = [e for e in Echo.log if e[0] == "start"]
    assert starts[0] == ("start", JUDGE, "j") and ("start", "own", "e") in starts
    jurors = [e[1:] for e in starts if e[1].startswith("harmjudge@")]  # told of the jury's seats too
    assert jurors == [("harmjudge@a", "a"), ("harmjudge@b", "b"), ("harmjudge@c", "c")]


class Counting(ScriptedEngine):
    """Counts the canaries each model is asked, in `asked`."""

    asked: dict[str, int] = {}

    def generate(self, requests):
        canaries = sum(r.json_schema == CANARY_SCHEMA for r in requests)
        self.asked[self.info.model] = self.asked.get(self.info.model, 0) + canaries
        return super().generate(requests)


def test_each_engine_the_jury_loads_is_asked_the_canary_even_when_it_reuses_a_closed_ones_address(tmp_path):
    Counting.asked = {}

    def factory(engine_config, **options):  # keeps no engine: a closed one is freed, its id may come again
        return Counting(RESPONDERS.get(engine_config.model, default_responder), model=engine_config.model)

    pipeline.Run(config(tmp_path), engine_factory=factory).execute()
    assert Counting.asked == {"t": 0, "j": 1, "a": 1, "b": 1, "c": 1}
