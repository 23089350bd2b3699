"""A pack: everything a run config needs on an air-gapped node, in one directory, with `pack.lock` listing every
file by SHA-256, size and where it came from (`diagsafe-local pack` writes it; `run --pack` reads only from it).

The lock names each part the config needs (a model, a LoRA adapter, the prompt set, WordNet, the embedding
model, a vocabulary, a judge's policy file or validation) by the reference the config gives it, so `run --pack`
finds each in the pack or refuses before anything loads. `open_pack` checks every file's size and hash first;
`using` puts a verified pack in force for this process (the parts that load outside the config, WordNet and the
embedding model, ask `part`; a policy file the config names, `local_file`).

A run hashes a pack once: its process's check records each file's stat (device, inode, size, modification and
change times) in the user's cache under a random token, which the run hands the processes it starts (its shard
processes: `CHECK_ENV` in their environment, `Pack.check`); theirs hash only a file whose stat differs. Any other
process, a later run among them, hashes every file: a stat vouches for the bytes only for a while (a write through
a shared mapping's still-dirty page changes bytes and no time), so the record is trusted only by the run that
made it, for `CHECK_LIFETIME_NS`, where no other user could have written it, and not for a file changed too close
to its check (within one tick of its file system's clock).
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import secrets
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from diagsafe_local.core import atomic
from diagsafe_local.core.cache import cache_dir, file_sha256
from diagsafe_local.core.errors import DiagsafeError, RunFailed

LOCK = "pack.lock"
LOCK_VERSION = 1
ENV = "DIAGSAFE_PACK"
PartKind = Literal[
    "model", "adapter", "chat_template", "dataset", "wordnet", "embedding", "vocabulary", "policy", "validation"
]
# A file changed this close to its check is not vouched for: a second change within the same tick of its file
# system's clock (4 ms on Linux, 1-2 s on some) would leave its times as they were.
CHECK_MARGIN_NS = 2_000_000_000
CHECK_ENV = "DIAGSAFE_PACK_CHECK"  # the token of the run's check, in the environment of the processes it starts
CHECK_LIFETIME_NS = 3600 * 1_000_000_000  # a run's shard processes start within it; later, a process hashes again
_TOKEN = re.compile(r"[0-9a-f]{32}")
AUTO_VALIDATION = "auto"  # `judge.validation: auto` (judging.cards.AUTO), the one part packing may find empty


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

    @model_validator(mode="after")
    def _found_or_auto(self) -> PackedPart:
        if self.path is None and (self.kind, self.reference) != ("validation", AUTO_VALIDATION):
            raise ValueError(
                f"{self.kind} '{self.reference}' has no path in the pack: only `judge.validation: "
                f"{AUTO_VALIDATION}`, found empty when packing, may have none"
            )
        return self


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
    check: str | None = None  # the token of the check this process made or was handed (None: none recorded)

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
        error = exc.errors()[0]
        where = ".".join(map(str, error["loc"]))
        raise RunFailed(
            f"{lock_path}: not a pack lock this version reads ({where + ': ' if where else ''}{error['msg']})"
        ) from None
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
    lock_sha256 = hashlib.sha256(data).hexdigest()
    token = os.environ.get(CHECK_ENV)
    vouched = _run_check(token, lock_sha256)
    checked: dict[str, FileStat] = {}
    for packed in lock.files:
        path = root / packed.path
        if not path.is_file():
            raise DiagsafeError(
                f"{path}: missing from the pack (its lock lists it); pack again: "
                f"`diagsafe-local pack CONFIG --out {root}`"
            )
        before = FileStat.of(path)
        if vouched.get(packed.path) == before:
            checked[packed.path] = before
            continue
        if before.size != packed.size or file_sha256(path) != packed.sha256 or FileStat.of(path) != before:
            raise RunFailed(
                f"{path}: its bytes are not the ones packed (SHA-256 differs from {LOCK}): refused; pack again: "
                f"`diagsafe-local pack CONFIG --out {root}`"
            )
        if before.ctime_ns <= time.time_ns() - CHECK_MARGIN_NS:
            checked[packed.path] = before
    if not vouched:  # this process's own check: its processes trust it
        token = _record_check(PackCheck(lock_sha256=lock_sha256, made_ns=time.time_ns(), files=checked))
    return Pack(root=root, lock=lock, lock_sha256=lock_sha256, check=token)


class FileStat(BaseModel):
    """What a file's stat says of its bytes when they were checked: another inode, size or time is another file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int = Field(description="The inode's change time: set by every write, never settable but by root.")

    @classmethod
    def of(cls, path: Path) -> FileStat:
        found = path.stat()
        return cls(
            dev=found.st_dev,
            ino=found.st_ino,
            size=found.st_size,
            mtime_ns=found.st_mtime_ns,
            ctime_ns=found.st_ctime_ns,
        )


class PackCheck(BaseModel):
    """A node's record that a pack's files were hashed against its lock: each file by its stat then."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lock_sha256: str
    made_ns: int = Field(description="When it was made (ns since the epoch): trusted for CHECK_LIFETIME_NS.")
    files: dict[str, FileStat] = Field(description="The files vouched for, by their path in the pack.")


def _check_file(token: str) -> Path:
    return cache_dir() / "pack-checks" / platform.node() / f"{token}.json"


def _run_check(token: str | None, lock_sha256: str) -> dict[str, FileStat]:
    """The files the check of the run this process belongs to (`token`) vouches for; none where there is no token,
    its record is of another lock, expired, could have been written by another user (it or a folder holding it
    not ours, writable by others, or a link) or does not read."""
    if token is None or not _TOKEN.fullmatch(token):
        return {}
    path = _check_file(token)
    try:
        for held in (path, path.parent, path.parent.parent):
            found = held.lstat()
            if found.st_uid != os.geteuid() or found.st_mode & 0o022 or stat.S_ISLNK(found.st_mode):
                return {}
        record = PackCheck.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return {}
    fresh = 0 <= time.time_ns() - record.made_ns <= CHECK_LIFETIME_NS
    return dict(record.files) if record.lock_sha256 == lock_sha256 and fresh else {}


def _record_check(record: PackCheck) -> str | None:
    """Keep the check for the processes this one starts, under a new token, in folders only this user can write,
    removing the records expired there; the token (None: a cache that cannot be written, and they hash the pack
    again)."""
    token = secrets.token_hex(16)
    path = _check_file(token)

    def write(tmp: Path) -> None:
        tmp.chmod(0o600)
        tmp.write_text(record.model_dump_json(), encoding="utf-8")

    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        for folder in (path.parent.parent, path.parent):
            folder.mkdir(mode=0o700, exist_ok=True)
        for old in path.parent.glob("*.json"):
            if old.stat().st_mtime_ns < record.made_ns - CHECK_LIFETIME_NS:
                old.unlink(missing_ok=True)
        atomic.write_with(path, write)
    except OSError:
        return None
    return token


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
