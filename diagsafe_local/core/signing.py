"""Signed run directories: an HMAC over the SHA-256 (and length) of each file a decision or a resume rests on.

A hash inside the directory proves nothing against someone who can write the directory (they recompute it).
A key they do not hold does: with `DIAGSAFE_SIGNING_KEY` set, the command that writes a run directory signs it
each time it saves the manifest (`signature.json`: HMAC-SHA256 of the run id and each file's SHA-256 and
length), and `gate --require-signature`, run with the same key, refuses a directory whose files changed since.
A resumed run checks the signature first and reuses only the signed part of each file. The key never enters a
file; it is read as bytes, whatever its encoding.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.core import atomic
from diagsafe_local.core.errors import DiagsafeError, RunFailed

KEY_ENV = "DIAGSAFE_SIGNING_KEY"
SIGNATURE = "signature.json"
_CHUNK = 1 << 20


class Signed(BaseModel):
    """One signed file: its length and the SHA-256 of its content."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str
    bytes: int = Field(ge=0)


class Signature(BaseModel):
    """signature.json: which files were signed (None: the file did not exist), and the HMAC over them."""

    model_config = ConfigDict(extra="forbid")

    algorithm: Literal["hmac-sha256"] = Field(
        description="How `hmac` was made; a file naming any other (or none) is not one this tool can verify."
    )
    run_id: str
    files: dict[str, Signed | None]
    hmac: str


def signing_key(required: bool = False) -> bytes | None:
    """The key from the environment, as bytes; with `required`, its absence is a usage error."""
    key = os.environb.get(KEY_ENV.encode())
    if not key:
        if required:
            raise DiagsafeError(f"--require-signature needs the signing key in the environment variable {KEY_ENV}")
        return None
    return key


def _digest(key: bytes, run_id: str, files: dict[str, Signed | None]) -> str:
    listing = {name: None if signed is None else signed.model_dump() for name, signed in files.items()}
    message = json.dumps({"run_id": run_id, "files": listing}, sort_keys=True).encode("utf-8")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _prefix_sha256(path: Path, length: int) -> str | None:
    """SHA-256 of the first `length` bytes of a file (None when it is shorter)."""
    digest, left = hashlib.sha256(), length
    with open(path, "rb") as handle:
        while left:
            chunk = handle.read(min(_CHUNK, left))
            if not chunk:
                return None
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def _file(path: Path) -> Signed | None:
    if not path.is_file():
        return None
    size = path.stat().st_size
    return Signed(sha256=_prefix_sha256(path, size) or "", bytes=size)


def sign(directory: Path, run_id: str, names: Sequence[str]) -> bool:
    """Write signature.json for `names` when a key is set (True); without one, remove a stale signature."""
    key = signing_key()
    path = directory / SIGNATURE
    if key is None:
        path.unlink(missing_ok=True)  # it would no longer match the files just written
        return False
    files = {name: _file(directory / name) for name in names}
    signature = Signature(algorithm="hmac-sha256", run_id=run_id, files=files, hmac=_digest(key, run_id, files))
    atomic.write_text(path, signature.model_dump_json(indent=2) + "\n")
    return True


def _read(
    directory: Path, key: bytes, run_id: str, names: Sequence[str], raw: bytes | None = None
) -> tuple[Signature | None, list[str]]:
    """The signature, if its HMAC verifies with `key`, covers exactly `names` and is of `run_id` (`raw`: the
    signature file's bytes as the caller read them; None: read here)."""
    path = directory / SIGNATURE
    try:
        signature = Signature.model_validate_json(path.read_bytes() if raw is None else raw)
    except ValueError:
        return None, [f"{path}: corrupt signature file"]
    expected = _digest(key, signature.run_id, signature.files)
    if not hmac.compare_digest(expected.encode(), signature.hmac.encode("utf-8", "replace")):
        return None, [f"{path}: the signature does not verify with this key (another key, or the file was edited)"]
    if signature.run_id != run_id:
        return None, [f"{path}: signed for run {signature.run_id}, not this run ({run_id})"]
    if sorted(signature.files) != sorted(names):
        return None, [f"{path}: signs {sorted(signature.files)}, not the run's files {sorted(names)}"]
    return signature, []


