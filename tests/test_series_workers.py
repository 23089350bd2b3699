"""A series report verifies its checkpoints' runs in worker processes: the same documents as in one process, and
what does not verify, or cannot be read, said as in one."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from multiprocessing.context import ForkProcess
from pathlib import Path

import pytest
from fakes import ScriptedEngine
from test_series import by_step, checkpoint, recorded_series, watch
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.cpus import usable_cpus
from diagsafe_local.core.errors import DataError, RunFailed
from diagsafe_local.runs import series
from diagsafe_local.runs.series import write_series_report


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A series of five checkpoints (made once, by scripted engines): one whose results were damaged, one whose
    weights were saved again since its run, one whose run is still being written, two that verify."""
    tmp_path = tmp_path_factory.mktemp("series")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "diagsafe_local.evaluation.pipeline.create_engine",
            lambda config, **_: ScriptedEngine(lambda r: by_step(r, config.model), model=config.model),
        )
        train, spec = recorded_series(tmp_path)  # checkpoints 10 and 20
        for step in (30, 40, 50):
            checkpoint(train, f"checkpoint-{step}")
        assert watch(tmp_path).exit_code == 0
    runs = spec.series_dir / "runs"
    with open(runs / "checkpoint-20" / "results.jsonl", "a") as handle:
        handle.write("{not json\n")
    (train / "checkpoint-30" / "model.safetensors").write_bytes(b"other weights")
    manifest = runs / "checkpoint-40" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "status": "running"}))
    return spec.series_dir


def test_the_series_documents_are_the_same_verified_in_one_process_or_several(damaged, monkeypatch):
    monkeypatch.setattr(series, "threads_running", lambda: 1)  # workers, whatever threads the suite left running
    written = {}
    for workers in (1, 3):
        write_series_report(damaged, workers=workers)
        written[workers] = [(damaged / name).read_bytes() for name in ("series.json", "report.md", "report.html")]
    assert written[1] == written[3]
    points = {p["name"]: p for p in json.loads(written[3][0])["points"]}
    assert (
        points["checkpoint-20"]["status"] == "unverified" and "results.jsonl" in points["checkpoint-20"]["problems"][0]
    )
    assert points["checkpoint-30"]["status"] == "unverified" and "re-saved" in points["checkpoint-30"]["problems"][0]
    assert points["checkpoint-40"]["asr"] is None and not points["checkpoint-40"]["problems"]
    assert points["checkpoint-50"]["vs_previous"]["against"] == "checkpoint-10"  # the last one that verified
    assert [p["status"] for p in points.values()].count("finished") == 3


def test_an_error_met_in_a_worker_exits_as_it_does_in_one_process(damaged, monkeypatch):
    """An error that stops the report (here one naming a file's line, whose class does not pickle as itself) ends
    the command with the same line and exit status whatever the number of workers, never a traceback."""

    def unreadable(series_dir, state, entry, manifest):
        if entry.name == "checkpoint-50":
            raise DataError(Path(entry.path) / "model.safetensors", 3, None, "unreadable weights")
        return []

    monkeypatch.setattr(series, "run_problems", unreadable)
    outputs = []
    for workers in (1, 3):
        monkeypatch.setattr(series, "default_workers", lambda workers=workers: workers)
        result = CliRunner().invoke(app, ["report", str(damaged)])
        assert result.exit_code == 2 and "Traceback" not in result.output
        outputs.append(result.output)
    assert outputs[0] == outputs[1] and "checkpoint-50/model.safetensors line 3: unreadable weights" in outputs[0]


def test_a_worker_that_dies_stops_the_report_with_one_line(damaged, monkeypatch):
    """A worker killed while it verifies (the kernel's out-of-memory killer, a signal) is a run that cannot be
    completed: exit 3, one line, no traceback, and no document written from the runs it did not verify."""
    import os

    def killed(series_dir, state, entry, manifest):
        if entry.name == "checkpoint-50":
            os._exit(9)
        return []

    monkeypatch.setattr(series, "run_problems", killed)
    monkeypatch.setattr(series, "default_workers", lambda: 2)
    monkeypatch.setattr(series, "threads_running", lambda: 1)  # workers, whatever threads the suite left running
    before = (damaged / "series.json").read_bytes()
    result = CliRunner().invoke(app, ["report", str(damaged)])
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    assert "a process verifying the series' runs ended before it was done" in result.output
    assert (damaged / "series.json").read_bytes() == before


