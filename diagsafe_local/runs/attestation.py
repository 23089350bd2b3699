"""The gate's decision as an in-toto attestation: a Statement v1 (in-toto/attestation spec/v1/statement.md) in a
DSSE envelope (secure-systems-lab/dsse, envelope.md and protocol.md).

The subject is each gated target's weights by content (`TargetRef.model_hash`); the predicate is the decision as
the gate made it: passed, outcome and exit code, every check with its figure, interval, n and the limit's source
(`GateDecision.made`), the judge's identity and validation, the grammar canary, the decision's lines (the
sensitivity sample's flips and each pass's line among them), the run id, its results' SHA-256 and its signature.
Its field names follow the open in-toto `eval-result` proposal (in-toto/attestation #565, PR #575:
spec/predicates/eval-result.md) where it has them: `claims` of `metric`, `comparator`, `threshold` (a decimal
string), `passed`; `sampleSize`; `evaluatedAt`; `suite`; `harness`; `assuranceLevel`; `subjectProfile`.

Signed with an Ed25519 key (`DIAGSAFE_ATTEST_KEY`: a PEM private key file), which anyone verifies with the public
key, and with the run's HMAC key (`DIAGSAFE_SIGNING_KEY`) where set. Each signature is over DSSE's
pre-authentication encoding, PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body
(protocol.md, "Signature definition"). `verify_envelope` checks it with `cryptography` alone, never trusting the
unauthenticated `keyid` hint (envelope.md).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import importlib.util
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from diagsafe_local.core import atomic, model_files, signing
from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.fingerprint import model_fingerprint
from diagsafe_local.runs.gate import Check, GateDecision
from diagsafe_local.runs.limits import LIMITS
from diagsafe_local.runs.manifest import JudgeRef
from diagsafe_local.runs.policy import Policy, PolicyDecision
from diagsafe_local.runs.verify import VerifiedRun

STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE: Final = "https://diagsafe-local.dev/eval-result/v1"
POLICY_PREDICATE_TYPE: Final = "https://diagsafe-local.dev/release-policy/v1"
VERIFIER_ID = "https://diagsafe-local.dev/gate"
ATTEST_KEY_ENV = "DIAGSAFE_ATTEST_KEY"
HMAC_KEYID = "diagsafe-hmac-sha256"
EXIT_CODES = {"pass": 0, "fail": 1, "inconclusive": 4}
OUTCOMES: dict[str, Literal["pass", "fail", "inconclusive"]] = {
    "GO": "pass",
    "NO-GO": "fail",
    "INCONCLUSIVE": "inconclusive",
}


class _Camel(BaseModel):
    """Fields written in camelCase, as in-toto's predicates are."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class Claim(_Camel):
    """One check of the gate (`Check`) as the proposal's claim: `metric comparator threshold` passed or not."""

    metric: str = Field(description="The figure checked (`ASR`, `over-refusal rate`, ...), or the check's line.")
    of: str | None = Field(description="What it is the figure of: a target, a category of it, a baseline pair.")
    limit: str | None = Field(description="The gate limit (its config key), if the check is one.")
    comparator: Literal["<="] | None = Field(description="The check passes when value <= threshold.")
    threshold: str | None = Field(description="The limit, as a decimal string (the proposal's rule).")
    value: float | None = Field(description="The number compared (None: unknown, which fails).")
    interval: tuple[float | None, float | None] | None = Field(description="Its 95% interval, where it has one.")
    sample_size: int | None = Field(description="How many answers, goals or pairs the figure is over.")
    source: str | None = Field(
        description="Where the limit came from: command line (or the release policy), config, default."
    )
    passed: bool
    line: str = Field(description="The gate's line for it.")

    @classmethod
    def of_check(cls, check: Check) -> Claim:
        figure = {limit.name: limit.figure for limit in LIMITS}.get(check.limit or "")
        interval = None if check.ci_low is None and check.ci_high is None else (check.ci_low, check.ci_high)
        return cls(
            metric=figure or check.line,
            of=check.about,
            limit=check.limit,
            comparator="<=" if check.threshold is not None else None,
            threshold=None if check.threshold is None else repr(float(check.threshold)),
            value=check.value,
            interval=interval,
            sample_size=check.n,
            source=check.source,
            passed=check.passed,
            line=check.line,
        )


class Decision(_Camel):
    """The gate's decision in a word, and the exit status it ended with."""

    passed: bool
    outcome: Literal["pass", "fail", "inconclusive"]
    exit_code: int
    checks: int


