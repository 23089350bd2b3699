"""HarmMetric Eval data: both published layouts, validated row by row.

Current (long) layout, as published: one JSON object per line and per response, with `harmful_prompt`,
`response`, `response_category` (text, e.g. "harmful response"), `attack_method`, `source`, `prompt_id`
and `response_id` (integers; = prompt_id * 100 + k). The slot k = response_id % 100 (0-12) tells the
four harmful and the three irrelevant answers apart:

    reference response 0 | harmful response 1-4 | safe response/refusal 5 | safe response/prevention 6 |
    safe response/redirection 7 | irrelevant response 8-10 | useless response/prompt repetition 11 |
    useless response/useless affirmation 12

Numeric categories 0-12 (equal to the slot) are accepted too, and ids may be integers or digit strings.
Every prompt must hold each slot exactly once, and a category must agree with its slot.

Earlier (wide) layout: one JSON object per prompt with `harmful_prompt`, `ref_res_0`, `ref_res_1`,
`harmful_res_0..3`, `irr_res_0..2`, `refusal`, `prevention`, `redirection`, `useless_aff` (and `id`);
the prompt text itself is the prompt-repetition response.

Either layout may override a prompt's reference set: `references` (a list of strings, on the
reference row or the wide row) and `reference_agg` (`mean` or `max`) for how reference-based
metrics combine them. The earlier layout's published figures use the mean of its two references.
"""

from __future__ import annotations

import hashlib
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core.errors import DataError
from diagsafe_local.core.jsonl import json_rows

ReferenceAgg = Literal["mean", "max"]


class Category(IntEnum):
    """Response categories of HarmMetric Eval (the ids of the current layout)."""

    REFERENCE = 0
    HARMFUL_1 = 1
    HARMFUL_2 = 2
    HARMFUL_3 = 3
    HARMFUL_4 = 4
    REFUSAL = 5
    PREVENTION = 6
    REDIRECTION = 7
    IRRELEVANT_1 = 8
    IRRELEVANT_2 = 9
    IRRELEVANT_3 = 10
    PROMPT_REPETITION = 11
    USELESS_AFFIRMATION = 12


SCORED_CATEGORIES: tuple[Category, ...] = tuple(Category)[1:]
HARMFUL = (Category.HARMFUL_1, Category.HARMFUL_2, Category.HARMFUL_3, Category.HARMFUL_4)
SAFE = (Category.REFUSAL, Category.PREVENTION, Category.REDIRECTION)
IRRELEVANT = (Category.IRRELEVANT_1, Category.IRRELEVANT_2, Category.IRRELEVANT_3)
USELESS = (Category.PROMPT_REPETITION, Category.USELESS_AFFIRMATION)


def category_name(category: int) -> str:
    """Lower-case name of a category id, e.g. 12 -> 'useless_affirmation'."""
    return Category(category).name.lower()


# The published file's category strings and the slots (response_id % 100) each may take.
PUBLISHED_CATEGORIES: dict[str, tuple[Category, ...]] = {
    "reference response": (Category.REFERENCE,),
    "harmful response": (Category.HARMFUL_1, Category.HARMFUL_2, Category.HARMFUL_3, Category.HARMFUL_4),
    "safe response/refusal": (Category.REFUSAL,),
    "safe response/prevention": (Category.PREVENTION,),
    "safe response/redirection": (Category.REDIRECTION,),
    "irrelevant response": (Category.IRRELEVANT_1, Category.IRRELEVANT_2, Category.IRRELEVANT_3),
    "useless response/prompt repetition": (Category.PROMPT_REPETITION,),
    "useless response/useless affirmation": (Category.USELESS_AFFIRMATION,),
}


def published_category(category: Category) -> str:
    """The published file's text for a slot, e.g. 5 -> 'safe response/refusal'."""
    return next(text for text, slots in PUBLISHED_CATEGORIES.items() if category in slots)


class BenchResponse(BaseModel):
    """One scored response of the benchmark."""

    model_config = ConfigDict(frozen=True)

    response_id: str
    category: Category
    text: str
    attack_method: str = ""


class BenchPrompt(BaseModel):
    """A harmful prompt, its reference answer(s) and its 12 scored responses (categories 1-12, in order)."""

    model_config = ConfigDict(frozen=True)

    prompt_id: str
    prompt: str
    source: str = ""
    references: tuple[str, ...]
    reference_agg: ReferenceAgg | None = None
    responses: tuple[BenchResponse, ...]


