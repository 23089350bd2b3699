"""The policy-injection canary, a pass (`runs.injection`): when the judge's engine is loaded, the harm judge is
asked about each canary answer not yet judged (or whose verdict erred), stepped beside the run's verdicts; each
verdict is stored with the judge's score rule where it is a policy judge (injection_canary.jsonl). A few requests per run; the gate decides
from the replies."""

from __future__ import annotations

from collections.abc import Callable

from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.passes.base import JUDGE, JudgingPass, Poll, Runner, Seat
from diagsafe_local.judging.base import JUDGES, JudgeInput
from diagsafe_local.judging.rubrics import Rubric
from diagsafe_local.judging.verdicts import Verdict, VerdictStream
from diagsafe_local.runs.injection import CANARIES, Canary
from diagsafe_local.runs.records import InjectionRecord


class InjectionCanaryPass(JudgingPass):
    """The canaries without a verdict (or with an erred one), on the judge's engine: submitted when it is
    ready and stepped beside the run's verdicts (as the controls are), finished before it sleeps."""

    name = "injection_canary"

    def __init__(self) -> None:
        self.stream: VerdictStream | None = None
        self.store: JsonlStore[InjectionRecord] | None = None
        self.record: Callable[[str, Verdict], InjectionRecord] | None = None

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
        self.settle()  # a stream of an earlier load of the judge is finished first
        store, pending = self._pending(run)
        if seat.role != JUDGE or engine is None or not pending:
            return None
        judge = run.config.judge
        rubric = JUDGES.get(judge.rubric_name)
        rule, run_id = rubric.score_rule if isinstance(rubric, Rubric) else None, run.ctx.run_id

        def record(canary: str, verdict: Verdict) -> InjectionRecord:
            return InjectionRecord(
                run_id=run_id,
                canary=canary,
                judge=rubric.name,
                rule=rule,
                score=verdict.outcome.score,
                parse_status=verdict.outcome.status,
                judge_raw=verdict.reply,
            )

        self.close()
        self.store, self.record = store, record
        self.stream = VerdictStream(engine, judge.decoding(), judge.sampling.seed, judge.max_attempts, len(pending))
        for canary in pending:
            shown = JudgeInput(conversation=(Message(role="user", content=canary.request),), answer=canary.answer)
            self.stream.submit(canary.id, rubric, shown, ("injection canary", canary.id))
        return self.poll

    def poll(self) -> None:
        """Store the canaries' verdicts that one step of the engine finished."""
        if self.stream is None or self.store is None or self.record is None or not self.stream.pending:
            return
        finished = self.stream.poll()
        if finished:
            self.store.append(self.record(k, v) for k, v in finished)

    def settle(self) -> None:
        while self.stream is not None and self.stream.pending:
            self.poll()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
