"""A local model directory by its content: what identifies a checkpoint, whatever its path (a new checkpoint
written to the same path is another model). The content is the files a run loads (`core.model_files`, the rule
`pack` copies by): a directory and its pack copy are one checkpoint, and a model card or a repository file is no
part of it."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from diagsafe_local.core.model_files import loaded_files

FULL_HASH_LIMIT = 2 * 1024**3
RACY_NS = 2_000_000_000  # a file changed this recently may change again under the same stat fields
_FINGERPRINTS: dict[tuple[str, str, tuple[tuple[str, int, int, int, int, int], ...]], str | None] = {}


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


def cached_fingerprint(path: str, load_format: str = "auto") -> str | None:
    """`model_fingerprint`, reused in this process while every file a run loads keeps its path, size, device,
    inode, mtime and ctime (git's index keys a file so; a user can put an mtime back with utime but not a ctime).
    A file changed within `RACY_NS` of the look is not cached: two writes within one timestamp tick can leave
    every field alike (git's racy entries)."""
    root = Path(path)
    now = time.time_ns()
    try:
        if not root.exists():
            return None  # a hub id, or a model behind an API
        files = loaded_files(root, load_format) if root.is_dir() else [(root, root.name)]
        stats = tuple((relative, p.stat()) for p, relative in files)
    except OSError:  # a name no file system holds (an API model name of 300 characters): not a local model
        return None
    key = (
        str(root.resolve()),
        load_format,
        tuple((r, s.st_size, s.st_dev, s.st_ino, s.st_mtime_ns, s.st_ctime_ns) for r, s in stats),
    )
    if key in _FINGERPRINTS:
        return _FINGERPRINTS[key]
    found = model_fingerprint(path, load_format)
    if all(s.st_ctime_ns < now - RACY_NS for _, s in stats):
        _FINGERPRINTS[key] = found
    return found
