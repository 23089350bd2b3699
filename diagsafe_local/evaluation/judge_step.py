"""The pipeline's judge step: grade answers with the configured judges as a stream.

Harmful items go to `rubric` (or the panel), benign ones to `benign_rubric`. Verdicts come from
`verdicts.VerdictStream` (per-request retries, parse-failure accounting). An answer that could not be
generated is recorded as an `error`. Every record is appended as soon as it is final; a colocated pipeline
submits an answer's task the moment the answer is in (see `pipeline`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from diagsafe_local.core.hashing import content_key
from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.config import TargetConfig
from diagsafe_local.evaluation.context import RunContext
from diagsafe_local.evaluation.generation import Answer, conversation_until, stream_answers
from diagsafe_local.evaluation.items import Item
from diagsafe_local.judging.base import JUDGES, JudgeInput, ParseOutcome
from diagsafe_local.judging.config import JudgeConfig
from diagsafe_local.judging.verdicts import Verdict, VerdictStream
from diagsafe_local.runs.records import EngineRef, GenerationRecord, PanelVote, ResultRecord, Usage
from diagsafe_local.runs.verdicts import combined_score, combined_status, is_harmful


@dataclass(frozen=True)
class JudgeTask:
    """One answer to grade (or to report as an error)."""

    target: str
    system_prompt: str | None
    item: Item
    sample: int
    turn: int
    generation: GenerationRecord | None
    conversation: tuple
    error: str | None = None
    key: str | None = None  # what the verdict is made from (see `judge_key`)
    judged: tuple | None = None  # what the judge is shown, where not `conversation` (an attack's goal)


def judged_turns(item: Item, which: str) -> list[int]:
    """The turns whose answers are judged: the last one, or every generated (not pre-filled) one."""
    if which == "last":
        return [item.n_turns]
    return [t for t in range(1, item.n_turns + 1) if item.prefilled(t) is None]


def judge_key(
    judge: dict[str, Any], rubric: str, conversation: Sequence[Message], answer: str, references: Sequence[str]
) -> str:
    """What a stored verdict must have been made from to be reused: the judge model (by content), the rubric,
    and everything the judge was shown."""
    return content_key(judge, rubric, list(conversation), answer, list(references))


def pending_tasks(ctx: RunContext, target: TargetConfig) -> Iterator[JudgeTask]:
    """Answers of `target` without a current judgment: never judged, judged from other content (a changed
    prompt or answer, another judge model), or errored (retried on resume); worked out one at a time, as the
    judge takes them."""
    for item in ctx.items:
        for sample in range(target.sampling.n):
            for turn in judged_turns(item, ctx.config.judge.turns):
                task = task_for(ctx, target, item, sample, turn)
                if task is not None:
                    yield task


def unjudged(ctx: RunContext, target: TargetConfig) -> int:
    """How many of the target's answers the judge model has to judge and that have no verdict at all (a count
    from the keys alone: what the judge's progress counts toward; stale verdicts redone on resume come on top)."""
    results, jury = ctx.directory.results, ctx.config.judge.jury is not None
    return sum(
        (target.label, item.id, sample, turn) not in results
        for item in ctx.items
        if item.benign or not jury
        for sample in range(target.sampling.n)
        for turn in judged_turns(item, ctx.config.judge.turns)
    )


def for_jury(config: JudgeConfig, task: JudgeTask) -> bool:
    """Whether the jury judges a task (an answer to a harmful item, when there is a jury), not the judge's model."""
    return config.jury is not None and not task.item.benign and task.error is None


def answer_task(ctx: RunContext, target: TargetConfig, answer: Answer) -> JudgeTask | None:
    """The judge's task for an answer generation just made (with the conversation it answers), or None when a
    current verdict is stored (not an error, and no jury member's vote in it an error: that member is asked
    again, the others' stored votes kept)."""
    record, item = answer.record, ctx.items_by_id[answer.record.item_id]
    rubric = ctx.config.judge.judge_for(item.benign)
    key = judge_key(ctx.judge_settings(rubric), rubric, answer.conversation, record.answer, item.references)
    previous = ctx.directory.results.get(record.key)
    if previous is not None and previous.parse_status != "error" and previous.judge_key == key:
        juror_erred = previous.judge_rubric.startswith("jury:") and any(
            v.parse_status == "error" for v in previous.panel or ()
        )
        if not juror_erred:
            return None
    return JudgeTask(
        target.label, target.system_prompt, item, record.sample, record.turn, record, answer.conversation, key=key
    )


