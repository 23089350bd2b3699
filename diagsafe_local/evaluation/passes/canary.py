"""The grammar canary, a pass: every engine that decodes verdicts under a schema is asked the canary
(`judging.canary`) once it is loaded, and the run keeps the outcome in its manifest. On the judge's engine the
canary is sent with the first verdicts and decoded in their engine steps (alone, its ~40 tokens would cost ~40
steps of an engine that decodes one request); its outcome is recorded before any of those verdicts is."""

from __future__ import annotations

import logging
from weakref import WeakSet

from diagsafe_local.engines.base import Engine
from diagsafe_local.engines.streams import Stream, open_stream
from diagsafe_local.evaluation.config import TargetConfig
from diagsafe_local.evaluation.passes.base import JUDGE, JudgingPass, Poll, Runner, Seat
from diagsafe_local.judging.canary import canary_request, read_reply
from diagsafe_local.runs.manifest import GrammarCanary

log = logging.getLogger(__name__)


def canary_outcome(
    judge: Engine, backend: str | None, previous: GrammarCanary | None, held: bool, reply: str, juror: str | None
) -> GrammarCanary:
    """The outcome the run records of the canary's reply from the judge engine (or jury member `juror`'s). A run
    whose canary ever failed stays failed: the verdicts made meanwhile are in its stores and would be reused
    (`run --overwrite` starts again)."""
    versions = ", ".join(f"{name} {version}" for name, version in judge.info.versions.items() if version)
    outcome = GrammarCanary(
        enforced=held,
        engine=(f"jury member {juror}: " if juror else "") + f"{judge.info.kind} ({versions or 'versions unknown'})",
        backend=backend,
        reply=reply[:200],
    )
    if not outcome.enforced:
        log.warning(
            "the judge engine did not apply the grammar canary's schema (%s, backend %s; it replied %r): its "
            "verdicts are not decoded under their schema, and the gate will refuse this run",
            outcome.engine,
            backend,
            outcome.reply[:80],
        )
    if previous is not None and not previous.enforced:
        return previous
    return outcome


class CanaryRequest:
    """The canary in flight on one engine, in a stream of its own: `finish` steps the engine until its reply is
    in (the requests submitted beside it advance in the same steps; on a shared scheduler their results wait in
    their own streams, and slots freed meanwhile are refilled once it is in: at most its ~40 steps later) and
    records the outcome. An engine that raises instead of answering (a plugin's) did not apply the schema."""

    def __init__(self, run: Runner, engine: Engine, seat: Seat) -> None:
        self.run, self.engine, self.seat = run, engine, seat
        self.stream: Stream | None = None
        try:
            self.stream = open_stream(engine, 1)
            self.stream.submit(0, canary_request())
        except Exception as exc:
            self._record(False, f"{type(exc).__name__}: {exc}")

    def finish(self) -> None:
        while self.stream is not None:
            try:
                done = self.stream.poll()
            except Exception as exc:
                self._record(False, f"{type(exc).__name__}: {exc}")
                return
            if done:
                self._record(*read_reply(done[0][1]))

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    def _record(self, held: bool, reply: str) -> None:
        self.close()
        juror = None if self.seat.role == JUDGE else self.seat.label
        backend = self.seat.config.structured_output_backend
        self.run.grammar = canary_outcome(self.engine, backend, self.run.grammar, held, reply, juror)
        self.run.save_manifest("running")


class CanaryPass(JudgingPass):
    """Asks each engine the canary when a constrained seat first works on it: the judge's at every load (a
    resumed run asks again), beside its first verdicts (its poll, the first stepped with them, finishes it);
    a jury member's engine once, however many members it serves, before the member judges."""

    name = "grammar canary"

    def __init__(self) -> None:
        self.asked: WeakSet[Engine] = WeakSet()  # by the engine object: a closed engine's id may come again
        self.request: CanaryRequest | None = None

    def needs_judge(self, run: Runner) -> bool:
        return run.config.judge.own_constrained and run.grammar is None

    def start(self, run: Runner, seat: Seat, engine: Engine | None) -> Poll | None:
        if engine is None or not seat.config.own_constrained or engine in self.asked:
            return None
        self.asked.add(engine)
        request = CanaryRequest(run, engine, seat)
        if seat.role != JUDGE:
            request.finish()
            return None
        self.request = request
        return request.finish

    def target_judged(self, run: Runner, engine: Engine | None, target: TargetConfig) -> None:
        self.settle()  # before an attack's verdicts: it steps no poll of the passes

    def settle(self) -> None:
        if self.request is not None:
            self.request.finish()

    def close(self) -> None:
        if self.request is not None:
            self.request.close()
