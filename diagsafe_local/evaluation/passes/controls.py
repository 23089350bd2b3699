"""The judge's controls, a pass (`evaluation.controls`): submitted when the judge's engine is ready, stepped
beside the run's verdicts, finished before the engine sleeps or its residency ends."""

from __future__ import annotations

from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.controls import ControlJudging, keep_current, pending_controls
from diagsafe_local.evaluation.passes.base import JUDGE, Answers, JudgingPass, Poll, Runner, Seat


class ControlsPass(JudgingPass):
    """The controls without a current verdict, on the judge's engine (or a judge without a model)."""

    name = "controls"

    def __init__(self) -> None:
        self.stream: ControlJudging | None = None

    def needs_judge(self, run: Runner) -> bool:
        return bool(pending_controls(run.ctx))

    def start(self, run: Runner, seat: Seat, engine: Engine | None) -> Poll | None:
        if seat.role != JUDGE:
            return None
        self.stream = ControlJudging(engine, run.ctx, pending_controls(run.ctx))
        return self.stream.poll if self.stream.verdicts is not None else None

    def settle(self) -> None:
        if self.stream is not None:
            self.stream.finish()

    def tidy(self, run: Runner, answers: Answers) -> None:
        keep_current(run.ctx)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
