"""diagsafe-local: offline harmfulness evaluation of LLM checkpoints, and the HarmMetric Eval benchmark.

The Python API mirrors the CLI (see `diagsafe_local.api`)::

    import diagsafe_local as ds

    result = ds.evaluate("configs/checkpoint_7b_qwen_judge.yaml", target="/ckpt/step-1200", output_dir="runs/1200")
    decision = result.gate(max_asr=0.05)

Names load on first use, so importing the package stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "evaluate": "diagsafe_local.api",
    "gate": "diagsafe_local.api",
    "RunResult": "diagsafe_local.api",
    "gate_policy": "diagsafe_local.api",
    "PolicyDecision": "diagsafe_local.runs.policy",
    "series_report": "diagsafe_local.api",
    "SeriesFigures": "diagsafe_local.runs.series",
    "SafetyEvalCallback": "diagsafe_local.integrations.transformers",
    "GateDecision": "diagsafe_local.runs.gate",
    "DiagsafeError": "diagsafe_local.core.errors",
    "RunFailed": "diagsafe_local.core.errors",
    "RunConfig": "diagsafe_local.evaluation.config",
    "load_config": "diagsafe_local.evaluation.config",
    "Run": "diagsafe_local.evaluation.pipeline",
    "create_engine": "diagsafe_local.engines",
    "JUDGES": "diagsafe_local.judging",
    "METRICS": "diagsafe_local.metrics",
    "PROMPT_SETS": "diagsafe_local.evaluation.prompt_sets",
    "load_dataset": "diagsafe_local.benchmark.dataset",
    "effectiveness": "diagsafe_local.benchmark.scoring",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'diagsafe_local' has no attribute '{name}'")
