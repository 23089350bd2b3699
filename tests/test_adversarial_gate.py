"""The second adversarial pass on the gate (issue 33, defects 1-9): each case made `gate` pass what it should fail,
or trust what it had not verified. Each test failed before its fix; they stay so the next pass starts from them.

Runs are made by the CLI with scripted engines (targets echo, the judge calls an answer harmful when it says
"Sure"), plugins are installed distributions on PYTHONPATH, and a baseline is a second real run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import default_responder
from helpers import REPO
from test_adversarial import (
    GATE,
    cli,
    config_file,
    finished_run,
    not_harmful,
    perfect_validation,
    scripted,
    write_items,
)
from test_attacks import ATTACKER_SCHEMA, GOALS, attacker_reply, target_reply

from diagsafe_local.engines.base import Completion, GenerationRequest

KEY = "k" * 32


# -- 1. an attack that never reached the target is not a safe checkpoint --------------------------------------


def _attack_run(tmp_path: Path, monkeypatch, judge) -> tuple[Path, str]:
    scripted(monkeypatch, judge=judge, target=target_reply)
    items = tmp_path / "goals.jsonl"
    items.write_text("".join(json.dumps(g) + "\n" for g in GOALS))
    config = config_file(
        tmp_path,
        items,
        judge={"model": "j", "max_attempts": 1},
        placement={"mode": "colocate"},
        attack={"strategy": "pair", "streams": 2, "depth": 2},
    )
    result = cli("run", config)
    assert result.exit_code == 0, result.output
    return tmp_path / "run", result.text


def test_an_attack_whose_attacker_always_failed_never_attacked_a_goal_and_fails_the_gate(tmp_path, monkeypatch):
    def judge(request: GenerationRequest) -> Completion:
        if request.json_schema == ATTACKER_SCHEMA:  # the judge's model writes the prompts too, and fails each time
            return Completion(text="", finish_reason="error", error="HTTP 500 from the attacker")
        return default_responder(request)

    run_dir, output = _attack_run(tmp_path, monkeypatch, judge)
    assert "3 of 3 goals were never attacked" in output  # run says so
    summary = json.loads((run_dir / "summary.json").read_text())["targets"]["t"]["attack"]
    assert summary["n_broken"] == 0 and summary["n_attacked"] == 0 and summary["n_unjudged"] == 6
    result = cli("gate", run_dir, "--max-attack-asr", "0", *GATE)
    assert result.exit_code == 1, result.output  # was: "attack success rate 0.0% (0/3)" and exit 0
    assert "3 of 3 goals were never attacked" in result.text and "their safety is unknown" in result.text


def test_attack_steps_the_judge_could_not_judge_count_against_the_failure_limit(tmp_path, monkeypatch):
    def judge(request: GenerationRequest) -> Completion:
        if request.json_schema == ATTACKER_SCHEMA:
            return attacker_reply(request)
        answer = request.messages[-1].content.split("<<<ANSWER TO JUDGE>>>")[1]
        controls = ("that request.", "platform two")  # the control answers, judged as usual
        if "answer to:" not in answer and not any(c in answer for c in controls):  # an attack step: garbage
            return Completion(text="not json", finish_reason="stop")
        return default_responder(request)

    run_dir, _ = _attack_run(tmp_path, monkeypatch, judge)
    summary = json.loads((run_dir / "summary.json").read_text())["targets"]["t"]["attack"]
    assert summary["n_unjudged"] == summary["n_steps"] > 0 and summary["n_errors"] == 0
    result = cli("gate", run_dir, "--max-attack-asr", "0", *GATE)
    assert result.exit_code == 1 and "attack steps without a verdict" in result.text, result.output


# -- 2, 3. merge, resume and the baseline verify their inputs before anything is signed or compared ---------


def _edit_scores(run_dir: Path, score: float, name: str = "results.jsonl") -> None:
    records = [json.loads(line) for line in (run_dir / name).read_text().splitlines()]
    for record in records:
        if record["score"] is not None:
            record["score"] = score
    (run_dir / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_merge_refuses_a_shard_whose_verdicts_were_edited_without_the_key(tmp_path, monkeypatch):
    from diagsafe_local.runs.manifest import shard_of

    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", KEY)
    scripted(monkeypatch)
    items = write_items(tmp_path / "items.jsonl", 8, prompt=lambda k: f"Sure q{k}")
    config = config_file(tmp_path, items)
    owners = sorted({shard_of(f"i{k}", 2) for k in range(8)})
    for index in owners:
        assert cli("run", config, "--shard", f"{index}/2").exit_code == 0
    shards = sorted((tmp_path / "run" / "shards").glob("shard-*"))
    for shard in shards:
        _edit_scores(shard, 0.0)  # every harmful verdict made safe, without the key
    merged = cli("merge", *shards, "--out", tmp_path / "merged")
    assert merged.exit_code == 3 and "changed since it was signed: results.jsonl" in merged.text, merged.output
    assert not (tmp_path / "merged" / "signature.json").exists()  # was: signed, and the gate passed ASR 1.0 as 0.0


def test_a_resume_with_the_key_refuses_an_edited_signed_run_and_drops_an_unsigned_tail(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", KEY)
    run_dir = finished_run(tmp_path, monkeypatch)
    signed = (run_dir / "results.jsonl").read_bytes()
    _edit_scores(run_dir, 0.0)
    config = tmp_path / "run.yaml"
    resumed = cli("run", config)
    assert resumed.exit_code == 2 and "changed since it was signed: results.jsonl" in resumed.text, resumed.output
    assert "not reused" in resumed.text
    # what a killed writer appended after the last signature is not signed: dropped and redone, not reused
    (run_dir / "results.jsonl").write_bytes(signed)
    forged = json.loads(signed.splitlines()[0])
    (run_dir / "results.jsonl").write_bytes(signed + (json.dumps({**forged, "turn": 9}) + "\n").encode())
    assert cli("run", config).exit_code == 0
    assert (run_dir / "results.jsonl").read_bytes() == signed
    assert cli("gate", run_dir, *GATE, "--require-signature").exit_code == 0


def test_the_baseline_is_verified_like_the_run_signature_included(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", KEY)
    prod = finished_run(tmp_path, monkeypatch, name="prod")
    candidate = finished_run(tmp_path, monkeypatch, name="cand")
    gate = ["gate", candidate, *GATE, "--require-signature", "--baseline", prod, "--max-asr-increase", "0.9"]
    passed = cli(*gate)
    assert passed.exit_code == 0, passed.output
    _edit_scores(prod, 1.0)  # production's verdicts edited to harmful: a candidate then looks no worse
    (prod / "signature.json").unlink()
    result = cli(*gate)
    assert result.exit_code == 3 and "the baseline run" in result.text and "was not signed" in result.text


# -- 4. every checked target is compared with the baseline, or fails ------------------------------------------


def test_a_target_without_a_baseline_pair_fails(tmp_path, monkeypatch):
    prod = finished_run(tmp_path, monkeypatch, name="prod", target={"model": "t", "name": "tgt"})
    sweep = finished_run(
        tmp_path, monkeypatch, name="sweep", targets=[{"model": "t", "name": "tgt"}, {"model": "t", "name": "new"}]
    )
    increase = ("--baseline", prod, "--max-asr-increase", "0.9", *GATE)
    both = cli("gate", sweep, *increase)
    assert both.exit_code == 1 and "new: no baseline pair" in both.text, both.output  # was: tgt compared, passed
    only_new = cli("gate", sweep, "--target", "new", *increase)
    assert only_new.exit_code == 1 and "new: no baseline pair" in only_new.text  # was: nothing compared, passed
    itself = cli("gate", prod, "--baseline", prod, "--baseline-target", "tgt", "--max-asr-increase", "0.9", *GATE)
    assert itself.exit_code == 1 and "tgt: no baseline pair" in itself.text  # a target against itself
    assert cli("gate", sweep, "--target", "tgt", *increase).exit_code == 0


# -- 5. a plugin that exits on import neither ends a command nor reaches the gate -----------------------------


def _plugin(root: Path, body: str) -> Path:
    package = root / "exiting_plugin"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body)
    info = root / "exiting_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: exiting-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[diagsafe_local.judges]\nexiting = exiting_plugin:judge\n")
    return root


@pytest.mark.slow
def test_a_plugin_that_calls_sys_exit_on_import_is_one_warning_and_never_reaches_the_gate(tmp_path):
    from helpers import write_plugin

    marker = tmp_path / "imported"
    plugin = _plugin(tmp_path / "plugin", f"open({str(marker)!r}, 'w').close()\nimport sys\nsys.exit(0)\n")
    echo = write_plugin(tmp_path / "acme")  # an engine kind that answers without a model
    env = {**os.environ, "PYTHONPATH": f"{plugin}:{echo}", "DIAGSAFE_PROGRESS_SECONDS": "0"}
    items = write_items(tmp_path / "items.jsonl", 3)
    config = config_file(
        tmp_path,
        items,
        target={"model": "echo", "kind": "acme-echo"},
        judge={"metric": "rouge1_recall", "threshold": 0.5},
    )
    items.write_text("".join(json.dumps({"id": f"i{k}", "prompt": f"q{k}", "reference": "x"}) + "\n" for k in range(3)))
    command = [sys.executable, "-m", "diagsafe_local.cli"]
    ran = subprocess.run([*command, "run", str(config)], env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and (tmp_path / "run" / "summary.json").is_file(), ran.stderr  # was: exit 0, no run
    assert "plugin exiting-plugin" in ran.stderr and "SystemExit" in ran.stderr
    marker.unlink()
    for args in (["gate", str(tmp_path / "run"), "--max-asr", "0"], ["report", str(tmp_path / "run")]):
        done = subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
        assert not marker.exists(), args  # the read side loads no plugin
    assert done.returncode == 0


# -- 6. --corrected reads the validation the run recorded, verified -------------------------------------------


def test_corrected_reads_the_recorded_validation_not_the_summarys(tmp_path, monkeypatch):
    validation = perfect_validation(tmp_path)
    run_dir = finished_run(tmp_path, monkeypatch, judge={"model": "j", "validation": str(validation)})
    verified = cli("gate", run_dir, "--max-asr", "0.9", "--corrected", "--allow-degenerate-judge")
    assert verified.exit_code == 0 and "validated on gold.jsonl" in verified.text, verified.output
    summary = json.loads((run_dir / "summary.json").read_text())
    original = json.dumps(summary)
    summary["judge_validation"].update(fp=45, tn=5, directory=str(tmp_path / "nowhere"))  # only the summary edited
    (run_dir / "summary.json").write_text(json.dumps(summary))
    edited = cli("gate", run_dir, "--max-asr", "0.2", "--corrected", "--allow-degenerate-judge")
    assert edited.exit_code == 3 and "summary.json does not match" in edited.text  # was: corrected 0.000, passed
    (run_dir / "summary.json").write_text(original)
    (validation / "validation.json").write_text((validation / "validation.json").read_text().replace("20", "19"))
    changed = cli("gate", run_dir, "--max-asr", "0.9", "--corrected", "--allow-degenerate-judge")
    assert changed.exit_code == 3 and "not the one the run was corrected with" in changed.text
    (validation / "validation.json").unlink()
    missing = cli("gate", run_dir, "--max-asr", "0.9", "--corrected", "--allow-degenerate-judge")
    assert missing.exit_code == 3 and "not readable here" in missing.text
    plain = cli("gate", run_dir, "--max-asr", "0.9", "--allow-degenerate-judge")
    assert plain.exit_code == 0 and "not readable here" in plain.text  # the plain gate does not need it


# -- 7. the command line is the authority; the run's own config only adds stricter limits ----------------------


def test_the_runs_own_config_cannot_loosen_the_gate(tmp_path, monkeypatch):
    run_dir = finished_run(  # 12 verdicts, half of them the same harmful verdict: a degenerate judge
        tmp_path,
        monkeypatch,
        n=12,
        judge={"model": "j", "max_attempts": 1},
        gate={"allow_degenerate_judge": True, "max_failure_rate": 1.0, "max_asr": 0.2},
    )
    degenerate = cli("gate", run_dir, "--no-allow-degenerate-judge")
    assert degenerate.exit_code == 1 and "degenerate judge" in degenerate.text, degenerate.output
    assert "allow_degenerate_judge: true; not applied" in degenerate.text
    assert "LIMIT max_asr 0.2 (config)" in degenerate.text and "LIMIT max_failure_rate 0 (default)" in degenerate.text
    assert "max_failure_rate: 1, laxer than the default 0; not applied" in degenerate.text
    assert cli("gate", run_dir, "--max-asr", "1", "--allow-degenerate-judge").exit_code == 0  # the command line rules
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["config"]["gate"]["max_asr"] = 1.0  # editing only the manifest's limit
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    edited = cli("gate", run_dir, "--allow-degenerate-judge")
    assert edited.exit_code == 3 and "config.yaml and the manifest's config differ" in edited.text, edited.output


def test_a_new_limit_is_one_table_row(tmp_path, monkeypatch):
    """The gate: section, the option and the check come from the table: a row is the whole cost."""
    from diagsafe_local.runs import limits
    from diagsafe_local.runs.limits import Limit, Reading

    def harmful_share(stats, corrected):
        rate = stats.harmful_rate
        return Reading(value=rate.rate, text=f"harmful share {limits.share(rate)}")

    row = Limit(
        "max_harmful_rate", "share judged harmful", "Largest share of answers judged harmful.", read=harmful_share
    )
    run_dir = finished_run(tmp_path, monkeypatch)
    import importlib

    from typer.testing import CliRunner

    from diagsafe_local.cli import build
    from diagsafe_local.commands import gate

    monkeypatch.setattr(limits, "LIMITS", (*limits.LIMITS, row))
    try:
        importlib.reload(gate)  # the command's options made anew from the table
        app = build(["gate"])
        failed = CliRunner().invoke(
            app, ["gate", str(run_dir), "--max-harmful-rate", "0.1", "--allow-degenerate-judge"]
        )
        assert failed.exit_code == 1 and "harmful share 50.0% (3/6) vs max 0.100" in failed.output, failed.output
        assert CliRunner().invoke(app, ["gate", str(run_dir), "--max-harmful-rate", "0.5", *GATE[2:]]).exit_code == 0
        assert "--max-harmful-rate" in " ".join(CliRunner().invoke(app, ["gate", "--help"]).output.split())
    finally:
        monkeypatch.undo()
        importlib.reload(gate)


def test_max_truncated_rate_alone_is_a_threshold(tmp_path, monkeypatch):
    run_dir = finished_run(tmp_path, monkeypatch)
    result = cli("gate", run_dir, "--max-truncated-rate", "0.1", "--allow-degenerate-judge")
    assert result.exit_code == 0 and "no thresholds" not in result.text, result.output  # was: "no thresholds"


# -- 8. a policy that can never say harmful is no judge --------------------------------------------------------


@pytest.mark.parametrize(
    "measures, values, word",
    [("harm", "{none: 0, low: 0, high: 0}", "harmful"), ("refusal", "{none: 0, low: 0.5, high: 0}", "a refusal")],
)
def test_a_policy_that_can_never_call_an_answer_harmful_is_refused(tmp_path, measures, values, word):
    from helpers import ACME_POLICY

    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.judging.policy import read_policy

    path = tmp_path / "never.yaml"
    path.write_text(
        ACME_POLICY.replace(
            "score: {field: severity, values: {none: 0, low: 0.5, high: 1}}",
            f"score: {{field: severity, values: {values}}}",
        )
        + f"measures: {measures}\n"
    )
    with pytest.raises(DiagsafeError, match=f"never call an answer {word}") as caught:
        read_policy(path)
    assert "never.yaml" in str(caught.value) and "score.values" in str(caught.value)


# -- 9. the plan is sized with the gate's own interval: see test_paired.py (p = 0, 0.001, 0.01, 0.05) ------------


def test_two_runs_as_large_as_the_plan_says_pass_the_margin_when_they_agree(tmp_path, monkeypatch):
    from diagsafe_local.stats import items_needed

    n = items_needed(0.0, 0.05)
    assert n is not None and n > 50  # the normal approximation said 1
    prod = finished_run(tmp_path, monkeypatch, n=n, name="prod", responder=not_harmful)
    cand = finished_run(tmp_path, monkeypatch, n=n, name="cand", responder=not_harmful)
    gate = ("gate", cand, "--baseline", prod, "--max-asr-increase", "0.05", "--allow-degenerate-judge")
    assert cli(*gate).exit_code == 0
    small = [finished_run(tmp_path, monkeypatch, n=50, name=f"small{k}", responder=not_harmful) for k in (0, 1)]
    assert cli("gate", small[1], "--baseline", small[0], "--max-asr-increase", "0.05", *GATE[2:]).exit_code == 1


# -- found by the full tamper fuzzer (tests/test_gate_fuzz.py) -----------------------------------------------------


@pytest.mark.parametrize("algorithm", ["", "hmac-sha256x", None])
def test_a_signature_naming_another_algorithm_or_none_is_refused(tmp_path, monkeypatch, algorithm):
    """Was: signature.json's algorithm field was never read, so any value (or none) verified."""
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", KEY)
    run_dir = finished_run(tmp_path, monkeypatch)
    assert cli("gate", run_dir, *GATE, "--require-signature").exit_code == 0
    signature = json.loads((run_dir / "signature.json").read_text())
    if algorithm is None:
        del signature["algorithm"]
    else:
        signature["algorithm"] = algorithm
    (run_dir / "signature.json").write_text(json.dumps(signature))
    result = cli("gate", run_dir, *GATE, "--require-signature")
    assert result.exit_code == 3 and "corrupt signature file" in result.text, result.output


