"""A release policy across runs (`gate --policy release.yaml RUN...`): one decision over several runs.

Each entry names a run given on the command line (`NAME=DIR`), its tier and its limits (the limits table's names,
`runs.limits`), and is decided by the gate itself (`gate_run`: the run verified, every figure recomputed). Its
status is read off the gate's own checks, never re-checked:

- MISSING: the run (or the entry's baseline) was not given, or does not verify (the gate refused it);
- BREACH: a check of the gate failed and its 95% interval lies wholly above its limit, or it has none (an
  unknown figure, a degenerate judge, unjudged answers);
- INSUFFICIENT_EVIDENCE: a check's 95% interval holds its limit, whether the gate passed it (the estimate is
  within the limit, its upper bound is not: the n that brings the upper bound under the limit at the observed
  rate is given, by the gate's Wilson interval) or failed it (a paired increase whose interval spans the
  margin); or the gate itself was inconclusive (a paraphrase of the judge's prompt decides otherwise);
- PASS: every check passed, each interval within its limit.

A switch that tightens the gate (`require_offline`) may also be said once for every entry, at the policy's top
level or on the command line (`gate --policy ... --require-offline`); either only adds to what an entry says.

Only critical entries decide: any MISSING is NO-GO with exit 3 (cannot verify), else any BREACH is NO-GO (1),
else any INSUFFICIENT_EVIDENCE is INCONCLUSIVE (4), else GO (0). Supporting entries are listed under the
verdict as warnings, advisory ones only in the table; neither changes the exit code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model, model_validator

from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.settings import StrictModel, load_settings
from diagsafe_local.runs.gate import Check, GateDecision, gate_run
from diagsafe_local.runs.limits import LIMITS, SWITCHES, LimitValue, SwitchValue
from diagsafe_local.runs.verify import VerifiedRun
from diagsafe_local.stats import wilson

Tier = Literal["critical", "supporting", "advisory"]
Status = Literal["PASS", "BREACH", "INSUFFICIENT_EVIDENCE", "MISSING"]
INCREASES = frozenset(limit.name for limit in LIMITS if limit.scope in ("increase", "increase_category"))
RELATIVE = frozenset(limit.name for limit in LIMITS if limit.relative)


def _limit_field(per_category: bool, help: str) -> Any:
    if per_category:
        return (dict[str, LimitValue] | None, Field(None, description=help))
    return (LimitValue | None, Field(None, description=help))


PolicyLimits: type[StrictModel] = create_model(  # type: ignore[call-overload]
    "PolicyLimits",
    __base__=StrictModel,
    __doc__="An entry's limits and switches: the gate's options by their table names (`runs.limits`), as the "
    "command line gives them (a policy is the authority a command line is).",
    **{limit.name: _limit_field(limit.per_category, limit.help) for limit in LIMITS},
    **{switch.name: (SwitchValue, Field(False, description=switch.help)) for switch in SWITCHES},
)


class Entry(StrictModel):
    """One entry of a release policy: a run, how much it counts, and the limits the gate decides it on."""

    name: str = Field(min_length=1, description="The entry's name in the table.")
    tier: Tier = Field(description="critical: decides the release; supporting: a warning; advisory: reported.")
    run: str = Field(min_length=1, description="The run's name on the command line (NAME=DIR).")
    baseline: str | None = Field(None, description="The baseline run's name on the command line, for increases.")
    baseline_target: str | None = Field(None, description="The baseline run's target, if it has several.")
    targets: list[str] | None = Field(None, description="Check only these targets of the run (default: all).")
    limits: PolicyLimits = Field(description="The limits and switches, by the names of the limits table.")

    @model_validator(mode="after")
    def _increase_needs_a_baseline(self) -> Entry:
        given = self.limits.model_dump(exclude_unset=True)
        increases = sorted(name for name in INCREASES if given.get(name))
        if increases and self.baseline is None:
            raise ValueError(f"{', '.join(increases)} needs a baseline: name the production run as `baseline:`")
        return self


EVERY_ENTRY = tuple(switch for switch in SWITCHES if not switch.relaxes)
"""The switches a policy's top level or the command line may turn on for every entry: only those that tighten."""

EveryEntry: type[StrictModel] = create_model(  # type: ignore[call-overload]
    "EveryEntry",
    __base__=StrictModel,
    __doc__="The switches of the gate's table that tighten it, said once for every entry of a policy.",
    **{s.name: (SwitchValue, Field(False, description=f"For every entry: {s.help}")) for s in EVERY_ENTRY},
)


class Policy(EveryEntry):
    """A release policy: its entries, at least one critical, and the tightening switches for every entry."""

    entries: list[Entry] = Field(min_length=1, description="The entries, in the order of the table.")

    @model_validator(mode="after")
    def _names_and_tiers(self) -> Policy:
        names = [entry.name for entry in self.entries]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"entry names must be unique, given twice: {', '.join(twice)}")
        if not any(entry.tier == "critical" for entry in self.entries):
            raise ValueError("no critical entry: nothing would decide the release (set `tier: critical` on one)")
        return self


