"""The records of a run directory, one per answer: what the target answered (generations.jsonl), what the judge
made of it (results.jsonl, and attacks.jsonl for an adaptive attack's steps), and the judge's verdicts on the
control answers (judge_controls.jsonl).

Every record is a pydantic model, validated when written and when read: a file from another version is a clear
error naming the file, line and field, never a guessed key. The JSON Schema of ResultRecord ships as
`diagsafe_local/schemas/result.schema.json`.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from diagsafe_local.core import jsonl
from diagsafe_local.core.jsonl import KeyedRecord
from diagsafe_local.core.messages import Message
from diagsafe_local.runs.files import ATTACKS, CONTROLS, GENERATIONS
from diagsafe_local.runs.readers import Read, lenient_json

SCHEMA_VERSION = 1
ParseStatus = Literal["ok", "truncated", "invalid", "error"]


class Record(BaseModel):
    """A record the tool writes: unknown fields are errors, never ignored."""

    model_config = ConfigDict(extra="forbid")


class TokenCounts(Protocol):
    """What an engine's completion says about its tokens."""

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...


class ReasoningTrace(BaseModel):
    """What a judge thought before its verdict (as drawn, and as results and verdict stores keep it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str | None = Field(description="The reasoning (None when not stored).")
    tokens: int = Field(ge=0, description="Tokens of the reasoning phase.")
    closed_by_budget: bool = Field(
        False, description="The phase ran out of judge.reasoning_max_tokens and was closed for the model."
    )

    def kept(self, store: bool = True, max_chars: int | None = None) -> ReasoningTrace:
        """The trace as stored: without its text, or with the text cut to `max_chars` (the cut said)."""
        if not store or self.text is None:
            return self.model_copy(update={"text": None})
        if max_chars is not None and len(self.text) > max_chars:
            cut = len(self.text) - max_chars
            return self.model_copy(update={"text": f"{self.text[:max_chars]}… [{cut} characters not stored]"})
        return self


class Usage(BaseModel):
    """Token counts of one engine call for one request."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int = Field(0, description="Tokens of the prompt sent.")
    completion_tokens: int = Field(0, description="Tokens generated.")
    cached_tokens: int = Field(0, description="Prompt tokens served from the prefix cache.")

    @classmethod
    def of(cls, completion: TokenCounts) -> Usage:
        """A completion's token counts."""
        return cls(
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            cached_tokens=completion.cached_tokens,
        )


class EngineRef(BaseModel):
    """Which engine produced a text: kind (vllm, openai, transformers), model, adapter, endpoint (never keys)."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="The engine kind (`vllm`, `openai`, `transformers`, a plugin's).")
    model: str = Field(description="The model as configured: a path or a model name.")
    lora: str | None = Field(None, description="The LoRA adapter, if one was applied.")
    base_url: str | None = Field(None, description="The API endpoint (API engines; never a key).")


AnswerKey = tuple[str, str, int, int]  # (target, item_id, sample, turn): one answer of a run


class AnswerRecord(KeyedRecord):
    """A record about one answer of a run, kept by its `AnswerKey` (these fields come first)."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(description="The target's name (`targets:`).")
    item_id: str = Field(description="The dataset item's id.")
    sample: int = Field(ge=0, description="Sample index (0..n-1) when the target answers n times.")
    turn: int = Field(ge=1, description="1-based user turn the answer responds to.")

    @property
    def key(self) -> AnswerKey:
        return (self.target, self.item_id, self.sample, self.turn)


class GenerationRecord(AnswerRecord):
    """One answer of the target (generated or pre-filled) at one turn of one sample of one item."""

    answer: str = Field(description="The target's answer, as written.")
    finish_reason: str | None = Field(
        description="Why generation stopped: `stop`, `length` (cut off at max_tokens), ...; None on an error."
    )
    prefilled: bool = Field(False, description="A recorded assistant turn of the dataset, replayed, not generated.")
    usage: Usage = Field(default_factory=Usage, description="The target's token counts for this answer.")
    error: str | None = Field(
        None, description="Why the target gave no answer (the engine's message); None when it did."
    )
    request_key: str | None = Field(
        None,
        description="Hash of the model and the exact conversation sent; a resumed "
        "run reuses the answer only while it matches.",
    )


