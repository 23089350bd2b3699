"""Signed run directories: an HMAC over the SHA-256 of each file a decision rests on.

A hash inside the directory proves nothing against someone who can write the directory (they recompute it).
A key they do not hold does: with `DIAGSAFE_SIGNING_KEY` set, the command that finishes a run writes
`signature.json` (HMAC-SHA256 of the run id and each file's SHA-256), and `gate --require-signature`, run
with the same key, refuses a directory whose files changed since. The key never enters a file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core import atomic
from diagsafe_local.core.cache import file_sha256
from diagsafe_local.core.errors import DiagsafeError

KEY_ENV = "DIAGSAFE_SIGNING_KEY"
SIGNATURE = "signature.json"


class Signature(BaseModel):
    """signature.json: which files were signed, their hashes, and the HMAC over both."""

    model_config = ConfigDict(extra="forbid")

    algorithm: str = "hmac-sha256"
    run_id: str
    files: dict[str, str | None]  # name -> SHA-256 (None: the file did not exist)
    hmac: str


def signing_key(required: bool = False) -> bytes | None:
    """The key from the environment; with `required`, its absence is a usage error."""
    key = os.environ.get(KEY_ENV)
    if not key:
        if required:
            raise DiagsafeError(f"--require-signature needs the signing key in the environment variable {KEY_ENV}")
        return None
    return key.encode("utf-8")


def _digest(key: bytes, run_id: str, hashes: dict[str, str | None]) -> str:
    message = json.dumps({"run_id": run_id, "files": hashes}, sort_keys=True).encode("utf-8")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _hashes(directory: Path, names: Sequence[str]) -> dict[str, str | None]:
    return {name: file_sha256(directory / name) if (directory / name).is_file() else None for name in names}


def sign(directory: Path, run_id: str, names: Sequence[str]) -> bool:
    """Write signature.json for `names` when a key is set (True); without one, remove a stale signature."""
    key = signing_key()
    path = directory / SIGNATURE
    if key is None:
        path.unlink(missing_ok=True)  # it would no longer match the files just written
        return False
    hashes = _hashes(directory, names)
    signature = Signature(run_id=run_id, files=hashes, hmac=_digest(key, run_id, hashes))
    atomic.write_text(path, signature.model_dump_json(indent=2) + "\n")
    return True


def check_signature(directory: Path, run_id: str, required: bool) -> tuple[list[str], str]:
    """(problems, note) of a directory's signature: verified when a key is set and a signature exists; with
    `required`, a missing key is a usage error and a missing signature a problem."""
    key = signing_key(required)
    path = directory / SIGNATURE
    if not path.is_file():
        return (
            [f"{directory}: no {SIGNATURE}: the run was not signed (set {KEY_ENV} when it runs)"] if required else []
        ), ("not signed")
    if key is None:
        return [], f"signed, but not checked ({KEY_ENV} is not set)"
    try:
        signature = Signature.model_validate_json(path.read_bytes())
    except ValueError:
        return [f"{path}: corrupt signature file"], "signature corrupt"
    expected = _digest(key, signature.run_id, signature.files)
    if not hmac.compare_digest(expected, signature.hmac):
        return [f"{path}: the signature does not verify with this key (another key, or the file was edited)"], (
            "signature invalid"
        )
    if signature.run_id != run_id:
        return [f"{path}: signed for run {signature.run_id}, not this run ({run_id})"], "signature of another run"
    actual = _hashes(directory, list(signature.files))
    changed = [name for name, digest in signature.files.items() if actual[name] != digest]
    if changed:
        return [f"{directory}: changed since it was signed: {', '.join(changed)}"], "signature does not match"
    return [], "signature verified"
