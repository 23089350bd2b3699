"""validate's output directory, written as one set (signals held until every file is in place):

- `agreement.csv` / `agreement.md`: one row per judge, metric, stored column and panel;
- `confusion.csv`: each row's confusion counts (gold x predicted; the 3 XSTest classes too with --classes 3);
- `by_group.csv`: per prompt type / safe-unsafe (XSTest), per category (HarmMetric Eval), per group column;
- `judge_kappa.csv`: Cohen's kappa between every two rows' decisions;
- `disagreements.jsonl`: every item where a row's decision and the gold label differ, with both;
- `roc.png`, `calibration.png`;
- `annotators.json`: inter-annotator agreement (the ceiling), where the set has several annotators;
- `validation.json`: each judge's confusion counts and identity, read by runs with `judge.validation`;
- `validate.json`: the manifest (tool, gold file and hash, what was validated, bootstrap settings).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from diagsafe_local.core import atomic, jsonl
from diagsafe_local.core.figures import png_figure
from diagsafe_local.runs.validation import VALIDATION_FILE, JudgeErrorRates, ValidationFile
from diagsafe_local.validation.agreement import (
    BINARY,
    SCORED,
    THREE_CLASS,
    agreement_row,
    annotator_agreement,
    binary_metrics,
    confusion_counts,
    effective_counts,
    pairwise_kappa,
)
from diagsafe_local.validation.gold import GoldItem, GoldSet


@dataclass
class Scored:
    """One validated row's per-item scores (NaN = no verdict), its 3-class labels, and where it came from."""

    name: str
    kind: Literal["judge", "metric", "stored", "panel"]
    scores: np.ndarray
    classes: list[str | None] | None = None
    raw: list[str] = field(default_factory=list)
    identity: dict[str, Any] | None = None
    reasoning: list[str | None] = field(default_factory=list)  # a reasoning judge's thoughts, per item


AGREEMENT_COLUMNS = [
    "judge",
    "kind",
    "n",
    "n_missing",
    *(c for m in (*BINARY, *SCORED) for c in (m, f"{m}_ci_low", f"{m}_ci_high")),
    "best_threshold",
    "decision",
]


class Disagreement(BaseModel):
    """One item where a validated row's decision differs from the gold label."""

    model_config = ConfigDict(extra="forbid")

    judge: str
    item_id: str
    line: int | None
    prompt: str
    response: str
    gold: int
    predicted: int
    score: float
    gold_class: str | None = None
    groups: dict[str, str] = {}
    judge_output: str | None = None
    judge_reasoning: str | None = None


def write_outputs(
    out: Path,
    gold: GoldSet,
    rows: list[Scored],
    manifest: dict[str, Any],
    classes: int,
    bootstrap: int,
    seed: int,
    target_fpr: float | None = None,
) -> list[dict[str, Any]]:
    """Compute every table and write the directory as one set; returns the agreement rows."""
    labelled = np.array([item.label is not None for item in gold.items])
    items = [item for item in gold.items if item.label is not None]
    y = np.array([item.label for item in items], dtype=int)
    weights = np.array([item.weight for item in items], dtype=float) if gold.weighted else None
    gold3 = [item.label3 for item in items] if classes == 3 else None
    table, predictions = [], {}
    for scored in rows:
        pred3 = [c for c, keep in zip(scored.classes or [None] * len(gold.items), labelled) if keep]
        row, predicted = agreement_row(
            scored.name,
            y,
            scored.scores[labelled],
            "best-threshold" if scored.kind == "metric" else "verdict",
            bootstrap,
            seed,
            gold3 if scored.classes is not None else None,
            pred3 if scored.classes is not None else None,
            target_fpr,
            weights,
        )
        table.append({"kind": scored.kind, **row})
        predictions[scored.name] = predicted
    columns = (
        AGREEMENT_COLUMNS
        + (["threshold_at_target_fpr", "fpr_at_threshold", "tpr_at_threshold"] if target_fpr is not None else [])
        + ([c for m in THREE_CLASS for c in (m, f"{m}_ci_low", f"{m}_ci_high")] if classes == 3 else [])
    )
    agreement = pd.DataFrame(table).reindex(columns=columns)
    raw = {scored.name: [r for r, keep in zip(scored.raw, labelled) if keep] for scored in rows if scored.raw}
    annotators = (
        annotator_agreement([item.annotators for item in items], [item.label for item in items])
        if gold.annotator_columns
        else None
    )
    if annotators is not None:
        annotators["columns"] = list(gold.annotator_columns)
    with atomic.outputs_together():
        out.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out / "agreement.csv", agreement.to_csv(index=False))
        atomic.write_text(
            out / "confusion.csv", _confusion(items, y, predictions, rows, labelled, classes).to_csv(index=False)
        )
        atomic.write_text(out / "by_group.csv", _by_group(items, y, predictions).to_csv(index=False))
        kappa = pd.DataFrame(pairwise_kappa(predictions)).rename_axis("judge").reset_index()
        atomic.write_text(out / "judge_kappa.csv", kappa.to_csv(index=False))
        jsonl.write(out / "disagreements.jsonl", _disagreements(items, y, predictions, rows, labelled, raw))
        atomic.write_with(out / "roc.png", lambda p: _roc(y, rows, labelled, p))
        atomic.write_with(out / "calibration.png", lambda p: _calibration(y, rows, labelled, p))
        if annotators is not None:
            atomic.write_text(out / "annotators.json", json.dumps(annotators, indent=2) + "\n")
        atomic.write_text(
            out / VALIDATION_FILE, _validation(gold, y, predictions, rows, weights).model_dump_json(indent=2) + "\n"
        )
        atomic.write_text(out / "validate.json", json.dumps(manifest, indent=2, default=str) + "\n")
        atomic.write_text(out / "agreement.md", _markdown(agreement, annotators, kappa, manifest))
    return table


