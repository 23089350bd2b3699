"""Crash-safe file writes: a reader sees the old file or the complete new one, never half of it.

`outputs_together()` defers SIGTERM and SIGINT while a set of outputs is put in place, so a stopped command
leaves the previous set or the new one, not a mixture. A process killed outright (SIGKILL) can leave a
temporary file behind: `remove_stale_temporaries` clears them when the directory is next written.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` (fsynced), on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes private files; outputs follow the user's umask
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def current_umask() -> int:
    """The process's umask (read without changing it for longer than the call)."""
    current = os.umask(0)
    os.umask(current)
    return current


def write_text(path: str | Path, text: str) -> None:
    """Atomically write `text` (UTF-8) to `path`."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_with(path: str | Path, writer: Callable[[Path], object]) -> None:
    """Atomically create `path` by calling `writer(temporary_path)`."""
    with atomic_path(path) as tmp:
        writer(tmp)


TEMPORARY_GLOB = ".*.tmp"


def remove_stale_temporaries(directory: Path) -> int:
    """Delete temporaries that a killed writer left in `directory` (call it holding the directory's lock)."""
    stale = [p for p in directory.glob(TEMPORARY_GLOB) if p.is_file()]
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


@contextmanager
def outputs_together() -> Iterator[None]:
    """Hold back SIGTERM and SIGINT until the block ends (they are delivered right after it, once).

    The signals' Python handlers are swapped for ones that only take note, rather than the signals being masked:
    a mask holds only for the thread that sets it, and the kernel delivers a process's signal to any thread that
    does not block it (a thread of pyarrow's, numpy's or vLLM's pools), so a masked block was still cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    stopping = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in stopping}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])
