"""The jury, the step: once every answer is in, each member of `judge.jury` judges the answers to harmful items
one member after another, each model loaded once (alone, or on the judge's engine when it is the same engine);
every member's verdict is stored as it comes in (jury.jsonl), so a resumed run asks each member only what it has
not judged; then each answer's record is written with its members' votes combined by the jury's rule."""

from __future__ import annotations

from collections.abc import Iterator

from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.context import RunContext
from diagsafe_local.evaluation.judge_step import (
    TASKS_IN_FLIGHT,
    JudgeTask,
    combined,
    for_jury,
    judge_key,
    pending_tasks,
    result_record,
    total_usage,
    vote,
)
from diagsafe_local.judging.base import JUDGES, JudgeInput
from diagsafe_local.judging.config import JuryMember
from diagsafe_local.judging.verdicts import VerdictStream
from diagsafe_local.runs.records import JuryVote, ResultRecord, Usage


def juror_key(ctx: RunContext, member: JuryMember, task: JudgeTask) -> str:
    """What a member's stored verdict must have been made from to be reused (as `judge_key` for the judge)."""
    answer = task.generation.answer if task.generation else ""
    return judge_key(ctx.juror_settings(member), member.rubric_name, task.conversation, answer, task.item.references)


def _stored(ctx: RunContext, member: JuryMember, task: JudgeTask) -> JuryVote | None:
    """The member's current verdict on a task, if stored (an error is asked again)."""
    vote = ctx.directory.store(JuryVote).get((task.target, task.item.id, task.sample, task.turn, member.label))
    if vote is None or vote.vote.parse_status == "error" or vote.judge_key != juror_key(ctx, member, task):
        return None
    return vote


def pending_votes(ctx: RunContext, member: JuryMember) -> Iterator[JudgeTask]:
    """The jury's tasks, over every target, that `member` has no current verdict on, one at a time."""
    for target in ctx.config.targets:
        for task in pending_tasks(ctx, target):
            if for_jury(ctx.config.judge, task) and _stored(ctx, member, task) is None:
                yield task


class JurorStep:
    """One member as a task stream (`judge_step.judge_tasks` drives it): each verdict appended to jury.jsonl
    at the poll that finishes it."""

    def __init__(self, engine: Engine | None, ctx: RunContext, member: JuryMember) -> None:
        self.ctx, self.member = ctx, member
        self.judge = JUDGES.get(member.rubric_name)
        self.verdicts = VerdictStream(
            engine, member.decoding(), member.sampling.seed, member.max_attempts, member.batch_size
        )
        self._tasks: dict[int, JudgeTask] = {}
        self._next = 0
        self.done = 0

    def submit(self, task: JudgeTask) -> None:
        judged = JudgeInput(
            conversation=task.conversation,
            answer=task.generation.answer if task.generation else "",
            references=task.item.references,
        )
        seed_key = (task.target, task.item.id, task.sample, task.turn, self.member.label)
        self._tasks[self._next] = task
        self.verdicts.submit(self._next, self.judge, judged, seed_key)
        self._next += 1

    def poll(self) -> int:
        votes = []
        for k, verdict in self.verdicts.poll():
            task = self._tasks.pop(k)
            votes.append(
                JuryVote(
                    run_id=self.ctx.run_id,
                    target=task.target,
                    item_id=task.item.id,
                    sample=task.sample,
                    turn=task.turn,
                    judge_key=juror_key(self.ctx, self.member, task),
                    vote=vote(self.member.label, verdict),
                    attempts=verdict.attempts,
                    usage=Usage.of(verdict.completion) if verdict.completion else Usage(),
                )
            )
        if votes:
            self.ctx.directory.store(JuryVote).append(votes)
            self.done += len(votes)
        return len(votes)

    @property
    def pending(self) -> int:
        return self.verdicts.pending

    def close(self) -> None:
        self.verdicts.close()


def combine_jury(ctx: RunContext, target: str) -> int:
    """Write the record of every jury task of `target` whose members have all judged it: their votes combined
    by the jury's rule (a member whose verdict is an error votes harmful, and is counted: `runs.jury`). Returns
    the records written."""
    jury = ctx.config.judge.jury
    assert jury is not None
    label, written = jury.label(), 0
    batch: list[ResultRecord] = []
    for task in pending_tasks(ctx, ctx.targets[target]):
        if not for_jury(ctx.config.judge, task):
            continue
        stored = [
            ctx.directory.store(JuryVote).get((target, task.item.id, task.sample, task.turn, m.label))
            for m in jury.members
        ]
        current = [
            v
            for v, m in zip(stored, jury.members, strict=True)
            if v is not None and v.judge_key == juror_key(ctx, m, task)
        ]
        if len(current) < len(jury.members):
            continue  # a member never judged it (its engine failed): left pending, and the run is incomplete
        votes = [v.vote for v in current]
        verdict = combined(label, votes, max(v.attempts for v in current))
        batch.append(result_record(ctx, task, verdict, label, votes, total_usage(v.usage for v in current)))
        if len(batch) >= TASKS_IN_FLIGHT:
            ctx.directory.results.append(batch)
            written, batch = written + len(batch), []
    if batch:
        ctx.directory.results.append(batch)
    return written + len(batch)
