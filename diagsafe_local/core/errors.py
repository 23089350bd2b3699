"""User-facing errors: each says what is wrong, where, and what to do."""

from __future__ import annotations

from pathlib import Path


class DiagsafeError(Exception):
    """An error the CLI reports in one clear message and a non-zero exit, without a traceback.

    Exit codes: 0 success, 1 the gate said no, 2 usage or input error (this class), 3 the run could not
    complete (`RunFailed`), 4 the gate is inconclusive (the decision depends on the judge's wording).
    """

    exit_code = 2


class RunFailed(DiagsafeError):
    """The run could not complete (engine or resource failure), or a finished run is needed and this one is not."""

    exit_code = 3


class DataError(DiagsafeError):
    """Bad input data, located by file, line (or record) and field."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        where = self.path if line is None else f"{self.path} line {line}"
        what = f"field '{field}': {message}" if field else message
        super().__init__(f"{where}: {what}")


class MissingDependencyError(DiagsafeError):
    """An optional dependency is not installed; the message says how to install it."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the '{package}' package, which is not installed. "
            f"Install it with: pip install 'diagsafe-local[{extra}]'"
        )


class Interrupted(BaseException):
    """SIGTERM (a SLURM time limit) or SIGINT (Ctrl-C) stopped the command; finished work is saved.

    A BaseException, like KeyboardInterrupt: the `except Exception` that isolates one failed request or batch
    must not swallow it. Exit status 3, as for any run that could not complete."""

    exit_code = 3
