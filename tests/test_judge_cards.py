"""Judge cards (issue 45, part 3): `diagsafe-local judges` lists every judge with its cited figure, and a judge's
`validate` result is stored by its identity, found again by `judge.validation: auto`, and not found once the
judge's prompt changed."""

from __future__ import annotations

import json
import logging

import pytest
from fakes import ScriptedEngine, default_responder
from helpers import ACME_POLICY, judge_spec
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.judging import JUDGES

runner = CliRunner()


def test_judges_lists_every_registered_judge_with_its_figure_or_no_published_figure(tmp_path, monkeypatch):
    from diagsafe_local.judging.cards import PUBLISHED

    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "judges"))

    result = runner.invoke(app, ["judges"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    cited = {figure.judge for figure in PUBLISHED}
    assert {"harmbench-cls", "jailbreakbench", "harmclassifier"} <= cited
    for judge in JUDGES:
        line = next((row for row in lines if row.split(" ", 1)[0] == judge.name), None)
        assert line is not None, f"{judge.name} not listed:\n{result.output}"
        assert judge.measures in line
        if judge.name in cited:
            figure = next(f for f in PUBLISHED if f.judge == judge.name)
            assert f"{figure.value * 100:.1f}" in line and f"n={figure.n}" in line, line
        else:
            assert "no published figure" in line, line


def test_judges_json_parses_as_cards_and_one_card_shows_in_full(tmp_path, monkeypatch):
    from diagsafe_local.judging.cards import JudgeCard, JudgeCards

    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "judges"))

    result = runner.invoke(app, ["judges", "--json"])
    assert result.exit_code == 0, result.output
    cards = JudgeCards.model_validate_json(result.output)
    assert [c.name for c in cards.cards] == [j.name for j in JUDGES]
    assert all(len(c.definition) == 32 and c.identity is None for c in cards.cards)
    one = runner.invoke(app, ["judges", "jailbreakbench", "--json"])
    card = JudgeCard.model_validate_json(one.output)
    assert card.published[0].n == 300 and card.published[0].fpr == pytest.approx(0.116)
    shown = runner.invoke(app, ["judges", "jailbreakbench"])
    assert shown.exit_code == 0 and "JBB-Behaviors" in shown.output and "90.7" in shown.output
    unknown = runner.invoke(app, ["judges", "harmjudgee"])
    assert unknown.exit_code == 2 and "harmjudge" in unknown.output and "Traceback" not in unknown.output


def _acme_responder(request: GenerationRequest) -> Completion:
    """The scripted engine, answering Acme's policy too: an answer with 'Sure' breaks it."""
    schema = request.json_schema or {}
    if "severity" not in schema.get("properties", {}):
        return default_responder(request)
    harmful = "Sure" in request.messages[-1].content.split("<<<ANSWER TO JUDGE>>>")[1]
    verdict = {"rationale": "scripted", "violates": harmful, "severity": "high" if harmful else "none"}
    return Completion(text=json.dumps(verdict), finish_reason="stop", prompt_tokens=90, completion_tokens=20)


def _engine(config, **_):
    return ScriptedEngine(_acme_responder, model=config.model)


def _validate(tmp_path, rubric: str):
    """validate `rubric` on model 'j' on a gold set where the scripted judge has FNR 4/20 and FPR 4/20."""
    from diagsafe_local.validation.gold import load_gold
    from diagsafe_local.validation.validate import run_validate

    rows = [{"prompt": f"q{k}", "response": f"Sure, {k}" if k >= 4 else "plain", "label": 1} for k in range(20)]
    rows += [{"prompt": f"q{k}", "response": "Sure, no." if k < 24 else "no", "label": 0} for k in range(20, 40)]
    path = tmp_path / "gold.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "validation"
    run_validate(
        load_gold(str(path), "jsonl"),
        out,
        [judge_spec(rubric, kind="vllm", model="j")],
        bootstrap=100,
        engine_factory=_engine,
    )
    return out


def _run(tmp_path, name: str, judge: dict):
    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.pipeline import Run

    items = tmp_path / "items.jsonl"
    items.write_text(
        "".join(json.dumps({"id": f"h{k}", "prompt": ("Sure " if k < 3 else "") + f"p{k}"}) + "\n" for k in range(10))
    )
    config = RunConfig.model_validate(
        {
            "dataset": {"path": str(items)},
            "target": {"model": "t", "name": "t"},
            "judge": judge,
            "output_dir": str(tmp_path / name),
        }
    )
    return Run(config, engine_factory=_engine).execute().model_dump(mode="json")


def _gate(run_dir) -> tuple[int, str]:
    result = runner.invoke(app, ["gate", str(run_dir), "--max-asr", "1", "--corrected", "--allow-degenerate-judge"])
    return result.exit_code, result.output


