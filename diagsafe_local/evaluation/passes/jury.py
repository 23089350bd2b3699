"""The jury, a pass (`evaluation.jury_step`): each member, one after another, over every target's answers to
harmful items, on the judge's engine while it is loaded when the member is served the same way, else on a
model of its own; once every engine is closed, each answer's record is written with its votes combined."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Sequence

from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.judge_step import JudgeTask, judge_tasks
from diagsafe_local.evaluation.jury_step import JurorStep, combine_jury, pending_votes
from diagsafe_local.evaluation.passes.base import Answers, JudgingPass, Runner, Seat
from diagsafe_local.judging.config import JuryMember
from diagsafe_local.runs.records import JuryVote


def _member(run: Runner, seat: Seat) -> JuryMember:
    jury = run.config.judge.jury
    assert jury is not None  # a seat of this pass is a member's
    return next(m for m in jury.members if m.label == seat.label)


class JuryPass(JudgingPass):
    """A seat per member, in the jury's order; its work: the answers it has no current verdict on."""

    name = "jury"

    @classmethod
    def cost(cls, config: RunConfig) -> str | None:
        jury = config.judge.jury
        if jury is None:
            return None
        n = len(jury.members)
        return (
            f"judge jury: {n} members ({', '.join(m.label for m in jury.members)}) = {n} verdicts per answer to a "
            "harmful item instead of 1; each member's model loads alone, one after another, once the answers are in"
        )

    def seats(self, run: Runner) -> Sequence[Seat]:
        jury = run.config.judge.jury
        return [Seat(f"jury:{m.label}", m.label, m) for m in jury.members] if jury is not None else ()

    def pending(self, run: Runner, seat: Seat) -> Iterator[JudgeTask] | None:
        tasks = pending_votes(run.ctx, _member(run, seat))
        first = next(tasks, None)
        return None if first is None else itertools.chain([first], tasks)

    def drain(self, run: Runner, seat: Seat, engine: Engine | None, work: Iterator[JudgeTask]) -> None:
        start = time.perf_counter()
        judged = judge_tasks(
            JurorStep(engine, run.ctx, _member(run, seat)), work, run.reporter(f"jury {seat.label}: verdicts")
        )
        seconds = time.perf_counter() - start
        run.timings[seat.role] = {
            "judge_seconds": round(seconds, 3),
            "judgments_per_second": round(judged / seconds, 3) if seconds else 0.0,
        }
        run.save_manifest("running")

    def finish(self, run: Runner) -> None:
        if run.config.judge.jury is not None:
            for target in run.config.targets:
                run.fresh["judgments"] += combine_jury(run.ctx, target.label)

    def tidy(self, run: Runner, answers: Answers) -> None:
        if run.config.judge.jury is not None:
            store = run.ctx.directory.store(JuryVote)
            store.keep(lambda k: answers.kept(k[:4]))
            store.compact(lambda k: (*answers.order(k[:4]), k[4]))
