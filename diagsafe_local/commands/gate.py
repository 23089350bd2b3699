"""`diagsafe-local gate RUN_DIR`: exit 0 if the checkpoint meets the limits, 1 if not, 3 if the run (or its
baseline) does not verify or anything unexpected happens. Its limit options are generated from the limits
table (`runs.limits`); it imports only the read side of the package."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from diagsafe_local.commands.common import Hooks, fire_hooks, user_errors
from diagsafe_local.runs.limits import LIMITS, SWITCHES


def _category_limits(values: list[str], option: str) -> dict[str, float]:
    from diagsafe_local.core.errors import DiagsafeError

    limits = {}
    for value in values:
        name, sep, number = value.rpartition("=")
        try:
            limits[name] = float(number)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise DiagsafeError(f"{option} expects CATEGORY=NUMBER, got '{value}'")
    return limits


def limit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command one option per limit and switch of the tables (typed and documented from them); the
    command receives what was given as `command_line` (per-category limits as dicts)."""
    original = inspect.signature(fn, eval_str=True)
    extra = []
    for limit in LIMITS:
        kind: Any = list[str] | None if limit.per_category else float | None
        option = typer.Option(limit.option, help=limit.help, show_default=False)
        extra.append(
            inspect.Parameter(
                limit.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind, option]
            )
        )
    for switch in SWITCHES:
        option = typer.Option(switch.option, help=switch.help)
        extra.append(
            inspect.Parameter(
                switch.name, inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, option]
            )
        )

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        given: dict[str, Any] = {}
        for limit in LIMITS:
            value = kwargs.pop(limit.name, None)
            given[limit.name] = _category_limits(value, limit.option) if limit.per_category and value else value
        for switch in SWITCHES:
            given[switch.name] = kwargs.pop(switch.name, False)
        return fn(*args, **kwargs, command_line=given)

    kept = [p for p in original.parameters.values() if p.name != "command_line"]
    wrapper.__signature__ = original.replace(parameters=[*kept, *extra])  # type: ignore[attr-defined]
    return wrapper


