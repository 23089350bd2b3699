"""`diagsafe-local doctor`: is this node ready? The table, then exit 0 (ready) or 3 (what to fix)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors
from diagsafe_local.selftest.doctor import Check

MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


@user_errors
def doctor(
    engines: Annotated[
        bool, typer.Option(help="Also try vLLM itself on tiny models built here (a minute or two; off: seconds).")
    ] = True,
    work: Annotated[
        Path | None, typer.Option(help="Where to build the tiny models (default: a temporary folder, removed).")
    ] = None,
) -> None:
    """Check this node before a first run: the install, the GPUs, vLLM's behaviour on tiny models. Exit 0 when
    it is ready, 3 when something must be fixed (each FAIL line says what)."""
    from diagsafe_local.core.console import engine_output
    from diagsafe_local.selftest.doctor import engine_checks, node_checks, ready

    checks = node_checks()
    _print(checks)
    if engines and ready(checks):
        with tempfile.TemporaryDirectory(prefix="diagsafe-doctor-") as scratch:
            folder = work or Path(scratch)
            folder.mkdir(parents=True, exist_ok=True)
            with engine_output(folder / "engines.log") as console:  # vLLM's own logs go to the file
                found = engine_checks(folder, say=lambda line: print(line, file=console.stream, flush=True))
        _print(found)
        checks += found
        if work is None and not ready(found):
            typer.echo("vLLM's own output and each failed check's traceback: rerun with --work DIR (DIR/engines.log)")
    elif engines:
        typer.echo("skip  vLLM on tiny models: fix the FAIL lines above first")
    fine = ready(checks)
    typer.echo("READY" if fine else "NOT READY: fix each FAIL line above")
    raise typer.Exit(0 if fine else 3)


def _print(checks: list[Check]) -> None:
    width = max(len(c.name) for c in checks)
    for check in checks:
        typer.echo(f"{MARKS[check.status]}  {check.name:<{width}}  {check.detail}")
