"""Watching a training run: its checkpoints found as they are saved, each complete one evaluated (submitted to
SLURM as an array job, or run here one after another), and where each stands kept in a series directory
(`runs.series_state`).

A checkpoint is a Hugging Face `checkpoint-N` directory, or a model directory whose name ends in its step
(`step-1000`, `global_step1000`). It is complete only when the trainer has finished writing it: a `checkpoint-N`
has `trainer_state.json` (the Trainer writes it after the weights, optimizer and RNG state), and every weight
file is whole (each safetensors file's header covers the file; a sharded model's index names only shards that
are there and whole); a plain model directory must also have stayed unchanged between two scans at least
`settle` seconds apart (nothing says when its writer is done). A checkpoint that disappears before its run
finished (the trainer's `save_total_limit`) is recorded as deleted. A checkpoint is its weights: one whose weights
changed since its run (the trainer re-saved it in place) is evaluated again, its old run moved to runs/.resaved/.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from diagsafe_local.core import model_files
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.core.fingerprint import cached_fingerprint
from diagsafe_local.core.resources import slurm_file
from diagsafe_local.evaluation.config import RunConfig, load_config
from diagsafe_local.evaluation.slurm import Resources, sbatch
from diagsafe_local.runs.files import RUN_LOG
from diagsafe_local.runs.manifest import read_manifest_file
from diagsafe_local.runs.series_state import (
    DONE,
    RUNS,
    STOP,
    CheckpointEntry,
    SeriesState,
    checkpoint_step,
    incomplete,
    is_trainer_checkpoint,
    now,
    read_series,
    update_series,
)

RESAVED = ".resaved"  # runs/.resaved/: the runs of weights a checkpoint no longer holds (re-saved in place)

Mode = Literal["submit", "local"]


@dataclass(frozen=True)
class Checkpoint:
    name: str
    step: int
    path: Path


def _signature(path: Path) -> tuple:
    return tuple(
        sorted(
            (str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()
        )
    )


class Scanner:
    """Finds the complete checkpoints of a directory; a plain model directory must look the same at two scans
    `settle` seconds apart. Knows each checkpoint's weights by content (`cached_fingerprint`)."""

    def __init__(self, directory: Path, settle: float, load_format: str = "auto") -> None:
        self.directory, self.settle, self.load_format = directory, settle, load_format
        self._seen: dict[Path, tuple[tuple, float]] = {}

    def complete(self) -> list[Checkpoint]:
        found = []
        for path in sorted(self.directory.iterdir()) if self.directory.is_dir() else []:
            step = checkpoint_step(path) if path.is_dir() else None
            if step is None:
                continue
            try:
                if incomplete(path) is not None:
                    continue
                signature = _signature(path)
            except OSError:  # deleted while looked at
                continue
            if not is_trainer_checkpoint(path):
                before = self._seen.get(path)
                if before is None or before[0] != signature:
                    self._seen[path] = (signature, time.monotonic())
                    if self.settle > 0:
                        continue
                elif time.monotonic() - before[1] < self.settle:
                    continue
            found.append(Checkpoint(path.name, step, path.resolve()))
        return found

    def weights(self, path: Path) -> str | None:
        """The checkpoint's content hash, as a run's manifest records it (None: it is gone)."""
        return cached_fingerprint(str(path), self.load_format)


