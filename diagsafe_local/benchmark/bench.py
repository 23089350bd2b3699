"""The `bench` command's work: score HarmMetric Eval with metrics (and a judge through an engine), rank them,
write the leaderboard and its files. Shared by `bench` and `demo`."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from diagsafe_local import __version__
from diagsafe_local.core.console import progress

DEFAULT_DATASET = "Abel-24/HarmMetric_Eval"


def judge_config(judge: dict[str, Any]) -> Any:
    """The judge's engine config, validated (and a local model path checked) before anything is written."""
    from pydantic import ValidationError

    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.engines.base import local_model_path
    from diagsafe_local.judging import JUDGES
    from diagsafe_local.judging.config import JudgeConfig

    spec = JUDGES.get(judge["rubric"])
    settings = {k: v for k, v in judge["engine"].items() if v is not None}
    if spec.engine_kind:
        settings = {"kind": spec.engine_kind, "model": settings["model"]}
    try:
        config = JudgeConfig(
            **settings,
            rubric=spec.name,
            benign_rubric="refusal-keywords",
            probability=judge["probability"],
            reasoning=judge.get("reasoning"),
            reasoning_max_tokens=judge.get("reasoning_max_tokens", 1024),
        )
    except ValidationError as exc:
        raise DiagsafeError("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())) from None
    if config.kind != "openai":
        local_model_path(config.model)
    return config


def _judge_scores(data: Any, judge: dict[str, Any], config: Any, out: Path, seed: int, verbose: bool) -> Any:
    """Score the benchmark with a judge through an engine (loaded here, closed after)."""
    from diagsafe_local.benchmark.judge_scores import judge_benchmark, judge_metric_name
    from diagsafe_local.core.console import engine_output
    from diagsafe_local.engines import create_engine

    metric = judge_metric_name(config.rubric, config.model, judge["probability"])
    with engine_output(None if verbose else out / "run.log") as console:
        engine = create_engine(config, structured_backend="xgrammar")
        try:
            decoding = config.decoding().model_copy(update={"temperature": judge["temperature"]})
            return judge_benchmark(
                data,
                engine,
                config.rubric,
                metric,
                out / "judgments.jsonl",
                samples=judge["samples"],
                decoding=decoding,
                seed=seed,
                on_batch=lambda done, total: console.progress(f"{metric}: judging", done, total),
            )
        finally:
            engine.close()


def run_bench(
    dataset: str,
    metrics: str,
    scoring: str,
    missing: str,
    reference_agg: str,
    bootstrap: int,
    seed: int,
    out: Path,
    judge: dict[str, Any] | None = None,
    verbose: bool = False,
) -> None:
    """Validate everything, lock `out`, score, rank and write the outputs."""
    from diagsafe_local.benchmark.dataset import load_dataset
    from diagsafe_local.core.atomic import remove_stale_temporaries
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.core.hub import resolve_dataset
    from diagsafe_local.core.locking import DirectoryLock
    from diagsafe_local.metrics import METRICS

    for name, value, allowed in (
        ("--scoring", scoring, ("current", "v1")),
        ("--missing", missing, ("error", "drop-prompt", "worst-case")),
        ("--reference-agg", reference_agg, ("mean", "max")),
    ):
        if value not in allowed:
            raise DiagsafeError(f"{name} must be one of {', '.join(allowed)}; got '{value}'")
    names = METRICS.names() if metrics == "all" else [m.strip() for m in metrics.split(",") if m.strip()]
    for name in names:
        METRICS.get(name)
    if not names and not judge:
        raise DiagsafeError("nothing to rank: give --metrics and/or --judge")
    config = judge_config(judge) if judge else None
    data = load_dataset(resolve_dataset(dataset))
    lock = DirectoryLock(out, "bench")  # also proves --out writable before any scoring
    remove_stale_temporaries(out)
    try:
        _rank(data, dataset, names, scoring, missing, reference_agg, bootstrap, seed, out, judge, config, verbose)
    finally:
        lock.release()


def _rank(
    data,
    dataset: str,
    names: list[str],
    scoring: str,
    missing: str,
    reference_agg: str,
    bootstrap: int,
    seed: int,
    out: Path,
    judge: dict | None,
    config=None,
    verbose: bool = False,
) -> None:
    from diagsafe_local.benchmark.report import print_leaderboard, write_outputs
    from diagsafe_local.benchmark.runner import leaderboard, score_responses

    with progress("scoring", len(names)) as advance:
        scores = score_responses(data, names, reference_agg, on_metric=advance)  # type: ignore[arg-type]
    if judge:
        import pandas as pd

        scores = pd.concat([scores, _judge_scores(data, judge, config, out, seed, verbose)], ignore_index=True)
        names = [*names, scores["metric"].iloc[-1]]
    board = leaderboard(scores, data, scoring, missing, bootstrap, seed)  # type: ignore[arg-type]
    manifest = {
        "tool": f"diagsafe-local {__version__}",
        "python": platform.python_version(),
        "dataset": dataset,
        "dataset_path": data.path,
        "dataset_sha256": data.sha256,
        "layout": data.layout,
        "n_prompts": len(data.prompts),
        "n_responses": data.n_responses,
        "metrics": names,
        "judge": judge,
        "formula": scoring,
        "missing": missing,
        "reference_agg": reference_agg,
        "bootstrap": bootstrap,
        "seed": seed,
    }
    paths = write_outputs(out, board, scores, manifest, data)
    print_leaderboard(board)
    print("wrote " + ", ".join(str(p) for p in paths))
