"""Offline by proof (issue 47, item 2): the socket guard, `run --offline` recording its policy, a model not on
disk refused before anything loads, the default under `submit` and `watch --submit`, and a whole `run` inside a
fresh network namespace (`unshare -n`, loopback up) where any other connection fails."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, tiny_engine
from servers import FakeOpenAIServer
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.offline import ENV, HUB_SETTINGS, NetworkRefused, offline
from diagsafe_local.runs.manifest import Manifest, read_manifest_file


@pytest.fixture
def server():
    fake = FakeOpenAIServer()
    yield fake
    fake.close()


def _config(tmp_path: Path, base_url: str, **target: str) -> Path:
    """An API-path run of three items, target and judge at `base_url` (the target's fields overridable)."""
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": f"i{k}", "prompt": f"question {k}"}) + "\n" for k in range(3)))
    served = {"kind": "openai", "model": "m", "base_url": base_url, "max_retries": 0}
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "dataset": {"path": str(items)},
                "target": {"name": "t", **served, **target},
                "judge": served,
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    return config


# -- the guard --------------------------------------------------------------------------------------------------


def test_the_guard_refuses_a_host_outside_loopback_and_the_endpoints_naming_it_and_the_setting():
    with offline(["http://192.0.2.7:8000/v1"]):
        with pytest.raises(NetworkRefused, match=r"'example\.org' refused: the run is offline \(--offline"):
            socket.create_connection(("example.org", 443), timeout=1)
        with socket.socket() as sock, pytest.raises(NetworkRefused, match=r"'203\.0\.113\.5'.*DIAGSAFE_OFFLINE=1"):
            sock.connect(("203.0.113.5", 80))
        with pytest.raises(NetworkRefused, match="huggingface.co"):
            socket.getaddrinfo("huggingface.co", 443)
    assert NetworkRefused("x").exit_code == 3 and isinstance(NetworkRefused("x"), OSError)  # a library sees OSError


def test_the_guard_allows_loopback_and_the_configured_endpoint():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with offline(["http://192.0.2.7:8000/v1"]):
            socket.create_connection(("localhost", listener.getsockname()[1]), timeout=5).close()
            with socket.socket() as sock:
                sock.connect(("127.0.0.1", listener.getsockname()[1]))
            with socket.socket() as sock:  # the endpoint's address passes the guard (whatever the network says)
                sock.setblocking(False)
                assert sock.connect_ex(("192.0.2.7", 8000)) != 0  # in progress or unreachable, never refused


def test_offline_sets_the_hubs_switches_and_restores_everything_after(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("WANDB_MODE", "online")
    before = (socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex)
    with offline([]):
        assert all(os.environ[name] == value for name, value in HUB_SETTINGS.items()) and os.environ[ENV] == "1"
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['HF_HUB_OFFLINE'])"],
                               capture_output=True, text=True, check=True)  # fmt: skip
        assert child.stdout.strip() == "1"  # every process the run starts inherits them
    assert "HF_HUB_OFFLINE" not in os.environ and os.environ["WANDB_MODE"] == "online"
    assert (socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex) == before


# -- run --offline ----------------------------------------------------------------------------------------------


def test_an_offline_run_records_its_policy_and_endpoints_and_an_online_run_says_it_was_not(server, tmp_path):
    config = _config(tmp_path, server.base_url)
    result = CliRunner().invoke(app, ["run", str(config)], env={ENV: "1"})  # as a job of `submit` is told
    assert result.exit_code == 0, result.output
    network = read_manifest_file(tmp_path / "run").network
    assert network is not None and network.offline and network.endpoints == [server.base_url]
    result = CliRunner().invoke(app, ["run", str(config), "--overwrite"], env={ENV: "0"})  # as `submit --online`
    assert result.exit_code == 0, result.output
    network = read_manifest_file(tmp_path / "run").network
    assert network is not None and not network.offline


def test_gate_require_offline_passes_only_a_signed_run_that_recorded_an_offline_policy(server, tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGSAFE_SIGNING_KEY", "k" * 32)
    config = _config(tmp_path, server.base_url)
    gate = ["gate", str(tmp_path / "run"), "--max-asr", "1", "--allow-degenerate-judge", "--require-signature"]
    for offline_flag, passes in (("1", True), ("0", False)):
        ran = CliRunner().invoke(app, ["run", str(config), "--overwrite"], env={ENV: offline_flag})
        assert ran.exit_code == 0, ran.output
        result = CliRunner().invoke(app, [*gate, "--require-offline"])
        assert result.exit_code == (0 if passes else 3), result.output
    plain = CliRunner().invoke(app, gate)
    assert plain.exit_code == 0, plain.output  # the online run passes without the switch
    assert "refused: --require-offline: its signed manifest records no offline network policy" in " ".join(
        result.output.split()
    )
    monkeypatch.delenv("DIAGSAFE_SIGNING_KEY")  # an offline run whose record no signature vouches for
    ran = CliRunner().invoke(app, ["run", str(config), "--overwrite"], env={ENV: "1"})
    assert ran.exit_code == 0, ran.output
    result = CliRunner().invoke(app, [*gate[:-1], "--require-offline"])
    assert result.exit_code == 3 and "no verified signature" in " ".join(result.output.split()), result.output


def test_a_merge_is_offline_only_where_every_shard_ran_offline(server, tmp_path):
    config = _config(tmp_path, server.base_url)
    for shard, offline_flag in (("0/2", "1"), ("1/2", "1")):
        result = CliRunner().invoke(app, ["run", str(config), "--shard", shard], env={ENV: offline_flag})
        assert result.exit_code == 0, result.output
    shards = sorted((tmp_path / "run" / "shards").iterdir())
    merged = tmp_path / "merged"
    assert CliRunner().invoke(app, ["merge", *map(str, shards), "--out", str(merged)]).exit_code == 0
    network = read_manifest_file(merged).network
    assert network is not None and network.offline and network.endpoints == [server.base_url]
    result = CliRunner().invoke(app, ["run", str(config), "--shard", "1/2", "--overwrite"], env={ENV: "0"})
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["merge", *map(str, shards), "--out", str(tmp_path / "merged-online")])
    assert result.exit_code == 0, result.output
    network = read_manifest_file(tmp_path / "merged-online").network
    assert network is not None and not network.offline