class RunRef(_Camel):
    """The run decided on: its id, its results by content and its signature as the gate checked it."""

    run_id: str
    results_sha256: str | None
    signature: str = Field(description="The gate's note on the run's signature (`signature verified`, ...).")
    signature_sha256: str | None = Field(description="SHA-256 of signature.json (None: the run has none).")


class EvalResult(_Camel):
    """The predicate: the decision, each claim, and what it rests on."""

    verifier: dict[str, str]
    harness: dict[str, str]
    evaluated_at: str | None = Field(description="When the run's manifest was last written (RFC 3339).")
    decided_at: str
    suite: dict[str, str | None]
    assurance_level: Literal["self_attested"] = "self_attested"
    subject_profile: Literal["public-model"] = "public-model"
    decision: Decision
    claims: list[Claim]
    sample_size: int = Field(description="Judged answers of the gated targets.")
    run: RunRef
    judge: dict[str, Any] | None = Field(
        description="The judge's identity as the manifest records it, each judge's instructions by SHA-256."
    )
    validation: dict[str, Any] | None = Field(description="The judge validation that verified (None: none).")
    grammar_canary: dict[str, Any] | None
    network_policy: dict[str, Any] | None = Field(description="The network policy the run recorded (None: none).")
    lines: list[str] = Field(description="Every line of the gate's decision, in order.")
    notes: list[str] = Field(description="The run's verification notes.")


class PolicyRef(_Camel):
    """The release policy decided by, bound by content: the SHA-256 of the bytes the gate parsed, and its entries
    as parsed (`verify-attestation --policy FILE` checks both against a policy file)."""

    path: str
    sha256: str
    entries: list[dict[str, Any]] = Field(description="The policy's entries as the gate read them.")


class EntryResult(_Camel):
    """One entry of the policy as decided: its status, the run it was decided on and the gate's claims on it."""

    name: str
    tier: Literal["critical", "supporting", "advisory"]
    status: Literal["PASS", "BREACH", "INSUFFICIENT_EVIDENCE", "MISSING"]
    figure: str = Field(description="The figure against its limit, as the table shows it.")
    needed: int | None = Field(description="Items at the observed rate that would decide it (INSUFFICIENT).")
    run: RunRef | None = Field(description="The entry's run as verified (None: MISSING).")
    claims: list[Claim]


class PolicyResult(_Camel):
    """The predicate of a release decision (`gate --policy --attest`): the verdict, each entry, and the policy."""

    verifier: dict[str, str]
    harness: dict[str, str]
    decided_at: str
    decision: Decision
    verdict: Literal["GO", "NO-GO", "INCONCLUSIVE"]
    reason: str
    policy: PolicyRef
    entries: list[EntryResult]
    lines: list[str] = Field(description="The policy's table and verdict, as the gate printed them.")


class Subject(BaseModel):
    """A Statement's subject: a gated target's weights by content."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    digest: dict[str, str]


class Statement(BaseModel):
    """An in-toto Statement v1 carrying the predicate."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    type: Literal["https://in-toto.io/Statement/v1"] = Field(STATEMENT_TYPE, alias="_type")
    subject: list[Subject] = Field(min_length=1)
    predicate_type: Literal[
        "https://diagsafe-local.dev/eval-result/v1", "https://diagsafe-local.dev/release-policy/v1"
    ] = Field(PREDICATE_TYPE, alias="predicateType")
    predicate: EvalResult | PolicyResult

    @model_validator(mode="after")
    def _type_names_the_predicate(self) -> Statement:
        policy = self.predicate_type == POLICY_PREDICATE_TYPE
        if policy != isinstance(self.predicate, PolicyResult):
            raise ValueError(f"predicateType {self.predicate_type} does not name this predicate")
        return self

    @property
    def decision(self) -> Decision:
        return self.predicate.decision


class EnvelopeSignature(BaseModel):
    """One DSSE signature: the unauthenticated key hint and the base64 signature."""

    keyid: str = ""
    sig: str


class Envelope(BaseModel):
    """A DSSE envelope (envelope.md)."""

    payload: str
    payloadType: str  # noqa: N815 (DSSE's field name)
    signatures: list[EnvelopeSignature] = Field(min_length=1)


