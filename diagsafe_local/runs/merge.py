"""Working with finished run directories: merge several into one, compare two item by item."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from diagsafe_local.core import atomic, jsonl, signing
from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.runs import files
from diagsafe_local.runs.manifest import (
    AttackRef,
    Manifest,
    SourceRun,
    TargetRef,
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
    SensitivityRecord,
    read_controls,
)
from diagsafe_local.runs.summarize import Summarizer
from diagsafe_local.runs.summary import Summary, write_summary
from diagsafe_local.runs.verify import VerifiedRun, verify_run


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
    """Merge complete runs of the same dataset into `out` (results, attack steps, generations, controls); refuse
    a run that does not verify as complete for its share of the dataset (with a signing key set: unsigned, or
    changed since it was signed), duplicates, schema mismatches, runs attacked under different attack configs,
    and runs judged by different judges or holding one target name for different models (unless
    `allow_different_judges`). The merged run is written as one, with its config, and signed where a key is set."""
    if not run_dirs:
        raise DiagsafeError("merge needs run directories")
    results, steps, generations = _Placed(files.RESULTS), _Placed(files.ATTACKS), _Placed(files.GENERATIONS)
    sources = []
    for index, run_dir in enumerate(run_dirs):

        def place(line: jsonl.Line[ResultRecord], run_dir: Path = run_dir, index: int = index) -> None:
            _check_schema(run_dir, line.record)
            results.place(run_dir, index, line, unique=True)

        sources.append(_verified_source(run_dir, place))  # its results are placed in the pass that verifies them
    manifests = [s.manifest for s in sources]
    datasets = {m.dataset.sha256 for m in manifests}
    if len(datasets) > 1:
        listing = ", ".join(f"{d} ({m.dataset.sha256[:12]})" for d, m in zip(run_dirs, manifests))
        raise DiagsafeError(f"the runs evaluate different datasets: {listing}")
    targets = _same_judge_and_targets(run_dirs, manifests, allow_different_judges)
    attack = _same_attack(run_dirs, manifests)
    if results.duplicate is not None:  # said after what makes the runs unmergeable: that is what to fix first
        raise DiagsafeError(results.duplicate)
    out.mkdir(parents=True, exist_ok=True)
    if (out / files.RESULTS).exists() and not replace:
        raise DiagsafeError(f"{out} already holds results; choose an empty directory")
    first = manifests[0]
    # the judge's validated error rates carry over when every merged run was corrected by the same verified ones
    same = all(m.validation == first.validation for m in manifests) and all(s.validation for s in sources)
    validation, validation_ref = (sources[0].validation, first.validation) if same else (None, None)
    summarizer = Summarizer(validation, attack, first.judge.instructions if first.judge else None)
    controls: dict[tuple, ControlRecord] = {}
    sensitivity: dict[tuple, SensitivityRecord] = {}  # a whole run's sample judged again (runs of other targets)
    for index, (run_dir, source) in enumerate(zip(run_dirs, sources)):
        assert source.tallies is not None  # every verified run carries them
        summarizer.absorb(source.tallies)  # the sources' tallies add up to the merged run's
        for line in source.attack_steps():
            _check_schema(run_dir, line.record)
            steps.place(run_dir, index, line, unique=True)
        for generation in _read_generations(run_dir):
            generations.place(run_dir, index, generation, unique=False)
        controls.update((c.key, c) for c in read_controls(run_dir))
        if (run_dir / files.SENSITIVITY).is_file():
            sensitivity.update(
                (r.key, r) for r in jsonl.read_records(run_dir / files.SENSITIVITY, SensitivityRecord)[0]
            )
    results.write(out, run_dirs)
    if attack is not None:
        steps.write(out, run_dirs)
    else:  # a replaced merge's attack steps must not outlive it
        (out / files.ATTACKS).unlink(missing_ok=True)
    generations.write(out, run_dirs)
    jsonl.write(out / files.CONTROLS, sorted(controls.values(), key=lambda c: c.key))
    if sensitivity:
        jsonl.write(out / files.SENSITIVITY, sorted(sensitivity.values(), key=lambda r: r.key))
    else:  # a replaced merge's sample must not outlive it
        (out / files.SENSITIVITY).unlink(missing_ok=True)
    run_id = "merged:" + "+".join(m.run_id for m in manifests)
    summarizer.controls = list(controls.values())
    summary = write_summary(out, summarizer.summary().model_copy(update={"run_id": run_id}))
    write_config(out, run_id, first.config)
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
        sources=[SourceRun(run_dir=str(d), run_id=m.run_id, engines=m.engines) for d, m in zip(run_dirs, manifests)],
    )
    write_manifest(out, merged)
    signing.sign(out, run_id, files.SIGNED_FILES)
    return summary


def _verified_source(run_dir: Path, observe: Callable[[jsonl.Line[ResultRecord]], None]) -> VerifiedRun:
    """A run to merge, verified as complete for its share of the dataset and, with a signing key set, signed:
    merging signs the result, so nothing unverified may go into it. `observe` sees its results as they verify."""
    source = verify_run(run_dir, require_signature=signing.signing_key() is not None, whole=False, observe=observe)
    if source.problems:
        raise RunFailed(f"{run_dir}: not merged, it does not verify:\n  - " + "\n  - ".join(source.problems))
    return source


def _check_schema(run_dir: Path, record: ResultRecord) -> None:
    if record.schema_version != SCHEMA_VERSION:
        raise DiagsafeError(f"{run_dir}: result schema version {record.schema_version}, expected {SCHEMA_VERSION}")


def _read_generations(run_dir: Path) -> Iterator[jsonl.Line[GenerationRecord]]:
    """A merged source's generations (a run that generated nothing has none)."""
    path = run_dir / files.GENERATIONS
    if path.is_file():
        yield from jsonl.stream(path, GenerationRecord)


