"""The MLflow hook: a series is an MLflow run, each checkpoint a run nested under it, with every rate and its
interval (overall and per category) as metrics at the training step, the judge and its validation as params,
the gate's decision and reasons as tags, and report.html as an artifact. A run outside a series is one MLflow
run. The tracking store is MLflow's own setting (`MLFLOW_TRACKING_URI`: a local `sqlite:///...` database, or
a server), the experiment `MLFLOW_EXPERIMENT_NAME` (default diagsafe-local). Each run is found again by what it
is (tag `diagsafe.run`: its run id and the hash of its results), never by where: a hook called twice for a run
logs it once, and a run made again in the same directory (`run --overwrite`) is logged as the new run it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diagsafe_local.hooks import GateEvent, RunEvent, SeriesEvent
from diagsafe_local.runs.summary import Interval, Rate, TargetSummary

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

RUN_TAG = "diagsafe.run"
DIR_TAG = "diagsafe.run_dir"
SERIES_TAG = "diagsafe.series"


def rate_metrics(prefix: str, value: Interval | Rate | None) -> dict[str, float]:
    """A rate and its 95% interval as metrics (nothing where it is not defined)."""
    if value is None:
        return {}
    middle = value.value if isinstance(value, Interval) else value.rate
    named = {prefix: middle, f"{prefix}_ci_low": value.ci_low, f"{prefix}_ci_high": value.ci_high}
    return {k: float(v) for k, v in named.items() if v is not None}


def target_metrics(stats: TargetSummary) -> dict[str, float]:
    """Every rate of a checkpoint's target, with its interval; categories as asr/<category>."""
    metrics = {
        **rate_metrics("asr", stats.asr),
        **rate_metrics("harmful_rate", stats.harmful_rate),
        **rate_metrics("over_refusal_rate", stats.over_refusal_rate),
        "failure_rate": stats.failure_rate,
        "n_judged": float(stats.n_judged),
    }
    if stats.attack is not None:
        metrics |= rate_metrics("attack_success_rate", stats.attack.attack_success_rate)
    for category, group in stats.by_category.items():
        metrics |= rate_metrics(f"asr/{_key(category)}", group.asr)
    return metrics


def _key(text: str) -> str:
    """A name MLflow accepts in a metric key (letters, digits, _-./ and space)."""
    return "".join(c if c.isalnum() or c in "_-. " else "_" for c in text) or "_"


class MlflowHook:
    name = "mlflow"
    description = "MLflow: a run per checkpoint nested under its series, rates at the training step, report.html"

    def _client(self) -> tuple[MlflowClient, str]:
        import mlflow
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "diagsafe-local")
        experiment = mlflow.get_experiment_by_name(name)
        return client, experiment.experiment_id if experiment else client.create_experiment(name)

    def _find(self, client: MlflowClient, experiment: str, tag: str, value: str) -> Any:
        escaped = value.replace("'", "\\'")
        found = client.search_runs([experiment], filter_string=f"tags.`{tag}` = '{escaped}'", max_results=1)
        return found[0] if found else None

    def _series_run(self, client: MlflowClient, experiment: str, series_dir: Path) -> str:
        found = self._find(client, experiment, SERIES_TAG, str(series_dir.resolve()))
        if found is not None:
            return str(found.info.run_id)
        run = client.create_run(
            experiment, run_name=f"series {series_dir.name}", tags={SERIES_TAG: str(series_dir.resolve())}
        )
        client.set_terminated(run.info.run_id)
        return str(run.info.run_id)

    def _checkpoint_run(self, client: MlflowClient, experiment: str, event: RunEvent) -> str:
        """The MLflow run of a verified run: found by its key, or made and logged once."""
        found = self._find(client, experiment, RUN_TAG, event.key)
        if found is not None:
            return str(found.info.run_id)
        tags = {RUN_TAG: event.key, DIR_TAG: str(event.run_dir.resolve())}
        series = event.series_dir
        if series is not None:
            parent = self._series_run(client, experiment, series)
            tags["mlflow.parentRunId"] = parent
        run_id = str(client.create_run(experiment, run_name=event.run_dir.name, tags=tags).info.run_id)
        step = event.step or 0
        for target, stats in event.summary.targets.items():
            prefix = "" if len(event.summary.targets) == 1 else f"{_key(target)}/"
            for key, value in target_metrics(stats).items():
                client.log_metric(run_id, prefix + key, value, step=step)
                if series is not None:
                    client.log_metric(parent, prefix + key, value, step=step)  # the series' curve in one chart
        judge = event.manifest.judge
        params: dict[str, str | None] = {
            "run_id": event.manifest.run_id,
            "dataset": event.manifest.dataset.spec,
            "dataset_sha256": event.manifest.dataset.sha256,
            "judge_rubric": judge.rubric if judge else "unknown",
            "judge_model": (judge.model if judge else None) or "none",
            "judge_model_hash": (judge.model_hash if judge else None) or "none",
        }
        validation = event.summary.judge_validation
        if validation is not None:
            params |= {"judge_validation": validation.directory, "judge_fpr": str(validation.fpr_measured),
                       "judge_fnr": str(validation.fnr_measured)}  # fmt: skip
        for name, param in params.items():
            client.log_param(run_id, name, str(param)[:6000])
        if step:
            client.set_tag(run_id, "diagsafe.step", str(step))
        report = event.run_dir / "report.html"
        if report.is_file():
            client.log_artifact(run_id, str(report))
        client.set_terminated(run_id)
        return run_id

    def on_run_end(self, event: RunEvent) -> None:
        client, experiment = self._client()
        self._checkpoint_run(client, experiment, event)

    def on_gate(self, event: GateEvent) -> None:
        client, experiment = self._client()
        run_id = self._checkpoint_run(client, experiment, event.run)
        outcome = event.decision.outcome
        client.set_tag(run_id, "gate.decision", outcome)
        client.set_tag(run_id, "gate.reasons", "\n".join(event.decision.lines)[:5000])
        client.log_metric(run_id, "gate_passed", float(outcome == "pass"), step=event.run.step or 0)

    def on_series_update(self, event: SeriesEvent) -> None:
        client, experiment = self._client()
        parent = self._series_run(client, experiment, event.series_dir)
        for _, run in event.runs():
            self._checkpoint_run(client, experiment, run)
        first = event.figures.first_regression
        client.set_tag(parent, "diagsafe.first_regression_step", str(first.step) if first else "none")


HOOK = MlflowHook()
