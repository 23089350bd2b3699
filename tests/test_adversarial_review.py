"""Defects an adversarial review reproduced (issue 43's bar: the gate fails closed). Each once got through: a
merge of two checkpoints under one target, an attestation of weights the run never evaluated, a run gated against
a copy of itself, a hook's timeout changing the exit code, lax limit values in a release policy."""

from __future__ import annotations

import json
import shutil

import pytest
from pydantic import ValidationError
from test_adversarial import cli, config_file, finished_run, not_harmful, scripted, write_items
from test_attestation import _statement, keys  # noqa: F401 (a fixture)

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.runs.limits import GateConfig
from diagsafe_local.runs.policy import load_policy


def test_merge_refuses_one_target_answered_by_two_checkpoints_even_allowing_different_judges(tmp_path, monkeypatch):
    scripted(monkeypatch, judge=not_harmful)
    a = tmp_path / "ckA"
    b = tmp_path / "ckB"
    for folder, text in ((a, b"A "), (b, b"B ")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(text * 64)
    items = write_items(tmp_path / "items.jsonl", 8)
    ca = config_file(tmp_path, items, "ra", target={"model": str(a), "name": "t"})
    cb = config_file(tmp_path, items, "rb", target={"model": str(b), "name": "t"})
    assert cli("run", ca, "--shard", "0/2").exit_code == 0
    assert cli("run", cb, "--shard", "1/2").exit_code == 0
    sa = next((tmp_path / "ra" / "shards").iterdir())
    sb = next((tmp_path / "rb" / "shards").iterdir())
    for flags in ((), ("--allow-different-judges",)):
        r = cli("merge", sa, sb, "--out", tmp_path / "m", *flags)
        assert r.exit_code == 2 and "target 't' is another model" in r.text, r.output
        assert "--allow-different-judges" not in r.text and not (tmp_path / "m" / "manifest.json").exists()


@pytest.mark.usefixtures("keys")
def test_an_unsigned_run_whose_manifest_names_other_weights_neither_verifies_nor_attests(tmp_path, monkeypatch):
    monkeypatch.delenv("DIAGSAFE_SIGNING_KEY")
    good = tmp_path / "good"
    good.mkdir()
    (good / "model.safetensors").write_bytes(b"safe " * 64)
    run_dir = finished_run(tmp_path, monkeypatch, responder=not_harmful, target={"model": str(good), "name": "t"})
    manifest_path = run_dir / "manifest.json"
    original = manifest_path.read_text()
    out = tmp_path / "d.json"
    # the model's path edited: the config bound to the run id names another
    manifest = json.loads(original)
    manifest["targets"]["t"]["model"] = "/checkpoints/evil"
    manifest_path.write_text(json.dumps(manifest))
    r = cli("gate", run_dir, "--max-asr", "0.9", "--allow-degenerate-judge", "--attest", out)
    assert r.exit_code == 3 and "/checkpoints/evil" in r.text and not out.exists(), r.output
    # the hash alone edited: nothing binds it on an unsigned run, so the checkpoint is hashed again to attest
    manifest = json.loads(original)
    manifest["targets"]["t"]["model_hash"] = "sha256:" + "ab" * 32
    manifest_path.write_text(json.dumps(manifest))
    r = cli("gate", run_dir, "--max-asr", "0.9", "--allow-degenerate-judge", "--attest", out)
    assert r.exit_code == 3 and "model_hash" in r.text and not out.exists(), r.output
    assert "Traceback" not in r.output
    # the untouched run attests its checkpoint's hash
    manifest_path.write_text(original)
    r = cli("gate", run_dir, "--max-asr", "0.9", "--allow-degenerate-judge", "--attest", out)
    assert r.exit_code == 0, r.output
    assert _statement(out)["subject"][0]["digest"]["sha256"] == json.loads(original)["targets"]["t"][
        "model_hash"
    ].removeprefix("sha256:")


def test_a_copy_of_the_candidate_is_no_baseline(tmp_path, monkeypatch):
    run_dir = finished_run(tmp_path, monkeypatch)
    shutil.copytree(run_dir, tmp_path / "copy")
    r = cli(
        "gate",
        run_dir,
        "--baseline",
        tmp_path / "copy",
        "--max-asr-increase",
        "0.4",
        "--max-asr",
        "1",
        "--allow-degenerate-judge",
    )
    assert r.exit_code == 2 and "the candidate run itself" in r.text, r.output


@pytest.mark.parametrize("value", ["1e300", "inf", "-5", "nan", "x"])
def test_no_hook_timeout_changes_the_gate_exit(tmp_path, monkeypatch, value):
    run_dir = finished_run(tmp_path, monkeypatch, responder=not_harmful)
    monkeypatch.setenv("DIAGSAFE_HOOK_TIMEOUT", value)
    r = cli("gate", run_dir, "--max-asr", "0.9", "--allow-degenerate-judge", "--hook", "mlflow")
    assert r.exit_code == 0, (r.output, r.exception)


@pytest.mark.parametrize(
    "limits",
    ["{max_asr_category: {cyber: yes}}", "{max_asr_category: {cyber: '0.05'}}", "{max_asr: '0.05'}"],
)
def test_a_policy_limit_is_a_number_never_a_boolean_or_text(tmp_path, limits):
    path = tmp_path / "release.yaml"
    path.write_text(f"entries:\n  - name: a\n    tier: critical\n    run: safe\n    limits: {limits}\n")
    with pytest.raises(DiagsafeError) as caught:
        load_policy(path)
    assert str(path) in str(caught.value) and "line 5" in str(caught.value) and "max_asr" in str(caught.value)


@pytest.mark.parametrize(
    "gate", [{"max_asr_category": {"cyber": True}}, {"max_asr_category": {"cyber": "0.05"}}, {"max_asr": "0.05"}]
)
def test_a_config_gate_limit_is_a_number_never_a_boolean_or_text(gate):
    with pytest.raises(ValidationError):
        GateConfig.model_validate(gate)
    assert GateConfig.model_validate({"max_asr": 0, "max_asr_category": {"cyber": 1}}).max_asr == 0


def test_auto_validation_of_a_lone_judge_is_not_taken_for_a_panel_of_it(tmp_path, monkeypatch):
    from helpers import ACME_POLICY
    from test_judge_cards import _run, _validate

    from diagsafe_local.judging.cards import judge_identity
    from diagsafe_local.judging.config import JudgeConfig

    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "cache" / "judges"))
    _validate(tmp_path, "harmjudge")
    acme = tmp_path / "acme.yaml"
    acme.write_text(ACME_POLICY)
    panel = {"rule": "any", "members": ["harmjudge", str(acme)]}
    lone = JudgeConfig.model_validate({"model": "j", "kind": "vllm"})
    assert judge_identity(lone) != judge_identity(JudgeConfig.model_validate({**lone.model_dump(), "panel": panel}))
    summary = _run(tmp_path, "panel", {"model": "j", "validation": "auto", "panel": panel})
    assert summary.get("judge_validation") is None, "a panel took the lone harmjudge's validation"


def test_a_hook_beside_a_policy_is_refused_not_ignored(tmp_path, monkeypatch):
    run_dir = finished_run(tmp_path, monkeypatch)
    policy = tmp_path / "release.yaml"
    policy.write_text("entries:\n  - name: a\n    tier: critical\n    run: safe\n    limits: {max_asr: 0.9}\n")
    r = cli("gate", "--policy", policy, f"safe={run_dir}", "--hook", "mlflow")
    assert r.exit_code == 2 and "--hook" in r.text, r.output
