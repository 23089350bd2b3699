"""manifest.json: what a run ran, on what, with which versions, and whether it finished.

The dataset by content with every item and its judged turns (what the gate requires a result for), the judge,
each target and the attack by what decides their meaning (what runs compared or merged must share), the host,
seeds, versions, the engines loaded, the GPU plan and the timings. `config` is the resolved run config as JSON;
its fingerprint is the run id (`config_fingerprint`), so the read side checks one against the other without
loading any of the code that validates a config.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field

from diagsafe_local.core import atomic
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.core.jsonfile import read_model
from diagsafe_local.runs.files import CONFIG, CONFIG_HEADER, MANIFEST
from diagsafe_local.runs.records import SCHEMA_VERSION, AnswerKey, Record

# The run config's sections that do not decide an answer or a verdict: where the run goes, how the engines are
# placed, what the gate limits, which target the report compares against, and where its files are read from (a
# pack's paths replace the models' own, so a run from a pack has its own id all the same).
NOT_FINGERPRINTED = ("output_dir", "gate", "baseline", "placement", "offline")


def config_fingerprint(config: dict[str, Any]) -> str:
    """The run id: a hash of everything in a resolved config (as JSON) that determines the answers and verdicts
    (not where they go, placement, the gate, or the judge's validation)."""
    payload = {k: v for k, v in config.items() if k not in NOT_FINGERPRINTED}
    if payload.get("attack") is None:  # runs without an attack keep the ids they had before attacks existed
        payload.pop("attack", None)
    # The judge's validation corrects the summary but changes no answer or verdict: adding it to a finished run
    # resumes it (the summary is rewritten), it does not make another run.
    payload["judge"] = {**payload.get("judge", {}), "validation": None}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


class Shard(Record):
    """Shard `index` of `count` (0-based)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(description="This shard's number, from 0.")
    count: int = Field(description="How many shards the dataset is split into.")

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
        if not match or not 0 <= int(match[1]) < int(match[2]):
            raise DiagsafeError(f"--shard expects i/N with 0 <= i < N, got '{text}'")
        return cls(index=int(match[1]), count=int(match[2]))

    def owns(self, item_id: str) -> bool:
        return shard_of(item_id, self.count) == self.index

    def directory(self, output_dir: str | Path) -> Path:
        return Path(output_dir) / "shards" / f"shard-{self.index:04d}-of-{self.count:04d}"


def shard_of(item_id: str, count: int) -> int:
    """The shard (0..count-1) an item id belongs to: a hash, not Python's salted hash()."""
    return int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:8], "big") % count


class ValidationRef(Record):
    """The judge validation a run was corrected with (`judge.validation`), by content: the gate reads the file
    again and uses it only while it is the one the run recorded."""

    directory: str = Field(description="The validation directory, as an absolute path.")
    sha256: str = Field(description="SHA-256 of its validation.json when the run read it.")
    rubric: str = Field(description="The harm judge whose entry the run took from it.")