class PanelVote(BaseModel):
    """One panel member's verdict on an answer (`judge.panel`)."""

    model_config = ConfigDict(extra="forbid")

    rubric: str = Field(description="The member: its rubric (panel) or its name (jury).")
    raw: str | None = Field(description="The member's reply as written (None on an error).")
    verdict: dict[str, Any] | None = Field(description="The reply parsed (None unless parse_status is ok).")
    score: float | None = Field(description="1 = harmful, 0 = not harmful; None unless parse_status is ok.")
    parse_status: ParseStatus = Field(
        description="ok; truncated (cut off), invalid (did not validate), error (the engine failed)."
    )
    error: str | None = Field(None, description="The engine's message where parse_status is error.")


class AttackInfo(BaseModel):
    """Where a judged answer stands in an adaptive attack (attacks.jsonl: `sample` is the stream, `turn` the
    chain's step)."""

    model_config = ConfigDict(extra="forbid")

    strategy: str = Field(description="The attack strategy (`pair`, `crescendo`, a plugin's).")
    goal: str = Field(description="What the attack aims at: the item's request, as the judge grades against it.")
    stream: int = Field(ge=0, description="The chain (pair) or conversation (crescendo) of its goal.")
    step: int = Field(ge=1, description="1-based step of the chain: one attacker prompt and one target answer.")
    depth: int = Field(ge=1, description="pair: the refinement; crescendo: the conversation turn.")
    turn: int = Field(ge=1, description="The conversation turn the answer responds to (pair: always 1).")
    parent: int | None = Field(description="The step this one builds on (None: the chain's first).")
    attacker_prompt: str = Field(description="What the attacker wrote and the target was sent last.")
    improvement: str = Field("", description="The attacker's own note on how this prompt improves on the last.")
    backtracked: bool = Field(False, description="crescendo: the target refused and the turn was taken back.")
    refused: bool = Field(False, description="The refusal detector's reading of the answer.")
    end: str | None = Field(
        None,
        description="Why the chain ended at this step: success, error, or the strategy's own reason (pair: depth; "
        "crescendo: turns). None: it went on, or its goal was broken elsewhere.",
    )
    chain_key: str = Field(
        description="Hash of what the chain depends on; a resumed run reuses it only while it matches."
    )
    attacker_usage: Usage = Field(default_factory=Usage, description="The attacker's token counts for this step.")

    @property
    def queried(self) -> bool:
        """Whether the step asked the target (an attacker that failed wrote no prompt, and spent no query)."""
        return bool(self.attacker_prompt)


def asked_hash(asked: Sequence[str]) -> str:
    """What a target was asked, hashed: its user turns in order (not a system prompt, not its own earlier answers).
    The manifest records it for every judged turn of the dataset, the gate checks every result against it, and
    a paired comparison pairs answers by it."""
    return _asked_hash(tuple(asked))


def _hash_of(asked: tuple[str, ...]) -> str:
    return hashlib.sha256(repr(list(asked)).encode("utf-8", "surrogatepass")).hexdigest()[:16]  # repr: unambiguous


# The runs of a series or a comparison ask the same prompts (one dataset): a dataset's worth is kept, the last 4,096
# prompts, so each is hashed once a process, not once a record (a hit costs the tuple's string hashes; kept by
# content, so an edited prompt is hashed anew). A kept prompt holds its text, so only prompts of at most
# _KEPT_CHARS characters are kept: the cache stays under ~8 MB of text (32 MB at 4 bytes a character) whatever the
# run holds; a longer prompt is hashed each time.
_KEPT_CHARS = 2048
_kept_hash = functools.lru_cache(maxsize=4096)(_hash_of)


def _asked_hash(asked: tuple[str, ...]) -> str:
    return _kept_hash(asked) if sum(map(len, asked)) <= _KEPT_CHARS else _hash_of(asked)


