"""A tamper fuzzer for the gate: real run directories made by the tool (one target signed and validated, a sweep
with a baseline run, an adaptive attack, a merge of shards; the judging passes and the series are in
test_gate_fuzz_passes.py), and, for each, mutations of every file the gate reads or the signature covers: each
JSON field changed, deleted, or swapped to another valid value (a parse status, a label, a score, a run id of a
sibling run); keys and lines added; lines deleted, duplicated, reordered, or taken from a sibling run; the
results edited with the summary's hash of them rewritten to match (what an editor without the key would do);
bytes flipped, files truncated, deleted, emptied, replaced by a sibling's, or replaced by a symlink to it.

Two properties. A mutation that must be refused is refused (exit 3): a line or a run id of another run, a broken
hash, a truncated or deleted decision file, a decision file that is now another run's file (copied or a symlink
to it), and on a signed run gated with --require-signature any change to a signed byte. Every other mutation is
refused, or reaches exactly the decision of the untouched run (exit code and every PASS/FAIL/FLIP line). The fast
tier runs a sample of each kind of mutation, rotated by a seed (DIAGSAFE_FUZZ_SEED, else today's date; printed);
the slow tier a wider sample (DIAGSAFE_FUZZ_PER_KIND=all runs every one, by hand; DIAGSAFE_FUZZ_CASES and
DIAGSAFE_FUZZ_KINDS, comma-separated names, narrow it to some cases and kinds, to run it in shards).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import random
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_adversarial import cli, config_file, perfect_validation, scripted, write_items
from test_attacks import GOALS, responder

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.runs.summary import write_summary
from diagsafe_local.runs.verify import verify_run

KEY = "fuzz-key-" + "k" * 24
FAST_PER_KIND = 6  # the fast tier's sample of each kind (CI's budget)
DELETE = b"\0delete"
# The files the gate decides on, in a run directory; the signature covers these and generations.jsonl, jury.jsonl.
DECISION_FILES = ("manifest.json", "config.yaml", "results.jsonl", "judge_controls.jsonl", "summary.json",
                  "attacks.jsonl", "sensitivity.jsonl")  # fmt: skip
RUN_FILES = (*DECISION_FILES, "generations.jsonl", "jury.jsonl", "signature.json")
# Another valid value of a field: a status, a label, a finish reason, a series entry's status.
SWAPS = {"ok": ("invalid", "truncated", "error"), "harmful": ("not_harmful", "uncertain"),
         "not_harmful": ("harmful",), "stop": ("length",), "complete": ("running",), "finished": ("failed", "seen")}  # fmt: skip


@dataclass
class Case:
    """A directory the gate is given, how it is gated, every file it reads for it, and what must be refused."""

    name: str
    run_dir: Path  # what `gate` is given (a run, or a series directory)
    args: tuple[str, ...]
    files: list[Path]
    guarded: frozenset[Path] = frozenset()  # files any change to which must be refused (signed ones, weights)
    other: dict[Path, Path] = field(default_factory=dict)  # a directory's sibling of the same shape
    foreign_id: str | None = None  # a sibling run's id (not one this run's results may carry)
    decision: tuple[int, tuple[str, ...]] = (0, ())
    env: dict[str, str] = field(default_factory=dict)

    def must_refuse(self, path: Path) -> bool:
        """Whether any change to this file must be refused (a signed file under --require-signature)."""
        return path in self.guarded


@dataclass(frozen=True)
class Mutation:
    path: Path
    kind: str  # the family, for a sample of each
    what: str
    made: bytes | Callable[[], bytes]  # the new content, or how to make it (only a sampled one is made)
    # A second file rewritten to match (the summary's results hash), or how to make it.
    also: tuple[tuple[Path, bytes], ...] | Callable[[], tuple[tuple[Path, bytes], ...]] = ()
    refuse: bool = False  # it must be refused (exit 3), not merely decided the same
    link: Path | None = None  # the file is replaced by a symlink to this one
    resummarise: bool = False  # summary.json is then recomputed from the edited records, as `run` writes it

    @property
    def content(self) -> bytes:
        return self.made if isinstance(self.made, bytes) else self.made()

    def rewrites(self) -> tuple[tuple[Path, bytes], ...]:
        """Each file it writes, with its new content."""
        return ((self.path, self.content), *(self.also() if callable(self.also) else self.also))


def gate(case: Case, monkeypatch: pytest.MonkeyPatch) -> tuple[int, tuple[str, ...]]:
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    result = cli("gate", case.run_dir, *case.args)
    lines = tuple(line for line in result.output.splitlines() if line.startswith(("PASS", "FAIL", "FLIP", "GATE")))
    return result.exit_code, lines


def run_files(run_dir: Path) -> list[Path]:
    """The files of a run directory the gate reads or its signature covers."""
    return [run_dir / n for n in RUN_FILES if (run_dir / n).is_file()]


def run_id(run_dir: Path) -> str:
    return str(json.loads((run_dir / "manifest.json").read_text())["run_id"])


# -- the runs ---------------------------------------------------------------------------------------------------


def _build(root: Path) -> list[Case]:
    mp = pytest.MonkeyPatch()
    try:
        return _cases(root, mp)
    finally:
        mp.undo()


def decided(cases: list[Case], mp: pytest.MonkeyPatch) -> list[Case]:
    """The cases with the decision each gets untouched (one the gate reached, with its lines)."""
    for case in cases:
        case.decision = gate(case, mp)
        assert case.decision[0] in (0, 1, 4) and len(case.decision[1]) > 1, (case.name, case.decision)
    return cases


def _cases(root: Path, mp: pytest.MonkeyPatch) -> list[Case]:
    cases = []
    scripted(mp)
    items = write_items(
        root / "items.jsonl", 10, prompt=lambda k: ("Sure " if k % 3 == 0 else "") + f"q{k}", category="c"
    )
    # one target, signed, its judge validated, its sensitivity to the judge's wording sampled
    validation = perfect_validation(root)
    mp.setenv("DIAGSAFE_SIGNING_KEY", KEY)
    judge = {"model": "j", "validation": str(validation), "sensitivity": {"variants": 2, "sample": 4}}
    for name in ("signed", "signed_twin"):
        assert cli("run", config_file(root, items, name, judge=judge)).exit_code == 0
    mp.delenv("DIAGSAFE_SIGNING_KEY")
    # a sweep against a production run (another model's: a baseline that is the candidate's own run is refused)
    for name, model in (("prod", "production"), ("sweep", "t")):
        sweep = {"targets": [{"model": model, "name": "t"}, {"model": model, "name": "u", "system_prompt": "be brief"}]}
        assert cli("run", config_file(root, items, name, **sweep)).exit_code == 0
    signed, prod = root / "signed", root / "prod"
    args = ("--max-asr", "0.5", "--max-asr-category", "c=0.6", "--allow-degenerate-judge", "--corrected")
    files = [*run_files(signed), validation / "validation.json"]
    twin = {signed: root / "signed_twin"}
    cases.append(Case("signed", signed, (*args, "--require-signature"), files, guarded=frozenset(run_files(signed)), other=twin,
                      foreign_id=run_id(prod), env={"DIAGSAFE_SIGNING_KEY": KEY}))  # fmt: skip
    cases.append(Case("validated", signed, args, files, other=twin, foreign_id=run_id(prod),
                      env={"DIAGSAFE_SIGNING_KEY": ""}))  # fmt: skip
    increase = ("--baseline", str(prod), "--max-asr-increase", "0.9", "--max-asr", "0.5", "--allow-degenerate-judge")
    cases.append(Case("sweep", root / "sweep", increase, [*run_files(root / "sweep"), *run_files(prod)],
                      other={root / "sweep": prod}, foreign_id=run_id(signed)))  # fmt: skip
    # an adaptive attack
    scripted(mp, judge=responder, target=responder)  # the judge's model writes the attacker's prompts too
    goals = root / "goals.jsonl"
    goals.write_text("".join(json.dumps(g) + "\n" for g in GOALS))
    attack = {"placement": {"mode": "colocate"}, "attack": {"strategy": "pair", "streams": 2, "depth": 2}}
    assert cli("run", config_file(root, goals, "attacked", **attack)).exit_code == 0
    cases.append(Case("attack", root / "attacked", ("--max-attack-asr", "0.7", "--allow-degenerate-judge"),
                      run_files(root / "attacked"), foreign_id=run_id(signed)))  # fmt: skip
    # shards merged
    scripted(mp)
    config = config_file(root, items, "sharded")
    for index in range(2):
        assert cli("run", config, "--shard", f"{index}/2").exit_code == 0
    shards = sorted((root / "sharded" / "shards").glob("shard-*"))
    assert cli("merge", *shards, "--out", root / "merged").exit_code == 0
    cases.append(Case("merged", root / "merged", ("--max-asr", "0.5", "--allow-degenerate-judge"),
                      run_files(root / "merged"), other={root / "merged": signed}, foreign_id=run_id(signed)))  # fmt: skip
    return decided(cases, mp)


# -- the mutations ----------------------------------------------------------------------------------------------


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(value, dict):
        if not value:
            yield path
        for key, inner in value.items():
            yield from _leaves(inner, (*path, key))
    elif isinstance(value, list) and value:
        for k, inner in enumerate(value):
            yield from _leaves(inner, (*path, k))
    else:
        yield path


def _dicts(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of every mapping in a document, the document first."""
    if isinstance(value, dict):
        yield path
        for key, inner in value.items():
            yield from _dicts(inner, (*path, key))
    elif isinstance(value, list):
        for k, inner in enumerate(value):
            yield from _dicts(inner, (*path, k))