class SeriesSpec:
    """What a series evaluates every checkpoint with: the run config (one target, replaced by each
    checkpoint), overrides, a step filter, and the production baseline."""

    def __init__(
        self,
        series_dir: Path,
        checkpoint_dir: Path,
        config: Path,
        overrides: list[str] | None = None,
        every: int | None = None,
        baseline: Path | None = None,
    ) -> None:
        self.series_dir = series_dir.resolve()
        self.checkpoint_dir = checkpoint_dir.resolve()
        self.config = config.resolve()
        self.overrides = list(overrides or [])
        self.every = every
        self.baseline = baseline.resolve() if baseline else None
        parsed = load_config(self.config, self.overrides)  # a bad config stops here, before anything is written
        if len(parsed.targets) != 1:
            raise DiagsafeError(
                f"{config}: a series evaluates each checkpoint as the config's one target; it has {len(parsed.targets)}"
            )
        self.load_format = model_files.load_format(parsed.targets[0])  # what its runs hash of a checkpoint

    def state(self, current: SeriesState | None) -> SeriesState:
        """The series' state: a new one, or the existing one if it is this series (else an error)."""
        fresh = SeriesState(
            checkpoint_dir=str(self.checkpoint_dir),
            config=str(self.config),
            overrides=self.overrides,
            every=self.every,
            baseline=str(self.baseline) if self.baseline else None,
        )
        if current is None:
            return fresh
        kept = {"checkpoints", "series_id", "sequence"}  # what a series keeps of its own
        mine, theirs = fresh.model_dump(exclude=kept), current.model_dump(exclude=kept)
        different = [k for k in mine if mine[k] != theirs[k]]
        if different:
            raise DiagsafeError(
                f"{self.series_dir} is the series of another setup ({', '.join(different)} differ: "
                f"{', '.join(f'{theirs[k]!r}' for k in different)}); use another series directory"
            )
        return current

    def run_config(self, checkpoint: CheckpointEntry) -> RunConfig:
        return load_config(self.config, [*self.overrides, *_target_settings(checkpoint)])


def _target_settings(entry: CheckpointEntry) -> list[str]:
    return [f"target.model={entry.path}", f"target.name=step-{entry.step}", f"output_dir={entry.run_dir}"]


def record(spec: SeriesSpec, checkpoints: list[Checkpoint]) -> list[CheckpointEntry]:
    """Add checkpoints not yet in the series (skipped where `every` leaves them out); returns the new entries."""
    added: list[CheckpointEntry] = []

    def change(current: SeriesState | None) -> SeriesState:
        state = spec.state(current)
        for c in checkpoints:
            if c.name in state.checkpoints:
                continue
            skip = spec.every is not None and c.step % spec.every != 0
            entry = CheckpointEntry(
                name=c.name,
                step=c.step,
                path=str(c.path),
                status="skipped" if skip else "seen",
                run_dir=str(spec.series_dir / RUNS / c.name),
                seen=now(),
                updated=now(),
                error=f"step {c.step} is not a multiple of --every {spec.every}" if skip else None,
            )
            state.checkpoints[c.name] = entry
            added.append(entry)
        return state

    update_series(spec.series_dir, change)
    return added


def set_status(series_dir: Path, name: str, status: str, **fields: Any) -> None:
    def change(current: SeriesState | None) -> SeriesState:
        assert current is not None
        entry = current.checkpoints[name]
        current.checkpoints[name] = entry.model_copy(update={"status": status, "updated": now(), **fields})
        return current

    update_series(series_dir, change)


def _finished(entry: CheckpointEntry) -> bool:
    try:
        return read_manifest_file(Path(entry.run_dir)).status == "complete"
    except (DiagsafeError, OSError):
        return False


def _evaluated(entry: CheckpointEntry) -> str | None:
    """The content hash of the weights its run evaluated, as the run's manifest records it (None: unknown)."""
    try:
        targets = list(read_manifest_file(Path(entry.run_dir)).targets.values())
    except (DiagsafeError, OSError):
        return None
    return targets[0].model_hash if len(targets) == 1 else None


def resaved(spec: SeriesSpec, scanner: Scanner, found: list[Checkpoint], say: Callable[[str], None]) -> None:
    """Each finished checkpoint whose weights are no longer those its run evaluated (re-saved in place) is seen
    anew, to be evaluated again; its run is moved to runs/.resaved/."""
    state = read_series(spec.series_dir)
    for checkpoint in found:
        entry = state.checkpoints.get(checkpoint.name)
        if entry is None or entry.status != "finished":
            continue
        evaluated = entry.model_hash or _evaluated(entry)
        current = scanner.weights(checkpoint.path)
        if current is None or current == evaluated:
            continue
        aside = spec.series_dir / RUNS / RESAVED / f"{entry.name}-{time.strftime('%Y%m%dT%H%M%S')}"
        if Path(entry.run_dir).exists():
            aside.parent.mkdir(parents=True, exist_ok=True)
            Path(entry.run_dir).rename(aside)
        error = f"re-saved in place: its weights are {current}; its run of {evaluated} is now {aside}"
        set_status(spec.series_dir, entry.name, "seen", error=error, model_hash=None, job_id=None)
        say(f"{entry.name}: its weights changed since its run (re-saved in place): it is evaluated again")


