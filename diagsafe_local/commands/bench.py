"""`diagsafe-local bench`: rank harmfulness metrics on HarmMetric Eval."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local import __version__
from diagsafe_local.commands.common import progress, split_list, user_errors

DEFAULT_DATASET = "Abel-24/HarmMetric_Eval"


def list_metrics() -> None:
    """Print the metric registry: name, whether it needs a reference, one-line description."""
    from rich.console import Console
    from rich.table import Table

    from diagsafe_local.metrics import METRICS

    table = Table(title=f"{len(METRICS)} metrics")
    table.add_column("name")
    table.add_column("reference")
    table.add_column("description")
    for spec in METRICS:
        table.add_row(spec.name, "yes" if spec.needs_reference else "no", spec.description)
    Console().print(table)


@user_errors
def bench(
    dataset: Annotated[str, typer.Option(help="Benchmark file (either layout) or Hugging Face dataset id.")] = DEFAULT_DATASET,
    metrics: Annotated[str, typer.Option(help="Comma-separated metric names, or 'all'. See --list.")] = "all",
    scoring: Annotated[str, typer.Option(help="Effectiveness formula: 'current' or 'v1' (the earlier paper version).")] = "current",
    missing: Annotated[str, typer.Option(help="Missing scores: 'error', 'drop-prompt' or 'worst-case'.")] = "error",
    reference_agg: Annotated[str, typer.Option(help="Combine several references by 'mean' or 'max' (rows may override).")] = "mean",
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the 95% CIs.", min=100)] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/bench"),
    list_: Annotated[bool, typer.Option("--list", help="List the available metrics and exit.")] = False,
) -> None:
    """Score every benchmark response with each metric and rank the metrics (HarmMetric Eval)."""
    if list_:
        list_metrics()
        return
    run_bench(dataset, metrics, scoring, missing, reference_agg, bootstrap, seed, out)


def run_bench(
    dataset: str, metrics: str, scoring: str, missing: str, reference_agg: str, bootstrap: int, seed: int, out: Path
) -> None:
    """The bench command's work, shared with the demo."""
    from diagsafe_local.benchmark.dataset import load_dataset
    from diagsafe_local.benchmark.report import print_leaderboard, write_outputs
    from diagsafe_local.benchmark.runner import leaderboard, score_responses
    from diagsafe_local.errors import DiagsafeError
    from diagsafe_local.hub import resolve_dataset
    from diagsafe_local.metrics import METRICS

    for name, value, allowed in (
        ("--scoring", scoring, ("current", "v1")),
        ("--missing", missing, ("error", "drop-prompt", "worst-case")),
        ("--reference-agg", reference_agg, ("mean", "max")),
    ):
        if value not in allowed:
            raise DiagsafeError(f"{name} must be one of {', '.join(allowed)}; got '{value}'")
    names = METRICS.names() if metrics == "all" else split_list(metrics)
    for name in names:
        METRICS.get(name)
    data = load_dataset(resolve_dataset(dataset))
    with progress("scoring", len(names)) as advance:
        scores = score_responses(data, names, reference_agg, on_metric=advance)  # type: ignore[arg-type]
    board = leaderboard(scores, data, scoring, missing, bootstrap, seed)  # type: ignore[arg-type]
    manifest = {
        "tool": f"diagsafe-local {__version__}",
        "python": platform.python_version(),
        "dataset": dataset,
        "dataset_path": data.path,
        "dataset_sha256": data.sha256,
        "layout": data.layout,
        "n_prompts": len(data.prompts),
        "n_responses": data.n_responses,
        "metrics": names,
        "formula": scoring,
        "missing": missing,
        "reference_agg": reference_agg,
        "bootstrap": bootstrap,
        "seed": seed,
    }
    paths = write_outputs(out, board, scores, manifest)
    print_leaderboard(board)
    typer.echo("wrote " + ", ".join(str(p) for p in paths))
