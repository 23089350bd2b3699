"""Agreement statistics of a judge with gold labels, with 95% CIs (scikit-learn computes every metric;
statsmodels the Wilson intervals and the inter-annotator Fleiss' kappa).

Rates that are a share of items (accuracy, precision, recall, FPR, FNR) get Wilson intervals, which stay
honest at small n and at 0% or 100% (a judge right on all 20 items: accuracy [84%, 100%], where a bootstrap
says [100%, 100%]). Composite figures (balanced accuracy, F1, kappa, AUROC, AUPRC, ECE and the 3-class
figures) get percentile-bootstrap intervals over items.

A judge's binary decision is its verdict (score above 0.5: harmful, or refused); for score-valued judges
(P(Yes), a classifier's probability, a reference metric) AUROC, AUPRC, ECE and the threshold that maximises
agreement are reported too. A reference metric has no decision of its own: it is cut at that best threshold,
fitted on the same set (so its binary figures are optimistic, and the table says so in `decision`).
Items without a verdict (a parse failure, an engine error) are counted in `n_missing` and left out of
every figure; they are never guessed.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from diagsafe_local.runs.verdicts import HARMFUL_ABOVE
from diagsafe_local.stats import bootstrap, wilson

BINARY = ("accuracy", "balanced_accuracy", "precision", "recall", "f1", "cohen_kappa", "fpr", "fnr")
SHARES = ("accuracy", "precision", "recall", "fpr", "fnr")  # Wilson intervals; the rest are bootstrapped
SCORED = ("auroc", "auprc", "ece")
THREE_CLASS = ("accuracy_3class", "macro_f1_3class", "cohen_kappa_3class")


def binary_metrics(y: np.ndarray, pred: np.ndarray, w: np.ndarray | None = None) -> dict[str, float]:
    """Accuracy, balanced accuracy, precision, recall, F1, Cohen's kappa, FPR, FNR of 0/1 predictions
    (NaN where undefined, e.g. FNR without positives); weighted by `w` where the items are a weighted sample."""
    from sklearn.metrics import accuracy_score, cohen_kappa_score, precision_recall_fscore_support

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        precision, recall, f1, support = precision_recall_fscore_support(
            y, pred, labels=[0, 1], zero_division=np.nan, sample_weight=w
        )
        specificity, sensitivity = (r if s else np.nan for r, s in zip(recall, support))
        kappa = cohen_kappa_score(y, pred, labels=[0, 1], sample_weight=w) if len(set(y) | set(pred)) > 1 else np.nan
    return {
        "accuracy": float(accuracy_score(y, pred, sample_weight=w)),
        # sklearn's balanced_accuracy_score, written as the mean recall: it warns and misreports on one class
        "balanced_accuracy": float(np.nanmean([specificity, sensitivity])),
        "precision": float(precision[1]),
        "recall": float(sensitivity),
        "f1": float(f1[1]) if support[1] or (pred == 1).any() else np.nan,
        "cohen_kappa": float(kappa),
        "fpr": float(1 - specificity),
        "fnr": float(1 - sensitivity),
    }


def score_metrics(y: np.ndarray, score: np.ndarray, bins: int = 10, w: np.ndarray | None = None) -> dict[str, float]:
    """AUROC, AUPRC (average precision) and expected calibration error (`bins` equal-width bins; scikit-learn
    has no ECE, so it is the bin-weighted gap of its calibration curve's bins); weighted by `w` if given."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    if len(set(y)) < 2:
        return {"auroc": np.nan, "auprc": np.nan, "ece": np.nan}
    weights = np.ones(len(y)) if w is None else w
    edges = np.linspace(0.0, 1.0, bins + 1)
    ids = np.searchsorted(edges[1:-1], score)  # the bins of sklearn.calibration.calibration_curve
    counts = np.bincount(ids, minlength=bins)
    filled = counts > 0
    gap = np.abs(
        np.bincount(ids, weights=y * weights, minlength=bins)[filled]
        - np.bincount(ids, weights=score * weights, minlength=bins)[filled]
    )
    return {
        "auroc": float(roc_auc_score(y, score, sample_weight=w)),
        "auprc": float(average_precision_score(y, score, sample_weight=w)),
        "ece": float(gap.sum() / weights.sum()),
    }


def best_threshold(y: np.ndarray, score: np.ndarray, w: np.ndarray | None = None) -> float:
    """The score threshold (score >= t is positive) with the highest agreement, from sklearn's ROC curve."""
    from sklearn.metrics import roc_curve

    if len(set(y)) < 2:
        return float("nan")
    weights = np.ones(len(y)) if w is None else w
    fpr, tpr, thresholds = roc_curve(y, score, sample_weight=w)
    positives, negatives = float(weights[y == 1].sum()), float(weights[y == 0].sum())
    agreement = (tpr * positives + (1 - fpr) * negatives) / weights.sum()
    agreement[~np.isfinite(thresholds)] = -1
    return float(thresholds[int(np.argmax(agreement))])


def threshold_at_fpr(y: np.ndarray, score: np.ndarray, target: float) -> tuple[float, float, float]:
    """(threshold, its FPR, its TPR): the lowest cut on sklearn's ROC curve whose FPR stays within `target`."""
    from sklearn.metrics import roc_curve

    if len(set(y)) < 2:
        return float("nan"), float("nan"), float("nan")
    fpr, tpr, thresholds = roc_curve(y, score)
    allowed = np.flatnonzero((fpr <= target) & np.isfinite(thresholds))
    if not len(allowed):
        return float("nan"), float("nan"), float("nan")
    k = allowed[-1]
    return float(thresholds[k]), float(fpr[k]), float(tpr[k])


def three_class_metrics(gold: Sequence[str], pred: Sequence[str]) -> dict[str, float]:
    from sklearn.metrics import accuracy_score, cohen_kappa_score, f1_score

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "accuracy_3class": float(accuracy_score(gold, pred)),
            "macro_f1_3class": float(f1_score(gold, pred, average="macro", zero_division=np.nan)),
            "cohen_kappa_3class": float(cohen_kappa_score(gold, pred)) if len(set(gold) | set(pred)) > 1 else np.nan,
        }


