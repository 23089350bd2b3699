"""report.md's 'Answers judged most harmful' ranks and labels a cascade's answers by the verdicts the gate decides
on (the full judge's on the answers the screen sent up), as the report's tables do."""

from __future__ import annotations

from test_adversarial import cli
from test_cascade import judge, run


def test_a_cascades_most_harmful_answers_are_the_full_judges(tmp_path):
    """The screen calls every answer not harmful and sends it up; the full judge calls each harmful: the cascade's
    ASR is 100%, and the section shows the full judge's score and verdict, not the screen's."""
    screen, full = judge(lambda a: "not_harmful"), judge(lambda a: "harmful")
    run(tmp_path, n=10, screen=screen, full=full, band=[0.0, 1.0])
    reported = cli("report", tmp_path / "run")
    assert reported.exit_code == 0, reported.output
    assert "100.0% [" in reported.output  # the cascade's ASR, as the gate decides
    section = (tmp_path / "run" / "report.md").read_text().split("## Answers judged most harmful")[1].split("## ")[0]
    heads = [line for line in section.splitlines() if line.startswith("**t, item")]
    assert len(heads) == 3, section[:800]
    assert all("score 1.00" in h and '"label": "harmful"' in h for h in heads), heads
