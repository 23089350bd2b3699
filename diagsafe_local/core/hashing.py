"""Stable hashes: content keys (what a stored answer or verdict was made from) and per-request seeds."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def request_seed(base: int, *parts: object) -> int:
    """A per-request seed that depends only on the request's identity, not on batch composition."""
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def content_key(*parts: Any) -> str:
    """A stable hash of JSON-able parts (pydantic models by their JSON dump)."""

    def plain(value: Any) -> Any:
        return value.model_dump(mode="json") if hasattr(value, "model_dump") else value

    payload = json.dumps([plain(p) for p in parts], sort_keys=True, default=plain, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]
