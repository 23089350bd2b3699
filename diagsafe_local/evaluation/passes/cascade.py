"""The cascade, a pass (`judge.cascade`; the read side, and what goes up: `runs.cascade`): once the screen (the
run's judge) has judged every answer, the full judge, on a model of its own, judges the answers the screen sent
up and the audit sample of the ones it kept; each verdict is stored in cascade.jsonl as it is final, so a
resumed run asks only what is left."""

from __future__ import annotations

from collections.abc import Sequence

from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.engines.base import Engine
from diagsafe_local.engines.identity import engine_identity
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.judge_step import TASKS_IN_FLIGHT, judge_key, vote
from diagsafe_local.evaluation.passes.base import Answers, JudgingPass, Runner, Seat
from diagsafe_local.judging.base import JUDGES, JudgeInput
from diagsafe_local.judging.config import CascadeConfig
from diagsafe_local.judging.verdicts import VerdictStream
from diagsafe_local.runs.cascade import CascadeRecord, audit_draw, audit_size, in_cascade, sent_up
from diagsafe_local.runs.records import AnswerKey, ResultRecord, Usage

Work = list[tuple[ResultRecord, str, str]]  # (the screened answer, role, the full judge's key for it)


def _store(run: Runner) -> JsonlStore[CascadeRecord]:
    return run.ctx.directory.store(CascadeRecord)


def _key(run: Runner, cascade: CascadeConfig, record: ResultRecord) -> str:
    """What the full judge's verdict on an answer is made from (its model by content, settings, what it is shown)."""
    judge = cascade.judge
    settings = {**engine_identity(judge).key(), **judge.verdict_settings(judge.rubric_name)}
    references = run.ctx.items_by_id[record.item_id].references
    return judge_key(settings, judge.rubric_name, record.conversation, record.answer, references)


def _wanted(run: Runner, cascade: CascadeConfig) -> dict[AnswerKey, tuple[ResultRecord, str]]:
    """The answers the full judge is to judge, by key, with their role: those sent up, and the audit."""
    screened = [r for r in run.ctx.directory.results.values() if in_cascade(r)]
    up = {r.key for r in screened if sent_up(r.score, cascade.band, cascade.send)}
    samples = {t.label: t.sampling.n for t in run.config.targets}
    audit = audit_draw(run.dataset.items or [], samples, cascade.seed, audit_size(cascade.audit_half_width))
    return {r.key: (r, "band" if r.key in up else "audit") for r in screened if r.key in up or r.key in audit}


class CascadePass(JudgingPass):
    """One seat, the full judge; its work: the answers sent up or audited with no current verdict."""

    name = "cascade"

    @classmethod
    def cost(cls, config: RunConfig) -> str | None:
        cascade = config.judge.cascade
        if cascade is None:
            return None
        low, high = cascade.band
        up = f"scored {low:g}-{high:g}" if cascade.send == "band" else f"scored {low:g} or more"
        return (
            f"cascade: the screen ({config.judge.rubric_name}) on every answer; the answers it {up} go up to "
            f"{cascade.judge.label}, plus an audit of up to {audit_size(cascade.audit_half_width)} of the rest per "
            "target, judged by both; the full judge's model loads once, after the screen"
        )

    def seats(self, run: Runner) -> Sequence[Seat]:
        cascade = run.config.judge.cascade
        return [Seat("cascade", cascade.judge.label, cascade.judge)] if cascade is not None else ()

    def pending(self, run: Runner, seat: Seat) -> Work | None:
        cascade = run.config.judge.cascade
        assert cascade is not None  # the seat is the cascade's
        store, work = _store(run), []
        for r, role in _wanted(run, cascade).values():
            key, stored = _key(run, cascade, r), store.get(r.key)
            if stored is None or stored.judge_key != key or stored.role != role or stored.vote.parse_status == "error":
                work.append((r, role, key))
        return work or None

    def drain(self, run: Runner, seat: Seat, engine: Engine | None, work: Work) -> None:
        cascade = run.config.judge.cascade
        assert cascade is not None
        judge, store = cascade.judge, _store(run)
        stream = VerdictStream(engine, judge.decoding(), judge.sampling.seed, judge.max_attempts, judge.batch_size)
        asked = dict(enumerate(work))
        try:
            for k, (r, _, _) in asked.items():
                shown = JudgeInput(
                    conversation=tuple(r.conversation),
                    answer=r.answer,
                    references=run.ctx.items_by_id[r.item_id].references,
                )
                stream.submit(k, JUDGES.get(judge.rubric_name), shown, (*r.key, "cascade"))
                while stream.pending >= TASKS_IN_FLIGHT:
                    self._store_polled(run, store, stream, asked, judge.label)
            while stream.pending:
                self._store_polled(run, store, stream, asked, judge.label)
        finally:
            stream.close()
        run.save_manifest("running")

    @staticmethod
    def _store_polled(
        run: Runner, store: JsonlStore[CascadeRecord], stream: VerdictStream, asked: dict, label: str
    ) -> None:
        records = []
        for k, verdict in stream.poll():
            r, role, key = asked[k]
            records.append(
                CascadeRecord(
                    target=r.target,
                    item_id=r.item_id,
                    sample=r.sample,
                    turn=r.turn,
                    run_id=run.ctx.run_id,
                    role=role,
                    judge_key=key,
                    vote=vote(label, verdict),
                    attempts=verdict.attempts,
                    usage=Usage.of(verdict.completion) if verdict.completion else Usage(),
                )
            )
        if records:
            store.append(records)

    def tidy(self, run: Runner, answers: Answers) -> None:
        if run.config.judge.cascade is not None:
            wanted, store = _wanted(run, run.config.judge.cascade), _store(run)
            store.keep(lambda k: answers.kept(k) and k in wanted)
            store.compact(answers.order)
