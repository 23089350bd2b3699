"""Hooks: a run's results, a gate's decision and a series' figures sent where people already look.

A hook is an object with a `name`, a `description` and any of `on_run_end(RunEvent)`, `on_gate(GateEvent)` and
`on_series_update(SeriesEvent)`, registered under the entry-point group `diagsafe_local.hooks` (the built-in
`mlflow` and `wandb` hooks are registered exactly so). Which hooks fire is chosen with `--hook NAME` or
`DIAGSAFE_HOOKS=mlflow,wandb` (SLURM jobs inherit it; `commands.common.fire_hooks`); each reads its own tool's settings from that tool's
environment variables (`MLFLOW_TRACKING_URI`, `WANDB_MODE`, ...).

A hook is given only a run that verified, and the gate's decision as a frozen copy. Each call runs in a process of
its own (forked: the command's memory is out of its reach) for at most `DIAGSAFE_HOOK_TIMEOUT` seconds (default
30); one that fails, ends its process or passes its time limit is one warning: it never changes a command's
outcome or the gate's exit code.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core.errors import RunFailed
from diagsafe_local.core.registry import Registry
from diagsafe_local.runs.gate import GateDecision
from diagsafe_local.runs.manifest import Manifest
from diagsafe_local.runs.passes import decided
from diagsafe_local.runs.series import SeriesFigures, SeriesPoint
from diagsafe_local.runs.series_state import RUNS, is_series
from diagsafe_local.runs.summary import Summary
from diagsafe_local.runs.verify import VerifiedRun, verify_run

log = logging.getLogger(__name__)
_STEP = re.compile(r"step-(\d+)")
TIMEOUT_VARIABLE = "DIAGSAFE_HOOK_TIMEOUT"
DEFAULT_TIMEOUT = 30.0
MAX_TIMEOUT = 86400.0  # a day: poll() overflows on far larger values


class Hook(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...


HOOKS: Registry[Hook] = Registry("hook", plugin_group="diagsafe_local.hooks")


class Unverified(RunFailed):
    """A run that does not verify: no hook is given it."""


@dataclass(frozen=True)
class RunEvent:
    """A run finished (`run`, `watch --local`, a series' SLURM task), and verified; its summary is the figures the
    gate decides on (`passes.decided`)."""

    run_dir: Path
    summary: Summary
    manifest: Manifest

    @classmethod
    def of(cls, run_dir: Path, verified: VerifiedRun | None = None) -> RunEvent:
        """The event of a run directory as verified (`verified`: the run verified already; else it is now). A run
        that does not verify raises `Unverified`: a hook is given nothing that did not verify."""
        run = verified or verify_run(run_dir)
        if run.problems:
            raise Unverified(f"{run_dir} does not verify: {run.problems[0]}")
        return cls(run_dir, decided(run).model_copy(deep=True), run.manifest.model_copy(deep=True))

    @property
    def key(self) -> str:
        """What the run is, whatever directory holds it: its run id and the content hash of its results (a run
        made again in the same directory, `run --overwrite`, is another run)."""
        return f"{self.manifest.run_id}:{self.summary.results_sha256}"

    @property
    def series_dir(self) -> Path | None:
        """The series the run belongs to (a checkpoint's run is `SERIES/runs/NAME`), if any."""
        parent = self.run_dir.resolve().parent
        return parent.parent if parent.name == RUNS and is_series(parent.parent) else None

    @property
    def step(self) -> int | None:
        """The training step of a checkpoint's run (its target is named step-N), if it is one."""
        names = list(self.summary.targets)
        match = _STEP.fullmatch(names[0]) if len(names) == 1 else None
        return int(match[1]) if match else None


class GateDecisionView(BaseModel):
    """The gate's decision as a hook sees it: a frozen copy, with the outcome the gate exits on."""

    model_config = ConfigDict(frozen=True)

    outcome: Literal["pass", "fail", "inconclusive"]
    passed: bool
    inconclusive: bool
    checks: int
    lines: tuple[str, ...]

    @classmethod
    def of(cls, decision: GateDecision) -> GateDecisionView:
        return cls(
            outcome=decision.outcome,
            passed=decision.passed,
            inconclusive=decision.inconclusive,
            checks=decision.checks,
            lines=tuple(decision.lines),
        )


@dataclass(frozen=True)
class GateEvent:
    """The gate decided on a run it verified."""

    run: RunEvent
    decision: GateDecisionView

    @classmethod
    def of(cls, run: VerifiedRun, decision: GateDecision) -> GateEvent:
        return cls(RunEvent.of(run.run_dir, run), GateDecisionView.of(decision))


@dataclass(frozen=True)
class SeriesEvent:
    """A checkpoint of a series finished, failed or was deleted: its figures were rebuilt."""

    series_dir: Path
    figures: SeriesFigures

    def runs(self, points: Iterable[SeriesPoint] | None = None) -> Iterator[tuple[SeriesPoint, RunEvent]]:
        """Each evaluated checkpoint (of `points`, default all) with its run as verified now, in step order; one
        whose run does not verify is left out, with a warning."""
        for point in self.figures.points if points is None else points:
            if point.asr is None:
                continue
            try:
                yield point, RunEvent.of(Path(point.run_dir))
            except Unverified as exc:
                log.warning("%s: not given to the hook: %s", point.name, exc)


def hook_timeout() -> float:
    """Seconds each hook call may take: `DIAGSAFE_HOOK_TIMEOUT`, or 30 (a value that is not a positive number is
    a warning, and the default; one over a day is a warning, and a day)."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        log.warning("%s=%r is not a number of seconds; hooks run with %g s", TIMEOUT_VARIABLE, text, DEFAULT_TIMEOUT)
        return DEFAULT_TIMEOUT
    if seconds > MAX_TIMEOUT:
        log.warning("%s=%r is over a day; hooks run with %g s", TIMEOUT_VARIABLE, text, MAX_TIMEOUT)
        return MAX_TIMEOUT
    return seconds


def fire(method: str, event: Callable[[], Any], names: Iterable[str]) -> None:
    """Call `method` of each named hook with the event `event()` makes, each in a process of its own within the
    time limit; a run that does not verify reaches no hook, and a hook that fails (or is unknown) is a warning."""
    try:
        made = event()
    except Unverified as exc:
        log.warning("hooks not called: %s", exc)
        return
    timeout = hook_timeout()
    for name in names:
        try:
            problem = _call(name, method, made, timeout)
        except Exception as exc:  # a hook never changes what a command decided, nor its exit code
            problem = f"could not be run: {type(exc).__name__}: {exc}"
        if problem is not None:
            log.warning("hook %s: %s %s", name, method, problem)


def _call(name: str, method: str, event: Any, timeout: float) -> str | None:
    """Run one hook's `method` in a forked process; what went wrong (None: nothing)."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_in_child, args=(name, method, event, send), name=f"hook {name}")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # else the child writes what the command has buffered a second time
    deadline = time.monotonic() + timeout
    process.start()
    send.close()
    try:
        if not receive.poll(timeout):
            return f"passed its time limit of {timeout:g} s ({TIMEOUT_VARIABLE}) and was stopped"
        try:
            problem: str | None = receive.recv()
        except EOFError:
            process.join()
            return f"failed: its process ended with exit code {process.exitcode}"
        process.join(max(0.0, deadline - time.monotonic()))  # the child's own clean-up, within the limit
        return None if problem is None else f"failed: {problem}"
    finally:
        receive.close()
        if process.is_alive():
            process.kill()
        process.join()


def _in_child(name: str, method: str, event: Any, send: Connection) -> None:
    """The hook's process: load the hook, call it, send back what went wrong (None: nothing)."""
    try:
        call = getattr(HOOKS.get(name), method, None)
        if call is not None:
            call(event)
        send.send(None)
    except BaseException as exc:  # a hook (even one that calls sys.exit) never changes what a command decided
        send.send(f"{type(exc).__name__}: {exc}")
