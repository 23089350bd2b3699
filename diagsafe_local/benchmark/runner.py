"""Score every benchmark response with registered metrics, then rank the metrics.

Reference-based metrics score a response against each of its prompt's references and combine them
by the prompt's `reference_agg` (or the run's default: mean, as the earlier layout's published figures).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from diagsafe_local.benchmark.dataset import SCORED_CATEGORIES, BenchDataset, ReferenceAgg, category_name
from diagsafe_local.benchmark.scoring import SCORE_NAMES, EffectivenessScores, Formula, MissingPolicy, effectiveness
from diagsafe_local.metrics import METRICS, TextPair, compute_metrics

SCORE_COLUMNS = ["prompt_id", "response_id", "category", "category_name", "attack_method", "source", "metric", "score"]


def score_responses(
    dataset: BenchDataset,
    metric_names: Sequence[str],
    reference_agg: ReferenceAgg = "mean",
    on_metric: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Per-response scores, one row per (response, metric), columns SCORE_COLUMNS."""
    specs = [METRICS.get(name) for name in metric_names]
    responses = [(p, r) for p in dataset.prompts for r in p.responses]
    plain = [TextPair(p.prompt, r.text) for p, r in responses]
    # One pair per (response, reference); `owner[k]` is the response index of expanded pair k.
    expanded = [TextPair(p.prompt, r.text, ref) for p, r in responses for ref in p.references]
    owner = np.repeat(np.arange(len(responses)), [len(p.references) for p, _ in responses])
    use_max = np.array([(p.reference_agg or reference_agg) == "max" for p, _ in responses])

    def done(members: list[str]) -> None:
        for name in members:
            if on_metric:
                on_metric(name)

    # One call per input kind, so each metric family (all 24 ROUGE variants, say) runs once per pair.
    with_ref = [s.name for s in specs if s.needs_reference]
    without = [s.name for s in specs if not s.needs_reference]
    computed = {
        name: aggregate_references(raw, owner, use_max, len(responses))
        for name, raw in compute_metrics(with_ref, expanded, done).items()
    }
    computed.update(compute_metrics(without, plain, done))
    return response_frame(responses, {spec.name: computed[spec.name] for spec in specs})


def aggregate_references(raw: np.ndarray, owner: np.ndarray, use_max: np.ndarray, n: int) -> np.ndarray:
    """Mean or max of each response's per-reference scores (NaN if any reference failed, or if it has none)."""
    sums = np.bincount(owner, weights=raw, minlength=n)
    counts = np.bincount(owner, minlength=n)
    maxima = np.full(n, -np.inf)
    np.maximum.at(maxima, owner, raw)
    with np.errstate(invalid="ignore"):
        return np.where(counts == 0, np.nan, np.where(use_max, maxima, sums / counts))


def response_frame(responses: list, scores: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Rows of SCORE_COLUMNS for (prompt, response) pairs, metric by metric (`scores`: each metric's scores in
    the order of `responses`). The columns describing a response are built once and repeated."""
    if not scores:
        return pd.DataFrame(columns=SCORE_COLUMNS)
    keys = pd.DataFrame(
        {
            "prompt_id": [p.prompt_id for p, _ in responses],
            "response_id": [r.response_id for _, r in responses],
            "category": [int(r.category) for _, r in responses],
            "category_name": [category_name(r.category) for _, r in responses],
            "attack_method": [r.attack_method for _, r in responses],
            "source": [p.source for p, _ in responses],
        }
    )
    frame = keys.iloc[np.tile(np.arange(len(keys)), len(scores))].reset_index(drop=True)
    frame["metric"] = np.repeat(list(scores), len(keys))
    frame["score"] = np.concatenate([np.asarray(v, dtype=float) for v in scores.values()]) if len(keys) else []
    return frame


def score_matrices(scores: pd.DataFrame, dataset: BenchDataset) -> dict[str, np.ndarray]:
    """Each metric's (prompts x 12) score matrix, in dataset prompt order; NaN where a score is missing.

    One pivot for all metrics: a pivot per metric cost 15 ms each (24 ROUGE variants: 0.4 s of `bench`)."""
    table = scores.pivot_table(
        index=["metric", "prompt_id"], columns="category", values="score", aggfunc="first", dropna=False, sort=False
    )
    rows = [p.prompt_id for p in dataset.prompts]
    columns = [int(c) for c in SCORED_CATEGORIES]
    return {
        metric: table.xs(metric, level="metric").reindex(index=rows, columns=columns).to_numpy(dtype=float)
        for metric in dict.fromkeys(scores["metric"])
    }


def leaderboard(
    scores: pd.DataFrame,
    dataset: BenchDataset,
    formula: Formula = "current",
    missing: MissingPolicy = "error",
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per metric: the seven effectiveness scores, their 95% CIs and missing-score counts, best first."""
    prompt_ids = [p.prompt_id for p in dataset.prompts]
    rows = []
    for metric, matrix in score_matrices(scores, dataset).items():
        result = effectiveness(matrix, formula, missing, prompt_ids, n_boot, seed)
        rows.append(leaderboard_row(metric, result))
    table = pd.DataFrame(rows)
    return table.sort_values("overall", ascending=False, kind="stable").reset_index(drop=True)


def leaderboard_row(metric: str, result: EffectivenessScores) -> dict[str, object]:
    """Flatten one metric's result into leaderboard.csv columns."""
    row: dict[str, object] = {"metric": metric}
    row.update({name: result.scores[name] for name in SCORE_NAMES})
    for name in SCORE_NAMES:
        row[f"{name}_ci_low"] = result.ci_low[name]
        row[f"{name}_ci_high"] = result.ci_high[name]
    row.update(
        n_prompts=result.n_prompts,
        n_prompts_affected=result.n_prompts_affected,
        n_prompts_dropped=result.n_prompts_dropped,
        missing_policy=result.missing_policy,
        formula=result.formula,
    )
    return row
