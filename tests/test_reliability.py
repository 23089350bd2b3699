"""One writer per output directory, outputs that follow the user's umask, and clear errors for unwritable paths."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers import REPO, SAMPLE
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core import atomic


def hold_lock(directory) -> subprocess.Popen:
    code = (
        "import sys, time; from pathlib import Path; from diagsafe_local.core.locking import DirectoryLock\n"
        "lock = DirectoryLock(Path(sys.argv[1]), 'run'); print('held', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(directory)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_with_the_first_ones_pid_and_host(tmp_path):
    holder = hold_lock(tmp_path / "out")
    try:
        result = CliRunner().invoke(
            app, ["bench", "--dataset", str(SAMPLE), "--metrics", "rouge1_recall", "--out", str(tmp_path / "out")]
        )
        assert result.exit_code == 2
        message = " ".join(result.output.split())
        assert (
            f"pid {holder.pid} on host" in message
            and "being written by another diagsafe-local process (run, pid" in message
        )
        assert not (tmp_path / "out" / "leaderboard.csv").exists()
        items = tmp_path / "items.jsonl"
        items.write_text('{"id": "a", "prompt": "hi"}\n')
        config = tmp_path / "run.yaml"
        (tmp_path / "t").mkdir()
        config.write_text(
            f"dataset: {{path: {items}}}\ntarget: {{model: {tmp_path / 't'}}}\njudge: {{model: {tmp_path / 't'}}}\n"
            f"output_dir: {tmp_path / 'out'}\n"
        )
        run = CliRunner().invoke(app, ["run", str(config)])
        assert run.exit_code == 2 and f"pid {holder.pid}" in " ".join(run.output.split())
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    after = CliRunner().invoke(
        app, ["bench", "--dataset", str(SAMPLE), "--metrics", "rouge1_recall", "--out", str(tmp_path / "out")]
    )
    assert after.exit_code == 0, after.output  # the lock went with its process


def test_outputs_follow_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        atomic.write_text(tmp_path / "shared.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "shared.json").stat().st_mode & 0o777 == 0o664  # group-writable, as a cluster group dir needs


def test_unwritable_out_is_refused_before_any_scoring(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = CliRunner().invoke(
        app, ["bench", "--dataset", str(SAMPLE), "--metrics", "meteor", "--out", str(blocker / "out")]
    )
    assert result.exit_code == 2 and "cannot write to" in " ".join(result.output.split())
    assert "Traceback" not in result.output


def _finished_run(tmp_path):
    from test_pipeline_unit import Factory, make_config

    from diagsafe_local.evaluation.pipeline import Run

    Run(make_config(tmp_path), engine_factory=Factory()).execute()
    return tmp_path / "run"


def test_gate_refuses_an_unfinished_run_with_its_own_exit_code(tmp_path):
    import json

    run_dir = _finished_run(tmp_path)
    gate = ["gate", str(run_dir), "--max-asr", "1", "--allow-degenerate-judge"]
    assert CliRunner().invoke(app, gate).exit_code == 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    refused = CliRunner().invoke(app, gate)
    assert refused.exit_code == 3 and "the run is not complete (status 'running')" in " ".join(refused.output.split())
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    with open(run_dir / "results.jsonl", "a", encoding="utf-8") as handle:  # results changed after the summary
        handle.write((run_dir / "results.jsonl").read_text().splitlines()[0] + "\n")
    stale = CliRunner().invoke(app, gate)
    assert stale.exit_code == 3 and "summary.json does not belong to results.jsonl" in " ".join(stale.output.split())


def test_corrupt_run_files_and_bad_thresholds_are_input_errors_not_tracebacks(tmp_path):
    run_dir = _finished_run(tmp_path)
    bad = CliRunner().invoke(app, ["gate", str(run_dir), "--max-asr", "1.5"])
    assert bad.exit_code == 2 and "--max-asr: a limit must be a number in [0, 1], got 1.5" in " ".join(
        bad.output.split()
    )
    # a run file that does not read is a run the gate cannot verify: refused (3), naming the file
    (run_dir / "summary.json").write_text('{"targets": {')
    for command in (["gate", str(run_dir), "--max-asr", "1"], ["report", str(run_dir)]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 3 and "corrupt run summary" in " ".join(result.output.split()), command
    (run_dir / "manifest.json").write_bytes(b"\xff\xfe")
    result = CliRunner().invoke(app, ["gate", str(run_dir), "--max-asr", "1"])
    assert result.exit_code == 3 and "corrupt run manifest" in " ".join(result.output.split())
    missing = CliRunner().invoke(app, ["compare", str(tmp_path / "nope"), str(run_dir)])
    assert missing.exit_code == 2 and "Traceback" not in missing.output


def test_a_missing_model_path_is_named_not_tried_as_a_hub_id(tmp_path, monkeypatch):
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.engines.base import local_model_path

    (tmp_path / "runs").mkdir()
    for typo in (str(tmp_path / "ckpt"), "./nope/ckpt", "../x/y/z"):
        try:
            local_model_path(typo)
        except DiagsafeError as exc:
            assert "no such file or directory" in str(exc)
        else:
            raise AssertionError(typo)
    monkeypatch.chdir(tmp_path)  # back where the test started afterwards: later tests use paths relative to it
    local_model_path("Qwen/Qwen2.5-7B-Instruct")  # a hub id stays a hub id
    with pytest.raises(DiagsafeError):
        local_model_path("runs/step-12O0")  # beside an existing runs/: a local path with a typo


def test_a_run_where_every_answer_failed_exits_3(tmp_path, monkeypatch):
    import yaml
    from test_pipeline_unit import Factory, make_config

    from diagsafe_local.engines.base import error_completion

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(make_config(tmp_path).model_dump(mode="json")))
    monkeypatch.setattr(
        "diagsafe_local.evaluation.pipeline.create_engine",
        Factory(target=lambda request: error_completion("the engine fell over")),
    )
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 3, result.output
    assert "nothing of t could be judged" in " ".join(result.output.split())


def test_bench_outputs_when_every_judgment_failed(tmp_path):
    import numpy as np

    from diagsafe_local.benchmark.dataset import load_dataset
    from diagsafe_local.benchmark.report import write_outputs
    from diagsafe_local.benchmark.runner import leaderboard, response_frame

    data = load_dataset(SAMPLE)
    responses = [(p, r) for p in data.prompts for r in p.responses]
    scores = response_frame(responses, {"judge:x": np.full(len(responses), np.nan)})
    worst = leaderboard(scores, data, missing="worst-case")
    assert worst.iloc[0]["overall"] == 0.0 and worst.iloc[0]["n_prompts_affected"] == 10
    dropped = leaderboard(scores, data, missing="drop-prompt")
    assert dropped.iloc[0]["n_prompts"] == 0
    for name, board in (("worst", worst), ("dropped", dropped)):
        write_outputs(tmp_path / name, board, scores, {"dataset": "x"}, data)  # was a TypeError
        assert "| `judge:x` | n/a" in (tmp_path / name / "failure_analysis.md").read_text()


def test_compare_refuses_runs_of_different_datasets_and_overwrite_keeps_user_files(tmp_path):
    import json

    from test_pipeline_unit import Factory, make_config

    from diagsafe_local.evaluation.pipeline import Run

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    run_a = _finished_run(tmp_path / "a")
    run_b = _finished_run(tmp_path / "b")
    assert CliRunner().invoke(app, ["compare", str(run_a), str(run_b)]).exit_code == 0
    manifest = json.loads((run_b / "manifest.json").read_text())
    manifest["dataset"]["sha256"] = "0" * 64
    (run_b / "manifest.json").write_text(json.dumps(manifest))
    refused = CliRunner().invoke(app, ["compare", str(run_a), str(run_b)])
    assert refused.exit_code == 2 and "different datasets" in " ".join(refused.output.split())
    assert CliRunner().invoke(app, ["compare", str(run_a), str(run_b), "--allow-different-datasets"]).exit_code == 0

    (run_a / "notes.txt").write_text("mine")
    (run_a / "figures").mkdir(exist_ok=True)
    (run_a / "figures" / "my_plot.png").write_text("mine")
    config = make_config(tmp_path / "a").model_copy(
        update={"targets": [make_config(tmp_path / "a").targets[0].model_copy(update={"name": "other"})]}
    )
    Run(config, overwrite=True, engine_factory=Factory()).execute()
    assert (run_a / "notes.txt").read_text() == "mine" and (run_a / "figures" / "my_plot.png").exists()


def test_unknown_gate_category_and_malformed_messages_cell_are_input_errors(tmp_path):
    from diagsafe_local.core.errors import DataError
    from diagsafe_local.evaluation.config import DatasetConfig
    from diagsafe_local.evaluation.items import load_items

    run_dir = _finished_run(tmp_path)
    result = CliRunner().invoke(app, ["gate", str(run_dir), "--max-asr", "1", "--max-asr-category", "cyber=0.1"])
    assert result.exit_code == 2 and "unknown category 'cyber'; this run has: benign, x, y" in " ".join(
        result.output.split()
    )
    csv = tmp_path / "items.csv"
    csv.write_text('id,messages\na,"[{""role"": ""user"", ""content"": ""hi""}]"\nb,"[{""role"": ""user"""\n')
    try:
        load_items(DatasetConfig(path=str(csv)), csv)
        raise AssertionError("no error")
    except DataError as exc:
        assert (exc.line, exc.field) == (3, "messages") and "not a JSON list of messages" in exc.message


