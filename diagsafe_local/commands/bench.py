"""`diagsafe-local bench`: rank harmfulness metrics on HarmMetric Eval."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.benchmark.bench import DEFAULT_DATASET, run_bench
from diagsafe_local.commands.common import Reasoning, ReasoningMaxTokens, judge_engine, user_errors


def list_metrics() -> None:
    """Print the metric registry (name, needs a reference, description) and the judge rubrics."""
    from rich.console import Console
    from rich.table import Table

    from diagsafe_local.metrics import METRICS

    table = Table(title=f"{len(METRICS)} metrics")
    table.add_column("name")
    table.add_column("reference")
    table.add_column("description")
    for spec in METRICS:
        table.add_row(spec.name, "yes" if spec.needs_reference else "no", spec.description)
    Console().print(table)
    from diagsafe_local.judging import JUDGES

    judges = Table(title=f"{len(JUDGES)} judges (--judge NAME --judge-model MODEL)")
    for column in ("name", "measures", "P(Yes)", "reasons", "description", "source"):
        judges.add_column(column)
    for judge in JUDGES:
        p_yes = "no" if judge.label_words is None else ("default" if judge.default_probability else "option")
        reasons = "no" if judge.thinking is None else ("default" if judge.reasons_by_default else "option")
        judges.add_row(judge.name, judge.measures, p_yes, reasons, judge.description, judge.source)
    Console().print(judges)


@user_errors
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
    list_: Annotated[bool, typer.Option("--list", help="List the available metrics and exit.")] = False,
    judge: Annotated[str | None, typer.Option(help="Also rank a judge: a rubric name (e.g. harmjudge).")] = None,
    judge_model: Annotated[
        str | None, typer.Option(help="The judge's model: a local directory or hub id (or the served name).")
    ] = None,
    engine: Annotated[
        str, typer.Option(help="Judge engine: 'local' (vLLM on this node) or 'api' (OpenAI-compatible).")
    ] = "local",
    base_url: Annotated[str | None, typer.Option(help="API endpoint for --engine api.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Environment variable holding the API key.")] = None,
    samples: Annotated[int, typer.Option(help="Sampled verdicts averaged per response (the paper used 3).", min=1)] = 1,
    judge_temperature: Annotated[
        float | None, typer.Option(help="Judge temperature (default 0, or 0.7 with --samples > 1).")
    ] = None,
    judge_dtype: Annotated[str, typer.Option(help="Judge dtype (local engine).")] = "auto",
    judge_max_model_len: Annotated[int | None, typer.Option(help="Judge context length (local engine).")] = None,
    judge_lora: Annotated[
        str | None, typer.Option(help="LoRA adapter on the judge model (local engine), e.g. a trained HarmClassifier.")
    ] = None,
    judge_eager: Annotated[
        bool | None,
        typer.Option(
            "--judge-eager/--judge-compiled",
            help="Skip or use graph compilation for the local judge engine (default: eager without CUDA, compiled on GPUs).",
        ),
    ] = None,
    probability: Annotated[
        bool | None,
        typer.Option(
            "--probability/--sampled",
            help="Score a Yes/No judge by first-token P(Yes), or by sampled verdicts (default: the judge's own default).",
        ),
    ] = None,
    reasoning: Reasoning = None,
    reasoning_max_tokens: ReasoningMaxTokens = 1024,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the judge engine's own logs here instead of in OUT/run.log.")
    ] = False,
) -> None:
    """Score every benchmark response with each metric (and optionally a judge) and rank them (HarmMetric Eval)."""
    if list_:
        list_metrics()
        return
    judge_settings = None
    if judge:
        from diagsafe_local.core.errors import DiagsafeError

        if not judge_model:
            raise DiagsafeError("--judge needs --judge-model")
        judge_settings = {
            "rubric": judge,
            "samples": samples,
            "probability": probability,
            "reasoning": reasoning,
            "reasoning_max_tokens": reasoning_max_tokens,
            "temperature": judge_temperature if judge_temperature is not None else (0.7 if samples > 1 else 0.0),
            "engine": judge_engine(
                judge_model, engine, base_url, api_key_env, judge_dtype, judge_max_model_len, judge_lora, judge_eager
            ),
        }
    run_bench(
        dataset,
        metrics or ("" if judge else "all"),
        scoring,
        missing,
        reference_agg,
        bootstrap,
        seed,
        out,
        judge_settings,
        verbose,
    )
