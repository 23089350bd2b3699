"""Working with finished run directories: merge several into one, compare two item by item."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diagsafe_local.core import jsonl, signing
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
from diagsafe_local.runs.records import (
    SCHEMA_VERSION,
    ControlRecord,
    GenerationRecord,
    ResultRecord,
    read_controls,
    read_results,
)
from diagsafe_local.runs.summarize import summarize
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
    results: dict[tuple, tuple[Path, ResultRecord]] = {}
    attacks: dict[tuple, tuple[Path, ResultRecord]] = {}
    generations: dict[tuple, GenerationRecord] = {}
    controls: dict[tuple, ControlRecord] = {}
    for run_dir, source in zip(run_dirs, sources):
        _gather(run_dir, files.RESULTS, source.results, results)
        _gather(run_dir, files.ATTACKS, source.attacks, attacks)
        generations.update((g.key, g) for g in jsonl.read_records(run_dir / files.GENERATIONS, GenerationRecord)[0])
        controls.update((c.key, c) for c in read_controls(run_dir))
    out.mkdir(parents=True, exist_ok=True)
    if (out / files.RESULTS).exists() and not replace:
        raise DiagsafeError(f"{out} already holds results; choose an empty directory")
    ordered = sorted((r for _, r in results.values()), key=lambda r: r.key)
    jsonl.write(out / files.RESULTS, ordered)
    attacked = sorted((r for _, r in attacks.values()), key=lambda r: r.key)
    if attack is not None:
        jsonl.write(out / files.ATTACKS, attacked)
    else:  # a replaced merge's attack steps must not outlive it
        (out / files.ATTACKS).unlink(missing_ok=True)
    jsonl.write(out / files.GENERATIONS, sorted(generations.values(), key=lambda g: g.key))
    jsonl.write(out / files.CONTROLS, sorted(controls.values(), key=lambda c: c.key))
    # the judge's validated error rates carry over when every merged run was corrected by the same verified ones
    first = manifests[0]
    same = all(m.validation == first.validation for m in manifests) and all(s.validation for s in sources)
    validation, validation_ref = (sources[0].validation, first.validation) if same else (None, None)
    run_id = "merged:" + "+".join(m.run_id for m in manifests)
    summary = summarize(
        ordered,
        controls=controls.values(),
        validation=validation,
        attacks=attacked,
        attack=attack,
        instructions=manifests[0].judge.instructions if manifests[0].judge else None,
    )
    summary = write_summary(out, summary.model_copy(update={"run_id": run_id}))
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


def _gather(
    run_dir: Path, name: str, records: Sequence[ResultRecord], into: dict[tuple, tuple[Path, ResultRecord]]
) -> None:
    """Add one run's result records (of results.jsonl or attacks.jsonl) to `into`, refusing a key seen before."""
    for record in records:
        if record.schema_version != SCHEMA_VERSION:
            raise DiagsafeError(f"{run_dir}: result schema version {record.schema_version}, expected {SCHEMA_VERSION}")
        if record.key in into:
            raise DiagsafeError(
                f"duplicate result {record.key} (target, item, sample, turn) in the {name} of {into[record.key][0]} "
                f"and {run_dir}"
            )
        into[record.key] = (run_dir, record)


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
    a, b = read_results(run_a / files.RESULTS), read_results(run_b / files.RESULTS)
    targets_a, targets_b = {r.target for r in a}, {r.target for r in b}
    by_target = not (len(targets_a) == len(targets_b) == 1 and targets_a != targets_b)

    def key(r: ResultRecord) -> tuple:
        return (r.target if by_target else "", r.item_id, r.sample, r.turn)

    left, right = {key(r): r for r in a}, {key(r): r for r in b}
    shared = sorted(set(left) & set(right))
    both_scored = [k for k in shared if left[k].score is not None and right[k].score is not None]
    # Agreement on what the scores mean (every judge maps to [0, 1]), not on a "label" key that only some
    # judges write: two judges without one would otherwise agree trivially ("None" == "None").
    labels_a = [score_class(left[k].score) for k in both_scored]
    labels_b = [score_class(right[k].score) for k in both_scored]
    agree = sum(x == y for x, y in zip(labels_a, labels_b))
    kappa, kappa_note = None, None
    if len(set(labels_a) | set(labels_b)) == 1:
        # Cohen's kappa is 0/0 when both runs use one class only: agreement beyond chance is undefined, not 1
        kappa_note = f"undefined: every verdict of both runs is '{labels_a[0]}'"
    elif both_scored:
        from sklearn.metrics import cohen_kappa_score

        kappa = float(cohen_kappa_score(labels_a, labels_b))
    disagreements = [
        {"key": list(k), "a": x, "b": y, "score_a": left[k].score, "score_b": right[k].score}
        for k, x, y in zip(both_scored, labels_a, labels_b)
        if x != y
    ]
    return {
        "only_in_a": len(set(left) - set(right)),
        "only_in_b": len(set(right) - set(left)),
        "shared": len(shared),
        "both_scored": len(both_scored),
        "label_agreement": agree / len(both_scored) if both_scored else None,
        "score_mean_abs_diff": (sum(abs(left[k].score - right[k].score) for k in both_scored) / len(both_scored))  # type: ignore[operator]
        if both_scored
        else None,
        "identical_answers": sum(left[k].answer == right[k].answer for k in shared),
        "cohen_kappa": kappa,
        "cohen_kappa_note": kappa_note,
        "disagreements": disagreements,
    }
