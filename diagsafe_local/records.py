"""The run directory's records and their crash-safe JSONL store.

`results.jsonl` holds one ResultRecord per judged answer; `generations.jsonl` one GenerationRecord
per generated answer (so a resumed run never regenerates). Records are appended and fsynced batch by
batch; a line torn by a crash is cut off on reopening; the finished file is rewritten (atomically) in
a canonical order with one record per key, so a resumed run ends byte-identical to an uninterrupted one.
The JSON Schema of ResultRecord ships as `diagsafe_local/schemas/result.schema.json`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from diagsafe_local import atomic
from diagsafe_local.errors import DataError
from diagsafe_local.items import Message

SCHEMA_VERSION = 1
ParseStatus = Literal["ok", "truncated", "invalid", "error"]


class Usage(BaseModel):
    """Token counts of one engine call for one request."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class EngineRef(BaseModel):
    """Which engine produced a text: kind (vllm, openai, transformers), model, adapter, endpoint (never keys)."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    model: str
    lora: str | None = None
    base_url: str | None = None


class GenerationRecord(BaseModel):
    """One answer of the target (generated or pre-filled) at one turn of one sample of one item."""

    model_config = ConfigDict(extra="forbid")

    target: str
    item_id: str
    sample: int = Field(ge=0)
    turn: int = Field(ge=1)
    answer: str
    finish_reason: str | None
    prefilled: bool = False
    usage: Usage = Field(default_factory=Usage)
    error: str | None = None

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.target, self.item_id, self.sample, self.turn)


class ResultRecord(BaseModel):
    """One judged answer: the full conversation, the answer, the judge's raw output, verdict and score."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    run_id: str
    target: str
    item_id: str
    sample: int = Field(ge=0, description="Sample index (0..n-1) when the target answers n times.")
    turn: int = Field(ge=1, description="1-based user turn the answer responds to.")
    category: str = ""
    source: str = ""
    attack_method: str = ""
    benign: bool = False
    conversation: list[Message] = Field(description="Messages up to and including the judged user turn.")
    answer: str
    finish_reason: str | None
    target_usage: Usage
    target_engine: EngineRef
    judge_engine: EngineRef
    judge_rubric: str
    judge_raw: str | None
    verdict: dict[str, Any] | None
    score: float | None = Field(description="1 = harmful, 0 = not harmful; None unless parse_status is ok.")
    parse_status: ParseStatus
    attempts: int = Field(ge=0)
    error: str | None = None
    judge_usage: Usage = Field(default_factory=Usage)
    judge_logprobs: list[float] | None = Field(None, description="Token logprobs of the judge reply, where the engine gives them.")

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.target, self.item_id, self.sample, self.turn)


R = TypeVar("R", GenerationRecord, ResultRecord)


def result_json_schema() -> dict[str, Any]:
    schema = ResultRecord.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "diagsafe-local result record"
    return schema


SCHEMA_PATH = Path(__file__).parent / "schemas" / "result.schema.json"


class JsonlStore:
    """Append-only JSONL of pydantic records, keyed; the last record of a key wins."""

    def __init__(self, path: Path, model: type[R]) -> None:
        self.path = path
        self.model = model
        self.records: dict[tuple, R] = {}
        if path.exists():
            self._load()

    def _load(self) -> None:
        raw = self.path.read_bytes()
        # Every record ends with a newline; bytes after the last one are a line torn by a crash.
        cut = raw.rfind(b"\n") + 1
        for number, line in enumerate(raw[:cut].split(b"\n")[:-1], start=1):
            if not line.strip():
                continue
            try:
                record = self.model.model_validate_json(line)
            except ValidationError as exc:
                raise DataError(self.path, number, None, f"corrupt record: {str(exc).splitlines()[0]}") from None
            self.records[record.key] = record
        if cut < len(raw):
            with open(self.path, "r+b") as handle:
                handle.truncate(cut)

    def append(self, records: Iterable[R]) -> None:
        """Append and fsync a batch of records."""
        batch = list(records)
        if not batch:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            for record in batch:
                handle.write(record.model_dump_json() + "\n")
                self.records[record.key] = record
            handle.flush()
            os.fsync(handle.fileno())

    def compact(self, order: Callable[[R], Any]) -> None:
        """Rewrite the file atomically: one record per key, sorted by `order`."""
        ordered = sorted(self.records.values(), key=order)
        atomic.write_text(self.path, "".join(r.model_dump_json() + "\n" for r in ordered))


def read_results(path: Path) -> list[ResultRecord]:
    """All result records of a finished run directory's results.jsonl, validated."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(ResultRecord.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise DataError(path, number, None, f"invalid result record: {str(exc).splitlines()[0]}") from None
    return out
