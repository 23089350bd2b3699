"""The JSON Schemas of the records the tool writes, shipped in `diagsafe_local/schemas/` for other programs: the
result, summary and manifest records, and each judging pass's record (`runs.passes`, under the pass's name).

Regenerate them after changing a record: `python -m diagsafe_local.runs.schemas` (a test checks they are current).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from diagsafe_local.core.pack import PackLock
from diagsafe_local.runs import passes
from diagsafe_local.runs.manifest import Manifest
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.summary import Summary

SCHEMAS: dict[str, type[BaseModel]] = {
    "result": ResultRecord,
    "summary": Summary,
    "manifest": Manifest,
    "pack": PackLock,
    **{row.name: row.record for row in passes.PASSES},
}
SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of a record the tool writes (shipped in diagsafe_local/schemas/NAME.schema.json)."""
    schema = SCHEMAS[name].model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"diagsafe-local {name}" if name in ("summary", "manifest") else f"diagsafe-local {name} record"
    return schema


def schema_path(name: str) -> Path:
    return SCHEMA_DIR / f"{name}.schema.json"


if __name__ == "__main__":
    for each in SCHEMAS:
        schema_path(each).write_text(json.dumps(json_schema(each), indent=2) + "\n")