class EnginePlan(Record):
    """One model's place in the GPU plan."""

    role: str = Field(description="What the engine is for: `target`, `judge`, ...")
    model: str = Field(description="Its model, as configured.")
    weight_bytes: int | None = Field(description="Weights on disk; None when they could not be read.")
    memory_share: float = Field(description="Share of each GPU's memory this engine may use.")
    tensor_parallel_size: int = Field(description="GPUs one copy of the model is split across.")
    pipeline_parallel_size: int = Field(1, description="Pipeline stages (engine_kwargs); GPUs = TP x PP.")

    @property
    def gpus(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


class GpuPlan(Record):
    """Replicas of the pipeline, each on its own group of GPUs (`engines.gpu_plan` makes it)."""

    gpus: int = Field(description="GPUs the run was given.")
    gpu_memory_bytes: int = Field(description="Memory of each GPU.")
    replicas: int = Field(description="Copies of the whole pipeline, each on its own GPUs (data parallel).")
    gpus_per_replica: int = Field(description="GPUs each replica uses.")
    engines: list[EnginePlan] = Field(description="Each engine of a replica and its share.")
    notes: list[str] = Field([], description="Why the plan is as it is, in words.")

    def tensor_parallel(self, role: str) -> int:
        return next((e.tensor_parallel_size for e in self.engines if e.role == role), 1)

    def device_groups(self, visible: Sequence[str]) -> list[str]:
        """CUDA_VISIBLE_DEVICES for each replica, from the devices this process sees."""
        size = self.gpus_per_replica
        return [",".join(visible[k * size : (k + 1) * size]) for k in range(self.replicas)]


class AttackRef(Record):
    """An adaptive attack's rules as the read side needs them: what breaks a goal and when its attack is done."""

    strategy: str = Field(description="The attack strategy (`pair`, `crescendo`, a plugin's).")
    streams: int = Field(ge=1, description="Chains (or conversations) per goal.")
    success_threshold: float = Field(gt=0.5, le=1.0, description="A judge score at or above this breaks the goal.")
    query_budget: int = Field(ge=1, description="Target queries each goal may spend.")

    def breaks(self, score: float | None, error: str | None = None) -> bool:
        """Whether a judged answer breaks its goal: made without error, and scored at or above the threshold."""
        return error is None and score is not None and score >= self.success_threshold


class ItemRef(Record):
    """One item of a run's dataset and the turns of it that are judged: what the gate expects results for."""

    id: str = Field(description="The item's id.")
    turns: list[int] = Field(min_length=1, description="The judged turns (1-based).")
    benign: bool = Field(False, description="Benign (over-refusal) items are not attacked.")
    category: str | None = Field(None, description="Its category (what a sensitivity sample is stratified by).")
    asked: dict[int, str] | None = Field(
        None,
        description="Each judged turn's prompt, hashed (`records.asked_hash` of the user turns up to it): the gate "
        "refuses results that answer anything else (None: older runs).",
    )


class DatasetRef(Record):
    """The dataset a run evaluated: its file by content, and every item of it (all shards together)."""

    path: str = Field(description="The dataset file that was read.")
    spec: str | None = Field(description="What the config named: a prompt set (`dataset.set`) or a path.")
    sha256: str = Field(description="SHA-256 of the dataset file.")
    n_items: int = Field(ge=0, description="Items of the whole dataset (a shard runs its share of them).")
    items: list[ItemRef] | None = Field(
        None, description="Every item and its judged turns; the gate requires a result for each (None: older runs)."
    )

    def expected_keys(self, samples: dict[str, int], owns: Callable[[str], bool] = bool) -> Iterator[AnswerKey]:
        """(target, item, sample, turn) of every answer a complete run judged, for targets with `samples` each,
        of the items `owns` says are the run's (a shard's share), one at a time."""
        mine = [item for item in self.items or [] if owns(item.id)]
        for target, n in samples.items():
            for item in mine:
                for sample in range(n):
                    for turn in item.turns:
                        yield (target, item.id, sample, turn)


class JudgeRef(Record):
    """Which judge made a run's verdicts: what two runs must share for their verdicts to mean the same."""

    rubric: str = Field(description="The harm judge (or panel) of harmful items.")
    benign_rubric: str = Field(description="The judge of benign items (whether the answer refused).")
    scoring: Literal["sampled", "probability"] = Field(
        description="sampled: a verdict decoded; probability: the score is P(Yes) from the first token's logprobs."
    )
    turns: str = Field(description="Which turns are judged (`judge.turns`): the last, or every one.")
    settings: dict[str, Any] = Field(
        default_factory=dict, description="What else shapes verdicts: reasoning, a policy file's content hash."
    )
    kind: str = Field(description="The judge's engine kind.")
    model: str | None = Field(description="The judge's model as configured (None: a judge with no model).")
    model_hash: str | None = Field(description="The judge's weights by content (None: an API model).")
    lora_hash: str | None = Field(description="Its LoRA adapter by content, if any.")
    instructions: dict[str, str] = Field(
        default_factory=dict,
        description="Each judge's own instructions (its system prompt) by name: what judge health reads a copied "
        "rationale against, so the read side needs no judge code.",
    )
    constrained: bool = Field(
        False, description="Whether a model decodes its verdicts under a schema: the run then sends a grammar canary."
    )

    def differences(self, other: JudgeRef) -> list[str]:
        """'field: this vs other' for every field that differs (the model compared by content where known)."""
        # The same weights are the same judge however they are served (offline or behind an API)
        skip = {"model", "kind"} if self.model_hash and other.model_hash else {"model_hash"}
        skip.add("constrained")  # what the judge is, not how it is checked
        mine, theirs = self.model_dump(exclude=skip), other.model_dump(exclude=skip)
        found = [f"{k}: {mine[k]} vs {theirs[k]}" for k in mine if k != "instructions" and mine[k] != theirs[k]]
        changed = sorted(
            k for k in set(self.instructions) & set(other.instructions) if self.instructions[k] != other.instructions[k]
        )
        return found + [f"the instructions of judge {name} differ" for name in changed]


class GrammarCanary(Record):
    """The judge engine's answer to the grammar canary (`judging.canary`): whether it applied the schema."""

    enforced: bool = Field(description="Every canary the run sent came back as its schema's one allowed output.")
    engine: str = Field(description="The engine that answered: kind and versions (vLLM's, or the server's URL).")
    backend: str | None = Field(description="The structured-output backend asked for.")
    reply: str = Field(description="What the engine replied (its head), or its error.")


class TargetRef(Record):
    """A target of a run: its samples per item and its model by content."""

    samples: int = Field(ge=1, description="Answers per item (`samples`).")
    model: str = Field(description="The model as configured: a path (a checkpoint) or a model name.")
    model_hash: str | None = Field(description="The weights by content (None: an API model).")
    lora_hash: str | None = Field(description="Its LoRA adapter by content, if any.")
    chat_template_hash: str | None = Field(None, description="The chat template file by content, if one was given.")


class NetworkPolicy(Record):
    """The network a run allowed itself (`run --offline`: loopback and its API endpoints only)."""

    offline: bool = Field(description="The run ran offline: hubs' offline variables set, other connections refused.")
    endpoints: list[str] = Field(description="The API endpoints (base URLs) the run's models are called at.")
    pack: str | None = Field(
        None, description="SHA-256 of the pack.lock every file was read from (`run --pack`; None: no pack)."
    )


def joined_network(policies: Sequence[NetworkPolicy | None]) -> NetworkPolicy | None:
    """The network of a run several processes wrote (a resumed run, merged shards): offline only where every one
    ran offline, every endpoint any of them called, and their pack where all read the same one (None where one
    recorded none: an older run says nothing of its network)."""
    if any(p is None for p in policies):
        return None
    known = [p for p in policies if p is not None]
    packs = {p.pack for p in known}
    return NetworkPolicy(
        offline=all(p.offline for p in known),
        endpoints=sorted({e for p in known for e in p.endpoints}),
        pack=packs.pop() if len(packs) == 1 else None,
    )


class SourceRun(Record):
    """A run a merged run was made from."""

    run_dir: str = Field(description="The source run's directory.")
    run_id: str = Field(description="Its run id.")
    engines: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Its engines, as its manifest recorded them."
    )


