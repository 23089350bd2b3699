"""`diagsafe-local report RUN_DIR`: Markdown and HTML report with per-category charts."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from diagsafe_local.commands.common import Hooks, fire_hooks, user_errors


@user_errors
def report(
    run_dir: Annotated[Path, typer.Argument(help="A finished run directory, or a series directory (`watch`).")],
    baseline: Annotated[
        str | None,
        typer.Option(
            help="Compare with a baseline, paired over the same items: a baseline run directory (e.g. production's), "
            "or a target of this sweep (default: the config's baseline)."
        ),
    ] = None,
    margin: Annotated[
        float, typer.Option(help="A series: the ASR increase that counts as a regression (paired, CI above 0).", min=0)
    ] = 0.02,
    workers: Annotated[
        int | None,
        typer.Option(
            help="A series: at most this many processes verify its runs, at most one a CPU (default: one per CPU "
            "the load leaves idle, at most 4).",
            min=1,
        ),
    ] = None,
    hook: Hooks = None,
) -> None:
    """Write report.md, report.html and figures/ into a run directory; of a series directory (`watch`), the series
    report: every rate against the training step, each checkpoint compared with the previous one and the baseline,
    and series.json. A series' state and runs are checked as the gate checks them: a state that does not verify
    is refused (exit 3), and a run that is not its checkpoint's weights is shown as unverified, never plotted."""
    _numpy_without_blas_pool()
    from diagsafe_local.commands.common import warn
    from diagsafe_local.runs.files import REPORT_FILES
    from diagsafe_local.runs.report import print_summary, write_report
    from diagsafe_local.runs.series import written_series

    if written_series(run_dir):
        from diagsafe_local.runs.series import SERIES_FILES, write_series_report

        figures, processes = write_series_report(run_dir, margin, Path(baseline) if baseline else None, workers)
        first = figures.first_regression
        typer.echo(f"series state: {figures.signature}")
        typer.echo(
            f"{sum(p.asr is not None for p in figures.points)} of {len(figures.points)} checkpoints evaluated "
            f"(verified in {processes} process{'es' if processes > 1 else ''})"
        )
        typer.echo(
            f"first regression beyond {margin:.1%}: " + (f"step {first.step} ({first.name})" if first else "none")
        )
        warn(f"{p.name}: not verified: {'; '.join(p.problems)}" for p in figures.points if p.status == "unverified")
        typer.echo("wrote " + ", ".join(str(run_dir / name) for name in SERIES_FILES))
        fire_hooks("on_series_update", hook, lambda: _series_event(run_dir, figures))
        return

    written = write_report(run_dir, baseline)
    print_summary(written)
    typer.echo("wrote " + ", ".join(str(run_dir / name) for name in REPORT_FILES if (run_dir / name).exists()))


def _numpy_without_blas_pool() -> None:
    """Load numpy with OpenBLAS's thread pool at one thread: the pool's threads start when numpy loads, and a
    process running other threads never forks the series' workers (`runs.series.verifying_processes`); this
    command's arrays are small. The variable is set only while numpy loads (children get the user's environment);
    a user's own setting, or numpy already loaded (`api`, tests), is left as it is."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


def _series_event(series_dir: Path, figures: Any) -> Any:
    from diagsafe_local.hooks import SeriesEvent

    return SeriesEvent(series_dir, figures)
