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
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console as RichConsole
    from rich.text import Text

INTERVAL_ENV = "DIAGSAFE_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 10.0


def percent(value: float | None) -> str:
    """A share as a percentage with one decimal ("n/a" where unknown), as tables and reports show it."""
    return "n/a" if value is None else f"{100 * value:.1f}%"


def rich_console(stderr: bool = False, width: int | None = None) -> RichConsole:
    """A rich console for tables and lines that quote run data (names, problems, answers): it reads no markup, so
    what a run wrote (`ckpt[/oops]`, `[link=...]`) is shown as written, never parsed as tags."""
    import rich.console

    return rich.console.Console(stderr=stderr, width=width, markup=False)


def warning_line(message: str) -> Text:
    """`warning: message`, the prefix in bold yellow and the message as written (for `rich_console`)."""
    import rich.text

    return rich.text.Text.assemble(("warning:", "bold yellow"), " ", message)


def progress_interval() -> float:
    """Seconds between two progress lines of a stage in a log file ($DIAGSAFE_PROGRESS_SECONDS, default 10)."""
    try:
        return max(0.0, float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


class Console:
    """Progress and warnings for a person: rich progress bars per stage on a terminal (counts, rate, time left),
    plain lines where the output is a log file (SLURM): a stage's first and last line, and at most one line
    every `progress_interval()` seconds between them, however many units it counts."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.perf_counter) -> None:
        self.stream = stream
        self.clock = clock
        self.live = stream.isatty()
        self._started: dict[str, float] = {}
        self._printed: dict[str, float] = {}
        self._bars: Any = None
        self._tasks: dict[str, Any] = {}

    def progress(self, stage: str, done: int, total: int, rate: bool = True, note: str = "") -> None:
        """Report that `done` of `total` units of `stage` are finished; stages report 0 when they begin, and the
        rate and time left follow once units are done (`rate=False` for coarse units such as turns); `note` is
        shown beside (a training loss, say)."""
        if self.live:
            self._bar(stage, done, total, rate, note)
            return
        now = self.clock()
        start = self._started.setdefault(stage, now)
        last = self._printed.get(stage)
        if last is not None and done < total and now - last < progress_interval():
            return
        self._printed[stage] = now
        elapsed = now - start
        text = f"{stage}: {done}/{total}"
        if rate and elapsed > 0 and done:
            text += f", {done / elapsed:.1f}/s"
            if done < total:
                text += f", {_duration(elapsed / done * (total - done))} left"
        if note:
            text += f"; {note}"
        self.stream.write(text + "\n")
        self.stream.flush()

    def _bar(self, stage: str, done: int, total: int, rate: bool, note: str) -> None:
        from rich.console import Console as RichConsole
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        if self._bars is None:
            self._bars = Progress(
                TextColumn("{task.description}", markup=False),  # stages and notes name run data: as written
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[note]}", markup=False),
                console=RichConsole(file=self.stream),
            )
            self._bars.start()
        if stage not in self._tasks:
            self._tasks[stage] = self._bars.add_task(stage, total=total, rate="", note="")
        task = self._tasks[stage]
        speed = self._bars.tasks[task].speed if rate else None
        self._bars.update(task, completed=done, total=total, rate=f"{speed:.1f}/s" if speed else "", note=note)

    def say(self, line: str) -> None:
        """A line for the person running the command (above the bars, where they are shown)."""
        if self._bars is not None:
            self._bars.console.print(line, highlight=False, markup=False)
            return
        self.stream.write(line + "\n")
        self.stream.flush()

    def warn(self, message: str) -> None:
        self.say(f"warning: {message}")

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
    """Yield `advance(label)`, counting units of one stage on a `Console` on stderr: a progress bar on a terminal,
    plain log lines otherwise (e.g. SLURM logs: the first and last, at most one every `progress_interval()`
    seconds between)."""
    console = Console(sys.stderr)
    done = 0
    console.progress(description, 0, total)

    def advance(label: str) -> None:
        nonlocal done
        done += 1
        console.progress(description, done, total, note=label)

    try:
        yield advance
    finally:
        console.close()
