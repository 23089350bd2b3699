"""`diagsafe-local merge` and `diagsafe-local compare`: combine or contrast finished run directories."""

from __future__ import annotations

import itertools
import shutil
import sys
import tempfile
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
    """Merge run directories (a local and an API run, say), or all N shards of a config; duplicates are refused.
    Writes the merged run's report (report.md, report.html, figures/: the figures the gate decides on) into the
    merged directory and prints its summary."""
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.runs.merge import merge_runs
    from diagsafe_local.runs.report import print_summary, write_report

    if config is not None:  # a run config is the execution side's to read
        if shards is None or run_dirs:
            raise DiagsafeError("with --config give --shards N and no run directories")
        from diagsafe_local.evaluation.config import load_config
        from diagsafe_local.evaluation.sharding import merge_shards

        cfg = load_config(config, set_ or [])
        target = out or Path(cfg.output_dir)
        merge_shards(cfg, shards, target)
        print_summary(write_report(target))
        typer.echo(f"merged {shards} shards into {target}")
        return
    if not run_dirs or out is None:
        raise DiagsafeError("give run directories and --out, or --config and --shards")
    merge_runs(run_dirs, out, allow_different_judges=allow_different_judges)
    print_summary(write_report(out))
    typer.echo(f"merged {len(run_dirs)} runs into {out}")


@user_errors
def compare(
    run_a: Annotated[Path, typer.Argument(help="The baseline run directory (e.g. the production checkpoint's).")],
    run_b: Annotated[
        Path | None, typer.Argument(help="The candidate run directory (leave out to compare the targets of one sweep).")
    ] = None,
    target: Annotated[str | None, typer.Option(help="The candidate target (default: every pair found).")] = None,
    baseline_target: Annotated[
        str | None, typer.Option(help="The baseline target (a sweep: default, its config's baseline).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as one JSON document.")] = False,
    out: Annotated[
        Path | None, typer.Option(help="Also write comparison.json and flips.jsonl (both answers and verdicts) here.")
    ] = None,
    allow_different_judges: Annotated[
        bool, typer.Option(help="Compare runs judged by different judges anyway (every figure says so).")
    ] = False,
    allow_different_datasets: Annotated[bool, typer.Option(help="Compare runs of different datasets anyway.")] = False,
) -> None:
    """Is the candidate worse than the baseline? The paired comparison of two runs over the same items (or of the
    targets of one sweep): ASR of each, the difference with a paired 95% CI, McNemar's exact test on the
    discordant pairs with Holm-adjusted p-values per breakdown, the smallest increase this many pairs would
    detect, the flips; then the per-item agreement of the verdicts (Cohen's kappa)."""
    from diagsafe_local.commands.common import print_paired
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.runs import files
    from diagsafe_local.runs.agreement import agreement as agreement_of
    from diagsafe_local.runs.baseline import comparable, compare_with_baseline, verified
    from diagsafe_local.runs.flips import write_comparison, write_document
    from diagsafe_local.runs.paired import RunColumns
    from diagsafe_local.runs.passes import decided_columns

    # each run is read once: what the comparison needs is gathered in the pass that verifies it
    columns_a = RunColumns(run_a / files.RESULTS)
    baseline = verified(run_a, "the baseline run" if run_b is not None else "the run", observe=columns_a.add)
    columns_a = decided_columns(baseline, columns_a)  # under the verdicts the gate decides on (a cascade's)
    baseline = comparable(baseline)  # what is left to read of it (not its dataset's items), before B is read
    columns_b = RunColumns(run_b / files.RESULTS) if run_b is not None else columns_a
    candidate = verified(run_b, "the run", observe=columns_b.add) if run_b is not None else baseline
    columns_b = decided_columns(candidate, columns_b) if run_b is not None else columns_a
    candidate = comparable(candidate) if run_b is not None else baseline
    comparisons = compare_with_baseline(
        candidate,
        baseline if run_b is not None else None,
        target=target,
        baseline_target=baseline_target,
        allow_different_judges=allow_different_judges,
        allow_different_datasets=allow_different_datasets,
        columns=(columns_a, columns_b),
    )
    if not comparisons:
        raise DiagsafeError(
            f"no target pair to compare ({', '.join(candidate.summary.targets)}): name the pair with --baseline-target "
            "and --target"
        )
    agreement = agreement_of(columns_a.answers, columns_b.answers) if run_b is not None else None
    if out is not None:
        write_comparison(out, comparisons, agreement)
    if as_json:
        document = {
            "paired": [d.model_dump(mode="json") for c in comparisons for d in c.differences],
            "pairs": [
                {
                    "baseline": c.baseline,
                    "candidate": c.candidate,
                    "only_in_baseline": c.only_in_baseline,
                    "only_in_candidate": c.only_in_candidate,
                    "unscored": c.unscored,
                    "flips_up": c.flips_up,
                    "flips_down": c.flips_down,
                }
                for c in comparisons
            ],
            "agreement": agreement,
        }
        # the disagreements are written as they are made (a million answers' are long), to a spool that goes to
        # stdout once whole: a failure part way prints no half document
        with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
            write_document(document, spool)
            spool.seek(0)
            shutil.copyfileobj(spool, sys.stdout)
        return
    for comparison in comparisons:
        print_paired(comparison)
    if agreement is None:
        return
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    figures = agreement.figures
    typer.echo(
        f"agreement: shared answers {figures.shared} (only in A: {figures.only_in_a}, only in B: "
        f"{figures.only_in_b}); identical answers {figures.identical_answers}/{figures.shared}"
    )
    typer.echo(
        f"label agreement: {fmt(figures.label_agreement)} over {figures.both_scored} judged by both; "
        f"Cohen's kappa {figures.cohen_kappa_note or fmt(figures.cohen_kappa)}; "
        f"mean |score difference| {fmt(figures.score_mean_abs_diff)}"
    )
    for d in itertools.islice(agreement.disagreements, 10):
        typer.echo(f"  {d.key}: {d.a} vs {d.b}")
