"""`diagsafe-local bench`: rank harmfulness metrics on HarmMetric Eval."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from diagsafe_local.benchmark.bench import DEFAULT_DATASET, run_bench
from diagsafe_local.commands.common import (
    JudgeModels,
    Samples,
    judge_options,
    judge_spec,
    print_listing,
    user_errors,
)


def list_metrics(as_json: bool = False) -> None:
    """Every metric and judge (plugins' included, with their package): a table for people, JSON lines for
    programs."""
    from diagsafe_local.judging import JUDGES
    from diagsafe_local.metrics import METRICS

    metrics = [
        {
            "name": spec.name,
            "kind": "metric",
            "measures": "harm",
            "reference": spec.needs_reference,
            "description": spec.description,
            "source": spec.source,
            "package": METRICS.origin(spec.name),
        }
        for spec in METRICS
    ]
    judges = [
        {
            "name": judge.name,
            "kind": "judge",
            "measures": judge.measures,
            "model": judge.needs_model,
            "p_yes": "no" if judge.label_words is None else ("default" if judge.default_probability else "option"),
            "reasons": "no" if judge.thinking is None else ("default" if judge.reasons_by_default else "option"),
            "description": judge.description,
            "source": judge.source,
            "package": JUDGES.origin(judge.name),
        }
        for judge in JUDGES
    ]
    if as_json:
        print_listing("", metrics + judges, [], as_json=True)
        return
    print_listing(f"{len(metrics)} metrics", metrics, ["name", "reference", "description", "package"])
    print_listing(
        f"{len(judges)} judges (--judge NAME --judge-model MODEL)",
        judges,
        ["name", "measures", "p_yes", "reasons", "description", "source", "package"],
    )


@user_errors
@judge_options
def bench(
    dataset: Annotated[
        str, typer.Option(help="Benchmark file (either layout) or Hugging Face dataset id.")
    ] = DEFAULT_DATASET,
    metrics: Annotated[
        str | None,
        typer.Option(help="Comma-separated metric names, or 'all' (the default without --judge). See --list."),
    ] = None,
    scoring: Annotated[
        str, typer.Option(help="Effectiveness formula: 'current' or 'v1' (the earlier paper version).")
    ] = "current",
    missing: Annotated[str, typer.Option(help="Missing scores: 'error', 'drop-prompt' or 'worst-case'.")] = "error",
    reference_agg: Annotated[
        str, typer.Option(help="Combine several references by 'mean' or 'max' (rows may override).")
    ] = "mean",
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the 95% CIs.", min=100)] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/bench"),
    list_: Annotated[bool, typer.Option("--list", help="List the metrics and judges and exit.")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --list: one JSON object per line, for programs.")
    ] = False,
    judge: Annotated[
        str | None,
        typer.Option(help="Also rank a judge: a name of --list, a policy file (./acme.yaml), or METRIC>=THRESHOLD."),
    ] = None,
    judge_model: JudgeModels = None,
    samples: Samples = 1,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the judge engine's own logs here instead of in OUT/run.log.")
    ] = False,
    chart: Annotated[bool, typer.Option(help="Also draw leaderboard.png (matplotlib: about a second more).")] = False,
    exclude_training_prompts: Annotated[
        Path | None,
        typer.Option(
            help="Leave out the benchmark prompts this training file trains on (any file train-classifier reads), "
            "to rank a judge trained on them on the rest; says how many (none for HarmClassifier's released "
            "train_data.jsonl: its prompts are not the benchmark's)."
        ),
    ] = None,
    judge_settings: dict[str, Any] | None = None,
) -> None:
    """Score every benchmark response with each metric (and optionally a judge) and rank them (HarmMetric Eval)."""
    if list_:
        list_metrics(as_json)
        return
    spec = None
    if judge:
        settings = dict(judge_settings or {})
        if samples > 1 and "temperature" not in settings.get("sampling", {}):
            settings["sampling"] = {**settings.get("sampling", {}), "temperature": 0.7}  # sampled verdicts vary
        spec = judge_spec(judge, _one(judge_model), settings)
    run_bench(
        dataset,
        metrics or ("" if judge else "all"),
        scoring=scoring,
        missing=missing,
        reference_agg=reference_agg,
        bootstrap=bootstrap,
        seed=seed,
        out=out,
        judge=spec,
        samples=samples,
        verbose=verbose,
        chart=chart,
        exclude_prompts=_training_prompts(exclude_training_prompts),
    )


def _training_prompts(path: Path | None) -> tuple[str, list[str]] | None:
    """The prompts of a training file (any file `train-classifier` reads), with where they come from."""
    if path is None:
        return None
    from diagsafe_local.classifier.labels import load_pairs

    return str(path), [pair.prompt for pair in load_pairs(path)[0]]


def _one(models: list[str] | None) -> str | None:
    from diagsafe_local.core.errors import DiagsafeError

    if models and len(models) > 1:
        raise DiagsafeError("bench ranks one judge: give one --judge-model")
    return models[0] if models else None
