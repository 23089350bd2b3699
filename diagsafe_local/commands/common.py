"""What every command shares: clean error exits, and progress that suits a terminal or a log file."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer

from diagsafe_local.errors import DiagsafeError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn a DiagsafeError into one red line on stderr and its exit status (2, or 3 for RunFailed); no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DiagsafeError as exc:
            from rich.console import Console

            Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[str], None]]:
    """Yield `advance(label)`: a rich progress bar on a terminal, plain log lines otherwise (e.g. SLURM logs)."""
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
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


def split_list(value: str) -> list[str]:
    """'a, b,c' -> ['a', 'b', 'c']."""
    return [part.strip() for part in value.split(",") if part.strip()]
