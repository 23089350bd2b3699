"""`diagsafe-local merge` and `diagsafe-local compare`: combine or contrast finished run directories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def merge(
    run_dirs: Annotated[list[Path] | None, typer.Argument(help="Finished run directories of the same dataset.")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Directory for the merged run (default with --config: its output_dir).")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="Merge the shards of this run config (with --shards).")] = None,
    shards: Annotated[int | None, typer.Option(help="Number of shards the config was split into.", min=1)] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Config override, as given to run.")] = None,
    allow_different_judges: Annotated[
        bool,
        typer.Option(help="Merge runs judged by different judges (or naming two models alike) all the same."),
    ] = False,
) -> None:
    """Merge run directories (a local and an API run, say), or all N shards of a config; duplicates are refused."""
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.evaluation.report import print_summary, write_report
    from diagsafe_local.evaluation.runs import merge_runs, merge_shards

    if config is not None:
        if shards is None or run_dirs:
            raise DiagsafeError("with --config give --shards N and no run directories")
        from diagsafe_local.evaluation.config import load_config

        cfg = load_config(config, set_ or [])
        target = out or Path(cfg.output_dir)
        print_summary(merge_shards(cfg, shards, target))
        write_report(target)
        typer.echo(f"merged {shards} shards into {target}")
        return
    if not run_dirs or out is None:
        raise DiagsafeError("give run directories and --out, or --config and --shards")
    print_summary(merge_runs(run_dirs, out, allow_different_judges=allow_different_judges))
    typer.echo(f"merged {len(run_dirs)} runs into {out}")


@user_errors
def compare(
    run_a: Annotated[Path, typer.Argument(help="First run directory.")],
    run_b: Annotated[Path, typer.Argument(help="Second run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
    allow_different_datasets: Annotated[bool, typer.Option(help="Compare runs of different datasets anyway.")] = False,
) -> None:
    """Per-item agreement of verdicts and scores between two complete runs of the same dataset, with Cohen's kappa."""
    from diagsafe_local.evaluation.runs import compare_runs

    result = compare_runs(run_a, run_b, allow_different_datasets)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    typer.echo(
        f"shared answers: {result['shared']} (only in A: {result['only_in_a']}, only in B: {result['only_in_b']})"
    )
    typer.echo(f"identical answers: {result['identical_answers']}/{result['shared']}")
    typer.echo(
        f"label agreement: {fmt(result['label_agreement'])} over {result['both_scored']} judged by both; "
        f"Cohen's kappa {result['cohen_kappa_note'] or fmt(result['cohen_kappa'])}; "
        f"mean |score difference| {fmt(result['score_mean_abs_diff'])}"
    )
    for d in result["disagreements"][:10]:
        typer.echo(f"  {tuple(d['key'])}: {d['a']} vs {d['b']}")