class Keys(BaseModel):
    """The keys an attestation is signed with: an Ed25519 private key (PEM bytes) and the run's HMAC key."""

    model_config = ConfigDict(frozen=True)

    ed25519_pem: bytes | None = Field(repr=False)
    hmac: bytes | None = Field(repr=False)


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding (protocol.md): what every signature signs."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def signing_keys() -> Keys:
    """The keys `gate --attest` signs with, read before the gate decides: at least one must be set, and an
    Ed25519 key must load (usage errors, exit 2)."""
    path = os.environ.get(ATTEST_KEY_ENV)
    pem = None
    if path:
        try:
            pem = Path(path).read_bytes()
        except OSError as exc:
            raise DiagsafeError(f"{ATTEST_KEY_ENV}={path}: cannot read the key ({exc.strerror})") from None
        _private_key(pem, path)
    if importlib.util.find_spec("securesystemslib") is None:
        raise DiagsafeError("--attest needs securesystemslib: pip install 'diagsafe-local[attest]'")
    keys = Keys(ed25519_pem=pem, hmac=signing.signing_key())
    if keys.ed25519_pem is None and keys.hmac is None:
        raise DiagsafeError(
            f"--attest needs a key to sign with: {ATTEST_KEY_ENV} (a PEM Ed25519 private key file, verified with its "
            f"public key) or {signing.KEY_ENV} (the run's HMAC key)"
        )
    return keys


def _private_key(pem: bytes, where: str) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise DiagsafeError(f"{where}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise DiagsafeError(f"{where}: an Ed25519 private key is needed, this is {type(key).__name__}")
    return key


def public_key(path: Path) -> Any:
    """An Ed25519 public key from a PEM file (usage errors, exit 2)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise DiagsafeError(f"{path}: cannot read the key ({exc.strerror})") from None
    except ValueError as exc:
        raise DiagsafeError(f"{path}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise DiagsafeError(f"{path}: an Ed25519 public key is needed, this is {type(key).__name__}")
    return key


def _digest(content_hash: str, where: str) -> dict[str, str]:
    """A content hash of ours (`core.fingerprint`) as an in-toto DigestSet: `sha256` over every byte of the files
    a run loads of the directory, `diagsafe-sha256-sampled` over their sizes and first and last MiB (over 2 GiB)."""
    algorithm, _, digest = content_hash.partition(":")
    name = {"sha256": "sha256", "sha256-sampled": "diagsafe-sha256-sampled"}.get(algorithm)
    if name is None or not digest:
        raise RunFailed(f"{where}: no attestation: its content hash {content_hash!r} is of no known kind")
    return {name: digest}


def _subjects(run: VerifiedRun, targets: list[str]) -> list[Subject]:
    """Each gated target's weights by content (and its LoRA adapter's, if it has one). The manifest's model_hash is
    taken as is only when the run's signature verified; on a run not signed (or not checked) it is any bytes its
    writer chose, so the checkpoint is hashed again here and must match, or nothing is attested."""
    subjects = []
    for label in targets:
        target = run.manifest.targets.get(label)
        if target is None or target.model_hash is None:
            raise RunFailed(
                f"{run.run_dir}: no attestation: target {label} has no weights by content (an API model, or an older "
                "run): an in-toto subject needs a digest"
            )
        if not run.signature_verified:
            index = list(run.manifest.targets).index(label)
            on_disk = model_fingerprint(target.model, model_files.target_load_format(run.manifest.config, index))
            if on_disk != target.model_hash:
                found = "is not on this machine" if on_disk is None else f"hashes to {on_disk}"
                raise RunFailed(
                    f"{run.run_dir}: no attestation: the run's signature did not verify, so target {label}'s "
                    f"model_hash {target.model_hash} is checked against {target.model}, which {found}"
                )
            if target.lora_hash is not None:
                raise RunFailed(
                    f"{run.run_dir}: no attestation: the run's signature did not verify, and target {label}'s adapter "
                    "hash is not checked here: sign the run (DIAGSAFE_SIGNING_KEY) to attest an adapter"
                )
        subjects.append(Subject(name=target.model, digest=_digest(target.model_hash, f"target {label}")))
        if target.lora_hash is not None:
            adapter = _digest(target.lora_hash, f"target {label}'s adapter")
            subjects.append(Subject(name=f"{target.model} (LoRA adapter of target {label})", digest=adapter))
    return subjects


def _judge(judge: JudgeRef) -> dict[str, Any]:
    identity = judge.model_dump(mode="json", exclude={"instructions"})
    identity["instructions_sha256"] = {
        name: hashlib.sha256(text.encode("utf-8")).hexdigest() for name, text in judge.instructions.items()
    }
    return identity


def statement(run: VerifiedRun, decision: GateDecision, targets: list[str] | None) -> Statement:
    """The Statement of a decision on a verified run (the gated targets: `targets`, or all)."""
    from diagsafe_local import __version__

    names = targets or list(run.summary.targets)
    manifest = run.manifest
    predicate = EvalResult(
        verifier={"id": VERIFIER_ID},
        harness={"name": "diagsafe-local", "version": __version__},
        evaluated_at=manifest.updated,
        decided_at=_now(),
        suite={"name": manifest.dataset.spec or manifest.dataset.path, "sha256": manifest.dataset.sha256},
        decision=Decision(
            passed=decision.outcome == "pass",
            outcome=decision.outcome,
            exit_code=EXIT_CODES[decision.outcome],
            checks=decision.checks,
        ),
        claims=[Claim.of_check(check) for check in decision.made],
        sample_size=sum(run.summary.targets[name].n_judged for name in names),
        run=_run_ref(run),
        judge=None if manifest.judge is None else _judge(manifest.judge),
        validation=None if run.validation is None else run.validation.model_dump(mode="json"),
        grammar_canary=None if manifest.grammar is None else manifest.grammar.model_dump(mode="json"),
        network_policy=None if manifest.network is None else manifest.network.model_dump(mode="json"),
        lines=decision.lines,
        notes=run.notes,
    )
    return Statement(subject=_subjects(run, names), predicate=predicate)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _run_ref(run: VerifiedRun) -> RunRef:
    """The run as verified: its id, its results' SHA-256, and its signature as checked (the bytes verify read)."""
    return RunRef(
        run_id=run.manifest.run_id,
        results_sha256=run.results_sha256,
        signature=next((n.removeprefix("signature: ") for n in run.notes if n.startswith("signature: ")), "none"),
        signature_sha256=run.signature_sha256,
    )


