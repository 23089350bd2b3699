"""What a command shows while engines run: progress per stage and warnings on the console, engine logs in a file.

vLLM and transformers log every step at INFO, from this process and from vLLM's engine-core processes, straight
to the standard output and error. `engine_output(log_path)` points file descriptors 1 and 2 (inherited by the
engine processes) at `log_path` for the duration, and gives the command a `Console` on the real terminal for
its own progress and warnings; `-v` (log_path None) leaves everything on the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO


class Console:
    """Progress and warnings for a person: rich progress bars per stage on a terminal (counts, rate, time),
    plain lines where the output is a log file (SLURM)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self._started: dict[str, float] = {}
        self._bars: Any = None
        self._tasks: dict[str, Any] = {}

    def progress(self, stage: str, done: int, total: int, rate: bool = True) -> None:
        """Report that `done` of `total` units of `stage` are finished; stages report 0 when they begin, and the
        rate since then follows once units are done (`rate=False` for coarse units such as turns)."""
        if self.live:
            self._bar(stage, done, total, rate)
            return
        start = self._started.setdefault(stage, time.perf_counter())
        elapsed = time.perf_counter() - start
        rate_text = f", {done / elapsed:.1f}/s" if rate and elapsed > 0 and done else ""
        self.stream.write(f"{stage}: {done}/{total}{rate_text}\n")
        self.stream.flush()

    def _bar(self, stage: str, done: int, total: int, rate: bool) -> None:
        from rich.console import Console as RichConsole
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self._bars is None:
            self._bars = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                console=RichConsole(file=self.stream),
            )
            self._bars.start()
        if stage not in self._tasks:
            self._tasks[stage] = self._bars.add_task(stage, total=total, rate="")
        task = self._tasks[stage]
        speed = self._bars.tasks[task].speed if rate else None
        self._bars.update(task, completed=done, total=total, rate=f"{speed:.1f}/s" if speed else "")

    def warn(self, message: str) -> None:
        if self._bars is not None:
            self._bars.console.print(f"[bold yellow]warning:[/] {message}", highlight=False)
            return
        self.stream.write(f"warning: {message}\n")
        self.stream.flush()

    def close(self) -> None:
        """Leave the finished bars on the screen."""
        if self._bars is not None:
            self._bars.stop()
            self._bars = None


class _ToConsole(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.warn(record.getMessage())


@contextmanager
def engine_output(log_path: Path | None) -> Iterator[Console]:
    """Send everything written to stdout and stderr (engine logs, child processes included) to `log_path`
    while the block runs; yield a Console on the real terminal. With `log_path` None nothing is redirected."""
    if log_path is None:
        plain = Console(sys.stderr)
        try:
            yield plain
        finally:
            plain.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    terminal = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    console = Console(terminal)
    handler = _ToConsole(console)
    ours = logging.getLogger("diagsafe_local")
    ours.addHandler(handler)
    propagate, ours.propagate = ours.propagate, False
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield console
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)
        ours.removeHandler(handler)
        ours.propagate = propagate
        console.close()
        terminal.close()


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[str], None]]:
    """Yield `advance(label)`: a rich progress bar on a terminal, plain log lines otherwise (e.g. SLURM logs)."""
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
        ) as bar:
            task = bar.add_task(description, total=total)
            yield lambda label: bar.update(task, advance=1, description=f"{description}: {label}")
        return
    done = 0

    def advance(label: str) -> None:
        nonlocal done
        done += 1
        print(f"[{done}/{total}] {description}: {label}", file=sys.stderr, flush=True)

    yield advance