def test_resume_is_keyed_by_content_changed_items_redone_removed_items_dropped(tmp_path):
    import json

    from test_pipeline_unit import ITEMS, Factory, make_config

    from diagsafe_local.evaluation.pipeline import Run

    config = make_config(tmp_path)
    Run(config, engine_factory=Factory()).execute()
    items = [dict(i) for i in ITEMS if i["id"] != "d"]  # d removed
    items[0] = {**items[0], "prompt": "Sure, tell me another thing"}  # a's prompt changed, same id
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    factory = Factory()
    summary = Run(config, engine_factory=factory).execute().model_dump(mode="json")
    target, judge = factory.made[0], factory.made[1]
    assert [r.messages[-1].content for b in target.batches for r in b] == ["Sure, tell me another thing"]
    judged = [r for b in judge.batches for r in b if "another thing" in r.messages[-1].content]
    assert judged  # its answer was judged again
    results = {
        (r.item_id, r.turn): r
        for r in __import__("diagsafe_local.runs.records", fromlist=["x"]).read_results(
            tmp_path / "run" / "results.jsonl"
        )
    }
    assert "d" not in {i for i, _ in results} and results[("a", 1)].answer == "answer to: Sure, tell me another thing"
    assert summary["targets"]["t"]["n_benign_items"] == 0
    # Kept: answers b/1-3, c/1 (replayed), c/2; verdicts b/1-3, c/2. Redone: a/1 and its verdict.
    assert summary["reused"] == {"generations": 5, "judgments": 4}
    from diagsafe_local.runs.report import write_report

    write_report(tmp_path / "run")
    assert "5 answers and 4 verdicts were reused" in (tmp_path / "run" / "report.md").read_text()


