"""A series directory: the safety evaluations of one training run's checkpoints (`watch`, the training
callback), and what is known of each checkpoint — seen, submitted (with its SLURM job id), finished, failed, or
deleted by the trainer before its run finished.

`series.state.json` is rewritten atomically under a file lock, so the training callback and a `watch` process can
both record checkpoints, and a restarted `watch` neither submits a checkpoint twice nor misses one. Each
checkpoint's run directory is `runs/<checkpoint name>/`, an ordinary run directory the gate and report read.

A checkpoint is its weights, not its path: each entry records the content hash of the weights its run evaluated
(the run manifest's), and `checkpoint_step` and `incomplete` say what a checkpoint directory is and when it is
whole, for `watch` and for the gate's `latest` alike.

The state names the production baseline run, so the gate decides on it: with `DIAGSAFE_SIGNING_KEY` set, every
write signs it as a run directory is signed (`signature.json` of the series directory), for the series' identity
(its id, made once, and its directory) and with a sequence number that every write raises. `signed_series`
refuses a state changed since it was signed, another series' state, and a state older than the newest one this
directory has seen (`series.sequence`, written after each state: a replayed older state is caught unless that file
is rolled back with it, which only a key outside the directory's writers could rule out).
"""

from __future__ import annotations

import json
import re
import uuid
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
SEQUENCE = "series.sequence"  # "<series id> <sequence>" of the newest state written here
Status = Literal["seen", "submitted", "finished", "failed", "deleted", "skipped"]
DONE: tuple[Status, ...] = ("finished", "failed", "deleted", "skipped")
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_STEP_AT_END = re.compile(r".*?(\d+)")


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
    error: str | None = Field(None, description="Why it failed, what removed it, or that it was re-saved in place.")
    model_hash: str | None = Field(
        None, description="The content hash of the weights its run evaluated (its manifest's), once it finished."
    )


class SeriesState(Record):
    """series.state.json."""

    schema_version: int = 1
    series_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex, description="Made once, with the series; its signature binds it."
    )
    sequence: int = Field(0, ge=0, description="How many times the state was written; every write raises it.")
    checkpoint_dir: str = Field(description="The training run's output directory, watched for checkpoints.")
    config: str = Field(description="The run config every checkpoint is evaluated with (its target replaced).")
    overrides: list[str] = Field(default_factory=list, description="--set overrides applied to that config.")
    every: int | None = Field(None, description="Evaluate only checkpoints whose step is a multiple of this.")
    baseline: str | None = Field(None, description="The production model's run directory, compared with each.")
    checkpoints: dict[str, CheckpointEntry] = Field(default_factory=dict, description="By name.")

    def ordered(self) -> list[CheckpointEntry]:
        """The checkpoints by training step."""
        return sorted(self.checkpoints.values(), key=lambda c: (c.step, c.name))

    def evaluates(self, step: int) -> bool:
        """Whether the series evaluates a checkpoint of this step (`every` leaves the others out)."""
        return self.every is None or step % self.every == 0


def step_of_name(name: str) -> int | None:
    """The training step a checkpoint's name says (`checkpoint-500`, `step-500`, `global_step500`)."""
    match = _CHECKPOINT.fullmatch(name) or _STEP_AT_END.fullmatch(name)
    return int(match[1]) if match else None


def checkpoint_step(path: Path) -> int | None:
    """The training step of a checkpoint directory by its name, or None for a directory that is none (a plain
    directory is a checkpoint only when it holds a model)."""
    is_model = (path / "config.json").is_file() or (path / "adapter_config.json").is_file()
    return step_of_name(path.name) if is_trainer_checkpoint(path) or is_model else None


def is_trainer_checkpoint(path: Path) -> bool:
    """A Hugging Face Trainer's `checkpoint-N` (not a plain model directory)."""
    return _CHECKPOINT.fullmatch(path.name) is not None


def incomplete(path: Path) -> str | None:
    """Why a checkpoint is not yet whole (None: it is, as far as its files can say)."""
    from safetensors import SafetensorError, safe_open

    hf = is_trainer_checkpoint(path)
    if hf and not (path / "trainer_state.json").is_file():
        return "no trainer_state.json yet (the Trainer writes it last)"
    if not hf and not ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()):
        return "no config.json"
    weights = sorted(path.glob("*.safetensors"))
    for index in path.glob("*.safetensors.index.json"):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return f"{index.name} does not read yet"
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            return f"shard {missing[0]} of {index.name} is not there yet"
    if not weights and not any(path.glob("*.bin")):
        return "no weights yet"
    for file in weights:
        try:
            with safe_open(str(file), framework="numpy"):
                pass
        except (SafetensorError, OSError) as exc:
            return f"{file.name} is not whole yet ({exc})"
    return None


def newest_complete(state: SeriesState) -> tuple[str, int] | None:
    """(name, step) of the newest complete checkpoint on disk that the series evaluates (None: none yet)."""
    root = Path(state.checkpoint_dir)
    candidates = []
    for path in root.iterdir() if root.is_dir() else []:
        step = checkpoint_step(path) if path.is_dir() else None
        if step is not None and state.evaluates(step):
            candidates.append((step, path))
    for step, path in sorted(candidates, reverse=True):
        try:
            if incomplete(path) is None:
                return path.name, step
        except OSError:  # deleted while looked at
            continue
    return None


