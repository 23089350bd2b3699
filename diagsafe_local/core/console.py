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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO


class Console:
    """Progress lines and warnings for a person: a live line on a terminal, plain lines in a log (SLURM)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self._started: dict[str, float] = {}

    def progress(self, stage: str, done: int, total: int, rate: bool = True) -> None:
        """Report that `done` of `total` units of `stage` are finished; stages report 0 when they begin, and the
        rate since then follows once units are done (`rate=False` for coarse units such as turns)."""
        start = self._started.setdefault(stage, time.perf_counter())
        elapsed = time.perf_counter() - start
        rate_text = f", {done / elapsed:.1f}/s" if rate and elapsed > 0 and done else ""
        line = f"{stage}: {done}/{total}{rate_text}"
        if self.live:
            end = "\n" if done >= total else ""
            self.stream.write(f"\r\033[K{line}{end}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def warn(self, message: str) -> None:
        self.stream.write(f"warning: {message}\n")
        self.stream.flush()


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
        yield Console(sys.stderr)
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
        terminal.close()