def task_for(ctx: RunContext, target: TargetConfig, item: Item, sample: int, turn: int) -> JudgeTask | None:
    """The judge's task for one stored answer, or None when a current verdict is stored; an answer that is
    missing or could not be generated is a task that records the error."""
    done = stream_answers(ctx.directory.generations, target.label, item, sample)
    answers = {k: r.answer for k, r in done.items() if r.error is None}
    record = done.get(turn)
    if record is not None and record.error is None:
        return answer_task(ctx, target, Answer(record, conversation_until(item, turn, answers, target.system_prompt)))
    failed = next((done[k] for k in range(1, turn + 1) if k in done and done[k].error), None)
    reason = f"turn {failed.turn} could not be generated: {failed.error}" if failed else "answer missing"
    conversation = conversation_until(item, turn, {k: answers.get(k, "") for k in range(1, turn)}, target.system_prompt)
    return JudgeTask(target.label, target.system_prompt, item, sample, turn, record, conversation, reason)


def rubric_name(config: JudgeConfig, task: JudgeTask) -> str:
    """Harmful items get the harm rubric (or the panel); benign items the over-refusal rubric (or the keyword
    detector)."""
    return config.judge_for(task.item.benign)


def _members(config: JudgeConfig, name: str) -> list[str]:
    """The judges behind a rubric name: the panel's members, or the judge itself."""
    return config.panel.names() if config.panel and name == config.panel.label() else [name]


def _engine_ref(ctx: RunContext, rubric: str) -> EngineRef:
    """The engine a record names as its judge's: the judge model's, none for a model-free judge, the jury."""
    if rubric.startswith("jury:"):
        return EngineRef(kind="jury", model=rubric)
    return EngineRef(kind="none", model=rubric) if _model_free(rubric) else ctx.judge_ref


def _model_free(name: str) -> bool:
    return name in JUDGES and not JUDGES.get(name).needs_model


class JudgeStep:
    """The judge as a stream: `submit` tasks (all at once, or as their answers come in), `poll` to advance the
    judge engine; each finished record is appended to `results` at the poll that finishes it. A panel's
    record is written when its last member's verdict is in."""

    def __init__(
        self,
        engine: Engine | None,
        ctx: RunContext,
        results: JsonlStore | None = None,
        finish: Callable[[JudgeTask, ResultRecord], ResultRecord] | None = None,
    ) -> None:
        config = self.config = ctx.config.judge
        self.ctx = ctx
        self.finish = finish  # completes each record before it is written (an attack adds its step)
        self.results = (
            results if results is not None else ctx.directory.results
        )  # an attack's steps go to their own store
        self.verdicts = VerdictStream(
            engine, config.decoding(), config.sampling.seed, config.max_attempts, config.batch_size
        )
        self._waiting: dict[int, tuple[JudgeTask, str, dict[str, Verdict], int]] = {}
        self._ready: list[tuple[JudgeTask, ResultRecord]] = []
        self._next = 0
        self.done = 0

    def submit(self, task: JudgeTask) -> None:
        name = rubric_name(self.config, task)
        if task.error is not None:
            self._ready.append((task, self._record(task, None, name, None)))
            return
        judged = JudgeInput(
            conversation=task.judged or task.conversation,
            answer=task.generation.answer,  # type: ignore[union-attr]
            references=task.item.references,
        )
        members = _members(self.config, name)
        self._waiting[self._next] = (task, name, {}, len(members))
        for member in members:
            seed_key = (task.target, task.item.id, task.sample, task.turn) + ((member,) if len(members) > 1 else ())
            self.verdicts.submit((self._next, member), JUDGES.get(member), judged, seed_key)
        self._next += 1

    def poll(self) -> int:
        """One step: append the records finished in it; returns how many."""
        finished, self._ready = self._ready, []
        for (k, member), verdict in self.verdicts.poll():
            task, name, members, wanted = self._waiting[k]
            members[member] = verdict
            if len(members) == wanted:
                del self._waiting[k]
                if wanted == 1:
                    record = self._record(task, verdict, name)
                else:
                    # in the members' order (the label's), not the order their verdicts came back in
                    votes = [vote(m, members[m]) for m in _members(self.config, name)]
                    usage = total_usage(Usage.of(v.completion) for v in members.values() if v.completion)
                    record = self._record(
                        task, combined(name, votes, max(v.attempts for v in members.values())), name, votes, usage
                    )
                finished.append((task, record))
        records = [self.finish(task, record) if self.finish else record for task, record in finished]
        if records:
            self.results.append(records)
            self.done += len(records)
        return len(records)

    @property
    def pending(self) -> int:
        return len(self._ready) + len(self._waiting)

    def close(self) -> None:
        self.verdicts.close()

    def _record(
        self,
        task: JudgeTask,
        verdict: Verdict | None,
        name: str,
        votes: list[PanelVote] | None = None,
        usage: Usage | None = None,
    ) -> ResultRecord:
        return result_record(self.ctx, task, verdict, name, votes, usage)


# Judge tasks taken from their source at once: more than a judge engine runs side by side, few enough that the
# tasks in hand (each holds its answer and conversation) are all a run holds.
TASKS_IN_FLIGHT = 4096


class TaskStep(Protocol):
    """A stream that judges tasks (the judge step, a jury member's step)."""

    done: int

    def submit(self, task: JudgeTask) -> None: ...

    def poll(self) -> int: ...

    @property
    def pending(self) -> int: ...

    def close(self) -> None: ...


