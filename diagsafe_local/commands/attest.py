"""`diagsafe-local verify-attestation FILE --key PUB.pem`: check the signature of an attestation that
`gate --attest` wrote and print its decision. Its exit code follows the decision, so `verify-attestation F &&
deploy` ships only a passed checkpoint: 0 valid and passed, 1 valid and failed, 4 valid and inconclusive, 3 when
it does not verify (one line naming what failed), 2 for bad input (no key asked for, a key that does not load);
`--signature-only`: 0 whenever it verifies, whatever it decided."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def verify_attestation(
    file: Annotated[Path, typer.Argument(help="The attestation (a DSSE envelope) that `gate --attest` wrote.")],
    key: Annotated[Path | None, typer.Option(help="The Ed25519 public key (PEM) whose signature must verify.")] = None,
    hmac: Annotated[
        bool,
        typer.Option(
            "--hmac",
            help="Also (or only) check the HMAC signature with the run's key in DIAGSAFE_SIGNING_KEY.",
        ),
    ] = False,
    policy: Annotated[
        Path | None,
        typer.Option(
            help="For a release decision (`gate --policy --attest`): the policy file it must be of (its SHA-256 and "
            "entries), and its verdict must be what its entries' statuses give.",
            metavar="FILE",
        ),
    ] = None,
    signature_only: Annotated[
        bool,
        typer.Option(
            "--signature-only",
            help="Exit 0 when the signature verifies, whatever the decision (default: 0 only for a passed gate, 1 "
            "failed, 4 inconclusive).",
        ),
    ] = False,
) -> None:
    """Verify an attestation's signature (the DSSE envelope's PAE), print the decision it states, and exit with
    it: 0 passed, 1 failed, 4 inconclusive (--signature-only: 0), 3 invalid."""
    from diagsafe_local.core import signing
    from diagsafe_local.core.errors import DiagsafeError, RunFailed
    from diagsafe_local.runs.attestation import PolicyResult, check_policy, public_key, verify_envelope

    if key is None and not hmac:
        raise DiagsafeError("verify-attestation needs a key to check: --key PUB.pem (Ed25519) or --hmac")
    public = None if key is None else public_key(key)
    secret = None
    if hmac:
        secret = signing.signing_key()
        if secret is None:
            raise DiagsafeError(f"--hmac needs the run's signing key in the environment variable {signing.KEY_ENV}")
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise DiagsafeError(f"{file}: cannot read it ({exc.strerror})") from None
    try:
        made = verify_envelope(raw, public, secret)
        if policy is not None:
            check_policy(made, policy)
    except RunFailed as exc:
        raise RunFailed(f"{file}: INVALID: {exc}") from None
    predicate = made.predicate
    decision = predicate.decision
    by = " and ".join(part for part, on in (("the Ed25519 key", public), ("the HMAC key", secret)) if on is not None)
    typer.echo(f"VALID  {file}: signed by {by}")
    for subject in made.subject:
        typer.echo(f"SUBJECT  {subject.name} {', '.join(f'{a}:{d}' for a, d in subject.digest.items())}")
    if isinstance(predicate, PolicyResult):
        typer.echo(f"POLICY  {predicate.policy.path} (SHA-256 {predicate.policy.sha256}): {predicate.verdict}")
        for entry in predicate.entries:
            run = "no verified run" if entry.run is None else f"run {entry.run.run_id}"
            typer.echo(f"ENTRY  {entry.name} ({entry.tier}, {run}): {entry.status}: {entry.figure}")
    else:
        typer.echo(f"RUN  {predicate.run.run_id} (signature: {predicate.run.signature})")
        for claim in predicate.claims:
            typer.echo(("PASS  " if claim.passed else "FAIL  ") + claim.line)
    typer.echo(
        f"DECISION  passed: {str(decision.passed).lower()}, outcome {decision.outcome}, exit code "
        f"{decision.exit_code}, {decision.checks} checks"
    )
    if not signature_only:  # the outcome, not its recorded exit code: both are signed, the outcome is the decision
        raise typer.Exit({"pass": 0, "inconclusive": 4}.get(decision.outcome, 1))
