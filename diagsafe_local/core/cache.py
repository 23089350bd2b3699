"""Where diagsafe-local keeps downloads and prepared data."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    """DIAGSAFE_CACHE if set, else ~/.cache/diagsafe-local."""
    return Path(os.environ.get("DIAGSAFE_CACHE", Path.home() / ".cache" / "diagsafe-local"))


def judge_cache() -> Path:
    """Where judges' validations are kept by judge identity (see `judging.cards`): DIAGSAFE_JUDGE_CACHE if set,
    else `judges/` in the cache."""
    return Path(os.environ.get("DIAGSAFE_JUDGE_CACHE", cache_dir() / "judges"))


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
