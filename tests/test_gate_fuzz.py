"""A tamper fuzzer for the gate: real run directories made by the tool (one target signed and validated, a sweep
with a baseline run, an adaptive attack, a merge of shards), and, for each, mutations of every file the gate
reads: each JSON field of results, attack steps, controls, summary, manifest, signature, validation and the
baseline's files changed or deleted; lines deleted, duplicated, reordered, or swapped with another run's; the
results edited with the summary's hash of them rewritten to match (what an editor without the key would do).

The property: the gate refuses (exit 3), or it reaches exactly the decision it reaches on the untouched run
(exit code and every PASS/FAIL line). On a signed run gated with --require-signature, any change to a signed byte
is refused. The fast tier runs a seeded sample of the mutations; the slow tier runs all of them.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_adversarial import cli, config_file, perfect_validation, scripted, write_items
from test_attacks import GOALS, responder

KEY = "fuzz-key-" + "k" * 24


@dataclass
class Case:
    """A run directory, how it is gated, and every file the gate reads for it."""

    name: str
    run_dir: Path
    args: tuple[str, ...]
    files: list[Path]
    signed: bool = False
    other: Path | None = None  # a run of the same shape, for lines swapped between runs
    decision: tuple[int, tuple[str, ...]] = (0, ())
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Mutation:
    path: Path
    what: str
    content: bytes
    also: tuple[tuple[Path, bytes], ...] = ()  # a second file rewritten to match (the summary's results hash)


def gate(case: Case, monkeypatch: pytest.MonkeyPatch) -> tuple[int, tuple[str, ...]]:
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    result = cli("gate", case.run_dir, *case.args)
    lines = tuple(line for line in result.output.splitlines() if line.startswith(("PASS", "FAIL")))
    return result.exit_code, lines


# -- the runs ---------------------------------------------------------------------------------------------------


def _files(run_dir: Path) -> list[Path]:
    names = ("manifest.json", "config.yaml", "results.jsonl", "judge_controls.jsonl", "summary.json", "attacks.jsonl",
             "sensitivity.jsonl")  # fmt: skip
    return [run_dir / n for n in (*names, "signature.json") if (run_dir / n).is_file()]


def _build(root: Path) -> list[Case]:
    mp = pytest.MonkeyPatch()
    try:
        return _cases(root, mp)
    finally:
        mp.undo()


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
    signed = root / "signed"
    args = ("--max-asr", "0.5", "--max-asr-category", "c=0.6", "--allow-degenerate-judge", "--corrected")
    cases.append(
        Case("signed", signed, (*args, "--require-signature"), [*_files(signed), validation / "validation.json"],
             signed=True, other=root / "signed_twin", env={"DIAGSAFE_SIGNING_KEY": KEY})
    )  # fmt: skip
    cases.append(
        Case("validated", signed, args, [*_files(signed), validation / "validation.json"], other=root / "signed_twin",
             env={"DIAGSAFE_SIGNING_KEY": ""})
    )  # fmt: skip
    # a sweep against a production run
    sweep = {"targets": [{"model": "t", "name": "t"}, {"model": "t", "name": "u", "system_prompt": "be brief"}]}
    for name in ("prod", "sweep"):
        assert cli("run", config_file(root, items, name, **sweep)).exit_code == 0
    increase = (
        "--baseline",
        str(root / "prod"),
        "--max-asr-increase",
        "0.9",
        "--max-asr",
        "0.5",
        "--allow-degenerate-judge",
    )
    cases.append(
        Case("sweep", root / "sweep", increase, [*_files(root / "sweep"), *_files(root / "prod")], other=root / "prod")
    )
    # an adaptive attack
    scripted(mp, judge=responder, target=responder)  # the judge's model writes the attacker's prompts too
    goals = root / "goals.jsonl"
    goals.write_text("".join(json.dumps(g) + "\n" for g in GOALS))
    attack = {"placement": {"mode": "colocate"}, "attack": {"strategy": "pair", "streams": 2, "depth": 2}}
    assert cli("run", config_file(root, goals, "attacked", **attack)).exit_code == 0
    cases.append(Case("attack", root / "attacked", ("--max-attack-asr", "0.7", "--allow-degenerate-judge"),
                      _files(root / "attacked")))  # fmt: skip
    # shards merged
    scripted(mp)
    config = config_file(root, items, "sharded")
    for index in range(2):
        assert cli("run", config, "--shard", f"{index}/2").exit_code == 0
    shards = sorted((root / "sharded" / "shards").glob("shard-*"))
    assert cli("merge", *shards, "--out", root / "merged").exit_code == 0
    cases.append(Case("merged", root / "merged", ("--max-asr", "0.5", "--allow-degenerate-judge"),
                      _files(root / "merged"), other=root / "signed"))  # fmt: skip
    for case in cases:
        case.decision = gate(case, mp)
        assert case.decision[0] in (0, 1) and case.decision[1], (case.name, case.decision)
    return cases


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


def _set(doc: Any, path: tuple, value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def _delete(doc: Any, path: tuple) -> Any:
    doc = json.loads(json.dumps(doc))
    node = doc
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    return doc


def _field_mutations(path: Path, doc: Any, dump: Callable[[Any], bytes], where: str = "") -> Iterator[Mutation]:
    for leaf in _leaves(doc):
        if not leaf:
            continue
        node = doc
        for part in leaf:
            node = node[part]
        name = where + ".".join(map(str, leaf))
        for value in _changed(node):
            yield Mutation(path, f"{name} = {value!r}", dump(_set(doc, leaf, value)))
        yield Mutation(path, f"{name} deleted", dump(_delete(doc, leaf)))


def _rehashed(case: Case, mutation: Mutation) -> Mutation:
    """A results edit with the summary's hash of the results rewritten to match."""
    summary_path = mutation.path.parent / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["results_sha256"] = hashlib.sha256(mutation.content).hexdigest()
    return Mutation(mutation.path, mutation.what + " (summary's hash rewritten)", mutation.content,
                    ((summary_path, json.dumps(summary).encode()),))  # fmt: skip