def policy_entries(policy: Policy) -> list[dict[str, Any]]:
    """A policy's entries as an attestation binds them (and `verify-attestation --policy` compares them)."""
    return [entry.model_dump(mode="json", exclude_defaults=True) for entry in policy.entries]


def policy_statement(path: Path, sha256: str, policy: Policy, decided: PolicyDecision) -> Statement:
    """The Statement of a release decision: one subject, the checkpoint every verified entry's run evaluated (its
    weights by content, as `statement` checks them). Runs of different checkpoints are refused (exit 2: one
    attestation speaks for one checkpoint; baselines are not subjects), and so is a policy none of whose runs
    verified (exit 3: no checkpoint is known by content)."""
    from diagsafe_local import __version__

    by_entry = {
        o.entry.name: _subjects(o.run, o.entry.targets or list(o.run.summary.targets))
        for o in decided.outcomes
        if o.run is not None
    }
    if not by_entry:
        raise RunFailed("no attestation: no run of the policy verified, so no checkpoint is known by its weights")
    digests = {name: sorted(json.dumps(s.digest, sort_keys=True) for s in subs) for name, subs in by_entry.items()}
    if len({tuple(d) for d in digests.values()}) > 1:
        raise DiagsafeError(
            "--attest: the policy's runs evaluated different checkpoints, and one attestation speaks for one: "
            + "; ".join(f"entry {name}: {', '.join(s.name for s in by_entry[name])}" for name in by_entry)
        )
    predicate = PolicyResult(
        verifier={"id": VERIFIER_ID},
        harness={"name": "diagsafe-local", "version": __version__},
        decided_at=_now(),
        decision=Decision(
            passed=decided.verdict == "GO",
            outcome=OUTCOMES[decided.verdict],
            exit_code=decided.exit_code,
            checks=sum(len(o.decision.made) for o in decided.outcomes if o.decision is not None),
        ),
        verdict=decided.verdict,
        reason=decided.reason,
        policy=PolicyRef(path=str(path), sha256=sha256, entries=policy_entries(policy)),
        entries=[
            EntryResult(
                name=o.entry.name,
                tier=o.entry.tier,
                status=o.status,
                figure=o.figure,
                needed=o.needed,
                run=None if o.run is None else _run_ref(o.run),
                claims=[] if o.decision is None else [Claim.of_check(check) for check in o.decision.made],
            )
            for o in decided.outcomes
        ],
        lines=[*decided.table(), *decided.summary()],
    )
    return Statement(subject=next(iter(by_entry.values())), predicate_type=POLICY_PREDICATE_TYPE, predicate=predicate)


