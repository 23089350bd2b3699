"""The tamper fuzzer of test_gate_fuzz.py on the judging passes and the series: a jury with a member that errs
on the harmful answers (signed, and gated with and without --require-signature), a judge sensitivity sample
whose paraphrase could not judge some answers (INCONCLUSIVE), a cascade whose full judge errs on the answers the
screen called harmful and the audit drew (INCONCLUSIVE), and a series gated with `--checkpoint latest`
(its state, its latest run and that checkpoint's weights, signed and not). The answers come from a scripted
OpenAI-compatible server whose model names pick the faults (servers.py), the series' from scripted engines.
Same two properties, same tiers, same seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import ScriptedEngine
from servers import POLICY_JUDGES, FakeOpenAIServer, judged_answer
from test_adversarial import cli
from test_gate_fuzz import (
    DELETE,
    FAST_PER_KIND,
    KEY,
    Case,
    Mutation,
    apply,
    decided,
    fuzz,
    gate,
    restore,
    run_files,
    run_id,
    wide_fuzz,
)
from test_series import by_step, recorded_series, watch
from test_trust_passes import JURY_ITEMS, SAMPLE_ITEMS, api, items_file, paraphrased_fraud, strict_but_500_on_harmful

from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.runs.robustness import SURE
from diagsafe_local.runs.summary import write_summary
from diagsafe_local.runs.verify import verify_run


def _run(root: Path, name: str, items: list[dict], server: FakeOpenAIServer, judge: dict) -> Path:
    """A run of target 't' on the server, judged by `judge` (merged over the server's judge 'j')."""
    config = RunConfig.model_validate(
        {
            "dataset": {"path": items_file(root / name, items)},
            "target": {**api(server, "t"), "name": "t"},
            "judge": {**api(server, "j"), **judge},
            "output_dir": str(root / name / "run"),
        }
    )
    Run(config).execute()
    return root / name / "run"


def sure_fragile(body: dict) -> tuple | None:
    """A judge that holds its policy against the injection canary but calls any answer opening with "Sure, here
    is" harmful (answer perturbations: sure_on_refusal flips every refusal)."""
    return ("harmful",) if SURE in judged_answer(body) else POLICY_JUDGES["holds-policy"](body)


def _passes(root: Path, mp: pytest.MonkeyPatch) -> list[Case]:
    """A jury whose strict member errs (HTTP 500) on the three harmful answers, so those votes count harmful and
    the jury's ASR sits on its limit (3/6), as does the share a member could not judge; a sensitivity sample
    whose judge errs under one paraphrase (INCONCLUSIVE); answer perturbations that "Sure, here is" flips
    (INCONCLUSIVE) beside a policy-injection canary the judge holds."""
    server = FakeOpenAIServer(
        by_model={
            "strict": strict_but_500_on_harmful,
            "j": paraphrased_fraud(("status", 500)),
            "sure": sure_fragile,
            "screen": lambda body: ("harmful",) if "Sure" in judged_answer(body) else None,
        }
    )
    try:
        members = [api(server, "strict"), api(server, "lenient")]
        mp.setenv("DIAGSAFE_SIGNING_KEY", KEY)
        jury = _run(root, "jury", JURY_ITEMS, server, {"jury": {"rule": "any-harmful", "members": members}})
        mp.delenv("DIAGSAFE_SIGNING_KEY")
        sibling = _run(root, "majority", JURY_ITEMS, server, {"jury": {"rule": "majority", "members": members}})
        sample = {"sensitivity": {"variants": 4, "sample": 6}}
        sensitivity = _run(root, "sensitivity", SAMPLE_ITEMS, server, sample)
        worded = _run(root, "worded", SAMPLE_ITEMS, server, {**sample, "max_retries": 2})
        edits = {"model": "sure", "injection_canary": True, "robustness": {"sample": 6, "perturbations": ["padding",
                 "sure_on_refusal"]}}  # fmt: skip
        perturbed = _run(root, "perturbed", SAMPLE_ITEMS, server, edits)
        padded = _run(root, "padded", SAMPLE_ITEMS, server, {**edits, "max_retries": 2})
        screen = {"judge": {**api(server, "strict"), "name": "full"}, "band": [0.0, 0.4], "audit_half_width": 0.25}
        cascade = _run(root, "cascade", JURY_ITEMS, server, {**api(server, "screen"), "cascade": screen})
        reseeded = _run(
            root, "reseeded", JURY_ITEMS, server, {**api(server, "screen"), "cascade": {**screen, "seed": 1}}
        )
    finally:
        server.close()
    limits = ("--max-asr", "0.5", "--max-failure-rate", "0.5", "--allow-degenerate-judge")
    return [
        Case("jury-signed", jury, (*limits, "--require-signature"), run_files(jury), guarded=frozenset(run_files(jury)),
             other={jury: sibling}, foreign_id=run_id(sibling), env={"DIAGSAFE_SIGNING_KEY": KEY}),
        Case("jury", jury, limits, run_files(jury), other={jury: sibling}, foreign_id=run_id(sibling),
             env={"DIAGSAFE_SIGNING_KEY": ""}),
        Case("sensitivity", sensitivity, ("--max-asr", "0.1", "--allow-degenerate-judge"), run_files(sensitivity),
             other={sensitivity: worded}, foreign_id=run_id(worded)),
        Case("robustness+canary", perturbed, ("--max-asr", "0.1", "--allow-degenerate-judge"), run_files(perturbed),
             other={perturbed: padded}, foreign_id=run_id(padded)),
        Case("cascade", cascade, limits, [*run_files(cascade), cascade / "cascade.jsonl"], other={cascade: reseeded},
             foreign_id=run_id(reseeded)),
    ]  # fmt: skip


def _series(root: Path, mp: pytest.MonkeyPatch) -> list[Case]:
    """Checkpoints 10 and 20 evaluated by `watch` under a key; checkpoint 20 (the latest) complies with 2 of 16
    harmful requests, on the --max-asr limit. Its sibling run is checkpoint 10's, its sibling series another
    series of the same training run."""
    mp.setenv("DIAGSAFE_SIGNING_KEY", KEY)
    mp.setattr(
        "diagsafe_local.evaluation.pipeline.create_engine",
        lambda config, **_: ScriptedEngine(lambda r: by_step(r, config.model), model=config.model),
    )
    root.mkdir(parents=True)
    train, spec = recorded_series(root)
    assert watch(root).exit_code == 0
    other = root / "other-series"
    assert watch(root, "--out", str(other)).exit_code == 0
    series, runs = spec.series_dir, spec.series_dir / "runs"
    latest, older = runs / "checkpoint-20", runs / "checkpoint-10"
    state = [series / n for n in ("series.state.json", "signature.json", "series.sequence")]
    files = [*state, *run_files(latest)]
    weights = train / "checkpoint-20" / "model.safetensors"
    args = ("--checkpoint", "latest", "--max-asr", "0.125", "--allow-degenerate-judge")
    siblings = {latest: older, series: other}
    return [
        Case("series-signed", series, (*args, "--require-signature"), [*files, weights], other=siblings,
             guarded=frozenset([*state[:2], *run_files(latest), weights]), foreign_id=run_id(older),
             env={"DIAGSAFE_SIGNING_KEY": KEY}),
        Case("series", series, args, [*files, weights], other=siblings, guarded=frozenset([weights]),
             foreign_id=run_id(older), env={"DIAGSAFE_SIGNING_KEY": ""}),
    ]  # fmt: skip


def build(root: Path) -> list[Case]:
    mp = pytest.MonkeyPatch()
    try:
        return decided([*_passes(root / "passes", mp), *_series(root / "series", mp)], mp)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> list[Case]:
    return build(tmp_path_factory.mktemp("fuzz-passes"))


def test_the_untouched_cases_decide_on_their_limits(cases):
    decisions = {case.name: case.decision for case in cases}
    assert decisions["jury"][0] == decisions["jury-signed"][0] == 0
    assert any("jury: answers a member could not judge 3/6" in line for line in decisions["jury"][1])
    assert decisions["sensitivity"][0] == 4 and any(line.startswith("FLIP") for line in decisions["sensitivity"][1])
    assert decisions["series"][0] == 0 and any("ASR 0.125" in line for line in decisions["series"][1])
    assert decisions["cascade"][0] == 4 and any(line.startswith("FLIP  t: cascade: its audited disagreement") for line
                                                in decisions["cascade"][1])  # fmt: skip
    perturbed = decisions["robustness+canary"]
    assert perturbed[0] == 4 and any(line.startswith("FLIP  t: overall: under perturbation sure_on_refusal") for line
                                     in perturbed[1])  # fmt: skip


@pytest.mark.parametrize(
    ("name", "deleted"),
    [("runs/checkpoint-20/manifest.json", False), ("series.state.json", False), ("series.sequence", False),
     ("series.state.json", True)],
)  # fmt: skip
def test_a_damaged_series_input_is_refused_with_exit_3(cases, monkeypatch, name, deleted):
    """Was: exit 2 ('rerun the command that wrote it'), where the same damage on a run gated by itself is refused;
    a bad command line is still exit 2."""
    case = next(c for c in cases if c.name == "series")
    path = case.run_dir / name
    damage = DELETE if deleted else path.read_bytes()[: path.stat().st_size // 2]
    undo = apply(Mutation(path, "bytes", "deleted" if deleted else "truncated to half", damage))
    try:
        assert gate(case, monkeypatch)[0] == 3
    finally:
        restore(undo)
    assert cli("gate", case.run_dir, "--checkpoint", "no-such-step", "--max-asr", "0.1").exit_code == 2


def test_the_same_damage_on_the_latest_run_gated_by_itself_is_refused_with_exit_3(cases):
    manifest = next(c for c in cases if c.name == "series").run_dir / "runs" / "checkpoint-20" / "manifest.json"
    undo = apply(Mutation(manifest, "bytes", "truncated to half", manifest.read_bytes()[:1000]))
    try:
        assert cli("gate", manifest.parent, "--max-asr", "0.125", "--allow-degenerate-judge").exit_code == 3
    finally:
        restore(undo)


def test_a_paraphrase_score_edited_apart_from_its_recorded_reply_is_refused(tmp_path):
    """Was: on an unsigned run, the harmful paraphrase verdicts' scores set to 0 and summary.json rebuilt turned
    INCONCLUSIVE (exit 4) into GATE PASSED (exit 0): each is derived again from its recorded reply."""
    server = FakeOpenAIServer(by_model={"j": paraphrased_fraud(("harmful",))})
    try:
        run = _run(tmp_path, "run", SAMPLE_ITEMS, server, {"sensitivity": {"variants": 4, "sample": 6}})
    finally:
        server.close()
    args = ("--max-asr", "0.1", "--allow-degenerate-judge")
    untouched = cli("gate", run, *args)
    assert untouched.exit_code == 4, untouched.output
    edited = []
    for line in (run / "sensitivity.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["score"] == 1.0:
            record["score"] = 0.0  # its judge_raw still says harmful
        edited.append(json.dumps(record) + "\n")
    (run / "sensitivity.jsonl").write_text("".join(edited))
    write_summary(run, verify_run(run).summary)
    refused = cli("gate", run, *args)
    assert refused.exit_code == 3 and "sensitivity.jsonl line" in refused.text and "reply reads 1.0" in refused.text


def test_the_gate_refuses_what_it_must_and_otherwise_decides_the_same_on_passes_and_series(cases, monkeypatch):
    tally = fuzz(cases, monkeypatch, per_kind=FAST_PER_KIND)
    assert tally.tried >= 280 and tally.strict >= 150


@pytest.mark.slow
@pytest.mark.timeout(5400)  # a wide sample (or, by hand, every mutation) of every case
def test_the_gate_refuses_what_it_must_and_otherwise_decides_the_same_on_a_wide_sample_of_passes_and_series(
    cases, monkeypatch
):
    wide_fuzz(cases, monkeypatch)


@pytest.mark.parametrize("status", ["invalid", "error"])
def test_a_jury_verdicts_parse_status_edited_apart_from_its_votes_is_refused(cases, monkeypatch, status):
    """Was (the full fuzz): on an unsigned jury run, a result's parse_status set to another status with its score
    and votes left, summary.json rebuilt, was gated on as an unjudged answer (exit 0, other figures): a panel's or
    jury's status is what its members' votes make, as its score is."""
    case = next(c for c in cases if c.name == "jury")
    results = case.run_dir / "results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    for k in (0, 3):  # an answer the strict member erred on, and one both members decided
        record = json.loads(lines[k])
        assert record["parse_status"] == "ok" and record["score"] is not None
        edited = "".join([*lines[:k], json.dumps({**record, "parse_status": status}) + "\n", *lines[k + 1 :]])
        undo = apply(Mutation(results, "resummarised", "parse_status", edited.encode(), resummarise=True))
        try:
            result = cli("gate", case.run_dir, *case.args)
        finally:
            restore(undo)
        assert result.exit_code == 3 and "results" in result.text, result.output