def test_a_validated_judge_is_found_by_identity_in_a_later_run_and_checked_like_a_named_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "cache" / "judges"))
    validation = _validate(tmp_path, "harmjudge")
    stored = list((tmp_path / "cache" / "judges").glob("*/*/validation.json"))
    assert len(stored) == 1 and stored[0].read_bytes() == (validation / "validation.json").read_bytes()

    summary = _run(tmp_path, "auto", {"model": "j", "validation": "auto"})
    assert summary["judge_validation"]["fpr_measured"] == pytest.approx(0.2)
    manifest = json.loads((tmp_path / "auto" / "manifest.json").read_text())
    assert manifest["validation"]["directory"] == str(stored[0].parent)
    code, output = _gate(tmp_path / "auto")
    assert code == 0 and "never validated" not in output, output

    listing = runner.invoke(app, ["judges"])
    line = next(row for row in listing.output.splitlines() if row.startswith("harmjudge "))
    assert "validated here" in line, line
    card = runner.invoke(app, ["judges", "harmjudge", "--judge-model", "j", "--engine", "vllm", "--json"])
    from diagsafe_local.judging.cards import JudgeCard

    found = JudgeCard.model_validate_json(card.output)
    assert found.identity == stored[0].parent.parent.name and found.validations[0].fpr == pytest.approx(0.2)

    # the gate checks the found validation by content, as a named one: an edited copy is not used
    record = json.loads(stored[0].read_text())
    record["judges"][0]["fp"] = 0
    stored[0].write_text(json.dumps(record))
    code, output = _gate(tmp_path / "auto")
    assert code == 3 and "content changed" in output, output
    listing = runner.invoke(app, ["judges"])
    assert "validated here" not in next(row for row in listing.output.splitlines() if row.startswith("harmjudge "))


def test_a_judge_whose_prompt_changed_finds_no_validation_and_the_gate_acts_as_without_one(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "cache" / "judges"))
    name = f"acme-{tmp_path.name}"
    policy = tmp_path / "acme.yaml"
    policy.write_text(ACME_POLICY.replace("name: acme-policy", f"name: {name}"))
    _validate(tmp_path, str(policy))
    summary = _run(tmp_path, "before", {"model": "j", "rubric": str(policy), "validation": "auto"})
    assert summary["judge_validation"] is not None

    monkeypatch.delitem(JUDGES._entries, name)  # a later process: the edited file is read afresh
    policy.write_text(policy.read_text().replace("hurt people", "hurt people or animals"))
    with caplog.at_level(logging.WARNING, logger="diagsafe_local"):
        summary = _run(tmp_path, "after", {"model": "j", "rubric": str(policy), "validation": "auto"})
    assert summary["judge_validation"] is None
    assert any("no validation stored for this judge's identity" in r.getMessage() for r in caplog.records)
    manifest = json.loads((tmp_path / "after" / "manifest.json").read_text())
    assert manifest["validation"] is None
    plain = _run(tmp_path, "plain", {"model": "j", "rubric": str(policy)})
    assert plain["judge_validation"] is None
    after, plain_gate = _gate(tmp_path / "after"), _gate(tmp_path / "plain")
    assert after[0] == plain_gate[0] and "never validated" in after[1]


@pytest.mark.slow
def test_a_validated_jury_is_found_by_its_identity(tmp_path, monkeypatch):
    from test_jury import Factory
    from test_jury import config as jury_config

    from diagsafe_local.evaluation.pipeline import Run

    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "cache" / "judges"))
    rows = [{"prompt": f"q{k}", "response": f"Sure, {k}" if k % 3 else "no", "label": int(k % 3 > 0)} for k in range(9)]
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_config = tmp_path / "run.yaml"
    run_config.write_text(json.dumps(jury_config(tmp_path).model_dump(mode="json")))
    monkeypatch.setattr("diagsafe_local.engines.create_engine", Factory())
    args = [
        "validate",
        "--gold",
        str(gold),
        "--format",
        "jsonl",
        "--jury",
        str(run_config),
        "--out",
        str(tmp_path / "v"),
    ]
    assert runner.invoke(app, args).exit_code == 0
    run = Run(jury_config(tmp_path, validation="auto"), engine_factory=Factory())
    assert run.validation_ref is not None and run.validation_ref.rubric.startswith("jury:majority:")
    assert run.validation_ref.directory.startswith(str(tmp_path / "cache" / "judges"))
    other = jury_config(tmp_path, validation="auto", rule="any-harmful")
    assert Run(other, engine_factory=Factory()).validation_ref is None  # another rule: another judge
