"""The files of a run directory: their names, written nowhere else, and `RunFiles`, which reads each once."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from diagsafe_local.core import jsonl, signing
from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.jsonfile import read_model
from diagsafe_local.core.jsonl import Line

M = TypeVar("M", bound=BaseModel)

MANIFEST = "manifest.json"
CONFIG = "config.yaml"
GENERATIONS = "generations.jsonl"
RESULTS = "results.jsonl"
CONTROLS = "judge_controls.jsonl"
ATTACKS = "attacks.jsonl"
SENSITIVITY = "sensitivity.jsonl"
JURY = "jury.jsonl"
ROBUSTNESS = "robustness.jsonl"
INJECTION = "injection_canary.jsonl"
CASCADE = "cascade.jsonl"
SUMMARY = "summary.json"
SIGNATURE = signing.SIGNATURE
RUN_LOG = "run.log"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
CHART = "figures/asr_by_category.png"
ATTACK_CHART = "figures/attack_success_vs_queries.png"
FLIPS = "flips.jsonl"
REPORT_FILES = (REPORT_MD, REPORT_HTML, CHART, ATTACK_CHART, FLIPS)
# The run's own files a signature covers: everything a decision or a resume reads but the judging passes' files,
# which `runs.passes.signed_files()` adds from the pass table.
SIGNED_FILES = (MANIFEST, CONFIG, GENERATIONS, RESULTS, ATTACKS, SUMMARY)
# The first line of the config.yaml the tool writes (a user's own config there is never overwritten).
CONFIG_HEADER = "# written by diagsafe-local: the resolved config of run"


class RunFiles:
    """A run directory's files, each read once: what is parsed is what was hashed, and the signature is checked
    against these hashes (`read`; None: absent), never against the files read again. A file that does not read
    is a reason to refuse the run (exit 3), and so is a symbolic link: the tool writes none, so a linked file
    holds another directory's bytes, never this run's."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.read: dict[str, signing.Signed | None] = {}

    def _path(self, name: str) -> Path:
        path = self.run_dir / name
        if path.is_symlink():
            raise RunFailed(f"refused, {name} is a symbolic link (to {path.readlink()}): not this run's file")
        return path

    def whole(self, name: str) -> bytes | None:
        """A small file's bytes (None: there is none)."""
        path = self._path(name)
        try:
            raw = path.read_bytes() if path.is_file() else None
        except OSError as exc:
            raise RunFailed(f"refused, {name} does not read: {exc}") from None
        self.read[name] = None if raw is None else signing.digest_of(raw)
        return raw

    def model(self, name: str, model: type[M], what: str) -> M | None:
        """A JSON file as its record (None: there is none); one that does not read refuses the run."""
        raw = self.whole(name)
        if raw is None:
            return None
        try:  # one pass over the bytes (a manifest is ~200 KB: json.loads, then validating its dict, took half again)
            return model.model_validate_json(raw)
        except ValidationError:
            pass  # what it refuses, the JSON reader reads or refuses as it always has (its own message)
        try:
            return read_model(self.run_dir / name, model, what, raw)
        except DiagsafeError as exc:
            raise RunFailed(f"refused, {name} does not read: {exc}") from None

    def stream(self, name: str, model: type[M]) -> Iterator[Line[M]]:
        """A JSONL file's records one at a time, hashed as they are read (none where there is no file)."""
        path = self._path(name)
        if not path.is_file():
            self.read[name] = None
            return
        digest = hashlib.sha256()
        try:
            size = yield from jsonl.stream(path, model, digest)
        except DiagsafeError as exc:
            raise RunFailed(f"refused, {name} does not read: {exc}") from None
        self.read[name] = signing.Signed(sha256=digest.hexdigest(), bytes=size)

    def records(self, name: str, model: type[M]) -> list[Line[M]] | None:
        """A small JSONL file's records, read whole (None: there is none)."""
        lines = list(self.stream(name, model))
        return None if self.read[name] is None else lines

    def sha256(self, name: str) -> str | None:
        """The SHA-256 of a file as read (None: absent, or not read)."""
        signed = self.read.get(name)
        return None if signed is None else signed.sha256

    def signature(self, run_id: str, required: bool, names: Sequence[str]) -> tuple[list[str], str]:
        """(problems, note) of the directory's signature over `names`, checked against the files as read here (the
        ones not read are hashed by `signing`): call it once every file a decision rests on was read."""
        raw = self.whole(signing.SIGNATURE)  # held: the bytes checked are the bytes an attestation states
        return signing.check_signature(self.run_dir, run_id, names, required, self.read, raw)
