"""`diagsafe-local gate RUN_DIR`: exit 0 if the checkpoint meets the thresholds, 1 if not."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


def _category_limits(values: list[str], option: str = "--max-asr-category") -> dict[str, float]:
    from diagsafe_local.core.errors import DiagsafeError

    limits = {}
    for value in values:
        name, sep, number = value.rpartition("=")
        try:
            limits[name] = float(number)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise DiagsafeError(f"{option} expects CATEGORY=NUMBER, got '{value}'")
    return limits


@user_errors
def gate(
    run_dir: Annotated[Path, typer.Argument(help="A finished run directory.")],
    max_asr: Annotated[
        float | None, typer.Option(help="Largest acceptable ASR (default: the config's gate.max_asr).")
    ] = None,
    max_asr_category: Annotated[list[str] | None, typer.Option(help="CATEGORY=MAX, repeatable.")] = None,
    max_failure_rate: Annotated[
        float | None, typer.Option(help="Largest share of unjudged answers (default 0).")
    ] = None,
    max_over_refusal: Annotated[float | None, typer.Option(help="Largest over-refusal rate on benign items.")] = None,
    max_attack_asr: Annotated[
        float | None,
        typer.Option(help="Largest adaptive-attack success rate: goals broken within the budget (needs attack:)."),
    ] = None,
    max_truncated_rate: Annotated[
        float | None, typer.Option(help="Largest share of answers cut off at max_tokens.")
    ] = None,
    allow_degenerate_judge: Annotated[
        bool, typer.Option(help="Pass even if the judge health checks flag a degenerate judge.")
    ] = False,
    corrected: Annotated[
        bool,
        typer.Option(
            help="Decide ASR limits on the upper 95% bound of the ASR corrected for the judge's validated FPR/FNR "
            "(needs judge.validation)."
        ),
    ] = False,
    target: Annotated[list[str] | None, typer.Option(help="Check only these targets (repeatable).")] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="A baseline run directory (e.g. production's) for --max-asr-increase (default: gate.baseline_run)."
        ),
    ] = None,
    max_asr_increase: Annotated[
        float | None,
        typer.Option(help="Non-inferiority margin: largest acceptable upper bound of the paired ASR increase."),
    ] = None,
    max_asr_increase_category: Annotated[
        list[str] | None, typer.Option(help="CATEGORY=MARGIN, repeatable: the same per category.")
    ] = None,
    baseline_target: Annotated[str | None, typer.Option(help="The baseline run's target, if it has several.")] = None,
    require_signature: Annotated[
        bool,
        typer.Option(
            help="Refuse a run directory without a valid signature.json (an HMAC of every run file, made at the end "
            "of `run` with the key in DIAGSAFE_SIGNING_KEY; the gate needs the same key)."
        ),
    ] = False,
) -> None:
    """Pass (exit 0) or fail (exit 1) a run against ASR thresholds, with a one-screen reason. Every figure is
    recomputed from results.jsonl; a run that is not complete, lacks a result for any item of its dataset, holds
    another run's results, or whose summary does not match its results, is refused with exit 3; bad input
    exits 2."""
    from pydantic import ValidationError

    from diagsafe_local.core.errors import DiagsafeError, RunFailed
    from diagsafe_local.runs.baseline import compare_with_baseline
    from diagsafe_local.runs.gate import GateConfig, check_gate, check_increase
    from diagsafe_local.runs.verify import verify_run

    verified = verify_run(run_dir, require_signature)
    if verified.problems:
        raise RunFailed(f"{run_dir}: refused, the run does not verify:\n  - " + "\n  - ".join(verified.problems))
    settings = verified.manifest.gate_settings
    if max_asr is not None:
        settings["max_asr"] = max_asr
    if max_asr_category:
        settings["max_asr_category"] = _category_limits(max_asr_category)
    if max_failure_rate is not None:
        settings["max_failure_rate"] = max_failure_rate
    if max_over_refusal is not None:
        settings["max_over_refusal"] = max_over_refusal
    if max_attack_asr is not None:
        settings["max_attack_asr"] = max_attack_asr
    if max_truncated_rate is not None:
        settings["max_truncated_rate"] = max_truncated_rate
    if allow_degenerate_judge:
        settings["allow_degenerate_judge"] = True
    if corrected:
        settings["corrected"] = True
    if baseline is not None:
        settings["baseline_run"] = str(baseline)
    if max_asr_increase is not None:
        settings["max_asr_increase"] = max_asr_increase
    if max_asr_increase_category:
        settings["max_asr_increase_category"] = _category_limits(
            max_asr_increase_category, "--max-asr-increase-category"
        )
    if baseline_target is not None:
        settings["baseline_target"] = baseline_target
    try:
        thresholds = GateConfig.model_validate(settings)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise DiagsafeError(f"invalid gate thresholds: {problems}") from None
    for note in verified.notes:
        typer.echo(f"NOTE  {note}")
    result = check_gate(verified.summary, thresholds, target)
    if thresholds.max_asr_increase is not None or thresholds.max_asr_increase_category:
        if not thresholds.baseline_run:
            raise DiagsafeError("--max-asr-increase needs the baseline run: --baseline DIR (or gate.baseline_run)")
        comparisons = compare_with_baseline(
            run_dir, Path(thresholds.baseline_run), baseline_target=thresholds.baseline_target
        )
        comparisons = [c for c in comparisons if not target or c.candidate in target]
        increase = check_increase(comparisons, thresholds)
        result = result.model_copy(
            update={"passed": result.passed and increase.passed, "lines": result.lines + increase.lines}
        )
    for line in result.lines:
        typer.echo(line)
    typer.echo("GATE PASSED" if result.passed else "GATE FAILED")
    raise typer.Exit(0 if result.passed else 1)
