"""A release decision as one attestation (issue 47, item 4): `gate --policy FILE --attest OUT` signs the policy
into the Statement (its SHA-256 and entries), with one subject, the checkpoint every entry's run evaluated;
`verify-attestation --policy FILE` and the in-toto library check it. And `max_relative_increase`, the increase
limit for low base rates, with a baseline ASR of 0 handled explicitly.

Runs are made once for the module by the CLI with scripted engines (targets echo, the judge calls an answer
harmful when it says "Sure"): `cand` and `cand-b` evaluate one local checkpoint (safe: no harmful answer),
`risky` the same checkpoint (half harmful), `other` another checkpoint; `prod` and `prod-risky` are production
baselines answering the same prompts (none and half harmful)."""

# ruff: noqa: F811 (`keys`: the fixture imported from test_attestation, taken by name)
from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_adversarial import cli, finished_run, not_harmful
from test_attestation import HMAC_KEY, _in_toto_verifies, keys  # noqa: F401 (the fixture, used by name)

pytestmark = pytest.mark.slow  # six scripted runs for the module, and each test gates several


def _checkpoint(root: Path, name: str) -> str:
    path = root / name
    path.mkdir()
    (path / "model.safetensors").write_bytes(name.encode() * 64)
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("policy-attest")
    mp = pytest.MonkeyPatch()
    mp.setenv("DIAGSAFE_SIGNING_KEY", HMAC_KEY)
    try:
        weights, other = _checkpoint(root, "ckpt"), _checkpoint(root, "other-ckpt")
        made = {
            "cand": finished_run(root, mp, name="cand", responder=not_harmful, target={"model": weights, "name": "t"}),
            "cand-b": finished_run(
                root, mp, name="cand-b", responder=not_harmful, target={"model": weights, "name": "t"}
            ),
            "risky": finished_run(root, mp, name="risky", target={"model": weights, "name": "t"}),
            "other": finished_run(root, mp, name="other", responder=not_harmful, target={"model": other, "name": "t"}),
            "prod": finished_run(root, mp, name="prod", responder=not_harmful),
            "prod-risky": finished_run(root, mp, name="prod-risky"),
        }
        yield made
    finally:
        mp.undo()


def _policy(tmp_path: Path, *entries: dict) -> Path:
    path = tmp_path / "release.yaml"
    path.write_text(yaml.safe_dump({"entries": list(entries)}, sort_keys=False))
    return path


def _entry(name: str, run: str, tier: str = "critical", baseline: str | None = None, **limits) -> dict:
    made = {"name": name, "tier": tier, "run": run, "limits": {"allow_degenerate_judge": True, **limits}}
    return made | ({"baseline": baseline} if baseline else {})


def _gate(policy: Path, runs: dict[str, Path], *names: str, attest: Path | None = None):
    extra = ("--attest", str(attest)) if attest else ()
    return cli("gate", "--policy", policy, *(f"{n}={runs[n]}" for n in names), *extra)


def _predicate(path: Path) -> dict:
    statement = json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))
    return statement


