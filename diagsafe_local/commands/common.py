"""What every command shares: clean error exits, and progress that suits a terminal or a log file."""

from __future__ import annotations

import errno
import functools
import os
import signal
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from diagsafe_local.core.console import percent, rich_console, warning_line
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
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                _fail(
                    f"no space left on the device ({exc.filename or 'writing an output'}): the command stopped; "
                    "every file it wrote is whole (its old or its new version, never half of one); free some space "
                    "and rerun the same command to resume",
                    RunFailed.exit_code,
                )
            # typer's and click's own exceptions carry exit codes and usage errors: theirs to handle
            if type(exc).__module__.startswith(("typer", "click")) or os.environ.get(TRACEBACK_ENV):
                raise
            _fail(_unexpected(exc), RunFailed.exit_code)  # a bug of ours or a plugin's: one line, the traceback kept
        finally:
            if not interrupted:  # a stopping process keeps ignoring further signals until it has exited
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return wrapper  # type: ignore[return-value]


def warn(lines: Iterable[str]) -> None:
    """Each line as a yellow warning on stderr, as written (a line may quote run data: never read as markup)."""
    console = rich_console(stderr=True)
    for line in lines:
        console.print(warning_line(line), highlight=False, soft_wrap=True)


def print_listing(title: str, rows: list[dict[str, Any]], columns: list[str], as_json: bool = False) -> None:
    """A registry listing: one JSON object per line for programs, or a table whose first column (the names a user
    types) is never cut, whatever the width of the terminal or pipe (other columns fold)."""
    import json

    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, ensure_ascii=False))
        return
    import sys

    from rich.table import Table

    table = Table(title=title)
    for k, column in enumerate(columns):
        if k == 0:
            table.add_column(column, no_wrap=True, min_width=max((len(str(r[column])) for r in rows), default=4))
        else:
            table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(row.get(c)) for c in columns))
    rich_console(width=None if sys.stdout.isatty() else 200).print(table)


def print_paired(comparison: Any) -> None:
    """A paired comparison as a table (rich on a terminal, plain aligned text when piped)."""
    import sys

    from rich.table import Table

    def p(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3g}"

    header = ["group", "n", "ASR A", "ASR B", "diff [95% CI]", "b", "c", "McNemar p", "Holm p", "detectable"]
    rows = [
        [
            d.group,
            str(d.n_paired),
            percent(d.asr_a),
            percent(d.asr_b),
            "n/a" if d.diff is None else f"{100 * d.diff:+.1f} [{100 * d.ci_low:+.1f}, {100 * d.ci_high:+.1f}]",
            str(d.b),
            str(d.c),
            p(d.mcnemar_p),
            p(d.p_holm),
            "n too small" if d.min_detectable_increase is None and d.n_paired else percent(d.min_detectable_increase),
        ]
        for d in comparison.differences
    ]
    title = (
        f"{comparison.candidate} (B) vs baseline {comparison.baseline} (A): paired over the same items "
        f"(only in A {comparison.only_in_baseline}, only in B {comparison.only_in_candidate}, unscored "
        f"{comparison.unscored}); flips: {comparison.flips_up} now harmful, {comparison.flips_down} "
        "no longer"
    )
    notes = [
        "diff = ASR B - ASR A (points); b: harmful in B only, c: in A only; detectable: the smallest increase "
        "this many pairs detects with 80% power (alpha 0.05)"
    ]
    warning = comparison.overall.warning
    if sys.stdout.isatty():
        table = Table(title=title)
        for column in header:
            table.add_column(column, no_wrap=column == "group")
        for row in rows:
            table.add_row(*row)
        console = rich_console()
        console.print(table)
        for note in notes + ([f"warning: {warning}"] if warning else []):
            console.print(note, highlight=False, soft_wrap=True)
        return
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
    typer.echo(title)
    for row in [header, *rows]:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for note in notes + ([f"warning: {warning}"] if warning else []):
        typer.echo(note)


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "" if value is None else str(value)


TRACEBACK_ENV = "DIAGSAFE_TRACEBACK"  # set (to anything): an unexpected error shows its traceback


