"""What a decision on a run directory rests on, checked rather than trusted.

The gate (and, as a banner, the report) decides only on a run that verifies:
- finished: the manifest says `complete` (a running, killed or half-resumed run is refused);
- whole: a result for every (target, item, sample, judged turn) of the dataset the manifest lists (every item
  of the whole dataset, so a shard, a merge of some shards or a run whose results were cut is refused,
  naming what is missing), and no result for anything else;
- its own: every result carries this run's id (or, for a merged run, the id of a run it was merged from),
  and summary.json names this run;
- attacked, where the config has an attack: every harmful item of the dataset was attacked to its end (broken,
  its query budget spent, or every chain ended), by this run;
- recomputed: every figure is recomputed from results.jsonl (the controls, attacks.jsonl); summary.json is a cache,
  and one that disagrees with the recomputation, or whose results hash is not the results file's, is refused;
- signed, where a key is set: the HMAC in signature.json over every run file's hash (see `core.signing`).

What this cannot catch: someone who can write the directory and rewrites every file consistently (results,
summary, manifest) produces a run that verifies. Only a signature made with a key they do not hold
(`gate --require-signature`) rules that out.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core import signing
from diagsafe_local.core.cache import file_sha256
from diagsafe_local.runs import files
from diagsafe_local.runs.attack_figures import goal_figures
from diagsafe_local.runs.manifest import AttackRef, Manifest, read_manifest_file
from diagsafe_local.runs.records import ResultRecord, read_attacks, read_controls, read_results
from diagsafe_local.runs.summarize import summarize
from diagsafe_local.runs.summary import Summary, read_summary
from diagsafe_local.runs.validation import VALIDATION_FILE, JudgeValidation, read_validation

# Summary fields that describe how the run went, not what it found: not recomputed from the results.
_NOT_RECOMPUTED = {"run_id", "reused", "results_sha256", "throughput"}
_SHOWN = 5


class VerifiedRun(BaseModel):
    """A run directory as verified: its manifest, the summary recomputed from its results, and what failed."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    run_dir: Path
    manifest: Manifest
    summary: Summary
    results: list[ResultRecord]
    attacks: list[ResultRecord] = []
    problems: list[str]
    notes: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_run(run_dir: Path, require_signature: bool = False) -> VerifiedRun:
    """Check a run directory (see the module docstring). Unreadable files are errors (exit 2); a run that is
    unfinished, partial, another run's, edited or unsigned where a signature is required is listed in
    `problems`, for the gate to refuse (exit 3) and the report to show."""
    from diagsafe_local.core.errors import DiagsafeError

    if not run_dir.is_dir():
        raise DiagsafeError(f"{run_dir}: no such run directory")
    manifest = read_manifest_file(run_dir)
    problems: list[str] = []
    notes: list[str] = []
    if manifest.status != "complete":
        problems.append(
            f"the run is not complete (status '{manifest.status}'): it is still running, or was stopped; resume it "
            "with the same `run` command first"
        )
    if not (run_dir / files.SUMMARY).is_file():
        problems.append(f"no {files.SUMMARY}: the run never finished")
    stored = read_summary(run_dir) if (run_dir / files.SUMMARY).is_file() else Summary(targets={})
    sign_problems, sign_note = signing.check_signature(run_dir, manifest.run_id, require_signature)
    problems += sign_problems
    notes.append(f"signature: {sign_note}")
    results_path = run_dir / files.RESULTS
    results = read_results(results_path) if results_path.is_file() else []
    if not results_path.is_file():
        problems.append(f"no {files.RESULTS}")
    problems += _foreign(results, manifest)
    problems += _coverage(results, manifest)
    actual = file_sha256(results_path) if results_path.is_file() else None
    if stored.results_sha256 != actual:
        problems.append(
            "summary.json does not belong to results.jsonl (written by an older version, or the results changed "
            "after it); resume the run to rebuild it"
        )
    if stored.run_id != manifest.run_id:
        problems.append(f"summary.json is of run {stored.run_id}, not of this run ({manifest.run_id})")
    attacks = read_attacks(run_dir)
    attack = manifest.attack
    if attack is not None or attacks:
        problems += _foreign(attacks, manifest, files.ATTACKS)
        problems += _attack_coverage(attacks, manifest, attack)
    validation = stored.judge_validation
    summary = summarize(
        results,
        controls=read_controls(run_dir),
        validation=validation,
        attacks=attacks,
        attack=attack,
        instructions=manifest.judge.instructions if manifest.judge else None,
    )
    summary = summary.model_copy(
        update={
            "run_id": stored.run_id,
            "reused": stored.reused,
            "results_sha256": stored.results_sha256,
            "targets": {
                name: stats.model_copy(
                    update={"throughput": stored.targets[name].throughput if name in stored.targets else None}
                )
                for name, stats in summary.targets.items()
            },
        }
    )
    mismatch = _first_difference(stored.model_dump(mode="json"), summary.model_dump(mode="json"))
    if mismatch:
        problems.append(f"summary.json does not match results.jsonl: {mismatch}; resume the run to rebuild it")
    notes += _validation_notes(validation, problems)
    notes += _dataset_notes(manifest)
    return VerifiedRun(
        run_dir=run_dir,
        manifest=manifest,
        summary=summary,
        results=results,
        attacks=attacks,
        problems=problems,
        notes=notes,
    )


