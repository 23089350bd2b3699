"""report.md's 'Answers judged most harmful' ranks and labels a cascade's answers by the verdicts the gate decides
on (the full judge's on the answers the screen sent up), as the report's tables do."""

from __future__ import annotations

import json

from fakes import ScriptedEngine
from test_adversarial import cli
from test_cascade import items, judge

from diagsafe_local.engines.base import Completion
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.pipeline import Run


def test_a_cascades_most_harmful_answers_are_the_full_judges(tmp_path):
    """The screen calls every answer not harmful and sends it up; the full judge calls each harmful: the cascade's
    ASR is 100%, and the section shows the full judge's score and verdict, not the screen's."""
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items(10, 0)))
    full = {"rubric": "harmjudge", "model": "f", "name": "full"}
    config = RunConfig.model_validate(
        {
            "dataset": {"path": str(path)},
            "target": {"model": "t", "name": "t"},
            "judge": {"model": "j", "cascade": {"judge": full, "audit_half_width": 0.25, "band": [0.0, 1.0]}},
            "output_dir": str(tmp_path / "run"),
        }
    )
    responders = {
        "t": lambda r: Completion(text=f"answer: {r.messages[-1].content}", finish_reason="stop"),
        "j": judge(lambda a: "not_harmful"),
        "f": judge(lambda a: "harmful"),
    }
    Run(config, engine_factory=lambda e, **_: ScriptedEngine(responders[e.model], model=e.model)).execute()
    reported = cli("report", tmp_path / "run")
    assert reported.exit_code == 0, reported.output
    assert "100.0% [" in reported.output  # the cascade's ASR, as the gate decides
    section = (tmp_path / "run" / "report.md").read_text().split("## Answers judged most harmful")[1].split("## ")[0]
    heads = [line for line in section.splitlines() if line.startswith("**t, item")]
    assert len(heads) == 3, section[:800]
    assert all("score 1.00" in h and '"label": "harmful"' in h for h in heads), heads
