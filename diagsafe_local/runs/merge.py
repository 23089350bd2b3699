"""Merge finished run directories into one (comparing runs is `runs.paired` and `runs.agreement`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from diagsafe_local.core import atomic, jsonl, signing
from diagsafe_local.core.cache import file_sha256
from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.locking import DirectoryLock
from diagsafe_local.runs import files
from diagsafe_local.runs import passes as table
from diagsafe_local.runs.manifest import (
    AttackRef,
    Manifest,
    SourceRun,
    TargetRef,
    joined_network,
    read_manifest_file,
    write_config,
    write_manifest,
)
from diagsafe_local.runs.pairing import line_digest
from diagsafe_local.runs.records import (
    SCHEMA_VERSION,
    ControlRecord,
    GenerationRecord,
    ResultRecord,
)
from diagsafe_local.runs.summarize import Summarizer
from diagsafe_local.runs.summary import Summary, write_summary
from diagsafe_local.runs.verify import VerifiedRun, verify_run

# A merge's private stage in its output directory: tempfile.mkdtemp's name (8 of [a-z0-9_]) after the prefix.
STAGE_PREFIX = ".merging."
STAGE = re.compile(re.escape(STAGE_PREFIX) + r"[a-z0-9_]{8}")


def read_manifest(run_dir: Path) -> Manifest:
    """The manifest of a complete run; an incomplete (running or killed) run is refused with exit code 3."""
    if not run_dir.is_dir():
        raise DiagsafeError(f"{run_dir}: no such run directory")
    manifest = read_manifest_file(run_dir)
    if manifest.status != "complete":
        raise RunFailed(
            f"{run_dir}: the run is not complete (status '{manifest.status}'): it is still running, "
            "or was stopped; resume it with the same `run` command first"
        )
    return manifest


def merge_runs(
    run_dirs: Sequence[Path], out: Path, replace: bool = False, allow_different_judges: bool = False
) -> Summary:
    """Merge complete runs of the same dataset into `out` (results, attack steps, generations, and each judging
    pass's records under its merge rule, as `runs.passes` declares it); refuse a run that does not verify as complete for its share of the dataset (with a signing
    key set: unsigned, or changed since it was signed), duplicates, schema mismatches, runs attacked under different
    attack configs, runs configured with different gate limits, and runs judged by different judges or holding one
    target name for different models (unless `allow_different_judges`). What is merged is what was verified: a
    source file that changes after its run verified stops the merge (see `_Attested`). The merged run is written
    as one, with its config, and signed where a key is set; a refused merge leaves `out` as it was."""
    if not run_dirs:
        raise DiagsafeError("merge needs run directories")
    results = _Placed(files.RESULTS, unique=True)
    steps, generations = _Placed(files.ATTACKS, unique=True), _Placed(files.GENERATIONS, unique=False)
    sources, attested = [], []
    by_pass: dict[str, dict[Any, jsonl.KeyedRecord]] = {}  # each pass merged by key: its sources' records
    for index, run_dir in enumerate(run_dirs):

        def place(line: jsonl.Line[ResultRecord], prompt: str, *, run_dir: Path = run_dir) -> None:  # prompt: unread
            _check_schema(run_dir, line.record)
            results.place(line)

        start = results.rows()
        source = _verified_source(run_dir, place)  # its results are placed in the pass that verifies them
        assert source.results_sha256 is not None  # a run without results does not verify
        verified = _Attested(run_dir, source.manifest.run_id)
        for read in source.passes.values():  # merged as verify read them: the bytes checked are the bytes merged
            if read.row.merge == "union":
                verified.check_held(read.row.file, read.sha256)
                if read.records is not None:
                    by_pass.setdefault(read.row.name, {}).update((r.key, r) for r in read.records)
        verified.check(files.RESULTS, source.results_sha256)
        results.read(index, start, source.results_sha256)
        sources.append(source)
        attested.append(verified)
    manifests = [s.manifest for s in sources]
    datasets = {m.dataset.sha256 for m in manifests}
    if len(datasets) > 1:
        listing = ", ".join(f"{d} ({m.dataset.sha256[:12]})" for d, m in zip(run_dirs, manifests))
        raise DiagsafeError(f"the runs evaluate different datasets: {listing}")
    targets = _same_judge_and_targets(run_dirs, manifests, allow_different_judges)
    attack = _same_attack(run_dirs, manifests)
    _same_gate(run_dirs, manifests)
    results.check(run_dirs)  # duplicates are said after what makes the runs unmergeable: that is what to fix first
    if (out / files.RESULTS).exists() and not replace:
        raise DiagsafeError(f"{out} already holds results; choose an empty directory")
    first = manifests[0]
    # the judge's validated error rates carry over when every merged run was corrected by the same verified ones
    same = all(m.validation == first.validation for m in manifests) and all(s.validation for s in sources)
    validation, validation_ref = (sources[0].validation, first.validation) if same else (None, None)
    summarizer = Summarizer(validation, attack, first.judge.instructions if first.judge else None)
    for index, (run_dir, source, verified) in enumerate(zip(run_dirs, sources, attested)):
        assert source.tallies is not None  # every verified run carries them
        summarizer.absorb(source.tallies)  # the sources' tallies add up to the merged run's
        start = steps.rows()
        for line in source.attack_steps():
            _check_schema(run_dir, line.record)
            steps.place(line)
        verified.check(files.ATTACKS, source.attacks_sha256)
        if source.attacks_sha256 is not None:
            steps.read(index, start, source.attacks_sha256)
        verified.check(files.GENERATIONS, _place_generations(run_dir, index, generations))
    run_id = "merged:" + "+".join(m.run_id for m in manifests)
    summarizer.controls = [c for c in by_pass.get("controls", {}).values() if isinstance(c, ControlRecord)]
    with _staged(out) as stage:
        results.write(stage, run_dirs)
        if attack is not None:
            steps.write(stage, run_dirs)
        generations.write(stage, run_dirs)
        for name, records in by_pass.items():
            jsonl.write(stage / table.named(name).file, sorted(records.values(), key=lambda r: r.key))
        summary = write_summary(stage, summarizer.summary().model_copy(update={"run_id": run_id}))
        write_config(stage, run_id, first.config)
        merged = Manifest(
            run_id=run_id,
            status="complete",
            merged_from=[str(d) for d in run_dirs],
            dataset=first.dataset,
            config=first.config,
            judge=first.judge,
            targets=targets,
            attack=attack,
            validation=validation_ref,
            # every source verified, its canary included: the merge's holds where all of theirs did
            grammar=first.grammar if all(m.grammar and m.grammar.enforced for m in manifests) else None,
            network=joined_network([m.network for m in manifests]),
            sources=[
                SourceRun(run_dir=str(d), run_id=m.run_id, engines=m.engines) for d, m in zip(run_dirs, manifests)
            ],
        )
        write_manifest(stage, merged)
        signing.sign(stage, run_id, table.signed_files())
    return summary


@contextmanager
def _staged(out: Path) -> Iterator[Path]:
    """A private directory inside `out` to write the merged run into; once every file is written they replace
    the merged run's files in `out` (the manifest, then the signature, last; a file the merged run does not have
    is removed), so a merge refused half-way leaves `out` as it was, never half a run. It holds `out`'s lock
    throughout (one writer: another merge, or a run writing there, is refused), and first removes the stages
    that merges killed before they could (SIGKILL, node loss) left there: none of them can be live, as a live
    merge would hold the lock."""
    lock = DirectoryLock(out, "merge")
    try:
        for stale in out.iterdir():
            if STAGE.fullmatch(stale.name) and stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale)
        stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=out))
    except BaseException:
        lock.release()
        raise
    try:
        yield stage
        names = [name for name in table.signed_files() if name != files.MANIFEST] + [files.MANIFEST, files.SIGNATURE]
        with atomic.outputs_together():
            (out / files.SIGNATURE).unlink(missing_ok=True)  # no signature over a mixture while the files move
            for name in names:
                if (stage / name).is_file():
                    os.replace(stage / name, out / name)
                else:
                    (out / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        lock.release()


class _Attested:
    """What a source's files were verified as. With a signing key set (merging then signs), every file merged
    must hash, as merge read it, to what the source's signature records: merge never signs a byte the source's
    key did not. With a key or without, the small files merge holds (read before the run was verified) must
    still be as they were once it has verified; the large ones are copied checked against the hash of the pass
    that read them (verify's for results and attack steps, merge's own for generations, which no decision
    reads)."""

    def __init__(self, run_dir: Path, run_id: str) -> None:
        self.run_dir = run_dir
        self.signed = signing.signed_files(run_dir, run_id, table.signed_files()) if signing.signing_key() else None

    def check(self, name: str, sha256: str | None) -> None:
        """A file merged as read with this SHA-256 (None: absent), checked against its signature where a key is
        set."""
        if self.signed is not None:
            signed = self.signed.get(name)
            self._same(name, sha256, signed.sha256 if signed else None)

    def check_held(self, name: str, sha256: str | None) -> None:
        """A small file as verify read it: as signed, and as the file is now (one changed since is refused rather
        than merged as it was: its run no longer is what verified)."""
        self.check(name, sha256)
        path = self.run_dir / name
        self._same(name, sha256, file_sha256(path) if path.is_file() else None)

    def _same(self, name: str, sha256: str | None, verified: str | None) -> None:
        if sha256 != verified:
            raise RunFailed(f"{self.run_dir / name} changed while it was merged (after its run verified); not merged")


def _verified_source(run_dir: Path, observe: Callable[[jsonl.Line[ResultRecord], str], None]) -> VerifiedRun:
    """A run to merge, verified as complete for its share of the dataset and, with a signing key set, signed:
    merging signs the result, so nothing unverified may go into it. `observe` sees its results as they verify."""
    source = verify_run(run_dir, require_signature=signing.signing_key() is not None, whole=False, observe=observe)
    if source.problems:
        raise RunFailed(f"{run_dir}: not merged, it does not verify:\n  - " + "\n  - ".join(source.problems))
    return source


def _check_schema(run_dir: Path, record: ResultRecord) -> None:
    if record.schema_version != SCHEMA_VERSION:
        raise DiagsafeError(f"{run_dir}: result schema version {record.schema_version}, expected {SCHEMA_VERSION}")


def _place_generations(run_dir: Path, index: int, generations: _Placed) -> str | None:
    """Place a merged source's generations; the SHA-256 of the file they were read from (None: a run that
    generated nothing has none)."""
    path = run_dir / files.GENERATIONS
    return generations.place_file(index, path, GenerationRecord) if path.is_file() else None


class _Placed:
    """The records of one run file to merge, held as a 128-bit hash of each record's key and its place (not as
    records: merging a million answers does not hold a million records); then copied source after source, byte for
    byte, in long blocks, into the merged file. Each source is hashed as it is copied and checked against the hash
    it had when it was read: a source that changed in between stops the merge. With `unique` a key placed twice is
    refused (results); otherwise its last record wins (generations: a resumed run regenerates an answer)."""

    def __init__(self, name: str, unique: bool) -> None:
        self.name, self.unique = name, unique
        self.keys = bytearray()
        self.offsets = array("q")
        self.spans: dict[int, tuple[int, int, str]] = {}  # source -> its first and end row, its file's SHA-256

    def place(self, line: jsonl.Line[Any]) -> None:
        """Hold the place of a source's next record (sources are placed one after another, each in file order)."""
        self.keys += line_digest(repr(line.record.key).encode("utf-8", "surrogatepass"))  # repr: unambiguous
        self.offsets.append(line.offset)

    def read(self, source: int, first: int, sha256: str) -> None:
        """A source's records from row `first` on are placed, read from a file whose SHA-256 is `sha256`."""
        self.spans[source] = (first, len(self.offsets), sha256)

    def place_file(self, source: int, path: Path, model: type[jsonl.KeyedRecord]) -> str:
        """Place every record of a source's file, hashing the file in the same pass; returns its SHA-256."""
        start, digest = self.rows(), hashlib.sha256()
        for line in jsonl.stream(path, model, digest):
            self.place(line)
        self.read(source, start, digest.hexdigest())
        return digest.hexdigest()

    def rows(self) -> int:
        return len(self.offsets)

    def check(self, run_dirs: Sequence[Path]) -> np.ndarray | None:
        """Which rows are written (None: every one); with `unique`, a key placed twice is an error naming it. The
        key hashes are sorted (stably: a key's rows stay in reading order) and each compared with the next."""
        keys = np.frombuffer(bytes(self.keys), dtype="<u8").reshape(-1, 2)
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        ordered = keys[order]
        again = np.flatnonzero((ordered[1:] == ordered[:-1]).all(axis=1))  # order[k + 1] repeats order[k]'s key
        if not len(again):
            return None
        if self.unique:  # the earliest row, in reading order, whose key an earlier row has
            k = again[np.argmin(order[again + 1])]
            raise DiagsafeError(self._duplicate(int(order[k]), int(order[k + 1]), run_dirs))
        kept = np.ones(len(keys), dtype=bool)
        kept[order[again]] = False  # the last row of a key wins
        return kept

    def _duplicate(self, first: int, second: int, run_dirs: Sequence[Path]) -> str:
        owners = [self._owner(row, run_dirs) for row in (first, second)]
        with open(owners[1] / self.name, "rb") as handle:
            handle.seek(self.offsets[second])
            record = json.loads(handle.readline())
        key = tuple(record[field] for field in ("target", "item_id", "sample", "turn"))
        return f"duplicate result {key} (target, item, sample, turn) in the {self.name} of {owners[0]} and {owners[1]}"

    def _owner(self, row: int, run_dirs: Sequence[Path]) -> Path:
        return next(run_dirs[s] for s, (first, end, _) in self.spans.items() if first <= row < end)

    def write(self, out: Path, run_dirs: Sequence[Path]) -> None:
        """Write the merged file atomically: each source's records in its own order, sources in the given order."""
        kept = self.check(run_dirs)
        with atomic.atomic_path(out / self.name) as tmp, open(tmp, "wb") as sink:
            for source, (first, end, sha256) in self.spans.items():
                path = run_dirs[source] / self.name
                digest = hashlib.sha256()
                with open(path, "rb") as handle:
                    if kept is None or kept[first:end].all():
                        _copy(handle, sink, digest)
                    else:
                        _copy_kept(handle, sink, digest, kept[first:end])
                if digest.hexdigest() != sha256:
                    raise RunFailed(f"{path} changed while it was merged; not merged")