def agreement_row(
    name: str,
    y: np.ndarray,
    score: np.ndarray,
    decision: str,
    resamples: int,
    seed: int,
    gold3: Sequence[str | None] | None = None,
    pred3: Sequence[str | None] | None = None,
    target_fpr: float | None = None,
    weights: np.ndarray | None = None,
) -> tuple[dict[str, Any], np.ndarray]:
    """One row of agreement.csv for a judge's scores (NaN = no verdict) on gold labels `y`, and the 0/1
    predictions it was scored on (-1 where missing). `decision` is 'verdict' (score > 0.5) or 'best-threshold'.
    With `weights` (inverse inclusion probabilities of a weighted sample), every figure is weighted, so it
    estimates the population's; the intervals of shares use the Kish effective sample size."""
    judged = np.isfinite(score)
    yj, sj = y[judged], score[judged]
    wj = None if weights is None else weights[judged]
    scored = len(set(sj.tolist()) - {0.0, 1.0}) > 0  # more than a 0/1 verdict: a score worth ranking by
    threshold = best_threshold(yj, sj, wj) if scored else float("nan")
    predj = (
        (sj >= threshold).astype(int) if decision == "best-threshold" else (sj > HARMFUL_ABOVE).astype(int)
    )  # is_harmful, vectorised
    three = gold3 is not None and pred3 is not None
    g3 = np.array(gold3, dtype=object)[judged] if three else None
    p3 = np.array(pred3, dtype=object)[judged] if three else None

    def figures(index: np.ndarray) -> dict[str, float]:
        w = None if wj is None else wj[index]
        out = {k: v for k, v in binary_metrics(yj[index], predj[index], w).items() if k not in SHARES}
        if scored:
            out |= score_metrics(yj[index], sj[index], w=w)
        if three:
            out |= three_class_metrics(list(g3[index]), list(p3[index]))  # type: ignore[index]
        return out

    row: dict[str, Any] = {"judge": name, "n": int(judged.sum()), "n_missing": int((~judged).sum())}
    if row["n"]:
        point = binary_metrics(yj, predj, wj) | figures(np.arange(row["n"]))
        intervals = bootstrap(row["n"], figures, resamples, seed) | share_intervals(yj, predj, wj)
    else:
        point, intervals = {}, {}
    for metric in (*BINARY, *SCORED, *(THREE_CLASS if three else ())):
        row[metric] = _unit(point.get(metric, np.nan))
        low, high = intervals.get(metric, (np.nan, np.nan))
        row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = _unit(low), _unit(high)
    row["best_threshold"] = threshold
    if target_fpr is not None:
        cut = threshold_at_fpr(yj, sj, target_fpr) if scored else (float("nan"),) * 3
        row["threshold_at_target_fpr"], row["fpr_at_threshold"], row["tpr_at_threshold"] = cut
    row["decision"] = (
        "score >= best_threshold (fitted on this set)" if decision == "best-threshold" else "verdict (score > 0.5)"
    )
    predictions = np.full(len(y), -1)
    predictions[judged] = predj
    return row, predictions


def _unit(value: float | None) -> float:
    """A figure within its range (float rounding can put an AUPRC at 1.0000000000000002); NaN stays NaN."""
    return float("nan") if value is None else float(np.clip(value, -1.0, 1.0))


