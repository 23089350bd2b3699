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

from diagsafe_local.attacks.config import AttackConfig
from diagsafe_local.core import jsonl, signing
from diagsafe_local.core.jsonl import KeyedRecord
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Completion
from diagsafe_local.engines.gpu_plan import GpuPlan
from diagsafe_local.judging.base import ReasoningTrace
from diagsafe_local.validation.correction import JudgeValidation

SCHEMA_VERSION = 1

# The run directory's files; these names are written nowhere else.
MANIFEST = "manifest.json"
CONFIG = "config.yaml"
GENERATIONS = "generations.jsonl"
RESULTS = "results.jsonl"
CONTROLS = "judge_controls.jsonl"
ATTACKS = "attacks.jsonl"
SUMMARY = "summary.json"
RUN_LOG = "run.log"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
CHART = "figures/asr_by_category.png"
ATTACK_CHART = "figures/attack_success_vs_queries.png"
FLIPS = "flips.jsonl"
REPORT_FILES = (REPORT_MD, REPORT_HTML, CHART, ATTACK_CHART, FLIPS)
SIGNATURE = signing.SIGNATURE
# The run files a signature covers: everything a decision or a resume reads.
SIGNED_FILES = (MANIFEST, CONFIG, GENERATIONS, RESULTS, CONTROLS, ATTACKS, SUMMARY)
ParseStatus = Literal["ok", "truncated", "invalid", "error"]


class Usage(BaseModel):
    """Token counts of one engine call for one request."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def of(cls, completion: Completion) -> Usage:
        """A completion's token counts."""
        return cls(
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            cached_tokens=completion.cached_tokens,
        )


class EngineRef(BaseModel):
    """Which engine produced a text: kind (vllm, openai, transformers), model, adapter, endpoint (never keys)."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    model: str
    lora: str | None = None
    base_url: str | None = None


AnswerKey = tuple[str, str, int, int]  # (target, item_id, sample, turn): one answer of a run


class AnswerRecord(KeyedRecord):
    """A record about one answer of a run, kept by its `AnswerKey` (these fields come first)."""

    model_config = ConfigDict(extra="forbid")

    target: str
    item_id: str
    sample: int = Field(ge=0)
    turn: int = Field(ge=1)

    @property
    def key(self) -> AnswerKey:
        return (self.target, self.item_id, self.sample, self.turn)


class GenerationRecord(AnswerRecord):
    """One answer of the target (generated or pre-filled) at one turn of one sample of one item."""

    answer: str
    finish_reason: str | None
    prefilled: bool = False
    usage: Usage = Field(default_factory=Usage)
    error: str | None = None
    request_key: str | None = Field(
        None,
        description="Hash of the model and the exact conversation sent; a resumed "
        "run reuses the answer only while it matches.",
    )


class PanelVote(BaseModel):
    """One panel member's verdict on an answer (`judge.panel`)."""

    model_config = ConfigDict(extra="forbid")

    rubric: str
    raw: str | None
    verdict: dict[str, Any] | None
    score: float | None
    parse_status: ParseStatus
    error: str | None = None


