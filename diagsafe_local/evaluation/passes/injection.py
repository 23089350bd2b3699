"""The policy-injection canary, a pass (`runs.injection`): when the judge's engine is loaded, the harm judge is
asked about each canary answer not yet judged (or whose verdict erred), and each verdict is stored with the
judge's score rule (injection_canary.jsonl). A few requests per run; the gate decides from the replies."""

from __future__ import annotations

from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.passes.base import JUDGE, JudgingPass, Poll, Runner, Seat
from diagsafe_local.judging.base import JUDGES, JudgeInput
from diagsafe_local.judging.rubrics import Rubric
from diagsafe_local.judging.verdicts import VerdictStream
from diagsafe_local.runs.injection import CANARIES, Canary
from diagsafe_local.runs.records import InjectionRecord


class InjectionCanaryPass(JudgingPass):
    """The canaries without a verdict (or with an erred one), on the judge's engine."""

    name = "injection_canary"

    @classmethod
    def cost(cls, config: RunConfig) -> str | None:
        if not config.judge.injection_canary:
            return None
        return f"policy-injection canary: {len(CANARIES)} more verdicts per run (the judge's, once)"

    def _pending(self, run: Runner) -> tuple[JsonlStore[InjectionRecord], list[Canary]]:
        store = run.ctx.directory.store(InjectionRecord)
        if not run.config.judge.injection_canary:
            return store, []
        name = run.config.judge.rubric_name
        done = {c.canary for c in store.values() if c.judge == name and c.parse_status != "error"}
        return store, [c for c in CANARIES if c.id not in done]

    def needs_judge(self, run: Runner) -> bool:
        return bool(self._pending(run)[1])

    def start(self, run: Runner, seat: Seat, engine: Engine | None) -> Poll | None:
        store, pending = self._pending(run)
        if seat.role != JUDGE or engine is None or not pending:
            return None
        judge = run.config.judge
        rubric = JUDGES.get(judge.rubric_name)
        assert isinstance(rubric, Rubric) and rubric.score_rule is not None  # the config allows no other judge
        stream = VerdictStream(engine, judge.decoding(), judge.sampling.seed, judge.max_attempts, judge.batch_size)
        try:
            for canary in pending:
                shown = JudgeInput(conversation=(Message(role="user", content=canary.request),), answer=canary.answer)
                stream.submit(canary.id, rubric, shown, ("injection canary", canary.id))
            while stream.pending:
                store.append(
                    InjectionRecord(
                        run_id=run.ctx.run_id,
                        canary=canary_id,
                        judge=rubric.name,
                        rule=rubric.score_rule,
                        score=verdict.outcome.score,
                        parse_status=verdict.outcome.status,
                        judge_raw=verdict.completion.text if verdict.completion else verdict.outcome.error,
                    )
                    for canary_id, verdict in stream.poll()
                )
        finally:
            stream.close()
        return None