def read_policy(path: Path) -> tuple[Policy, str]:
    """A release policy and the SHA-256 of the bytes it was parsed from, read once (what an attestation binds is
    what decided); errors name the file, line and field (exit 2)."""
    try:
        raw = path.read_bytes() if path.is_file() else None
    except OSError as exc:
        raise DiagsafeError(f"{path}: cannot read the release policy ({exc.strerror})") from None
    policy = load_settings(path, Policy, what="release policy", raw=raw)
    assert raw is not None  # load_settings refused a path that is not a file
    return policy, hashlib.sha256(raw).hexdigest()


def load_policy(path: Path) -> Policy:
    """Read and validate a release policy; errors name the file, line and field (exit 2)."""
    return read_policy(path)[0]


def named_runs(given: Sequence[str]) -> dict[str, Path]:
    """The runs of the command line: NAME=DIR, or DIR named by its last part. A name given twice is an error."""
    runs: dict[str, Path] = {}
    for text in given:
        name, sep, path = text.partition("=")
        if not sep or not name or "/" in name:
            name, path = Path(text).name, text
        if name in runs:
            raise DiagsafeError(f"run name '{name}' is given twice on the command line; name each as NAME=DIR")
        runs[name] = Path(path)
    return runs


class Outcome(BaseModel):
    """One entry as decided: its status, the figure against its limit, and the gate's lines."""

    entry: Entry
    status: Status
    figure: str
    needed: int | None = Field(None, description="Items at the observed rate that would decide it (INSUFFICIENT).")
    lines: list[str] = Field(default_factory=list)
    run: VerifiedRun | None = Field(None, exclude=True, description="The entry's run as verified (None: MISSING).")
    decision: GateDecision | None = Field(None, exclude=True, description="The gate's decision on it.")


class PolicyDecision(BaseModel):
    """The release decision over every entry, and its exit code."""

    outcomes: list[Outcome]
    verdict: Literal["GO", "NO-GO", "INCONCLUSIVE"]
    exit_code: int
    reason: str
    every_entry: dict[str, str] = Field(
        default_factory=dict, description="The tightening switches on for every entry, and who said so."
    )

    def table(self) -> list[str]:
        """The table: entry, tier, run, status, figure vs limit (plain text, for terminals and CI logs)."""
        rows = [("ENTRY", "TIER", "RUN", "STATUS", "FIGURE VS LIMIT")]
        rows += [(o.entry.name, o.entry.tier, o.entry.run, o.status, o.figure) for o in self.outcomes]
        widths = [max(len(r[k]) for r in rows) for k in range(4)]
        return ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]

    def summary(self) -> list[str]:
        """The verdict, then a warning per supporting entry that did not pass."""
        lines = [f"POLICY {self.verdict}: {self.reason}"]
        lines += [f"LIMIT {name} on every entry ({source})" for name, source in self.every_entry.items()]
        lines += [
            f"WARN  supporting entry {o.entry.name}: {o.status} (does not decide the release)"
            for o in self.outcomes
            if o.entry.tier == "supporting" and o.status != "PASS"
        ]
        return lines


