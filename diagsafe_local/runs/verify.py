"""What a decision on a run directory rests on, each input loaded through one verification path.

The gate (and, as a banner, the report) decides only on a run that verifies:
- read once: each run file is read once, and the bytes hashed for the signature and content checks are the bytes
  parsed and decided on (small files held, the results streamed through one hashing reader); a file swapped
  after it was read changes nothing that is decided, and a run file that is a symbolic link is refused
  (`files.RunFiles`);
- its record: manifest.json reads as a complete run's, its config hashes to its run id (a merged run: to the
  id of the runs it was merged from, and its id is theirs joined), and config.yaml is the tool's copy of the
  same config (the gate's own section included: the run's limits are the manifest's, and a config.yaml missing
  or not the tool's is refused, so no edit of it drops a limit);
- finished and whole: the manifest says `complete`, and there is a result for every (target, item, sample,
  judged turn) of the dataset the manifest lists (every item of the whole dataset: a shard, a merge of some
  shards or a run whose results were cut is refused, naming what is missing), and none for anything else;
- its own: every result, attack step and control verdict carries this run's id (or a merged source's) and
  is of an item of its dataset, and every result answers the very prompt its item asks (the manifest records
  each judged turn's prompt, hashed); summary.json names this run and its results file;
- derived, not taken: each result's benign, category and final_turn from its item in the run's dataset, its judge
  from the run's, and every recorded verdict (results, attack steps, paraphrases, controls) from its judge's recorded reply
  where the read side can read it (`runs.rederive`, which says what it cannot derive and why);
- attacked, where the config has an attack: every harmful item attacked to its end (broken, its query budget
  spent, or every chain ended), by this run;
- checked by each judging pass, as its row in `runs.passes` declares: the pass's check sees every result and
  reads the pass's own file (the judge's controls and its grammar canary, decided from its recorded reply
  whatever flag the manifest carries: `runs.controls`; the sensitivity sample: `runs.sensitivity`; each
  jury verdict as its rule makes it of the members' votes: `runs.jury`), and says what it could not judge;
- recomputed: every figure is recomputed from results.jsonl, attacks.jsonl and judge_controls.jsonl;
  summary.json is a cache, and one that disagrees with the recomputation, or whose SHA-256 of results.jsonl or
  sensitivity.jsonl is not theirs, is refused;
- corrected by the validation it recorded: the judge validation is read again from its directory and used only
  while its validation.json is the one the run recorded (by SHA-256), for the judge the run recorded;
- signed, where a key is set: the HMAC in signature.json over every run file (see `core.signing`).

A file that cannot be read is a reason to refuse (exit 3), never a usage error. What this cannot catch: someone
who can write the directory and rewrites every file consistently produces a run that verifies; only a signature
made with a key they do not hold (`gate --require-signature`) rules that out.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pydantic_core
import yaml
from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.core import jsonl
from diagsafe_local.core.cache import file_sha256
from diagsafe_local.core.collection import fewer_collections
from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.jsonl import Line
from diagsafe_local.runs import files
from diagsafe_local.runs import passes as table
from diagsafe_local.runs.attack_figures import goal_figures
from diagsafe_local.runs.controls import ControlsCheck
from diagsafe_local.runs.manifest import Manifest, config_fingerprint
from diagsafe_local.runs.records import SHOWN, AnswerKey, ResultRecord, WrongResults
from diagsafe_local.runs.rederive import Rederived
from diagsafe_local.runs.sensitivity import SampleCheck, TargetSensitivity
from diagsafe_local.runs.summarize import Summarizer
from diagsafe_local.runs.summary import Summary
from diagsafe_local.runs.validation import VALIDATION_FILE, JudgeValidation, validated_rates

# Summary fields that describe how the run went, not what it found: not recomputed from the results.
_NOT_RECOMPUTED = {"run_id", "reused", "results_sha256", "sensitivity_sha256", "throughput"}


class VerifiedRun(BaseModel):
    """A run directory as verified: its manifest, the summary recomputed from its records, the judge validation
    that verified (None: none, or it did not), and what failed.
    Its records are not held: `results()` and `attack_steps()` read them again, checked to be the bytes that
    were verified."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    run_dir: Path
    manifest: Manifest
    summary: Summary
    results_sha256: str | None = None
    attacks_sha256: str | None = None
    validation: JudgeValidation | None = None
    validation_problem: str | None = Field(
        None, description="Why the judge validation the run recorded did not verify."
    )
    problems: list[str]
    notes: list[str]
    signature_verified: bool = Field(False, description="Its signature verified with the key set here.")
    signature_sha256: str | None = Field(None, description="SHA-256 of signature.json as checked (None: none).")
    tallies: Summarizer | None = Field(None, exclude=True, description="What the summary was folded from.")
    passes: dict[str, table.PassRead] = Field(
        default_factory=dict, exclude=True, description="Each judging pass as read (`runs.passes`), by name."
    )

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def sensitivity(self) -> dict[str, TargetSensitivity] | None:
        """Each target's sample under its judge and under each paraphrase (judge.sensitivity); None: none, or one
        that did not verify."""
        read = self.passes.get("sensitivity")
        return read.check.figures() if read is not None and isinstance(read.check, SampleCheck) else None

    def results(self) -> Iterator[Line[ResultRecord]]:
        """The run's result records (with their place in the file), read again one at a time."""
        return _reread(self.run_dir / files.RESULTS, self.results_sha256)

    def attack_steps(self) -> Iterator[Line[ResultRecord]]:
        """The run's attack steps, read again one at a time (none without attacks.jsonl)."""
        return _reread(self.run_dir / files.ATTACKS, self.attacks_sha256)