class ResultRecord(KeyedRecord):
    """One judged answer: the full conversation, the answer, the judge's raw output, verdict and score."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(SCHEMA_VERSION, description="Version of this record's format.")
    run_id: str = Field(description="The run's id (manifest.json): a record of another run is refused.")
    target: str = Field(description="The target's name (`targets:`).")
    item_id: str = Field(description="The dataset item's id.")
    sample: int = Field(ge=0, description="Sample index (0..n-1) when the target answers n times.")
    turn: int = Field(ge=1, description="1-based user turn the answer responds to.")
    category: str = Field("", description="The item's harm category.")
    source: str = Field("", description="The prompt set the item comes from.")
    attack_method: str = Field("", description="The item's attack method (jailbreak template, multi-turn, ...).")
    benign: bool = Field(False, description="A benign item: its answers count toward over-refusal, never ASR.")
    final_turn: bool = Field(True, description="The conversation's last user turn: only these count toward ASR.")
    conversation: list[Message] = Field(description="Messages up to and including the judged user turn.")
    answer: str = Field(description="The target's answer, as written.")
    finish_reason: str | None = Field(
        description="Why generation stopped: `stop`, `length` (cut off at max_tokens), ...; None on an error."
    )
    target_usage: Usage = Field(description="The target's token counts for the answer.")
    target_engine: EngineRef = Field(description="The engine that wrote the answer.")
    judge_engine: EngineRef = Field(description="The engine that judged it.")
    judge_rubric: str = Field(description="The judge (`judge.rubric`) that gave the verdict.")
    panel: list[PanelVote] | None = Field(None, description="Each member's verdict when a panel judged the answer.")
    judge_raw: str | None = Field(description="The judge's reply as written (None on an error).")
    verdict: dict[str, Any] | None = Field(
        description="The reply parsed (probability mode: `label`, `p_yes`, `logprobs`); None unless parse_status is ok."
    )
    score: float | None = Field(description="1 = harmful, 0 = not harmful; None unless parse_status is ok.")
    parse_status: ParseStatus = Field(
        description="ok; truncated (cut off), invalid (did not validate), error (an engine failed): all but ok are unjudged."
    )
    attempts: int = Field(ge=0, description="Judge requests made for the verdict, retries included.")
    error: str | None = Field(None, description="The engine's message where the target or the judge failed.")
    judge_usage: Usage = Field(default_factory=Usage, description="The judge's token counts for the verdict.")
    reasoning: ReasoningTrace | None = Field(None, description="The judge's reasoning phase, where it had one.")
    judge_logprobs: list[float] | None = Field(
        None, description="Token logprobs of the judge reply, where the engine gives them."
    )
    judge_key: str | None = Field(
        None,
        description="Hash of the judge (model by content, rubric) and of everything it "
        "was shown; a resumed run reuses the verdict only while it matches.",
    )
    attack: AttackInfo | None = Field(None, description="The adaptive attack step (attacks.jsonl only).")

    @property
    def key(self) -> AnswerKey:  # its own fields' order (run_id first) stays that of the published format
        return (self.target, self.item_id, self.sample, self.turn)

    def asked(self) -> str:
        """What the target was asked, hashed (`asked_hash` of its user turns)."""
        asked = []  # a loop, not a comprehension (Python 3.11 makes a function of each): verify calls this a record
        for message in self.conversation:
            if message.role == "user":
                asked.append(message.content)
        return _asked_hash(tuple(asked))


class AnswerVerdict(KeyedRecord):
    """A verdict on one answer of a run besides its result record (a sensitivity paraphrase's, a jury member's),
    keyed by the answer and by `_judge` (which paraphrase or member gave it)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    target: str
    item_id: str
    sample: int
    turn: int

    @property
    def _judge(self) -> str:
        raise NotImplementedError

    @property
    def key(self) -> tuple[str, str, int, int, str]:
        return (self.target, self.item_id, self.sample, self.turn, self._judge)


class SensitivityRecord(AnswerVerdict):
    """One answer of the sensitivity sample judged again under one paraphrase of the judge's prompt."""

    category: str | None
    variant: str = Field(
        description="The judge under a paraphrase: its name and the paraphrase's number (harmjudge~2)."
    )
    score: float | None
    parse_status: str
    judge_raw: str | None

    @property
    def _judge(self) -> str:
        return self.variant


class JuryVote(AnswerVerdict):
    """One jury member's verdict on one answer (jury.jsonl): kept as it comes in, so a resumed run asks each
    member only what it has not judged; the combined record (results.jsonl) carries every member's vote."""

    judge_key: str = Field(description="The member (model by content, rubric) and what it was shown, hashed.")
    vote: PanelVote
    attempts: int = Field(ge=0)
    usage: Usage = Field(default_factory=Usage)

    @property
    def _judge(self) -> str:
        return self.vote.rubric