class BenchDataset(BaseModel):
    """A loaded, validated benchmark file."""

    model_config = ConfigDict(frozen=True)

    path: str
    layout: Literal["current", "v1"]
    sha256: str
    prompts: tuple[BenchPrompt, ...]

    @property
    def n_responses(self) -> int:
        return sum(len(p.responses) for p in self.prompts)


WIDE_FIELDS: dict[str, Category] = {
    "harmful_res_0": Category.HARMFUL_1,
    "harmful_res_1": Category.HARMFUL_2,
    "harmful_res_2": Category.HARMFUL_3,
    "harmful_res_3": Category.HARMFUL_4,
    "refusal": Category.REFUSAL,
    "prevention": Category.PREVENTION,
    "redirection": Category.REDIRECTION,
    "irr_res_0": Category.IRRELEVANT_1,
    "irr_res_1": Category.IRRELEVANT_2,
    "irr_res_2": Category.IRRELEVANT_3,
    "useless_aff": Category.USELESS_AFFIRMATION,
}
WIDE_REFERENCE_FIELDS = ("ref_res_0", "ref_res_1")


def load_dataset(path: str | Path) -> BenchDataset:
    """Load a benchmark file in either layout (auto-detected); raise DataError naming file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise DataError(path, None, None, "no such file")
    raw = path.read_bytes()
    rows = list(json_rows(path, raw))
    if not rows:
        raise DataError(path, None, None, "the file holds no records")
    first_line, first = rows[0]
    if "response_category" in first:
        layout, prompts = "current", _parse_current(path, rows)
    elif "ref_res_0" in first or "harmful_res_0" in first:
        layout, prompts = "v1", _parse_wide(path, rows)
    else:
        raise DataError(
            path,
            first_line,
            None,
            "unknown layout: expected 'response_category' (current layout) or 'ref_res_0' (earlier layout)",
        )
    return BenchDataset(path=str(path), layout=layout, sha256=hashlib.sha256(raw).hexdigest(), prompts=prompts)


def _text(path: Path, line: int, row: dict[str, Any], field: str, *, required: bool = True) -> str:
    if field not in row or row[field] is None:
        if required:
            raise DataError(path, line, field, "missing")
        return ""
    value = row[field]
    if not isinstance(value, str):
        raise DataError(path, line, field, f"must be a string, got {type(value).__name__}")
    return value


def _id(path: Path, line: int, row: dict[str, Any], field: str) -> int:
    if field not in row or row[field] is None:
        raise DataError(path, line, field, "missing")
    value = row[field]
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise DataError(path, line, field, f"must be a non-negative integer (or its string), got {value!r}")
    return int(value)


def _reference_override(
    path: Path, line: int, row: dict[str, Any]
) -> tuple[tuple[str, ...] | None, ReferenceAgg | None]:
    refs = row.get("references")
    if refs is not None:
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
            raise DataError(path, line, "references", "must be a non-empty list of non-empty strings")
        refs = tuple(refs)
    agg = row.get("reference_agg")
    if agg is not None and agg not in ("mean", "max"):
        raise DataError(path, line, "reference_agg", f"must be 'mean' or 'max', got {agg!r}")
    return refs, agg


def _slot(path: Path, line: int, row: dict[str, Any]) -> tuple[int, Category]:
    """(prompt id, slot) of a current-layout row, its category checked against the slot."""
    if "response_category" not in row:
        raise DataError(path, line, "response_category", "missing (the file's first record uses the current layout)")
    prompt_id = _id(path, line, row, "prompt_id")
    response_id = _id(path, line, row, "response_id")
    k = response_id - prompt_id * 100
    if not 0 <= k <= Category.USELESS_AFFIRMATION:
        raise DataError(
            path,
            line,
            "response_id",
            f"must be prompt_id*100 + a slot 0-12 ({prompt_id * 100}-{prompt_id * 100 + 12}), got {row['response_id']!r}",
        )
    slot = Category(k)
    raw = row["response_category"]
    if isinstance(raw, str) and raw.strip() in PUBLISHED_CATEGORIES:
        if slot not in PUBLISHED_CATEGORIES[raw.strip()]:
            raise DataError(
                path,
                line,
                "response_category",
                f"{raw!r} disagrees with response_id {row['response_id']!r}: slot {k} is {published_category(slot)!r}",
            )
        return prompt_id, slot
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or not str(raw).strip().isdigit():
        known = ", ".join(repr(t) for t in PUBLISHED_CATEGORIES)
        raise DataError(path, line, "response_category", f"must be one of {known} or a category id 0-12, got {raw!r}")
    if int(raw) > Category.USELESS_AFFIRMATION:
        raise DataError(path, line, "response_category", f"must be a category id 0-12, got {raw!r}")
    if int(raw) != k:
        raise DataError(
            path,
            line,
            "response_id",
            f"must be prompt_id*100 + response_category = {prompt_id * 100 + int(raw)}, got {row['response_id']!r}",
        )
    return prompt_id, slot


def _parse_current(path: Path, rows: list[tuple[int, dict[str, Any]]]) -> tuple[BenchPrompt, ...]:
    groups: dict[int, dict[int, tuple[int, dict[str, Any]]]] = {}
    first_line: dict[int, int] = {}
    for line, row in rows:
        prompt_id, category = _slot(path, line, row)
        for field in ("harmful_prompt", "response"):
            _text(path, line, row, field)
        for field in ("attack_method", "source"):
            _text(path, line, row, field, required=False)
        group = groups.setdefault(prompt_id, {})
        first_line.setdefault(prompt_id, line)
        if category in group:
            raise DataError(
                path,
                line,
                "response_id",
                f"prompt {prompt_id} already has slot {int(category)} ({category_name(category)}) on line {group[category][0]}",
            )
        if group and row["harmful_prompt"] != next(iter(group.values()))[1]["harmful_prompt"]:
            raise DataError(path, line, "harmful_prompt", f"differs from the other rows of prompt {prompt_id}")
        group[category] = (line, row)

    prompts = []
    for prompt_id, group in groups.items():
        missing = [c for c in Category if c not in group]
        if missing:
            names = ", ".join(f"{c.value} ({c.name.lower()})" for c in missing)
            what = "its reference response (slot 0)" if missing == [Category.REFERENCE] else f"slots {names}"
            raise DataError(path, first_line[prompt_id], "response_category", f"prompt {prompt_id} lacks {what}")
        ref_line, ref_row = group[Category.REFERENCE]
        refs, agg = _reference_override(path, ref_line, ref_row)
        any_row = ref_row
        prompts.append(
            BenchPrompt(
                prompt_id=str(prompt_id),
                prompt=any_row["harmful_prompt"],
                source=any_row.get("source") or "",
                references=refs or (ref_row["response"],),
                reference_agg=agg,
                responses=tuple(
                    BenchResponse(
                        response_id=str(group[c][1]["response_id"]),
                        category=c,
                        text=group[c][1]["response"],
                        attack_method=group[c][1].get("attack_method") or "",
                    )
                    for c in SCORED_CATEGORIES
                ),
            )
        )
    return tuple(prompts)


def _parse_wide(path: Path, rows: list[tuple[int, dict[str, Any]]]) -> tuple[BenchPrompt, ...]:
    prompts = []
    seen: dict[str, int] = {}
    for index, (line, row) in enumerate(rows):
        prompt = _text(path, line, row, "harmful_prompt")
        prompt_id = str(_id(path, line, row, "id")) if "id" in row else str(index)
        if prompt_id in seen:
            raise DataError(path, line, "id", f"duplicate id {prompt_id} (first on line {seen[prompt_id]})")
        seen[prompt_id] = line
        refs, agg = _reference_override(path, line, row)
        if refs is None:
            refs = tuple(_text(path, line, row, field) for field in WIDE_REFERENCE_FIELDS)
        texts = {category: _text(path, line, row, field) for field, category in WIDE_FIELDS.items()}
        texts[Category.PROMPT_REPETITION] = prompt
        prompts.append(
            BenchPrompt(
                prompt_id=prompt_id,
                prompt=prompt,
                references=refs,
                reference_agg=agg,
                responses=tuple(
                    BenchResponse(response_id=f"{prompt_id}:{c.value}", category=c, text=texts[c])
                    for c in SCORED_CATEGORIES
                ),
            )
        )
    return tuple(prompts)
