"""Evaluation items: conversations of 1..N user turns, optionally with recorded assistant turns.

A user turn directly followed by an assistant message is *pre-filled* (replayed, not generated); every
other user turn is answered by the target. Items come from a JSONL file with a column mapping
(`prompt` or `messages`, plus optional id/category/source/attack_method/benign) or from a HarmMetric
Eval file (one item per prompt, keeping its references).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core.errors import DataError
from diagsafe_local.core.messages import Message
from diagsafe_local.core.tables import table_rows
from diagsafe_local.evaluation.config import DatasetConfig


class Item(BaseModel):
    """One conversation to evaluate."""

    model_config = ConfigDict(frozen=True)

    id: str
    messages: tuple[Message, ...]
    category: str = ""
    source: str = ""
    attack_method: str = ""
    benign: bool = False
    references: tuple[str, ...] = ()

    @property
    def user_positions(self) -> list[int]:
        """Indices in `messages` of the user turns, in order (turn k is user_positions[k-1])."""
        return [i for i, m in enumerate(self.messages) if m.role == "user"]

    @property
    def n_turns(self) -> int:
        return len(self.user_positions)

    def prefilled(self, turn: int) -> str | None:
        """The recorded answer of 1-based `turn`, or None if the target must generate it."""
        pos = self.user_positions[turn - 1]
        if pos + 1 < len(self.messages) and self.messages[pos + 1].role == "assistant":
            return self.messages[pos + 1].content
        return None


def _validate_messages(path: str, line: int, field: str, raw: Any) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise DataError(path, line, field, "must be a non-empty list of {role, content} objects")
    messages = []
    for k, m in enumerate(raw):
        if (
            not isinstance(m, dict)
            or m.get("role") not in ("system", "user", "assistant")
            or not isinstance(m.get("content"), str)
        ):
            raise DataError(path, line, f"{field}[{k}]", "must be {role: system|user|assistant, content: string}")
        messages.append(Message(role=m["role"], content=m["content"]))
    roles = [m.role for m in messages]
    if "system" in roles[1:]:
        raise DataError(path, line, field, "a system message may only come first")
    body = roles[1:] if roles[0] == "system" else roles
    if not body or body[0] != "user":
        raise DataError(
            path, line, field, "the conversation must start with a user message (after an optional system message)"
        )
    for k in range(1, len(body)):
        if body[k] == "assistant" and body[k - 1] != "user":
            raise DataError(path, line, field, "an assistant message must follow a user message")
    if body[-1] != "user":
        raise DataError(path, line, field, "must end with a user message (the turn the target answers)")
    return tuple(messages)


def _text_field(path: str, line: int, row: dict[str, Any], field: str) -> str:
    value = row.get(field, "")
    if value is None:
        return ""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise DataError(path, line, field, f"must be a string, got {type(value).__name__}")
    return str(value)


def load_items(config: DatasetConfig, resolved_path: Path) -> list[Item]:
    """Items of the configured dataset, validated row by row (ids unique)."""
    fmt = config.format
    if fmt == "auto":
        fmt = "harmmetric" if _looks_like_harmmetric(resolved_path) else "items"
    items = harmmetric_items(resolved_path) if fmt == "harmmetric" else _jsonl_items(config, resolved_path)
    if not items:
        raise DataError(resolved_path, None, None, "no items")
    return items


def _looks_like_harmmetric(path: Path) -> bool:
    with open(path, encoding="utf-8", errors="replace") as handle:
        head = handle.read(4096)
    return '"response_category"' in head or '"ref_res_0"' in head


def harmmetric_items(path: Path) -> list[Item]:
    from diagsafe_local.benchmark.dataset import load_dataset

    return [
        Item(
            id=p.prompt_id, messages=(Message(role="user", content=p.prompt),), source=p.source, references=p.references
        )
        for p in load_dataset(path).prompts
    ]


def _references(path: Path, line: int, row: dict[str, Any], field: str) -> tuple[str, ...]:
    """An item's reference answers: one text, or a list of texts (JSONL)."""
    value = row.get(field)
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise DataError(path, line, field, "must be a text or a list of texts")
        return tuple(v for v in value if v.strip())
    text = _text_field(str(path), line, row, field)
    return (text,) if text else ()


def _flag(path: Path, line: int, row: dict[str, Any], field: str) -> bool:
    value = row.get(field, False)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise DataError(path, line, field, f"must be true or false, got {value!r}")
    return value


def _near_misses(path: Path, number: int, row: dict[str, Any], known: list[str]) -> None:
    """A field the item reader does not read whose name is one slip from a field it does (`references` for
    `reference`) is an error with the hint, not a silently missing value; other extra fields are kept out."""
    for name in row:
        if name in known:
            continue
        close = [k for k in difflib.get_close_matches(name, known, n=1, cutoff=0.8) if k not in row]
        if close:
            raise DataError(
                path,
                number,
                name,
                f"not a field items have: did you mean '{close[0]}'? (or map your column with dataset.columns)",
            )


def _jsonl_items(config: DatasetConfig, path: Path) -> list[Item]:
    """Items of a user's JSONL/CSV/Parquet file through the configured column mapping."""
    cols = config.columns
    items: list[Item] = []
    seen: dict[str, int] = {}
    known = list(cols.model_dump().values())
    for number, row in table_rows(path):
        _near_misses(path, number, row, known)
        messages_value = row.get(cols.messages)
        if isinstance(messages_value, str):  # a CSV cell holding the messages as JSON
            try:
                messages_value = json.loads(messages_value)
            except json.JSONDecodeError as exc:
                raise DataError(path, number, cols.messages, f"not a JSON list of messages ({exc.msg})") from None
        if messages_value is not None:
            messages = _validate_messages(str(path), number, cols.messages, messages_value)
        elif cols.prompt in row and row[cols.prompt] is not None:
            prompt = row[cols.prompt]
            if not isinstance(prompt, str) or not prompt.strip():
                raise DataError(path, number, cols.prompt, "must be a non-empty string")
            messages = (Message(role="user", content=prompt),)
        else:
            raise DataError(path, number, cols.prompt, f"missing (give '{cols.prompt}' or '{cols.messages}')")
        item_id = _text_field(str(path), number, row, cols.id) or str(number)
        if item_id in seen:
            raise DataError(path, number, cols.id, f"duplicate id '{item_id}' (first on line {seen[item_id]})")
        seen[item_id] = number
        benign = _flag(path, number, row, cols.benign)
        expected = row.get(cols.expected)
        if expected is not None:
            if expected not in ("comply", "refuse"):
                raise DataError(path, number, cols.expected, f"must be 'comply' or 'refuse', got {expected!r}")
            benign = expected == "comply"
        references = _references(path, number, row, cols.reference)
        items.append(
            Item(
                id=item_id,
                messages=messages,
                category=_text_field(str(path), number, row, cols.category),
                source=_text_field(str(path), number, row, cols.source),
                attack_method=_text_field(str(path), number, row, cols.attack_method),
                benign=benign,
                references=references,
            )
        )
    return items