def _changed(value: Any) -> list[Any]:
    """Other values of the same kind (and one of another kind)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [value + 0.1, 1.0 - value if value != 0.5 else 0.25]
    if isinstance(value, str):
        return [value + "x", ""]
    if value is None:
        return [0, "x"]
    return [None]


def _at(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _edited(doc: Any, path: tuple, change: Callable[[Any, Any], None]) -> Any:
    """A copy of `doc` with `change(parent, key)` applied at `path`."""
    doc = json.loads(json.dumps(doc))
    change(_at(doc, path[:-1]), path[-1])
    return doc


def _set(doc: Any, path: tuple, value: Any) -> Any:
    return _edited(doc, path, lambda parent, key: parent.__setitem__(key, value))


def _is_hash(key: Any) -> bool:
    """A hash the gate checks against what it read: the summary's of the results and the paraphrase verdicts (a
    manifest's dataset hash names a file the gate never reads)."""
    return key in ("results_sha256", "sensitivity_sha256")


def _field_mutations(
    case: Case, path: Path, doc: Any, dump: Callable[[Any], bytes], where: str = ""
) -> Iterator[Mutation]:
    """Each field changed, deleted, swapped to another valid value; a key added to each mapping."""
    decisive = path.name in DECISION_FILES
    signed = case.must_refuse(path)
    for leaf in _leaves(doc):
        if not leaf:
            continue
        value, name = _at(doc, leaf), where + ".".join(map(str, leaf))
        broken = decisive and _is_hash(leaf[-1]) and isinstance(value, str)  # a hash the gate checks
        # Each edit is made (a copy of the document dumped) only if the sample tries it: a case has thousands.
        setter = lambda other, leaf=leaf: lambda: dump(_set(doc, leaf, other))  # noqa: E731
        for other in _changed(value):
            yield Mutation(path, "field", f"{name} = {other!r}", setter(other), refuse=signed or broken)
        if isinstance(value, str):
            for other in SWAPS.get(value, ()):
                yield Mutation(path, "swap", f"{name} = {other!r}", setter(other), refuse=signed)
        if leaf[-1] == "run_id" and case.foreign_id not in (None, value):
            foreign = setter(case.foreign_id)
            yield Mutation(path, "foreign", f"{name} = a sibling's run id", foreign, refuse=signed or decisive)
        deleted = lambda leaf=leaf: dump(_edited(doc, leaf, lambda p, k: p.__delitem__(k)))  # noqa: E731
        yield Mutation(path, "field", f"{name} deleted", deleted, refuse=signed)
    for node in _dicts(doc):
        where_added = where + (".".join(map(str, node)) or "top level")
        added = lambda node=node: dump(_set(doc, (*node, "zz_added"), 1))  # noqa: E731
        yield Mutation(path, "added key", f"{where_added}: key added", added, refuse=signed)


