"""One rule for a cascade's figures everywhere a run's figures are shown: what `run`, `merge` and `report` print,
what `compare`, `report --baseline` and the series report pair, are the figures the gate decides on (the cascade's
verdicts: the full judge's where the screen sent an answer up), and a cascade's full judge is one judge by content
(its weights), as the run's judge is, wherever two runs must share their judges."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import ScriptedEngine
from safetensors.numpy import save_file
from servers import FakeOpenAIServer, judged_answer
from test_adv4_gate import EVERYTHING_UP, _gate
from test_adv4_gate import _run as cascade_run
from test_cascade import FULL, SCREEN, items, judge
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.pipeline import Run


def _asr_cells(output: str) -> list[str]:
    """The ASR cells ('40.0% [') of a printed summary table or a report, each with its whole figure."""
    return re.findall(r"(?<![\d.])\d+\.\d% \[", output)


@pytest.mark.slow  # a run through the API path: about 3 s
def test_run_and_merge_print_the_figures_the_gate_decides_on(tmp_path):
    """The screen calls every answer not harmful (ASR 0%), its band [0, 0.5] sends all of them up, and the full
    judge calls each harmful: the cascade's ASR, the gate's, is 100%, and so is what `run` and `merge` print."""
    server = FakeOpenAIServer(by_model={"full": lambda body: ("harmful",) if judged_answer(body) else None})
    try:
        dataset = tmp_path / "items.jsonl"
        dataset.write_text("".join(json.dumps(i) + "\n" for i in items(5, 0)))
        api = {"kind": "openai", "base_url": server.base_url, "backoff_base": 0.01, "max_retries": 1}
        config = {
            "dataset": {"path": str(dataset)},
            "target": {**api, "model": "t", "name": "t"},
            "judge": {**api, "model": "screen", "cascade": {"judge": {**api, "model": "full"}, "band": [0.0, 0.5]}},
            "output_dir": str(tmp_path / "run"),
        }
        path = tmp_path / "run.json"
        path.write_text(json.dumps(config))
        ran = CliRunner().invoke(app, ["run", str(path)])
    finally:
        server.close()
    assert ran.exit_code == 0, ran.output
    assert _asr_cells(ran.output) == ["100.0% ["], ran.output
    merged = CliRunner().invoke(app, ["merge", str(tmp_path / "run"), "--out", str(tmp_path / "merged")])
    assert merged.exit_code == 0 and _asr_cells(merged.output) == ["100.0% ["], merged.output
    report = CliRunner().invoke(app, ["report", str(tmp_path / "merged")])
    assert report.exit_code == 0 and _asr_cells(report.output) == ["100.0% ["], report.output


def test_compare_and_report_baseline_pair_the_cascades_verdicts(tmp_path):
    """The candidate's 12 'sly' answers, all sent up, are harmful to the full judge: the cascades' ASRs are 0.400
    and 0.700 (what the gate pairs), while the screen's verdicts did not move (0.400 on both sides)."""
    candidate, baseline = cascade_run(tmp_path / "cand", sly=12), cascade_run(tmp_path / "base")
    compared = CliRunner().invoke(app, ["compare", str(baseline), str(candidate), "--json"])
    assert compared.exit_code == 0, compared.output
    document = json.loads(compared.output)
    overall = next(d for d in document["paired"] if d["group"] == "overall")
    assert (overall["asr_a"], overall["asr_b"], overall["diff"]) == pytest.approx((0.4, 0.7, 0.3)), overall
    assert document["pairs"][0]["flips_up"] == 12
    assert document["agreement"]["both_scored"] == 40
    assert document["agreement"]["label_agreement"] == pytest.approx(28 / 40)  # the 12 flips disagree
    reported = CliRunner().invoke(app, ["report", str(candidate), "--baseline", str(baseline)])
    assert reported.exit_code == 0, reported.output
    paired = (candidate / "report.md").read_text().split("compared with baseline")[1].split("\n## ")[0]
    assert "| overall | 40 | 40.0% | 70.0% | +30.0 [" in paired, paired
    flips = [json.loads(line) for line in (candidate / "flips.jsonl").read_text().splitlines()]
    assert [(f["direction"], f["score_a"], f["score_b"]) for f in flips] == [("now_harmful", 0.0, 1.0)] * 12, flips
    code, output = _gate(candidate, baseline, margin="0.05")  # the gate reads the same pairs
    assert code == 1 and "ASR increase +30.0 points" in output, output


def test_compare_refuses_a_cascade_against_a_baseline_without_one_as_the_gate_does(tmp_path):
    """One screen on both sides, a cascade on one: its pairs would mix the full judge's verdicts with the
    screen's. compare refuses the two as judged by different judges (exit 2), or with --allow-different-judges
    says so on every figure; the gate refuses them (exit 3)."""
    candidate, baseline = cascade_run(tmp_path / "cand", sly=12), cascade_run(tmp_path / "base", cascade=None)
    refused = CliRunner().invoke(app, ["compare", str(baseline), str(candidate)])
    assert refused.exit_code == 2 and "cascade" in refused.output, refused.output
    allowed = CliRunner().invoke(app, ["compare", str(baseline), str(candidate), "--allow-different-judges"])
    assert allowed.exit_code == 0 and "judged by different judges" in allowed.output, allowed.output
    code, output = _gate(candidate, baseline)
    assert code == 3 and "refused" in output and "cascade" in output, output