def test_a_new_model_at_the_same_path_is_not_mistaken_for_the_old_one(tmp_path):
    from test_pipeline_unit import Factory, make_config

    from diagsafe_local.evaluation.pipeline import Run

    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"step 1000")
    config = make_config(tmp_path, target={"model": str(model), "name": "t"})
    Run(config, engine_factory=Factory()).execute()
    again = Factory()
    Run(config, engine_factory=again).execute()
    assert again.made == []  # same content: nothing to redo
    (model / "weights.bin").write_bytes(b"step 2000")  # a new checkpoint written to the same path
    changed = Factory()
    summary = Run(config, engine_factory=changed).execute().model_dump(mode="json")
    assert changed.made[0].calls == 3 and summary["reused"]["generations"] == 0


@pytest.mark.slow
def test_sigterm_during_bench_leaves_no_temporaries_and_no_mixed_outputs(tmp_path):
    """SIGTERM right after the first output of the set is put in place (from inside the command, at that very
    point): the set is finished with the signal held back, then the command stops (exit 3), all outputs or none."""
    expected = {
        "leaderboard.csv",
        "leaderboard.md",
        "scores.parquet",
        "leaderboard.png",
        "bench.json",
        "failure_analysis.md",
        "failure_analysis.csv",
        "category_scores.csv",
    }
    out = tmp_path / "out"
    command = ["bench", "--dataset", str(SAMPLE), "--metrics", "all", "--chart", "--out", str(out)]
    stopped = [sys.executable, str(REPO / "tests" / "node_failure.py"), "SIGTERM", "leaderboard.png", "1", *command]
    done = subprocess.run(stopped, start_new_session=True, capture_output=True, text=True, timeout=600)
    assert done.returncode == 3 and "interrupted by SIGTERM" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    written = {p.name for p in out.iterdir()} - {".diagsafe.lock"}
    assert not [n for n in written if n.endswith(".tmp")]
    assert written == expected  # the whole set, never part of it


