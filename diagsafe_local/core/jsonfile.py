"""JSON object files the tool writes (manifests, summaries, validation.json), read back and checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from diagsafe_local.core.errors import DiagsafeError


def read_json(path: Path, what: str, raw: bytes | None = None) -> dict[str, Any]:
    """A JSON object file written by the tool (a run's manifest or summary, validation.json), or an error naming
    the file; `raw`: its bytes as the caller read them (None: read here)."""
    if raw is None and not path.is_file():
        raise DiagsafeError(
            f"{path.parent}: no {path.name}: not a finished {what.split()[0]} directory (is this the {what}'s directory?)"
        )
    try:
        value = json.loads((path.read_bytes() if raw is None else raw).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DiagsafeError(f"{path}: corrupt {what} ({exc}); rerun the command that wrote it") from None
    if not isinstance(value, dict):
        raise DiagsafeError(f"{path}: corrupt {what} (not a JSON object)")
    return value


M = TypeVar("M", bound=BaseModel)


def read_model(path: Path, model: type[M], what: str, raw: bytes | None = None) -> M:
    """A file as its typed record: a file of another version is a clear error, never a guessed key (`raw`: as
    `read_json`)."""
    data = read_json(path, what, raw)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise DiagsafeError(
            f"{path}: not a {what} of this version of diagsafe-local ({where}: {first['msg']}); "
            "rerun the command that wrote it"
        ) from None