def confusion_counts(y: np.ndarray, pred: np.ndarray) -> tuple[int, int, int, int]:
    """(tn, fp, fn, tp) of 0/1 predictions, from sklearn's confusion matrix."""
    from sklearn.metrics import confusion_matrix

    if not len(y):  # sklearn refuses an empty sample: a judge without a single verdict (its engine died)
        return 0, 0, 0, 0
    tn, fp, fn, tp = (int(v) for v in confusion_matrix(y, pred, labels=[0, 1]).ravel())
    return tn, fp, fn, tp


def effective_counts(y: np.ndarray, pred: np.ndarray, w: np.ndarray | None) -> tuple[float, float, float, float]:
    """(tn, fp, fn, tp) as counts of a simple random sample as informative as the weighted one (what the
    judge-error correction draws from): each class's weighted confusion share times its effective size, the
    share's binomial variance over its design variance, s(1 - s) / V with V = sum w^2 (z - s)^2 / (sum w)^2 (Korn
    and Graubard 1998; equal weights give the number of items). A share of 0 or 1 has no design variance to
    measure: its effective size is then the class's number of items."""
    if w is None:
        return tuple(float(v) for v in confusion_counts(y, pred))  # type: ignore[return-value]
    out = []
    for label in (0, 1):
        members = y == label
        weights, called = w[members], (pred[members] == 1).astype(float)
        total = weights.sum()
        share = float((weights * called).sum() / total) if total else 0.0
        variance = float((weights**2 * (called - share) ** 2).sum() / total**2) if total else 0.0
        if 0.0 < share < 1.0 and variance > 0.0:
            size = share * (1 - share) / variance
        else:
            size = float(members.sum())
        for predicted in (0, 1):
            out.append((share if predicted else 1 - share) * size)
    tn, fp, fn, tp = out
    return tn, fp, fn, tp


def share_intervals(y: np.ndarray, pred: np.ndarray, w: np.ndarray | None = None) -> dict[str, tuple[float, float]]:
    """Wilson 95% intervals of accuracy, precision, recall, FPR and FNR; with weights, of the weighted share
    over the Kish effective sample size (sum w)^2 / sum w^2."""
    weights = np.ones(len(y)) if w is None else w
    sets = {
        "accuracy": (np.ones(len(y), dtype=bool), y == pred),
        "precision": (pred == 1, y == 1),
        "recall": (y == 1, pred == 1),
        "fpr": (y == 0, pred == 1),
        "fnr": (y == 1, pred == 0),
    }
    out = {}
    for name, (among, hit) in sets.items():
        total, squares = weights[among].sum(), (weights[among] ** 2).sum()
        n = total**2 / squares if squares else 0.0
        share = weights[among & hit].sum() / total if total else 0.0
        low, high = wilson(share * n, round(n)) if round(n) else (None, None)
        out[name] = (np.nan if low is None else low, np.nan if high is None else high)
    return out


def annotator_agreement(annotators: Sequence[Sequence[int | None]], labels: Sequence[int | None]) -> dict[str, Any]:
    """Inter-annotator agreement, the ceiling a judge can reach: Fleiss' kappa (statsmodels) over items every
    annotator labelled, and each annotator's agreement with the majority label."""
    from statsmodels.stats.inter_rater import aggregate_raters, fleiss_kappa

    full = np.array([a for a in annotators if all(v is not None for v in a)], dtype=int)
    result: dict[str, Any] = {"n_items": len(full), "n_annotators": full.shape[1] if len(full) else 0}
    if len(full):
        table, _ = aggregate_raters(full, n_cat=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result["fleiss_kappa"] = float(fleiss_kappa(table, method="fleiss"))
    each = []
    for k in range(len(annotators[0]) if annotators else 0):
        pairs = [(a[k], g) for a, g in zip(annotators, labels) if a[k] is not None and g is not None]
        each.append(float(np.mean([a == g for a, g in pairs])) if pairs else None)
    result["agreement_with_majority"] = each
    return result


def pairwise_kappa(predictions: dict[str, np.ndarray]) -> dict[str, dict[str, float | None]]:
    """Cohen's kappa between every two judges, on the items both decided."""
    from sklearn.metrics import cohen_kappa_score

    table: dict[str, dict[str, float | None]] = {}
    for a, pa in predictions.items():
        table[a] = {}
        for b, pb in predictions.items():
            both = (pa >= 0) & (pb >= 0)
            if not both.any() or len(set(pa[both]) | set(pb[both])) < 2:
                table[a][b] = None
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                table[a][b] = float(cohen_kappa_score(pa[both], pb[both]))
    return table
