"""What `verify` holds a run to where the mutation figure (docs/benchmarks-log.md) found survivors that change a
decision: a result for an answer the dataset does not have, and the attack side (a goal with no steps at all,
steps for a goal the dataset does not have, a missing answer of an attack run, the steps read again after
verification); and where a refusal would say the wrong thing or crash (a manifest's targets that are not the
config's, the values of an edited summary figure, the count of attack records in a run without an attack). Runs are made once for the module with scripted engines (test_attacks' PAIR run: goals g1..g3 and
one benign item; test_adversarial's run: items i0..i5); each test edits a copy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_adversarial import finished_run
from test_attacks import Engines, attack_config

from diagsafe_local.core.errors import RunFailed
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.runs.verify import verify_run


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mp = pytest.MonkeyPatch()
    try:
        return finished_run(tmp_path_factory.mktemp("verify-mutants"), mp)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify-mutants-attack")
    Run(attack_config(root), engine_factory=Engines()).execute()
    return root / "run"


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_result_for_an_answer_the_dataset_does_not_have_is_named(plain, tmp_path):
    run_dir = _copy(plain, tmp_path)
    results = run_dir / "results.jsonl"
    rows = _lines(results)
    _write(results, [*rows, {**rows[0], "item_id": "i9"}])
    problems = verify_run(run_dir).problems
    assert any(p.startswith("1 results are for answers the run's dataset does not have: t/i9") for p in problems), (
        problems
    )


def test_an_attack_runs_steps_are_read_again_only_as_verified(attacked, tmp_path):
    run_dir = _copy(attacked, tmp_path)
    run = verify_run(run_dir)
    assert run.ok, run.problems
    steps = run_dir / "attacks.jsonl"
    assert [line.record.item_id for line in run.attack_steps()] == [row["item_id"] for row in _lines(steps)]
    _write(steps, [{**row, "score": 0.0} for row in _lines(steps)])
    with pytest.raises(RunFailed, match="changed after it was verified"):
        list(run.attack_steps())


def test_a_goal_with_no_steps_at_all_is_unfinished(attacked, tmp_path):
    run_dir = _copy(attacked, tmp_path)
    steps = run_dir / "attacks.jsonl"
    _write(steps, [row for row in _lines(steps) if row["item_id"] != "g3"])
    problems = verify_run(run_dir).problems
    assert any(p.startswith("the attack did not finish 1 of 3 goals (e.g. t/g3)") for p in problems), problems


def test_steps_for_a_goal_the_dataset_does_not_have_are_named(attacked, tmp_path):
    run_dir = _copy(attacked, tmp_path)
    steps = run_dir / "attacks.jsonl"
    rows = _lines(steps)
    _write(steps, [*rows, {**rows[0], "item_id": "g9"}])
    problems = verify_run(run_dir).problems
    assert "attacks.jsonl attacks goals the run's dataset does not have: t/g9" in problems, problems


def test_an_attack_run_missing_an_answer_is_refused(attacked, tmp_path):
    """The attack's own checks add to the run's problems: they do not replace them."""
    run_dir = _copy(attacked, tmp_path)
    results = run_dir / "results.jsonl"
    rows = _lines(results)
    _write(results, rows[1:])
    problems = verify_run(run_dir).problems
    assert any("judged answers are missing" in p for p in problems), problems


def test_a_manifest_whose_targets_are_not_the_configs_is_refused_in_one_line(plain, tmp_path):
    run_dir = _copy(plain, tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["targets"] = {"u": manifest["targets"]["t"]}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_run(run_dir).problems
    assert "the manifest's targets (u) are not the config's (t): the manifest was edited" in problems, problems


def test_an_edited_summary_figure_is_named_with_both_values(plain, tmp_path):
    run_dir = _copy(plain, tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["targets"]["t"]["asr"]["value"] = 0.125
    (run_dir / "summary.json").write_text(json.dumps(summary))
    problems = verify_run(run_dir).problems
    assert any("targets.t.asr.value is 0.125 in summary.json, 0.5 recomputed" in p for p in problems), problems


def test_attack_records_in_a_run_without_an_attack_are_counted(plain, attacked, tmp_path):
    run_dir = _copy(plain, tmp_path)
    shutil.copy(attacked / "attacks.jsonl", run_dir / "attacks.jsonl")
    steps = len(_lines(run_dir / "attacks.jsonl"))
    problems = verify_run(run_dir).problems
    assert f"attacks.jsonl holds {steps} attack records, and the run's config has no attack" in problems, problems
