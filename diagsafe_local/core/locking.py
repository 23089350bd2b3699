"""One writer per output directory: an advisory lock on `<dir>/.diagsafe.lock`.

`fcntl.lockf` takes a POSIX record lock, which NFS (v4, and v3 with lockd) carries to the server, so two
`run` commands on different nodes of a SLURM cluster that write the same directory see each other. The
lock file holds the holder's PID and host for the error message. Limits: a filesystem without lock
support (some FUSE or parallel filesystems mounted without locking) makes the lock a no-op, with a warning;
the lock is released when the process ends, however it ends (SIGKILL and node loss included on local
disks; on NFS, when the server notices the client is gone).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from diagsafe_local.core.errors import DiagsafeError

log = logging.getLogger(__name__)
LOCK_NAME = ".diagsafe.lock"


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive POSIX lock on `path` (created if absent) for the block, waiting for other processes that
    hold it: one writer at a time of a file that several processes write (an annotator's labels)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


class DirectoryLock:
    """Holds the lock of one directory until `release()` or the end of the process."""

    def __init__(self, directory: Path, what: str) -> None:
        self.path = directory / LOCK_NAME
        self._created = not directory.exists()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise DiagsafeError(f"cannot write to {directory}: {exc.strerror}") from None
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                holder = os.pread(self._fd, 256, 0).decode("utf-8", "replace").strip() or "unknown process"
                self.release()
                raise DiagsafeError(
                    f"{directory} is being written by another diagsafe-local process ({holder}); wait for it to "
                    "finish, or choose another output directory"
                ) from None
            log.warning(
                "%s: this filesystem does not support locks (%s); nothing stops a second writer", directory, exc
            )
            return
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{what}, pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        """Unlock; a directory this lock created and nothing else wrote to is removed (a command that failed
        early leaves no empty output directory behind)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            directory = self.path.parent
            if self._created and [p.name for p in directory.iterdir()] == [LOCK_NAME]:
                self.path.unlink(missing_ok=True)
                directory.rmdir()
