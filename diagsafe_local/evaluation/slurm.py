"""SLURM submission of a sharded run: an array job (task i = shard i) plus a merge job after it.

Re-submitting skips shards that are already complete. Resources are sbatch options, never edits of the
templates: their `#SBATCH` lines are defaults that these options override. GPUs are asked for in the form the
site takes (`--gpus=N`, which needs select/cons_tres, or `--gres=gpu:N`), and not at all by a job that needs
none (an API-only run, the merge): some sites refuse `--gpus=0`. Jobs run offline (`run --offline`) unless
asked not to: their environment carries DIAGSAFE_OFFLINE=1.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import BaseModel, Field

from diagsafe_local.core import offline
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.core.resources import slurm_file
from diagsafe_local.evaluation.config import load_config
from diagsafe_local.evaluation.sharding import incomplete_shards

GpuRequest = Literal["gpus", "gres"]
GPU_REQUEST_SETTING = "DIAGSAFE_SLURM_GPU_REQUEST"  # the site's form, for every submit and watch on it


def gpu_request_form(asked: str | None = None) -> GpuRequest:
    """How jobs ask for GPUs: as `asked` (--gpu-request), else as the site's DIAGSAFE_SLURM_GPU_REQUEST says,
    else `gpus`."""
    value = asked or os.environ.get(GPU_REQUEST_SETTING) or "gpus"
    if value not in ("gpus", "gres"):
        where = "--gpu-request" if asked else GPU_REQUEST_SETTING
        raise DiagsafeError(f"{where}: expected gpus or gres, got {value!r}")
    return cast(GpuRequest, value)


class Resources(BaseModel):
    """What each shard asks SLURM for, and extra sbatch arguments for both jobs."""

    partition: str | None = None
    gpus_per_task: int = 1
    gpu_request: GpuRequest = Field(default_factory=gpu_request_form)
    cpus_per_task: int = 8
    mem: str = "64G"
    time: str = "04:00:00"
    sbatch_args: list[str] = []
    offline: bool = True

    @classmethod
    def planned(
        cls, config: Path, overrides: list[str], gpu_memory_gib: float, gpus_per_task: int | None, **asked: Any
    ) -> Resources:
        """The resources asked for, with GPUs per job, unless given, what the config's largest model needs on GPUs
        of `gpu_memory_gib` (see `planned_gpus`)."""
        gpus = planned_gpus(config, overrides, gpu_memory_gib) if gpus_per_task is None else gpus_per_task
        return cls(gpus_per_task=gpus, **asked)

    def export(self) -> str:
        """sbatch's --export for every job: the submitting environment, this virtualenv, and whether jobs run
        offline (`core.offline`), said either way so that the login node's environment does not decide."""
        return f"--export=ALL,DIAGSAFE_VENV={sys.prefix},{offline.ENV}={int(self.offline)}"

    def gpu_args(self) -> list[str]:
        """The sbatch arguments that ask for each job's GPUs: none where it needs none."""
        if self.gpus_per_task == 0:
            return []
        if self.gpu_request == "gres":
            return [f"--gres=gpu:{self.gpus_per_task}"]
        return [f"--gpus={self.gpus_per_task}"]


def planned_gpus(config: Path, overrides: list[str], gpu_memory_gib: float) -> int:
    """GPUs one shard needs: the largest tensor parallel size its models need on GPUs of this size; none where
    every model is behind an API."""
    from diagsafe_local.engines.gpu_plan import GIB
    from diagsafe_local.evaluation.planning import api_only, plan_run

    cfg = load_config(config, overrides)
    if api_only(cfg):
        return 0
    return plan_run(cfg, 1, [int(gpu_memory_gib * GIB)] * 8, replicate=False).gpus_per_replica


def sbatch(args: list[str]) -> str:
    """Submit a job; its id (of an array: the array's)."""
    try:
        proc = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise DiagsafeError("sbatch not found: run this on a SLURM login node") from None
    if proc.returncode != 0:
        raise DiagsafeError(f"sbatch failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip().split(";")[0]


def submit_shards(
    config: Path,
    overrides: list[str],
    shards: int,
    resources: Resources,
    dry_run: bool,
    say: Callable[[str], None],
) -> None:
    """Submit the incomplete shards of `config` and the merge job (or, with `dry_run`, say what would run)."""
    cfg = load_config(config, overrides)
    todo = incomplete_shards(cfg, shards)
    logs = Path(cfg.output_dir) / "slurm-logs"
    forwarded = [arg for o in overrides for arg in ("--set", o)]
    common = [resources.export(), *resources.sbatch_args]
    if resources.partition:
        common.append(f"--partition={resources.partition}")
    asked = [
        "--nodes=1",  # --gpus is a job's total: on several nodes a task would see only its first node's
        *resources.gpu_args(),
        f"--cpus-per-task={resources.cpus_per_task}",
        f"--mem={resources.mem}",
        f"--time={resources.time}",
    ]
    config_path = str(config.resolve())
    array = [
        f"--array={','.join(map(str, todo))}",
        "--job-name=diagsafe-shard",
        *common,
        *asked,
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
            say("sbatch " + shlex.join(array))
        say("sbatch --dependency=afterok:<array job id> " + shlex.join(merge))
        for script in ("array.sbatch", "merge.sbatch"):
            say(f"\n# ---- {slurm_file(script)}\n" + slurm_file(script).read_text())
        return
    logs.mkdir(parents=True, exist_ok=True)
    if todo:
        skipped = shards - len(todo)
        array_id = sbatch(array)
        say(
            f"array job {array_id}: shards {','.join(map(str, todo))} of {shards}"
            + (f" ({skipped} already complete, skipped)" if skipped else "")
        )
        merge_id = sbatch([f"--dependency=afterok:{array_id}", *merge])
    else:
        say(f"all {shards} shards are complete; submitting only the merge")
        merge_id = sbatch(merge)
    say(f"merge job {merge_id}: writes the merged run and report to {cfg.output_dir}")
    say(f"watch:  squeue -j {','.join([array_id, merge_id] if todo else [merge_id])}   |   tail -f {logs}/*.out")
