"""The run directory's records and their crash-safe JSONL store.

`results.jsonl` holds one ResultRecord per judged answer; `generations.jsonl` one GenerationRecord
per generated answer (so a resumed run never regenerates). Records are appended and fsynced batch by
batch; a line torn by a crash is cut off on reopening; the finished file is rewritten (atomically) in
a canonical order with one record per key, so a resumed run ends byte-identical to an uninterrupted one.
The JSON Schema of ResultRecord ships as `diagsafe_local/schemas/result.schema.json`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.core import jsonl
from diagsafe_local.core.jsonl import KeyedRecord
from diagsafe_local.core.messages import Message

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


class GenerationRecord(KeyedRecord):
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
    request_key: str | None = Field(None, description="Hash of the model and the exact conversation sent; a resumed "
                                    "run reuses the answer only while it matches.")

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.target, self.item_id, self.sample, self.turn)


class ResultRecord(KeyedRecord):
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
    final_turn: bool = Field(True, description="The conversation's last user turn: only these count toward ASR.")
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
    judge_key: str | None = Field(None, description="Hash of the judge (model by content, rubric) and of everything it "
                                  "was shown; a resumed run reuses the verdict only while it matches.")

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.target, self.item_id, self.sample, self.turn)




def result_json_schema() -> dict[str, Any]:
    schema = ResultRecord.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "diagsafe-local result record"
    return schema


SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "result.schema.json"


def read_results(path: Path) -> list[ResultRecord]:
    """All result records of a finished run directory's results.jsonl, validated (a torn line is an error)."""
    return jsonl.read_records(path, ResultRecord)[0]
