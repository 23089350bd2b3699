"""`diagsafe-local submit CONFIG --shards N`: an array job (task i = shard i) plus a merge job after it.

Re-submitting skips shards that are already complete. `--dry-run` prints the sbatch commands and scripts.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors
from diagsafe_local.core.resources import slurm_file


def _sbatch(args: list[str]) -> str:
    from diagsafe_local.core.errors import DiagsafeError

    try:
        proc = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise DiagsafeError("sbatch not found: run this on a SLURM login node") from None
    if proc.returncode != 0:
        raise DiagsafeError(f"sbatch failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip().split(";")[0]


@user_errors
def submit(
    config: Annotated[Path, typer.Argument(help="Run config (YAML).")],
    shards: Annotated[int, typer.Option(help="Split the items into N shards, one array task each.", min=1)] = 1,
    partition: Annotated[str | None, typer.Option(help="SLURM partition.")] = None,
    gpus_per_task: Annotated[int, typer.Option(help="GPUs per shard (0 for CPU-only nodes).", min=0)] = 1,
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
    from diagsafe_local.evaluation.config import load_config
    from diagsafe_local.evaluation.runs import incomplete_shards

    overrides = set_ or []
    cfg = load_config(config, overrides)
    todo = incomplete_shards(cfg, shards)
    logs = Path(cfg.output_dir) / "slurm-logs"
    forwarded = [arg for o in overrides for arg in ("--set", o)]
    common = [f"--export=ALL,DIAGSAFE_VENV={sys.prefix}", *(sbatch_arg or [])]
    if partition:
        common.append(f"--partition={partition}")
    resources = [f"--gpus={gpus_per_task}", f"--cpus-per-task={cpus_per_task}", f"--mem={mem}", f"--time={time_limit}"]
    config_path = str(config.resolve())
    array = [
        f"--array={','.join(map(str, todo))}",
        "--job-name=diagsafe-shard",
        *common,
        *resources,
        f"--output={logs.resolve()}/shard-%a-job-%A.out",
        str(slurm_file("array.sbatch")),
        config_path,
        str(shards),
        *forwarded,
    ]
    merge = [
        "--job-name=diagsafe-merge",
        *common,
        "--cpus-per-task=1",
        "--mem=4G",
        "--time=00:30:00",
        f"--output={logs.resolve()}/merge-job-%j.out",
        str(slurm_file("merge.sbatch")),
        config_path,
        str(shards),
        *forwarded,
    ]
    if dry_run:
        if todo:
            typer.echo("sbatch " + shlex.join(array))
        typer.echo("sbatch --dependency=afterok:<array job id> " + shlex.join(merge))
        for script in ("array.sbatch", "merge.sbatch"):
            typer.echo(f"\n# ---- {slurm_file(script)}\n" + slurm_file(script).read_text())
        return
    logs.mkdir(parents=True, exist_ok=True)
    if todo:
        skipped = shards - len(todo)
        array_id = _sbatch(array)
        typer.echo(
            f"array job {array_id}: shards {','.join(map(str, todo))} of {shards}"
            + (f" ({skipped} already complete, skipped)" if skipped else "")
        )
        merge_id = _sbatch([f"--dependency=afterok:{array_id}", *merge])
    else:
        typer.echo(f"all {shards} shards are complete; submitting only the merge")
        merge_id = _sbatch(merge)
    typer.echo(f"merge job {merge_id}: writes the merged run and report to {cfg.output_dir}")
    typer.echo(f"watch:  squeue -j {','.join([array_id, merge_id] if todo else [merge_id])}   |   tail -f {logs}/*.out")
