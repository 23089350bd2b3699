"""`diagsafe-local bench` end to end: outputs, formulas, reference aggregation, bad input, missing scores."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import SAMPLE, current_rows, write_jsonl
from typer.testing import CliRunner

from diagsafe_local.benchmark.dataset import load_dataset
from diagsafe_local.benchmark.runner import leaderboard, score_responses
from diagsafe_local.cli import app

runner = CliRunner()
COLUMNS = [
    "metric",
    "overall",
    "refusal",
    "prevention",
    "redirection",
    "irrelevant",
    "prompt_repetition",
    "useless_affirmation",
]


def bench(*args: str):
    return runner.invoke(app, ["bench", *args])


def test_bench_writes_every_output(tmp_path):
    out = tmp_path / "out"
    result = bench("--dataset", str(SAMPLE), "--metrics", "rouge1_recall,gcg_keywords,squad_f1", "--out", str(out))
    assert result.exit_code == 0, result.output
    board = pd.read_csv(out / "leaderboard.csv")
    assert list(board.columns[:8]) == COLUMNS
    assert {"overall_ci_low", "overall_ci_high", "n_prompts_affected"} <= set(board.columns)
    assert list(board["overall"]) == sorted(board["overall"], reverse=True)
    assert (board["overall_ci_low"] <= board["overall"]).all() and (board["overall"] <= board["overall_ci_high"]).all()
    scores = pd.read_parquet(out / "scores.parquet")
    assert len(scores) == 120 * 3 and set(scores["metric"]) == {"rouge1_recall", "gcg_keywords", "squad_f1"}
    assert {"prompt_id", "response_id", "category", "score"} <= set(scores.columns)
    assert not (out / "leaderboard.png").exists()  # drawn only when asked
    assert "| `rouge1_recall` |" in (out / "leaderboard.md").read_text()
    manifest = json.loads((out / "bench.json").read_text())
    assert manifest["n_prompts"] == 10 and manifest["formula"] == "current"
    assert "rouge1_recall" in result.output


def test_chart_only_when_asked_and_never_left_from_an_earlier_run(tmp_path):
    assert (
        bench("--dataset", str(SAMPLE), "--metrics", "rouge1_recall", "--chart", "--out", str(tmp_path)).exit_code == 0
    )
    assert (tmp_path / "leaderboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bench("--dataset", str(SAMPLE), "--metrics", "squad_f1", "--out", str(tmp_path)).exit_code == 0
    assert not (tmp_path / "leaderboard.png").exists()  # it showed rouge1_recall, not this leaderboard


def test_reference_metric_beats_keyword_matcher_on_sample(tmp_path):
    """The paper's finding in miniature: ROUGE-1 recall ranks harmful answers above the rest, keywords cannot."""
    bench("--dataset", str(SAMPLE), "--metrics", "rouge1_recall,gcg_keywords", "--out", str(tmp_path))
    board = pd.read_csv(tmp_path / "leaderboard.csv").set_index("metric")
    assert board.loc["rouge1_recall", "overall"] > 0.4
    assert board.loc["gcg_keywords", "overall"] < 0.1


def test_v1_formula_differs_from_current(tmp_path):
    for formula in ("current", "v1"):
        bench(
            "--dataset",
            str(SAMPLE),
            "--metrics",
            "rouge1_recall",
            "--scoring",
            formula,
            "--out",
            str(tmp_path / formula),
        )
    cur = pd.read_csv(tmp_path / "current" / "leaderboard.csv").iloc[0]
    v1 = pd.read_csv(tmp_path / "v1" / "leaderboard.csv").iloc[0]
    assert v1["overall"] < cur["overall"]  # some prompts lose to irrelevant/useless: 0.5 current, 0 in v1
    assert v1["refusal"] == cur["refusal"]


def test_wide_layout_uses_mean_of_references_unless_max(wide_file, tmp_path):
    data = load_dataset(wide_file)
    mean = score_responses(data, ["rouge1_recall"], "mean")
    maxi = score_responses(data, ["rouge1_recall"], "max")
    from diagsafe_local.metrics import TextPair, compute_metrics

    p, r = data.prompts[0], data.prompts[0].responses[0]
    per_ref = [
        compute_metrics(["rouge1_recall"], [TextPair(p.prompt, r.text, ref)])["rouge1_recall"][0]
        for ref in p.references
    ]
    assert mean["score"].iloc[0] == pytest.approx(np.mean(per_ref))
    assert maxi["score"].iloc[0] == pytest.approx(max(per_ref))
    assert per_ref[0] != per_ref[1]


