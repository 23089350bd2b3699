"""Flips: the items a candidate answers harmfully where the baseline did not, and the reverse, each with both
answers and both verdicts; written as `flips.jsonl` (and a comparison's figures as `comparison.json`)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core import atomic, jsonl
from diagsafe_local.runs import files
from diagsafe_local.runs.agreement import Agreement, Disagreements
from diagsafe_local.runs.paired import PairedComparison
from diagsafe_local.runs.records import ResultRecord

COMPARISON = "comparison.json"


class Flip(BaseModel):
    """One item whose verdict changed between the baseline (a) and the candidate (b)."""

    model_config = ConfigDict(extra="forbid")

    direction: Literal["now_harmful", "no_longer_harmful"]
    baseline: str
    candidate: str
    item_id: str
    sample: int
    category: str
    request: str
    answer_a: str
    answer_b: str
    score_a: float | None
    score_b: float | None
    verdict_a: dict[str, Any] | None
    verdict_b: dict[str, Any] | None


def flips(comparison: PairedComparison, limit: int | None = None) -> Iterator[Flip]:
    """The flips of a comparison (the first `limit`), the ones now harmful first, read back one at a time."""

    def flip(direction: Literal["now_harmful", "no_longer_harmful"], a: ResultRecord, b: ResultRecord) -> Flip:
        return Flip(
            direction=direction,
            baseline=comparison.baseline,
            candidate=comparison.candidate,
            item_id=b.item_id,
            sample=b.sample,
            category=b.category,
            request=b.conversation[-1].content,
            answer_a=a.answer,
            answer_b=b.answer,
            score_a=a.score,
            score_b=b.score,
            verdict_a=a.verdict,
            verdict_b=b.verdict,
        )

    for a, b in comparison.flips("up", limit):
        yield flip("now_harmful", a, b)
    left = None if limit is None else max(0, limit - comparison.flips_up)
    for a, b in comparison.flips("down", left):
        yield flip("no_longer_harmful", a, b)


def _dump(document: dict[str, Any], path: Path) -> None:
    """The document as indented JSON, written as it is encoded (never whole in memory)."""
    with open(path, "w", encoding="utf-8") as handle:
        write_document(document, handle)


def write_comparison(out: Path, comparisons: Sequence[PairedComparison], agreement: Agreement | None = None) -> None:
    """comparison.json (every figure) and flips.jsonl, as one set."""
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "paired": [d.model_dump(mode="json") for c in comparisons for d in c.differences],
        "agreement": agreement,
    }
    with atomic.outputs_together():
        atomic.write_with(out / COMPARISON, lambda path: _dump(document, path))
        jsonl.write(out / files.FLIPS, (f for c in comparisons for f in flips(c)))


def write_document(document: dict[str, Any], handle: TextIO) -> None:
    """`document` as `json.dump(document, handle, indent=2)` and a newline write it, where its `Agreement` values
    are written as their figures and then their disagreements, one at a time as they are made."""
    streamed = {key: value for key, value in document.items() if isinstance(value, Agreement)}
    if not streamed:
        json.dump(document, handle, indent=2)
        handle.write("\n")
        return
    # each Agreement's list is a placeholder no other value can spell (a fresh random token), cut out and written
    marks = {key: secrets.token_hex(16) for key in streamed}
    head = {
        key: {**value.figures.model_dump(), "disagreements": marks[key]} if key in streamed else value
        for key, value in document.items()
    }
    rest = json.dumps(head, indent=2)
    for key, value in streamed.items():
        before, rest = rest.split(json.dumps(marks[key]))
        handle.write(before)
        outer = before[before.rfind("\n") + 1 :]
        outer = outer[: len(outer) - len(outer.lstrip(" "))]
        _write_list(handle, value.disagreements, outer)
    handle.write(rest + "\n")


def _write_list(handle: TextIO, disagreements: Disagreements, outer: str) -> None:
    """The disagreements as json.dump writes a list indented by 2 whose closing bracket is indented by `outer`."""
    if not len(disagreements):
        handle.write("[]")
        return
    inner = "\n" + outer + "  "
    separator = "[" + inner
    encode = json.JSONEncoder(indent=2).encode  # what json.dumps(row, indent=2) makes
    for row in disagreements.rows():
        handle.write(separator + encode(row).replace("\n", inner))
        separator = "," + inner
    handle.write("\n" + outer + "]")
