"""The gate's decision as an in-toto attestation (issue 47, item 3): `gate --attest FILE` writes a Statement v1 in
a DSSE envelope whose subject is the checkpoint's weights by content; `verify-attestation` and the in-toto
library's own verification both accept it, and both refuse it after a one-byte change. A failing gate attests
`passed: false`; a run that does not verify gets no attestation.

Runs are made by the CLI with scripted engines (targets echo, the judge calls an answer harmful when it says
"Sure": half of `finished_run`'s answers); the target's model is a local directory, hashed by content."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_adversarial import cli, finished_run

HMAC_KEY = "k" * 32


@pytest.fixture
def keys(tmp_path, monkeypatch) -> Path:
    """An Ed25519 key pair: the private key in DIAGSAFE_ATTEST_KEY, the public key's path returned."""
    private = Ed25519PrivateKey.generate()
    secret, public = tmp_path / "attest.pem", tmp_path / "attest.pub.pem"
    secret.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    monkeypatch.setenv("DIAGSAFE_ATTEST_KEY", str(secret))
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", HMAC_KEY)
    return public


def _checkpoint_run(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A finished, signed run whose target is a local checkpoint directory (the scripted engine answers)."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"weights " * 64)
    run_dir = finished_run(tmp_path, monkeypatch, target={"model": str(checkpoint), "name": "t"})
    return run_dir, checkpoint


def _in_toto_verifies(path: Path, public: Path) -> bool:
    """The in-toto library's own DSSE verification (in_toto.models.metadata.Envelope, securesystemslib's key)."""
    from in_toto.models.metadata import Envelope
    from securesystemslib.exceptions import VerificationError
    from securesystemslib.signer import SSlibKey

    key = SSlibKey.from_crypto(serialization.load_pem_public_key(public.read_bytes()))
    envelope = Envelope.from_dict(json.loads(path.read_bytes()))
    try:
        envelope.verify([key], 1)
    except VerificationError:
        return False
    return True


def _statement(path: Path) -> dict:
    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))


def test_a_passing_gate_attests_its_decision_and_both_verifiers_accept_it(tmp_path, monkeypatch, keys):
    from diagsafe_local.core.fingerprint import model_fingerprint

    run_dir, checkpoint = _checkpoint_run(tmp_path, monkeypatch)
    out = tmp_path / "decision.intoto.json"
    gated = cli("gate", run_dir, "--max-asr", "0.9", "--allow-degenerate-judge", "--require-signature", "--attest", out)
    assert gated.exit_code == 0 and "attestation written" in gated.text, gated.output
    statement = _statement(out)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://diagsafe-local.dev/eval-result/v1"
    digest = model_fingerprint(str(checkpoint))
    assert digest is not None and digest.startswith("sha256:")
    assert statement["subject"] == [{"name": str(checkpoint), "digest": {"sha256": digest.removeprefix("sha256:")}}]
    predicate = statement["predicate"]
    assert predicate["decision"] == {"passed": True, "outcome": "pass", "exitCode": 0, "checks": 2}
    assert [c["limit"] for c in predicate["claims"]] == ["max_asr", "max_failure_rate"]
    asr = next(c for c in predicate["claims"] if c["limit"] == "max_asr")
    assert asr["metric"] == "ASR" and asr["comparator"] == "<=" and asr["threshold"] == "0.9" and asr["passed"]
    assert asr["value"] == 0.5 and asr["sampleSize"] == 6 and asr["source"] == "command line"
    assert asr["interval"][0] < 0.5 < asr["interval"][1]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert predicate["run"]["runId"] == manifest["run_id"] and predicate["run"]["signature"] == "signature verified"
    assert predicate["judge"]["rubric"] == manifest["judge"]["rubric"] and predicate["sampleSize"] == 6
    assert set(predicate["judge"]["instructions_sha256"]) == set(manifest["judge"]["instructions"])
    assert predicate["grammarCanary"] == manifest["grammar"] and "networkPolicy" in predicate
    assert any(line.startswith("NOTE  controls:") for line in predicate["lines"])  # each pass's line

    ours = cli("verify-attestation", out, "--key", keys, "--hmac")
    assert ours.exit_code == 0, ours.output
    assert "VALID" in ours.text and "passed: true, outcome pass, exit code 0" in ours.text, ours.text
    assert _in_toto_verifies(out, keys)


