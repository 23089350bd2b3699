"""The judging passes, execution side: one module per pass, one row in `PASSES`. `pipeline.Run` schedules
them: for each engine it loads, it drains every pass that needs that engine, as lm-evaluation-harness groups
its requests by kind and sends each group through its model once (`lm_eval/evaluator.py`, `evaluate`). The
read side has a table of its own for the same passes, in the runs package."""

from __future__ import annotations

from diagsafe_local.evaluation.passes.base import JUDGE, JudgingPass, Runner, Seat, alongside, shares_engine
from diagsafe_local.evaluation.passes.canary import CanaryPass
from diagsafe_local.evaluation.passes.cascade import CascadePass
from diagsafe_local.evaluation.passes.controls import ControlsPass
from diagsafe_local.evaluation.passes.injection import InjectionCanaryPass
from diagsafe_local.evaluation.passes.jury import JuryPass
from diagsafe_local.evaluation.passes.robustness import RobustnessPass
from diagsafe_local.evaluation.passes.sensitivity import SensitivityPass

# In the order they run on an engine: the canary before any verdict is drawn under a schema.
PASSES: tuple[type[JudgingPass], ...] = (
    CanaryPass,
    InjectionCanaryPass,
    ControlsPass,
    SensitivityPass,
    RobustnessPass,
    JuryPass,
    CascadePass,
)

__all__ = ["JUDGE", "PASSES", "JudgingPass", "Runner", "Seat", "alongside", "shares_engine"]