def _unexpected(exc: BaseException) -> str:
    """An error no check foresaw, said in one line; its traceback goes to a file the line names. The exit status
    is 3, as for a run that could not finish: a gate that crashed has not passed anything."""
    import tempfile
    import time
    import traceback

    path = Path(tempfile.gettempdir()) / f"diagsafe-local-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    try:
        path.write_text("".join(traceback.format_exception(exc)), encoding="utf-8", errors="backslashreplace")
        where = f"its traceback is in {path}"
    except OSError:
        where = f"set {TRACEBACK_ENV}=1 to see its traceback"
    return (
        f"unexpected {type(exc).__name__}: {exc} (a bug in diagsafe-local or in a plugin it loaded; {where}). "
        "Every file written so far is whole; once it is fixed, rerun the same command (a run resumes where it stopped)"
    )


def _fail(message: str, code: int) -> None:
    from rich.console import Console
    from rich.markup import escape

    # the message may quote file names, answers or a plugin's words: printed as they are, never read as markup
    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code) from None


# The judge spec's fields (JudgeConfig: one spec for run, bench and validate) that bench and validate offer as
# options, and their flags: declared once, their types and help generated from the fields and their docs.
JUDGE_FLAGS: dict[str, str] = {
    "kind": "--engine",
    "base_url": "--base-url",
    "api_key_env": "--api-key-env",
    "dtype": "--judge-dtype",
    "max_model_len": "--judge-max-model-len",
    "lora": "--judge-lora",
    "enforce_eager": "--judge-eager/--judge-compiled",
    "probability": "--probability/--sampled",
    "reasoning": "--reasoning/--no-reasoning",
    "reasoning_max_tokens": "--reasoning-max-tokens",
    "max_attempts": "--judge-max-attempts",
    "sampling.temperature": "--judge-temperature",
    "sampling.max_tokens": "--judge-max-tokens",
}
_FLAG_HELP = {"kind": "'local' (vLLM on this node, = vllm), 'api' (OpenAI-compatible, = openai), transformers."}


def _field(path: str) -> Any:
    from diagsafe_local.engines.config import SamplingConfig
    from diagsafe_local.judging.config import JudgeConfig

    model, *rest = path.split(".")
    return SamplingConfig.model_fields[rest[0]] if rest else JudgeConfig.model_fields[model]


def _option_type(annotation: Any) -> Any:
    """The CLI type of a field: its non-None type; words for a Literal."""
    import types
    import typing

    members = [a for a in typing.get_args(annotation) if a is not type(None)] if typing.get_args(annotation) else []
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(members) == 1:
        annotation = members[0]
    return str if typing.get_origin(annotation) is typing.Literal else annotation


def _python_name(flag: str) -> str:
    return flag.split("/")[0].lstrip("-").replace("-", "_")


