"""`diagsafe-local selftest`: prove an install on this node with tiny models, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def selftest(
    out: Annotated[Path, typer.Option(help="Where to build the models and write the run directory.")] = Path("out/selftest"),
    n: Annotated[int, typer.Option(help="Synthetic multi-turn conversations.", min=1)] = 24,
) -> None:
    """Build tiny random-weight target and judge models, run the real pipeline, check the results."""
    from diagsafe_local.report import print_summary, load_summary
    from diagsafe_local.selftest import run_selftest

    passed, lines, run_dir = run_selftest(out, n)
    print_summary(load_summary(run_dir))
    for line in lines:
        typer.echo(line)
    typer.echo(f"SELFTEST {'PASSED' if passed else 'FAILED'} (run directory {run_dir})")
    raise typer.Exit(0 if passed else 1)
