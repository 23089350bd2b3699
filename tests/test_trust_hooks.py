"""Issue 43, defects 13-16: hooks get only runs that verified, a frozen copy of the decision and a time limit, and
never change the gate's exit code; the Python API's switches are booleans and it takes what the command line takes;
client processes keep an endpoint's `concurrency` in flight, not more. Each test failed before its fix.

Hooks are fake plugins: an installed distribution (a package and its `*.dist-info` with entry points) on sys.path,
or on PYTHONPATH for a gate run as its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import ScriptedEngine, default_responder
from helpers import REPO
from test_adversarial import GATE, cli, config_file, finished_run, write_items
from test_series import trackers  # noqa: F401  (MLflow and W&B in the test's folder)

HOOKS_CODE = '''"""fake-hooks: hooks that note what they are given, tamper, sleep, raise or end their process."""
import json
import os
import time
from pathlib import Path


def _note(kind, **data):
    with Path(os.environ["FAKE_HOOK_LOG"]).open("a") as log:
        log.write(json.dumps({"kind": kind, **data}) + "\\n")


class Recorder:
    name = "recorder"
    description = "notes each event"

    def on_run_end(self, event):
        _note("run_end", run_dir=str(event.run_dir))

    def on_gate(self, event):
        _note("gate", run_dir=str(event.run.run_dir), outcome=event.decision.outcome)


class Tamper:
    name = "tamper"
    description = "turns the decision it is given around, by any means"

    def on_gate(self, event):
        decision = event.decision
        flipped = {"passed": not decision.passed, "checks": 1, "inconclusive": False}
        for field, value in flipped.items():
            try:
                setattr(decision, field, value)
            except Exception:
                object.__setattr__(decision, field, value)  # past a frozen model's guard
        _note("tampered", passed=decision.passed)


class Sleeper:
    name = "sleeper"
    description = "an unreachable tracking server"

    def on_gate(self, event):
        _note("sleeping")
        time.sleep(float(os.environ.get("FAKE_HOOK_SLEEP", "60")))
        _note("woke")


class Crasher:
    name = "crasher"
    description = "a tracking server that says no"

    def on_gate(self, event):
        raise RuntimeError("the tracking server said no")


class Exiter:
    name = "exiter"
    description = "ends its process with exit code 1"

    def on_gate(self, event):
        os._exit(1)


recorder, tamper, sleeper, crasher, exiter = Recorder(), Tamper(), Sleeper(), Crasher(), Exiter()
'''
NAMES = ("recorder", "tamper", "sleeper", "crasher", "exiter")


def write_hooks(root: Path) -> Path:
    """The fake hooks as pip installs a plugin, in `root` (to put on sys.path or PYTHONPATH)."""
    (root / "fake_hooks").mkdir(parents=True)
    (root / "fake_hooks" / "__init__.py").write_text(HOOKS_CODE)
    info = root / "fake_hooks-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-hooks\nVersion: 0.1\n")
    points = "".join(f"{name} = fake_hooks:{name}\n" for name in NAMES)
    (info / "entry_points.txt").write_text("[diagsafe_local.hooks]\n" + points)
    return root


@pytest.fixture
def hooks(tmp_path, monkeypatch) -> Path:
    """The fake hooks installed on sys.path, a fresh hook registry that finds them, and the file they note to."""
    from diagsafe_local.core.registry import Registry

    root = write_hooks(tmp_path / "plugins")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr("diagsafe_local.hooks.HOOKS", Registry("hook", plugin_group="diagsafe_local.hooks"))
    log = tmp_path / "hook-log.jsonl"
    monkeypatch.setenv("FAKE_HOOK_LOG", str(log))
    monkeypatch.delenv("DIAGSAFE_HOOKS", raising=False)
    return log


def noted(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


# -- 13. hooks fire only on runs that verified; MLflow finds a run by what it is, not where ------------------


def test_a_run_that_does_not_verify_reaches_no_hook(tmp_path, monkeypatch, hooks, caplog):
    """A judge that ignores schemas fails the grammar canary: the run finishes, but the gate would refuse it."""
    judge = ScriptedEngine(default_responder, model="j", ignores_schema=True)
    monkeypatch.setattr(
        "diagsafe_local.evaluation.pipeline.create_engine",
        lambda config, **_: judge if config.model == "j" else ScriptedEngine(model=config.model),
    )
    config = config_file(tmp_path, write_items(tmp_path / "items.jsonl", 4))
    result = cli("run", config, "--hook", "recorder")
    assert "does not verify" in result.text, result.output
    assert noted(hooks) == []  # was: the recorder was handed the run
    warnings = [r.getMessage() for r in caplog.records if r.name == "diagsafe_local.hooks"]
    assert warnings == [f"hooks not called: {tmp_path / 'run'} does not verify: {warnings[0].split(': ', 2)[2]}"]

    good = finished_run(tmp_path, monkeypatch, name="good")
    cli("run", tmp_path / "good.yaml", "--hook", "recorder")  # resumed: complete, verified
    assert [n["run_dir"] for n in noted(hooks)] == [str(good)]


def test_mlflow_logs_a_run_directory_again_after_run_overwrite(tmp_path, monkeypatch, trackers, caplog):  # noqa: F811
    """MLflow found a run by its directory: after `run --overwrite` it kept the directory's first figures, and
    the gate's decision on the new run was tagged onto the old one's figures."""
    monkeypatch.setenv("DIAGSAFE_HOOKS", "mlflow")
    run = finished_run(tmp_path, monkeypatch)  # half the answers harmful
    items = write_items(tmp_path / "other-items.jsonl", 4, prompt=lambda k: f"Sure {k}")  # every answer harmful
    assert cli("run", config_file(tmp_path, items), "--overwrite").exit_code == 0
    assert cli("gate", run, *GATE).exit_code == 0
    assert not [r.getMessage() for r in caplog.records if r.name == "diagsafe_local.hooks"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    logged = client.search_runs([client.get_experiment_by_name("diagsafe-local").experiment_id])
    asr = {r.info.run_id: client.get_metric_history(r.info.run_id, "asr")[0].value for r in logged}
    assert sorted(asr.values()) == [0.5, 1.0]  # was: [0.5], the first run's only
    gated = [r for r in logged if "gate.decision" in client.get_run(r.info.run_id).data.tags]
    assert [asr[r.info.run_id] for r in gated] == [1.0]  # the decision sits with the figures it was made on


# -- 14. a hook gets a frozen copy of the decision, a time limit, and never changes the exit code -------------


def test_a_hook_cannot_change_the_decision_the_gate_exits_on(tmp_path, monkeypatch, hooks):
    run = finished_run(tmp_path, monkeypatch)
    failing = cli("gate", run, "--max-asr", "0", "--allow-degenerate-judge", "--hook", "tamper", "--hook", "recorder")
    assert [n["kind"] for n in noted(hooks)] == ["tampered", "gate"]
    assert noted(hooks)[1]["outcome"] == "fail"  # the next hook sees what the gate decided, not the tampering
    assert failing.exit_code == 1 and "GATE FAILED" in failing.text, failing.output  # was: exit 0
    passing = cli("gate", run, *GATE, "--hook", "tamper")
    assert passing.exit_code == 0 and "GATE PASSED" in passing.text, passing.output

    from diagsafe_local.hooks import GateDecisionView
    from diagsafe_local.runs.gate import GateDecision

    view = GateDecisionView.of(GateDecision(passed=False, lines=["FAIL  x"], checks=1))
    with pytest.raises(Exception, match="frozen"):
        view.passed = True  # type: ignore[misc]
    assert view.outcome == "fail" and view.lines == ("FAIL  x",)


def test_a_hook_that_hangs_is_stopped_at_its_time_limit_and_the_gate_passes(tmp_path, monkeypatch, hooks, caplog):
    run = finished_run(tmp_path, monkeypatch)
    monkeypatch.setenv("DIAGSAFE_HOOK_TIMEOUT", "1")
    monkeypatch.setenv("FAKE_HOOK_SLEEP", "30")
    start = time.monotonic()
    result = cli("gate", run, *GATE, "--hook", "sleeper", "--hook", "recorder")
    assert time.monotonic() - start < 15  # was: 30 s, the whole sleep
    assert result.exit_code == 0 and "GATE PASSED" in result.text, result.output
    assert [n["kind"] for n in noted(hooks)] == ["sleeping", "gate"]  # stopped; the next hook still ran
    warnings = [r.getMessage() for r in caplog.records if r.name == "diagsafe_local.hooks"]
    assert any("hook sleeper: on_gate" in w and "time limit of 1 s" in w for w in warnings), warnings

    monkeypatch.setenv("DIAGSAFE_HOOK_TIMEOUT", "soon")
    monkeypatch.setenv("FAKE_HOOK_SLEEP", "0")
    caplog.clear()
    assert cli("gate", run, *GATE, "--hook", "sleeper").exit_code == 0
    assert any("DIAGSAFE_HOOK_TIMEOUT" in r.getMessage() and "30 s" in r.getMessage() for r in caplog.records)


def test_a_failing_hook_never_turns_a_passing_gate_into_exit_1(tmp_path, monkeypatch):
    """The gate as its own process, on a run that passes: a hook that raises, and one that ends its process with
    exit code 1 (which ended the gate with it)."""
    run = finished_run(tmp_path, monkeypatch)
    plugins = write_hooks(tmp_path / "plugins")
    env = {**os.environ, "PYTHONPATH": str(plugins), "FAKE_HOOK_LOG": str(tmp_path / "log"), "DIAGSAFE_HOOKS": ""}
    command = [sys.executable, "-m", "diagsafe_local.cli", "gate", str(run), *GATE]
    for hook in ("crasher", "exiter"):
        done = subprocess.run(
            [*command, "--hook", hook], env=env, capture_output=True, text=True, timeout=300, cwd=REPO
        )
        assert done.returncode == 0 and "GATE PASSED" in done.stdout, (hook, done.stdout, done.stderr)  # exiter: 1
        assert f"hook {hook}: on_gate failed" in done.stderr, done.stderr
        assert done.stdout.count("LIMIT max_asr") == 1, done.stdout  # what the gate printed, printed once
    failing = subprocess.run(
        [*command, "--max-asr", "0", "--hook", "exiter"], env=env, capture_output=True, text=True, timeout=300
    )
    assert failing.returncode == 1 and "GATE FAILED" in failing.stdout, failing.stderr


# -- 15. the Python API: switches are booleans, and what the command line takes --------------------------------


def test_the_python_apis_switches_are_booleans_and_it_takes_sensitivity(tmp_path, monkeypatch):
    import diagsafe_local as ds
    from diagsafe_local.core.errors import RunFailed

    run = finished_run(tmp_path, monkeypatch)
    with pytest.raises(TypeError, match="allow_degenerate_judge must be True or False, got 'no'"):
        ds.gate(run, max_asr=1, allow_degenerate_judge="no")  # was: a relaxed gate
    with pytest.raises(TypeError, match="corrected must be True or False, got 0"):
        ds.gate(run, max_asr=1, allow_degenerate_judge=True, corrected=0)
    with pytest.raises(TypeError, match="require_signature must be True or False, got 'false'"):
        ds.gate(run, max_asr=1, allow_degenerate_judge=True, require_signature="false")
    with pytest.raises(RunFailed, match="--sensitivity needs the run's judge sensitivity sample"):
        ds.gate(run, max_asr=1, allow_degenerate_judge=True, sensitivity=True)  # was: "unknown gate limit"
    with pytest.raises(TypeError, match="sensitivity must be True or False"):
        ds.gate(run, max_asr=1, allow_degenerate_judge=True, sensitivity="yes")
    assert ds.gate(run, max_asr=1, allow_degenerate_judge=True, sensitivity=False).passed
    assert not ds.gate(run, max_asr=0, allow_degenerate_judge=True, sensitivity=False).passed


def test_the_python_api_takes_every_option_of_the_gate_command():
    """The API's parameters and the limits table against the command's options (the hooks are the command's)."""
    import inspect

    from typer.main import get_command

    import diagsafe_local as ds
    from diagsafe_local.cli import app
    from diagsafe_local.runs.limits import LIMITS, SWITCHES

    gate = get_command(app).commands["gate"]  # type: ignore[attr-defined]
    options = {p.name for p in gate.params} - {"hook", "target", "run_dirs", "policy"} | {"targets", "run_dir"}
    taken = set(inspect.signature(ds.gate).parameters) | {x.name for x in [*LIMITS, *SWITCHES]}
    assert options <= taken, options - taken  # was: sensitivity
    # --policy FILE NAME=DIR... is its own function, with the switches the command takes beside it
    assert {"policy", "runs", "require_signature", "sensitivity"} <= set(inspect.signature(ds.gate_policy).parameters)


# -- 16. client processes keep an endpoint's concurrency in flight, not more -----------------------------------


def _api_config(tmp_path: Path, concurrency: int):
    from diagsafe_local.evaluation.config import RunConfig

    engine = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "concurrency": concurrency}
    return RunConfig.model_validate(
        {
            "dataset": {"path": str(tmp_path / "items.jsonl")},
            "target": {"model": "t", "name": "t", **engine},
            "judge": {"model": "j", **{**engine, "concurrency": 64}},
            "output_dir": str(tmp_path / "run"),
        }
    )