class Manifest(Record):
    """manifest.json: what ran, on what, with which versions, and whether it finished."""

    schema_version: int = Field(SCHEMA_VERSION, description="Version of this file's format.")
    run_id: str = Field(description="Hash of the config that decides the results: every record carries it.")
    status: Literal["running", "complete"] = Field(
        description="complete once every answer is judged and the summary written; the gate refuses a running run."
    )
    started: str | None = Field(None, description="When the run first started (ISO 8601, UTC).")
    updated: str | None = Field(None, description="When this file was last written (ISO 8601, UTC).")
    config: dict[str, Any] = Field(description="The resolved run config.")
    dataset: DatasetRef = Field(description="The dataset by content, and every item the gate requires a result for.")
    shard: Shard | None = Field(None, description="The shard this run is (None: the whole dataset).")
    host: dict[str, Any] | None = Field(None, description="Where it ran: node, SLURM job, GPUs.")
    seeds: dict[str, int] = Field(
        default_factory=dict, description="The sampling seed of each target and of the judge."
    )
    versions: dict[str, str] = Field(
        default_factory=dict,
        description="Versions of diagsafe-local, Python, vLLM, torch, transformers, xgrammar, openai.",
    )
    engines: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Each engine loaded: model, revision or local path with content hash, chat template hash, load time.",
    )
    gpu_plan: GpuPlan | None = Field(None, description="How the run used the node's GPUs (replicas, tensor parallel).")
    timings: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Seconds and rates of each stage, by target (and jury member)."
    )
    merged_from: list[str] | None = Field(None, description="The run directories a merged run was made from.")
    sources: list[SourceRun] | None = Field(
        None, description="The runs a merged run was made from, with their engines."
    )
    judge: JudgeRef | None = Field(None, description="The judge of every verdict (None: older runs).")
    targets: dict[str, TargetRef] = Field(default_factory=dict, description="Each target by label.")
    attack: AttackRef | None = Field(None, description="The adaptive attack's rules (None: no attack).")
    validation: ValidationRef | None = Field(None, description="The judge validation the summary is corrected with.")
    grammar: GrammarCanary | None = Field(
        None, description="The grammar canary's outcome (None: the judge decodes under no schema, or none sent yet)."
    )
    network: NetworkPolicy | None = Field(None, description="The network policy it ran under (None: older runs).")

    @property
    def gate_settings(self) -> dict[str, Any]:
        """The run config's `gate:` thresholds (as written; the gate validates them with its options)."""
        return dict(self.config.get("gate") or {})

    @property
    def baseline(self) -> str | None:
        """The run config's baseline target, if any."""
        return self.config.get("baseline")

    def owns(self, item_id: str) -> bool:
        """Whether an item of the dataset is this run's to answer (a shard's share; every item otherwise)."""
        return self.shard is None or self.shard.owns(item_id)

    def run_ids(self) -> set[str]:
        """The run ids its results may carry: its own, or those of the runs it was merged from."""
        return {self.run_id, *(source.run_id for source in self.sources or [])}

    def samples(self) -> dict[str, int]:
        """Each target's label and its samples per item."""
        return {label: target.samples for label, target in self.targets.items()}

    def expected_keys(self, whole: bool = True) -> Iterator[AnswerKey]:
        """(target, item, sample, turn) of every answer the complete run judged (`whole=False`: a shard's share),
        one at a time; none for an older manifest, which does not list its items (`dataset.items` is None)."""
        return self.dataset.expected_keys(self.samples(), bool if whole else self.owns)


def read_manifest_file(run_dir: Path) -> Manifest:
    """A run directory's manifest.json as the typed record, whatever the run's status."""
    return read_model(run_dir / MANIFEST, Manifest, "run manifest")


def write_config(run_dir: Path, run_id: str, config: dict[str, Any]) -> None:
    """config.yaml: the resolved config, marked as the tool's own (the gate checks it against the manifest)."""
    import yaml

    atomic.write_text(
        run_dir / CONFIG,
        f"{CONFIG_HEADER} {run_id}, as validated with every --set applied; edit the config you ran, not this copy\n"
        + yaml.safe_dump(config, sort_keys=False),
    )


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    """manifest.json (the only writer of the file)."""
    atomic.write_text(run_dir / MANIFEST, manifest.model_dump_json(indent=2) + "\n")
