"""`diagsafe-local watch CHECKPOINT_DIR --config CONFIG`: evaluate a training run's checkpoints as they are saved."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import (
    CpusPerTask,
    GpuMemory,
    GpuRequest,
    GpusPerTask,
    Hooks,
    JobsOffline,
    Mem,
    Overrides,
    Partition,
    SbatchArgs,
    TimeLimit,
    run_end_hooks,
    user_errors,
)


@user_errors
def watch(
    checkpoint_dir: Annotated[Path, typer.Argument(help="The training run's output directory (checkpoint-N/ inside).")],
    config: Annotated[Path, typer.Option(help="Run config: its one target is replaced by each checkpoint.")],
    out: Annotated[
        Path | None, typer.Option(help="The series directory (default: CHECKPOINT_DIR/safety-series).")
    ] = None,
    submit: Annotated[
        bool, typer.Option("--submit", help="Submit each batch of new checkpoints to SLURM as one array job.")
    ] = False,
    local: Annotated[bool, typer.Option("--local", help="Evaluate new checkpoints here, one after another.")] = False,
    every: Annotated[
        int | None, typer.Option(help="Evaluate only checkpoints whose step is a multiple of K.", min=1)
    ] = None,
    until_step: Annotated[
        int | None, typer.Option(help="Stop once every checkpoint up to this step is done.", min=0)
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="One pass, then stop (for cron, or after training).")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between passes.", min=0.1)] = 60.0,
    settle: Annotated[
        float,
        typer.Option(help="A plain model directory (not checkpoint-N) counts once unchanged this many seconds.", min=0),
    ] = 30.0,
    baseline: Annotated[
        Path | None, typer.Option(help="The production model's run directory: each checkpoint is compared with it.")
    ] = None,
    margin: Annotated[float, typer.Option(help="The series report's regression margin (ASR increase).", min=0)] = 0.02,
    set_: Overrides = None,
    partition: Partition = None,
    gpus_per_task: GpusPerTask = None,
    gpu_memory: GpuMemory = 80.0,
    gpu_request: GpuRequest = None,
    cpus_per_task: CpusPerTask = 8,
    mem: Mem = "64G",
    time_limit: TimeLimit = "04:00:00",
    sbatch_arg: SbatchArgs = None,
    offline: JobsOffline = True,
    hook: Hooks = None,
) -> None:
    """Find the checkpoints a training run saves, evaluate each complete one (--submit: SLURM array jobs; --local:
    here), keep where each stands in a series directory (a restarted watch resumes it), and rebuild the series
    report as they finish. Stops at SERIES/STOP, on SIGTERM, after --until-step, or after one pass (--once)."""
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.evaluation.slurm import Resources, gpu_request_form
    from diagsafe_local.evaluation.watch import SeriesSpec
    from diagsafe_local.evaluation.watch import watch as watch_series

    if submit == local:
        raise DiagsafeError("choose how checkpoints are evaluated: --submit (SLURM) or --local (here)")
    series_dir = out or checkpoint_dir / "safety-series"
    spec = SeriesSpec(series_dir, checkpoint_dir, config, set_, every, baseline)
    resources = None
    if submit:
        resources = Resources.planned(
            config,
            set_ or [],
            gpu_memory,
            gpus_per_task,
            partition=partition,
            cpus_per_task=cpus_per_task,
            mem=mem,
            time=time_limit,
            sbatch_args=sbatch_arg or [],
            gpu_request=gpu_request_form(gpu_request),
            offline=offline,
        )

    def updated(directory: Path) -> None:
        from diagsafe_local.commands.report import report

        report(directory, margin=margin, hook=hook)

    reason = watch_series(
        spec,
        "submit" if submit else "local",
        resources=resources,
        until_step=until_step,
        interval=interval,
        settle=settle,
        once=once,
        say=typer.echo,
        on_update=updated,
        after_run=lambda run_dir: run_end_hooks(run_dir, hook),
    )
    typer.echo(f"watch stopped: {reason}; series: {spec.series_dir}")