_BLOCK = 1 << 20


def _copy(source: BinaryIO, sink: BinaryIO, digest: Any) -> None:
    """Every byte of `source`, hashed, ending in a newline."""
    block = b""
    while chunk := source.read(_BLOCK):
        digest.update(chunk)
        sink.write(chunk)
        block = chunk
    if block and not block.endswith(b"\n"):  # a last line without its newline
        sink.write(b"\n")


def _copy_kept(source: BinaryIO, sink: BinaryIO, digest: Any, kept: np.ndarray) -> None:
    """The lines of `source` whose record `kept` keeps (blank lines hold none), every byte hashed."""
    row = 0
    for raw in source:
        digest.update(raw)
        if raw.strip():
            if kept[row]:
                sink.write(raw if raw.endswith(b"\n") else raw + b"\n")
            row += 1


def _same_attack(run_dirs: Sequence[Path], manifests: Sequence[Manifest]) -> AttackRef | None:
    """The merged runs' attack: one for all, or none for all. Attacks with another strategy, attacker, budget or
    threshold break goals at other rates, so their figures cannot be pooled."""
    attacks = [m.attack for m in manifests]
    sections = [m.config.get("attack") for m in manifests]
    if any(a != attacks[0] for a in attacks[1:]) or any(c != sections[0] for c in sections[1:]):
        listing = ", ".join(f"{d} ({a.strategy if a else 'no attack'})" for d, a in zip(run_dirs, attacks))
        raise DiagsafeError(
            f"the runs were not attacked alike (their attack: sections differ): {listing}; merge runs of one attack config"
        )
    return attacks[0]


