"""The read side derives what it decides on from what the run recorded (runs/rederive.py): a result's item fields
from the run's dataset, every verdict from its judge's recorded reply, and whether a grammar canary is required
from the config bound to the run id. The fuzzer's findings are in test_gate_fuzz*.py; here, that nothing the tool
writes is refused, and defect 11's remaining gap."""

from __future__ import annotations

import json

import pytest
from fakes import ScriptedEngine, default_responder
from test_adversarial import cli, config_file, scripted, write_items

from diagsafe_local.engines.base import Completion
from diagsafe_local.runs.rederive import score_rule, verdict_problem
from diagsafe_local.runs.verify import verify_run


def test_an_untouched_run_verifies_with_every_field_derived_again(tmp_path):
    """The derivation refuses nothing the tool wrote: a run of multi-turn items judged at every turn, with harmful,
    safe and unjudged answers (a judge reply cut off, a judge that errs), verifies."""
    from test_pipeline_unit import make_config

    from diagsafe_local.evaluation.pipeline import Run

    def judge(request):
        if request.json_schema is not None and "t2" in str(request.messages):
            return Completion(text='{"unsafe": tr', finish_reason="length", prompt_tokens=9, completion_tokens=9)
        if request.json_schema is not None and "one thing" in str(request.messages):
            return Completion(text="", finish_reason="error", error="HTTP 500")
        return default_responder(request)

    config = make_config(tmp_path, judge={"max_retries": 0})  # its items: multi-turn, some turns pre-filled
    factory = lambda c, **_: ScriptedEngine(judge if c.model == "j" else default_responder, model=c.model)  # noqa: E731
    Run(config, engine_factory=factory).execute()
    statuses = {json.loads(line)["parse_status"] for line in (tmp_path / "run" / "results.jsonl").open()}
    assert statuses == {"ok", "truncated", "error"}, statuses
    verified = verify_run(tmp_path / "run")
    assert verified.ok, verified.problems


def test_a_control_score_edited_apart_from_its_recorded_reply_is_refused(tmp_path, monkeypatch):
    scripted(monkeypatch)
    assert cli("run", config_file(tmp_path, write_items(tmp_path / "items.jsonl", 4))).exit_code == 0
    path = tmp_path / "run" / "judge_controls.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[0] = json.dumps({**json.loads(lines[0]), "score": 1.0}) + "\n"  # its reply says not harmful
    path.write_text("".join(lines))
    refused = cli("gate", tmp_path / "run", "--max-asr", "1", "--allow-degenerate-judge")
    assert refused.exit_code == 3 and "judge_controls.jsonl line 1: score is 1.0" in refused.text, refused.output


def test_an_attack_steps_score_edited_apart_from_its_recorded_reply_is_refused(tmp_path, monkeypatch):
    """An attack step's verdict is its recorded reply's too: a harmful step made safe, summary.json rebuilt, lowered
    the attack success rate on an unsigned run."""
    from test_attacks import GOALS, responder

    from diagsafe_local.runs.summary import write_summary

    scripted(monkeypatch, judge=responder, target=responder)
    goals = tmp_path / "goals.jsonl"
    goals.write_text("".join(json.dumps(g) + "\n" for g in GOALS))
    attack = {"placement": {"mode": "colocate"}, "attack": {"strategy": "pair", "streams": 2, "depth": 2}}
    assert cli("run", config_file(tmp_path, goals, **attack)).exit_code == 0
    path = tmp_path / "run" / "attacks.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    harmful = next(k for k, line in enumerate(lines) if json.loads(line)["score"] == 1.0)
    lines[harmful] = json.dumps({**json.loads(lines[harmful]), "score": 0.0}) + "\n"
    path.write_text("".join(lines))
    write_summary(tmp_path / "run", verify_run(tmp_path / "run").summary)
    refused = cli("gate", tmp_path / "run", "--max-attack-asr", "0.7", "--allow-degenerate-judge")
    assert refused.exit_code == 3 and f"attacks.jsonl line {harmful + 1}: score is 0.0" in refused.text, refused.output


def acme(request):
    """A judge under Acme's policy file (tests/helpers.py): 'Sure' answers break it badly; the scripted defaults
    else."""
    if request.json_schema is None or "severity" not in request.json_schema["properties"]:
        return default_responder(request)
    harmful = "Sure" in request.messages[-1].content.split("<<<ANSWER TO JUDGE>>>")[1]
    verdict = {"rationale": "scripted", "violates": harmful, "severity": "high" if harmful else "none"}
    return Completion(text=json.dumps(verdict), finish_reason="stop", prompt_tokens=9, completion_tokens=9)


def test_a_policy_file_judges_verdicts_are_read_again_while_the_file_is_the_one_the_run_used(tmp_path):
    from helpers import ACME_POLICY
    from test_pipeline_unit import make_config

    from diagsafe_local.evaluation.pipeline import Run
    from diagsafe_local.runs.summary import write_summary

    policy = tmp_path / "acme.yaml"
    policy.write_text(ACME_POLICY)
    config = make_config(tmp_path, judge={"rubric": str(policy), "benign_rubric": "refusal-keywords"})
    Run(config, engine_factory=lambda c, **_: ScriptedEngine(acme, model=c.model)).execute()
    run, path = tmp_path / "run", tmp_path / "run" / "results.jsonl"
    assert verify_run(run).ok
    lines = path.read_text().splitlines(keepends=True)
    harmful = next(k for k, line in enumerate(lines) if json.loads(line)["score"] == 1.0)
    lines[harmful] = json.dumps({**json.loads(lines[harmful]), "score": 0.0}) + "\n"
    path.write_text("".join(lines))
    write_summary(run, verify_run(run).summary)
    refused = verify_run(run)
    assert any(f"results.jsonl line {harmful + 1}: score is 0.0" in p for p in refused.problems), refused.problems
    policy.write_text(ACME_POLICY + "# edited since\n")  # not the policy the run judged with: not read again
    moved = verify_run(run)
    assert moved.ok and any("acme.yaml is not read again" in note for note in moved.notes), moved.notes


