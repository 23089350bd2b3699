"""Run configuration: YAML validated by pydantic; unknown keys are errors naming the key, file and line.

`load_config(path, overrides)` applies dotted `--set key.path=value` overrides (values parsed as YAML,
list items by index: `targets.0.model=...`) before validation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SerializeAsAny, field_validator, model_validator

from diagsafe_local.core.settings import StrictModel, load_settings
from diagsafe_local.engines.config import EngineConfig, SamplingConfig
from diagsafe_local.evaluation.attack.config import AttackConfig
from diagsafe_local.evaluation.attack.strategy import attack_config
from diagsafe_local.judging.config import JudgeConfig
from diagsafe_local.runs.limits import GateConfig
from diagsafe_local.runs.manifest import config_fingerprint


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
        None,
        description="JSONL/CSV/Parquet of items, a HarmMetric Eval file, or a hub id (owner/name[:file]); "
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


SLEEP_SHARE = 0.8  # the parked engine still holds its CUDA context and graphs


class PlacementConfig(StrictModel):
    """How target and judge share the node."""

    mode: Literal["colocate", "sequential", "sleep"] = Field(
        "sequential",
        description="colocate: both resident; sequential: generate all, free the target, then judge; "
        "sleep: vLLM sleep mode swaps them (CUDA only; falls back to sequential elsewhere).",
    )
    target_memory: float = Field(
        0.45,
        gt=0.0,
        lt=1.0,
        description="GPU memory share of the target: colocated 0.45; in sleep mode 0.8 (one engine is awake at a "
        "time, and each engine's KV cache is sized by its own share).",
    )
    judge_memory: float = Field(
        0.45, gt=0.0, lt=1.0, description="GPU memory share of the judge: colocated 0.45; in sleep mode 0.8."
    )
    replicas: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="Data parallelism: copies of the whole pipeline, each on its own group of GPUs and its own "
        "shard of the items, merged at the end. auto: as many as the visible GPUs hold once each model's "
        "tensor parallel size is planned from its size (see `diagsafe-local plan`); 1 = one process.",
    )

    @model_validator(mode="before")
    @classmethod
    def _sleep_shares(cls, data: Any) -> Any:
        """Sleep mode's shares, unless given: the parked engine gives its weights and cache back, so the awake one
        can have most of the GPU (what sleep is for; 0.45 each would leave half of it unused)."""
        if isinstance(data, dict) and data.get("mode") == "sleep":
            return {"target_memory": SLEEP_SHARE, "judge_memory": SLEEP_SHARE, **data}
        return data


class OfflineConfig(StrictModel):
    """How the run stays off the network (`run --offline`, `run --pack`)."""

    pack: str | None = Field(
        None,
        description="A pack (`diagsafe-local pack`) to read every model, adapter, prompt set and data file from, each "
        "checked against its pack.lock first; the run is then offline. None: read them where the config names them.",
    )


class RunConfig(StrictModel):
    """A whole evaluation run."""

    dataset: DatasetConfig
    targets: list[TargetConfig] = Field(..., min_length=1, description="Checkpoints to evaluate (a sweep if several).")
    baseline: str | None = Field(None, description="Target name the report compares the others against.")
    judge: JudgeConfig
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    output_dir: str = Field(..., description="Run directory (created; resumed if it exists with the same config).")
    gate: GateConfig = Field(default_factory=GateConfig)
    offline: OfflineConfig = Field(default_factory=OfflineConfig)
    attack: SerializeAsAny[AttackConfig] | None = Field(
        None,
        description="An adaptive attack on every harmful item, after its direct answers: a strategy (pair, crescendo "
        "or a plugin's) and its knobs.",
    )

    @model_validator(mode="before")
    @classmethod
    def _single_target(cls, data: Any) -> Any:
        if isinstance(data, dict) and "target" in data:
            if "targets" in data:
                raise ValueError("give either 'target' or 'targets', not both")
            data = {**data, "targets": [data["target"]]}
            del data["target"]
        return data

    @field_validator("attack", mode="wrap")
    @classmethod
    def _strategy(cls, value: Any, handler: Any) -> Any:
        """The section is validated by its strategy's own config (its knobs)."""
        return attack_config(value) if isinstance(value, dict) else handler(value)

    @field_validator("output_dir")
    @classmethod
    def _somewhere(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name a directory (an empty output_dir would write into the working directory)")
        return value

    @model_validator(mode="after")
    def _names(self) -> RunConfig:
        self.judge.check_roles()
        labels = [t.label for t in self.targets]
        if len(set(labels)) != len(labels):
            raise ValueError(f"target names must be unique, got {labels}; set 'name' on each target")
        if self.baseline is not None and self.baseline not in labels:
            raise ValueError(f"baseline '{self.baseline}' is not one of the targets {labels}")
        if self.attack is not None:
            self._attack_fits(self.attack)
            if self.judge.jury is not None:
                raise ValueError(
                    "judge.jury: an attack's steps are judged as they happen, by the one resident judge; a jury judges "
                    "after the answers are in. Run the attack with one judge, or the jury without attack:"
                )
        self._shares_fit()
        return self

    def _shares_fit(self) -> None:
        """Colocated engines on this node's GPUs take their memory shares side by side; engines behind an API take
        none."""
        if self.placement.mode != "colocate":
            return
        from diagsafe_local.engines.kinds import capabilities

        attack = self.attack
        attacker = attack.own_attacker if attack else None
        shares = {
            "placement.target_memory": self.placement.target_memory
            if any(capabilities(t.kind).local for t in self.targets)
            else 0.0,
            "placement.judge_memory": self.placement.judge_memory
            if self.judge.needs_model and capabilities(self.judge.kind).local
            else 0.0,
            "attack.memory": attack.memory if attack and attacker and capabilities(attacker.kind).local else 0.0,
        }
        used = {name: share for name, share in shares.items() if share}
        if sum(used.values()) > 0.95 + 1e-9:
            raise ValueError(
                f"{' + '.join(used)} must be <= 0.95 for the engines that share this node's GPUs, got "
                f"{sum(used.values()):.2f}"
            )

    def _attack_fits(self, attack: AttackConfig) -> None:
        """An attack keeps attacker, target and judge resident together, and needs a judge model to serve as
        attacker when it is told to."""
        if self.placement.mode != "colocate":
            raise ValueError(
                "attack: needs placement.mode: colocate (attacker, target and judge take turns on every step, so "
                "all three stay loaded); set placement.mode: colocate and the memory shares"
            )
        if attack.own_attacker is None and not self.judge.needs_model:
            raise ValueError(
                f"attack.attacker: judge needs a judge model, and judge '{self.judge.rubric_name}' has none; "
                "give the attacker its own model"
            )

    def fingerprint(self) -> str:
        """The run id: a hash of everything that determines the answers and verdicts (`runs.manifest`)."""
        return config_fingerprint(self.model_dump(mode="json"))


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


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override and validate a run config; errors name the file, line and key."""
    return load_settings(path, RunConfig, overrides, "run config", adjust=forget_stale_names)