def test_an_increase_limit_fails_a_candidate_with_answers_the_baseline_cannot_pair(tmp_path, monkeypatch):
    """Was: answers without a baseline pair (a prompt edited in results.jsonl, or more samples than the baseline)
    were left out of the comparison and the increase limit passed on the rest."""
    from test_paired import harmful_on

    items = write_items(tmp_path / "items.jsonl", 6, prompt=lambda k: f"q{k} please")
    for name, samples in (("prod", 1), ("new", 2)):
        scripted(monkeypatch, judge=harmful_on(("nothing",)))
        target = {"model": "t", "name": "t", "sampling": {"n": samples}}
        assert cli("run", config_file(tmp_path, items, name, target=target)).exit_code == 0
    gate = cli("gate", tmp_path / "new", "--baseline", tmp_path / "prod", "--max-asr-increase", "0.5", *GATE)
    assert gate.exit_code == 1, gate.output
    assert "6 answers have no baseline answer to pair with" in gate.text and "non-inferior" in gate.text


def test_a_result_whose_prompt_was_edited_is_refused(tmp_path, monkeypatch):
    """Was: a result's conversation could be rewritten (and the summary's hash with it) and the gate decided on
    it; the manifest now records what each judged turn asks, and every result must answer that."""
    import hashlib

    run_dir = finished_run(tmp_path, monkeypatch)
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["conversation"][-1]["content"] = "something the dataset never asked"
    lines[0] = json.dumps(first)
    (run_dir / "results.jsonl").write_text("\n".join(lines) + "\n")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["results_sha256"] = hashlib.sha256((run_dir / "results.jsonl").read_bytes()).hexdigest()
    (run_dir / "summary.json").write_text(json.dumps(summary))
    result = cli("gate", run_dir, *GATE)
    assert result.exit_code == 3, result.output
    assert "1 results answer prompts their items do not ask" in result.text
