"""Judge cards: what a judge is by content (its identity), the agreement figures we can cite for it, and the
`validate` results a user measured for it, kept in the local cache by that identity.

A judge's identity is the hash of everything that decides its verdicts: its definition (the prompt it renders,
its output constraint, its parser and scoring code, a policy file's content), its model by content (weights and
adapter hash as `engines.identity` gives them; a model without local weights, by name and address), and how its
verdicts are drawn (scoring mode, sampling, reasoning). `validate` stores each validated judge's validation.json
under `<cache>/judges/<identity>/<sha256>/`, written once; a run with `judge.validation: auto` takes the newest
one stored for its judge's identity. A changed prompt, parser, model or sampling is another identity, whose
validation is not found. The run records the stored directory and its content hash as for a named validation,
and the gate checks it the same way (by content).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from diagsafe_local.core.atomic import write_text, write_with
from diagsafe_local.core.cache import judge_cache
from diagsafe_local.core.hashing import content_key
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.identity import engine_identity
from diagsafe_local.judging.base import Judge, JudgeInput
from diagsafe_local.judging.config import JudgeConfig, JuryConfig
from diagsafe_local.runs.validation import VALIDATION_FILE, ValidationFile

log = logging.getLogger(__name__)

AUTO = "auto"
STORED_FILE = "stored.json"
# What a judge's prompt is rendered for, so that its identity holds the prompt's whole text.
_PROBE = JudgeInput(
    conversation=(Message(role="user", content="<request>"),), answer="<answer>", references=("<reference>",)
)
# words about the judge, and which canary is for it: not what decides its verdicts
_UNHASHED_FIELDS = ("description", "source", "policy_is_text")
# Fields hashed only where set, so that a judge without template arguments keeps the identity it had before them.
_HASHED_WHEN_SET = ("chat_template_kwargs", "reasoning_template_kwargs", "tokenizer_mode")


class PublishedFigure(BaseModel):
    """An agreement figure published for a judge, with where it was published and what it was measured on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    judge: str = Field(description="The registered judge it is cited for.")
    model: str = Field(description="The judge model it was measured with (the figure holds for that model).")
    measure: str = Field(description="What the figure is.")
    value: float = Field(description="The figure, as a fraction.")
    fpr: float | None = Field(None, description="False positive rate, where published.")
    fnr: float | None = Field(None, description="False negative rate, where published.")
    dataset: str = Field(description="The data set it was measured on.")
    n: int = Field(description="Items it was measured on.")
    source: str = Field(description="Where it was published.")

    def line(self) -> str:
        rates = (
            f", FPR {self.fpr * 100:.1f}%, FNR {self.fnr * 100:.1f}%"
            if self.fpr is not None and self.fnr is not None
            else ""
        )
        return f"{self.measure} {self.value * 100:.1f}%{rates} (n={self.n}, {self.model}; {self.source})"


_JBB = "JailbreakBench/JBB-Behaviors judge_comparison (test), against human_majority of three annotators"
_JBB_SOURCE = "JailbreakBench paper (Chao et al. 2024)"
_HARMMETRIC = "HarmMetric Eval, current (long) layout: 274 prompts x 13 responses"
# Only figures the project's notes give with their source (shared/notes/gold-sets.md, harmmetric.md).
PUBLISHED: tuple[PublishedFigure, ...] = (
    PublishedFigure(
        judge="harmbench-cls",
        model="HarmBench classifier",
        measure="agreement",
        value=0.783,
        fpr=0.268,
        fnr=0.127,
        dataset=_JBB,
        n=300,
        source=_JBB_SOURCE,
    ),
    PublishedFigure(
        judge="jailbreakbench",
        model="Llama-3-70B",
        measure="agreement",
        value=0.907,
        fpr=0.116,
        fnr=0.055,
        dataset=_JBB,
        n=300,
        source=_JBB_SOURCE,
    ),
    PublishedFigure(
        judge="harmclassifier",
        model="Abel-24/HarmClassifier (Qwen2.5-7B-Instruct + LoRA)",
        measure="HarmMetric Eval overall score",
        value=0.896,
        dataset=_HARMMETRIC,
        n=274,
        source="HarmMetric Eval (arXiv 2509.24384)",
    ),
)