def state_path(series_dir: Path) -> Path:
    return series_dir / STATE


def is_series(directory: Path) -> bool:
    """Whether a directory is a series directory (not a run directory)."""
    return state_path(directory).is_file()


def read_series(series_dir: Path, raw: bytes | None = None) -> SeriesState:
    """A series directory's state, checked (a file of another version is a clear error); `raw`: its bytes as the
    caller read them (None: read here)."""
    if not is_series(series_dir) and raw is None:
        raise DiagsafeError(f"{series_dir}: not a series directory (no {STATE}; `watch` or the callback makes one)")
    return read_model(state_path(series_dir), SeriesState, "series state", raw)


def signed_as(series_dir: Path, state: SeriesState) -> str:
    """What a state's signature is made for: its series (id and directory) and its sequence."""
    return f"series {state.series_id} #{state.sequence} at {series_dir.resolve()}"


def _newest_seen(series_dir: Path) -> tuple[str, int] | None:
    """(series id, sequence) of the newest state written here, from `series.sequence` (None: none recorded)."""
    try:
        series_id, sequence = (series_dir / SEQUENCE).read_text().split()
        return series_id, int(sequence)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        raise DiagsafeError(f"{series_dir / SEQUENCE}: corrupt (expected '<series id> <sequence>')") from None


def update_series(series_dir: Path, change: Callable[[SeriesState | None], SeriesState | None]) -> SeriesState | None:
    """Read, change and write the state as one step under the series' lock (`change` gets None for a new
        series; it returns the new state, or None to leave the file as it was). Each write raises the sequence past
        every one this directory has seen, and signs the state for its series and sequence; a state that is not the
    newest here (`signed_series`) is refused, never signed again."""
    series_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(series_dir / ".series.lock"):
        current = read_series(series_dir) if is_series(series_dir) else None
        stale = _stale(series_dir, current) if current is not None else []
        if stale:  # a key holder signs only what it can tell is this series' newest state
            raise RunFailed(f"{series_dir}: " + "; ".join(stale) + "; put this series' newest state back")
        changed = change(current)
        if changed is not None:
            seen = _newest_seen(series_dir)
            floor = seen[1] if seen and seen[0] == changed.series_id else 0
            changed.sequence = max(floor, current.sequence if current else 0) + 1
            atomic.write_text(state_path(series_dir), changed.model_dump_json(indent=2) + "\n")
            signing.sign(series_dir, signed_as(series_dir, changed), [STATE])
            atomic.write_text(series_dir / SEQUENCE, f"{changed.series_id} {changed.sequence}\n")
        return changed


def signed_series(series_dir: Path, require_signature: bool) -> tuple[SeriesState, str]:
    """The state a gate or report decides on, read once, with its signature checked for this series and its
    sequence (as `signing.check_signature` checks a run's). Refused (exit 3): a state changed since it was signed,
    unsigned where a signature is required, another series' state, one older than the newest this directory has
    seen, and one that does not list every run in runs/ (a state older than its runs)."""
    with file_lock(series_dir / ".series.lock"):  # not between a writer's state and its signature
        raw = state_path(series_dir).read_bytes() if is_series(series_dir) else None
        state = read_series(series_dir, raw)
        assert raw is not None
        read = {STATE: signing.digest_of(raw)}  # the bytes parsed are the bytes checked
        path = series_dir / signing.SIGNATURE
        signed, note = signing.check_signature(
            series_dir,
            signed_as(series_dir, state),
            [STATE],
            require_signature,
            read,
            path.read_bytes() if path.is_file() else None,
        )
        problems = signed + _stale(series_dir, state) + _unlisted(series_dir, state)
        if problems:
            raise RunFailed(f"{series_dir}: refused: " + "; ".join(problems))
        return state, note


def _stale(series_dir: Path, state: SeriesState) -> list[str]:
    """Why a state is not this directory's newest by `series.sequence` (empty: as far as it can tell, it is)."""
    seen = _newest_seen(series_dir)
    if seen is not None and seen[0] != state.series_id:
        return [f"{STATE} is another series' state (series {state.series_id}; this directory's is {seen[0]})"]
    if seen is not None and seen[1] > state.sequence:
        return [f"{STATE} is an older state (sequence {state.sequence}; sequence {seen[1]} was written here)"]
    return []


def _unlisted(series_dir: Path, state: SeriesState) -> list[str]:
    """A run in runs/ the state does not list: the state is older than that run (or was edited)."""
    runs = series_dir / RUNS
    names = sorted(p.name for p in (runs.iterdir() if runs.is_dir() else []) if p.is_dir() and p.name[0] != ".")
    unlisted = [name for name in names if name not in state.checkpoints]
    return [f"{STATE} is an older state: it does not list the run {runs / unlisted[0]}"] if unlisted else []
