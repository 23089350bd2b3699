"""The grammar canary, a pass: every engine that decodes verdicts under a schema is asked the canary
(`judging.canary`) once it is loaded, before it judges, and the run keeps the outcome in its manifest."""

from __future__ import annotations

import logging
from weakref import WeakSet

from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.passes.base import JUDGE, JudgingPass, Poll, Runner, Seat
from diagsafe_local.judging.canary import ask_canary
from diagsafe_local.runs.manifest import GrammarCanary

log = logging.getLogger(__name__)


def send_canary(
    judge: Engine, backend: str | None, previous: GrammarCanary | None, juror: str | None = None
) -> GrammarCanary:
    """Send the grammar canary to the judge engine (or to jury member `juror`'s). A run whose canary ever failed
    stays failed: the verdicts made meanwhile are in its stores and would be reused (`run --overwrite` starts
    again)."""
    held, answer = ask_canary(judge)
    versions = ", ".join(f"{name} {version}" for name, version in judge.info.versions.items() if version)
    outcome = GrammarCanary(
        enforced=held,
        engine=(f"jury member {juror}: " if juror else "") + f"{judge.info.kind} ({versions or 'versions unknown'})",
        backend=backend,
        reply=answer[:200],
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


class CanaryPass(JudgingPass):
    """Asks each engine the canary when a constrained seat first works on it: the judge's at every load (a
    resumed run asks again), a jury member's engine once, however many members it serves."""

    name = "grammar canary"

    def __init__(self) -> None:
        self.asked: WeakSet[Engine] = WeakSet()  # by the engine object: a closed engine's id may come again

    def needs_judge(self, run: Runner) -> bool:
        return run.config.judge.own_constrained and run.grammar is None

    def start(self, run: Runner, seat: Seat, engine: Engine | None) -> Poll | None:
        if engine is None or not seat.config.own_constrained or engine in self.asked:
            return None
        juror = None if seat.role == JUDGE else seat.label
        run.grammar = send_canary(engine, seat.config.structured_output_backend, run.grammar, juror)
        self.asked.add(engine)
        run.save_manifest("running")
        return None