@user_errors
@limit_options
def gate(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="A finished run directory; with --policy, the runs its entries name, as NAME=DIR.",
            metavar="RUN_DIR...",
        ),
    ],
    target: Annotated[list[str] | None, typer.Option(help="Check only these targets (repeatable).")] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="A baseline run directory (e.g. production's) for --max-asr-increase (default: a series' own; never "
            "one named by the run's config)."
        ),
    ] = None,
    baseline_target: Annotated[str | None, typer.Option(help="The baseline run's target, if it has several.")] = None,
    require_signature: Annotated[
        bool,
        typer.Option(
            help="Refuse a run (and a baseline run) without a valid signature.json: an HMAC of every run file, made by "
            "`run` and `merge` with the key in DIAGSAFE_SIGNING_KEY; the gate needs the same key."
        ),
    ] = False,
    sensitivity: Annotated[
        bool,
        typer.Option(
            "--sensitivity",
            help="Refuse a run without a judge sensitivity sample (judge.sensitivity); one that has it is always "
            "checked: a decision that a paraphrase of the judge's prompt flips is INCONCLUSIVE (exit 4).",
        ),
    ] = False,
    checkpoint: Annotated[
        str | None,
        typer.Option(
            help="With a series directory (`watch`): gate this checkpoint of it, `latest` or a step. The latest one "
            "not yet evaluated is refused, never passed over."
        ),
    ] = None,
    hook: Hooks = None,
    attest: Annotated[
        Path | None,
        typer.Option(
            help="Write the decision, pass or fail, as an in-toto Statement in a DSSE envelope to FILE, signed with "
            "DIAGSAFE_ATTEST_KEY (an Ed25519 private key, PEM) and/or DIAGSAFE_SIGNING_KEY; a run that does not "
            "verify gets none (an older FILE is removed first). With --policy: one attestation of the release "
            "decision, the policy signed into it, its subject the checkpoint all the runs evaluated. "
            "`verify-attestation` checks it.",
            metavar="FILE",
        ),
    ] = None,
    policy: Annotated[
        Path | None,
        typer.Option(
            help="A release policy (YAML): one decision over the runs given as NAME=DIR, each entry decided by the "
            "gate with its own limits and tier; GO 0, NO-GO 1 (3 when a critical run is missing or does not "
            "verify), INCONCLUSIVE 4; --require-offline applies to every entry. See docs/gate.md.",
            metavar="FILE",
        ),
    ] = None,
    *,
    command_line: dict[str, Any],
) -> None:
    """Pass (exit 0) or fail (exit 1) a run against its limits, with a one-screen reason; INCONCLUSIVE (exit 4)
    when every limit passed but a paraphrase of the judge's prompt decides otherwise (judge sensitivity). The run is verified
    first (complete, whole, its own, every figure recomputed from its records, its judge validation and
    signature checked): one that does not verify is refused with exit 3, as is anything unexpected; bad input
    exits 2. Limits on the command line are the authority; the run's config can only add stricter ones. With
    --policy FILE, one release decision over several runs given as NAME=DIR: GO 0, NO-GO 1 (3 when a critical
    run is missing or does not verify), INCONCLUSIVE 4."""
    from diagsafe_local.core.errors import DiagsafeError, Interrupted, RunFailed
    from diagsafe_local.runs.gate import gate_run
    from diagsafe_local.runs.series_state import is_series

    if policy is not None:
        given = {"--target": target, "--baseline": baseline, "--baseline-target": baseline_target}
        given |= {"--checkpoint": checkpoint, "--hook": hook}  # a hook gets one run's decision
        every = [s.name for s in SWITCHES if not s.relaxes and command_line.pop(s.name)]  # tightens every entry
        given |= {"--" + name.replace("_", "-"): value for name, value in command_line.items()}
        conflicting = [k for k, v in given.items() if v]
        _gate_policy(policy, run_dirs, require_signature, sensitivity, attest, conflicting, every)
    if len(run_dirs) != 1:
        raise DiagsafeError(f"gate takes one RUN_DIR, got {len(run_dirs)}: several runs are decided with --policy FILE")
    run_dir = run_dirs[0]
    keys = None
    if attest is not None:
        from diagsafe_local.runs import attestation

        keys = attestation.signing_keys()
        attest.unlink(missing_ok=True)  # an attestation of an earlier decision must not outlive this one
    if is_series(run_dir) or checkpoint is not None:
        from diagsafe_local.runs.series import gated_checkpoint

        entry, run_dir, series_baseline, signature = gated_checkpoint(run_dir, checkpoint, require_signature)
        typer.echo(f"NOTE  series checkpoint {entry.name} (step {entry.step}, {entry.status}): {run_dir}")
        typer.echo(f"NOTE  series state: {signature}")
        if baseline is None and series_baseline is not None:
            baseline, command_line["baseline_source"] = series_baseline, "the series' baseline"
    if baseline is not None:
        command_line["baseline_run"] = str(baseline)
    command_line["baseline_target"] = baseline_target
    try:
        run, decision = gate_run(
            run_dir,
            command_line,
            targets=target,
            require_signature=require_signature,
            require_sensitivity=sensitivity,
        )
    except (DiagsafeError, Interrupted):
        raise
    except BaseException as exc:  # fail closed: nothing unexpected may end in a pass, or in the "do not deploy" 1
        raise RunFailed(
            f"{run_dir}: refused: the gate stopped on an unexpected {type(exc).__name__} ({exc}); nothing was decided"
        ) from None
    for note in run.notes:
        typer.echo(f"NOTE  {note}")
    for line in decision.lines:
        typer.echo(line)
    if attest is not None and keys is not None:
        attestation.write(attest, run, decision, target, keys)
        typer.echo(f"NOTE  attestation written: {attest}")
    fire_hooks("on_gate", hook, lambda: _gate_event(run, decision))
    if decision.outcome == "inconclusive":
        typer.echo("GATE INCONCLUSIVE: the decision depends on the judge's wording (FLIP lines above)")
        raise typer.Exit(4)
    typer.echo("GATE PASSED" if decision.outcome == "pass" else "GATE FAILED")
    raise typer.Exit(0 if decision.outcome == "pass" else 1)


def _gate_policy(
    policy: Path,
    runs: list[Path],
    signed: bool,
    sensitivity: bool,
    attest: Path | None,
    conflicting: list[str],
    every: list[str],
) -> None:
    """`gate --policy FILE NAME=DIR...`: the table, each entry's lines, the verdict and its exit code; with
    --attest, the release decision as one attestation of the checkpoint the runs evaluated. `every`: the
    tightening switches given, on for every entry."""
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.runs.policy import decide_policy, named_runs, read_policy

    if conflicting:
        raise DiagsafeError(f"--policy: {', '.join(conflicting)} cannot be given with it: each entry sets its own")
    keys = None
    if attest is not None:
        from diagsafe_local.runs import attestation

        keys = attestation.signing_keys()
        attest.unlink(missing_ok=True)  # an attestation of an earlier decision must not outlive this one
    rules, sha256 = read_policy(policy)
    decision = decide_policy(
        rules,
        named_runs([str(run) for run in runs]),
        require_signature=signed,
        require_sensitivity=sensitivity,
        switches=every,
    )
    for outcome in decision.outcomes:
        typer.echo(f"== {outcome.entry.name} ({outcome.entry.tier}, run {outcome.entry.run}): {outcome.status}")
        for line in outcome.lines:
            typer.echo(line)
    for line in [*decision.table(), *decision.summary()]:
        typer.echo(line)
    if attest is not None and keys is not None:
        made = attestation.policy_statement(policy, sha256, rules, decision)
        attestation.write_statement(attest, made, keys)
        typer.echo(f"NOTE  attestation written: {attest} (policy SHA-256 {sha256})")
    raise typer.Exit(decision.exit_code)


def _gate_event(run: Any, decision: Any) -> Any:
    from diagsafe_local.hooks import GateEvent

    return GateEvent.of(run, decision)
