"""The grammar canary: every run whose judge decodes under a schema proves that its engine applies it, and the
gate refuses a run whose engine did not (an engine that ignores schemas, scripted here and as an OpenAI server;
the real vLLM engine with its grammar dropped is in tests/test_doctor.py)."""

from __future__ import annotations

import json

from fakes import ScriptedEngine, default_responder
from servers import FakeOpenAIServer
from test_pipeline_unit import make_config
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.judging.canary import CANARY_SCHEMA
from diagsafe_local.runs.manifest import read_manifest_file


def engines(ignores_schema: bool):
    made: list[ScriptedEngine] = []

    def factory(config, **options):
        made.append(ScriptedEngine(default_responder, model=config.model, ignores_schema=ignores_schema))
        return made[-1]

    factory.made = made  # type: ignore[attr-defined]
    return factory


def gate(run_dir) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["gate", str(run_dir), "--max-asr", "1"])
    return result.exit_code, result.output


def test_a_judge_engine_that_applies_schemas_passes_the_canary_once_per_run(tmp_path):
    factory = engines(ignores_schema=False)
    Run(make_config(tmp_path), engine_factory=factory).execute()
    manifest = read_manifest_file(tmp_path / "run")
    assert manifest.judge.constrained and manifest.grammar.enforced and manifest.grammar.backend == "xgrammar"
    judge = next(e for e in factory.made if e.info.model == "j")
    sent = [r for batch in judge.batches for r in batch if r.json_schema == CANARY_SCHEMA]
    assert len(sent) == 1
    code, output = gate(tmp_path / "run")
    assert code == 0, output


def test_an_engine_that_ignores_schemas_is_caught_and_the_gate_refuses_the_run_even_after_a_resume(tmp_path):
    Run(make_config(tmp_path), engine_factory=engines(ignores_schema=True)).execute()
    manifest = read_manifest_file(tmp_path / "run")
    assert manifest.grammar is not None and not manifest.grammar.enforced
    assert manifest.grammar.reply == "Sunny, with a light breeze."
    code, output = gate(tmp_path / "run")
    assert code == 3 and "did not apply its schema" in output and "scripted (scripted 1)" in output, output
    assert "backend xgrammar" in output

    # fixed engine, same run resumed: the verdicts made without the schema are still there, so it stays refused
    Run(make_config(tmp_path), engine_factory=engines(ignores_schema=False)).execute()
    assert not read_manifest_file(tmp_path / "run").grammar.enforced
    assert gate(tmp_path / "run")[0] == 3


def test_a_run_without_its_canary_is_refused_and_resuming_it_sends_one(tmp_path):
    Run(make_config(tmp_path), engine_factory=engines(ignores_schema=False)).execute()
    path = tmp_path / "run" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["grammar"] = None  # a run made before the canary
    path.write_text(json.dumps(manifest))
    code, output = gate(tmp_path / "run")
    assert code == 3 and "no grammar canary was recorded" in output
    factory = engines(ignores_schema=False)
    Run(make_config(tmp_path), engine_factory=factory).execute()  # nothing left to judge: the judge loads for it
    assert read_manifest_file(tmp_path / "run").grammar.enforced
    assert gate(tmp_path / "run")[0] == 0


def test_judges_that_decode_under_no_schema_send_no_canary(tmp_path):
    factory = engines(ignores_schema=True)
    Run(
        make_config(tmp_path, judge={"metric": "gcg_keywords", "threshold": 0.5, "benign_rubric": "refusal-keywords"}),
        engine_factory=factory,
    ).execute()
    manifest = read_manifest_file(tmp_path / "run")
    assert not manifest.judge.constrained and manifest.grammar is None
    assert not any(r.json_schema == CANARY_SCHEMA for e in factory.made for b in e.batches for r in b)


def test_an_openai_compatible_server_that_ignores_schemas_is_refused(tmp_path):
    server = FakeOpenAIServer(always=("ignore_schema",))
    try:
        api = {"kind": "openai", "base_url": server.base_url, "backoff_base": 0.01, "max_retries": 1}
        config = make_config(tmp_path, target={"model": "t", **api}, judge={"model": "j", **api})
        Run(config).execute()
    finally:
        server.close()
    manifest = read_manifest_file(tmp_path / "run")
    assert not manifest.grammar.enforced and manifest.grammar.engine.startswith("openai")
    code, output = gate(tmp_path / "run")
    assert code == 3 and "did not apply its schema" in output


def test_a_judge_engine_that_raises_on_the_canary_fails_it_without_a_traceback(tmp_path):
    def raising(config, **options):
        engine = ScriptedEngine(default_responder, model=config.model)
        if config.model == "j":
            answer = engine._answer

            def _answer(request):
                if request.json_schema == CANARY_SCHEMA:
                    raise RuntimeError("grammar backend exploded")
                return answer(request)

            engine._answer = _answer  # type: ignore[method-assign]
        return engine

    Run(make_config(tmp_path), engine_factory=raising).execute()
    canary = read_manifest_file(tmp_path / "run").grammar
    assert canary is not None and not canary.enforced and canary.reply == "RuntimeError: grammar backend exploded"
    code, output = gate(tmp_path / "run")
    assert code == 3 and "RuntimeError: grammar backend exploded" in output and "Traceback" not in output