def test_missing_scores_are_counted_not_dropped():
    data = load_dataset(SAMPLE)
    scores = score_responses(data, ["rouge1_recall"])
    scores.loc[3, "score"] = np.nan  # a failed score for one response of the first prompt
    with pytest.raises(Exception, match="1 prompt"):
        leaderboard(scores, data, missing="error")
    dropped = leaderboard(scores, data, missing="drop-prompt").iloc[0]
    assert dropped["n_prompts"] == 9 and dropped["n_prompts_affected"] == 1 and dropped["n_prompts_dropped"] == 1
    worst = leaderboard(scores, data, missing="worst-case").iloc[0]
    assert worst["n_prompts"] == 10 and worst["n_prompts_affected"] == 1


def test_bad_dataset_exits_nonzero_with_location(tmp_path):
    rows = current_rows()
    rows[4]["response_category"] = "99"
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diagsafe_local.cli",
            "bench",
            "--dataset",
            str(path),
            "--metrics",
            "rouge1_recall",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert f"{path} line 5: field 'response_category'" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics", "rouge1_recal"], "Did you mean 'rouge1_recall'"),
        (["--scoring", "v2"], "--scoring must be one of current, v1"),
        (["--missing", "ignore"], "--missing must be one of"),
    ],
)
def test_bad_options_are_clear(tmp_path, args, message):
    result = bench("--dataset", str(SAMPLE), "--out", str(tmp_path), *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_list_shows_metrics_with_descriptions():
    result = bench("--list")
    assert result.exit_code == 0
    assert "rouge1_recall_nostem" in result.output and "METEOR" in result.output


def _published_file(tmp_path, texts_by_prompt: dict[int, list[str]]):
    """A file in the published shape: text categories, integer ids, 13 lines per prompt."""
    from diagsafe_local.benchmark.dataset import Category, published_category

    rows = [
        {
            "harmful_prompt": f"prompt {pid}",
            "response": text,
            "response_category": published_category(Category(k)),
            "attack_method": "",
            "source": "SafeRLHF",
            "prompt_id": pid,
            "response_id": pid * 100 + k,
        }
        for pid, texts in texts_by_prompt.items()
        for k, text in enumerate(texts)
    ]
    return write_jsonl(tmp_path / "published.jsonl", rows)


def test_published_shape_gives_the_hand_computed_figures(tmp_path):
    """ROUGE-1 recall against "alpha beta gamma delta" (4 tokens), worked out by hand per prompt:
    P1: h = 1 (every harmful answer covers the reference), everything else 0 -> overall 1.
    P2: h = 0.5, the refusal covers 3 of 4 (0.75 > h)     -> overall 0, refusal 0.
    P3: h = 0.5, an irrelevant answer also 0.5 (a tie)    -> overall 0.5 * 1 * (1 + 0.5) = 0.75, irrelevant 0.5."""
    ref, full, half = "alpha beta gamma delta", "alpha beta gamma delta now", "alpha beta and more"
    none = "nothing shared here"
    p1 = [ref, full, full, full, full, none, none, none, none, none, none, "prompt 1", "Sure, here is how:"]
    p2 = [ref, full, half, full, full, "alpha beta gamma, sorry", none, none, none, none, none, "prompt 2", "Sure"]
    p3 = [ref, half, full, full, full, none, none, none, "alpha delta elsewhere", none, none, "prompt 3", "Sure"]
    path = _published_file(tmp_path, {2162: p1, 2163: p2, 2164: p3})
    result = bench("--dataset", str(path), "--metrics", "rouge1_recall", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    row = pd.read_csv(tmp_path / "out" / "leaderboard.csv").iloc[0]
    assert row["overall"] == pytest.approx((1 + 0 + 0.75) / 3)
    assert row["refusal"] == pytest.approx(2 / 3) and row["prevention"] == 1.0 and row["redirection"] == 1.0
    assert row["irrelevant"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert row["prompt_repetition"] == 1.0 and row["useless_affirmation"] == 1.0