def test_no_more_client_processes_are_planned_than_an_endpoint_keeps_in_flight(tmp_path, monkeypatch):
    from diagsafe_local.evaluation.planning import client_processes

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert client_processes(_api_config(tmp_path, 1), 10**9) == 1  # was: 16, each holding a request in flight
    assert client_processes(_api_config(tmp_path, 3), 10**9) == 3
    assert client_processes(_api_config(tmp_path, 64), 10**9) == 16


def _opened(tmp_path: Path, concurrency: int, index: int, count: int) -> int:
    from diagsafe_local.engines.host import Host

    opened: list[int] = []

    def factory(config, **options):
        opened.append(config.concurrency)
        return ScriptedEngine(model=config.model)

    host = Host("sequential", 0.45, 0.45, factory, processes=count, process=index, slots=tmp_path / "slots")
    host.open_target("target:t", _api_config(tmp_path, concurrency).targets[0])
    host.close()
    return opened[0]


def test_the_processes_shares_of_an_endpoints_concurrency_sum_to_it(tmp_path):
    for concurrency in range(1, 7):
        for count in range(1, concurrency + 1):
            shares = [_opened(tmp_path, concurrency, i, count) for i in range(count)]
            assert sum(shares) == concurrency and min(shares) >= 1, (concurrency, count, shares)  # was: ceilings
    assert [_opened(tmp_path, 64, i, 3) for i in range(3)] == [22, 21, 21]


