"""The grammar canary's schema and its one allowed output, as the read side checks a recorded reply against it
(`judging.canary` sends it): a schema that allows a single output no model writes unconstrained (a fixed
improbable enum value and six digits)."""

from __future__ import annotations

import re
from typing import Any

from diagsafe_local.runs.readers import lenient_json

CANARY_VALUE = "zq-canary-7731"
CANARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "canary": {"enum": [CANARY_VALUE]},
        "digits": {"type": "string", "pattern": "^[0-9]{6}$"},
    },
    "required": ["canary", "digits"],
    "additionalProperties": False,
}
_DIGITS = re.compile(r"[0-9]{6}")


def canary_held(text: str) -> bool:
    """Whether a reply to the canary is the one output its schema allows."""
    try:
        reply = lenient_json(text)  # the one parse of a reply: a ValueError for any it cannot read, deep ones too
    except ValueError:
        return False
    return (
        isinstance(reply, dict)
        and set(reply) == {"canary", "digits"}
        and reply["canary"] == CANARY_VALUE
        and isinstance(reply["digits"], str)
        and _DIGITS.fullmatch(reply["digits"]) is not None
    )
