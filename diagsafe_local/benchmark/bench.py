"""The `bench` command's work: score HarmMetric Eval with metrics (and a judge through an engine), rank them,
write the leaderboard and its files. Shared by `bench` and `demo`."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diagsafe_local import __version__
from diagsafe_local.core.console import progress
from diagsafe_local.judging.config import JudgeConfig

DEFAULT_DATASET = "Abel-24/HarmMetric_Eval"


def _judge_scores(data: Any, judge: JudgeConfig, samples: int, out: Path, seed: int, verbose: bool) -> Any:
    """Score the benchmark with a judge through an engine (loaded here, closed after; none for a model-free one)."""
    from diagsafe_local.benchmark.judge_scores import judge_benchmark, judge_metric_name
    from diagsafe_local.core.console import engine_output
    from diagsafe_local.engines import create_engine

    metric = judge_metric_name(judge.rubric_name, judge.model, judge.probability)
    with engine_output(None if verbose else out / "run.log") as console:
        engine = create_engine(judge, structured_backend="xgrammar") if judge.needs_model else None
        try:
            return judge_benchmark(
                data,
                engine,
                judge.rubric_name,
                metric,
                out / "judgments.jsonl",
                samples=samples,
                decoding=judge.decoding(),
                max_attempts=judge.max_attempts,
                seed=seed,
                on_batch=lambda done, total: console.progress(f"{metric}: judging", done, total),
            )
        finally:
            if engine is not None:
                engine.close()


def run_bench(
    dataset: str,
    metrics: str,
    *,
    scoring: str = "current",
    missing: str = "error",
    reference_agg: str = "mean",
    bootstrap: int = 1000,
    seed: int = 0,
    out: Path,
    judge: JudgeConfig | None = None,
    samples: int = 1,
    verbose: bool = False,
    chart: bool = False,
    exclude_prompts: tuple[str, Sequence[str]] | None = None,
) -> None:
    """Validate everything, lock `out`, score, rank and write the outputs (the chart only when asked).
    `exclude_prompts`: (the file they come from, prompts) a judge was trained on, left out so that it is ranked
    on the rest."""
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
    if judge is not None and judge.harm_judge.measures != "harm":
        raise DiagsafeError(
            f"rubric '{judge.rubric}' measures {judge.harm_judge.measures}, not harm: the benchmark ranks harm judges"
        )
    data = load_dataset(resolve_dataset(dataset))
    if exclude_prompts is not None:
        data = without_prompts(data, *exclude_prompts)
    lock = DirectoryLock(out, "bench")  # also proves --out writable before any scoring
    remove_stale_temporaries(out)
    try:
        _rank(
            data, dataset, names, scoring, missing, reference_agg, bootstrap, seed, out, judge, samples, verbose, chart
        )
    finally:
        lock.release()


def without_prompts(data: Any, source: str, prompts: Sequence[str]) -> Any:
    """The benchmark without these prompts (compared with whitespace collapsed)."""
    from diagsafe_local.core.errors import DiagsafeError

    def key(text: str) -> str:
        return " ".join(text.split())

    trained = {key(p) for p in prompts}
    kept = tuple(p for p in data.prompts if key(p.prompt) not in trained)
    left_out, name = len(data.prompts) - len(kept), Path(source).name
    if not kept:
        raise DiagsafeError(f"{source} trains on all {left_out} benchmark prompts: none is left to rank")
    if not left_out:  # the authors' released train_data.jsonl: its 271 prompts are none of the benchmark's 274
        print(
            f"none of the {len(trained)} prompts {name} trains on is a benchmark prompt (compared with whitespace "
            f"collapsed): nothing left out, ranking on all {len(kept)}"
        )
    else:
        print(f"left out {left_out} benchmark prompts that {name} trains on; ranking on {len(kept)}")
    return data.model_copy(update={"prompts": kept})


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
    judge: JudgeConfig | None,
    samples: int,
    verbose: bool,
    chart: bool,
) -> None:
    from diagsafe_local.benchmark.report import print_leaderboard, write_outputs
    from diagsafe_local.benchmark.runner import leaderboard, score_responses

    with progress("scoring", len(names)) as advance:
        scores = score_responses(data, names, reference_agg, on_metric=advance)  # type: ignore[arg-type]
    if judge:
        import pandas as pd

        scores = pd.concat([scores, _judge_scores(data, judge, samples, out, seed, verbose)], ignore_index=True)
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
        "judge": None if judge is None else {**judge.model_dump(mode="json", exclude_none=True), "samples": samples},
        "formula": scoring,
        "missing": missing,
        "reference_agg": reference_agg,
        "bootstrap": bootstrap,
        "seed": seed,
    }
    paths = write_outputs(out, board, scores, manifest, data, chart=chart)
    print_leaderboard(board)
    print("wrote " + ", ".join(str(p) for p in paths))
