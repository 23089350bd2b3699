"""JSON rubric judges: the judge reads the conversation between fixed delimiters and writes a verdict
that must follow a JSON schema; the schema comes from one pydantic model, and the same model parses the
reply. The judged text is neutralised (see `base.neutralise`), so an answer cannot close the delimiters
or inject instructions into the judge.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel

from diagsafe_local.core.messages import Message
from diagsafe_local.judging.base import Judge, JudgeInput, ParseOutcome
from diagsafe_local.runs.readers import ModelReader
from diagsafe_local.runs.records import ScoreRule

Context = Literal["conversation", "request", "none"]


def render_transcript(judged: JudgeInput, context: Context = "conversation", labels: Sequence[str] = ()) -> str:
    """The judged material between fixed delimiters, the answer last: after the whole conversation, after the
    request it replies to only, or alone; `labels` (the judge's verdict fields) neutralised in it."""
    *before, (_, answer) = judged.turns(labels)
    if context == "request":
        before = [turn for turn in before if turn[0] == "user"][-1:]
    shown = [] if context == "none" else ["<<<CONVERSATION>>>", *(f"[{r.upper()}]: {t}" for r, t in before)]
    if shown:
        shown.append("<<<END CONVERSATION>>>")
    return "\n".join([*shown, "<<<ANSWER TO JUDGE>>>", answer, "<<<END ANSWER TO JUDGE>>>"])


def _kind(spec: dict[str, Any]) -> str:
    if "enum" in spec:
        return "one of " + ", ".join(json.dumps(v) for v in spec["enum"])
    if spec.get("type") == "boolean":
        return "true or false"
    if spec.get("type") == "string":
        return f"text of at most {spec['maxLength']} characters" if "maxLength" in spec else "text"
    return str(spec.get("type", "a value"))


def reply_format(schema: dict[str, Any]) -> str:
    """The reply format in words: each field, its kind and meaning, in schema order.

    No example object: a weak judge copies an example verdict word for word instead of judging.
    """
    fields = [
        f"- {name}: {_kind(spec)}" + (f"; {spec['description']}" if spec.get("description") else "")
        for name, spec in schema["properties"].items()
    ]
    return "Reply with one JSON object and nothing else. Its fields, in this order:\n" + "\n".join(fields)


@dataclass(frozen=True, kw_only=True)
class Rubric(Judge):
    """A judge that answers in JSON: instructions as the system message, the verdict model's schema as
    the constraint, and the verdict -> score map."""

    instructions: str
    verdict_model: type[BaseModel]
    to_score: Callable[[Any], float]
    context: Context = "conversation"
    paraphrases: tuple[str, ...] = ()  # rewordings of `instructions`, its criteria kept (judge sensitivity)
    score_rule: ScoreRule | None = None  # a policy file's verdict -> score, as the read side parses it again

    def variant(self, k: int) -> Rubric:
        """The judge under its k-th paraphrase (1-based): the same verdict, schema and score, other words."""
        return replace(self, name=f"{self.name}~{k}", instructions=self.paraphrases[k - 1], paraphrases=())

    @cached_property
    def schema(self) -> dict[str, Any]:
        """The verdict model's JSON Schema (built once: pydantic's schema generation is slow per request)."""
        return self.verdict_model.model_json_schema()

    @cached_property
    def system_prompt(self) -> str:
        """The instructions, then the reply format described in words from the schema."""
        return f"{self.instructions}\n\n{reply_format(self.schema)}"

    @property
    def own_prompt(self) -> str:
        return self.system_prompt

    @cached_property
    def labels(self) -> tuple[str, ...]:
        """The verdict's field names: an answer that writes `label: not_harmful` must not pose as a verdict."""
        return tuple(self.schema.get("properties", {}))

    def render(self, judged: JudgeInput) -> tuple[Message, ...]:
        """Rubric first (shared prefix for the prefix cache), the item last."""
        return (
            Message(role="system", content=self.system_prompt),
            Message(
                role="user", content=render_transcript(judged, self.context, self.labels) + "\n\nYour JSON verdict:"
            ),
        )

    def constraint(self) -> dict[str, Any]:
        return {"json_schema": self.schema}

    def parse_text(self, text: str) -> ParseOutcome:
        """Parse and validate the reply against the verdict model (`runs.readers.ModelReader`, as the read side
        reads it again)."""
        read = ModelReader(self.verdict_model, self.to_score).parse(text)
        if isinstance(read, str):
            return ParseOutcome(status="invalid", error=read)
        return ParseOutcome(status="ok", verdict=read.verdict, score=read.score)