def _reread(path: Path, verified: str | None) -> Iterator[Line[ResultRecord]]:
    """A verified file's records again; a file that changed since it was verified stops the reader (exit 3)
    before its last record is handed over, so nothing is decided on records that were not verified."""
    if verified is None:
        return
    digest = hashlib.sha256()
    held: Line[ResultRecord] | None = None
    try:
        for line in jsonl.stream(path, ResultRecord, digest):
            if held is not None:
                yield held
            held = line
    except DiagsafeError as exc:
        raise RunFailed(f"{path} changed after it was verified ({exc}): nothing is decided on it") from None
    if digest.hexdigest() != verified:
        raise RunFailed(f"{path} changed after it was verified: nothing is decided on it")
    if held is not None:
        yield held


@fewer_collections()  # a run's records stream past what it keeps (`core.collection`)
def verify_run(
    run_dir: Path,
    require_signature: bool = False,
    *,
    whole: bool = True,
    observe: Callable[[Line[ResultRecord], str], None] | None = None,
) -> VerifiedRun:
    """Check a run directory (see the module docstring). A directory that is not there is a usage error (exit
    2); a run file that does not read is refused (exit 3); everything else that fails is listed in `problems`,
    for the gate to refuse (exit 3) and the report to show. `whole=False` checks a shard as complete for its own
    share of the dataset (what `merge` needs of its sources). `observe` sees every result line in the pass that
    verifies them (a comparison gathers its columns there), with its record's prompt hash (`ResultRecord.asked`,
    which the dataset check computed: a pairing key reads it); what it gathered counts only if the run verifies."""
    if not run_dir.is_dir():
        raise DiagsafeError(f"{run_dir}: no such run directory")
    held = files.RunFiles(run_dir)
    manifest = held.model(files.MANIFEST, Manifest, "run manifest")
    if manifest is None:
        raise RunFailed(f"refused, {run_dir}: no {files.MANIFEST}: not a run directory (is this the run's directory?)")
    manifest_problems = _record(manifest)
    problems: list[str] = []
    notes: list[str] = []
    problems += _config_file(held.whole(files.CONFIG), manifest)
    validation, validation_notes = _validation(manifest)
    notes += validation_notes
    cached = held.model(files.SUMMARY, Summary, "run summary")
    if cached is None:
        problems.append(f"no {files.SUMMARY}: the run never finished")
    stored = cached or Summary(targets={})
    summarizer = Summarizer(
        # recomputed with the validation that verified; where the run recorded one that cannot be read here, with
        # the summary's own, which then corrects nothing the gate relies on (--corrected refuses such a run)
        validation or (stored.judge_validation if manifest.validation else None),
        manifest.attack,
        manifest.judge.instructions if manifest.judge else None,
    )
    coverage = _Coverage(manifest, whole)
    asked = _Asked(manifest)
    rederived = Rederived(manifest, files.RESULTS)
    checks = {row.name: row.check(manifest) for row in table.PASSES}
    sees = [check.see for check in checks.values()]  # each pass's check sees every result
    foreign: Counter[str] = Counter()
    allowed = manifest.run_ids()
    for line in held.stream(files.RESULTS, ResultRecord):
        record = line.record
        if record.run_id not in allowed:
            foreign[record.run_id] += 1
        coverage.see(record.key)
        prompt = record.asked()  # once a record: the dataset check and an observer's pairing key both read it
        asked.see(record, prompt)
        rederived.see(line)
        for see in sees:
            see(record)
        summarizer.add(record)
        if observe is not None:
            observe(line, prompt)
    results_sha256 = held.sha256(files.RESULTS)
    if results_sha256 is None:
        problems.append(f"no {files.RESULTS}")
    problems += _foreign(foreign, manifest)
    problems += coverage.problems()
    problems += asked.problems()
    problems += rederived.problems()
    notes += rederived.replies.notes
    if stored.results_sha256 != results_sha256:
        problems.append(
            "summary.json does not belong to results.jsonl (written by an older version, or the results changed "
            "after it); resume the run to rebuild it"
        )
    if stored.run_id != manifest.run_id:
        problems.append(f"summary.json is of run {stored.run_id}, not of this run ({manifest.run_id})")
    attack_foreign: Counter[str] = Counter()
    attack_rederived = Rederived(manifest, files.ATTACKS, items=False)
    steps = 0
    for line in held.stream(files.ATTACKS, ResultRecord):
        steps += 1
        attack_rederived.see(line)
        if line.record.run_id not in allowed:
            attack_foreign[line.record.run_id] += 1
        summarizer.add_attack_step(line.record)
    if manifest.attack is not None or steps:
        problems += _foreign(attack_foreign, manifest, files.ATTACKS)
        problems += _attack_coverage(summarizer, steps, manifest, whole)
        problems += attack_rederived.problems()
    read = {row.name: _read(held, row, checks[row.name]) for row in table.PASSES}
    for each in read.values():
        problems += each.check.problems()
        bound = each.row.summary_hash
        if cached is not None and bound is not None and getattr(cached, bound) != each.sha256:
            problems.append(
                f"summary.json does not belong to {each.row.file} (written by an older version, or the {each.row.name} "
                "verdicts changed after it); resume the run to rebuild it"
            )
    # the signature, checked against the bytes read above: never against the files read again
    signature, sign_note = held.signature(manifest.run_id, require_signature, table.signed_files())
    notes.insert(0, f"signature: {sign_note}")
    controls = checks["controls"]  # the judge's health is folded from its controls
    assert isinstance(controls, ControlsCheck)
    summarizer.controls = controls.records
    summary = summarizer.summary()
    summary = summary.model_copy(
        update={
            "run_id": stored.run_id,
            "reused": stored.reused,
            "results_sha256": stored.results_sha256,
            "targets": {
                name: stats.model_copy(
                    update={"throughput": stored.targets[name].throughput if name in stored.targets else None}
                )
                for name, stats in summary.targets.items()
            },
        }
    )
    mismatch = cached is not None and _summary_difference(
        stored.model_dump(mode="json"), summary.model_dump(mode="json")
    )
    if mismatch:
        problems.append(f"summary.json does not match the run's records: {mismatch}; resume the run to rebuild it")
    notes += _dataset_notes(manifest)
    return VerifiedRun(
        run_dir=run_dir,
        manifest=manifest,
        summary=summary,
        results_sha256=results_sha256,
        attacks_sha256=held.sha256(files.ATTACKS),
        validation=validation,
        validation_problem=validation_notes[0] if validation_notes else None,
        problems=manifest_problems + signature + problems,
        notes=notes,
        signature_verified=sign_note == "signature verified",
        signature_sha256=held.sha256(files.SIGNATURE),
        tallies=summarizer,
        passes=read,
    )