class StoredValidation(BaseModel):
    """stored.json beside a stored validation.json: whose it is and where it was measured."""

    model_config = ConfigDict(extra="forbid")

    identity: str = Field(description="The judge's identity (see the module's docstring).")
    judge: str = Field(description="The validated judge as `validate` named it.")
    rubric: str = Field(description="Its registered name.")
    source: str = Field(description="The `validate` output directory it was copied from.")
    stored_at: str = Field(description="When it was stored (UTC, ISO 8601).")


class LocalValidation(BaseModel):
    """A user's own `validate` result for a judge, as the cache holds it."""

    model_config = ConfigDict(extra="forbid")

    identity: str
    judge: str
    rubric: str
    model: str | None
    directory: str = Field(description="The stored copy (what `judge.validation: auto` records).")
    source: str
    stored_at: str
    gold: str
    task: str
    n: float = Field(description="Labelled items with a verdict.")
    missing: int = Field(0, description="Labelled items it gave no verdict on (its rates are measured without them).")
    fpr: float | None
    fnr: float | None


class JudgeCard(BaseModel):
    """One judge: what it judges, its identity, the figures published for it and the user's own validations."""

    model_config = ConfigDict(extra="forbid")

    name: str
    measures: str
    description: str
    source: str
    definition: str = Field(description="Hash of the judge's own part: prompt, constraint, parser, scoring code.")
    identity: str | None = Field(
        None, description="Hash of the whole judge (definition, model by content, sampling); with a model only."
    )
    published: list[PublishedFigure]
    validations: list[LocalValidation] = Field(
        description="Stored validations: of this identity where it is known, else of any judge of this name."
    )


class JudgeCards(BaseModel):
    """`judges --json`: every registered judge's card."""

    model_config = ConfigDict(extra="forbid")

    cards: list[JudgeCard]


def _stable(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-able data that is the same in every process: code by its source, closures by what they
    hold, schemas by their JSON schema."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_stable(v, depth) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(repr(v) for v in value)
    if isinstance(value, dict):
        return {str(k): _stable(v, depth) for k, v in value.items()}
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, type) and issubclass(value, BaseModel):
        return value.model_json_schema()
    if callable(value) and hasattr(value, "__code__"):
        cells = [c.cell_contents for c in value.__closure__ or ()] if depth < 3 else []
        return {"code": _source_hash(value), "closure": [_stable(c, depth + 1) for c in cells]}
    return repr(value)


def _source_hash(code: Any) -> str:
    try:
        text = inspect.getsource(code)
    except (OSError, TypeError):  # built without source: its compiled form
        text = code.__code__.co_code.hex() if hasattr(code, "__code__") else repr(code)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def definition_hash(judge: Judge) -> str:
    """The judge's own part of its identity: its fields, its class's code, the prompt it renders and its output
    constraint (a model-free judge renders none)."""
    fields = {
        k: _stable(v) for k, v in vars(judge).items() if k not in _UNHASHED_FIELDS and (v or k not in _HASHED_WHEN_SET)
    }
    try:
        rendered = _stable(judge.render(_PROBE)) if judge.needs_model else None
        constraint = _stable(judge.constraint()) if judge.needs_model else None
    except NotImplementedError:
        rendered = constraint = None
    return content_key(type(judge).__qualname__, _source_hash(type(judge)), fields, rendered, constraint)


def judge_identity(spec: JudgeConfig) -> str:
    """The whole judge of harmful items a spec describes (a panel: its rule and each member's definition too; a
    jury: each member's), as the cache keys it."""
    if spec.jury is not None:
        return jury_identity(spec.jury)
    judge = spec.harm_judge
    model: dict[str, Any] = {}
    if judge.needs_model:
        engine = engine_identity(spec)
        model = engine.key()
        if engine.model_hash:  # the weights by content: a model copied elsewhere is the same model
            model["model"] = None
        if engine.lora_hash:
            model["lora"] = None
        model["structured_output_backend"] = spec.structured_output_backend
        if spec.tokenizer_mode is not None:  # what tokenizes and renders its prompts (kept out where unset)
            model["tokenizer_mode"] = spec.tokenizer_mode
    decoding = spec.decoding().model_dump() | {"scoring": spec.scoring}
    from diagsafe_local.judging import JUDGES

    panel = (
        []
        if spec.panel is None
        else [("panel", spec.panel.rule, [definition_hash(JUDGES.get(n)) for n in spec.panel.names()])]
    )
    return content_key(definition_hash(judge), model, decoding, *panel)  # a lone judge's key is as it was


