"""The Python API, shaped like the command line: evaluate a config into a run directory, gate a run.

    import diagsafe_local as ds

    result = ds.evaluate("configs/checkpoint_7b_qwen_judge.yaml", target="/ckpt/step-1200", output_dir="runs/1200")
    print(result.summary.targets["step-1200"].asr.value)
    decision = result.gate(max_asr=0.05)            # or ds.gate("runs/1200", max_asr=0.05)
    if not decision.passed:
        print("\\n".join(decision.lines))

    series = ds.series_report("ckpts/safety-series")  # a training run's checkpoints (`watch`, the callback)
    latest = ds.gate("ckpts/safety-series", checkpoint="latest", max_asr=0.05)

Errors are the command line's, raised with the same messages: `DiagsafeError` (the CLI's exit 2: bad input),
`RunFailed` (exit 3: the run could not complete, or does not verify). A gate that says no is a decision, not an
error: `passed` is False and `lines` says why. `evaluate` runs in this process (tensor parallel where the plan
asks for it; data-parallel replicas are the `run` command's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.runs.gate import GateDecision
from diagsafe_local.runs.manifest import Manifest
from diagsafe_local.runs.summary import Summary

if TYPE_CHECKING:
    from diagsafe_local.runs.policy import PolicyDecision
    from diagsafe_local.runs.series import SeriesFigures


class RunResult(BaseModel):
    """A finished run: its directory, its verified summary (every figure recomputed from its records, as the gate
    decides on them: `runs.passes.decided`) and manifest, and what did not verify (empty for a run the gate will
    decide on)."""

    model_config = ConfigDict(frozen=True)

    run_dir: Path
    summary: Summary
    manifest: Manifest
    problems: list[str]

    def gate(self, **limits: Any) -> GateDecision:
        """`gate(self.run_dir, **limits)`."""
        return gate(self.run_dir, **limits)


def evaluate(
    config: str | Path | Any,
    *,
    target: str | None = None,
    output_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    overwrite: bool = False,
    engine_factory: Callable[..., Any] | None = None,
) -> RunResult:
    """Run (or resume) a config: a YAML path or a `RunConfig`. `target` replaces the model of its one target (as
    `--set target.model=...` does, the config's target name dropped with it), `output_dir` the run directory,
    `overrides` are `key.path=value` settings as `--set` takes them."""
    from diagsafe_local.evaluation.config import RunConfig, load_config
    from diagsafe_local.evaluation.pipeline import Run
    from diagsafe_local.runs.passes import decided
    from diagsafe_local.runs.verify import verify_run

    settings = [*overrides]
    if target is not None:
        settings.append(f"target.model={target}")
    if output_dir is not None:
        settings.append(f"output_dir={output_dir}")
    if isinstance(config, RunConfig):
        if settings:
            raise DiagsafeError("target, output_dir and overrides apply to a config file; edit the RunConfig instead")
        loaded = config
    else:
        loaded = load_config(Path(config), settings)
    run = Run(loaded, overwrite=overwrite, engine_factory=engine_factory)
    run.execute()
    verified = verify_run(run.dir.root)
    return RunResult(
        run_dir=run.dir.root, summary=decided(verified), manifest=verified.manifest, problems=verified.problems
    )


def gate(
    run_dir: str | Path,
    *,
    targets: Sequence[str] | None = None,
    baseline: str | Path | None = None,
    baseline_target: str | None = None,
    require_signature: bool = False,
    sensitivity: bool = False,
    checkpoint: str | None = None,
    attest: str | Path | None = None,
    **limits: float | Mapping[str, float] | bool,
) -> GateDecision:
    """The gate on a run directory, as `diagsafe-local gate` decides it: `limits` are the limits and switches of
    the limits table by name (`max_asr=0.05`, `max_asr_category={"cyber": 0.1}`, `allow_degenerate_judge=True`);
    `sensitivity` refuses a run without a judge sensitivity sample (`--sensitivity`); of a series directory
    (`watch`), on its `checkpoint` ("latest" or a step), compared with the series' baseline unless `baseline` is
    given; `attest` writes the decision there as a signed in-toto attestation (`gate --attest`). A switch that is
    not True or False is a `TypeError`; a run (or baseline) that does not verify raises `RunFailed`."""
    from diagsafe_local.runs import attestation
    from diagsafe_local.runs.gate import gate_run
    from diagsafe_local.runs.limits import LIMITS, SWITCHES
    from diagsafe_local.runs.series import gated_checkpoint
    from diagsafe_local.runs.series_state import is_series

    switches = {switch.name for switch in SWITCHES}
    known = {limit.name for limit in LIMITS} | switches
    unknown = sorted(set(limits) - known)
    if unknown:
        raise DiagsafeError(f"unknown gate limit(s) {unknown}; the limits are {sorted(known)}")
    flags = {"require_signature": require_signature, "sensitivity": sensitivity}
    for name, value in {**flags, **{n: v for n, v in limits.items() if n in switches}}.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    keys = None
    if attest is not None:  # the keys load before anything is decided; an older attestation never outlives it
        keys = attestation.signing_keys()
        Path(attest).unlink(missing_ok=True)
    if is_series(Path(run_dir)) or checkpoint is not None:
        _, run_dir, series_baseline, _ = gated_checkpoint(Path(run_dir), checkpoint, require_signature)
        baseline = baseline or series_baseline
    command_line: dict[str, Any] = {name: limits.get(name) for name in known}
    command_line["baseline_run"] = str(baseline) if baseline is not None else None
    command_line["baseline_target"] = baseline_target
    run, decision = gate_run(
        Path(run_dir),
        command_line,
        targets=list(targets) if targets else None,
        require_signature=require_signature,
        require_sensitivity=sensitivity,
    )
    if attest is not None and keys is not None:
        attestation.write(Path(attest), run, decision, list(targets) if targets else None, keys)
    return decision


def gate_policy(
    policy: str | Path,
    runs: Mapping[str, str | Path],
    *,
    require_signature: bool = False,
    sensitivity: bool = False,
    **switches: bool,
) -> PolicyDecision:
    """One release decision over several runs, as `diagsafe-local gate --policy FILE NAME=DIR...` decides it:
    `runs` maps each name the policy's entries use to its run directory; `switches` are the switches of the limits
    table that tighten the gate (`require_offline=True`), on for every entry as the command line's are. The
    decision's `exit_code` is the command's (GO 0, NO-GO 1, cannot verify 3, INCONCLUSIVE 4). A flag that is not
    True or False is a `TypeError`; an invalid policy file, an unknown switch or one that relaxes the gate (each
    entry's own) raises `DiagsafeError`."""
    from diagsafe_local.runs.limits import SWITCHES
    from diagsafe_local.runs.policy import decide_policy, load_policy

    unknown = sorted(set(switches) - {switch.name for switch in SWITCHES})
    if unknown:
        raise DiagsafeError(f"unknown gate switch(es) {unknown}; the switches are {[s.name for s in SWITCHES]}")
    flags = {"require_signature": require_signature, "sensitivity": sensitivity, **switches}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    return decide_policy(
        load_policy(Path(policy)),
        {name: Path(run) for name, run in runs.items()},
        require_signature=require_signature,
        require_sensitivity=sensitivity,
        switches=[name for name, on in switches.items() if on],
    )


def series_report(series_dir: str | Path, *, margin: float = 0.02, baseline: str | Path | None = None) -> SeriesFigures:
    """`diagsafe-local report SERIES_DIR`: every checkpoint's figures against the training step (written as
    series.json, report.md, report.html and figures/ into the series directory), returned typed."""
    from diagsafe_local.runs.series import write_series_report

    return write_series_report(Path(series_dir), margin, Path(baseline) if baseline else None).figures