def _read(held: files.RunFiles, row: table.JudgingPass, check: table.PassCheck) -> table.PassRead:
    """A pass's own file read once and given to its check (a pass whose verdicts are in the results has its file
    read by no one but the signature)."""
    lines = held.records(row.file, row.record) if row.merge != "in_results" else None
    check.read(lines)
    records = None if lines is None else [line.record for line in lines]
    return table.PassRead(row=row, check=check, records=records, sha256=held.sha256(row.file))


def _record(manifest: Manifest) -> list[str]:
    """The manifest's own checks: finished, written by this version, and its config the one its id names."""
    problems = []
    if manifest.status != "complete":
        problems.append(
            f"the run is not complete (status '{manifest.status}'): it is still running, or was stopped; resume it "
            "with the same `run` command first"
        )
    missing = [
        what
        for what, absent in (
            ("its dataset's items", manifest.dataset.items is None),
            ("its judge", manifest.judge is None),
            ("its targets", not manifest.targets),
        )
        if absent
    ]
    if missing:
        problems.append(
            f"the manifest does not record {', '.join(missing)} (written by an older version), so the run cannot be "
            "checked; resume it with this version to record them"
        )
    fingerprint = config_fingerprint(manifest.config)
    if manifest.sources:
        sources = [source.run_id for source in manifest.sources]
        if manifest.run_id != "merged:" + "+".join(sources) or fingerprint not in sources:
            problems.append(
                f"the merged run's id {manifest.run_id} is not that of the runs it names, or its config is none of "
                "theirs (the manifest was edited)"
            )
    elif fingerprint != manifest.run_id:
        problems.append(
            f"the manifest's config is not the config of run {manifest.run_id} (it hashes to {fingerprint}): the "
            "manifest was edited"
        )
    return problems + _targets_of_config(manifest)


