"""A local model directory by its content: what identifies a checkpoint, whatever its path (a new checkpoint
written to the same path is another model)."""

from __future__ import annotations

import hashlib
from pathlib import Path

FULL_HASH_LIMIT = 2 * 1024**3


def model_fingerprint(path: str) -> str | None:
    """SHA-256 over a local model directory's files; None for hub ids.

    Directories over 2 GiB hash each file's size and first and last MiB instead of every byte,
    which tells checkpoints apart without reading tens of gigabytes.
    """
    root = Path(path)
    if not root.exists():
        return None
    files = sorted(p for p in (root.rglob("*") if root.is_dir() else [root]) if p.is_file())
    full = sum(p.stat().st_size for p in files) <= FULL_HASH_LIMIT
    digest = hashlib.sha256()
    for p in files:
        digest.update(str(p.relative_to(root) if root.is_dir() else p.name).encode())
        size = p.stat().st_size
        digest.update(str(size).encode())
        with open(p, "rb") as handle:
            if full:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            else:
                digest.update(handle.read(1 << 20))
                handle.seek(max(0, size - (1 << 20)))
                digest.update(handle.read(1 << 20))
    return ("sha256:" if full else "sha256-sampled:") + digest.hexdigest()