def test_an_offline_run_whose_model_is_not_on_disk_nor_in_the_hub_cache_stops_before_loading(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    config = _config(tmp_path, "http://127.0.0.1:9/v1", kind="vllm", model="diagsafe-test/never-downloaded")
    result = subprocess.run(
        [sys.executable, "-m", "diagsafe_local.cli", "run", str(config), "--offline"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    message = " ".join(result.stderr.split())
    assert (
        "model 'diagsafe-test/never-downloaded' is neither a local directory nor in the Hugging Face cache" in message
    )
    assert "hf download diagsafe-test/never-downloaded" in message
    assert not (tmp_path / "run").exists()  # before the run directory, before any engine


def test_submit_and_watch_submit_run_their_jobs_offline_unless_asked_not_to(tmp_path, monkeypatch):
    config = _config(tmp_path, "http://127.0.0.1:9/v1")
    for args, value in (([], "1"), (["--online"], "0")):
        dry = CliRunner().invoke(app, ["submit", str(config), "--shards", "2", *args, "--dry-run"])
        assert dry.exit_code == 0, dry.output
        sbatch = [line for line in dry.output.splitlines() if line.startswith("sbatch ")]
        exports = [word for line in sbatch for word in line.split() if word.startswith("--export=")]
        assert len(sbatch) == 2 and exports == [f"--export=ALL,DIAGSAFE_VENV={sys.prefix},{ENV}={value}"] * 2
    from diagsafe_local.evaluation import watch
    from diagsafe_local.evaluation.slurm import Resources
    from diagsafe_local.runs.series_state import CheckpointEntry

    sent: list[list[str]] = []
    monkeypatch.setattr(watch, "sbatch", lambda args: sent.append(args) or "7")
    monkeypatch.setattr(watch, "set_status", lambda *args, **kwargs: None)
    spec = watch.SeriesSpec(tmp_path / "series", tmp_path / "train", config)
    entry = CheckpointEntry(
        name="checkpoint-5", step=5, path=str(tmp_path / "train" / "checkpoint-5"), status="seen",
        run_dir=str(tmp_path / "series" / "runs" / "checkpoint-5"), seen="now", updated="now",
    )  # fmt: skip
    watch.submit(spec, [entry], Resources(gpus_per_task=0))
    (args,) = sent
    assert [a for a in args if a.startswith("--export=")] == [f"--export=ALL,DIAGSAFE_VENV={sys.prefix},{ENV}=1"]
    from test_series import checkpoint

    checkpoint(tmp_path / "train", "checkpoint-10")
    for option, value in (("--online", "0"), ("--offline", "1")):
        sent.clear()
        watched = CliRunner().invoke(
            app, ["watch", str(tmp_path / "train"), "--config", str(config), "--submit", "--once", option,
                  "--out", str(tmp_path / f"series{option}"), "--gpus-per-task", "0"],
        )  # fmt: skip
        assert watched.exit_code == 0, watched.output
        assert [a for args in sent for a in args if a.startswith("--export=")] == [
            f"--export=ALL,DIAGSAFE_VENV={sys.prefix},{ENV}={value}"
        ]


# -- the proof: a whole run in a network namespace of its own ----------------------------------------------------

IN_NAMESPACE = """
import errno, json, socket, subprocess, sys
sys.path.insert(0, sys.argv[1])
from servers import FakeOpenAIServer
sock = socket.socket()
sock.settimeout(5)
outside = sock.connect_ex(("192.0.2.1", 443))  # no route out of this namespace
server = FakeOpenAIServer()
config = json.loads(sys.argv[3])
for engine in (config["target"], config["judge"]):
    if "base_url" in engine:  # an API model: the scripted server on this namespace's loopback
        engine["base_url"] = server.base_url
with open(sys.argv[2], "w") as f:
    json.dump(config, f)
run = subprocess.run([sys.executable, "-m", "diagsafe_local.cli", "run", sys.argv[2], *sys.argv[4:]])
server.close()
print(json.dumps({"outside": outside, "unreachable": errno.ENETUNREACH, "run": run.returncode}))
"""


def _namespace_reason() -> str | None:
    """Why a network namespace cannot be made here (None: it can)."""
    missing = [tool for tool in ("unshare", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"no network namespace here (unshare -n needs root or user namespaces): {probe.stderr.strip()}"
    return None


NO_NAMESPACE = _namespace_reason()
NAMESPACE = pytest.mark.skipif(NO_NAMESPACE is not None, reason=str(NO_NAMESPACE))


def _run_in_namespace(tmp_path: Path, config: dict, *how: str) -> Manifest:
    """`run` (`--offline`, or `how`) on `config` inside a fresh network namespace with only loopback up (its API
    models served by a scripted server there); asserts that nothing outside is reachable and that the run
    succeeded."""
    script = tmp_path / "in_namespace.py"
    script.write_text(IN_NAMESPACE)
    inner = shlex.join([sys.executable, str(script), str(REPO / "tests"), str(tmp_path / "run.json"),
                        json.dumps(config), *(how or ["--offline"])])  # fmt: skip
    proc = subprocess.run(
        ["unshare", "-n", "sh", "-c", f"ip link set lo up && {inner}"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["outside"] == errno.ENETUNREACH == outcome["unreachable"]  # the namespace is closed
    assert outcome["run"] == 0, proc.stderr[-3000:]
    manifest = read_manifest_file(Path(config["output_dir"]))
    assert manifest.status == "complete" and manifest.network is not None and manifest.network.offline
    return manifest


@pytest.mark.slow
@NAMESPACE
def test_a_whole_offline_run_passes_in_a_network_namespace_where_nothing_else_is_reachable(tmp_path):
    manifest = _run_in_namespace(tmp_path, yaml.safe_load(_config(tmp_path, "http://placeholder:1/v1").read_text()))
    assert manifest.network is not None
    assert [url.startswith("http://127.0.0.1:") for url in manifest.network.endpoints] == [True]


@pytest.mark.slow
@pytest.mark.vllm
@NAMESPACE
def test_a_run_from_a_pack_on_the_vllm_engine_loads_and_judges_in_a_closed_network_namespace(tmp_path, tiny_models):
    """`pack` where the files are, then `run --pack` on real tiny models in a namespace where nothing but loopback
    is reachable: vLLM's engine processes read every file from the pack (the hubs' switches reach them too)."""
    config = yaml.safe_load(_config(tmp_path, "unused").read_text())
    target = shutil.copytree(tiny_models["target"], tmp_path / "target")  # as a hub snapshot: files no run loads
    extra = {"pytorch_model.bin": b"not weights: a run that loaded this would fail", "README.md": b"# card",
             ".gitattributes": b"*.bin filter=lfs"}  # fmt: skip
    for name, data in extra.items():
        (target / name).write_bytes(data)
    config["target"] = {**tiny_engine(target), "name": "tiny",
                        "sampling": {"temperature": 0.0, "max_tokens": 8, "seed": 0}}  # fmt: skip
    config["judge"] = {**tiny_engine(tiny_models["judge"]), "sampling": {"temperature": 0.0, "max_tokens": 200}}
    (tmp_path / "packed.yaml").write_text(yaml.safe_dump(config))
    pack = tmp_path / "pack"
    packed = CliRunner().invoke(app, ["pack", str(tmp_path / "packed.yaml"), "--out", str(pack)])
    assert packed.exit_code == 0, packed.output
    from diagsafe_local.core.pack import PackLock

    lock = PackLock.model_validate_json((pack / "pack.lock").read_text())
    assert not {Path(f.path).name for f in lock.files} & set(extra)
    assert all(name in packed.output for name in extra)  # said as left out
    manifest = _run_in_namespace(tmp_path, config, "--pack", str(pack))
    assert manifest.network is not None and manifest.network.endpoints == []
    assert manifest.network.pack == hashlib.sha256((pack / "pack.lock").read_bytes()).hexdigest()
    assert set(manifest.engines) == {"target:tiny", "judge"}
    assert all(Path(engine["model"]).is_relative_to(pack) for engine in manifest.engines.values()), manifest.engines
    config["output_dir"] = str(tmp_path / "refused")
    (tmp_path / "packed.yaml").write_text(yaml.safe_dump(config))
    other = shutil.copytree(tiny_models["judge"], tmp_path / "another-judge")  # a model the pack does not hold
    unpacked = ["--set", f"judge.model={other}"]
    result = CliRunner().invoke(app, ["run", str(tmp_path / "packed.yaml"), "--pack", str(pack), *unpacked])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output  # no traceback
    assert f"has no model '{other}'" in " ".join(result.output.split())
    weights = next(path for path in pack.rglob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 1]))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "packed.yaml"), "--pack", str(pack)])
    assert result.exit_code == 3 and f"{weights}: its bytes are not the ones packed" in " ".join(result.output.split())
    assert not (tmp_path / "refused").exists()  # both before the run directory, before any engine