def check_policy(made: Statement, path: Path) -> None:
    """An attestation's release decision against a policy file (`verify-attestation --policy`): the file's bytes
    must be the ones attested (SHA-256), their entries the attested entries, and the verdict the one the attested
    statuses give (as `decide_policy` gives it); else RunFailed naming what differs (exit 3)."""
    from diagsafe_local.runs.policy import read_policy, verdict_of

    predicate = made.predicate
    if not isinstance(predicate, PolicyResult):
        raise RunFailed(f"--policy: the attestation is of a single run's gate ({made.predicate_type}), not of a policy")
    policy, sha256 = read_policy(path)
    if sha256 != predicate.policy.sha256:
        raise RunFailed(f"{path} is not the policy attested: SHA-256 {sha256}, attested {predicate.policy.sha256}")
    if policy_entries(policy) != predicate.policy.entries:
        raise RunFailed(f"the attested entries are not {path}'s")
    attested = [(e.name, e.tier) for e in predicate.entries]
    if attested != [(e.name, e.tier) for e in policy.entries]:
        raise RunFailed(f"the attested entries' outcomes are not those of {path}'s entries: {attested}")
    verdict, code, _ = verdict_of({e.status for e in predicate.entries if e.tier == "critical"})
    if (verdict, code) != (predicate.verdict, predicate.decision.exit_code):
        raise RunFailed(
            f"the attested verdict {predicate.verdict} (exit {predicate.decision.exit_code}) is not what its entries' "
            f"statuses give: {verdict} (exit {code})"
        )


def envelope(payload: bytes, keys: Keys) -> dict[str, Any]:
    """The DSSE envelope of `payload`, signed with each key given: Ed25519 through securesystemslib's signer,
    the HMAC over the same PAE."""
    from securesystemslib.dsse import Envelope as SSlibEnvelope
    from securesystemslib.signer import CryptoSigner, Signature

    signed = SSlibEnvelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    if keys.ed25519_pem is not None:
        signed.sign(CryptoSigner(_private_key(keys.ed25519_pem, ATTEST_KEY_ENV)))
    if keys.hmac is not None:
        digest = hmac.new(keys.hmac, signed.pae(), hashlib.sha256).hexdigest()
        signed.signatures[HMAC_KEYID] = Signature(keyid=HMAC_KEYID, sig=digest)
    return signed.to_dict()


def write(path: Path, run: VerifiedRun, decision: GateDecision, targets: list[str] | None, keys: Keys) -> Statement:
    """Sign the decision's Statement and write its envelope to `path` atomically."""
    return write_statement(path, statement(run, decision, targets), keys)


def write_statement(path: Path, made: Statement, keys: Keys) -> Statement:
    """Sign a Statement and write its envelope to `path` atomically."""
    payload = made.model_dump_json(by_alias=True).encode("utf-8")
    atomic.write_text(path, json.dumps(envelope(payload, keys), indent=2) + "\n")
    return made


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RunFailed(f"{what} is not base64") from None


def verify_envelope(raw: bytes, key: Any | None, hmac_key: bytes | None) -> Statement:
    """The Statement of an envelope once every key asked for verifies a signature over its PAE (an Ed25519
    public key: any signature, the keyid being a hint; the HMAC key: the HMAC signature); else RunFailed naming
    what failed (exit 3)."""
    from cryptography.exceptions import InvalidSignature

    try:
        env = Envelope.model_validate_json(raw)
    except ValidationError as exc:
        raise RunFailed(f"not a DSSE envelope ({exc.errors()[0]['msg']})") from None
    if env.payloadType != PAYLOAD_TYPE:
        raise RunFailed(f"payloadType is {env.payloadType!r}, not {PAYLOAD_TYPE!r}")
    payload = _b64(env.payload, "the payload")
    signed = pae(env.payloadType, payload)
    if key is not None:
        good = False
        for signature in env.signatures:
            try:
                key.verify(_b64(signature.sig, "a signature"), signed)
                good = True
            except (InvalidSignature, RunFailed):
                continue
        if not good:
            raise RunFailed("no signature verifies with the Ed25519 public key (another key, or the envelope changed)")
    if hmac_key is not None:
        mine = [s for s in env.signatures if s.keyid == HMAC_KEYID]
        expected = hmac.new(hmac_key, signed, hashlib.sha256).digest()
        if not any(hmac.compare_digest(_b64(s.sig, "the HMAC signature"), expected) for s in mine):
            raise RunFailed(f"the HMAC signature does not verify with {signing.KEY_ENV} (another key, or changed)")
    try:
        return Statement.model_validate_json(payload)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise RunFailed(f"the payload is not this tool's Statement: {where}: {error['msg']}") from None