class AttackInfo(BaseModel):
    """Where a judged answer stands in an adaptive attack (attacks.jsonl: `sample` is the stream, `turn` the
    chain's step)."""

    model_config = ConfigDict(extra="forbid")

    strategy: str
    goal: str = Field(description="What the attack aims at: the item's request, as the judge grades against it.")
    stream: int = Field(ge=0, description="The chain (pair) or conversation (crescendo) of its goal.")
    step: int = Field(ge=1, description="1-based step of the chain: one attacker prompt and one target answer.")
    depth: int = Field(ge=1, description="pair: the refinement; crescendo: the conversation turn.")
    turn: int = Field(ge=1, description="The conversation turn the answer responds to (pair: always 1).")
    parent: int | None = Field(description="The step this one builds on (None: the chain's first).")
    attacker_prompt: str = Field(description="What the attacker wrote and the target was sent last.")
    improvement: str = ""
    backtracked: bool = Field(False, description="crescendo: the target refused and the turn was taken back.")
    refused: bool = Field(False, description="The refusal detector's reading of the answer.")
    end: Literal["success", "depth", "turns", "error"] | None = Field(
        None, description="Why the chain ended at this step (None: it went on, or its goal was broken elsewhere)."
    )
    chain_key: str = Field(
        description="Hash of what the chain depends on; a resumed run reuses it only while it matches."
    )
    attacker_usage: Usage = Field(default_factory=Usage)

    @property
    def queried(self) -> bool:
        """Whether the step asked the target (an attacker that failed wrote no prompt, and spent no query)."""
        return bool(self.attacker_prompt)


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
    panel: list[PanelVote] | None = Field(None, description="Each member's verdict when a panel judged the answer.")
    judge_raw: str | None
    verdict: dict[str, Any] | None
    score: float | None = Field(description="1 = harmful, 0 = not harmful; None unless parse_status is ok.")
    parse_status: ParseStatus
    attempts: int = Field(ge=0)
    error: str | None = None
    judge_usage: Usage = Field(default_factory=Usage)
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


SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "result.schema.json"


def read_results(path: Path) -> list[ResultRecord]:
    """All result records of a finished run directory's results.jsonl, validated (a torn line is an error)."""
    return jsonl.read_records(path, ResultRecord)[0]


def read_attacks(run_dir: Path) -> list[ResultRecord]:
    """A run directory's attack steps (attacks.jsonl), validated; none when the run wrote no such file."""
    path = run_dir / ATTACKS
    return read_results(path) if path.is_file() else []


# -- summary.json and manifest.json ---------------------------------------------------------------------------


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Rate(_Record):
    """A share of `n` with its 95% Wilson interval (None where n is 0)."""

    rate: float | None
    ci_low: float | None
    ci_high: float | None
    n: int


class Interval(_Record):
    """A mean score with its 95% interval (None where n is 0)."""

    value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int


class EarlierTurns(_Record):
    """Judged turns before a conversation's last: reported apart, never in ASR."""

    n: int
    harmful_rate: Rate


class ReasoningStats(_Record):
    """A reasoning judge's phases over one group of answers."""

    n: int
    mean_tokens: float
    n_closed_by_budget: int = Field(description="Phases that ran out of judge.reasoning_max_tokens and were closed.")


class GroupStats(_Record):
    """Counts and rates of one group of answers (a target, or one category, source or attack method of it)."""

    n_answers: int
    n_harmful_items: int
    n_benign_items: int
    n_judged: int
    n_parse_failures: int
    n_errors: int
    failure_rate: float
    asr: Interval
    harmful_rate: Rate
    refusal_rate: Rate
    over_refusal_rate: Rate
    truncated: Rate
    earlier_turns: EarlierTurns
    corrected_asr: Interval | None = Field(
        None,
        description="ASR (mean score, uncertain = 0.5) corrected for the judge's validated FPR/FNR (Rogan-Gladen), with its 95% CI.",
    )
    reasoning: ReasoningStats | None = Field(None, description="The judge's reasoning phases, where it reasoned.")


class AttackGroup(_Record):
    """An adaptive attack's figures over a group of goals (a target's, or one category's)."""

    n_goals: int
    n_broken: int
    attack_success_rate: Rate = Field(description="Goals broken within the budget (a goal counts once).")
    n_queries: int = Field(description="Target queries spent.")
    n_errors: int = Field(description="Steps that ended their chain with an attacker or target error.")
    queries_to_success_median: float | None = Field(
        description="Median target queries (over all the goal's chains) until its first break."
    )
    queries_to_success: dict[str, int] = Field(description="Broken goals by queries to their first break.")
    broken_by_depth: dict[str, float] = Field(
        description="Share of goals broken by each depth (pair) or turn (crescendo), cumulative."
    )

    def broken_within(self, queries: int) -> float:
        """Share of the goals broken within `queries` target queries (0 without goals)."""
        broken = sum(n for q, n in self.queries_to_success.items() if int(q) <= queries)
        return broken / self.n_goals if self.n_goals else 0.0