def _foreign(results: list[ResultRecord], manifest: Manifest, name: str = files.RESULTS) -> list[str]:
    """Results that another run wrote (their run id is not this run's, nor a merged source's)."""
    allowed = manifest.run_ids()
    foreign = Counter(r.run_id for r in results if r.run_id not in allowed)
    if not foreign:
        return []
    listing = ", ".join(f"{n} of run {run_id}" for run_id, n in foreign.most_common(_SHOWN))
    return [f"{name} holds results of another run ({listing}); this run is {manifest.run_id}"]


def _attack_coverage(attacks: list[ResultRecord], manifest: Manifest, attack: AttackRef | None) -> list[str]:
    """Goals the attack did not finish: a harmful item of the dataset that is neither broken, nor out of queries,
    nor at the end of every chain (and attack records of the run without an attack, or of no goal)."""
    if attack is None:
        return [f"{files.ATTACKS} holds {len(attacks)} attack records, and the run's config has no attack"]
    goals = [item.id for item in manifest.dataset.items or [] if not item.benign]
    by_goal: dict[tuple[str, str], list[ResultRecord]] = {}
    for r in attacks:
        by_goal.setdefault((r.target, r.item_id), []).append(r)
    unfinished = []
    for target in manifest.samples():
        for goal in goals:
            if not goal_figures(by_goal.pop((target, goal), []), attack)["finished"]:
                unfinished.append(f"{target}/{goal}")
    problems = []
    if unfinished:
        problems.append(
            f"the attack did not finish {len(unfinished)} of {len(goals) * len(manifest.samples())} goals (e.g. "
            + ", ".join(unfinished[:_SHOWN])
            + "); resume the run to complete it"
        )
    if by_goal:
        extra = [f"{t}/{i}" for t, i in sorted(by_goal)][:_SHOWN]
        problems.append(f"{files.ATTACKS} attacks goals the run's dataset does not have: " + ", ".join(extra))
    return problems


def _coverage(results: list[ResultRecord], manifest: Manifest) -> list[str]:
    """What is missing from (or extra in) the results, against every item of the manifest's dataset."""
    expected = manifest.expected_keys()
    if expected is None:
        return [
            "the manifest lists no items (written by an older version), so completeness cannot be checked; "
            "resume the run with this version to record them"
        ]
    problems = []
    shard = f" (this is shard {manifest.shard['index']} of {manifest.shard['count']})" if manifest.shard else ""
    found = {r.key for r in results}
    missing = expected - found
    if missing:
        by_target = Counter(key[0] for key in missing)
        first = sorted(missing)[:_SHOWN]
        problems.append(
            f"{len(missing)} of {len(expected)} judged answers are missing{shard}: "
            + ", ".join(f"{target} {n}" for target, n in sorted(by_target.items()))
            + "; e.g. "
            + ", ".join(f"{t}/{i} sample {s} turn {k}" for t, i, s, k in first)
            + (
                "; merge every shard (diagsafe-local merge --config CONFIG --shards N) and gate the merged run"
                if manifest.shard or manifest.merged_from
                else "; resume the run to complete it"
            )
        )
    extra = found - expected
    if extra:
        first = sorted(extra)[:_SHOWN]
        problems.append(
            f"{len(extra)} results are for answers the run's dataset does not have: "
            + ", ".join(f"{t}/{i} sample {s} turn {k}" for t, i, s, k in first)
        )
    return problems


def _first_difference(stored: Any, recomputed: Any, path: str = "") -> str | None:
    """Where two summaries first differ ('targets.t.asr.value: 0.0 in summary.json, 0.4 recomputed')."""
    if isinstance(stored, dict) and isinstance(recomputed, dict):
        for key in sorted(set(stored) | set(recomputed)):
            if not path and key in _NOT_RECOMPUTED:
                continue
            found = _first_difference(stored.get(key), recomputed.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(stored, list) and isinstance(recomputed, list) and len(stored) == len(recomputed):
        for k, (a, b) in enumerate(zip(stored, recomputed)):
            found = _first_difference(a, b, f"{path}[{k}]")
            if found:
                return found
        return None
    numbers = (int, float)
    if isinstance(stored, numbers) and isinstance(recomputed, numbers) and not isinstance(stored, bool):
        if math.isclose(stored, recomputed, rel_tol=1e-9, abs_tol=1e-12):
            return None
    elif stored == recomputed:
        return None
    return f"{path} is {stored!r} in summary.json, {recomputed!r} recomputed from results.jsonl"


def _validation_notes(validation: JudgeValidation | None, problems: list[str]) -> list[str]:
    """Whether the judge's validated error counts in summary.json are the validation directory's own."""
    if validation is None:
        return []
    directory = Path(validation.directory)
    if not (directory / VALIDATION_FILE).is_file():
        return [f"judge validation {directory} is not readable here: its error counts are taken from summary.json"]
    counts = ("tp", "fp", "tn", "fn")
    mine = tuple(getattr(validation, c) for c in counts)
    if not any(
        tuple(getattr(e, c) for c in counts) == mine and e.judge == validation.judge
        for e in read_validation(directory).judges
    ):
        problems.append(
            f"summary.json's judge validation counts are not those of {directory / VALIDATION_FILE} (edited, or the "
            "validation was rerun); resume the run to take them again"
        )
    return []


def _dataset_notes(manifest: Manifest) -> list[str]:
    path = Path(manifest.dataset.path)
    if path.is_file() and file_sha256(path) != manifest.dataset.sha256:
        return [
            f"the dataset file {path} changed since the run (the run evaluated the version of SHA-256 "
            f"{manifest.dataset.sha256[:12]}; its items are listed in the manifest)"
        ]
    return []