def _live_jobs(job_ids: list[str]) -> set[str] | None:
    """The jobs (array tasks) of `job_ids` that SLURM still has queued or running (None: squeue could not say)."""
    arrays = sorted({j.split("_")[0] for j in job_ids})
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-r", "-o", "%i", "-j", ",".join(arrays)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        # squeue refuses ids it no longer knows (every task ended and was purged): none is live
        return set() if "Invalid job id" in proc.stderr else None
    return set(proc.stdout.split())


def refresh(series_dir: Path) -> None:
    """Bring each unfinished checkpoint's status up to date: finished when its run directory is complete; a
    submitted one whose job ended without that failed; one whose directory was deleted first is deleted."""
    state = read_series(series_dir)
    open_entries = [e for e in state.ordered() if e.status in ("seen", "submitted")]
    submitted = [e.job_id for e in open_entries if e.status == "submitted" and e.job_id]
    live = _live_jobs(submitted) if submitted else set()
    for entry in open_entries:
        fields: dict[str, Any] = {}
        if _finished(entry):
            status, error, fields = "finished", None, {"model_hash": _evaluated(entry)}
        elif not Path(entry.path).exists():
            status, error = "deleted", "the checkpoint was deleted before its run finished (save_total_limit?)"
        elif entry.status == "submitted" and live is not None and entry.job_id not in live:
            status, error = (
                "failed",
                f"job {entry.job_id} ended without a complete run: see "
                f"{series_dir / 'slurm-logs' / f'diagsafe-series-{entry.job_id}.out'}",
            )
        else:
            continue
        set_status(series_dir, entry.name, status, error=error, **fields)


def submit(spec: SeriesSpec, entries: list[CheckpointEntry], resources: Resources) -> str:
    """One array job for `entries` (task k evaluates the k-th); each entry is marked submitted with its task's
    job id. Returns the array's job id."""
    logs = spec.series_dir / "slurm-logs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    tasks = logs / f"tasks-{stamp}-{entries[0].name}.tsv"
    tasks.write_text("".join(f"{e.path}\tstep-{e.step}\t{e.run_dir}\n" for e in entries))
    args = [
        f"--array=0-{len(entries) - 1}",
        "--job-name=diagsafe-series",
        resources.export(),
        *resources.sbatch_args,
        *([f"--partition={resources.partition}"] if resources.partition else []),
        "--nodes=1",
        *resources.gpu_args(),
        f"--cpus-per-task={resources.cpus_per_task}",
        f"--mem={resources.mem}",
        f"--time={resources.time}",
        f"--output={logs}/%x-%A_%a.out",
        str(slurm_file("series.sbatch")),
        str(spec.config),
        str(tasks),
        *[arg for o in spec.overrides for arg in ("--set", o)],
    ]
    array = sbatch(args)
    for k, entry in enumerate(entries):
        set_status(spec.series_dir, entry.name, "submitted", job_id=f"{array}_{k}")
    return array


