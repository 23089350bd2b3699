"""Data parallelism on one node: the run split into shards, each shard a `diagsafe-local run --shard` process on
its own group of GPUs, then merged into the run directory.

Shards are the same deterministic, resumable shards as `submit`'s array jobs, so a killed run resumes shard by
shard, and a rerun on a node with a different number of GPUs keeps the shard count it started with (its
shards then run in turns on the groups there are).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from diagsafe_local.core.errors import RunFailed
from diagsafe_local.engines.gpus import visible_devices
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.sharding import Shard, incomplete_shards, merge_shards
from diagsafe_local.runs import files
from diagsafe_local.runs.manifest import GpuPlan, read_manifest_file
from diagsafe_local.runs.summary import Summary

SHARD_DIR = re.compile(r"shard-\d{4}-of-(\d{4})")


def started_shard_count(config: RunConfig) -> int | None:
    """The shard count of this config's shards already in its run directory, if any."""
    for path in sorted((Path(config.output_dir) / "shards").glob("shard-*-of-*")):
        match = SHARD_DIR.fullmatch(path.name)
        manifest = path / files.MANIFEST
        if match and manifest.is_file() and read_manifest_file(path).run_id == config.fingerprint():
            return int(match[1])
    return None


def unsharded_run(config: RunConfig) -> bool:
    """Whether the run directory holds a run made by one process (not a merge), which that process resumes."""
    manifest = Path(config.output_dir) / files.MANIFEST
    return manifest.is_file() and read_manifest_file(manifest.parent).merged_from is None


def run_replicas(
    config_path: Path,
    overrides: list[str],
    config: RunConfig,
    plan: GpuPlan,
    say: Callable[[str], None],
) -> Summary:
    """Run every incomplete shard as its own process on a free group of GPUs, then merge them; returns the
    merged summary. A failed shard leaves the others' work in place and the error names its log."""
    count = started_shard_count(config) or plan.replicas
    groups = plan.device_groups(visible_devices(plan.gpus)) if plan.gpus else [None] * plan.replicas
    todo = incomplete_shards(config, count)
    say(
        f"{count} shards over {len(groups)} replicas"
        + (f" of {plan.gpus_per_replica} GPU(s) each" if plan.gpus else " (no GPUs: processes on the CPU)")
        + f"; {count - len(todo)} already complete"
    )
    logs = Path(config.output_dir) / "shards"
    logs.mkdir(parents=True, exist_ok=True)
    free = list(groups)
    running: dict[int, tuple[subprocess.Popen[bytes], str | None]] = {}
    failed: list[str] = []
    try:
        while todo or running:
            while todo and free:
                index, group = todo.pop(0), free.pop(0)
                running[index] = (_launch(config_path, overrides, Shard(index=index, count=count), group, logs), group)
                say(f"shard {index}/{count} started" + (f" on GPUs {group}" if group else ""))
            time.sleep(0.5)
            for index, (proc, group) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[index]
                free.append(group)
                if proc.returncode == 0:
                    say(f"shard {index}/{count} finished")
                else:
                    failed.append(f"shard {index} (exit {proc.returncode}; log {_log(logs, index, count)})")
    finally:
        for proc, _ in running.values():  # interrupted: stop the shards (each resumes on the next run)
            proc.terminate()
        for proc, _ in running.values():
            proc.wait()
    if failed:
        raise RunFailed(f"{len(failed)} of {count} shards failed: " + "; ".join(failed) + ". Rerun to resume them.")
    return merge_shards(config, count)


def _log(logs: Path, index: int, count: int) -> Path:
    return logs / f"shard-{index:04d}-of-{count:04d}.log"


def _launch(
    config_path: Path, overrides: list[str], shard: Shard, group: str | None, logs: Path
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    if group is not None:
        env["CUDA_VISIBLE_DEVICES"] = group
    command = [
        sys.executable,
        "-m",
        "diagsafe_local.cli",
        "run",
        str(config_path),
        "--shard",
        f"{shard.index}/{shard.count}",
    ]
    command += [arg for o in overrides for arg in ("--set", o)]
    with _log(logs, shard.index, shard.count).open("ab") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