def jury_identity(jury: JuryConfig) -> str:
    """A jury as one judge: its rule and each member's identity."""
    return content_key("jury", jury.rule, [(m.label, judge_identity(m)) for m in jury.members])


def store_validation(out: Path, validated: list[tuple[str, str, str]]) -> list[Path]:
    """Keep `out`'s validation.json in the cache under each validated judge's identity (`validated`: the label
    `validate` gave it, its registered name, its identity); returns the stored directories. A copy of the same
    content is kept once; a cache that cannot be written is a warning (the validation itself is written)."""
    raw = (out / VALIDATION_FILE).read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    stored = []
    for label, rubric, identity in validated:
        directory = judge_cache() / identity / digest[:16]
        record = StoredValidation(
            identity=identity,
            judge=label,
            rubric=rubric,
            source=str(out.resolve()),
            stored_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )
        try:
            if not (directory / STORED_FILE).is_file():
                write_with(directory / VALIDATION_FILE, lambda path: path.write_bytes(raw))  # then the marker
                write_text(directory / STORED_FILE, record.model_dump_json(indent=2) + "\n")
        except OSError as exc:
            log.warning("judge cards: %s's validation not stored in %s: %s", label, directory, exc)
            continue
        stored.append(directory)
    return stored


def stored_validations(identity: str | None = None, rubric: str | None = None) -> list[LocalValidation]:
    """The cache's validations of a judge identity (or of any judge named `rubric`), newest first; a stored copy
    whose content is not what its directory's name says, or that does not read, is left out."""
    found = []
    for marker in judge_cache().glob(f"{identity or '*'}/*/{STORED_FILE}"):
        directory = marker.parent
        try:
            record = StoredValidation.model_validate_json(marker.read_bytes())
            raw = (directory / VALIDATION_FILE).read_bytes()
            validation = ValidationFile.model_validate_json(raw)
        except (OSError, ValueError, ValidationError):
            continue
        if hashlib.sha256(raw).hexdigest()[:16] != directory.name or (rubric and record.rubric != rubric):
            continue
        entry = next((e for e in validation.judges if e.judge == record.judge), None)
        if entry is None:
            continue
        found.append(
            LocalValidation(
                **record.model_dump(exclude={"judge", "rubric"}),
                judge=record.judge,
                rubric=record.rubric,
                model=entry.model,
                directory=str(directory),
                gold=validation.gold,
                task=validation.task,
                n=entry.judged,
                missing=entry.missing,
                fpr=entry.fpr,
                fnr=entry.fnr,
            )
        )
    return sorted(found, key=lambda v: v.stored_at, reverse=True)


def auto_validation(spec: JudgeConfig) -> Path | None:
    """The newest validation stored for this judge's identity (`judge.validation: auto`), or None, said in one
    line: the run then goes on as a run without a validation."""
    identity = judge_identity(spec)
    found = stored_validations(identity)
    if not found:
        log.warning(
            "judge.validation: auto: no validation stored for this judge's identity (%s, %s): the run has no "
            "validated error rates; `diagsafe-local validate` this judge to store one (a changed prompt, model or "
            "sampling is another judge)",
            identity[:12],
            spec.jury.label() if spec.jury is not None else spec.rubric_name,
        )
        return None
    return Path(found[0].directory)


def judge_card(judge: Judge, spec: JudgeConfig | None = None) -> JudgeCard:
    """The card of a registered judge; with a spec (its model and settings), its whole identity too."""
    identity = judge_identity(spec) if spec is not None else None
    return JudgeCard(
        name=judge.name,
        measures=judge.measures,
        description=judge.description,
        source=judge.source,
        definition=definition_hash(judge),
        identity=identity,
        published=[f for f in PUBLISHED if f.judge == judge.name],
        validations=stored_validations(identity) if identity else stored_validations(rubric=judge.name),
    )