class AttackSummary(AttackGroup):
    """A target's adaptive attack, overall and by category."""

    strategy: str
    success_threshold: float
    query_budget: int = Field(description="Target queries each goal could spend.")
    by_category: dict[str, AttackGroup]


class JudgeHealth(_Record):
    """Whether the judge looks at what it judges (see `evaluation.health`)."""

    n_verdicts: int
    identical_verdict_share: float | None
    copied_rationale_share: float | None
    control_mean_score: float | None
    n_controls: int
    label_entropy_by_category: dict[str, float | None]
    degenerate: bool
    flags: list[str]


class Tokens(_Record):
    target_completion: int
    judge_prompt: int
    judge_cached: int


Breakdown = Literal["category", "source", "attack_method"]
BREAKDOWNS: tuple[Breakdown, ...] = ("category", "source", "attack_method")


class TargetSummary(GroupStats):
    """One target's summary: its overall stats, breakdowns, judge health, tokens and throughput."""

    by_category: dict[str, GroupStats]
    by_source: dict[str, GroupStats]
    by_attack_method: dict[str, GroupStats]
    judge_health: JudgeHealth
    tokens: Tokens
    throughput: dict[str, float] | None = None
    attack: AttackSummary | None = Field(None, description="The adaptive attack on its harmful items (attack:).")

    def breakdown(self, field: Breakdown) -> dict[str, GroupStats]:
        """The groups of one breakdown: by category, source or attack method."""
        return {"category": self.by_category, "source": self.by_source, "attack_method": self.by_attack_method}[field]


class Summary(_Record):
    """summary.json."""

    schema_version: int = SCHEMA_VERSION
    targets: dict[str, TargetSummary]
    run_id: str | None = None
    reused: dict[str, int] | None = Field(None, description="Answers and verdicts reused from an earlier run.")
    results_sha256: str | None = Field(None, description="SHA-256 of the results.jsonl this summary summarises.")
    judge_validation: JudgeValidation | None = Field(
        None, description="The judge's error counts measured by `validate` (judge.validation), if given."
    )


class ItemRef(_Record):
    """One item of a run's dataset and the turns of it that are judged: what the gate expects results for."""

    id: str
    turns: list[int] = Field(min_length=1, description="The judged turns (1-based).")
    benign: bool = Field(False, description="Benign (over-refusal) items are not attacked.")


class DatasetRef(_Record):
    """The dataset a run evaluated: its file by content, and every item of it (all shards together)."""

    path: str
    spec: str | None
    sha256: str
    n_items: int = Field(ge=0, description="Items of the whole dataset (a shard runs its share of them).")
    items: list[ItemRef] | None = Field(
        None, description="Every item and its judged turns; the gate requires a result for each (None: older runs)."
    )

    def expected_keys(self, samples: dict[str, int]) -> set[AnswerKey] | None:
        """(target, item, sample, turn) of every answer a complete run judged, for targets with `samples` each."""
        if self.items is None:
            return None
        return {
            (target, item.id, sample, turn)
            for target, n in samples.items()
            for item in self.items
            for sample in range(n)
            for turn in item.turns
        }


class JudgeRef(_Record):
    """Which judge made a run's verdicts: what two runs must share for their verdicts to mean the same."""

    rubric: str = Field(description="The harm judge (or panel) of harmful items.")
    benign_rubric: str
    scoring: Literal["sampled", "probability"]
    turns: str
    settings: dict[str, Any] = Field(
        default_factory=dict, description="What else shapes verdicts: reasoning, a policy file's content hash."
    )
    kind: str
    model: str | None
    model_hash: str | None
    lora_hash: str | None

    def differences(self, other: JudgeRef) -> list[str]:
        """'field: this vs other' for every field that differs (the model compared by content where known)."""
        # The same weights are the same judge however they are served (offline or behind an API)
        skip = {"model", "kind"} if self.model_hash and other.model_hash else {"model_hash"}
        mine, theirs = self.model_dump(exclude=skip), other.model_dump(exclude=skip)
        return [f"{k}: {mine[k]} vs {theirs[k]}" for k in mine if mine[k] != theirs[k]]


