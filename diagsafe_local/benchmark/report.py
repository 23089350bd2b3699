"""Write and show a benchmark result: leaderboard CSV/Markdown, per-response scores, a chart, a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from diagsafe_local.benchmark.dataset import BenchDataset
from diagsafe_local.benchmark.scoring import SCORE_NAMES
from diagsafe_local.core import atomic
from diagsafe_local.core.figures import png_figure

LEADERBOARD_COLUMNS = ["metric", *SCORE_NAMES]


def write_outputs(
    out_dir: Path,
    board: pd.DataFrame,
    scores: pd.DataFrame,
    manifest: dict[str, object],
    dataset: BenchDataset,
    *,
    chart: bool = False,
) -> list[Path]:
    """Write every output file atomically, as one set (signals held back until all are in place); returns
    their paths. Without `chart`, a chart left by an earlier run is removed: it would not match this set."""
    with atomic.outputs_together():
        return _write_all(out_dir, board, scores, manifest, dataset, chart)


def _write_all(
    out_dir: Path,
    board: pd.DataFrame,
    scores: pd.DataFrame,
    manifest: dict[str, object],
    dataset: BenchDataset,
    chart: bool,
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out_dir / "leaderboard.csv",
        "md": out_dir / "leaderboard.md",
        "scores": out_dir / "scores.parquet",
        "manifest": out_dir / "bench.json",
    }
    png = out_dir / "leaderboard.png"
    if chart:
        paths["png"] = png
        atomic.write_with(png, lambda p: _chart(board, p))
    else:
        png.unlink(missing_ok=True)
    atomic.write_with(paths["scores"], lambda p: scores.to_parquet(p, index=False))
    atomic.write_text(paths["csv"], board.to_csv(index=False))
    atomic.write_text(paths["md"], to_markdown(board, manifest))
    atomic.write_text(paths["manifest"], json.dumps(manifest, indent=2, default=str) + "\n")
    from diagsafe_local.benchmark.failures import failure_analysis, failures_markdown

    shares, by_category, examples = failure_analysis(scores, dataset)
    paths["failures"] = out_dir / "failure_analysis.md"
    atomic.write_text(paths["failures"], failures_markdown(shares, by_category, examples))
    atomic.write_text(out_dir / "failure_analysis.csv", shares.to_csv(index=False))
    atomic.write_text(out_dir / "category_scores.csv", by_category.to_csv(index=False))
    return list(paths.values())


def _fmt(row: pd.Series, name: str) -> str:
    return f"{row[name]:.3f} [{row[name + '_ci_low']:.3f}, {row[name + '_ci_high']:.3f}]"


def to_markdown(board: pd.DataFrame, manifest: dict[str, object]) -> str:
    """Leaderboard as a Markdown table: each score with its bootstrap 95% CI."""
    lines = [
        "# HarmMetric Eval leaderboard",
        "",
        f"Dataset `{manifest.get('dataset')}` ({manifest.get('n_prompts')} prompts, layout {manifest.get('layout')}), "
        f"formula `{manifest.get('formula')}`, missing scores: `{manifest.get('missing')}`. "
        "Each cell: score [95% bootstrap CI over prompts].",
        "",
        "| " + " | ".join([*LEADERBOARD_COLUMNS, "prompts affected"]) + " |",
        "|" + "---|" * (len(LEADERBOARD_COLUMNS) + 1),
    ]
    for _, row in board.iterrows():
        cells = [f"`{row['metric']}`", *(_fmt(row, n) for n in SCORE_NAMES), str(row["n_prompts_affected"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _chart(board: pd.DataFrame, path: Path) -> None:
    import numpy as np

    metrics = list(board["metric"])
    with png_figure(path, (max(8, 1.1 * len(metrics) + 3), 5)) as ax:
        width = 0.8 / len(SCORE_NAMES)
        x = np.arange(len(metrics))
        for k, name in enumerate(SCORE_NAMES):
            values = board[name].to_numpy()
            low, high = board[f"{name}_ci_low"].to_numpy(), board[f"{name}_ci_high"].to_numpy()
            err = np.vstack([values - low, high - values])
            ax.bar(x + (k - (len(SCORE_NAMES) - 1) / 2) * width, values, width, yerr=err, capsize=1.5, label=name)
        ax.set_xticks(x, metrics, rotation=30, ha="right")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("effectiveness (higher = better metric)")
        ax.set_title("HarmMetric Eval: overall and fine-grained scores (95% CI)")
        ax.legend(ncol=4, fontsize=8, loc="upper right")


def print_leaderboard(board: pd.DataFrame) -> None:
    """Rich table of the leaderboard, best metric first."""
    import sys

    from rich.table import Table

    from diagsafe_local.core.console import rich_console

    short = {
        "prevention": "prevent.",
        "redirection": "redirect.",
        "irrelevant": "irrel.",
        "prompt_repetition": "repeat",
        "useless_affirmation": "affirm.",
    }
    table = Table(title="HarmMetric Eval leaderboard")
    for column in ["metric", "overall", "95% CI", *(short.get(n, n) for n in SCORE_NAMES[1:]), "affected"]:
        table.add_column(column, justify="left" if column == "metric" else "right", no_wrap=True)
    for _, row in board.iterrows():
        table.add_row(
            row["metric"],
            f"{row['overall']:.3f}",
            f"{row['overall_ci_low']:.2f}-{row['overall_ci_high']:.2f}",
            *(f"{row[n]:.3f}" for n in SCORE_NAMES[1:]),
            str(row["n_prompts_affected"]),
        )
    rich_console(width=None if sys.stdout.isatty() else 160).print(table)
