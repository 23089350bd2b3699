"""SLURM on a real single-node cluster started by the test suite: the sbatch scripts, the sharded array
job with its merge job (vLLM CPU engine, tiny models), a failed shard reported and resubmitted alone."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import REPO, in_process_vllm_for_children, tiny_engine
from slurm_cluster import LocalSlurm
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.runs.manifest import Shard
from diagsafe_local.selftest import synthetic_items

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
SMALL = ["--gpus=0", "--cpus-per-task=1", "--mem=1G", "--time=00:10:00"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm")).start()  # raises, never skips, if SLURM cannot start
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    cluster.stop()


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "slurm").glob("*.sbatch")))
def test_sbatch_scripts_pass_bash_n_and_test_only(slurm, script, tmp_path):
    path = REPO / "slurm" / script
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    # --gpus is a job's total, which a scheduler may split over nodes: every script keeps its job on one.
    assert "#SBATCH --nodes=1\n" in path.read_text()
    extra = ["--array=0-1"] if script == "array.sbatch" else []
    proc = subprocess.run(
        ["sbatch", "--test-only", *SMALL, *extra, str(path), "config.yaml", "2"],
        capture_output=True,
        text=True,
        env=slurm.env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and "to start" in proc.stderr, proc.stderr


def _job_ids(output: str) -> tuple[str | None, str]:
    array = re.search(r"array job (\d+)", output)
    merge = re.search(r"merge job (\d+)", output)
    return (array[1] if array else None), merge[1]


def test_array_and_merge_match_an_unsharded_run_and_a_failed_shard_is_resubmitted(
    slurm, tiny_models, vllm_engines, tmp_path
):
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps(i) + "\n" for i in synthetic_items(8)))
    out = tmp_path / "run"
    data = {
        "dataset": {"path": str(items)},
        "target": {**tiny_engine(tiny_models["target"]), "name": "tiny", "sampling": {"max_tokens": 16}},
        "judge": {**tiny_engine(tiny_models["judge"]), "turns": "every", "sampling": {"max_tokens": 400}},
        "output_dir": str(out),
    }
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(data))
    blocker = Shard(index=1, count=2).directory(out)
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where shard 1's run directory should go: the shard job fails")
    args = [
        "submit",
        str(config),
        "--shards",
        "2",
        "--gpus-per-task",
        "0",
        "--cpus-per-task",
        "1",
        "--mem",
        "3G",
        "--time",
        "00:30:00",
    ]
    runner = CliRunner()

    dry = runner.invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0 and "--array=0,1" in dry.output and "afterok:<array job id>" in dry.output

    with in_process_vllm_for_children():  # each job's two engines start in seconds
        first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    array_id, merge_id = _job_ids(first.output)
    slurm.wait([array_id, merge_id])
    assert slurm.job_state(f"{array_id}_0") == "COMPLETED"
    assert slurm.job_state(f"{array_id}_1") == "FAILED"
    assert slurm.job_state(merge_id) == "CANCELLED"  # afterok on a failed array never runs
    report = runner.invoke(app, ["merge", "--config", str(config), "--shards", "2"])
    assert report.exit_code == 2 and "shard 1 of 2 is missing" in " ".join(report.output.split())

    blocker.unlink()
    with in_process_vllm_for_children():
        second = runner.invoke(app, args)
    assert second.exit_code == 0 and "shards 1 of 2 (1 already complete, skipped)" in second.output, second.output
    array_id, merge_id = _job_ids(second.output)
    slurm.wait([array_id, merge_id])
    logs = "\n".join(p.read_text()[-1500:] for p in sorted((out / "slurm-logs").glob("*.out")))
    assert slurm.job_state(merge_id) == "COMPLETED", logs
    manifest = json.loads((Shard(index=1, count=2).directory(out) / "manifest.json").read_text())
    assert manifest["host"]["slurm"]["SLURM_ARRAY_TASK_ID"] == "1" and manifest["shard"] == {"index": 1, "count": 2}

    data["output_dir"] = str(tmp_path / "unsharded")
    Run(RunConfig.model_validate(data), engine_factory=vllm_engines).execute()

    def by_key(path: Path) -> dict:
        rows = {}
        for line in path.read_text().splitlines():
            r = json.loads(line)
            r["target_usage"].pop("cached_tokens")
            r["judge_usage"].pop("cached_tokens")
            rows[(r["item_id"], r["sample"], r["turn"])] = r
        return rows

    merged, unsharded = by_key(out / "results.jsonl"), by_key(tmp_path / "unsharded" / "results.jsonl")
    assert merged == unsharded and len(merged) == 14
    assert (out / "report.md").exists() and json.loads((out / "summary.json").read_text())["targets"]["tiny"][
        "n_judged"
    ] == 14


def test_a_training_run_with_the_callback_evaluates_its_checkpoints_on_slurm(slurm, tiny_models, tmp_path):
    """A real transformers Trainer trains a tiny model on CPU and saves 3 checkpoints; the callback records each
    and submits its run to the cluster (nothing is judged in training); the runs finish there, and the series
    report shows every checkpoint with its interval and its paired comparison with the previous one."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
    )

    from diagsafe_local.evaluation.slurm import Resources
    from diagsafe_local.integrations.transformers import SafetyEvalCallback
    from diagsafe_local.runs.series_state import read_series

    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps(i) + "\n" for i in synthetic_items(6)))
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "dataset": {"path": str(items)},
                "target": {**tiny_engine(tiny_models["target"]), "sampling": {"max_tokens": 16}},
                "judge": {**tiny_engine(tiny_models["judge"]), "sampling": {"max_tokens": 400}},
                "output_dir": str(tmp_path / "unused"),
            }
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["target"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models["target"], torch_dtype=torch.float32)
    texts = [f"example {k}: the quick brown fox jumps over the lazy dog" for k in range(16)]
    data = [{"input_ids": tokenizer(t)["input_ids"]} for t in texts]
    train = tmp_path / "train"
    series = tmp_path / "series"
    # both of the node's CPUs per job: one evaluation at a time, as two vLLM engines per job beside the session's
    # shared engines fill this machine's memory (run twice at once, vLLM found 0.28 GiB free for its KV cache)
    callback = SafetyEvalCallback(
        config, series, resources=Resources(gpus_per_task=0, cpus_per_task=2, mem="3G", time="00:30:00")
    )
    args = TrainingArguments(
        output_dir=str(train), max_steps=6, save_steps=2, per_device_train_batch_size=4, learning_rate=1e-3,
        report_to=[], use_cpu=True, logging_steps=100, save_only_model=True,
    )  # fmt: skip
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        processing_class=tokenizer,
        callbacks=[callback],
    )
    with in_process_vllm_for_children():  # the callback submits each checkpoint's run
        trainer.train()
    state = read_series(series)
    assert [(e.name, e.status) for e in state.ordered()] == [
        ("checkpoint-2", "submitted"),
        ("checkpoint-4", "submitted"),
        ("checkpoint-6", "submitted"),
    ]
    slurm.wait(sorted({e.job_id.split("_")[0] for e in state.ordered()}), timeout=1500)
    logs = "\n".join(p.read_text()[-1500:] for p in sorted((series / "slurm-logs").glob("*.out")))
    runner = CliRunner()
    refreshed = runner.invoke(app, ["watch", str(train), "--config", str(config), "--out", str(series), "--submit",
                                    "--once", "--gpus-per-task", "0"])  # fmt: skip
    assert refreshed.exit_code == 0, refreshed.output + logs
    assert {e.status for e in read_series(series).checkpoints.values()} == {"finished"}, logs
    figures = json.loads((series / "series.json").read_text())
    steps = [(p["step"], p["status"]) for p in figures["points"]]
    assert steps == [(2, "finished"), (4, "finished"), (6, "finished")]
    assert all(
        p["asr"]["n"] == 6 and p["asr"]["ci_low"] <= p["asr"]["value"] <= p["asr"]["ci_high"] for p in figures["points"]
    )
    assert [p["vs_previous"]["against"] if p["vs_previous"] else None for p in figures["points"]] == [
        None,
        "checkpoint-2",
        "checkpoint-4",
    ]
    assert (series / "figures" / "series_asr.png").stat().st_size > 0
    gate = runner.invoke(
        app, ["gate", str(series), "--checkpoint", "latest", "--max-asr", "1", "--allow-degenerate-judge"]
    )
    assert gate.exit_code in (0, 1) and "checkpoint checkpoint-6 (step 6" in gate.output, gate.output
    print((series / "report.md").read_text())
