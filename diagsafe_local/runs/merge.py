"""Working with finished run directories: merge several into one, compare two item by item."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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
from diagsafe_local.runs.pairing import Column, last_of_each, match
from diagsafe_local.runs.records import (
    SCHEMA_VERSION,
    AnswerKey,
    ControlRecord,
    GenerationRecord,
    ResultRecord,
    read_controls,
)
from diagsafe_local.runs.summarize import Summarizer
from diagsafe_local.runs.summary import Summary, write_summary
from diagsafe_local.runs.verdicts import score_class
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
    sources = [_verified_source(d) for d in run_dirs]
    manifests = [s.manifest for s in sources]
    datasets = {m.dataset.sha256 for m in manifests}
    if len(datasets) > 1:
        listing = ", ".join(f"{d} ({m.dataset.sha256[:12]})" for d, m in zip(run_dirs, manifests))
        raise DiagsafeError(f"the runs evaluate different datasets: {listing}")
    targets = _same_judge_and_targets(run_dirs, manifests, allow_different_judges)
    attack = _same_attack(run_dirs, manifests)
    out.mkdir(parents=True, exist_ok=True)
    if (out / files.RESULTS).exists() and not replace:
        raise DiagsafeError(f"{out} already holds results; choose an empty directory")
    first = manifests[0]
    # the judge's validated error rates carry over when every merged run was corrected by the same verified ones
    same = all(m.validation == first.validation for m in manifests) and all(s.validation for s in sources)
    validation, validation_ref = (sources[0].validation, first.validation) if same else (None, None)
    summarizer = Summarizer(validation, attack, first.judge.instructions if first.judge else None)
    results, steps, generations = _Placed(files.RESULTS), _Placed(files.ATTACKS), _Placed(files.GENERATIONS)
    controls: dict[tuple, ControlRecord] = {}
    for index, (run_dir, source) in enumerate(zip(run_dirs, sources)):
        for line in source.results():
            _check_schema(run_dir, line.record)
            results.place(run_dir, index, line, unique=True)
            summarizer.add(line.record)
        for line in source.attack_steps():
            _check_schema(run_dir, line.record)
            steps.place(run_dir, index, line, unique=True)
            summarizer.add_attack_step(line.record)
        for generation in _read_generations(run_dir):
            generations.place(run_dir, index, generation, unique=False)
        controls.update((c.key, c) for c in read_controls(run_dir))
    results.write(out, run_dirs)
    if attack is not None:
        steps.write(out, run_dirs)
    else:  # a replaced merge's attack steps must not outlive it
        (out / files.ATTACKS).unlink(missing_ok=True)
    generations.write(out, run_dirs)
    jsonl.write(out / files.CONTROLS, sorted(controls.values(), key=lambda c: c.key))
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
        sources=[SourceRun(run_dir=str(d), run_id=m.run_id, engines=m.engines) for d, m in zip(run_dirs, manifests)],
    )
    write_manifest(out, merged)
    signing.sign(out, run_id, files.SIGNED_FILES)
    return summary


def _verified_source(run_dir: Path) -> VerifiedRun:
    """A run to merge, verified as complete for its share of the dataset and, with a signing key set, signed:
    merging signs the result, so nothing unverified may go into it."""
    source = verify_run(run_dir, require_signature=signing.signing_key() is not None, whole=False)
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


@dataclass(frozen=True, slots=True)
class _Place:
    """Where one record to merge lies: its source, byte offset and length, and a hash of its bytes."""

    source: int
    offset: int
    length: int
    digest: bytes


class _Placed:
    """The records of one run file to merge, held as places in their sources (not as records, so merging a
    million answers does not hold a million records), then copied, sorted by key, byte for byte into the
    merged file. A source line whose bytes changed between reading and copying stops the merge."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.places: dict[tuple, _Place] = {}
        self.owner: dict[int, Path] = {}

    def place(self, run_dir: Path, source: int, line: jsonl.Line[Any], unique: bool) -> None:
        """Hold a record's place; with `unique`, a key seen in an earlier source is refused (else the last wins)."""
        key = line.record.key
        if unique and key in self.places:
            first = self.owner[self.places[key].source]
            raise DiagsafeError(
                f"duplicate result {key} (target, item, sample, turn) in the {self.name} of {first} and {run_dir}"
            )
        self.owner[source] = run_dir
        self.places[key] = _Place(source, line.offset, len(line.raw), _line_digest(line.raw))

    def write(self, out: Path, run_dirs: Sequence[Path]) -> None:
        """Write the merged file atomically, its records sorted by key."""
        with atomic.atomic_path(out / self.name) as tmp, open(tmp, "wb") as sink, ExitStack() as stack:
            handles = [
                stack.enter_context(open(d / self.name, "rb")) if d.joinpath(self.name).is_file() else None
                for d in run_dirs
            ]
            for key in sorted(self.places):
                place = self.places[key]
                handle = handles[place.source]
                assert handle is not None  # a place was read from this file
                handle.seek(place.offset)
                raw = handle.read(place.length)
                if _line_digest(raw) != place.digest:
                    raise RunFailed(f"{run_dirs[place.source] / self.name} changed while it was merged; not merged")
                sink.write(raw if raw.endswith(b"\n") else raw + b"\n")


