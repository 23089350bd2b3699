"""Hooks: a run's results, a gate's decision and a series' figures sent where people already look.

A hook is an object with a `name`, a `description` and any of `on_run_end(RunEvent)`, `on_gate(GateEvent)` and
`on_series_update(SeriesEvent)`, registered under the entry-point group `diagsafe_local.hooks` (the built-in
`mlflow` and `wandb` hooks are registered exactly so). Which hooks fire is chosen with `--hook NAME` or
`DIAGSAFE_HOOKS=mlflow,wandb` (SLURM jobs inherit it; `commands.common.fire_hooks`); each reads its own tool's settings from that tool's
environment variables (`MLFLOW_TRACKING_URI`, `WANDB_MODE`, ...). A hook that fails, at loading or at work, is
one warning: it never changes a command's outcome or the gate's exit code.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from diagsafe_local.core.errors import Interrupted
from diagsafe_local.core.registry import Registry
from diagsafe_local.runs.gate import GateDecision
from diagsafe_local.runs.manifest import Manifest
from diagsafe_local.runs.series import SeriesFigures
from diagsafe_local.runs.series_state import RUNS, is_series
from diagsafe_local.runs.summary import Summary
from diagsafe_local.runs.verify import VerifiedRun, verify_run

log = logging.getLogger(__name__)
_STEP = re.compile(r"step-(\d+)")


class Hook(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...


HOOKS: Registry[Hook] = Registry("hook", plugin_group="diagsafe_local.hooks")


@dataclass(frozen=True)
class RunEvent:
    """A run finished (`run`, `watch --local`, a series' SLURM task)."""

    run_dir: Path
    summary: Summary
    manifest: Manifest

    @classmethod
    def of(cls, run_dir: Path, verified: VerifiedRun | None = None) -> RunEvent:
        """The event of a run directory as verified (`verified`: the run verified already; else it is now: a
        hook is given nothing that did not verify)."""
        run = verified or verify_run(run_dir)
        return cls(run_dir, run.summary, run.manifest)

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


@dataclass(frozen=True)
class GateEvent:
    """The gate decided on a run it verified."""

    run: RunEvent
    decision: GateDecision


@dataclass(frozen=True)
class SeriesEvent:
    """A checkpoint of a series finished, failed or was deleted: its figures were rebuilt."""

    series_dir: Path
    figures: SeriesFigures


def fire(method: str, event: Any, names: Iterable[str]) -> None:
    """Call `method` of each named hook with `event`; a hook that fails (or is unknown) is one warning."""
    for name in names:
        try:
            hook = HOOKS.get(name)
            call = getattr(hook, method, None)
            if call is not None:
                call(event)
        except (KeyboardInterrupt, Interrupted):
            raise  # the user's interrupt is still an interrupt
        except BaseException as exc:  # a hook (even one that calls sys.exit) never changes what a command decided
            log.warning("hook %s: %s failed: %s: %s", name, method, type(exc).__name__, exc)
