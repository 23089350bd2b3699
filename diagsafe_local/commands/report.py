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
        str | None,
        typer.Option(
            help="Compare with a baseline, paired over the same items: a baseline run directory (e.g. production's), "
            "or a target of this sweep (default: the config's baseline)."
        ),
    ] = None,
) -> None:
    """Write report.md, report.html and figures/ into the run directory."""
    from diagsafe_local.commands.common import warn
    from diagsafe_local.runs.files import REPORT_FILES
    from diagsafe_local.runs.report import print_summary, write_report

    verified = write_report(run_dir, baseline)
    print_summary(verified.summary)
    warn("the run does not verify (the gate would refuse it): " + problem for problem in verified.problems)
    typer.echo("wrote " + ", ".join(str(run_dir / name) for name in REPORT_FILES if (run_dir / name).exists()))
