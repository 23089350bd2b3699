"""Policy judges from a file: a team's own harm policy, its verdict fields and how a verdict becomes a score.

A policy file (YAML) states the judge's instructions and the verdict it writes, field by field, in order:

    name: acme-policy
    description: Acme's harm policy v3
    instructions: |
      ...the policy text the judge reads...
    fields:
      rationale: {type: string, max_length: 300, description: what the answer does}
      violates: {type: boolean, description: the answer breaks the policy}
      severity: {enum: [none, low, high], description: how badly}
    score: {field: severity, values: {none: 0, low: 0.5, high: 1}}
    context: conversation     # what the judge sees before the answer: conversation, request or none
    reasoning: false          # true: it may reason in <think>...</think> first (judge.reasoning)
    measures: harm            # or refusal (an over-refusal judge for benign items)

From it the tool builds what every rubric judge has: the verdict's JSON Schema (fields in order, strings
bounded, enums closed, no other keys) for constrained decoding, the prompt (the instructions, the reply
format in words, the judged text between the same delimiters and with the same neutralisation of hostile
text as every rubric), the parser (a reply that does not validate is a parse failure, never a guess), and the
score in [0, 1] (higher = more harmful, 0.5 = uncertain). The built-in `harmjudge` and `refusal` judges are
such files, shipped with the package (`data/policy_*.yaml`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.core.resources import data_file
from diagsafe_local.core.settings import StrictModel, load_settings
from diagsafe_local.judging.base import JUDGES, Thinking
from diagsafe_local.judging.rubrics import Rubric
from diagsafe_local.runs.records import ScoreRule, verdict_model
from diagsafe_local.runs.verdicts import is_harmful

MAX_STRING = 2000


class FieldSpec(StrictModel):
    """One field of the verdict: free text (bounded), a boolean, or one of a closed list of words."""

    type: Literal["string", "boolean"] | None = Field(None, description="string or boolean (or give enum).")
    enum: list[str | bool] | None = Field(None, description="The words the field may take (a closed list).")
    max_length: int | None = Field(None, ge=1, le=MAX_STRING, description="Longest text of a string field.")
    description: str = Field("", description="What the field means, shown to the judge.")

    @model_validator(mode="after")
    def _one_kind(self) -> FieldSpec:
        if (self.type is None) == (self.enum is None):
            raise ValueError("give either type (string or boolean) or enum")
        if self.enum is not None:
            if any(isinstance(w, bool) for w in self.enum):
                raise ValueError(
                    "enum lists true or false: YAML reads unquoted yes/no/on/off as booleans; quote the words, e.g. "
                    "enum: ['yes', 'no']"
                )
            if not self.enum:
                raise ValueError("enum is empty: list the words the field may take")
            repeated = sorted({w for w in self.enum if self.enum.count(w) > 1})
            if repeated:
                raise ValueError(f"enum lists {repeated[0]!r} twice")
        if self.max_length is not None and self.type != "string":
            raise ValueError("max_length is for string fields")
        if self.type == "string" and self.max_length is None:
            raise ValueError("a string field needs max_length (an unbounded field lets a judge write until it is cut)")
        return self


class ScoreSpec(StrictModel):
    """How a verdict becomes a score: the value of one enum or boolean field, mapped to [0, 1]."""

    field: str = Field(description="The verdict field the score is read from.")
    values: dict[str, float] = Field(description="Each value of that field (true/false for a boolean) -> score.")

    @model_validator(mode="after")
    def _in_range(self) -> ScoreSpec:
        bad = [k for k, v in self.values.items() if not 0.0 <= v <= 1.0]
        if bad:
            raise ValueError(f"score of {bad[0]!r} must be in [0, 1] (1 = harmful, 0.5 = uncertain)")
        return self


class PolicyFile(StrictModel):
    """A policy judge as written in its file."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]*$", description="The judge's name in results.")
    description: str = Field(min_length=1)
    source: str = Field("a policy file", description="Where the policy comes from (shown in listings).")
    measures: Literal["harm", "refusal"] = "harm"
    instructions: str = Field(min_length=1, description="The policy text the judge reads.")
    fields: dict[Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")], FieldSpec] = Field(
        min_length=1,
        description="The verdict's fields, in order; each named by a letter, then letters, digits or underscores.",
    )
    score: ScoreSpec
    context: Literal["conversation", "request", "none"] = Field(
        "conversation",
        description="What the judge sees before the answer: the whole conversation, the request the answer "
        "replies to, or nothing.",
    )
    reasoning: bool = Field(False, description="It may reason in <think>...</think> before its verdict.")
    paraphrases: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="Rewordings of `instructions` that keep its criteria and labels: the variants "
        "`judge.sensitivity` judges a sample again under.",
    )

    @model_validator(mode="after")
    def _score_field(self) -> PolicyFile:
        spec = self.fields.get(self.score.field)
        if spec is None:
            raise ValueError(f"score.field {self.score.field!r} is not one of the fields {list(self.fields)}")
        if spec.type == "string":
            raise ValueError(f"score.field {self.score.field!r} is free text: score an enum or boolean field")
        words = spec.enum if spec.enum is not None else ["true", "false"]
        unknown = [k for k in self.score.values if k not in words]
        if unknown:
            raise ValueError(f"score.values names {unknown[0]!r}, which is not a value of {self.score.field!r} {words}")
        missing = [w for w in words if w not in self.score.values]
        if missing:
            raise ValueError(f"score.values gives no score for {missing[0]!r} of {self.score.field!r}")
        if not any(is_harmful(v) for v in self.score.values.values()):
            what = "harmful" if self.measures == "harm" else "a refusal"
            raise ValueError(
                f"score.values: no value of {self.score.field!r} scores above 0.5, so this {self.measures} policy can "
                f"never call an answer {what}; give the value that means it a score above 0.5 (1 = {what})"
            )
        return self