def _line_digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


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


def compare_runs(run_a: Path, run_b: Path, allow_different_datasets: bool = False) -> dict[str, Any]:
    """Per-item agreement of verdicts and scores between two complete runs, with Cohen's kappa on the labels.

    Runs of different datasets are refused (item ids may match while the prompts differ) unless allowed."""
    manifests = [read_manifest(run_a), read_manifest(run_b)]
    hashes = [m.dataset.sha256 for m in manifests]
    if hashes[0] != hashes[1] and not allow_different_datasets:
        raise DiagsafeError(
            f"the runs evaluate different datasets ({run_a}: {str(hashes[0])[:12]}, {run_b}: "
            f"{str(hashes[1])[:12]}); items with the same id may hold different prompts. "
            "Pass --allow-different-datasets to compare them anyway"
        )
    a, b = _agreement_side(run_a), _agreement_side(run_b)
    targets_a, targets_b = set(a.names["target"]), set(b.names["target"])
    by_target = not (len(targets_a) == len(targets_b) == 1 and targets_a != targets_b)
    keys_a, keys_b = _keyed(a, by_target), _keyed(b, by_target)
    rows_a, rows_b = last_of_each(keys_a), last_of_each(keys_b)
    left, right = match(keys_a, keys_b, rows_a, rows_b)
    scores_a, scores_b = np.asarray(a.scores)[left], np.asarray(b.scores)[right]
    scored = ~np.isnan(scores_a) & ~np.isnan(scores_b)
    # Agreement on what the scores mean (every judge maps to [0, 1]), not on a "label" key that only some
    # judges write: two judges without one would otherwise agree trivially ("None" == "None").
    labels_a = [score_class(float(x)) for x in scores_a[scored]]
    labels_b = [score_class(float(x)) for x in scores_b[scored]]
    n_scored = len(labels_a)
    agree = sum(x == y for x, y in zip(labels_a, labels_b))
    kappa, kappa_note = None, None
    if len(set(labels_a) | set(labels_b)) == 1:
        # Cohen's kappa is 0/0 when both runs use one class only: agreement beyond chance is undefined, not 1
        kappa_note = f"undefined: every verdict of both runs is '{labels_a[0]}'"
    elif n_scored:
        from sklearn.metrics import cohen_kappa_score

        kappa = float(cohen_kappa_score(labels_a, labels_b))
    found: list[tuple[AnswerKey, dict[str, Any]]] = []
    for row_a, row_b, x, y in zip(left[scored], right[scored], labels_a, labels_b):
        if x != y:  # read back: the disagreements are listed, in key order, with their scores
            record_a, record_b = a.read(int(row_a)), b.read(int(row_b))
            key = (record_a.target if by_target else "", record_a.item_id, record_a.sample, record_a.turn)
            found.append(
                (key, {"key": list(key), "a": x, "b": y, "score_a": record_a.score, "score_b": record_b.score})
            )
    disagreements = [entry for _, entry in sorted(found, key=lambda pair: pair[0])]
    shared = len(left)
    return {
        "only_in_a": len(rows_a) - shared,
        "only_in_b": len(rows_b) - shared,
        "shared": shared,
        "both_scored": n_scored,
        "label_agreement": agree / n_scored if n_scored else None,
        "score_mean_abs_diff": math.fsum(np.abs(scores_a[scored] - scores_b[scored]).tolist()) / n_scored
        if n_scored
        else None,
        "identical_answers": int((a.answer_digests()[left] == b.answer_digests()[right]).sum()),
        "cohen_kappa": kappa,
        "cohen_kappa_note": kappa_note,
        "disagreements": disagreements,
    }


def _agreement_side(run_dir: Path) -> Column:
    """Every result of a run as a column keyed by (item, sample, turn), with its target."""
    path = run_dir / files.RESULTS
    column = Column(path, ("target",), answers=True)
    for line in jsonl.stream(path, ResultRecord):
        r = line.record
        column.add((r.item_id, r.sample, r.turn), line, {"target": r.target})
    return column


def _keyed(column: Column, by_target: bool) -> np.ndarray:
    """The column's keys, each bound to its target where targets are compared by name (a per-target 64-bit salt
    XORed into the key hash keeps keys of one target apart and those of two targets apart)."""
    keys = column.keys().copy()
    if by_target:
        salts = np.array(
            [
                int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big")
                for t in column.names["target"]
            ],
            dtype=np.uint64,
        )
        keys["hi"] ^= salts[np.asarray(column.codes["target"], dtype=np.int64)]
    return keys
