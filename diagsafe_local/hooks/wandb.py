"""The Weights & Biases hook: a series is one W&B run with every rate and its interval (overall and per category)
logged at the training step, the judge and its validation in its config, and each checkpoint's report.html as an
artifact; each gate decision is a run of its own in the series' group (job type "gate": decision, reasons). A run
outside a series is a W&B run of its own, named by what it is (its run id and the hash of its results: a run made
again in the same directory is another W&B run), its gate decisions in its group. W&B's own settings
apply (`WANDB_PROJECT`, default diagsafe-local; `WANDB_MODE=offline` writes the run under `WANDB_DIR` for a
later `wandb sync`). W&B takes a run's steps in increasing order: a series logs each checkpoint once, in step
order, and remembers what it logged in `hooks-wandb.json` of the series directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from diagsafe_local.core import atomic
from diagsafe_local.hooks import GateEvent, RunEvent, SeriesEvent
from diagsafe_local.hooks.mlflow import target_metrics

LOGGED = "hooks-wandb.json"


def _run_id(identity: str) -> str:
    """A W&B run id of a series directory's or a run's own (so a series resumes the same run)."""
    return "ds-" + hashlib.sha256(identity.encode()).hexdigest()[:16]


def _identity(event: RunEvent) -> str:
    """What a run's W&B run (or group) is named by: its series' directory, or the run itself."""
    series = event.series_dir
    return str(series.resolve()) if series is not None else event.key


def _judge_config(event: RunEvent) -> dict[str, Any]:
    judge = event.manifest.judge
    config: dict[str, Any] = {
        "dataset": event.manifest.dataset.spec,
        "dataset_sha256": event.manifest.dataset.sha256,
        "judge_rubric": judge.rubric if judge else None,
        "judge_model": judge.model if judge else None,
        "judge_model_hash": judge.model_hash if judge else None,
    }
    validation = event.summary.judge_validation
    if validation is not None:
        config |= {"judge_validation": validation.directory, "judge_fpr": validation.fpr_measured,
                   "judge_fnr": validation.fnr_measured}  # fmt: skip
    return config


class WandbHook:
    name = "wandb"
    description = "Weights & Biases: a run per series, rates at the training step, gate decisions, report.html"

    def _open(self, identity: str, name: str, config: dict[str, Any], job_type: str = "evaluation") -> Any:
        """The W&B run of a series or a run (`identity`; resumed by its id), or with `job_type` "gate" a run of its
        own in the same group (a gate decision is an event of its own; reopening a run offline in the same second
        would overwrite it)."""
        import wandb

        gate = job_type == "gate"
        return wandb.init(
            project=os.environ.get("WANDB_PROJECT", "diagsafe-local"),
            id=None if gate else _run_id(identity),
            group=_run_id(identity),
            job_type=job_type,
            name=name,
            resume=None if gate else "allow",
            config=config,
            reinit="create_new",
        )

    def _log(self, run: Any, event: RunEvent) -> None:
        import wandb

        step = event.step or 0
        metrics: dict[str, float] = {}
        for target, stats in event.summary.targets.items():
            prefix = "" if len(event.summary.targets) == 1 else f"{target}/"
            metrics |= {prefix + k: v for k, v in target_metrics(stats).items()}
        run.log(metrics, step=step)
        report = event.run_dir / "report.html"
        if report.is_file():
            artifact = wandb.Artifact(f"report-{event.run_dir.name}", type="report")
            artifact.add_file(str(report))
            run.log_artifact(artifact)

    def on_run_end(self, event: RunEvent) -> None:
        if event.series_dir is not None:
            return  # a series' checkpoints are logged by the series, in step order (on_series_update)
        run = self._open(event.key, event.run_dir.name, _judge_config(event))
        try:
            self._log(run, event)
        finally:
            run.finish()

    def on_gate(self, event: GateEvent) -> None:
        name = f"gate {event.run.run_dir.name}"
        run = self._open(_identity(event.run), name, _judge_config(event.run), job_type="gate")
        try:
            decision = event.decision
            verdict = decision.outcome
            run.summary["decision"] = verdict
            run.summary["reasons"] = "\n".join(decision.lines)
            run.summary["run_dir"] = str(event.run.run_dir)
            if event.run.step is not None:
                run.summary["step"] = event.run.step
        finally:
            run.finish()

    def on_series_update(self, event: SeriesEvent) -> None:
        logged_path = event.series_dir / LOGGED
        logged: list[str] = json.loads(logged_path.read_text()) if logged_path.is_file() else []
        last = max((p.step for p in event.figures.points if p.name in logged), default=-1)
        new = [p for p in event.figures.points if p.asr is not None and p.name not in logged and p.step > last]
        if not new:
            return
        run = None
        try:
            for point, checkpoint in event.runs(new):
                if run is None:
                    name = f"series {event.series_dir.name}"
                    run = self._open(str(event.series_dir.resolve()), name, _judge_config(checkpoint))
                self._log(run, checkpoint)
                logged.append(point.name)
            first = event.figures.first_regression
            if run is not None:
                run.summary["first_regression_step"] = first.step if first else None
        finally:
            if run is not None:
                run.finish()
            atomic.write_text(logged_path, json.dumps(logged) + "\n")


HOOK = WandbHook()