def run_here(
    spec: SeriesSpec,
    entry: CheckpointEntry,
    say: Callable[[str], None],
    after_run: Callable[[Path], None] | None = None,
) -> None:
    """Evaluate one checkpoint in this process; its status says how it went."""
    from diagsafe_local.core.console import engine_output
    from diagsafe_local.evaluation.pipeline import Run
    from diagsafe_local.runs.report import write_report

    say(f"evaluating {entry.name} (step {entry.step}) into {entry.run_dir}")
    try:
        run = Run(spec.run_config(entry))
        run.prepare()  # the run directory first: its run.log takes the engines' output, as with `run`
        with engine_output(run.dir.root / RUN_LOG) as console:
            run.on_progress = console.progress
            run.execute()
        write_report(Path(entry.run_dir))  # as `run` writes it: what a hook files with the run
    except DiagsafeError as exc:
        gone = not Path(entry.path).exists()
        status = "deleted" if gone else "failed"
        error = "the checkpoint was deleted while it was evaluated" if gone else str(exc)
        set_status(spec.series_dir, entry.name, status, error=error)
        say(f"{entry.name}: {status}: {error}")
        return
    set_status(spec.series_dir, entry.name, "finished", error=None, model_hash=_evaluated(entry))
    say(f"{entry.name}: finished")
    if after_run is not None:
        after_run(Path(entry.run_dir))


def _done(series_dir: Path) -> int:
    return sum(e.status in DONE for e in read_series(series_dir).checkpoints.values())


class Stop:
    """Why `watch` stops: SIGTERM or SIGINT, the sentinel file, or every checkpoint up to --until-step done."""

    def __init__(self, series_dir: Path, until_step: int | None) -> None:
        self.series_dir, self.until_step = series_dir, until_step
        self.signalled: str | None = None

    @contextmanager
    def on_signals(self) -> Iterator[None]:
        def note(signum: int, _frame: object) -> None:
            self.signalled = signal.Signals(signum).name

        previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def reason(self) -> str | None:
        if self.signalled:
            return f"{self.signalled} received"
        if (self.series_dir / STOP).exists():
            return f"{self.series_dir / STOP} exists"
        if self.until_step is not None:
            entries = read_series(self.series_dir).ordered()
            reached = any(e.step >= self.until_step for e in entries)
            if reached and all(e.status in DONE for e in entries if e.step <= self.until_step):
                return f"every checkpoint up to step {self.until_step} is done"
        return None


def watch(
    spec: SeriesSpec,
    mode: Mode,
    *,
    resources: Resources | None = None,
    until_step: int | None = None,
    interval: float = 60.0,
    settle: float = 30.0,
    once: bool = False,
    say: Callable[[str], None] = print,
    on_update: Callable[[Path], None] | None = None,
    after_run: Callable[[Path], None] | None = None,
) -> str:
    """Watch until told to stop (see `Stop`); returns why it stopped. Each pass: record the complete
    checkpoints, update the statuses, see anew the checkpoints re-saved in place (`resaved`), evaluate what is
    new (`submit`: one array job for all of them; `local`: one after another, here, `after_run` called with each
    finished run directory), and call `on_update` when a checkpoint is done."""
    scanner = Scanner(spec.checkpoint_dir, settle, spec.load_format)
    stop = Stop(spec.series_dir, until_step)
    with stop.on_signals():  # before the first write: a SIGTERM from here on stops it cleanly
        update_series(spec.series_dir, spec.state)
        done_before = _done(spec.series_dir)
        while True:
            found = scanner.complete()
            for entry in record(spec, found):
                say(f"found {entry.name} (step {entry.step})" + (f": skipped, {entry.error}" if entry.error else ""))
            refresh(spec.series_dir)
            resaved(spec, scanner, found, say)
            todo = [
                e
                for e in read_series(spec.series_dir).ordered()
                if e.status == "seen" and (until_step is None or e.step <= until_step)
            ]
            if todo and mode == "submit":
                array = submit(spec, todo, resources or Resources())
                say(f"submitted {', '.join(e.name for e in todo)} as array job {array}")
            elif mode == "local":
                for entry in todo:
                    if stop.reason():
                        break
                    run_here(spec, entry, say, after_run)
            done = _done(spec.series_dir)
            if done > done_before and on_update is not None:
                on_update(spec.series_dir)
            done_before = done
            reason = stop.reason() or ("one pass asked (--once)" if once else None)
            if reason:
                return reason
            deadline = time.monotonic() + interval
            while time.monotonic() < deadline and not stop.reason():
                time.sleep(min(1.0, interval))
