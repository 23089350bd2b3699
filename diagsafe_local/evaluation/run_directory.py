"""A run's directory: its lock, what an earlier run left there, the overwrite rules, and its record stores.

Nothing happens on construction. `open()` takes the directory's lock (one writer), removes a killed writer's
temporaries, and decides what to do with what is there: the same config's run is resumed; another config's
run, or run files without a manifest, are refused unless `overwrite` (then only the files the tool writes are
removed); a `config.yaml` the tool did not write is refused always (a user's own config is never overwritten).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar, cast

from diagsafe_local.core import atomic, signing
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.core.jsonl import JsonlStore, KeyedRecord
from diagsafe_local.core.locking import DirectoryLock
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.runs import files, passes
from diagsafe_local.runs.manifest import Manifest, read_manifest_file, write_config
from diagsafe_local.runs.records import GenerationRecord, ResultRecord

R = TypeVar("R", bound=KeyedRecord)


def run_files() -> tuple[str, ...]:
    """Every file a run writes; each judging pass's from its row (`runs.passes`)."""
    return (
        files.MANIFEST,
        files.CONFIG,
        files.GENERATIONS,
        files.RESULTS,
        files.SUMMARY,
        files.ATTACKS,
        *(row.file for row in passes.PASSES),
        files.SIGNATURE,
    )


class RunDirectory:
    """The files of one run (opened with `open()`): the run's own stores, and each judging pass's (`store`)."""

    generations: JsonlStore[GenerationRecord]
    results: JsonlStore[ResultRecord]
    attacks: JsonlStore[ResultRecord]

    def __init__(self, config: RunConfig, root: Path, overwrite: bool = False) -> None:
        self.root = root
        self.config = config
        self.overwrite = overwrite
        self.previous: Manifest | None = None
        self.lock: DirectoryLock | None = None
        self._passes: dict[type[KeyedRecord], JsonlStore[Any]] = {}

    def open(self) -> RunDirectory:
        """Lock the directory, resume or replace what is there, and open the record stores."""
        foreign = self.root / files.CONFIG
        if foreign.is_file() and not foreign.read_bytes().startswith(files.CONFIG_HEADER.encode()):
            raise DiagsafeError(
                f"{foreign} was not written by diagsafe-local (your own config?): a run writes its resolved config "
                "there and never overwrites a file it did not create; move the file or choose another output_dir"
            )
        self.lock = DirectoryLock(self.root, "run")
        try:
            self._resume_or_replace()
        except BaseException:
            self.close()
            raise
        return self

    def _resume_or_replace(self) -> None:
        atomic.remove_stale_temporaries(self.root)
        run_id = self.config.fingerprint()
        if (self.root / files.MANIFEST).exists():
            self.previous = read_manifest_file(self.root)
            if self.previous.run_id != run_id:
                if not self.overwrite:
                    raise DiagsafeError(
                        f"{self.root} holds a run of a different config (run id {self.previous.run_id}, "
                        f"this config {run_id}). Use another output_dir, or --overwrite to replace it."
                    )
                self._wipe()
            elif signing.signing_key() is not None:
                self._keep_signed(run_id)
        elif self.root.exists() and any((self.root / name).exists() for name in run_files()[2:]):
            if not self.overwrite:
                raise DiagsafeError(f"{self.root} holds run files without a manifest; use --overwrite to replace them.")
            self._wipe()
        elif self.overwrite and self.root.exists():
            self._wipe()
        self.root.mkdir(parents=True, exist_ok=True)
        self.generations = JsonlStore(self.root / files.GENERATIONS, GenerationRecord)
        self.results = JsonlStore(self.root / files.RESULTS, ResultRecord)
        self.attacks = JsonlStore(self.root / files.ATTACKS, ResultRecord)
        self._passes = {row.record: JsonlStore(self.root / row.file, row.record) for row in passes.PASSES}

    def store(self, record: type[R]) -> JsonlStore[R]:
        """The store of the judging pass whose records are `record`s: its row's file (`runs.passes.PASSES`)."""
        return cast(JsonlStore[R], self._passes[record])

    def _keep_signed(self, run_id: str) -> None:
        """With a signing key set, resume only from what was signed: a file whose signed part changed refuses the
        resume; what a killed writer added after the last signature is dropped (it is redone)."""
        for name, length in signing.signed_lengths(self.root, run_id, passes.signed_files()).items():
            path = self.root / name
            if length is None:
                path.unlink(missing_ok=True)
            elif path.stat().st_size > length:
                with open(path, "r+b") as handle:
                    handle.truncate(length)
        self.previous = read_manifest_file(self.root)

    def _wipe(self) -> None:
        # Only what the tool writes: a user's own files in the directory (or in figures/) stay.
        for name in run_files() + files.REPORT_FILES:
            (self.root / name).unlink(missing_ok=True)
        if (self.root / "figures").is_dir() and not any((self.root / "figures").iterdir()):
            (self.root / "figures").rmdir()
        self.previous = None

    def write_config(self, run_id: str) -> None:
        """config.yaml: the resolved config, marked as the tool's own."""
        write_config(self.root, run_id, self.config.model_dump(mode="json"))

    def close(self) -> None:
        """Release the lock (the stores are written as they go)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