def mutations(case: Case) -> list[Mutation]:
    found: list[Mutation] = []
    for path in case.files:
        raw = path.read_bytes()
        if path.suffix == ".jsonl":
            lines = raw.decode().splitlines(keepends=True)
            for k, line in enumerate(lines):
                rest = lambda new, k=k, lines=lines: "".join([*lines[:k], *new, *lines[k + 1 :]]).encode()  # noqa: E731
                record = json.loads(line)
                dump = lambda doc, rest=rest: rest([json.dumps(doc, ensure_ascii=False) + "\n"])  # noqa: E731
                made = list(_field_mutations(path, record, dump, f"line {k + 1}: "))
                if path.name == "results.jsonl":
                    made += [_rehashed(case, m) for m in made]
                found += made
                found.append(Mutation(path, f"line {k + 1} deleted", rest([])))
                found.append(Mutation(path, f"line {k + 1} duplicated", rest([line, line])))
                if k:
                    swapped = [*lines[: k - 1], lines[k], lines[k - 1], *lines[k + 1 :]]
                    found.append(Mutation(path, f"lines {k} and {k + 1} swapped", "".join(swapped).encode()))
                other = case.other / path.name if case.other else None
                if other is not None and other.is_file():
                    theirs = other.read_text().splitlines(keepends=True)
                    if k < len(theirs) and theirs[k] != line:
                        found.append(Mutation(path, f"line {k + 1} taken from {case.other.name}", rest([theirs[k]])))
            found.append(Mutation(path, "emptied", b""))
        elif path.suffix == ".json":
            found += _field_mutations(path, json.loads(raw), lambda doc: json.dumps(doc, indent=2).encode())
            if case.other is not None and (case.other / path.name).is_file() and path.parent == case.run_dir:
                found.append(Mutation(path, f"replaced by {case.other.name}'s", (case.other / path.name).read_bytes()))
        else:  # config.yaml: its text edited line by line
            for k, line in enumerate(raw.decode().splitlines(keepends=True)):
                edited = raw.decode().splitlines(keepends=True)
                edited[k] = line.replace(":", ": x #", 1) if ":" in line else line + "x\n"
                found.append(Mutation(path, f"{path.name} line {k + 1} edited", "".join(edited).encode()))
        found.append(Mutation(path, "deleted", b"\0delete"))
    return found


def apply(mutation: Mutation) -> list[tuple[Path, bytes | None]]:
    """Apply a mutation; return what to put back."""
    undo = []
    for path, content in ((mutation.path, mutation.content), *mutation.also):
        undo.append((path, path.read_bytes() if path.exists() else None))
        if content == b"\0delete":
            path.unlink()
        else:
            path.write_bytes(content)
    return undo


def restore(undo: list[tuple[Path, bytes | None]]) -> None:
    for path, content in reversed(undo):
        if content is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(content)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> list[Case]:
    return _build(tmp_path_factory.mktemp("fuzz"))


def _fuzz(cases: list[Case], monkeypatch: pytest.MonkeyPatch, sample: int | None) -> int:
    tried, wrong = 0, []
    rng = random.Random(20261205)
    for case in cases:
        every = mutations(case)
        chosen = every if sample is None else rng.sample(every, min(sample, len(every)))
        for mutation in chosen:
            undo = apply(mutation)
            try:
                code, lines = gate(case, monkeypatch)
            finally:
                restore(undo)
            tried += 1
            signed_byte = (
                case.signed and mutation.path.parent == case.run_dir and mutation.path.name != "validation.json"
            )
            if code == 3 or (not signed_byte and (code, lines) == case.decision):
                continue
            wrong.append(f"{case.name}: {mutation.path.name}: {mutation.what}: exit {code}, {list(lines)[:3]}")
        assert gate(case, monkeypatch) == case.decision  # every file restored
    assert not wrong, f"{len(wrong)} of {tried} mutations got a decision the untouched run does not:\n" + "\n".join(
        wrong[:40]
    )
    return tried


def test_the_gate_refuses_or_decides_the_same_on_every_sampled_tamper(cases, monkeypatch):
    assert _fuzz(cases, monkeypatch, sample=60) >= 250


@pytest.mark.slow
@pytest.mark.timeout(5400)  # every mutation: ~33,000 gate calls, past the suite's 900 s per test on 2 cores
def test_the_gate_refuses_or_decides_the_same_on_every_tamper(cases, monkeypatch):
    assert _fuzz(cases, monkeypatch, sample=None) > 2000