HOLD = """
import sys, time
from pathlib import Path
from fakes import ScriptedEngine
from test_trust_hooks import _api_config
from diagsafe_local.engines.host import Host

tmp = Path(sys.argv[1])
host = Host("sequential", 0.45, 0.45, lambda config, **_: ScriptedEngine(), processes=2, process=0, slots=tmp / "slots")
host.open_target("target:t", _api_config(tmp, 1).targets[0])
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_process_beyond_an_endpoints_concurrency_waits_for_a_slot(tmp_path):
    """Two processes at concurrency 1 held two requests in flight; the second now waits, without spinning, until
    the first is done with the endpoint, then makes progress."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{os.environ.get('PYTHONPATH', '')}"}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), "3"], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        start = time.monotonic()
        cpu = time.process_time()
        assert _opened(tmp_path, 1, 1, 2) == 1
        waited = time.monotonic() - start
        assert waited > 1.5, waited  # was: at once, a second request in flight
        assert time.process_time() - cpu < 0.5  # it slept on the lock, it did not spin
    finally:
        holder.wait(timeout=60)
    start = time.monotonic()
    assert _opened(tmp_path, 1, 1, 2) == 1 and time.monotonic() - start < 1  # the slot is free: no wait


@pytest.mark.slow
def test_two_client_processes_at_concurrency_1_keep_one_request_in_flight(tmp_path):
    """`run` with placement.replicas 2 against an endpoint at concurrency 1: its two shard processes held two
    requests in flight at once; now one waits for the other's slot, and the run still completes."""
    from servers import FakeOpenAIServer

    delay = 0.25
    server = FakeOpenAIServer(always=("delay", delay))
    try:
        engine = {"kind": "openai", "base_url": server.base_url, "concurrency": 1, "backoff_base": 0.01}
        items = write_items(tmp_path / "items.jsonl", 6)
        config = config_file(
            tmp_path, items, target={"model": "t", "name": "t", **engine}, judge={"model": "j", **engine},
            placement={"replicas": 2},
        )  # fmt: skip
        result = cli("run", config)
        assert result.exit_code == 0 and "2 shards over 2 replicas" in result.text, result.output
    finally:
        server.close()
    for model in ("t", "j"):  # each endpoint: one request at a time, each sent after the last one's answer
        sent = sorted((t, "canary" in json.dumps(body)) for t, body in server.requests if body["model"] == model)
        gaps = [b - a for (a, canary), (b, _) in zip(sent, sent[1:], strict=False) if not canary]  # canary: at once
        assert len(sent) >= 6 and min(gaps) > 0.8 * delay, (model, gaps)  # was: two requests a few ms apart