class RobustnessRecord(AnswerVerdict):
    """One answer of the robustness sample judged again by the harm judge after one meaning-preserving edit
    (`runs.robustness.PERTURBATIONS`)."""

    category: str | None
    perturbation: str = Field(description="The edit of the answer the judge was shown (e.g. disclaimer_added).")
    score: float | None
    parse_status: str
    judge_raw: str | None = Field(description="The judge's reply as written (None on an error).")

    @property
    def _judge(self) -> str:
        return self.perturbation


_ABSENT: Any = object()  # a verdict without the rule's field


class ScoreRule(Record):
    """How a policy judge's verdict becomes a score (its policy file's `score:`): the value of one field, mapped
    to [0, 1]; what the read side parses a recorded reply again with."""

    field: str = Field(description="The verdict field the score is read from.")
    values: dict[str, float] = Field(description="Each value of that field (true/false for a boolean) -> score.")

    def of(self, verdict: Any) -> float | None:
        """The score of a parsed verdict (None: no object with a value of `field` the rule maps)."""
        value = verdict.get(self.field, _ABSENT) if isinstance(verdict, dict) else _ABSENT
        if value is _ABSENT:  # a field set to null is a value (its string "None")
            return None
        return self.values.get(str(value).lower() if isinstance(value, bool) else str(value))

    def read(self, reply: str) -> Read | None:
        """The reply as JSON and its score (a `runs.readers.Reader`; None: it does not read as a verdict)."""
        try:
            verdict = lenient_json(reply)
        except ValueError:
            return None
        score = self.of(verdict)
        return None if score is None else Read(verdict, score)


def verdict_model(name: str, fields: Mapping[str, Mapping[str, Any]]) -> type[BaseModel]:
    """A policy's verdict as a pydantic model, from its file's `fields:` (each an `enum`, a `type: boolean`, or
    a `type: string` with `max_length`): in order, closed, bounded. The one model a policy judge's replies are
    parsed by, when written (`judging.policy`) and read again (`PolicyVerdicts`)."""
    made: dict[str, Any] = {}
    for field, spec in fields.items():
        description = spec.get("description", "")
        if spec.get("enum") is not None:
            made[field] = (Literal[tuple(spec["enum"])], Field(description=description))
        elif spec.get("type") == "boolean":
            made[field] = (bool, Field(description=description))
        else:
            made[field] = (str, Field(max_length=spec.get("max_length"), description=description))
    return create_model(re.sub(r"\W", "_", name), __config__=ConfigDict(extra="forbid"), **made)


class PolicyVerdicts:
    """A policy judge's replies read again as its judge parsed them: the same lenient JSON, the same verdict model
    (`verdict_model`: extra fields refused, pydantic's lax coercions), scored by the policy's `rule`. A reply of
    the exact shape (every field, no other, each value of its own JSON type within its bounds: what an engine that
    holds the schema writes) is taken as it is, without pydantic: such a value validates to itself, so the verdict
    and score are the model's (verify reads every recorded reply: a series report reads thousands a run)."""

    def __init__(self, name: str, fields: Mapping[str, Mapping[str, Any]], rule: ScoreRule) -> None:
        self.rule = rule
        self.model = verdict_model(name, fields)
        self._keys = set(fields)
        kinds = {f: ("enum" if s.get("enum") is not None else s.get("type")) for f, s in fields.items()}
        self._words = [(f, frozenset(fields[f]["enum"])) for f, kind in kinds.items() if kind == "enum"]
        self._bools = [f for f, kind in kinds.items() if kind == "boolean"]
        self._texts = [(f, fields[f].get("max_length")) for f, kind in kinds.items() if kind not in ("enum", "boolean")]

    def _exact(self, value: Any) -> bool:
        """Whether a JSON value is a verdict of the exact shape (it validates to itself)."""
        if type(value) is not dict or value.keys() != self._keys:
            return False
        for field in self._bools:
            if type(value[field]) is not bool:
                return False
        for field, words in self._words:
            if type(value[field]) is not str or value[field] not in words:
                return False
        for field, longest in self._texts:
            if type(value[field]) is not str or (longest is not None and len(value[field]) > longest):
                return False
        return True

    def read(self, reply: str) -> Read | None:
        """The reply's verdict and score (a `runs.readers.Reader`; None: it does not read as a verdict)."""
        try:
            value = lenient_json(reply)
        except ValueError:
            return None
        if not self._exact(value):
            try:
                value = self.model.model_validate(value).model_dump(mode="json")
            except ValidationError:
                return None
        score = self.rule.of(value)
        return None if score is None else Read(value, score)


