"""HarmClassifier training data: labelled (prompt, response) pairs, a split by prompt, and the training set
with hard human labels for some pairs and soft reference-metric labels for the rest.

Pairs come from a HarmMetric-layout benchmark (harmful categories are the Yes class), from a labelled
JSONL file: `prompt`, `response`, `label` (0/1, the human judgment), optional `references` (a list of
harmful reference answers, needed for a soft label) and `prompt_id` (default: the prompt text), or from the
authors' released training labels (`train_data.jsonl`: `prompt`, `response`, `expected_answer` Yes/No and
`label`, the soft label itself), which train as they are: every pair the authors' `train_codes/train.py` trains
on, with its own label. A released row we would not have written (an empty response: line 38 of the release)
is counted and named in a warning (`quirk_lines`), never refused.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from diagsafe_local.benchmark.dataset import HARMFUL, BenchDataset, load_dataset
from diagsafe_local.benchmark.runner import aggregate_references
from diagsafe_local.classifier.config import SoftLabelConfig
from diagsafe_local.core.errors import DataError
from diagsafe_local.core.jsonl import json_rows
from diagsafe_local.metrics import METRICS, TextPair, compute_metrics


class LabelledPair(BaseModel):
    """A response to a prompt with its human class; `category` is set for HarmMetric pairs."""

    model_config = ConfigDict(frozen=True)

    prompt_id: str
    prompt: str
    response: str
    harmful: bool
    references: tuple[str, ...] = ()
    response_id: str = ""
    category: int | None = None
    label: float | None = None  # its own training label (the released file's soft label)
    quirks: tuple[str, ...] = ()  # the names of the RELEASED_QUIRKS it has


class TrainingExample(BaseModel):
    """One training pair with its target P(Yes)."""

    model_config = ConfigDict(frozen=True)

    pair: LabelledPair
    label: float
    kind: Literal["hard", "soft"]
    metric_value: float | None = None


def load_pairs(path: str | Path) -> tuple[list[LabelledPair], BenchDataset | None]:
    """Pairs of a HarmMetric-layout file (and the dataset itself), or of a labelled JSONL file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, None, None, "no such file")
    first = next(json_rows(path), None)
    if first is None:
        raise DataError(path, None, None, "the file holds no records")
    if "label" not in first[1]:
        dataset = load_dataset(path)
        pairs = [
            LabelledPair(
                prompt_id=p.prompt_id,
                prompt=p.prompt,
                response=r.text,
                harmful=r.category in HARMFUL,
                references=p.references,
                response_id=r.response_id,
                category=int(r.category),
            )
            for p in dataset.prompts
            for r in p.responses
        ]
        return pairs, dataset
    return [_labelled_row(path, line, row) for line, row in json_rows(path)], None


def _labelled_row(path: Path, line: int, row: dict) -> LabelledPair:
    if "expected_answer" in row:
        return _released_row(path, line, row)
    for field in ("prompt", "response"):
        if not isinstance(row.get(field), str) or not row[field].strip():
            raise DataError(path, line, field, "must be a non-empty string")
    if row.get("label") not in (0, 1, True, False):
        raise DataError(path, line, "label", f"must be 0 or 1, got {row.get('label')!r}")
    refs = row.get("references", [])
    if not isinstance(refs, list) or not all(isinstance(r, str) and r.strip() for r in refs):
        raise DataError(path, line, "references", "must be a list of non-empty strings")
    prompt_id = str(row.get("prompt_id") or hashlib.sha256(row["prompt"].encode()).hexdigest()[:12])
    return LabelledPair(
        prompt_id=prompt_id,
        prompt=row["prompt"],
        response=row["response"],
        harmful=bool(row["label"]),
        references=tuple(refs),
        response_id=f"{path.name}:{line}",
    )


@dataclass(frozen=True)
class Quirk:
    """Something a released row may have that we would not write, and how it trains."""

    name: str
    trains: str
    present: Callable[[dict[str, Any]], bool]


def _contradicts(row: dict[str, Any]) -> bool:
    return row["expected_answer"] in ("Yes", "No") and (row["label"] > 0.5) != (row["expected_answer"] == "Yes")


# How each trains is how the authors' train.py trains it: it formats any text into its prompt, reads every
# expected_answer but "Yes" as No, and its loss reads the label only.
RELEASED_QUIRKS = (
    Quirk("an empty prompt", "trained on as it is", lambda row: not row["prompt"].strip()),
    Quirk("an empty response", "trained on as it is", lambda row: not row["response"].strip()),
    Quirk(
        "an expected_answer neither 'Yes' nor 'No'",
        "trained on its label",
        lambda row: row["expected_answer"] not in ("Yes", "No"),
    ),
    Quirk("a label that contradicts its expected_answer", "trained on its label", _contradicts),
    Quirk("a label written as true or false", "trained on as 1 or 0", lambda row: isinstance(row["label"], bool)),
)