def test_a_late_error_leaves_no_empty_output_directory(tmp_path):
    out = tmp_path / "new-out"
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--dataset",
            str(SAMPLE),
            "--judge",
            "harmjudge",
            "--judge-model",
            str(tmp_path / "no-such-model"),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2 and "no such file or directory" in " ".join(result.output.split())
    assert not out.exists()
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "a", "prompt": "hi"}\n')
    config = tmp_path / "run.yaml"
    config.write_text(
        f"dataset: {{path: {items}}}\ntarget: {{model: {tmp_path}/nope/t}}\njudge: {{model: j/k}}\n"
        f"output_dir: {tmp_path / 'run-out'}\n"
    )
    run = CliRunner().invoke(app, ["run", str(config)])
    assert run.exit_code == 2 and "no such file or directory" in " ".join(run.output.split())
    assert not (tmp_path / "run-out").exists()


def test_compare_agreement_uses_scores_not_a_label_only_some_judges_write(tmp_path):
    """Two runs whose judge writes no "label" (PAIR-style ratings) used to agree trivially ("None" == "None")."""
    import json

    from diagsafe_local.runs.agreement import compare_runs

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    run_a, run_b = _finished_run(tmp_path / "a"), _finished_run(tmp_path / "b")
    for run_dir, flip in ((run_a, False), (run_b, True)):
        rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
        for k, row in enumerate(rows):
            harmful = (k % 2 == 0) != flip
            row["verdict"], row["score"] = {"rating": 10 if harmful else 1}, 1.0 if harmful else 0.0
        (run_dir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = compare_runs(run_a, run_b)
    assert result["both_scored"] == 6 and result["label_agreement"] == 0.0 and result["cohen_kappa"] < 0
    assert {d["a"] for d in result["disagreements"]} == {"harmful", "not_harmful"}


def test_a_summary_of_another_version_is_a_clear_error_not_a_guessed_key(tmp_path):
    import json

    run_dir = _finished_run(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    del summary["targets"]["t"]["judge_health"]  # as an older version wrote it
    (run_dir / "summary.json").write_text(json.dumps(summary))
    result = CliRunner().invoke(app, ["gate", str(run_dir), "--max-asr", "1"])
    message = " ".join(result.output.split())
    assert result.exit_code == 3 and "not a run summary of this version" in message and "judge_health" in message
