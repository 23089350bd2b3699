"""`diagsafe-local demo`: the embedded default that works offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.bench import run_bench
from diagsafe_local.commands.common import user_errors

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample_harmmetric.jsonl"


@user_errors
def demo(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/demo"),
    selftest: Annotated[bool, typer.Option(help="Also run the local pipeline on tiny models (a few minutes on CPU).")] = True,
) -> None:
    """HarmMetric Eval on the bundled sample (every metric), then the local pipeline self-test; all offline."""
    typer.echo(f"1/2  HarmMetric Eval on the bundled sample {SAMPLE} (all metrics) -> {out}/bench")
    run_bench(str(SAMPLE), "all", "current", "error", "mean", 1000, 0, out / "bench")
    if not selftest:
        return
    from diagsafe_local.report import load_summary, print_summary, write_report
    from diagsafe_local.selftest import run_selftest

    typer.echo(f"2/2  the checkpoint pipeline on tiny random-weight models (vLLM) -> {out}/selftest")
    passed, lines, run_dir = run_selftest(out / "selftest", 12)
    write_report(run_dir)
    print_summary(load_summary(run_dir))
    for line in lines:
        typer.echo(line)
    typer.echo(f"self-test {'passed' if passed else 'FAILED'}; report: {run_dir / 'report.md'}")
    raise typer.Exit(0 if passed else 1)
