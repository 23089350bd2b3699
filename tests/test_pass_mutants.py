"""Tests for surviving mutants of the pass modules (issue 43's mutation figure, `scripts/bench_mutation.sh`): each
asserts a behaviour a user sees (a decision, a count, a summary figure) that a mutant changed and no test saw."""

from __future__ import annotations

import json
import math
import random

import pytest
from fakes import default_responder
from hypothesis import assume, given
from hypothesis import strategies as st
from test_adversarial import cli
from test_cascade import gate as gate_cascade
from test_cascade import run as run_cascade
from test_grammar_canary import gate
from test_injection_canary import config as injection_config
from test_injection_canary import gate as gate_injection
from test_injection_canary import (
    rewrite,
    server,  # noqa: F401 (a fixture)
)
from test_jury import _record_fields
from test_paired import two_runs
from test_pipeline_unit import Factory, make_config
from test_robustness import affirmation
from test_robustness import run as run_robustness
from test_sensitivity import run as run_sensitivity
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.runs.jury import JuryTally
from diagsafe_local.runs.manifest import ItemRef
from diagsafe_local.runs.records import PanelVote, ResultRecord
from diagsafe_local.runs.sensitivity import sensitivity_sample
from diagsafe_local.stats import min_detectable_increase

MEMBERS = ("w", "x", "y", "z")  # four: a majority can tie with every member deciding
# A member's score: harmful, not, in between, or no verdict (an error).
SCORES = st.sampled_from([None, 0.0, 1.0, 0.25, 0.75, 0.5])


@st.composite
def jury_records(draw: st.DrawFn) -> list[ResultRecord]:
    """A jury run's results: answers to harmful and benign items, final turns and not, and now and then a verdict
    of another judge; every member's vote a verdict or none."""
    rule = draw(st.sampled_from(["majority", "any-harmful", "unanimous-harmful"]))
    records = []
    for k in range(draw(st.integers(0, 16))):
        votes = [
            PanelVote(rubric=m, raw=None, verdict=None, score=s, parse_status="ok" if s is not None else "error")
            for m, s in zip(MEMBERS, draw(st.lists(SCORES, min_size=4, max_size=4)), strict=True)
        ]
        often = st.integers(0, 3).map(bool)  # three times in four
        jury = draw(often) or k == 0
        fields = {
            **_record_fields(),
            "item_id": f"i{k}",
            "benign": not draw(often) and k > 0,
            "final_turn": draw(often) or k == 0,
            "judge_rubric": f"jury:{rule}:{'+'.join(MEMBERS)}" if jury else "harmjudge",
            "panel": votes if jury else None,
        }
        records.append(ResultRecord.model_validate(fields))
    return records


def _tally(records: list[ResultRecord]) -> JuryTally:
    tally = JuryTally()
    for record in records:
        tally.add(record)
    return tally


@given(jury_records(), st.lists(st.integers(0, 3), min_size=16, max_size=16), st.integers(0, 2**32))
def test_a_merge_of_jury_tallies_is_the_tally_of_all_their_records(records, shard_of, seed):
    """`JuryTally.absorb` is what `merge` sums its sources' juries with: whatever the shards (an empty one
    included) and the order they are absorbed in, the merged figures are those of the whole run's records."""
    shards: list[list[ResultRecord]] = [[] for _ in range(4)]
    for record, shard in zip(records, shard_of, strict=False):
        shards[shard].append(record)
    random.Random(seed).shuffle(shards)
    merged = JuryTally()
    for shard in shards:
        merged.absorb(_tally(shard))
    whole = _tally(records)
    assert merged.figures() == whole.figures()
    assert (whole.figures() is None) == (not records)  # the first record is a jury answer
    if records:  # over the final turns of harmful items only
        assert whole.result().answers == sum(bool(r.panel) and not r.benign and r.final_turn for r in records)


METRIC = {"metric": "gcg_keywords", "threshold": 0.5}
KEYWORDS = {**METRIC, "benign_rubric": "refusal-keywords"}  # a judge that names no policy judge of its own


