"""`diagsafe-local submit CONFIG --shards N`: an array job (task i = shard i) plus a merge job after it.

Re-submitting skips shards that are already complete. `--dry-run` prints the sbatch commands and scripts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import (
    CpusPerTask,
    GpuMemory,
    GpuRequest,
    GpusPerTask,
    JobsOffline,
    Mem,
    Partition,
    SbatchArgs,
    TimeLimit,
    user_errors,
)


@user_errors
def submit(
    config: Annotated[Path, typer.Argument(help="Run config (YAML).")],
    shards: Annotated[int, typer.Option(help="Split the items into N shards, one array task each.", min=1)] = 1,
    partition: Partition = None,
    gpus_per_task: GpusPerTask = None,
    gpu_memory: GpuMemory = 80.0,
    gpu_request: GpuRequest = None,
    cpus_per_task: CpusPerTask = 8,
    mem: Mem = "64G",
    time_limit: TimeLimit = "04:00:00",
    sbatch_arg: SbatchArgs = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Config override, passed on to every job.")] = None,
    offline: JobsOffline = True,
    dry_run: Annotated[bool, typer.Option(help="Print the sbatch commands and scripts; submit nothing.")] = False,
) -> None:
    """Submit the sharded evaluation and its merge job to SLURM; print job ids and how to watch them."""
    from diagsafe_local.evaluation.slurm import Resources, gpu_request_form, submit_shards

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
    submit_shards(config, set_ or [], shards, resources, dry_run, typer.echo)