def _weights(path: Path, value: float) -> Path:
    """A model directory whose weights are `value` everywhere."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    save_file({"w": np.full((8, 8), value, dtype=np.float32)}, str(path / "model.safetensors"))
    return path


def _cascade_config(out: Path, full_model: str) -> tuple[RunConfig, Callable[..., ScriptedEngine]]:
    """40 items screened by SCREEN, everything sent up to the full judge FULL at `full_model`: the config, and the
    engine factory that scripts its models."""
    out.mkdir(parents=True)
    dataset = out / "items.jsonl"
    dataset.write_text("".join(json.dumps(i) + "\n" for i in items(40, 0)))
    full = {"rubric": "harmjudge", "model": full_model, "name": "full"}
    config = RunConfig.model_validate(
        {
            "dataset": {"path": str(dataset)},
            "target": {"model": "t", "name": "t"},
            "judge": {"model": "j", "cascade": {"judge": full, "audit_half_width": 0.25, **EVERYTHING_UP}},
            "output_dir": str(out / "run"),
        }
    )
    responders: dict[str, Callable[[GenerationRequest], Completion]] = {
        "t": lambda r: Completion(text=f"answer: {r.messages[-1].content}", finish_reason="stop"),
        "j": SCREEN,
        full_model: FULL,
    }
    return config, lambda engine, **_: ScriptedEngine(responders[engine.model], model=engine.model)


def _cascade_by_path(out: Path, full_model: Path) -> Path:
    """`_cascade_config`'s run, its full judge's model a directory."""
    config, factory = _cascade_config(out, str(full_model))
    Run(config, engine_factory=factory).execute()
    return out / "run"


def test_a_full_judge_whose_weights_changed_under_its_path_is_another_judge(tmp_path):
    """Two cascades of one config, whose full judge's weights were replaced between the runs: not one judge, so
    the gate refuses the increase (exit 3) and compare refuses the pair (exit 2); the same weights compare."""
    full = _weights(tmp_path / "full", 0.0)
    baseline = _cascade_by_path(tmp_path / "base", full)
    same = _cascade_by_path(tmp_path / "same", full)
    code, output = _gate(same, baseline, margin="0.2")
    assert code == 0, output
    _weights(full, 1.0)  # retrained in place
    candidate = _cascade_by_path(tmp_path / "cand", full)
    code, output = _gate(candidate, baseline, margin="0.2")
    assert code == 3 and "refused" in output and "cascade" in output, output
    compared = CliRunner().invoke(app, ["compare", str(baseline), str(candidate)])
    assert compared.exit_code == 2 and "model_hash" in compared.output, compared.output


@pytest.fixture
def cascade_engines(monkeypatch) -> None:
    """Every engine the pipeline makes is scripted: the series' targets comply with more requests the later their
    step (`test_series.by_step`), the screen calls 'Sure' harmful, and the full judge calls every answer harmful."""
    from test_series import by_step

    everything = judge(lambda answer: "harmful")

    def factory(config: Any, **options: Any) -> ScriptedEngine:
        respond = everything if config.model == "f" else (lambda r: by_step(r, config.model))
        return ScriptedEngine(respond, model=config.model)

    monkeypatch.setattr("diagsafe_local.evaluation.pipeline.create_engine", factory)


def test_a_series_of_cascades_plots_and_compares_the_cascades_figures(tmp_path, cascade_engines):
    """Checkpoints 10 and 40 comply with 1 and 4 of 16 requests (the screen's ASRs 0.0625 and 0.25); every answer
    goes up and the full judge calls each harmful: the series plots the cascades' ASR 1.0 for both and pairs their
    verdicts (no difference), as the gate decides each."""
    from test_series import checkpoint, series_config, watch

    config = series_config(tmp_path)
    data = json.loads(config.read_text())
    data["judge"]["cascade"] = {"judge": {"rubric": "harmjudge", "model": "f", "name": "full"}, **EVERYTHING_UP}
    config.write_text(json.dumps(data))
    for step in (10, 40):
        checkpoint(tmp_path / "train", f"checkpoint-{step}")
    result = watch(tmp_path)
    assert result.exit_code == 0, result.output
    figures = json.loads((tmp_path / "train" / "safety-series" / "series.json").read_text())
    points = {p["name"]: p for p in figures["points"]}
    assert [points[n]["asr"]["value"] for n in ("checkpoint-10", "checkpoint-40")] == [1.0, 1.0], points
    assert points["checkpoint-40"]["vs_previous"]["diff"] == 0.0 and not points["checkpoint-40"]["regression"]
    assert points["checkpoint-40"]["by_category"]["cyber"]["value"] == 1.0


def test_a_cascade_that_records_its_full_judge_only_by_config_is_refused_as_a_baseline_pair(tmp_path):
    """Runs written before the full judge was recorded by content (their judge's settings hold no identity of it):
    which judge made their verdicts is not known, so the gate decides no increase on them (exit 3)."""
    candidate, baseline = cascade_run(tmp_path / "cand", sly=12), cascade_run(tmp_path / "base", sly=12)
    for run_dir in (candidate, baseline):
        path = run_dir / "manifest.json"
        manifest = json.loads(path.read_text())
        assert manifest["judge"]["settings"].pop("cascade")["rubric"] == "harmjudge"
        path.write_text(json.dumps(manifest))
    code, output = _gate(candidate, baseline, margin="0.2")
    assert code == 3 and "does not record its cascade's full judge by content" in output, output


def test_a_hook_is_given_the_figures_the_gate_decides_on(tmp_path):
    """What `run` hands the trackers (mlflow, W&B, a plugin's hook) of a cascade is the cascade's ASR, 0.700, not
    the screen's 0.300."""
    from diagsafe_local.hooks import RunEvent

    event = RunEvent.of(cascade_run(tmp_path / "cand", sly=12))
    assert event.summary.targets["t"].asr.value == pytest.approx(0.7)


def test_the_python_api_and_the_inspect_export_give_the_figures_the_gate_decides_on(tmp_path):
    """`api.evaluate`'s summary and an Inspect log's metrics and sample scores are the cascade's: every answer
    goes up and the full judge calls the 8 'maybe' answers harmful (ASR 0.400), which the screen called
    uncertain (0.300)."""
    pytest.importorskip("inspect_ai")
    from inspect_ai.log import read_eval_log

    from diagsafe_local import api

    config, factory = _cascade_config(tmp_path / "cascade", "f")
    result = api.evaluate(config, engine_factory=factory)
    assert result.summary.targets["t"].asr.value == pytest.approx(0.4)
    out = tmp_path / "run.eval"
    exported = CliRunner().invoke(app, ["export", str(result.run_dir), "--format", "inspect", "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    log = read_eval_log(str(out))
    assert log.results is not None and log.results.scores[0].metrics["asr"].value == pytest.approx(0.4)
    maybe = [s for s in log.samples or [] if "maybe" in s.output.completion]
    assert len(maybe) == 8 and {s.scores["judge"].value for s in maybe if s.scores} == {1.0}


def test_a_full_judge_behind_an_api_is_its_name_wherever_it_is_served():
    """As the run's judge: two endpoints serving one model name are one full judge; another name is another."""
    from diagsafe_local.engines.identity import engine_identity
    from diagsafe_local.evaluation.manifest import judge_ref
    from diagsafe_local.judging.config import JudgeConfig

    def ref(model: str, base_url: str):
        full = {"kind": "openai", "model": model, "base_url": base_url, "rubric": "harmjudge"}
        judge = JudgeConfig.model_validate({"model": "j", "cascade": {"judge": full}})
        return judge_ref(judge, engine_identity(judge))

    assert ref("f", "http://127.0.0.1:1/v1").differences(ref("f", "http://127.0.0.1:2/v1")) == []
    assert "'model': 'f'" in " ".join(ref("f", "http://127.0.0.1:1/v1").differences(ref("g", "http://127.0.0.1:1/v1")))


def test_merges_help_says_it_writes_a_report_into_the_merged_directory():
    """`merge RUN_DIRS --out` writes report.md, report.html and figures/ into --out (the figures the gate decides
    on); its --help, and so the generated command reference, says so."""
    shown = " ".join(CliRunner().invoke(app, ["merge", "--help"]).output.replace("│", " ").split())
    assert "report.md" in shown and "report.html" in shown, shown


def test_a_flip_shows_the_verdict_its_score_came_from(tmp_path):
    """The candidate's 12 'sly' answers flip on the full judge's verdicts (harmful), which the screen called not
    harmful: each flip's verdict is the full judge's, in compare --out's flips.jsonl and report --baseline's."""
    candidate, baseline = cascade_run(tmp_path / "cand", sly=12), cascade_run(tmp_path / "base")
    out = tmp_path / "cmp"
    compared = CliRunner().invoke(app, ["compare", str(baseline), str(candidate), "--out", str(out)])
    assert compared.exit_code == 0, compared.output
    reported = CliRunner().invoke(app, ["report", str(candidate), "--baseline", str(baseline)])
    assert reported.exit_code == 0, reported.output
    for path in (out / "flips.jsonl", candidate / "flips.jsonl"):
        flips = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(flips) == 12, path
        assert {(f["score_b"], f["verdict_b"]["label"], f["verdict_a"]["label"]) for f in flips} == {
            (1.0, "harmful", "not_harmful")
        }, (path, flips[0])
