"""Judges made from their names: a policy file's path (`./acme.yaml`), or a reference metric with its threshold
(`rouge1_recall>=0.31`). The judge registry resolves a name it does not hold through `made_on_demand`."""

from __future__ import annotations

from diagsafe_local.core.pack import local_file
from diagsafe_local.judging.base import JUDGES, Judge
from diagsafe_local.judging.metric_judge import metric_judge, parse_metric_judge
from diagsafe_local.judging.policy import load_policy
from diagsafe_local.runs.rederive import looks_like_path


def made_on_demand(name: str) -> tuple[Judge, str] | None:
    """The judge a name describes, with where it came from: a metric with its threshold (the metric's package),
    or a policy file ('file'); None for any other name."""
    if parse_metric_judge(name) is not None:
        from diagsafe_local.metrics import METRICS

        judge = metric_judge(name)
        return judge, METRICS.origin(judge.metric)
    if looks_like_path(name):
        return load_policy(local_file("policy", name)), "file"  # under `run --pack`, the pack's copy
    return None


JUDGES.resolve_with(made_on_demand)
