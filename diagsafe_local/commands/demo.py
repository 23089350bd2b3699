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
) -> None:
    """Run HarmMetric Eval on the bundled sample with every metric, offline."""
    typer.echo(f"HarmMetric Eval on the bundled sample {SAMPLE} (all metrics) -> {out}/bench")
    run_bench(str(SAMPLE), "all", "current", "error", "mean", 1000, 0, out / "bench")