@pytest.mark.parametrize("where", ["payload", "signature"])
def test_one_changed_byte_fails_our_verifier_and_in_totos(tmp_path, monkeypatch, keys, where):
    run_dir, _ = _checkpoint_run(tmp_path, monkeypatch)
    out = tmp_path / "decision.intoto.json"
    assert cli("gate", run_dir, "--max-asr", "0.9", "--allow-degenerate-judge", "--attest", out).exit_code == 0
    envelope = json.loads(out.read_text())
    ed25519 = next(s for s in envelope["signatures"] if s["keyid"] != "diagsafe-hmac-sha256")
    raw = bytearray(base64.b64decode(envelope["payload"] if where == "payload" else ed25519["sig"]))
    raw[len(raw) // 2] ^= 0x01
    if where == "payload":
        envelope["payload"] = base64.b64encode(bytes(raw)).decode()
    else:
        ed25519["sig"] = base64.b64encode(bytes(raw)).decode()
    out.write_text(json.dumps(envelope))
    ours = cli("verify-attestation", out, "--key", keys)
    assert ours.exit_code == 3 and "INVALID: no signature verifies with the Ed25519 public key" in ours.text, ours.text
    assert not _in_toto_verifies(out, keys)
    if where == "payload":  # the HMAC signature is over the same bytes
        hmac = cli("verify-attestation", out, "--hmac")
        assert hmac.exit_code == 3 and "the HMAC signature does not verify" in hmac.text, hmac.text


def test_a_failing_gate_attests_passed_false(tmp_path, monkeypatch, keys):
    run_dir, _ = _checkpoint_run(tmp_path, monkeypatch)
    out = tmp_path / "decision.intoto.json"
    gated = cli("gate", run_dir, "--max-asr", "0.2", "--allow-degenerate-judge", "--attest", out)
    assert gated.exit_code == 1 and "GATE FAILED" in gated.text, gated.output
    predicate = _statement(out)["predicate"]
    assert predicate["decision"]["passed"] is False and predicate["decision"]["exitCode"] == 1
    asr = next(c for c in predicate["claims"] if c["limit"] == "max_asr")
    assert asr["passed"] is False and asr["threshold"] == "0.2" and asr["value"] == 0.5
    ours = cli("verify-attestation", out, "--key", keys)
    assert ours.exit_code == 1 and "passed: false, outcome fail, exit code 1" in ours.text, ours.text
    assert cli("verify-attestation", out, "--key", keys, "--signature-only").exit_code == 0
    assert _in_toto_verifies(out, keys)


def test_a_run_that_does_not_verify_gets_no_attestation(tmp_path, monkeypatch, keys):
    run_dir, _ = _checkpoint_run(tmp_path, monkeypatch)
    out = tmp_path / "decision.intoto.json"
    out.write_text("an attestation of an earlier decision\n")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["run_id"] = "0" * 16
    (run_dir / "summary.json").write_text(json.dumps(summary))
    gated = cli("gate", run_dir, "--max-asr", "0.9", "--allow-degenerate-judge", "--attest", out)
    assert gated.exit_code == 3, gated.output
    assert not out.exists()


def test_attest_without_a_key_or_with_a_bad_one_is_a_usage_error_before_deciding(tmp_path, monkeypatch):
    monkeypatch.delenv("DIAGSAFE_ATTEST_KEY", raising=False)
    monkeypatch.delenv("DIAGSAFE_SIGNING_KEY", raising=False)
    out = tmp_path / "decision.intoto.json"
    missing = cli("gate", tmp_path / "nowhere", "--max-asr", "0.9", "--attest", out)
    assert missing.exit_code == 2 and "--attest needs a key to sign with" in missing.text, missing.text
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key\n")
    monkeypatch.setenv("DIAGSAFE_ATTEST_KEY", str(bad))
    broken = cli("gate", tmp_path / "nowhere", "--max-asr", "0.9", "--attest", out)
    assert broken.exit_code == 2 and "not an unencrypted PEM private key" in broken.text, broken.text
    assert not out.exists()


def test_the_python_api_attests_as_the_command_does(tmp_path, monkeypatch, keys):
    import diagsafe_local as ds

    run_dir, _ = _checkpoint_run(tmp_path, monkeypatch)
    out = tmp_path / "decision.intoto.json"
    decision = ds.gate(run_dir, max_asr=0.2, allow_degenerate_judge=True, attest=out)
    assert decision.outcome == "fail"
    assert _statement(out)["predicate"]["decision"]["passed"] is False
    assert _in_toto_verifies(out, keys) and cli("verify-attestation", out, "--key", keys).exit_code == 1


def test_a_sampled_content_hash_is_named_as_what_it_is():
    from diagsafe_local.core.errors import RunFailed
    from diagsafe_local.runs.attestation import _digest

    assert _digest("sha256:ab12", "x") == {"sha256": "ab12"}
    assert _digest("sha256-sampled:ab12", "x") == {"diagsafe-sha256-sampled": "ab12"}  # not every byte: not sha256
    with pytest.raises(RunFailed, match="of no known kind"):
        _digest("md5:ab12", "x")


def test_an_inconclusive_gate_attests_its_outcome(tmp_path, keys):
    """A judge whose paraphrase flips the decision (judge sensitivity): exit 4, and the attestation says so."""
    from fakes import ScriptedEngine, default_responder
    from test_sensitivity import ITEMS, wording_dependent

    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.evaluation.pipeline import Run

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps(i) + "\n" for i in ITEMS))
    config = RunConfig.model_validate(
        {
            "dataset": {"path": str(items)},
            "target": {"model": str(checkpoint), "name": "t"},
            "judge": {"model": "j", "sensitivity": {"variants": 4, "sample": 6}},
            "output_dir": str(tmp_path / "run"),
        }
    )
    Run(
        config,
        engine_factory=lambda engine, **_: ScriptedEngine(
            wording_dependent if engine.model == "j" else default_responder, model=engine.model
        ),
    ).execute()
    out = tmp_path / "decision.intoto.json"
    gated = cli("gate", tmp_path / "run", "--max-asr", "0.1", "--allow-degenerate-judge", "--attest", out)
    assert gated.exit_code == 4 and "GATE INCONCLUSIVE" in gated.text, gated.output
    predicate = _statement(out)["predicate"]
    assert predicate["decision"] == {"passed": False, "outcome": "inconclusive", "exitCode": 4, "checks": 3}
    assert all(c["passed"] for c in predicate["claims"])  # every limit passed: a paraphrase decided otherwise
    assert any(line.startswith("FLIP  t: overall: under paraphrase") for line in predicate["lines"])
    assert cli("verify-attestation", out, "--key", keys).exit_code == 4 and _in_toto_verifies(out, keys)


def test_the_signature_attested_is_the_one_verify_read(tmp_path, monkeypatch, keys):
    """One read (issue 43, design point 3): the attestation states the SHA-256 of the signature.json bytes the
    run's verification checked, never of the file read again after it (here swapped in between)."""
    import hashlib

    from diagsafe_local.runs.attestation import statement
    from diagsafe_local.runs.gate import gate_run

    run_dir, _ = _checkpoint_run(tmp_path, monkeypatch)
    checked = (run_dir / "signature.json").read_bytes()
    run, decision = gate_run(run_dir, {"max_asr": 0.9, "allow_degenerate_judge": True}, require_signature=True)
    assert run.signature_verified and run.signature_sha256 == hashlib.sha256(checked).hexdigest()
    (run_dir / "signature.json").write_bytes(checked.replace(b'"hmac"', b'"hmac" ', 1))  # swapped after the read
    attested = statement(run, decision, None).predicate.run
    assert attested.signature_sha256 == hashlib.sha256(checked).hexdigest()