class Unpicklable(Exception):
    """An error that pickles and does not unpickle (its __init__ takes two arguments, its args hold one)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)


def _unpicklable(series_dir, state, entry, manifest):
    if entry.name == "checkpoint-50":
        raise Unpicklable("no way back", "detail")
    return []


def test_a_result_a_worker_cannot_hand_back_is_said_as_what_it_was(damaged, monkeypatch):
    """A worker whose result (here an error) does not unpickle here breaks the pool as a killed one does: exit 3,
    one line, saying what it was, not 'killed, or out of memory'."""
    monkeypatch.setattr(series, "run_problems", _unpicklable)
    monkeypatch.setattr(series, "default_workers", lambda: 2)
    monkeypatch.setattr(series, "threads_running", lambda: 1)
    result = CliRunner().invoke(app, ["report", str(damaged)])
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    assert "out of memory" not in result.output and "TypeError" in result.output, result.output


def test_a_process_with_other_threads_verifies_in_itself(damaged, monkeypatch):
    """A process with other threads running (a training loop's: CUDA, data loaders) is never forked: a child
    of it may wait forever on a lock another thread held; the series is verified in this process."""
    import threading

    def no_pool(*args, **kwargs):
        raise AssertionError("a process with other threads was forked")

    monkeypatch.setattr(series, "ProcessPoolExecutor", no_pool)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        write_series_report(damaged, workers=3)
    finally:
        stop.set()
        thread.join()
    assert json.loads((damaged / "series.json").read_text())["points"]


def test_series_report_forks_from_a_process_with_native_threads(damaged, monkeypatch):
    """Threads Python does not know of (torch's OpenMP pool, CUDA's: most of a training process's) count as others
    running: the series is verified in this process, never forked."""
    import os
    import threading

    import torch

    def no_pool(*args, **kwargs):
        raise AssertionError("a process with other (native) threads was forked")

    monkeypatch.setattr(series, "ProcessPoolExecutor", no_pool)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    torch.ones(300, 300) @ torch.ones(300, 300)  # starts torch's OpenMP threads
    torch.set_num_threads(before)
    assert len(os.listdir("/proc/self/task")) > threading.active_count()
    monkeypatch.setattr("threading.active_count", lambda: 1)  # none of Python's: only the native ones count
    write_series_report(damaged, workers=3)
    assert json.loads((damaged / "series.json").read_text())["points"]


def _report_in_a_fresh_process(series_dir: Path, *options: str, **env: str) -> str:
    """`diagsafe-local report SERIES_DIR` as a user runs it: a process of its own, importing what the command does."""
    environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | env
    done = subprocess.run(
        [sys.executable, "-m", "diagsafe_local.cli", "report", str(series_dir), *options],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    return done.stdout


two_cpus = pytest.mark.skipif(usable_cpus() < 2, reason="one worker a CPU, and OpenBLAS starts no pool on one CPU")


@two_cpus
def test_the_command_verifies_a_series_in_its_workers(damaged):
    """The command's own process runs no other thread when it verifies, so its workers are forked: numpy's
    OpenBLAS starts a thread pool as it loads (one thread a CPU), which kept every report in one process."""
    assert "5 checkpoints evaluated (verified in 2 processes)" in _report_in_a_fresh_process(damaged, "--workers", "2")


@pytest.mark.parametrize(
    ("workers", "runs", "cpus", "threads", "processes"),
    [(4, 1, 8, 1, 1), (4, 3, 8, 1, 3), (2, 5, 8, 1, 2), (30, 50, 2, 1, 2), (4, 5, 8, 2, 1)],
)
def test_the_processes_are_the_workers_a_run_and_a_cpu_each_and_none_beside_other_threads(
    monkeypatch, workers, runs, cpus, threads, processes
):
    monkeypatch.setattr(series, "threads_running", lambda: threads)
    monkeypatch.setattr(series, "usable_cpus", lambda: cpus)
    assert series.verifying_processes(workers, runs) == processes


def test_a_worker_that_cannot_be_started_stops_the_report_and_leaves_no_process(damaged, monkeypatch):
    """The first submit forks every worker; where one fork is refused (processes or open files at a limit), the
    report stops with one line (exit 3) and the workers already forked are stopped: they have no manager, and
    this process would wait for them at its exit forever. A process of the caller's own (`ds.series_report` from
    a script) is left running, and so are the processes this test's process already had (the suite's shared
    engines)."""
    before = set(multiprocessing.active_children())
    callers = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    callers.start()
    started = []
    real_start = ForkProcess.start

    def start(process):
        if started:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        started.append(process)
        real_start(process)

    monkeypatch.setattr(ForkProcess, "start", start)
    monkeypatch.setattr(series, "threads_running", lambda: 1)
    monkeypatch.setattr(series, "usable_cpus", lambda: 3)
    (damaged / "series.json").unlink(missing_ok=True)
    try:
        with pytest.raises(RunFailed, match="could not start 3 .*Resource temporarily unavailable.*--workers 1"):
            write_series_report(damaged, workers=3)
        left = set(multiprocessing.active_children()) - before
    finally:
        for child in set(multiprocessing.active_children()) - before:  # a worker left over would hang pytest's exit
            child.kill()
            child.join()
    assert started and left == {callers}
    assert not (damaged / "series.json").exists()


def test_a_pool_whose_pipes_cannot_be_made_stops_the_report_with_one_line(damaged, monkeypatch):
    def no_pipes(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(series, "ProcessPoolExecutor", no_pipes)
    monkeypatch.setattr(series, "threads_running", lambda: 1)
    monkeypatch.setattr(series, "usable_cpus", lambda: 2)
    result = CliRunner().invoke(app, ["report", str(damaged), "--workers", "2"])
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    assert "could not start 2 processes" in result.output and "Too many open files" in result.output


def _signalled_at_checkpoint_30(signal_number):
    def problems(series_dir, state, entry, manifest):
        if entry.name == "checkpoint-30":
            os.kill(os.getpid(), signal_number)  # as Ctrl-C, or SLURM's SIGTERM, reaches the whole process group
            time.sleep(0.5)
        return []

    return problems


def test_a_worker_ignores_ctrl_c_and_leaves_it_to_the_command(damaged, monkeypatch):
    """Ctrl-C reaches the workers too: they ignore it (the command's process handles it and shuts them down; a
    worker that raised printed its traceback to the user)."""
    monkeypatch.setattr(series, "run_problems", _signalled_at_checkpoint_30(signal.SIGINT))
    monkeypatch.setattr(series, "threads_running", lambda: 1)
    monkeypatch.setattr(series, "usable_cpus", lambda: 2)
    try:
        report = write_series_report(damaged, workers=2)
    except KeyboardInterrupt:
        pytest.fail("a worker's Ctrl-C reached the command as its KeyboardInterrupt")
    assert report.processes == 2 and len(report.figures.points) == 5


def test_a_worker_ended_by_sigterm_stops_the_report_with_one_line(damaged, monkeypatch):
    """SIGTERM ends a worker at once (the pool's own way of stopping its workers when one died: a worker that
    ignored it kept the pool, and the command, waiting forever); the report stops with one line."""
    before = set(multiprocessing.active_children())
    monkeypatch.setattr(series, "run_problems", _signalled_at_checkpoint_30(signal.SIGTERM))
    monkeypatch.setattr(series, "threads_running", lambda: 1)
    monkeypatch.setattr(series, "usable_cpus", lambda: 2)
    with pytest.raises(RunFailed, match="ended before it was done"):
        write_series_report(damaged, workers=2)
    assert set(multiprocessing.active_children()) <= before


@two_cpus
def test_a_blas_pool_the_user_asked_for_keeps_the_report_in_one_process(damaged):
    """A user's own OPENBLAS_NUM_THREADS is kept: its pool's threads run, so the process is not forked."""
    output = _report_in_a_fresh_process(damaged, "--workers", "2", OPENBLAS_NUM_THREADS="2")
    assert "(verified in 1 process)" in output


@pytest.mark.parametrize(
    ("cpus", "load", "workers"),
    [(1, 0.0, 1), (2, 0.1, 2), (2, 1.2, 1), (2, 3.5, 1), (16, 2.7, 4), (16, 13.2, 3), (16, 15.5, 1), (3, 0.0, 3)],
)
def test_workers_are_the_cpus_the_load_leaves_idle(monkeypatch, cpus, load, workers):
    """One worker per CPU this process may use that the load average leaves idle (as `make -l` holds back jobs: on
    a busy machine more processes only share the same CPUs, and each spends more CPU on the same work), at most
    `series.WORKERS`, at least one (verified here)."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    monkeypatch.setattr("os.getloadavg", lambda: (load, load, load))
    assert series.default_workers() == workers


def test_open_files_at_their_limit_in_a_worker_is_one_line_naming_fewer_workers(damaged, monkeypatch):
    """The workers' pipes count against the open-files limit, so a worker may meet it where one process would
    not: said as the run and the way out, not as an unexpected error."""

    def at_the_limit(*args):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(series, "_checked", at_the_limit)
    state = series.signed_series(damaged, require_signature=False)[0]
    entry = state.ordered()[0]
    with pytest.raises(RunFailed, match=r"Too many open files \(open files at their limit; --workers 1 needs fewer"):
        series._checked_in_worker(damaged, state, entry)