def digest_of(raw: bytes) -> Signed:
    """A file's bytes as a signature records them."""
    return Signed(sha256=hashlib.sha256(raw).hexdigest(), bytes=len(raw))


def check_signature(
    directory: Path,
    run_id: str,
    names: Sequence[str],
    required: bool,
    read: Mapping[str, Signed | None],
    signature: bytes | None,
) -> tuple[list[str], str]:
    """(problems, note) of a directory's signature: verified when a key is set and a signature exists; with
    `required`, a missing key is a usage error and a missing signature a problem. Every signed file must be
    exactly as signed, and a file signed as absent must still be absent. `read`: the files the caller read and
    decides on, as it read them (None: absent); they are checked as read, never read again here (the others are
    hashed here). `signature`: signature.json's bytes as the caller read them (None: there is none), so what
    is checked is what the caller holds (and may state: an attestation gives its SHA-256)."""
    key = signing_key(required)
    if signature is None:
        problems = [f"{directory}: no {SIGNATURE}: it was not signed (set {KEY_ENV} where it is written)"]
        return (problems if required else []), "not signed"
    if key is None:
        return [], f"signed, but not checked ({KEY_ENV} is not set)"
    valid, problems = _read(directory, key, run_id, names, signature)
    if valid is None:
        return problems, "signature invalid"
    changed = [
        name
        for name, signed in valid.files.items()
        if (read[name] if name in read else _file(directory / name)) != signed
    ]
    if changed:
        return [f"{directory}: changed since it was signed: {', '.join(changed)}"], "signature does not match"
    return [], "signature verified"


def signed_files(directory: Path, run_id: str, names: Sequence[str]) -> dict[str, Signed | None]:
    """Each file as the directory's signature records it (None: signed as absent), once the signature verifies
    with the key (which must be set), so a reader can check the bytes it holds against it. A directory without a
    valid signature is refused (exit 3)."""
    key = signing_key(required=True)
    assert key is not None
    if not (directory / SIGNATURE).is_file():
        raise RunFailed(f"{directory}: no {SIGNATURE}: it was not signed (set {KEY_ENV} where it is written)")
    signature, problems = _read(directory, key, run_id, names)
    if signature is None:
        raise RunFailed("; ".join(problems))
    return dict(signature.files)


def signed_lengths(directory: Path, run_id: str, names: Sequence[str]) -> dict[str, int | None]:
    """For a run resumed with a key set: how much of each file is signed (None: the file was signed as absent).
    Every file must begin with exactly the bytes that were signed; what a killed writer appended after that is
    not signed, and the caller drops it. A directory that was never signed, or whose signed part changed, is
    refused: nothing in it can be trusted to be reused."""
    key = signing_key()
    assert key is not None
    if not (directory / SIGNATURE).is_file():
        raise DiagsafeError(
            f"{directory} holds an earlier run that was not signed, and {KEY_ENV} is set: its work cannot be "
            "verified, so it is not reused; run with --overwrite to start over"
        )
    signature, problems = _read(directory, key, run_id, names)
    if signature is None:
        raise DiagsafeError("; ".join(problems) + "; its work is not reused: run with --overwrite to start over")
    changed = []
    for name, signed in signature.files.items():
        path = directory / name
        if signed is not None and (not path.is_file() or _prefix_sha256(path, signed.bytes) != signed.sha256):
            changed.append(name)
    if changed:
        raise DiagsafeError(
            f"{directory}: changed since it was signed: {', '.join(changed)}; its work is not reused: run with "
            "--overwrite to start over"
        )
    return {name: None if signed is None else signed.bytes for name, signed in signature.files.items()}