def _same_gate(run_dirs: Sequence[Path], manifests: Sequence[Manifest]) -> None:
    """The merged run carries one config's gate settings (its `gate:` section and its baseline target): runs
    configured with others are refused, rather than the order of the arguments picking the limits the merged run
    is gated on. (Keeping the strictest of each would gate the merged run on a section no one wrote, and a
    baseline has no strictest.)"""
    settings = [{**{f"gate.{k}": v for k, v in m.gate_settings.items()}, "baseline": m.baseline} for m in manifests]
    differences = [
        f"{name}: {_setting(settings[0].get(name))} in {run_dirs[0]} vs {_setting(other.get(name))} in {run_dir}"
        for run_dir, other in zip(run_dirs[1:], settings[1:])
        for name in sorted(settings[0].keys() | other.keys())
        if settings[0].get(name) != other.get(name)
    ]
    if differences:
        raise DiagsafeError(
            "the runs' configs gate them differently, and the merged run can carry one config's limits: "
            + "; ".join(differences)
            + ". Set the same gate: section in their configs and run each again (`run CONFIG`: the gate is not "
            "part of the run id, nothing is judged again), or gate each run on its own"
        )


def _setting(value: Any) -> str:
    if value is None or value == {}:
        return "not set"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _same_judge_and_targets(
    run_dirs: Sequence[Path], manifests: Sequence[Manifest], allowed: bool
) -> dict[str, TargetRef]:
    """The merged run's targets; one target name for two models is refused, runs judged differently unless allowed."""
    targets: dict[str, TargetRef] = {}
    owner: dict[str, Path] = {}
    others = []
    for run_dir, manifest in zip(run_dirs, manifests):
        for label, target in manifest.targets.items():
            if label in targets and targets[label] != target:
                others.append(f"target '{label}' is another model in {owner[label]} and {run_dir}")
            targets.setdefault(label, target)
            owner.setdefault(label, run_dir)
    if others:  # no flag waives it: one target's answers would come from two checkpoints
        raise DiagsafeError("the runs answered with different models, so they cannot be merged: " + "; ".join(others))
    problems = []
    first = manifests[0]
    for run_dir, manifest in zip(run_dirs[1:], manifests[1:]):
        if first.judge is not None and manifest.judge is not None:
            problems += [f"judge {d} ({run_dirs[0]} vs {run_dir})" for d in first.judge.differences(manifest.judge)]
    if problems and not allowed:
        raise DiagsafeError(
            "the runs were not judged alike, so their verdicts do not mean the same: "
            + "; ".join(problems)
            + ". Pass --allow-different-judges to merge them anyway"
        )
    return targets