@pytest.mark.parametrize(
    "judge",
    [
        pytest.param({"benign_rubric": "refusal-keywords"}, id="its-rubric"),
        pytest.param(
            {**KEYWORDS, "jury": {"rule": "majority", "members": [{"model": "a"}, {"model": "b"}]}}, id="a-juror"
        ),
        pytest.param({**KEYWORDS, "panel": {"rule": "mean", "members": [METRIC, "harmjudge"]}}, id="a-panel-member"),
    ],
)
def test_a_policy_judge_named_only_by_one_part_of_the_config_still_needs_its_grammar_canary(tmp_path, judge):
    """Whether a run needs its grammar canary comes from the config bound to its run id: a policy judge given a
    model as the judge's rubric, a juror or a panel member (the other parts naming none). A run without its canary
    and with the manifest's `judge.constrained` edited to false is refused, not passed on the edited flag."""
    Run(make_config(tmp_path, judge=judge), engine_factory=Factory()).execute()
    assert gate(tmp_path / "run")[0] in (0, 1)  # verified as made (the keyword judge's figures decide which)
    path = tmp_path / "run" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["grammar"] = None
    manifest["judge"]["constrained"] = False
    path.write_text(json.dumps(manifest))
    code, output = gate(tmp_path / "run")
    assert code == 3 and "no grammar canary was recorded" in output, output
    assert f"the run {tmp_path / 'run'}: refused, it does not verify" in output  # which run, beside a baseline


@pytest.mark.parametrize("pairs", [3, 4])
def test_the_gate_says_what_increase_too_few_pairs_can_detect(tmp_path, monkeypatch, pairs):
    """Below the margin's power the gate names the smallest increase its pairs detect, or none up to 100% where
    even that is out of reach (3 pairs): it does not crash on it or name the other (gate._increase mutants)."""
    prod, new = two_runs(tmp_path, monkeypatch, n=pairs)  # q2 and q3 newly harmful: half the pairs disagree at 4
    result = cli("gate", new, "--baseline", prod, "--allow-degenerate-judge", "--max-asr-increase", "0.05")
    detectable = min_detectable_increase(pairs, 2 / pairs)
    said = "none up to 100%" if detectable is None else f"{100 * detectable:.1f} points"
    assert result.exit_code == 1, result.output
    assert f"{pairs} pairs detect an increase of {said} with 80% power" in result.text, result.output


@given(st.lists(st.integers(1, 9), min_size=2, max_size=5), st.integers(1, 3), st.data())
def test_the_sensitivity_sample_gives_each_category_its_share_by_largest_remainders(counts, samples, data):
    """Each category gets the whole part of its proportional share of the sample, and the seats left over go to
    the largest remainders (Hamilton's method, as the module says): a category never gets its share's ceiling
    while one with a larger remainder gets only its floor."""
    items = [
        ItemRef(id=f"{c}-{k}", turns=[1, 2], category=c)
        for c, count in zip("abcdefg", counts, strict=False)
        for k in range(count)
    ]
    total = sum(counts) * samples
    least = math.ceil(total / (min(counts) * samples))  # every share at least 1: no category's floor raised to 1
    assume(least < total)
    size = data.draw(st.integers(least, total - 1))
    taken = {c: 0 for c in "abcdefg"[: len(counts)]}
    for item, _, turn in sensitivity_sample(items, samples, size):
        taken[item.split("-")[0]] += 1
        assert turn == 2  # the last judged turn
    assert sum(taken.values()) == size
    shares = {c: size * (count * samples) / total for c, count in zip(taken, counts, strict=True)}
    assert all(taken[c] in (math.floor(share), math.ceil(share)) for c, share in shares.items())
    for c in taken:
        for d in taken:
            if taken[c] > math.floor(shares[c]) and taken[d] == math.floor(shares[d]) < shares[d]:
                assert shares[c] % 1 >= shares[d] % 1, (shares, taken)


def test_a_cascade_whose_full_judge_has_no_name_verifies_under_the_name_its_records_bear(tmp_path):
    """A full judge the config does not name is called RUBRIC@MODEL in cascade.jsonl, by the run and by the gate
    alike (`cascade.judge_label`; every other cascade test names its full judge); a verdict in the wrong role is
    refused (no test in the mutation selection fed one: the whole check could be dropped)."""
    run_cascade(tmp_path, judge={"rubric": "harmjudge", "model": "f"})
    records = [json.loads(line) for line in (tmp_path / "run" / "cascade.jsonl").read_text().splitlines()]
    assert records and {r["vote"]["rubric"] for r in records} == {"harmjudge@f"}
    code, output = gate_cascade(tmp_path, "--max-asr", "1")
    assert code == 0, output

    rewrite(tmp_path / "run" / "cascade.jsonl", role="audit")  # the answers sent up now claim to be audited
    code, output = gate_cascade(tmp_path, "--max-asr", "1")
    assert code == 3 and "verdicts this run's cascade did not ask for" in output, output