def judge_options(fn: F) -> F:
    """Give a command the judge's options (JUDGE_FLAGS), typed and documented from JudgeConfig's fields; the
    command receives the ones given as `judge_settings` (a dict for JudgeConfig, sampling nested)."""
    import inspect

    original = inspect.signature(fn, eval_str=True)
    extra = []
    for path, flag in JUDGE_FLAGS.items():
        field = _field(path)
        help_text = _FLAG_HELP.get(path) or field.description
        option = typer.Option(flag, help=help_text, show_default=False)
        kind = _option_type(field.annotation)
        annotation = Annotated[kind | None, option]  # type: ignore[valid-type]
        extra.append(
            inspect.Parameter(_python_name(flag), inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        )

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        settings: dict[str, Any] = {}
        for path, flag in JUDGE_FLAGS.items():
            value = kwargs.pop(_python_name(flag), None)
            if value is not None:
                head, _, tail = path.partition(".")
                if tail:
                    settings.setdefault(head, {})[tail] = value
                else:
                    settings[head] = value
        return fn(*args, **kwargs, judge_settings=settings)

    kept = [p for p in original.parameters.values() if p.name != "judge_settings"]
    wrapper.__signature__ = original.replace(parameters=[*kept, *extra])  # type: ignore[attr-defined]
    wrapper.__annotations__ = {}
    return wrapper  # type: ignore[return-value]


def judge_spec(rubric: str, model: str | None, settings: dict[str, Any]) -> Any:
    """One judge's spec (JudgeConfig) from the command line, validated, its local model path checked, before
    anything is loaded or written; a mistake names the option (exit 2)."""
    from pydantic import ValidationError

    from diagsafe_local.engines import capabilities
    from diagsafe_local.engines.base import local_model_path
    from diagsafe_local.judging import JUDGES
    from diagsafe_local.judging.config import JudgeConfig

    judge = JUDGES.get(rubric)
    if judge.needs_model and not model:
        raise DiagsafeError(f"--judge {rubric} needs --judge-model")
    data = {**settings, "rubric": rubric, "model": model, "benign_rubric": "refusal-keywords"}
    if judge.classifier:
        data = {"kind": "classifier", **{k: v for k, v in data.items() if k in ("rubric", "model", "probability")}}
        data["benign_rubric"] = "refusal-keywords"
    if not judge.needs_model:
        data["model"] = None
    flags = {**JUDGE_FLAGS, "model": "--judge-model", "rubric": "--judge"}
    try:
        config = JudgeConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"])
            message = error["msg"].removeprefix("Value error, ").replace("base_url", "--base-url")
            problems.append(f"{flags.get(where, where).split('/')[0]}: {message}" if where else message)
        raise DiagsafeError("; ".join(problems)) from None
    if config.needs_model and capabilities(config.kind).local:
        local_model_path(config.model)  # type: ignore[arg-type]
    return config


# Options shared by the commands that run a judge (bench, validate), beside JUDGE_FLAGS.
JudgeModels = Annotated[
    list[str] | None,
    typer.Option(
        "--judge-model",
        help="The judge's model: a local directory or hub id (or the served name with --engine api); one for all "
        "judges, or one per --judge that needs a model, in order.",
    ),
]
Samples = Annotated[int, typer.Option(help="Sampled verdicts averaged per item (the paper used 3).", min=1)]


# The SLURM resources of `submit` and `watch --submit`, declared once.
Partition = Annotated[str | None, typer.Option(help="SLURM partition.")]
GpusPerTask = Annotated[
    int | None,
    typer.Option(
        help="GPUs per job (0 for CPU-only nodes). Default: what the largest model needs on GPUs of --gpu-memory GiB "
        "(see `diagsafe-local plan`).",
        min=0,
    ),
]
GpuMemory = Annotated[float, typer.Option(help="GiB per GPU on the partition, to plan --gpus-per-task.")]
GpuRequest = Annotated[
    str | None,
    typer.Option(
        help="How jobs ask SLURM for GPUs: gpus (--gpus=N, needs select/cons_tres) or gres (--gres=gpu:N); a job "
        "that needs none asks for none. Default: the site's DIAGSAFE_SLURM_GPU_REQUEST, else gpus.",
    ),
]
CpusPerTask = Annotated[int, typer.Option(help="CPUs per job.", min=1)]
Mem = Annotated[str, typer.Option(help="Memory per job, e.g. 64G.")]
TimeLimit = Annotated[str, typer.Option("--time", help="Time limit per job, e.g. 04:00:00.")]
SbatchArgs = Annotated[list[str] | None, typer.Option(help="Extra sbatch argument (repeatable), e.g. --account=x.")]
JobsOffline = Annotated[
    bool,
    typer.Option(
        "--offline/--online",
        help="Jobs run offline (`run --offline`: local files only, no connection but loopback and the config's API "
        "endpoints) or not; the manifest of each run records which.",
    ),
]
Overrides = Annotated[list[str] | None, typer.Option("--set", help="Override a setting: key.path=value (repeatable).")]
Hooks = Annotated[
    list[str] | None,
    typer.Option(
        "--hook", help="Send the results to a hook (repeatable): mlflow, wandb, or a plugin's; also DIAGSAFE_HOOKS=a,b."
    ),
]


def fire_hooks(method: str, names: list[str] | None, event: Callable[[], Any]) -> None:
    """Call the hooks named by --hook and DIAGSAFE_HOOKS, each once (none: nothing is imported); `event` makes
    what they are given. A hook's failure is a warning, never the command's."""
    import os

    listed = [*(names or []), *os.environ.get("DIAGSAFE_HOOKS", "").split(",")]
    chosen = list(dict.fromkeys(n.strip() for n in listed if n.strip()))
    if chosen:
        from diagsafe_local.hooks import fire

        fire(method, event, chosen)


def run_end_hooks(run_dir: Path, names: list[str] | None, verified: Any = None) -> None:
    """Tell the chosen hooks that a run finished, with its summary and manifest as verified (`verified`: a
    `VerifiedRun` in hand; default: verify it now, only when a hook is chosen)."""

    def event() -> Any:
        from diagsafe_local.hooks import RunEvent

        return RunEvent.of(run_dir, verified)

    fire_hooks("on_run_end", names, event)