def _confusion(
    items: list[GoldItem],
    y: np.ndarray,
    predictions: dict[str, np.ndarray],
    rows: list[Scored],
    labelled: np.ndarray,
    classes: int,
) -> pd.DataFrame:
    from sklearn.metrics import confusion_matrix

    records = []
    for name, predicted in predictions.items():
        decided = predicted >= 0
        counts = confusion_counts(y[decided], predicted[decided])  # tn, fp, fn, tp: gold-major order
        records += [
            {"judge": name, "task": "binary", "gold": g, "predicted": p, "count": count}
            for (g, p), count in zip(((0, 0), (0, 1), (1, 0), (1, 1)), counts)
        ]
    if classes == 3:
        from diagsafe_local.validation.gold import XSTEST_CLASSES

        for scored in rows:
            if scored.classes is None:
                continue
            pairs = [
                (i.label3, c)
                for i, c in zip(items, (c for c, keep in zip(scored.classes, labelled) if keep))
                if c and i.label3
            ]
            if not pairs:
                continue
            matrix = confusion_matrix([g for g, _ in pairs], [p for _, p in pairs], labels=list(XSTEST_CLASSES))
            records += [
                {"judge": scored.name, "task": "3class", "gold": g, "predicted": p, "count": int(matrix[a, b])}
                for a, g in enumerate(XSTEST_CLASSES)
                for b, p in enumerate(XSTEST_CLASSES)
            ]
    return pd.DataFrame(records, columns=["judge", "task", "gold", "predicted", "count"])


def _by_group(items: list[GoldItem], y: np.ndarray, predictions: dict[str, np.ndarray]) -> pd.DataFrame:
    """Per group: how often the judge calls the items positive, against the gold share, and its error rates."""
    records = []
    fields = sorted({f for item in items for f in item.groups})
    for name, predicted in predictions.items():
        for group_field in fields:
            values = np.array([item.groups.get(group_field, "") for item in items])
            for group in sorted(set(values)):
                mask = (values == group) & (predicted >= 0)
                yg, pg = y[mask], predicted[mask]
                figures = binary_metrics(yg, pg) if len(yg) else dict.fromkeys(("accuracy", "fpr", "fnr"), np.nan)
                records.append(
                    {
                        "judge": name,
                        "group_field": group_field,
                        "group": group,
                        "n": int(mask.sum()),
                        "n_missing": int(((values == group) & (predicted < 0)).sum()),
                        "gold_positive_rate": float(yg.mean()) if len(yg) else np.nan,
                        "predicted_positive_rate": float(pg.mean()) if len(pg) else np.nan,
                        **({k: figures[k] for k in ("accuracy", "fpr", "fnr")}),
                    }
                )
    return pd.DataFrame(
        records,
        columns=[
            "judge",
            "group_field",
            "group",
            "n",
            "n_missing",
            "gold_positive_rate",
            "predicted_positive_rate",
            "accuracy",
            "fpr",
            "fnr",
        ],
    )


def _disagreements(
    items: list[GoldItem],
    y: np.ndarray,
    predictions: dict[str, np.ndarray],
    rows: list[Scored],
    labelled: np.ndarray,
    raw: dict[str, list[str]],
) -> list[Disagreement]:
    out = []
    for scored in rows:
        predicted = predictions[scored.name]
        scores = scored.scores[labelled]
        for k, item in enumerate(items):
            if predicted[k] >= 0 and predicted[k] != y[k]:
                out.append(
                    Disagreement(
                        judge=scored.name,
                        item_id=item.id,
                        line=item.line,
                        prompt=item.prompt,
                        response=item.response,
                        gold=int(y[k]),
                        predicted=int(predicted[k]),
                        score=float(scores[k]),
                        gold_class=item.label3,
                        groups=item.groups,
                        judge_output=raw[scored.name][k] if scored.name in raw else None,
                        judge_reasoning=scored.reasoning[k] if scored.reasoning else None,
                    )
                )
    return out