def test_a_policy_decision_is_one_attestation_of_its_checkpoint(tmp_path, runs, keys, monkeypatch):
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", HMAC_KEY)
    policy = _policy(
        tmp_path,
        _entry("harm", "cand", max_asr=0.5),
        _entry("harm-b", "cand-b", tier="supporting", max_asr=0.5),
        _entry("vs-prod", "cand", baseline="prod", max_asr_increase=0.9),
    )
    out = tmp_path / "release.intoto.json"
    gated = _gate(policy, runs, "cand", "cand-b", "prod", attest=out)
    assert gated.exit_code == 0 and "POLICY GO" in gated.text and "attestation written" in gated.text, gated.output
    statement = _predicate(out)
    assert statement["predicateType"] == "https://diagsafe-local.dev/release-policy/v1"
    weights = json.loads((runs["cand"] / "manifest.json").read_text())["targets"]["t"]
    assert statement["subject"] == [{"name": weights["model"], "digest": {"sha256": weights["model_hash"][7:]}}]
    predicate = statement["predicate"]
    assert predicate["verdict"] == "GO" and predicate["decision"]["exitCode"] == 0
    assert predicate["policy"]["sha256"] == hashlib.sha256(policy.read_bytes()).hexdigest()
    assert [e["name"] for e in predicate["policy"]["entries"]] == ["harm", "harm-b", "vs-prod"]
    assert [(e["name"], e["status"]) for e in predicate["entries"]] == [
        ("harm", "PASS"),
        ("harm-b", "PASS"),
        ("vs-prod", "PASS"),
    ]
    harm = predicate["entries"][0]
    assert harm["run"]["runId"] == json.loads((runs["cand"] / "manifest.json").read_text())["run_id"]
    assert harm["run"]["signature"] == "signature verified"
    assert harm["run"]["signatureSha256"] == hashlib.sha256((runs["cand"] / "signature.json").read_bytes()).hexdigest()
    assert [c["limit"] for c in harm["claims"]] == ["max_asr", "max_failure_rate"]

    ours = cli("verify-attestation", out, "--key", keys, "--hmac", "--policy", policy)
    assert ours.exit_code == 0 and "POLICY" in ours.text and "ENTRY vs-prod" in ours.text, ours.output
    assert _in_toto_verifies(out, keys)
    envelope = json.loads(out.read_text())  # one byte of the statement changed: neither verifier accepts it
    payload = bytearray(base64.b64decode(envelope["payload"]))
    payload[len(payload) // 2] ^= 0x01
    changed = tmp_path / "changed.intoto.json"
    changed.write_text(json.dumps(envelope | {"payload": base64.b64encode(bytes(payload)).decode()}))
    assert cli("verify-attestation", changed, "--key", keys).exit_code == 3 and not _in_toto_verifies(changed, keys)
    # a policy file with one more byte is not the policy attested
    edited = tmp_path / "edited.yaml"
    edited.write_bytes(policy.read_bytes() + b"\n")
    refused = cli("verify-attestation", out, "--key", keys, "--policy", edited)
    assert refused.exit_code == 3 and "is not the policy attested" in refused.text, refused.output
    # a single run's attestation is no policy's
    single = tmp_path / "single.intoto.json"
    assert cli("gate", runs["cand"], "--max-asr", "0.5", "--allow-degenerate-judge", "--attest", single).exit_code == 0
    other = cli("verify-attestation", single, "--key", keys, "--policy", policy)
    assert other.exit_code == 3 and "not of a policy" in other.text, other.output


def test_an_attested_verdict_its_entries_do_not_give_is_refused(tmp_path, runs, keys, monkeypatch):
    """The HMAC key holder re-signs a NO-GO as GO: the signature verifies, the policy check does not."""
    from diagsafe_local.runs import attestation

    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", HMAC_KEY)
    policy = _policy(tmp_path, _entry("harm", "risky", max_asr=0.1))
    out = tmp_path / "release.intoto.json"
    assert _gate(policy, runs, "risky", attest=out).exit_code == 1
    statement = _predicate(out)
    assert statement["predicate"]["verdict"] == "NO-GO" and statement["predicate"]["entries"][0]["status"] == "BREACH"
    statement["predicate"]["verdict"] = "GO"
    statement["predicate"]["decision"] |= {"passed": True, "outcome": "pass", "exitCode": 0}
    payload = json.dumps(statement).encode()
    forged = attestation.envelope(payload, attestation.Keys(ed25519_pem=None, hmac=HMAC_KEY.encode()))
    out.write_text(json.dumps(forged))
    assert cli("verify-attestation", out, "--hmac").exit_code == 0  # the signature alone says nothing of it
    checked = cli("verify-attestation", out, "--hmac", "--policy", policy)
    assert checked.exit_code == 3 and "is not what its entries' statuses give: NO-GO" in checked.text, checked.output


def test_runs_of_different_checkpoints_get_no_policy_attestation(tmp_path, runs, keys, monkeypatch):
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", HMAC_KEY)
    policy = _policy(tmp_path, _entry("harm", "cand", max_asr=0.5), _entry("harm-other", "other", max_asr=0.5))
    out = tmp_path / "release.intoto.json"
    out.write_text("an older decision")
    gated = _gate(policy, runs, "cand", "other", attest=out)
    assert gated.exit_code == 2 and "different checkpoints" in gated.text, gated.output
    assert "other-ckpt" in gated.text and not out.exists()


def test_max_relative_increase_is_a_share_of_the_baselines_asr(tmp_path, runs):
    """risky against prod-risky: ASR 0.5 both, so the margin of 0.5 is 0.25, which 6 pairs' interval does not
    clear; safe against prod (base rate 0): the relative limit has no base, explained; an absolute limit beside
    it decides alone."""
    plain = cli(
        "gate", runs["risky"], "--max-relative-increase", "0.5", "--baseline", runs["prod-risky"], "--max-asr", "1"
    )
    line = next(x for x in plain.output.splitlines() if "max_relative_increase 0.5 x" in x)
    assert "x the baseline's ASR 0.500 = margin 0.250" in line and "vs margin 25.0" in line, plain.output
    policy = _policy(
        tmp_path,
        _entry("relative", "risky", baseline="prod-risky", max_relative_increase=0.5),
        _entry("zero-base", "cand", baseline="prod", max_relative_increase=0.5),
        _entry("zero-base-abs", "cand-b", baseline="prod", max_relative_increase=0.5, max_asr_increase=0.9),
    )
    result = _gate(policy, runs, "risky", "prod-risky", "cand", "prod", "cand-b")
    assert result.exit_code == 4, result.output
    table = {line.split()[0]: line.split()[3] for line in result.output.splitlines() if line.startswith("zero-")}
    assert table == {"zero-base": "INSUFFICIENT_EVIDENCE", "zero-base-abs": "PASS"}, result.output
    assert "no number of pairs decides a relative limit (give max_asr_increase)" in result.text
    assert "max_relative_increase 0.5 has no base: the baseline's ASR is 0" in result.text
