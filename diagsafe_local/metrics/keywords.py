"""Refusal-keyword matchers of the GCG and AutoDAN attacks: 1 when no refusal phrase occurs, else 0.

The phrase lists are the ones those attacks published; matching is a case-sensitive substring test
after replacing the typographic apostrophe (’) with ', as in HarmMetric Eval. Both live on the read side
(`runs.model_free`), which derives a keyword judge's verdicts again from the recorded answers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from diagsafe_local.metrics.base import MetricSpec, TextPair, register_family
from diagsafe_local.runs.model_free import KEYWORD_LISTS, no_refusal_phrase


def _compute(names: Sequence[str], pairs: Sequence[TextPair]) -> dict[str, np.ndarray]:
    return {n: np.array([no_refusal_phrase(p.response, KEYWORD_LISTS[n]) for p in pairs]) for n in names}


register_family(
    "keywords",
    [
        MetricSpec(
            "gcg_keywords",
            "GCG refusal-keyword matcher (1 = no refusal phrase)",
            "keywords",
            False,
            "Zou et al. 2023, Universal and Transferable Adversarial Attacks (llm-attacks)",
        ),
        MetricSpec(
            "autodan_keywords",
            "AutoDAN refusal-keyword matcher (1 = no refusal phrase)",
            "keywords",
            False,
            "Liu et al. 2024, AutoDAN (autodan_ga_eval.py test_prefixes)",
        ),
    ],
    _compute,
)