def judge_tasks(
    step: TaskStep,
    tasks: Iterable[JudgeTask],
    on_progress: Callable[[int, int], None] | None = None,
    alongside: Callable[[], object] | None = None,
    total: int = 0,
) -> int:
    """Judge `tasks` through `step`, taking them `TASKS_IN_FLIGHT` at a time, each record stored as soon as it is
    final; `alongside` is polled with every step (another stream on the judge engine, such as the controls');
    `total`: what the progress counts toward (at least the tasks taken). Returns the tasks judged; closes `step`."""
    source = iter(tasks)
    taken = 0

    def take() -> None:
        nonlocal taken
        while step.pending < TASKS_IN_FLIGHT and (task := next(source, None)) is not None:
            step.submit(task)
            taken += 1

    try:
        take()
        if on_progress:
            on_progress(0, max(total, taken))
        while step.pending:
            if alongside:
                alongside()
            if step.poll() and on_progress:
                on_progress(step.done, max(total, taken))
            take()
    finally:
        step.close()
    return taken


def vote(member: str, verdict: Verdict) -> PanelVote:
    """A member's verdict as the record keeps it."""
    return PanelVote(
        rubric=member,
        raw=verdict.completion.text if verdict.completion else None,
        verdict=verdict.outcome.verdict,
        score=verdict.outcome.score,
        parse_status=verdict.outcome.status,
        error=verdict.outcome.error,
    )


def combined(label: str, votes: Sequence[PanelVote], attempts: int) -> Verdict:
    """A panel's or jury's verdict (`label`): its members' scores combined by its rule, their decisions kept in
    the verdict; no score when no member decided (or a panel's majority tie)."""
    scores = {v.rubric: v.score for v in votes}
    score = combined_score(label, list(scores.values()))
    verdict = {
        "panel": label.split(":", 2)[1],
        "label": None if score is None else ("harmful" if is_harmful(score) else "not_harmful"),
        "members": scores,
    }
    status = combined_status(score, [v.parse_status for v in votes])
    outcome = ParseOutcome(
        status=status,
        verdict=verdict,
        score=score,
        error=None
        if status == "ok"
        else f"no {label.split(':', 1)[0]} decision: " + "; ".join(f"{v.rubric}: {v.parse_status}" for v in votes),
    )
    return Verdict(None, outcome, attempts)


def total_usage(usages: Iterable[Usage]) -> Usage:
    """The judge's tokens for one record over several verdicts (a panel's or jury's members)."""
    total = Usage()
    for u in usages:
        total = Usage(
            prompt_tokens=total.prompt_tokens + u.prompt_tokens,
            completion_tokens=total.completion_tokens + u.completion_tokens,
            cached_tokens=total.cached_tokens + u.cached_tokens,
        )
    return total


def needs_engine(config: JudgeConfig, tasks: Iterable[JudgeTask]) -> bool:
    """Whether any task needs the judge model (keyword-only over-refusal checks do not)."""
    return any(t.error is None and not _model_free(rubric_name(config, t)) and not for_jury(config, t) for t in tasks)


def result_record(
    ctx: RunContext,
    task: JudgeTask,
    verdict: Verdict | None,
    rubric: str,
    votes: list[PanelVote] | None = None,
    usage: Usage | None = None,
) -> ResultRecord:
    """The record of one judged answer (`verdict` None: it could not be judged, `task.error` says why); a panel's
    or jury's carries each member's vote and their tokens together."""
    config = ctx.config.judge
    gen = task.generation
    common = dict(
        run_id=ctx.run_id,
        target=task.target,
        item_id=task.item.id,
        sample=task.sample,
        turn=task.turn,
        category=task.item.category,
        source=task.item.source,
        attack_method=task.item.attack_method,
        benign=task.item.benign,
        final_turn=task.turn == task.item.n_turns,
        conversation=list(task.conversation),
        judge_key=task.key,
        answer=gen.answer if gen else "",
        finish_reason=gen.finish_reason if gen else None,
        target_usage=gen.usage if gen else Usage(),
        target_engine=ctx.target_refs[task.target],
        judge_engine=_engine_ref(ctx, rubric),
        judge_rubric=rubric,
        panel=votes,
    )
    if verdict is None:
        return ResultRecord(
            **common, judge_raw=None, verdict=None, score=None, parse_status="error", attempts=0, error=task.error
        )
    completion, parsed = verdict.completion, verdict.outcome
    kept = (config.store_reasoning, config.reasoning_max_chars)
    return ResultRecord(
        **common,
        judge_raw=completion.text if completion else None,  # None: no model wrote this verdict
        verdict=parsed.verdict,
        score=parsed.score,
        parse_status=parsed.status,
        attempts=verdict.attempts,
        error=parsed.error,
        judge_usage=usage if usage is not None else (Usage.of(completion) if completion else Usage()),
        judge_logprobs=completion.logprobs if completion else None,
        reasoning=verdict.reasoning.kept(*kept) if verdict.reasoning else None,
    )