def _validation(
    gold: GoldSet, y: np.ndarray, predictions: dict[str, np.ndarray], rows: list[Scored], weights: np.ndarray | None
) -> ValidationFile:
    judges = []
    for scored in rows:
        if scored.kind == "metric":
            continue
        predicted = predictions[scored.name]
        decided = predicted >= 0
        w = None if weights is None else weights[decided]
        tn, fp, fn, tp = effective_counts(y[decided], predicted[decided], w)
        identity = scored.identity or {}
        judges.append(
            JudgeErrorRates(
                judge=scored.name,
                rubric=identity.get("rubric"),
                model=identity.get("model"),
                model_hash=identity.get("model_hash"),
                lora_hash=identity.get("lora_hash"),
                snapshot_hash=identity.get("snapshot_hash"),
                scoring=identity.get("scoring"),
                tp=tp,
                fp=fp,
                tn=tn,
                fn=fn,
                missing=int((~decided).sum()),
            )
        )
    return ValidationFile(
        gold=gold.source,
        gold_sha256=gold.sha256,
        task=gold.task,
        judges=judges,
        format=gold.format,
        n_labelled=len(y),
        weighted=gold.weighted,
    )


def _figure(path: Path, draw: Any, title: str, xlabel: str, ylabel: str) -> None:
    with png_figure(path, (6, 5), dpi=110) as ax:
        ax.plot([0, 1], [0, 1], linestyle=":", color="grey")
        draw(ax)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel, xlim=(0, 1), ylim=(0, 1.02))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")


def _roc(y: np.ndarray, rows: list[Scored], labelled: np.ndarray, path: Path) -> None:
    from sklearn.metrics import roc_curve

    def draw(ax: Any) -> None:
        if len(set(y)) < 2:
            ax.text(0.5, 0.5, "one class only: no ROC", ha="center")
            return
        for scored in rows:
            scores = scored.scores[labelled]
            keep = np.isfinite(scores)
            if keep.sum() == 0:
                continue
            fpr, tpr, _ = roc_curve(y[keep], scores[keep])
            ax.plot(fpr, tpr, marker="o" if len(fpr) <= 3 else None, markersize=3, label=scored.name)

    _figure(path, draw, "ROC against the gold labels", "false positive rate", "true positive rate")


def _calibration(y: np.ndarray, rows: list[Scored], labelled: np.ndarray, path: Path) -> None:
    from sklearn.calibration import calibration_curve

    def draw(ax: Any) -> None:
        drawn = False
        for scored in rows:
            scores = scored.scores[labelled]
            keep = np.isfinite(scores)
            if keep.sum() == 0 or not set(scores[keep].tolist()) - {0.0, 1.0} or len(set(y[keep])) < 2:
                continue
            true, predicted = calibration_curve(y[keep], np.clip(scores[keep], 0, 1), n_bins=10)
            ax.plot(predicted, true, marker="o", markersize=3, label=scored.name)
            drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no score-valued judge: nothing to calibrate", ha="center")

    _figure(path, draw, "Reliability diagram (10 equal-width bins)", "mean predicted score", "share positive in gold")


def _cell(row: pd.Series, name: str) -> str:
    value = row[name]
    if pd.isna(value):
        return "–"
    low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
    return f"{value:.3f} [{low:.3f}, {high:.3f}]" if pd.notna(low) else f"{value:.3f}"


def _markdown(
    agreement: pd.DataFrame, annotators: dict[str, Any] | None, kappa: pd.DataFrame, manifest: dict[str, Any]
) -> str:
    shown = ["accuracy", "balanced_accuracy", "f1", "cohen_kappa", "fpr", "fnr", "auroc"]
    lines = [
        f"# Judge agreement with gold labels: {manifest['gold']}",
        "",
        f"{manifest['n_labelled']} labelled items ({manifest['format']}, task: {manifest['task']}); "
        "95% CIs: Wilson for shares of items, bootstrap over items for the rest. `n_missing`: items without a verdict.",
        "",
        "| judge | n | missing | " + " | ".join(shown) + " |",
        "|" + "---|" * (len(shown) + 3),
    ]
    for _, row in agreement.iterrows():
        lines.append(
            f"| {row['judge']} | {row['n']} | {row['n_missing']} | " + " | ".join(_cell(row, m) for m in shown) + " |"
        )
    if any(agreement["decision"].str.startswith("score >=")):
        lines += [
            "",
            "Metrics are cut at the threshold that agrees best on this very set: their binary figures are optimistic.",
        ]
    if annotators is not None:
        ceiling = ", ".join("–" if a is None else f"{a:.3f}" for a in annotators["agreement_with_majority"])
        lines += [
            "",
            "## Inter-annotator agreement (the ceiling a judge can reach)",
            "",
            f"Fleiss' kappa {annotators.get('fleiss_kappa', float('nan')):.3f} over {annotators['n_items']} items "
            f"labelled by all {annotators['n_annotators']} annotators; each annotator's agreement with the majority: {ceiling}.",
        ]
    if len(kappa) > 1:
        names = list(kappa["judge"])
        lines += [
            "",
            "## Cohen's kappa between judges",
            "",
            "| | " + " | ".join(names) + " |",
            "|" + "---|" * (len(names) + 1),
        ]
        for _, row in kappa.iterrows():
            cells = ("–" if pd.isna(row[n]) else f"{row[n]:.3f}" for n in names)
            lines.append(f"| {row['judge']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
