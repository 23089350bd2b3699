"""`diagsafe-local plan CONFIG`: how `run` would use a node's GPUs, and what to ask SLURM for."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def plan(
    config: Annotated[Path, typer.Argument(help="Run config (YAML).")],
    gpus: Annotated[
        int | None, typer.Option(help="Plan for a node with this many GPUs (default: the GPUs visible here).", min=1)
    ] = None,
    gpu_memory: Annotated[float, typer.Option(help="GiB of memory per GPU, with --gpus.", min=1)] = 80.0,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Config override (repeatable).")] = None,
) -> None:
    """Print each model's tensor parallel size, the number of pipeline replicas, and the sbatch request."""
    from diagsafe_local.engines.gpu_plan import GIB
    from diagsafe_local.evaluation.config import load_config
    from diagsafe_local.evaluation.planning import plan_run

    cfg = load_config(config, set_ or [])
    memory = [int(gpu_memory * GIB)] * gpus if gpus else None
    chosen = plan_run(cfg, None, memory)
    if not chosen.gpus:
        typer.echo("no GPUs visible: one process on the CPU (plan for a GPU node with --gpus N --gpu-memory GIB)")
        return
    typer.echo(f"{chosen.gpus} GPUs of {chosen.gpu_memory_bytes / GIB:.0f} GiB, placement {cfg.placement.mode}")
    for engine in chosen.engines:
        size = f"{engine.weight_bytes / GIB:.1f} GiB" if engine.weight_bytes else "size unknown"
        typer.echo(
            f"  {engine.role}: {engine.model} ({size}; {engine.memory_share:.0%} of each GPU) -> "
            f"tensor_parallel_size {engine.tensor_parallel_size}"
        )
    typer.echo(
        f"replicas: {chosen.replicas} x {chosen.gpus_per_replica} GPU(s), each on its shard of the items (at most one per item)"
    )
    for note in chosen.notes:
        typer.echo(f"note: {note}")
    typer.echo(
        f"one node:  sbatch --gpus={chosen.replicas * chosen.gpus_per_replica} slurm/multi_gpu.sbatch {config}\n"
        f"many nodes: diagsafe-local submit {config} --shards N --gpus-per-task {chosen.gpus_per_replica}"
    )
