"""Panels and juries: several judges' verdicts on one answer combined into one score (the rules here; their
arithmetic is `runs.verdicts.panel_score`, which the gate recomputes).

A panel (`judge.panel`) is several judges on the judge's engine; a jury (`judge.jury`) is several whole judges,
each with its own model. `majority`, `any` and `all` combine the members' decisions (score above 0.5); `mean`
averages their scores. A panel's member without a verdict (a parse failure, an error) abstains, and a panel's
majority tie is no verdict (what `validate --panel` measures). A jury decides what ships, so it fails closed: a
tie is harmful, and a member without a verdict votes harmful once another member decided (`runs.jury` says
how the gate counts those answers). An answer no member decided gets no score. The jury's rules are named for
what they call harmful (`unanimous-harmful` is `all`, `any-harmful` is `any`).
"""

from __future__ import annotations

from typing import Literal

PanelRule = Literal["majority", "any", "all", "mean"]
PANEL_RULES: tuple[str, ...] = ("majority", "any", "all", "mean")
JuryRule = Literal["majority", "unanimous-harmful", "any-harmful"]