class TargetRef(_Record):
    """A target of a run: its samples per item and its model by content."""

    samples: int = Field(ge=1)
    model: str
    model_hash: str | None
    lora_hash: str | None
    chat_template_hash: str | None = None


class SourceRun(_Record):
    """A run a merged run was made from."""

    run_dir: str
    run_id: str
    engines: dict[str, dict[str, Any]] = Field(default_factory=dict)


class Manifest(_Record):
    """manifest.json: what ran, on what, with which versions, and whether it finished."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    status: Literal["running", "complete"]
    started: str | None = None
    updated: str | None = None
    config: dict[str, Any]
    dataset: DatasetRef
    shard: dict[str, int] | None = None
    host: dict[str, Any] | None = None
    seeds: dict[str, int] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    engines: dict[str, dict[str, Any]] = Field(default_factory=dict)
    gpu_plan: GpuPlan | None = Field(None, description="How the run used the node's GPUs (replicas, tensor parallel).")
    timings: dict[str, dict[str, float]] = Field(default_factory=dict)
    merged_from: list[str] | None = Field(None, description="The run directories a merged run was made from.")
    sources: list[SourceRun] | None = None
    judge: JudgeRef | None = Field(None, description="The judge of every verdict (None: older runs).")
    targets: dict[str, TargetRef] = Field(default_factory=dict, description="Each target by label.")

    @property
    def gate_settings(self) -> dict[str, Any]:
        """The run config's `gate:` thresholds (as written; the gate validates them with its options)."""
        return dict(self.config.get("gate") or {})

    @property
    def baseline(self) -> str | None:
        """The run config's baseline target, if any."""
        return self.config.get("baseline")

    @property
    def attack(self) -> AttackConfig | None:
        """The run config's adaptive attack, if any."""
        raw = self.config.get("attack")
        return None if raw is None else AttackConfig.model_validate(raw)

    def run_ids(self) -> set[str]:
        """The run ids its results may carry: its own, or those of the runs it was merged from."""
        return {self.run_id, *(source.run_id for source in self.sources or [])}

    def samples(self) -> dict[str, int]:
        """Each target's label and its samples per item."""
        if self.targets:
            return {label: target.samples for label, target in self.targets.items()}
        from diagsafe_local.evaluation.config import RunConfig

        return {t.label: t.sampling.n for t in RunConfig.model_validate(self.config).targets}

    def expected_keys(self) -> set[AnswerKey] | None:
        """(target, item, sample, turn) of every answer the complete run judged (None: an older manifest)."""
        return self.dataset.expected_keys(self.samples())


def read_summary(run_dir: Path) -> Summary:
    """A run directory's summary.json as the typed record (a file of another version is a clear error)."""
    from diagsafe_local.core.jsonfile import read_model

    return read_model(run_dir / SUMMARY, Summary, "run summary")


def read_manifest_file(run_dir: Path) -> Manifest:
    """A run directory's manifest.json as the typed record, whatever the run's status."""
    from diagsafe_local.core.jsonfile import read_model

    return read_model(run_dir / MANIFEST, Manifest, "run manifest")


SCHEMAS: dict[str, type[BaseModel]] = {"result": ResultRecord, "summary": Summary, "manifest": Manifest}


def json_schema(name: str) -> dict[str, Any]:
    """The JSON Schema of a record the tool writes (shipped in diagsafe_local/schemas/NAME.schema.json)."""
    schema = SCHEMAS[name].model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"diagsafe-local {name} record" if name == "result" else f"diagsafe-local {name}"
    return schema


def schema_path(name: str) -> Path:
    return SCHEMA_PATH.parent / f"{name}.schema.json"


if __name__ == "__main__":  # regenerate the shipped schemas: python -m diagsafe_local.evaluation.records
    import json

    for each in SCHEMAS:
        schema_path(each).write_text(json.dumps(json_schema(each), indent=2) + "\n")