def _resummarised(mutation: Mutation) -> Mutation:
    """An edit of the records with summary.json recomputed from them (its figures and hashes all agree)."""
    what = mutation.what + " (summary recomputed)"
    return dataclasses.replace(mutation, kind="resummarised", what=what, resummarise=True)


def _rehashed(mutation: Mutation) -> Mutation:
    """A results edit with the summary's hash of the results rewritten to match."""
    summary_path = mutation.path.parent / "summary.json"

    def rehash() -> tuple[tuple[Path, bytes], ...]:
        summary = json.loads(summary_path.read_text())
        summary["results_sha256"] = hashlib.sha256(mutation.content).hexdigest()
        return ((summary_path, json.dumps(summary).encode()),)

    return Mutation(mutation.path, "rehashed", mutation.what + " (summary's hash rewritten)", mutation.made, rehash,
                    refuse=mutation.refuse)  # fmt: skip


def _line_id(line: str) -> Any:
    return json.loads(line).get("run_id") if line.strip() else None


def _jsonl_mutations(case: Case, path: Path, raw: bytes, theirs: list[str]) -> Iterator[Mutation]:
    """Each line's fields; lines deleted, duplicated, reordered, taken from a sibling, added."""
    lines = raw.decode().splitlines(keepends=True)
    signed, results, decisive = case.must_refuse(path), path.name == "results.jsonl", path.name in DECISION_FILES
    for k, line in enumerate(lines):
        rest = lambda new, k=k: "".join([*lines[:k], *new, *lines[k + 1 :]]).encode()  # noqa: E731
        dump = lambda doc, rest=rest: rest([json.dumps(doc, ensure_ascii=False) + "\n"])  # noqa: E731
        made = list(_field_mutations(case, path, json.loads(line), dump, f"line {k + 1}: "))
        yield from made
        if results:
            yield from (_rehashed(m) for m in made if m.kind != "added key")
        if results or path.name == "sensitivity.jsonl":
            yield from (_resummarised(m) for m in made if m.kind in ("field", "swap", "foreign"))
        yield Mutation(path, "lines", f"line {k + 1} deleted", rest([]), refuse=signed or results)
        yield Mutation(path, "lines", f"line {k + 1} duplicated", rest([line, line]), refuse=signed or results)
        if k:
            swapped = [*lines[: k - 1], lines[k], lines[k - 1], *lines[k + 1 :]]
            yield Mutation(path, "lines", f"lines {k} and {k + 1} swapped", "".join(swapped).encode(), refuse=False)
        if k < len(theirs) and theirs[k] != line:
            foreign = decisive and _line_id(theirs[k]) != _line_id(line)
            yield Mutation(path, "sibling line", f"line {k + 1} taken from a sibling run", rest([theirs[k]]),
                           refuse=signed or foreign)  # fmt: skip
    if lines:
        extra = json.loads(lines[-1])
        if "item_id" in extra:
            extra["item_id"] = "zz-added"
        added = json.dumps(extra, ensure_ascii=False) + "\n"
        yield Mutation(path, "added line", "a line for an item the run has not", raw + added.encode(),
                       refuse=signed or results)  # fmt: skip
    yield Mutation(path, "added line", "a blank line added", raw + b"\n", refuse=signed)
    if theirs and theirs[-1] not in lines:
        foreign = decisive and bool(lines) and _line_id(theirs[-1]) != _line_id(lines[-1])
        yield Mutation(path, "added line", "a sibling run's line added", raw + theirs[-1].encode(),
                       refuse=signed or foreign)  # fmt: skip