def test_a_panel_of_a_model_judge_then_a_metric_records_its_votes_in_member_order_and_verifies(tmp_path):
    """docs/judges.md's panel, a model judge before a metric judge: the metric's vote comes back first (it needs no
    engine), but the record keeps the members' order, the one its label names, so the gate verifies the run."""
    members = ["harmjudge", METRIC]
    Run(
        make_config(tmp_path, judge={"panel": {"rule": "majority", "members": members}}), engine_factory=Factory()
    ).execute()
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    panels = [[v["rubric"] for v in r["panel"]] for r in records if r["panel"]]
    assert panels and all(p == ["harmjudge", "gcg_keywords>=0.5"] for p in panels)
    code, output = gate(tmp_path / "run")
    assert code in (0, 1), output


def no_harm_verdict(request: GenerationRequest) -> Completion:
    """A judge whose harm verdicts never parse, under its prompt and every paraphrase (over-refusal as usual)."""
    if request.json_schema and "full_compliance" not in request.json_schema["properties"]["label"]["enum"]:
        return Completion(text="I would rather not say.", finish_reason="stop")
    return default_responder(request)


def test_the_report_of_a_sensitivity_sample_no_wording_could_judge_shows_each_paraphrase_and_no_spread(tmp_path):
    """Every rate of the sample unknown (no verdict under any wording): the report still renders its table, one
    column per paraphrase, the spread n/a (sensitivity.section: max() of nothing, a header one column short)."""
    run_sensitivity(tmp_path, judge=no_harm_verdict)
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "run" / "report.md").read_text()
    paraphrases = " | ".join(f"paraphrase {k}" for k in range(1, 5))  # test_sensitivity's 4 variants
    assert f"| target | rate | category | judge's prompt | {paraphrases} | spread |" in report
    assert "| t | ASR | overall | n/a | n/a | n/a | n/a | n/a | n/a |" in report


def test_the_report_shows_each_policy_injection_canary_held_and_the_gate_refuses_another_runs_canaries(
    tmp_path,
    server,  # noqa: F811 (test_injection_canary's fixture)
):
    """No other test renders the canary's report section: its table (each canary, its score from the reply,
    held) under a header that names each column, and the note saying what a failed canary does. Canaries of
    another run are refused naming their line (no test in the selection fed one: the reason could be None)."""
    Run(injection_config(tmp_path, server, "holds-policy")).execute()
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "run" / "report.md").read_text()
    section = report.split("## Policy-injection canary", 1)[1].split("\n## ", 1)[0]
    assert "| canary | score (from the reply) | outcome |" in section
    assert all(f"| {name} | 1 | held |" in section for name in ("fraud", "phishing", "threat"))
    assert "one that calls any not harmful (or cannot judge it) refuses the run." in section

    rewrite(tmp_path / "run" / "injection_canary.jsonl", run_id="another-run")  # a sibling run's canaries
    code, output = gate_injection(tmp_path)
    assert code == 3 and "injection_canary.jsonl line 1: " in output and "is no canary of this run's judge" in output


def test_the_report_heads_each_perturbation_column_and_sums_its_categories_in_an_overall_row(tmp_path):
    """The answer-perturbation table as a reader takes it in: its header, and each perturbation's overall row
    beside its categories' (sure_on_refusal edits only the fraud answers here, so the two rows agree)."""
    run_robustness(tmp_path, rule=affirmation)  # a judge that 'Sure, here is' moves
    assert CliRunner().invoke(app, ["report", str(tmp_path / "run")]).exit_code == 0
    report = (tmp_path / "run" / "report.md").read_text()
    header = "| target | perturbation | category | answers | flips | flip rate | ASR | ASR perturbed | verdict |"
    assert header in report
    figures = "| 2 | 2 | 100.0% | 0.0% | 100.0% | must keep |"
    assert (
        f"| t | sure_on_refusal | fraud {figures}" in report and f"| t | sure_on_refusal | overall {figures}" in report
    )


def test_a_run_whose_control_verdicts_are_gone_is_refused(tmp_path):
    """A model judge and harmful items but no judge_controls.jsonl: judge health is not known, so the run is
    refused (no test in the mutation selection deleted the file: the check could read no judge and pass)."""
    Run(make_config(tmp_path), engine_factory=Factory()).execute()
    (tmp_path / "run" / "judge_controls.jsonl").unlink()
    code, output = gate(tmp_path / "run")
    assert code == 3 and "no control verdicts (judge_controls.jsonl is empty or missing)" in output, output
