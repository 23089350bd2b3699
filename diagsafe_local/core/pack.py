"""A pack: everything a run config needs on an air-gapped node, in one directory, with `pack.lock` listing every
file by SHA-256, size and where it came from (`diagsafe-local pack` writes it; `run --pack` reads only from it).

The lock names each part the config needs (a model, a LoRA adapter, the prompt set, WordNet, the embedding
model, a vocabulary, a judge's policy file or validation) by the reference the config gives it, so `run --pack`
finds each in the pack or refuses before anything loads. `open_pack` checks every file's size and hash first;
`using` puts a verified pack in force for this process (the parts that load outside the config, WordNet and the
embedding model, ask `part`; a policy file the config names, `local_file`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from diagsafe_local.core.cache import file_sha256
from diagsafe_local.core.errors import DiagsafeError, RunFailed

LOCK = "pack.lock"
LOCK_VERSION = 1
ENV = "DIAGSAFE_PACK"
PartKind = Literal[
    "model", "adapter", "chat_template", "dataset", "wordnet", "embedding", "vocabulary", "policy", "validation"
]


class PackedFile(BaseModel):
    """One file of the pack."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="Where it lies in the pack (relative, '/'-separated).")
    sha256: str = Field(description="SHA-256 of its bytes.")
    size: int = Field(ge=0, description="Its size in bytes.")
    source: str = Field(description="Where it was copied from: a path on the packing machine.")


class PackedPart(BaseModel):
    """A part the config needs, as the config names it, and where the pack holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: PartKind = Field(description="What it is.")
    reference: str = Field(description="How the config names it: a model's path or hub id, a prompt set, a metric.")
    revision: str | None = Field(None, description="The hub revision asked for (None: a local path or the default).")
    origin: str = Field(description="Where it came from: a local path, or `hub:ID@COMMIT` from the hub cache.")
    path: str | None = Field(
        description="Its file or directory in the pack (relative); None: looked up when packing and not found "
        "(`judge.validation: auto` where no validation was stored for the judge), which the run then says."
    )
    base: str | None = Field(None, description="An adapter's base model, as the config names it.")


class PackLock(BaseModel):
    """pack.lock: the parts a config needs and every file of the pack, each by its hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(LOCK_VERSION, description="Version of this file's format.")
    created: str = Field(description="When the pack was made (ISO 8601, UTC).")
    config: str = Field(description="The config the pack was made for (its path when packed).")
    parts: list[PackedPart] = Field(description="Each part the config needs.")
    files: list[PackedFile] = Field(description="Every file of the pack but this lock.")

    def find(self, kind: PartKind, reference: str, revision: str | None = None) -> PackedPart | None:
        return next((p for p in self.parts if (p.kind, p.reference, p.revision) == (kind, reference, revision)), None)


@dataclass(frozen=True)
class Pack:
    """A pack whose every file was checked against its lock."""

    root: Path
    lock: PackLock
    lock_sha256: str

    def part(self, kind: PartKind, reference: str, revision: str | None = None) -> Path | None:
        """Where the pack holds a part (None: it does not, or it records that packing found none)."""
        found = self.lock.find(kind, reference, revision)
        return self.root / found.path if found is not None and found.path is not None else None


def refused(root: Path, what: str) -> DiagsafeError:
    """A part the pack does not hold (exit 2): say which, and how to pack it."""
    return DiagsafeError(
        f"the pack {root} has no {what}, which the config needs; make the pack for this config where the files "
        f"are: `diagsafe-local pack CONFIG --out {root}`"
    )


def open_pack(root: Path) -> Pack:
    """Read `root`'s lock and check every file it lists (size, then SHA-256): a missing lock or file refuses with
    exit 2; a file whose bytes differ, a file (or link) the lock does not list, or a lock path outside the pack
    with exit 3, each naming the file."""
    lock_path = root / LOCK
    try:
        data = lock_path.read_bytes()
    except OSError:
        raise DiagsafeError(
            f"{lock_path}: no pack lock (not a pack, or one whose packing did not finish): make it with "
            f"`diagsafe-local pack CONFIG --out {root}`"
        ) from None
    try:
        lock = PackLock.model_validate_json(data)
    except ValidationError as exc:
        raise RunFailed(f"{lock_path}: not a pack lock this version reads ({exc.errors()[0]['msg']})") from None
    named = [part.path for part in lock.parts if part.path is not None] + [packed.path for packed in lock.files]
    outside = next((path for path in named if not _inside(root, path)), None)
    if outside is not None:
        raise RunFailed(f"{lock_path}: names {outside!r}, outside the pack: refused")
    listed = {root / packed.path for packed in lock.files} | {lock_path}
    unlisted = next((p for p in sorted(root.rglob("*")) if p.is_symlink() or not (p.is_dir() or p in listed)), None)
    if unlisted is not None:
        raise RunFailed(
            f"{unlisted}: in the pack but not in its {LOCK} (added after packing): refused; remove it or pack again: "
            f"`diagsafe-local pack CONFIG --out {root}`"
        )
    for packed in lock.files:
        path = root / packed.path
        if not path.is_file():
            raise DiagsafeError(
                f"{path}: missing from the pack (its lock lists it); pack again: "
                f"`diagsafe-local pack CONFIG --out {root}`"
            )
        if path.stat().st_size != packed.size or file_sha256(path) != packed.sha256:
            raise RunFailed(
                f"{path}: its bytes are not the ones packed (SHA-256 differs from {LOCK}): refused; pack again: "
                f"`diagsafe-local pack CONFIG --out {root}`"
            )
    return Pack(root=root, lock=lock, lock_sha256=hashlib.sha256(data).hexdigest())


def _inside(root: Path, path: str) -> bool:
    """`path` (as a lock names it) is relative and lies inside the pack at `root`."""
    return not Path(path).is_absolute() and (root / path).resolve().is_relative_to(root.resolve())


_in_force: list[Pack] = []  # the pack this process reads from (one, or none)


def current() -> Pack | None:
    """The pack in force in this process (within `using`), if any."""
    return _in_force[-1] if _in_force else None


def part(kind: PartKind, reference: str) -> Path | None:
    """Where the pack in force holds a part (None: no pack in force); a pack in force that lacks it refuses."""
    pack = current()
    if pack is None:
        return None
    found = pack.part(kind, reference)
    if found is None:
        raise refused(pack.root, f"{kind} '{reference}'")
    return found


def local_file(kind: PartKind, reference: str) -> Path:
    """A file the config names by path (a judge's policy file): the pack's copy where a pack is in force (one that
    lacks it refuses; a path inside the pack is its own copy), else the path itself."""
    pack = current()
    path = Path(reference)
    if pack is None or path.resolve().is_relative_to(pack.root.resolve()):
        return path
    found = part(kind, reference)
    assert found is not None
    return found


@contextmanager
def using(pack: Pack) -> Iterator[Pack]:
    """Within: `pack` is the one this process reads from."""
    _in_force.append(pack)
    try:
        yield pack
    finally:
        _in_force.remove(pack)