def _damage(case: Case, path: Path, raw: bytes) -> Iterator[Mutation]:
    """Bytes flipped (at positions fixed by the file's name), the file truncated."""
    signed, decisive = case.must_refuse(path), path.name in DECISION_FILES
    rng = random.Random(path.name)
    for at in sorted(rng.sample(range(len(raw)), min(4, len(raw)))):
        flipped = bytearray(raw)
        flipped[at] ^= 0x01
        yield Mutation(path, "bytes", f"byte {at} flipped", bytes(flipped), refuse=signed)
    if raw:
        yield Mutation(path, "bytes", "truncated to half", raw[: len(raw) // 2], refuse=signed or decisive)
        hashed = path.name != "signature.json" or not raw[-1:].isspace()  # the signature does not sign itself
        yield Mutation(path, "bytes", "last byte cut", raw[:-1], refuse=signed and hashed)


def _another_run(ours: Path, theirs: Path) -> bool:
    """Whether a sibling directory is another run (a run of the same config, re-run elsewhere, is not) or
    another series."""
    manifests = ours / "manifest.json", theirs / "manifest.json"
    return not all(m.is_file() for m in manifests) or run_id(ours) != run_id(theirs)


def mutations(case: Case) -> list[Mutation]:
    found: list[Mutation] = []
    for path in case.files:
        raw = path.read_bytes()
        sibling = case.other.get(path.parent, path.parent) / path.name
        theirs = sibling.read_bytes() if sibling != path and sibling.is_file() else None
        if path.suffix == ".jsonl":
            found += _jsonl_mutations(case, path, raw, theirs.decode().splitlines(keepends=True) if theirs else [])
            found.append(Mutation(path, "file", "emptied", b"", refuse=case.must_refuse(path)))
        elif path.suffix == ".json":
            found += _field_mutations(case, path, json.loads(raw), lambda doc: json.dumps(doc, indent=2).encode())
        elif path.suffix == ".safetensors":  # weights: flipped (cut or deleted, they are no checkpoint yet)
            found += (m for m in _damage(case, path, raw) if "flipped" in m.what)
            continue
        elif path.name == "config.yaml":  # its text edited line by line
            for k, line in enumerate(raw.decode().splitlines(keepends=True)):
                edited = raw.decode().splitlines(keepends=True)
                edited[k] = line.replace(":", ": x #", 1) if ":" in line else line + "x\n"
                found.append(Mutation(path, "field", f"{path.name} line {k + 1} edited", "".join(edited).encode(),
                                      refuse=case.must_refuse(path)))  # fmt: skip
        found += _damage(case, path, raw)
        decisive = path.name in DECISION_FILES or case.must_refuse(path)
        found.append(Mutation(path, "file", "deleted", DELETE, refuse=decisive))
        if theirs is not None and theirs != raw:  # another run's file, copied or linked: never this run's
            alien = decisive and _another_run(path.parent, sibling.parent)
            found.append(Mutation(path, "file", "replaced by a sibling's", theirs, refuse=alien))
            found.append(Mutation(path, "symlink", "a symlink to a sibling's", b"", refuse=alien, link=sibling))
    return found


def apply(mutation: Mutation) -> list[tuple[Path, bytes | None]]:
    """Apply a mutation; return what to put back."""
    undo = []
    for path, content in mutation.rewrites():  # made before any is written (the summary is read as it was)
        undo.append((path, path.read_bytes() if path.exists() else None))
        path.unlink(missing_ok=True)
        if mutation.link is not None and path == mutation.path:
            path.symlink_to(mutation.link)
        elif content != DELETE:
            path.write_bytes(content)
    if mutation.resummarise:
        summary = mutation.path.parent / "summary.json"
        undo.append((summary, summary.read_bytes()))
        try:
            write_summary(summary.parent, verify_run(summary.parent).summary)
        except DiagsafeError:  # records that do not read: the summary stays as it was
            pass
    return undo


def restore(undo: list[tuple[Path, bytes | None]]) -> None:
    for path, content in reversed(undo):
        path.unlink(missing_ok=True)
        if content is not None:
            path.write_bytes(content)


# -- the fuzz -----------------------------------------------------------------------------------------------------


def slow_per_kind() -> int | None:
    """The slow tier's sample: DIAGSAFE_FUZZ_PER_KIND mutations of each kind (default 25), or `all` of them (about
    100,000 gate calls over both fuzz files: ~45 minutes of one core here under load, so a run by hand in shards,
    never CI's; docs/benchmarks-log.md has the figures)."""
    given = os.environ.get("DIAGSAFE_FUZZ_PER_KIND", "25")
    return None if given == "all" else int(given)


def _names(variable: str) -> frozenset[str] | None:
    given = os.environ.get(variable, "")
    return frozenset(n.strip() for n in given.split(",") if n.strip()) or None


def wide_fuzz(cases: list[Case], monkeypatch: pytest.MonkeyPatch) -> None:
    """The slow tier: the cases DIAGSAFE_FUZZ_CASES names (every one if unset; skipped where it names none of
    these), a sample of DIAGSAFE_FUZZ_PER_KIND of each kind, or all, of the kinds DIAGSAFE_FUZZ_KINDS names."""
    names = _names("DIAGSAFE_FUZZ_CASES")
    chosen = [case for case in cases if names is None or case.name in names]
    if not chosen:
        pytest.skip(f"DIAGSAFE_FUZZ_CASES names none of {[case.name for case in cases]}")
    kinds = _names("DIAGSAFE_FUZZ_KINDS")
    tally = fuzz(chosen, monkeypatch, per_kind=slow_per_kind(), kinds=kinds)
    assert tally.tried > 700 or bool(names or kinds) and tally.tried > 0


def fuzz_seed() -> int:
    """The fast tier's seed: DIAGSAFE_FUZZ_SEED, else today's date (so the sample rotates daily)."""
    return int(os.environ.get("DIAGSAFE_FUZZ_SEED") or datetime.date.today().strftime("%Y%m%d"))


def sample(every: list[Mutation], rng: random.Random, per_kind: int) -> list[Mutation]:
    """Up to `per_kind` mutations of each kind, those that must be refused first among equals."""
    kinds: dict[str, list[Mutation]] = defaultdict(list)
    for mutation in every:
        kinds[mutation.kind].append(mutation)
    chosen = []
    for kind in sorted(kinds):
        strict = [m for m in kinds[kind] if m.refuse]
        loose = [m for m in kinds[kind] if not m.refuse]
        half = min(len(strict), max(per_kind // 2, per_kind - len(loose)))
        chosen += rng.sample(strict, half) + rng.sample(loose, min(len(loose), per_kind - half))
    return chosen


@dataclass
class Tally:
    """What a fuzz tried: gate calls, mutations that had to be refused, and those that got a wrong answer."""

    seed: int
    tried: int = 0
    strict: int = 0
    by_case: dict[str, int] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)


def fuzz(
    cases: list[Case], monkeypatch: pytest.MonkeyPatch, per_kind: int | None, kinds: frozenset[str] | None = None
) -> Tally:
    """Gate every case under its mutations (all, or a seeded sample of each kind; of the `kinds` named, or every
    kind); assert both properties."""
    tally = Tally(fuzz_seed())
    rng = random.Random(tally.seed)
    print(f"fuzz seed {tally.seed} (DIAGSAFE_FUZZ_SEED={tally.seed} repeats this sample)")
    for case in cases:
        every = [m for m in mutations(case) if kinds is None or m.kind in kinds]
        chosen = every if per_kind is None else sample(every, rng, per_kind)
        print(f"{case.name}: {len(chosen)} of {len(every)} mutations; by kind (tried/all): " + ", ".join(
            f"{k} {sum(m.kind == k for m in chosen)}/{sum(m.kind == k for m in every)}"
            for k in sorted({m.kind for m in every})))  # fmt: skip
        for mutation in chosen:
            undo = apply(mutation)
            try:
                code, lines = gate(case, monkeypatch)
            finally:
                restore(undo)
            tally.tried += 1
            tally.strict += mutation.refuse
            if code == 3 or (not mutation.refuse and (code, lines) == case.decision):
                continue
            want = "refused (exit 3)" if mutation.refuse else "refused or the same decision"
            tally.wrong.append(
                f"{case.name}: {mutation.path.parent.name}/{mutation.path.name}: {mutation.kind}: {mutation.what}: "
                f"exit {code}, {[line[:100] for line in lines][:3]}; wanted {want}"
            )
            print("WRONG", tally.wrong[-1])
        tally.by_case[case.name] = len(chosen)
        assert gate(case, monkeypatch) == case.decision  # every file restored
    print(f"fuzz: {tally.tried} gate calls ({tally.strict} must refuse), per case {tally.by_case}")
    assert not tally.wrong, (
        f"seed {tally.seed}: {len(tally.wrong)} of {tally.tried} mutations got a wrong answer:\n"
        + "\n".join(tally.wrong[:40])
    )
    return tally


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> list[Case]:
    return _build(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize(
    ("name", "value", "field"),
    [
        ("final_turn", False, "final_turn"),
        ("benign", True, "benign"),
        ("category", "other", "category"),
        ("parse_status", "error", "parse_status"),
        ("parse_status+score", ("invalid", None), "parse_status"),
        ("score", 0.0, "score"),
        ("verdict", {"label": "not_harmful"}, "score"),
        ("judge_rubric", "pair", "judge_rubric"),
    ],
)
def test_a_result_field_edited_apart_from_its_dataset_or_reply_is_refused(tmp_path, monkeypatch, name, value, field):
    """Was: on an unsigned run a harmful answer marked final_turn false (or benign, another category, unjudged,
    scored 0 apart from its recorded reply), summary.json rebuilt, passed a --max-asr it failed; each of these is
    derived again from the run's dataset and the judge's recorded reply, and the record that disagrees is named."""
    scripted(monkeypatch)
    items = write_items(tmp_path / "items.jsonl", 10, prompt=lambda k: ("Sure " if k % 3 == 0 else "") + f"q{k}")
    assert cli("run", config_file(tmp_path, items)).exit_code == 0
    run, args = tmp_path / "run", ("--max-asr", "0.35", "--allow-degenerate-judge", "--max-failure-rate", "0.2")
    assert cli("gate", run, *args).exit_code == 1  # ASR 0.4
    lines = (run / "results.jsonl").read_text().splitlines(keepends=True)
    record = json.loads(lines[0])  # item i0, a harmful answer
    assert record["score"] == 1.0
    if name == "parse_status+score":  # made unjudged in every field but its reply
        edit = {"parse_status": value[0], "score": value[1], "verdict": None}
    elif name == "verdict":  # the verdict and its score made safe, the reply left as the judge wrote it
        edit = {"verdict": {**record["verdict"], **value}, "score": 0.0}
    else:
        edit = {name: value}
    lines[0] = json.dumps({**record, **edit}) + "\n"
    (run / "results.jsonl").write_text("".join(lines))
    write_summary(run, verify_run(run).summary)
    refused = cli("gate", run, *args)
    assert refused.exit_code == 3, refused.output
    assert f"results.jsonl line 1: {field} is" in refused.text


def test_the_gate_refuses_what_it_must_and_otherwise_decides_the_same_on_a_sample_of_each_kind(cases, monkeypatch):
    tally = fuzz(cases, monkeypatch, per_kind=FAST_PER_KIND)
    assert tally.tried >= 280 and tally.strict >= 100


@pytest.mark.slow
@pytest.mark.timeout(5400)  # a wide sample (or, by hand, every mutation): past the suite's 900 s per test
def test_the_gate_refuses_what_it_must_and_otherwise_decides_the_same_on_a_wide_sample(cases, monkeypatch):
    wide_fuzz(cases, monkeypatch)