def _targets_of_config(manifest: Manifest) -> list[str]:
    """The manifest's targets must be the config's (the config is bound to the run id, the targets are not): a
    target's model or adapter edited in the manifest would name weights the run never answered with. A merged run
    may hold targets of the other runs' configs too."""
    configured = {}
    for target in manifest.config.get("targets") or []:
        model, lora = target.get("model"), target.get("lora")
        label = target.get("name") or Path(str(lora or model).rstrip("/")).name  # as TargetConfig.label
        configured[label] = (model, lora is not None)
    problems = [
        f"target '{label}' in the manifest is {ref.model!r}{' with' if ref.lora_hash else ' without'} an adapter, "
        f"the run's config says {configured[label][0]!r}{' with' if configured[label][1] else ' without'} one "
        "(the manifest was edited)"
        for label, ref in manifest.targets.items()
        if label in configured and (ref.model, ref.lora_hash is not None) != configured[label]
    ]
    if not manifest.sources and set(configured) != set(manifest.targets):
        problems.append(
            f"the manifest's targets ({', '.join(sorted(manifest.targets))}) are not the config's "
            f"({', '.join(sorted(configured))}): the manifest was edited"
        )
    return problems


def _config_file(raw: bytes | None, manifest: Manifest) -> list[str]:
    """config.yaml must be the tool's copy of the manifest's config (every run writes it, and never runs where a
    user's own config.yaml is): the run's gate: section is the manifest's, and a config.yaml that is missing, not
    the tool's or another config is refused rather than taken to mean a run without limits."""
    if raw is None:
        return [f"no {files.CONFIG}: every run writes its resolved config there (deleted?)"]
    if not raw.startswith(files.CONFIG_HEADER.encode()):
        return [f"{files.CONFIG} is not the tool's copy of the run's config (its first line was edited, or replaced)"]
    try:
        # libyaml's safe loader where PyYAML was built with it (ten times the pure-Python one: merge reads one per shard)
        written = yaml.load(raw.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (UnicodeDecodeError, yaml.YAMLError):
        return [f"{files.CONFIG} does not read as YAML (edited)"]
    if written != manifest.config:
        return [f"{files.CONFIG} and the manifest's config differ (one of them was edited)"]
    return []


def _foreign(foreign: Counter[str], manifest: Manifest, name: str = files.RESULTS) -> list[str]:
    """Records that another run wrote (their run id is not this run's, nor a merged source's), by run id."""
    if not foreign:
        return []
    listing = ", ".join(f"{n} of run {run_id}" for run_id, n in foreign.most_common(SHOWN))
    return [f"{name} holds results of another run ({listing}); this run is {manifest.run_id}"]


def _attack_coverage(summarizer: Summarizer, steps: int, manifest: Manifest, whole: bool) -> list[str]:
    """Goals the attack did not finish: a harmful item of the dataset that is neither broken, nor out of queries,
    nor at the end of every chain (and attack records of the run without an attack, or of no goal)."""
    attack, tally = manifest.attack, summarizer.attacks
    if attack is None or tally is None:
        return [f"{files.ATTACKS} holds {steps} attack records, and the run's config has no attack"]
    goals = [i.id for i in manifest.dataset.items or [] if not i.benign and (whole or manifest.owns(i.id))]
    left = dict(tally.goals)
    unfinished = []
    for target in manifest.samples():
        for goal in goals:
            if not goal_figures(left.pop((target, goal), []), attack)["finished"]:
                unfinished.append(f"{target}/{goal}")
    problems = []
    if unfinished:
        problems.append(
            f"the attack did not finish {len(unfinished)} of {len(goals) * len(manifest.samples())} goals (e.g. "
            + ", ".join(unfinished[:SHOWN])
            + "); resume the run to complete it"
        )
    if left:
        extra = [f"{t}/{i}" for t, i in sorted(left)][:SHOWN]
        problems.append(f"{files.ATTACKS} attacks goals the run's dataset does not have: " + ", ".join(extra))
    return problems


class _Asked(WrongResults):
    """Whether each result answers the prompt its item asks in the manifest's dataset (its user turns, hashed at
    run time): a result whose conversation was edited, or that came from another dataset's item of the same id,
    is not one this run made."""

    problem = (
        "{count} results answer prompts their items do not ask in the run's dataset (edited after the run, or made "
        "for another dataset), e.g. {shown}"
    )

    def __init__(self, manifest: Manifest) -> None:
        super().__init__()
        self.expected = {
            (item.id, turn): digest
            for item in manifest.dataset.items or []
            for turn, digest in (item.asked or {}).items()
        }

    def see(self, record: ResultRecord, prompt: str) -> None:
        """A record, with its prompt hash (`ResultRecord.asked`)."""
        digest = self.expected.get((record.item_id, record.turn))
        if digest is not None and prompt != digest:
            self._note(record)


class _Coverage:
    """Which answers the results cover, seen one key at a time: every (target, item, sample, judged turn) of the
    manifest's dataset (with `whole=False`, of a shard's own items) once, and nothing else. Each expected answer has
    a place worked out from its key (its target's first place, its sample, its item's turn: exact, no hash, so no
    two keys share one), and the places seen are one boolean each: a million answers cost 1 MB. They are marked a
    block at a time (one numpy step for 8,192 keys costs what one a key costs for a handful)."""

    _BLOCK = 8192

    def __init__(self, manifest: Manifest, whole: bool) -> None:
        self.manifest, self.whole = manifest, whole
        self.extra: list[AnswerKey] = []
        self.duplicated: list[AnswerKey] = []
        turns = [
            (item.id, turn)
            for item in manifest.dataset.items or []
            if whole or manifest.owns(item.id)
            for turn in item.turns
        ]
        self._per_sample = len(turns)
        self._turns: dict[tuple[str, int], int] = {}  # (item, turn) -> its place among one sample's answers
        for place, key in enumerate(turns):
            self._turns.setdefault(key, place)
        self._targets: dict[str, tuple[int, int]] = {}  # target -> (its first place, its samples)
        size = 0
        for target, samples in manifest.samples().items():
            self._targets[target] = (size, samples)
            size += samples * self._per_sample
        self.seen = np.zeros(size, dtype=bool)
        self._places = array("q")
        self._keys: list[AnswerKey] = []

    def _place(self, key: AnswerKey) -> int:
        """Where an expected answer lies (-1: the dataset has no such answer)."""
        target, item, sample, turn = key
        first = self._targets.get(target)
        at = self._turns.get((item, turn))
        if first is None or at is None or not 0 <= sample < first[1]:
            return -1
        return first[0] + sample * self._per_sample + at

    def see(self, key: AnswerKey) -> None:
        self._places.append(self._place(key))
        self._keys.append(key)
        if len(self._keys) == self._BLOCK:
            self._look_up()

    def _look_up(self) -> None:
        """Mark the held keys seen; name the first few seen twice, and every key the dataset does not have."""
        places = np.frombuffer(self._places, dtype=np.int64)
        found = places >= 0
        at = places[found]
        if self.seen[at].any() or len(np.unique(at)) < len(at):  # a key seen twice: name it, in order
            for index in np.flatnonzero(found):
                place = places[index]
                if self.seen[place] and len(self.duplicated) < SHOWN:
                    self.duplicated.append(self._keys[index])
                self.seen[place] = True
        else:
            self.seen[at] = True
        self.extra += [self._keys[index] for index in np.flatnonzero(~found)]  # counted; the first few are named
        self._places, self._keys = array("q"), []

    def problems(self) -> list[str]:
        self._look_up()
        manifest, shard = self.manifest, self.manifest.shard
        if manifest.dataset.items is None:
            return []  # an older manifest: said by _record
        problems = []
        if self.duplicated:
            problems.append(f"answers have more than one result, e.g. {self.duplicated[0]}")
        missing_count = int((~self.seen).sum())
        if missing_count:
            missing = self._missing()
            by_target = Counter(key[0] for key in missing)
            problems.append(
                f"{missing_count} of {len(self.seen)} judged answers are missing"
                + (f" (this is shard {shard.index} of {shard.count})" if shard and self.whole else "")
                + ": "
                + ", ".join(f"{target} {n}" for target, n in sorted(by_target.items()))
                + "; e.g. "
                + ", ".join(f"{t}/{i} sample {s} turn {k}" for t, i, s, k in sorted(missing)[:SHOWN])
                + (
                    "; merge every shard (diagsafe-local merge --config CONFIG --shards N) and gate the merged run"
                    if manifest.merged_from or shard
                    else "; resume the run to complete it"
                )
            )
        if self.extra:
            problems.append(
                f"{len(self.extra)} results are for answers the run's dataset does not have: "
                + ", ".join(f"{t}/{i} sample {s} turn {k}" for t, i, s, k in sorted(self.extra[:SHOWN]))
            )
        return problems

    def _missing(self) -> list[AnswerKey]:
        """The expected keys not seen (worked out again from the manifest: only when some are missing)."""
        return [k for k in self.manifest.expected_keys(self.whole) if not self.seen[self._place(k)]]


def _validation(manifest: Manifest) -> tuple[JudgeValidation | None, list[str]]:
    """The judge validation the run recorded, read again from its directory: used only while its validation.json
    has the content the run recorded and holds an entry for the run's judge."""
    ref, judge = manifest.validation, manifest.judge
    if ref is None or judge is None:
        return None, []
    path = Path(ref.directory) / VALIDATION_FILE
    if not path.is_file():
        return None, [f"judge validation {path} is not readable here: the corrected figures cannot be checked"]
    if file_sha256(path) != ref.sha256:
        return None, [f"judge validation {path} is not the one the run was corrected with (its content changed)"]
    identity = {"model": judge.model, "model_hash": judge.model_hash, "lora_hash": judge.lora_hash}
    try:
        return validated_rates(Path(ref.directory), ref.rubric, identity, judge.scoring), []
    except DiagsafeError as exc:
        return None, [f"judge validation {path} does not verify: {exc}"]


def _summary_difference(stored: Any, recomputed: Any) -> str | None:
    """`_first_difference` of two summaries as JSON, without walking them where they are equal (~5 against ~210 us
    a summary of the series). Exact: equal values differ nowhere for the walk (it compares numbers by isclose, which
    holds for equal ones, and the rest by ==), but for a NaN both hold as one object (a throughput copied from the
    stored summary): == takes an object for equal to itself, isclose never a NaN, so a dump that writes NaN (or a
    string holding "NaN") is walked, as is one that does not serialise (a lone surrogate `json.loads` let in)."""
    if stored == recomputed:
        try:
            if b"NaN" not in pydantic_core.to_json(stored, inf_nan_mode="constants"):
                return None
        except pydantic_core.PydanticSerializationError:
            pass
    return _first_difference(stored, recomputed)


def _first_difference(stored: Any, recomputed: Any, path: str = "") -> str | None:
    """Where two summaries first differ ('targets.t.asr.value: 0.0 in summary.json, 0.4 recomputed')."""
    if isinstance(stored, dict) and isinstance(recomputed, dict):
        for key in sorted(set(stored) | set(recomputed)):
            if not path and key in _NOT_RECOMPUTED:
                continue
            found = _first_difference(stored.get(key), recomputed.get(key), f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(stored, list) and isinstance(recomputed, list) and len(stored) == len(recomputed):
        for k, (a, b) in enumerate(zip(stored, recomputed)):
            found = _first_difference(a, b, f"{path}[{k}]")
            if found:
                return found
        return None
    numbers = (int, float)
    if isinstance(stored, numbers) and isinstance(recomputed, numbers) and not isinstance(stored, bool):
        if math.isclose(stored, recomputed, rel_tol=1e-9, abs_tol=1e-12):
            return None
    elif stored == recomputed:
        return None
    return f"{path} is {_short(stored)} in summary.json, {_short(recomputed)} recomputed"


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _dataset_notes(manifest: Manifest) -> list[str]:
    path = Path(manifest.dataset.path)
    if path.is_file() and file_sha256(path) != manifest.dataset.sha256:
        return [
            f"the dataset file {path} changed since the run (the run evaluated the version of SHA-256 "
            f"{manifest.dataset.sha256[:12]}; its items are listed in the manifest)"
        ]
    return []
