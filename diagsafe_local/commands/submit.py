"""`diagsafe-local submit CONFIG --shards N`: an array job (task i = shard i) plus a merge job after it.

Re-submitting skips shards that are already complete. `--dry-run` prints the sbatch commands and scripts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def submit(
    config: Annotated[Path, typer.Argument(help="Run config (YAML).")],
    shards: Annotated[int, typer.Option(help="Split the items into N shards, one array task each.", min=1)] = 1,
    partition: Annotated[str | None, typer.Option(help="SLURM partition.")] = None,
    gpus_per_task: Annotated[
        int | None,
        typer.Option(
            help="GPUs per shard (0 for CPU-only nodes). Default: what the largest model needs on GPUs of "
            "--gpu-memory GiB (see `diagsafe-local plan`).",
            min=0,
        ),
    ] = None,
    gpu_memory: Annotated[float, typer.Option(help="GiB per GPU on the partition, to plan --gpus-per-task.")] = 80.0,
    cpus_per_task: Annotated[int, typer.Option(help="CPUs per shard.", min=1)] = 8,
    mem: Annotated[str, typer.Option(help="Memory per shard, e.g. 64G.")] = "64G",
    time_limit: Annotated[str, typer.Option("--time", help="Time limit per shard, e.g. 04:00:00.")] = "04:00:00",
    sbatch_arg: Annotated[
        list[str] | None, typer.Option(help="Extra sbatch argument for both jobs (repeatable), e.g. --account=x.")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Config override, passed on to every job.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the sbatch commands and scripts; submit nothing.")] = False,
) -> None:
    """Submit the sharded evaluation and its merge job to SLURM; print job ids and how to watch them."""
    from diagsafe_local.evaluation.slurm import Resources, planned_gpus, submit_shards

    resources = Resources(
        partition=partition,
        gpus_per_task=planned_gpus(config, set_ or [], gpu_memory) if gpus_per_task is None else gpus_per_task,
        cpus_per_task=cpus_per_task,
        mem=mem,
        time=time_limit,
        sbatch_args=sbatch_arg or [],
    )
    submit_shards(config, set_ or [], shards, resources, dry_run, typer.echo)