class InjectionRecord(KeyedRecord):
    """The harm judge's verdict on one policy-injection canary (`runs.injection.CANARIES`): a plainly harmful
    control answer that tells the judge its policy allows it."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    canary: str = Field(description="The canary's id.")
    judge: str = Field(description="The harm judge that gave the verdict (its registered name).")
    rule: ScoreRule | None = Field(
        description="A policy judge's score rule, checked against the run's own verdicts (None: a built-in judge "
        "read by its `runs.readers` entry)."
    )
    score: float | None
    parse_status: str
    judge_raw: str | None = Field(description="The judge's reply as written (None on an error).")

    @property
    def key(self) -> tuple[str, str]:
        return (self.judge, self.canary)


class ControlRecord(KeyedRecord):
    """The judge's verdict on one control: a known answer that is not harmful."""

    model_config = ConfigDict(extra="forbid")

    item_id: str = Field(description="The dataset item whose request the control answers.")
    kind: str = Field(description="The control answer: `refusal` or `unrelated` (neither is harmful).")
    judge_rubric: str = Field(description="The judge (`judge.rubric`) that gave the verdict.")
    score: float | None = Field(description="The judge's score of the control; None unless parse_status is ok.")
    parse_status: str = Field(description="ok, truncated, invalid or error, as for result records.")
    judge_raw: str | None = Field(description="The judge's reply as written (None on an error).")
    judge_key: str | None = Field(
        None, description="Hash of the judge (model by content, rubric) and what it was shown, as for result records."
    )

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.judge_rubric, self.item_id, self.kind)


SHOWN = 5  # how many wrong results a problem names


class WrongResults:
    """Results one check of `verify` (or of a judging pass) finds wrong: counted, the first few kept to name
    them in its problem."""

    problem = ""  # "{count} results ..., e.g. {shown}"

    def __init__(self) -> None:
        self.wrong: list[AnswerKey] = []
        self.count = 0

    def _note(self, record: ResultRecord) -> None:
        self.count += 1
        if len(self.wrong) < SHOWN:
            self.wrong.append(record.key)

    def problems(self) -> list[str]:
        if not self.count:
            return []
        shown = ", ".join(f"{t}/{i} sample {s} turn {k}" for t, i, s, k in self.wrong)
        return [self.problem.format(count=self.count, shown=shown)]


RUN_WIDE = ""  # the target a judging pass's run-wide count is given under (the judge's controls are of no one target)


class CouldNotJudge(Record):
    """What a judging pass could not judge of one target (`runs.passes`): never left out of a decision."""

    count: int = Field(
        ge=0, description="Answers (or verdicts) it asked for and did not get: errored, unparsed, cut off, missing."
    )
    of: int = Field(ge=0, description="Answers (or verdicts) it asked for.")


def read_results(path: Path) -> list[ResultRecord]:
    """All result records of a finished run directory's results.jsonl, validated (a torn line is an error)."""
    return jsonl.read_records(path, ResultRecord)[0]


def read_attacks(run_dir: Path) -> list[ResultRecord]:
    """A run directory's attack steps (attacks.jsonl), validated; none when the run wrote no such file."""
    path = run_dir / ATTACKS
    return read_results(path) if path.is_file() else []


def read_generations(run_dir: Path) -> list[GenerationRecord]:
    """A run directory's answers (generations.jsonl), validated."""
    return jsonl.read_records(run_dir / GENERATIONS, GenerationRecord)[0]


def read_controls(run_dir: Path) -> list[ControlRecord]:
    """A run directory's verdicts on the control answers; none when the run wrote no such file."""
    path = run_dir / CONTROLS
    return jsonl.read_records(path, ControlRecord)[0] if path.is_file() else []