class _Placed:
    """The records of one run file to merge, held as places in their sources (not as records, so merging a
    million answers does not hold a million records): per record its key (strings shared), source, byte offset
    and length and a hash of its bytes, in compact columns; then copied, sorted by key, byte for byte into the
    merged file. A source line whose bytes changed between reading and copying stops the merge."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: dict[tuple, int] = {}  # key -> its row in the columns below
        self.sources = array("H")
        self.offsets = array("q")
        self.lengths = array("q")
        self.digests = bytearray()
        self.owner: dict[int, Path] = {}
        self.duplicate: str | None = None

    def place(self, run_dir: Path, source: int, line: jsonl.Line[Any], unique: bool) -> None:
        """Hold a record's place; with `unique`, a key seen in an earlier source is a duplicate (`duplicate` names
        the first; `write` refuses to write), else the last record of a key wins."""
        target, item_id, sample, turn = line.record.key
        key = (sys.intern(target), sys.intern(item_id), sample, turn)  # a million keys share their strings
        row = self.rows.get(key)
        if row is not None and unique:
            self.duplicate = self.duplicate or (
                f"duplicate result {key} (target, item, sample, turn) in the {self.name} of "
                f"{self.owner[self.sources[row]]} and {run_dir}"
            )
            return
        self.owner[source] = run_dir
        if row is None:
            self.rows[key] = len(self.sources)
            self.sources.append(source)
            self.offsets.append(line.offset)
            self.lengths.append(len(line.raw))
            self.digests += line_digest(line.raw)
        else:  # the later record of a key replaces the earlier one
            self.sources[row], self.offsets[row], self.lengths[row] = source, line.offset, len(line.raw)
            self.digests[16 * row : 16 * row + 16] = line_digest(line.raw)

    def write(self, out: Path, run_dirs: Sequence[Path]) -> None:
        """Write the merged file atomically, its records sorted by key."""
        if self.duplicate is not None:
            raise DiagsafeError(self.duplicate)
        with atomic.atomic_path(out / self.name) as tmp, open(tmp, "wb") as sink, ExitStack() as stack:
            handles = [
                stack.enter_context(open(d / self.name, "rb")) if d.joinpath(self.name).is_file() else None
                for d in run_dirs
            ]
            for key in sorted(self.rows):
                row = self.rows[key]
                handle = handles[self.sources[row]]
                assert handle is not None  # a place was read from this file
                handle.seek(self.offsets[row])
                raw = handle.read(self.lengths[row])
                if line_digest(raw) != self.digests[16 * row : 16 * row + 16]:
                    raise RunFailed(
                        f"{run_dirs[self.sources[row]] / self.name} changed while it was merged; not merged"
                    )
                sink.write(raw if raw.endswith(b"\n") else raw + b"\n")


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


def _same_judge_and_targets(
    run_dirs: Sequence[Path], manifests: Sequence[Manifest], allowed: bool
) -> dict[str, TargetRef]:
    """The merged run's targets; runs judged differently, or one target name for two models, are refused."""
    problems = []
    first = manifests[0]
    for run_dir, manifest in zip(run_dirs[1:], manifests[1:]):
        if first.judge is not None and manifest.judge is not None:
            problems += [f"judge {d} ({run_dirs[0]} vs {run_dir})" for d in first.judge.differences(manifest.judge)]
    targets: dict[str, TargetRef] = {}
    owner: dict[str, Path] = {}
    for run_dir, manifest in zip(run_dirs, manifests):
        for label, target in manifest.targets.items():
            if label in targets and targets[label] != target:
                problems.append(f"target '{label}' is another model in {owner[label]} and {run_dir}")
            targets.setdefault(label, target)
            owner.setdefault(label, run_dir)
    if problems and not allowed:
        raise DiagsafeError(
            "the runs were not judged alike, so their verdicts do not mean the same: "
            + "; ".join(problems)
            + ". Pass --allow-different-judges to merge them anyway"
        )
    return targets