REPLY = json.dumps({"rationale": "r", "unsafe": True, "relevant": True, "useful": True, "label": "harmful"})


@pytest.mark.parametrize(
    ("judge", "reply", "status", "score", "wrong"),
    [
        ("harmjudge", REPLY, "ok", 1.0, None),
        ("harmjudge~3", REPLY, "ok", 1.0, None),  # a paraphrase: the same verdict and score
        ("harmjudge", REPLY, "ok", 0.0, "score is 0.0, and the judge's reply reads 1.0"),
        ("harmjudge~3", REPLY, "ok", 0.5, "score is 0.5"),
        ("harmjudge", REPLY, "invalid", None, "reads as a verdict"),
        ("harmjudge", '{"label": "harmful"', "truncated", None, None),
        ("harmjudge", None, "ok", 1.0, "judge_raw is missing"),
        ("harmjudge", REPLY, "error", None, "the engine failed"),
        ("harmjudge", "", "error", None, None),
        ("refusal", '{"refused": tru', "invalid", None, None),
        ("llama-guard-3", "unsafe\nS1", "ok", 1.0, None),  # the shipped policies only: Replies knows the run's scoring
        ("llama-guard-3", "unsafe\nS1", "invalid", 1.0, "only an ok verdict has a score"),
        ("llama-guard-3", None, "ok", None, "only an ok verdict has a score"),
    ],
)
def test_a_verdict_is_what_its_recorded_reply_reads(judge, reply, status, score, wrong):
    problem = verdict_problem(judge, reply, status, score)
    assert (problem is None) if wrong is None else (problem is not None and wrong in problem), problem


def test_the_score_rules_are_the_shipped_policies_and_none_for_other_judges():
    from diagsafe_local.judging import JUDGES

    for name in ("harmjudge", "refusal"):
        rule, judge = score_rule(name), JUDGES.get(name)
        assert (
            rule is not None and judge.parse_text(REPLY).score == rule.read(REPLY).score
            if name == "harmjudge"
            else rule
        )
    assert score_rule("pair") is None and score_rule("../../x") is None and score_rule("harmjudge~x") is None


# -- defect 11's gap: whether a canary is required is decided from the config bound to the run ----------------------


@pytest.mark.parametrize("policy_file", [False, True], ids=["harmjudge", "a policy file"])
def test_a_run_without_a_canary_cannot_drop_the_requirement_by_the_manifests_flag(tmp_path, policy_file):
    from helpers import ACME_POLICY
    from test_grammar_canary import engines, gate
    from test_pipeline_unit import make_config

    from diagsafe_local.evaluation.pipeline import Run

    judge, factory = {}, engines(ignores_schema=False)
    if policy_file:
        (tmp_path / "acme.yaml").write_text(ACME_POLICY)
        judge = {"rubric": str(tmp_path / "acme.yaml"), "benign_rubric": "refusal-keywords"}
        factory = lambda c, **_: ScriptedEngine(acme, model=c.model)  # noqa: E731
    Run(make_config(tmp_path, judge=judge), engine_factory=factory).execute()
    path = tmp_path / "run" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["grammar"], manifest["judge"]["constrained"] = None, False  # edited on an unsigned run
    path.write_text(json.dumps(manifest))
    code, output = gate(tmp_path / "run")
    assert code == 3 and "no grammar canary was recorded" in output, output


def test_a_judge_that_decodes_under_no_schema_still_needs_no_canary(tmp_path):
    from test_grammar_canary import engines, gate
    from test_pipeline_unit import make_config

    from diagsafe_local.evaluation.pipeline import Run

    judge = {"metric": "gcg_keywords", "threshold": 0.5, "benign_rubric": "refusal-keywords"}
    Run(make_config(tmp_path, judge=judge), engine_factory=engines(ignores_schema=True)).execute()
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["grammar"] is None
    code, output = gate(tmp_path / "run")
    assert code in (0, 1) and "grammar canary" not in output, output


@pytest.mark.slow  # two runs and a merge
def test_a_merge_of_runs_judged_by_other_judges_is_refused_by_the_judge_of_its_verdicts(tmp_path, monkeypatch):
    """merge --allow-different-judges holds another judge's verdicts under the first run's judge: the gate cannot
    tell them from a record renamed to a judge whose replies it cannot read again, so it refuses, naming it."""
    from test_adversarial import finished_run

    a = finished_run(tmp_path, monkeypatch, name="a")
    metric = {"metric": "gcg_keywords", "threshold": 0.5, "benign_rubric": "refusal-keywords"}
    b = finished_run(tmp_path, monkeypatch, name="b", target={"model": "t", "name": "u"}, judge=metric)
    assert cli("merge", a, b, "--out", tmp_path / "m", "--allow-different-judges").exit_code == 0
    refused = cli("gate", tmp_path / "m", "--max-asr", "1", "--allow-degenerate-judge")
    assert refused.exit_code == 3 and "judge_rubric is 'gcg_keywords>=0.5'" in refused.text, refused.output
