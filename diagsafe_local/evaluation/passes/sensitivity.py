"""Judge sensitivity, a pass (`evaluation.sensitivity_step`): each target's sample judged again under every
paraphrase on the judge's engine, once that target's own verdicts are in."""

from __future__ import annotations

from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.config import RunConfig, TargetConfig
from diagsafe_local.evaluation.passes.base import JudgingPass, Runner
from diagsafe_local.evaluation.sensitivity_step import judge_sensitivity, pending_sensitivity


def _pending(run: Runner, target: TargetConfig) -> list[tuple]:
    return pending_sensitivity(run.ctx, target.label, target.sampling.n, run.dataset.items or [])


class SensitivityPass(JudgingPass):
    """The paraphrase verdicts not yet judged (or errored), target by target."""

    name = "judge sensitivity"

    @classmethod
    def cost(cls, config: RunConfig) -> str | None:
        settings = config.judge.sensitivity
        if settings is None:
            return None
        extra = settings.variants * settings.sample * (2 if settings.over_refusal else 1)
        return (
            f"judge sensitivity: {settings.variants} paraphrases x {settings.sample} answers"
            + (" of harmful items and as many of benign ones (over-refusal)" if settings.over_refusal else "")
            + f" = up to {extra} more verdicts per target ({extra * len(config.targets)} in all), one process"
        )

    def needs_judge(self, run: Runner) -> bool:
        return any(_pending(run, target) for target in run.config.targets)

    def target_judged(self, run: Runner, engine: Engine | None, target: TargetConfig) -> None:
        if engine is None:  # a judge without a model has no paraphrases (the config allows none)
            return
        pending = _pending(run, target)
        if pending:
            judge_sensitivity(engine, run.ctx, target.label, pending)
