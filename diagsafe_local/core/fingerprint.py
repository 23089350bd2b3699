"""A local model directory by its content: what identifies a checkpoint, whatever its path (a new checkpoint
written to the same path is another model). The content is the files a run loads (`core.model_files`, the rule
`pack` copies by): a directory and its pack copy are one checkpoint, and a model card or a repository file is no
part of it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from diagsafe_local.core.model_files import loaded_files

FULL_HASH_LIMIT = 2 * 1024**3


def model_fingerprint(path: str, load_format: str = "auto") -> str | None:
    """SHA-256 over the files a run loads from a local model directory read with `load_format` (`model_files`;
    `ADAPTER` for a LoRA adapter's), or over a single file; None for hub ids.

    Each file adds its path inside the directory, its size and its bytes. Where the files loaded pass 2 GiB, each
    adds its first and last MiB in place of every byte (`sha256-sampled:`), which tells checkpoints apart without
    reading tens of gigabytes.
    """
    root = Path(path)
    if not root.exists():
        return None
    files = loaded_files(root, load_format) if root.is_dir() else [(root, root.name)]
    full = sum(p.stat().st_size for p, _ in files) <= FULL_HASH_LIMIT
    digest = hashlib.sha256()
    for p, relative in files:
        digest.update(relative.encode())
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
