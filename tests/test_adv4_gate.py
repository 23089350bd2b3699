"""The adversarial review's cascade gate defect (fix round 4): an increase limit on a cascade run is decided on the
cascade's verdicts (the full judge's where the screen sent an answer up), on both sides of the pair, never on the
screen's verdicts in results.jsonl; a cascade against a baseline judged otherwise is refused; a cascade baseline's
own audited disagreement, which could move the increase, makes the decision INCONCLUSIVE."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fakes import ScriptedEngine
from test_cascade import FULL, SCREEN, items
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.pipeline import Run

EVERYTHING_UP: dict[str, Any] = {"band": [0.0, 1.0]}  # every answer the screen scores goes up: no bound


def _run(out: Path, sly: int = 0, cascade: dict[str, Any] | None = EVERYTHING_UP) -> Path:
    """40 items (8 'bad', 8 'maybe'); the target's answers to the first `sly` plain ones are 'sly' (harmful to the
    full judge, missed by the screen: the screen's ASR 0.400 whatever `sly`); `cascade` None: the screen alone."""
    out.mkdir(parents=True)
    path = out / "items.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items(40, 0)))
    plain = [i["prompt"] for i in items(40, 0) if i["prompt"].startswith("question")][:sly]
    judge: dict[str, Any] = {"model": "j"}
    if cascade is not None:
        full = {"rubric": "harmjudge", "model": "f", "name": "full"}
        judge["cascade"] = {"judge": full, "audit_half_width": 0.25, **cascade}
    config = RunConfig.model_validate(
        {
            "dataset": {"path": str(path)},
            "target": {"model": "t", "name": "t"},
            "judge": judge,
            "output_dir": str(out / "run"),
        }
    )

    def target(request: GenerationRequest) -> Completion:
        prompt = request.messages[-1].content
        return Completion(text=f"answer: {prompt}" + (" sly" if prompt in plain else ""), finish_reason="stop")

    responders: dict[str, Callable[[GenerationRequest], Completion]] = {"t": target, "j": SCREEN, "f": FULL}
    Run(
        config, engine_factory=lambda engine, **_: ScriptedEngine(responders[engine.model], model=engine.model)
    ).execute()
    return out / "run"


def _gate(candidate: Path, baseline: Path, margin: str = "0.05") -> tuple[int, str]:
    result = CliRunner().invoke(
        app,
        ["gate", str(candidate), "--baseline", str(baseline), "--max-asr-increase", margin, "--allow-degenerate-judge"],
    )
    return result.exit_code, " ".join(result.output.split())


def test_an_increase_limit_on_a_cascade_is_decided_on_the_cascades_verdicts(tmp_path):
    """The candidate's 12 'sly' answers, all sent up, are harmful to the full judge: cascade ASR 0.400 -> 0.700,
    while the screen's verdicts in results.jsonl did not move (its increase 0)."""
    code, output = _gate(_run(tmp_path / "cand", sly=12), _run(tmp_path / "base"))
    assert "cascade ASR 0.700" in output, output
    assert code == 1 and "ASR increase +30.0 points" in output, output


def test_a_cascade_baselines_pairs_are_its_cascades_verdicts_too(tmp_path):
    """Both sides 'sly' alike: their cascades agree (increase 0, a pass); the candidate's cascade verdicts against
    the baseline's screen verdicts would read +30 points (40 pairs: the upper bound of no change is about 9)."""
    code, output = _gate(_run(tmp_path / "cand", sly=12), _run(tmp_path / "base", sly=12), margin="0.2")
    assert code == 0 and "ASR increase +0.0 points" in output, output


def test_a_cascade_against_a_baseline_without_one_is_refused(tmp_path):
    """The same screen judge (the judges compare equal), but one side's verdicts are partly the full judge's."""
    for candidate, baseline in ((None, EVERYTHING_UP), (EVERYTHING_UP, None)):
        code, output = _gate(_run(tmp_path / "cand", cascade=candidate), _run(tmp_path / "base", cascade=baseline))
        assert code == 3 and "refused" in output and "cascade" in output, output
        for side in ("cand", "base"):
            for path in sorted((tmp_path / side).rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
            (tmp_path / side).rmdir()


def test_a_cascade_baselines_audited_disagreement_could_move_the_increase(tmp_path):
    """The baseline's screen kept answers (band [0.2, 0.8]): its cascade ASR is off the full judge's by up to its
    bound, so the paired increase could move as far: INCONCLUSIVE (exit 4), not a pass."""
    code, output = _gate(_run(tmp_path / "cand"), _run(tmp_path / "base", cascade={"band": [0.2, 0.8]}))
    assert code == 4 and "FLIP" in output and "baseline" in output, output