def items_needed(rate: float, limit: float, most: int = 10**7) -> int | None:
    """The fewest answers at `rate` whose 95% Wilson upper bound (the gate's interval) is at most `limit`; None
    when no number up to `most` is (the rate is at or above the limit)."""

    def clears(n: int) -> bool:
        high = wilson(rate * n, n)[1]
        return high is not None and high <= limit

    if rate >= limit or not clears(most):
        return None
    low, high = 0, 1
    while not clears(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if not clears(mid) else (low, mid)
    return high


def _straddles(check: Check) -> bool:
    """The check's 95% interval holds its limit: the items neither show the figure within it nor beyond it."""
    low, high, limit = check.ci_low, check.ci_high, check.threshold
    return low is not None and high is not None and limit is not None and low <= limit < high


def _status(decision: GateDecision) -> tuple[Status, str, int | None]:
    """An entry's status read off the gate's checks (see the module docstring): a failed check whose interval
    lies above its limit, or that has none, is a BREACH; a check, passed or failed, whose interval holds its
    limit is INSUFFICIENT_EVIDENCE; the gate's own inconclusive too; else a pass."""
    breach = next((c for c in decision.made if not c.passed and not _straddles(c)), None)
    if breach is not None or decision.outcome == "fail" and not decision.made:
        return "BREACH", breach.line if breach else "the gate made no check", None
    short = next((c for c in decision.made if _straddles(c)), None)
    if short is not None:
        assert short.ci_high is not None and short.threshold is not None
        paired = short.limit in INCREASES  # its value is the interval's upper bound, not the estimate
        needed = None if paired or short.value is None else items_needed(short.value, short.threshold)
        more = (
            "the baseline's ASR is 0: no number of pairs decides a relative limit (give max_asr_increase)"
            if short.limit in RELATIVE and short.threshold == 0
            else "more pairs decide it (see the power NOTE; `plan --baseline-asr` sizes them)"
            if paired
            else f"n={needed} needed at this rate"
            if needed
            else "no n brings the upper bound under it at this rate"
        )
        return (
            "INSUFFICIENT_EVIDENCE",
            f"{short.line}; the 95% interval holds the limit {short.threshold:g}: {more}",
            needed,
        )
    if decision.outcome == "inconclusive":
        flip = next((line for line in decision.lines if line.startswith("FLIP")), "")
        return "INSUFFICIENT_EVIDENCE", flip.removeprefix("FLIP  ") or "the judge's wording decides", None
    made = decision.made[0].line if decision.made else ""
    return "PASS", made + (f" (+{len(decision.made) - 1} checks)" if len(decision.made) > 1 else ""), None


def _decide_entry(
    entry: Entry, runs: dict[str, Path], require_signature: bool, require_sensitivity: bool, every: Sequence[str]
) -> Outcome:
    absent = [name for name in (entry.run, entry.baseline) if name is not None and name not in runs]
    if absent:
        return Outcome(entry=entry, status="MISSING", figure=f"run {absent[0]} not given on the command line")
    gone = [name for name in (entry.run, entry.baseline) if name is not None and not runs[name].is_dir()]
    if gone:
        return Outcome(entry=entry, status="MISSING", figure=f"run {gone[0]}: no such run directory {runs[gone[0]]}")
    command_line: dict[str, Any] = entry.limits.model_dump(exclude_unset=True) | dict.fromkeys(every, True)
    command_line["authority"] = "the release policy"
    if entry.baseline is not None:
        command_line |= {"baseline_run": str(runs[entry.baseline]), "baseline_source": "the release policy"}
    command_line["baseline_target"] = entry.baseline_target
    try:
        run, decision = gate_run(
            runs[entry.run],
            command_line,
            targets=entry.targets,
            require_signature=require_signature,
            require_sensitivity=require_sensitivity,
        )
    except RunFailed as exc:
        first = str(exc).splitlines()[0]
        return Outcome(entry=entry, status="MISSING", figure=first, lines=str(exc).splitlines())
    except DiagsafeError:  # a usage error of the entry's: decide_policy names the entry
        raise
    except Exception as exc:  # fail closed: nothing unexpected passes an entry
        return Outcome(entry=entry, status="MISSING", figure=f"the gate stopped on an unexpected {type(exc).__name__}")
    status, figure, needed = _status(decision)
    notes = [f"NOTE  {note}" for note in run.notes]
    return Outcome(
        entry=entry,
        status=status,
        figure=figure,
        needed=needed,
        lines=notes + decision.lines,
        run=run,
        decision=decision,
    )


def decide_policy(
    policy: Policy,
    runs: dict[str, Path],
    *,
    require_signature: bool = False,
    require_sensitivity: bool = False,
    switches: Sequence[str] = (),
) -> PolicyDecision:
    """Every entry decided by the gate, then the release (see the module docstring); `switches` the tightening
    ones the command line turns on for every entry. A run no entry names is a usage error (a misspelt name would
    otherwise leave its entry MISSING unnoticed)."""
    relaxing = sorted(set(switches) - {s.name for s in EVERY_ENTRY})
    if relaxing:
        raise DiagsafeError(f"{', '.join(relaxing)} cannot be said for every entry: each entry relaxes its own gate")
    every: dict[str, str] = {}
    for switch in EVERY_ENTRY:
        said = {"the policy": getattr(policy, switch.name), "the command line": switch.name in switches}
        if any(said.values()):
            every[switch.name] = " and ".join(who for who, on in said.items() if on)
    named = {e.run for e in policy.entries} | {e.baseline for e in policy.entries if e.baseline}
    unused = sorted(set(runs) - named)
    if unused:
        raise DiagsafeError(f"run(s) {', '.join(unused)} given, but no entry of the policy names them")
    outcomes = []
    for entry in policy.entries:
        try:
            outcomes.append(_decide_entry(entry, runs, require_signature, require_sensitivity, list(every)))
        except DiagsafeError as exc:  # a usage error of the entry's (an unknown target, category)
            raise DiagsafeError(f"release policy entry {entry.name}: {exc}") from None
    verdict, code, reason = verdict_of({o.status for o in outcomes if o.entry.tier == "critical"})
    return PolicyDecision(outcomes=outcomes, verdict=verdict, exit_code=code, reason=reason, every_entry=every)


def verdict_of(critical: set[Status]) -> tuple[Literal["GO", "NO-GO", "INCONCLUSIVE"], int, str]:
    """The release verdict, its exit code and reason, from the critical entries' statuses."""
    if "MISSING" in critical:
        return "NO-GO", 3, "a critical run is missing or does not verify: nothing can be decided on it"
    if "BREACH" in critical:
        return "NO-GO", 1, "a critical entry breaches its limits"
    if "INSUFFICIENT_EVIDENCE" in critical:
        return "INCONCLUSIVE", 4, "a critical entry has too few items (or judge wordings) to decide"
    return "GO", 0, "every critical entry passed"