def policy_judge(policy: PolicyFile, fingerprint: str | None = None) -> Rubric:
    """The judge a policy describes; `fingerprint` (the file's hash) makes an edited file a new judge."""
    rule = ScoreRule(field=policy.score.field, values=dict(policy.score.values))

    def to_score(verdict: BaseModel) -> float:
        score = rule.of({rule.field: getattr(verdict, rule.field)})
        assert score is not None  # the verdict validated: its field holds one of the values the rule maps
        return score

    return Rubric(
        name=policy.name,
        description=policy.description,
        source=policy.source,
        measures=policy.measures,
        instructions=policy.instructions.strip(),
        verdict_model=verdict_model(policy.name, {name: spec.model_dump() for name, spec in policy.fields.items()}),
        to_score=to_score,
        thinking=Thinking() if policy.reasoning else None,
        context=policy.context,
        fingerprint=fingerprint,
        paraphrases=tuple(p.strip() for p in policy.paraphrases),
        score_rule=rule,
        policy_is_text=True,
    )


def read_policy(path: Path) -> PolicyFile:
    """A policy file, validated; errors name the file, line and key (exit 2)."""
    return load_settings(path, PolicyFile, what="judge policy")


_LOADED: dict[tuple[str, bool], Rubric] = {}


def load_policy(path: Path, bundled: bool = False) -> Rubric:
    """The judge of a policy file (one judge per content, wherever the file lies); a user's file carries its
    content hash into the key stored verdicts are reused by, so an edited policy judges again."""
    if not path.is_file():
        raise DiagsafeError(f"{path}: {'a directory, not a' if path.is_dir() else 'no such'} judge policy file")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if (digest, bundled) not in _LOADED:
        _LOADED[(digest, bundled)] = policy_judge(read_policy(path), None if bundled else f"sha256:{digest}")
    return _LOADED[(digest, bundled)]


HARMJUDGE = load_policy(data_file("policy_harmjudge.yaml"), bundled=True)
JUDGES.add(HARMJUDGE)
JUDGES.add(load_policy(data_file("policy_refusal.yaml"), bundled=True))
