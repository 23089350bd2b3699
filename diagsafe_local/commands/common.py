"""What every command shares: clean error exits, and progress that suits a terminal or a log file."""

from __future__ import annotations

import errno
import functools
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeVar

import typer

from diagsafe_local.core.errors import DiagsafeError, Interrupted, RunFailed

F = TypeVar("F", bound=Callable[..., Any])


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _interrupt(signum: int, frame: Any) -> None:
    # Once stopping, a repeated signal (SLURM sends SIGTERM, a user presses Ctrl-C twice) must neither cut the
    # clean-up short nor kill the process with the shell's 128+N: it is ignored, and the exit code stays 3.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(
        f"interrupted by {signal.Signals(signum).name}: everything finished so far is saved, and no output was "
        "left half-written; rerun the same command to resume"
    )


def user_errors(fn: F) -> F:
    """Turn a DiagsafeError into one red line on stderr and its exit status (2, or 3 for RunFailed); no traceback.

    SIGTERM (what SLURM sends at the time limit) and SIGINT unwind the command like an error, so every
    `finally` runs: engines close, locks are released, temporary files are removed (exit status 3); a second
    signal while that happens is ignored. A full disk is an environment failure (exit 3), not a crash."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.signal(sig, _interrupt) for sig in _STOP_SIGNALS} if main else {}
        interrupted = False
        try:
            return fn(*args, **kwargs)
        except (DiagsafeError, Interrupted) as exc:
            interrupted = isinstance(exc, Interrupted)
            _fail(str(exc), exc.exit_code)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            _fail(
                f"no space left on the device ({exc.filename or 'writing an output'}): the command stopped; every "
                "file it wrote is whole (its old or its new version, never half of one); free some space and rerun "
                "the same command to resume",
                RunFailed.exit_code,
            )
        finally:
            if not interrupted:  # a stopping process keeps ignoring further signals until it has exited
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return wrapper  # type: ignore[return-value]


def warn(lines: Iterable[str]) -> None:
    """Each line as a yellow warning on stderr."""
    from rich.console import Console

    console = Console(stderr=True)
    for line in lines:
        console.print(f"[bold yellow]warning:[/] {line}", highlight=False, soft_wrap=True)


def _fail(message: str, code: int) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None


def judge_engine(
    model: str,
    engine: str,
    base_url: str | None,
    api_key_env: str | None,
    dtype: str,
    max_model_len: int | None,
    lora: str | None,
    eager: bool | None,
) -> dict[str, Any]:
    """A judge's engine settings from the CLI options `bench` and `validate` share (checked here)."""
    if engine not in ("local", "api"):
        raise DiagsafeError(f"--engine must be local or api, got '{engine}'")
    if engine == "api":
        if not base_url:
            raise DiagsafeError("--engine api needs --base-url")
        return {"kind": "openai", "model": model, "base_url": base_url, "api_key_env": api_key_env}
    return {
        "kind": "vllm",
        "model": model,
        "dtype": dtype,
        "max_model_len": max_model_len,
        "lora": lora,
        "enforce_eager": eager,
    }


# Options shared by the commands that run a judge (bench, validate).
Reasoning = Annotated[
    bool | None,
    typer.Option(
        "--reasoning/--no-reasoning",
        help="Let the judge reason before its constrained verdict (default: the judge's own; see `bench --list`).",
    ),
]
ReasoningMaxTokens = Annotated[
    int, typer.Option(help="Most tokens of a judge's reasoning phase (closed for it when they run out).", min=1)
]
