"""A judging pass, the execution side: what a pass that asks a judge something more needs of a run, and the
hooks `pipeline.Run` (the scheduler) calls as it loads engines. Each hook does nothing unless the pass has work
there, so a pass implements only its own moments."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from diagsafe_local.engines.base import Engine
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.evaluation.config import RunConfig, TargetConfig
from diagsafe_local.evaluation.context import RunContext
from diagsafe_local.judging.config import JudgeConfig
from diagsafe_local.runs.manifest import DatasetRef, GrammarCanary
from diagsafe_local.runs.records import AnswerKey

JUDGE = "judge"  # the role of the run's judge engine, resident while the targets are judged


@dataclass(frozen=True)
class Seat:
    """An engine a pass judges on: the run's judge (`role` 'judge') or a model of its own (a jury member's,
    'jury:<label>'), with the config that loads it and the label its records and timings use."""

    role: str
    label: str
    config: JudgeConfig


@dataclass(frozen=True)
class Answers:
    """The answers a complete run keeps verdicts of (`kept`: of its targets, items, samples and judged turns) and
    their canonical order, for a pass whose records are keyed by answer."""

    kept: Callable[[AnswerKey], bool]
    order: Callable[[AnswerKey], tuple[int, int, int, int]]


class Runner(Protocol):
    """What a pass reads and records of the run that schedules it (`pipeline.Run`)."""

    config: RunConfig
    ctx: RunContext
    dataset: DatasetRef
    grammar: GrammarCanary | None
    timings: dict[str, dict[str, float]]
    fresh: dict[str, int]

    def save_manifest(self, status: Literal["running", "complete"]) -> None: ...

    def reporter(self, stage: str, rate: bool = True) -> Callable[[int, int], None] | None: ...


Poll = Callable[[], None]


def shares_engine(config: JudgeConfig, other: JudgeConfig) -> bool:
    """Whether a seat runs on another's engine (the same model served the same way: the judge's, or the seat's
    before it): then it judges on that engine while it is loaded, and no model is loaded twice."""
    fields = set(EngineConfig.model_fields) | {"structured_output_backend"}
    return config.model_dump(include=fields) == other.model_dump(include=fields)


class JudgingPass:
    """One pass over the answers on the execution side. Its pending work is worked out from the run directory
    (a resumed run does only what is left). On the judge's engine, the scheduler calls `start` when it is loaded
    (or a judge without a model is set up), steps the returned poll with every step of the judge's verdicts,
    `target_judged` once a target's verdicts are in, `settle` before the engine is parked and before its
    residency ends; then, for each of the pass's `seats` with work `pending`, it loads the seat's engine (or keeps
    the resident one serving it), calls every pass's `start` for the seat and this pass's `drain`; `finish` once
    every engine is closed; `tidy` once the run is complete."""

    name: ClassVar[str]

    @classmethod
    def cost(cls, config: RunConfig) -> str | None:
        """What the pass adds to a run of `config`, as `plan` prints it (None: nothing)."""
        return None

    def needs_judge(self, run: Runner) -> bool:
        """Whether work is left that needs the judge's engine loaded."""
        return False

    def start(self, run: Runner, seat: Seat, engine: Engine | None) -> Poll | None:
        """`seat`'s engine is ready (None: a judge without a model); returns the poll of a stream to step beside
        the judge's verdicts, if the pass keeps one."""
        return None

    def target_judged(self, run: Runner, engine: Engine | None, target: TargetConfig) -> None:
        """The target's verdicts are in; the judge's engine (None: not loaded) is resident."""

    def settle(self) -> None:
        """Finish what is in flight on the judge's engine (before it sleeps, and before its residency ends)."""

    def seats(self, run: Runner) -> Sequence[Seat]:
        """The engines it judges on besides the judge's own moments, in the order it uses them."""
        return ()

    def pending(self, run: Runner, seat: Seat) -> Any:
        """The work left on `seat` (None: none), handed back to `drain`."""
        return None

    def drain(self, run: Runner, seat: Seat, engine: Engine | None, work: Any) -> None:
        """Do `work` on `seat`'s engine (None: its judge needs no model)."""

    def finish(self, run: Runner) -> None:
        """Every engine is closed: write what is made of the pass's verdicts."""

    def tidy(self, run: Runner, answers: Answers) -> None:
        """The run is complete: drop the pass's records the run no longer has (items removed, turns no longer
        judged, another judge) and put the rest in canonical order."""

    def close(self) -> None:
        """Give back what `start` opened (the run ends, or failed)."""


def alongside(polls: Sequence[Poll]) -> Poll | None:
    """One poll for the streams stepped beside the judge's verdicts (none, one as it is, or all in turn)."""
    if len(polls) <= 1:
        return polls[0] if polls else None

    def every() -> None:
        for poll in polls:
            poll()

    return every
