"""Compare with production: the paired comparison (`paired`) of verified runs, as `compare`, `gate --baseline`
and `report --baseline` use it.

Two run directories (last week's production run as the baseline, today's as the candidate), or two targets of
one sweep. Both runs must verify as the gate requires (complete, whole, their own, summary matching, signed
where that is required; else exit 3); they must have evaluated the same dataset and been judged by the same
judge (model by content, rubric, scoring mode, adapter, policy content; else exit 2, unless allowed — then
every figure carries the warning).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.jsonl import Line
from diagsafe_local.runs import files
from diagsafe_local.runs.paired import PairedComparison, RunColumns, compare_targets, sides
from diagsafe_local.runs.passes import decided_results, decided_verdicts
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.verify import VerifiedRun, verify_run


class Incomparable(DiagsafeError):
    """Two runs whose verdicts or items do not mean the same (another dataset, another judge): a usage error for
    `compare`; the gate refuses to decide on such a comparison (exit 3)."""


def verified(
    run_dir: Path,
    what: str,
    require_signature: bool = False,
    observe: Callable[[Line[ResultRecord], str], None] | None = None,
) -> VerifiedRun:
    """A run that verifies, or exit 3 naming what does not (`observe`: see `verify_run`), without the tallies its
    summary was folded from (merge's alone: a count of each distinct verdict, a million in a large run)."""
    run = verify_run(run_dir, require_signature, observe=observe)
    if run.problems:
        raise RunFailed(f"{what} {run_dir}: refused, it does not verify:\n  - " + "\n  - ".join(run.problems))
    return run.model_copy(update={"tallies": None})


def comparable(run: VerifiedRun) -> VerifiedRun:
    """What `compare_with_baseline` reads of a verified run whose columns are gathered (its manifest's dataset hash
    and judge, its summary and validation): not its dataset's items (14 MB a run of 10,000 items), passes or
    tallies."""
    manifest = run.manifest.model_copy(update={"dataset": run.manifest.dataset.model_copy(update={"items": None})})
    return run.model_copy(update={"manifest": manifest, "passes": {}, "tallies": None})


def judge_warning(baseline: VerifiedRun, candidate: VerifiedRun, allow_different_judges: bool) -> str | None:
    """None when both runs were judged alike; else an error (exit 2), or with `allow_different_judges` the
    warning every figure carries."""
    a, b = baseline.manifest.judge, candidate.manifest.judge
    differences = ["a run written by an older version does not record its judge"] if a is None or b is None else []
    if a is not None and b is not None:
        differences = a.differences(b)
    if not differences:
        return None
    text = "judged by different judges (" + "; ".join(differences) + ")"
    if not allow_different_judges:
        raise Incomparable(
            f"{baseline.run_dir} and {candidate.run_dir} were {text}: their verdicts do not mean the same. Pass "
            "--allow-different-judges to compare them anyway"
        )
    return f"{text}: differences mix the checkpoints' with the judges'"


def target_pairs(
    baseline: VerifiedRun, candidate: VerifiedRun, baseline_target: str | None, target: str | None
) -> list[tuple[str, str]]:
    """(baseline target, candidate target) pairs: the named ones; the one target of each run; the targets both
    runs share by name; or, within one sweep, every target against the baseline target (never a target against
    itself: that compares nothing). A candidate target with no pair is left out (the gate fails it)."""
    names_a, names_b = list(baseline.summary.targets), list(candidate.summary.targets)
    same_run = baseline.run_dir.resolve() == candidate.run_dir.resolve()
    if same_run:
        base = baseline_target or baseline.manifest.baseline
        if base is None:
            raise DiagsafeError(
                "comparing the targets of one sweep needs --baseline-target (or baseline: in its config)"
            )
        chosen = [target] if target else names_b
        pairs = [(base, t) for t in chosen if t != base]
    elif baseline_target or target:
        pairs = [(baseline_target or _only(names_a, baseline.run_dir), target or _only(names_b, candidate.run_dir))]
    elif len(names_a) == len(names_b) == 1:
        pairs = [(names_a[0], names_b[0])]
    else:
        pairs = [(n, n) for n in names_b if n in names_a]
    for name, _ in pairs:
        if name not in names_a:
            raise DiagsafeError(f"{baseline.run_dir} has no target '{name}' (it has {', '.join(names_a)})")
    for _, name in pairs:
        if name not in names_b:
            raise DiagsafeError(f"{candidate.run_dir} has no target '{name}' (it has {', '.join(names_b)})")
    return pairs


def _only(names: list[str], run_dir: Path) -> str:
    if len(names) != 1:
        raise DiagsafeError(f"{run_dir} has several targets ({', '.join(names)}): name one")
    return names[0]


def compare_with_baseline(
    candidate: VerifiedRun,
    baseline: VerifiedRun | None = None,
    *,
    target: str | None = None,
    baseline_target: str | None = None,
    allow_different_judges: bool = False,
    allow_different_datasets: bool = False,
    columns: tuple[RunColumns, RunColumns] | None = None,
    breakdowns: bool = True,
) -> list[PairedComparison]:
    """The paired comparison of every target pair of a verified candidate run and its verified baseline run (or,
    with `baseline` None, of the targets of one sweep), on the verdicts the gate decides on (a cascade's:
    `passes.decided_results`). `columns`: the baseline's and the candidate's under those verdicts, gathered while
    they were verified (`passes.decided_columns`; default: their results are read again); `breakdowns=False`:
    overall figures only."""
    baseline = baseline or candidate
    if baseline.manifest.dataset.sha256 != candidate.manifest.dataset.sha256 and not allow_different_datasets:
        raise Incomparable(
            f"the runs evaluate different datasets ({baseline.run_dir}: {baseline.manifest.dataset.sha256[:12]}, "
            f"{candidate.run_dir}: {candidate.manifest.dataset.sha256[:12]}); items with the same id may hold "
            "different prompts (pairs are matched by prompt content too). Pass --allow-different-datasets to "
            "compare them anyway"
        )
    warning = judge_warning(baseline, candidate, allow_different_judges) if baseline is not candidate else None
    rates = candidate.validation
    if rates is None or baseline.validation != rates:
        rates = None  # the corrected difference needs one verified judge validation for both
    pairs = target_pairs(baseline, candidate, baseline_target, target)
    if columns is not None:
        columns_a, columns_b = columns[0].sides, columns[1].sides
    elif baseline is candidate:
        named = {n for pair in pairs for n in pair}
        both = sides(candidate.run_dir / files.RESULTS, decided_results(candidate), named, decided_verdicts(candidate))
        columns_a = columns_b = both
    else:
        columns_a = sides(
            baseline.run_dir / files.RESULTS,
            decided_results(baseline),
            {b for b, _ in pairs},
            decided_verdicts(baseline),
        )
        columns_b = sides(
            candidate.run_dir / files.RESULTS,
            decided_results(candidate),
            {c for _, c in pairs},
            decided_verdicts(candidate),
        )
    return [
        compare_targets(base, cand, columns_a[base], columns_b[cand], rates, warning, breakdowns)
        for base, cand in pairs
    ]
