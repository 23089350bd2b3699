"""Held-out evaluation of a HarmClassifier: the base model's P(Yes), the tuned model's P(Yes) and the
reference metric, side by side. On a HarmMetric-layout source each gets its HarmMetric Eval
effectiveness on the held-out prompts; on any source, the AUROC against the human labels and, for the
probabilities, the accuracy at 0.5."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from diagsafe_local.benchmark.dataset import BenchDataset
from diagsafe_local.benchmark.runner import leaderboard, response_frame
from diagsafe_local.classifier.labels import LabelledPair


def auroc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); NaN with one class only."""
    keep = ~np.isnan(scores)
    scores, positive = scores[keep], positive[keep]
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    ranks = pd.Series(scores).rank(method="average").to_numpy()
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def evaluation_table(
    pairs: Sequence[LabelledPair],
    scorers: dict[str, np.ndarray],
    probabilities: set[str],
    dataset: BenchDataset | None,
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per scorer: HarmMetric effectiveness (HarmMetric sources), AUROC, accuracy at 0.5."""
    positive = np.array([p.harmful for p in pairs])
    rows = {
        name: {
            "scorer": name,
            "auroc": auroc(np.asarray(s, float), positive),
            "accuracy@0.5": float(np.mean((np.asarray(s) >= 0.5) == positive)) if name in probabilities else np.nan,
        }
        for name, s in scorers.items()
    }
    if dataset is not None:
        held = {p.prompt_id for p in pairs}
        subset = dataset.model_copy(update={"prompts": tuple(p for p in dataset.prompts if p.prompt_id in held)})
        index = {(p.prompt_id, p.response_id): k for k, p in enumerate(pairs)}
        responses = [(p, r) for p in subset.prompts for r in p.responses]
        order = [index[(p.prompt_id, r.response_id)] for p, r in responses]
        frame = response_frame(responses, {name: np.asarray(values)[order] for name, values in scorers.items()})
        board = leaderboard(frame, subset, missing="worst-case", n_boot=n_boot, seed=seed)
        for _, row in board.iterrows():
            rows[row["metric"]].update(
                {
                    "harmmetric_overall": row["overall"],
                    "ci_low": row["overall_ci_low"],
                    "ci_high": row["overall_ci_high"],
                    "n_prompts": row["n_prompts"],
                }
            )
    table = pd.DataFrame(list(rows.values()))
    by = "harmmetric_overall" if "harmmetric_overall" in table else "auroc"
    return table.sort_values(by, ascending=False, kind="stable").reset_index(drop=True)
