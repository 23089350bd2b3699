"""Deterministic sharding by item id: the same item lands in the same shard on every machine and rerun; the
shards of a config merged into its run once every one is complete."""

from __future__ import annotations

from pathlib import Path

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.runs import files
from diagsafe_local.runs.manifest import Shard, read_manifest_file
from diagsafe_local.runs.merge import merge_runs
from diagsafe_local.runs.summary import Summary


def merge_shards(config: RunConfig, count: int, out: Path | None = None) -> Summary:
    """Check that all `count` shards of `config` are present and complete, then merge them.

    The merged run goes to `out` (default: the config's output_dir). Errors say exactly which shard
    is missing, incomplete, or from another config.
    """
    dirs, problems = [], []
    for index in range(count):
        shard = Shard(index=index, count=count)
        path = shard.directory(config.output_dir)
        manifest_path = path / files.MANIFEST
        if not manifest_path.is_file():
            problems.append(f"shard {index} of {count} is missing (no {manifest_path})")
            continue
        manifest = read_manifest_file(path)
        if manifest.run_id != config.fingerprint():
            problems.append(
                f"shard {index} of {count} ran another config (run id {manifest.run_id}, expected {config.fingerprint()})"
            )
        elif manifest.status != "complete":
            problems.append(f"shard {index} of {count} is incomplete (status '{manifest.status}'; resubmit it)")
        dirs.append(path)
    if problems:
        raise DiagsafeError("cannot merge:\n  " + "\n  ".join(problems))
    return merge_runs(dirs, out or Path(config.output_dir), replace=True)


def incomplete_shards(config: RunConfig, count: int) -> list[int]:
    """Indices of shards that have no complete run directory for this config."""
    missing = []
    for index in range(count):
        path = Shard(index=index, count=count).directory(config.output_dir)
        manifest = read_manifest_file(path) if (path / files.MANIFEST).is_file() else None
        if manifest is None or manifest.status != "complete" or manifest.run_id != config.fingerprint():
            missing.append(index)
    return missing
