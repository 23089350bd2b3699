"""The grammar canary: one request whose schema allows a single output that no model writes unconstrained (a
fixed improbable enum value and six digits). Its reply proves the engine applied the schema: vLLM and its
plugins have shipped releases that silently dropped constraints, and a judge decoding without its schema still
often writes valid JSON, so a run's verdicts parsing is no proof. Sent once by every run whose judge decodes
under a schema (and by `doctor`)."""

from __future__ import annotations

from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Completion, Engine, GenerationRequest
from diagsafe_local.runs.grammar import CANARY_SCHEMA, CANARY_VALUE, canary_held

__all__ = ["CANARY_SCHEMA", "CANARY_VALUE", "ask_canary", "canary_held", "canary_request", "read_reply"]


def canary_request() -> GenerationRequest:
    """The canary, greedy, with room for its one object (about 40 tokens even byte by byte)."""
    return GenerationRequest(
        messages=(Message(role="user", content="Write a short sentence about the weather."),),
        max_tokens=96,
        temperature=0.0,
        json_schema=CANARY_SCHEMA,
    )


def ask_canary(engine: Engine) -> tuple[bool, str]:
    """Send the canary: whether the engine applied its schema, and what it replied (or its error). An engine that
    raises instead of answering (a plugin's) did not apply it."""
    try:
        reply = engine.generate([canary_request()])[0]
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return read_reply(reply)


def read_reply(reply: Completion) -> tuple[bool, str]:
    """Whether the canary's reply shows its schema applied, and what it replied (or its error)."""
    return reply.error is None and canary_held(reply.text), reply.error or reply.text
