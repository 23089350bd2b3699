"""A series directory: the safety evaluations of one training run's checkpoints (`watch`, the training
callback), and what is known of each checkpoint — seen, submitted (with its SLURM job id), finished, failed, or
deleted by the trainer before its run finished.

`series.state.json` is rewritten atomically under a file lock, so the training callback and a `watch` process can
both record checkpoints, and a restarted `watch` neither submits a checkpoint twice nor misses one. Each
checkpoint's run directory is `runs/<checkpoint name>/`, an ordinary run directory the gate and report read.

The state names which checkpoint is the latest and which run is the production baseline, so the gate decides on
it: with `DIAGSAFE_SIGNING_KEY` set, every write signs it as a run directory is signed (`signature.json` of the
series directory), and `gate SERIES --require-signature` refuses a state changed since (`signed_series`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field

from diagsafe_local.core import atomic, signing
from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.jsonfile import read_model
from diagsafe_local.core.locking import file_lock
from diagsafe_local.runs.records import Record

STATE = "series.state.json"
SERIES_JSON = "series.json"
RUNS = "runs"
STOP = "STOP"  # a file of this name in the series directory stops `watch`
SIGNED_AS = "series"  # the id its signature is made for (a run's is its run id)
Status = Literal["seen", "submitted", "finished", "failed", "deleted", "skipped"]
DONE: tuple[Status, ...] = ("finished", "failed", "deleted", "skipped")


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class CheckpointEntry(Record):
    """One checkpoint of the training run, and where its evaluation stands."""

    name: str = Field(description="Its directory's name (checkpoint-500).")
    step: int = Field(ge=0, description="The training step it was saved at.")
    path: str = Field(description="Its directory.")
    status: Status
    run_dir: str = Field(description="Its run directory (runs/<name>/ of the series).")
    job_id: str | None = Field(None, description="The SLURM job (array task) that evaluates it, when submitted.")
    seen: str = Field(description="When it was first seen complete (UTC).")
    updated: str = Field(description="When its status last changed (UTC).")
    error: str | None = Field(None, description="Why it failed, or what removed it.")


class SeriesState(Record):
    """series.state.json."""

    schema_version: int = 1
    checkpoint_dir: str = Field(description="The training run's output directory, watched for checkpoints.")
    config: str = Field(description="The run config every checkpoint is evaluated with (its target replaced).")
    overrides: list[str] = Field(default_factory=list, description="--set overrides applied to that config.")
    every: int | None = Field(None, description="Evaluate only checkpoints whose step is a multiple of this.")
    baseline: str | None = Field(None, description="The production model's run directory, compared with each.")
    checkpoints: dict[str, CheckpointEntry] = Field(default_factory=dict, description="By name.")

    def ordered(self) -> list[CheckpointEntry]:
        """The checkpoints by training step."""
        return sorted(self.checkpoints.values(), key=lambda c: (c.step, c.name))


def state_path(series_dir: Path) -> Path:
    return series_dir / STATE


def is_series(directory: Path) -> bool:
    """Whether a directory is a series directory (not a run directory)."""
    return state_path(directory).is_file()


def read_series(series_dir: Path) -> SeriesState:
    """A series directory's state, checked (a file of another version is a clear error)."""
    if not is_series(series_dir):
        raise DiagsafeError(f"{series_dir}: not a series directory (no {STATE}; `watch` or the callback makes one)")
    return read_model(state_path(series_dir), SeriesState, "series state")


def update_series(series_dir: Path, change: Callable[[SeriesState | None], SeriesState | None]) -> SeriesState | None:
    """Read, change and write the state as one step under the series' lock (`change` gets None for a new
    series; it returns the new state, or None to leave the file as it was)."""
    series_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(series_dir / ".series.lock"):
        current = read_series(series_dir) if is_series(series_dir) else None
        changed = change(current)
        if changed is not None:
            atomic.write_text(state_path(series_dir), changed.model_dump_json(indent=2) + "\n")
            signing.sign(series_dir, SIGNED_AS, [STATE])
        return changed


def signed_series(series_dir: Path, require_signature: bool) -> tuple[SeriesState, str]:
    """The state a gate decides on, with its signature checked (as `signing.check_signature` checks a run's): one
    changed since it was signed, or unsigned where a signature is required, is refused (exit 3)."""
    with file_lock(series_dir / ".series.lock"):  # not between a writer's state and its signature
        problems, note = signing.check_signature(series_dir, SIGNED_AS, [STATE], require_signature)
        if problems:
            raise RunFailed(f"{series_dir}: refused: " + "; ".join(problems))
        return read_series(series_dir), note