def _released_row(path: Path, line: int, row: dict) -> LabelledPair:
    """A row of the authors' train_data.jsonl: text, and a label the soft-label cross-entropy can train on (a
    number in [0, 1]: the authors' train.py cannot take text, and outside [0, 1] the loss has no minimum)."""
    for field in ("prompt", "response"):
        if not isinstance(row.get(field), str):
            raise DataError(path, line, field, f"must be a string, got {row.get(field)!r}")
    answer, label = row["expected_answer"], row.get("label")
    if not isinstance(label, (int, float)) or not 0.0 <= label <= 1.0:
        raise DataError(path, line, "label", f"must be a number in [0, 1] (the soft label), got {label!r}")
    return LabelledPair(
        prompt_id=hashlib.sha256(row["prompt"].encode()).hexdigest()[:12],
        prompt=row["prompt"],
        response=row["response"],
        harmful=answer == "Yes",
        response_id=f"{path.name}:{line}",
        label=float(label),
        quirks=tuple(quirk.name for quirk in RELEASED_QUIRKS if quirk.present(row)),
    )


def quirk_lines(pairs: Sequence[LabelledPair]) -> list[str]:
    """One line per quirk the released rows have: how many rows, which lines (the first five), how they train."""
    out = []
    for quirk in RELEASED_QUIRKS:
        where = [p.response_id.rsplit(":", 1) for p in pairs if quirk.name in p.quirks]  # (file name, line)
        if where:
            many = "s" if len(where) > 1 else ""
            lines = ", ".join(line for _, line in where[:5]) + (", ..." if len(where) > 5 else "")
            out.append(
                f"{len(where)} row{many} with {quirk.name} ({where[0][0]} line{many} {lines}): {quirk.trains}, "
                "as the authors' train.py does"
            )
    return out


def released(pairs: Sequence[LabelledPair]) -> bool:
    """Whether the pairs carry their own training labels (the authors' released file): they train as they are."""
    return bool(pairs) and all(p.label is not None for p in pairs)


def split_prompts(prompt_ids: Sequence[str], held_out: float, seed: int) -> tuple[set[str], set[str]]:
    """(training prompts, held-out prompts): a seeded split of the distinct prompt ids, both non-empty."""
    ids = sorted(set(prompt_ids))
    if len(ids) < 2:
        raise ValueError("a train/held-out split needs at least two distinct prompts")
    random.Random(seed).shuffle(ids)
    n_held = min(len(ids) - 1, max(1, round(held_out * len(ids))))
    return set(ids[n_held:]), set(ids[:n_held])


def soft_label(value: float, harmful: bool, mapping: SoftLabelConfig) -> float:
    """clip(sigmoid(scale * (value - center)), the class's band)."""
    raw = 1.0 / (1.0 + math.exp(-mapping.scale * (value - mapping.center)))
    low, high = mapping.yes_band if harmful else mapping.no_band
    return min(high, max(low, raw))


def metric_values(pairs: Sequence[LabelledPair], metric: str) -> np.ndarray:
    """The reference metric of each pair (mean over its references); NaN where a pair has none."""
    if not METRICS.get(metric).needs_reference:
        return compute_metrics([metric], [TextPair(p.prompt, p.response) for p in pairs])[metric]
    expanded = [(k, TextPair(p.prompt, p.response, ref)) for k, p in enumerate(pairs) for ref in p.references]
    if not expanded:
        return np.full(len(pairs), np.nan)
    raw = compute_metrics([metric], [t for _, t in expanded])[metric]
    owner = np.array([k for k, _ in expanded])
    return aggregate_references(raw, owner, np.zeros(len(pairs), dtype=bool), len(pairs))


def build_training_set(
    pairs: Sequence[LabelledPair],
    mapping: SoftLabelConfig,
    examples: int | None,
    hard_labels: int,
    seed: int,
) -> list[TrainingExample]:
    """Draw `examples` pairs (half of each class where possible), give `hard_labels` of them their human
    0/1 label and the rest a soft label from the reference metric (pairs it cannot grade stay hard). Released
    pairs keep their own labels, every one of them."""
    if released(pairs):
        return [
            TrainingExample(pair=p, label=p.label or 0.0, kind="hard" if p.label in (0.0, 1.0) else "soft")
            for p in pairs
        ]
    rng = random.Random(seed)
    by_class = {c: [p for p in pairs if p.harmful is c] for c in (True, False)}
    for group in by_class.values():
        rng.shuffle(group)
    if examples is None:
        chosen = by_class[True] + by_class[False]
    else:
        yes = min(len(by_class[True]), max(examples // 2, examples - len(by_class[False])))
        chosen = by_class[True][:yes] + by_class[False][: examples - yes]
    rng.shuffle(chosen)
    values = metric_values(chosen, mapping.metric)
    hard = set(rng.sample(range(len(chosen)), min(hard_labels, len(chosen))))
    out = []
    for k, (pair, value) in enumerate(zip(chosen, values)):
        if k in hard or math.isnan(value):
            out.append(
                TrainingExample(
                    pair=pair,
                    label=float(pair.harmful),
                    kind="hard",
                    metric_value=None if math.isnan(value) else float(value),
                )
            )
        else:
            out.append(
                TrainingExample(
                    pair=pair,
                    label=soft_label(float(value), pair.harmful, mapping),
                    kind="soft",
                    metric_value=float(value),
                )
            )
    return out
