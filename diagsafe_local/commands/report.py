"""`diagsafe-local report RUN_DIR`: Markdown and HTML report with per-category charts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="A finished run directory.")],
    baseline: Annotated[
        str | None, typer.Option(help="Target to compare the others against (default: the config's).")
    ] = None,
) -> None:
    """Write report.md, report.html and figures/ into the run directory."""
    from diagsafe_local.evaluation.report import load_summary, print_summary, write_report

    paths = write_report(run_dir, baseline)
    print_summary(load_summary(run_dir))
    typer.echo("wrote " + ", ".join(str(p) for p in paths))
