"""The GPU node's risky branches (issue 44, items 5, 7, 8), proven on CPU with fakes modelled on the documented
parts: NVML (tests/fakes.py's FakeNvml) for free memory, torch.cuda for the classifier's cache; SLURM's requests
as the sbatch arguments `submit` and `watch` build."""

from __future__ import annotations

import shlex
import subprocess
import weakref
from pathlib import Path

import pytest
import torch
import yaml
from fakes import ScriptedEngine, fake_gpu
from slurm_cluster import LocalSlurm
from test_gpu_node import gpu_node  # noqa: F401  (the fixture)
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.errors import RunFailed
from diagsafe_local.core.resources import slurm_file
from diagsafe_local.engines import gpus, host
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpu_plan import GIB

# -- item 5: waking a parked judge waits for the closed target's memory, as opening an engine does ----------------


class Memory:
    """What two TP-2 engines hold on each of two 80 GiB GPUs, as NVML reads it: a closed engine's workers give its
    memory back only after `exiting` more reads (vLLM gives them 5 s to exit); every read is logged."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.held = {"judge": 0.0, "target": 0.0}
        self.exiting = 0

    def free(self) -> int:
        if self.exiting:
            self.exiting -= 1
            if not self.exiting:
                self.held["target"] = 0.0
        free = 80 - sum(self.held.values())
        self.events.append(f"read {free:.0f}")
        return int(free * GIB)


class Recording(ScriptedEngine):
    """An engine that logs its sleep, wake and close, and holds GPU memory as vLLM's does (sleep level 1 keeps the
    CUDA context and graphs: 1.5 GiB)."""

    def __init__(self, name: str, memory: Memory) -> None:
        super().__init__()
        self.name, self.memory = name, memory
        memory.held[name] = 64.0

    def sleep(self) -> bool:
        self.memory.events.append(f"sleep {self.name}")
        self.memory.held[self.name] = 1.5
        return True

    def wake_up(self) -> None:
        self.memory.events.append(f"wake {self.name}")
        self.memory.held[self.name] = 64.0

    def close(self) -> None:
        self.memory.events.append(f"close {self.name}")
        self.memory.exiting = 3


def _sleeping_node(gpu_node, monkeypatch) -> tuple[host.Host, Memory]:  # noqa: F811
    events: list[str] = []
    memory = Memory(events)
    gpu_node(fake_gpu(0, free_gib=memory.free), fake_gpu(1, free_gib=memory.free))
    monkeypatch.setattr(host, "cuda_available", lambda: True)
    monkeypatch.setattr(gpus.time, "sleep", lambda seconds: None)
    placed = host.Host("sleep", 0.8, 0.8, lambda config, **options: Recording(config.model, memory))
    return placed, memory


def test_waking_the_judge_waits_for_the_closed_targets_memory(gpu_node, monkeypatch):  # noqa: F811
    placed, memory = _sleeping_node(gpu_node, monkeypatch)
    judge = placed.open_judge(EngineConfig(model="judge", tensor_parallel_size=2), "xgrammar")
    placed.park(judge)  # what the pipeline does around each target (pipeline.py `_execute`)
    target = placed.open_target("target:t", EngineConfig(model="target", tensor_parallel_size=2))
    target.close()
    del memory.events[:]
    placed.unpark(judge)
    # the target's workers still hold 64 GiB for two reads of each GPU: the judge (0.8 of 80 GiB) wakes only once
    # both GPUs show 64 GiB free again
    assert memory.events[-1] == "wake judge", memory.events
    reads = memory.events[:-1]
    assert reads[:2] == ["read 14", "read 14"] and reads[-2:] == ["read 78", "read 78"], reads


def test_a_judge_whose_memory_never_comes_back_is_not_woken_and_the_error_names_it(gpu_node, monkeypatch):  # noqa: F811
    placed, memory = _sleeping_node(gpu_node, monkeypatch)
    monkeypatch.setattr(host, "MEMORY_WAIT_SECONDS", 3)
    judge = placed.open_judge(EngineConfig(model="judge", tensor_parallel_size=2), "xgrammar")
    placed.park(judge)
    placed.open_target("target:t", EngineConfig(model="target", tensor_parallel_size=2))  # never closed
    with pytest.raises(RunFailed, match=r"GPU 0 has 14.5 of 80.0 GiB free, the engine needs 64.0 \(0.80\)"):
        placed.unpark(judge)
    assert "wake judge" not in memory.events


# -- item 8: the classifier (torch in this process) gives its CUDA memory back on close ----------------------------


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    from diagsafe_local.selftest.tiny_models import build_tiny_classifier

    return build_tiny_classifier(tmp_path_factory.mktemp("classifier") / "roberta", seed=4)


class FakeCudaCache:
    """torch.cuda's caching allocator as documented: a dropped tensor's blocks stay reserved by this process (NVML
    counts them used) until `empty_cache()`, which frees only the blocks no live tensor holds. cuBLAS's workspaces
    (32 MiB here) are such blocks until `torch._C._cuda_clearCublasWorkspaces()` drops them (torch's own leak check
    clears them before emptying the cache: torch/testing/_internal/common_utils.py, CudaMemoryLeakCheck). The CUDA
    context (0.5 GiB) stays until the process ends."""

    WORKSPACES = 32 / 1024

    def __init__(self) -> None:
        self.model: weakref.ref | None = None
        self.blocks = 0.0  # the model's
        self.workspaces = 0.0
        self.workspaces_held = False
        self.emptied: list[bool] = []  # at each empty_cache: whether the model was already gone

    def to(self, module: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
        if args and args[0] == "cuda":
            self.model, self.blocks = weakref.ref(module), 3.0
            self.workspaces, self.workspaces_held = self.WORKSPACES, True
        return module

    def clear_workspaces(self) -> None:
        self.workspaces_held = False

    def empty_cache(self) -> None:
        gone = self.model is not None and self.model() is None
        self.emptied.append(gone)
        if gone:
            self.blocks = 0.0
        if not self.workspaces_held:
            self.workspaces = 0.0

    @property
    def reserved(self) -> float:
        """GiB reserved by torch's allocator in this process."""
        return self.blocks + self.workspaces

    def free(self) -> int:
        return int((24 - 0.5 - self.reserved) * GIB)


def test_closing_the_classifier_drops_its_model_and_cublas_workspaces_then_empties_the_cuda_cache(
    gpu_node,  # noqa: F811
    monkeypatch,
    tiny_classifier,
):
    from diagsafe_local.engines.classifier_engine import ClassifierEngine

    cache = FakeCudaCache()
    gpu_node(fake_gpu(0, total_gib=24, free_gib=cache.free))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", cache.empty_cache)
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", cache.clear_workspaces, raising=False)  # CUDA builds
    monkeypatch.setattr(torch.nn.Module, "to", lambda module, *args, **kwargs: cache.to(module, *args, **kwargs))
    monkeypatch.setattr(gpus.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(host, "MEMORY_WAIT_SECONDS", 3)

    placed = host.Host("sequential", 0.45, 0.45, lambda config, **options: ClassifierEngine(config))
    classifier = placed.open_judge(EngineConfig(kind="classifier", model=str(tiny_classifier)), "xgrammar")
    assert cache.model is not None and cache.model() is not None  # on the GPU, in this process
    classifier.close()
    assert cache.emptied == [True]  # the model was released before the cache was emptied
    assert cache.reserved == 0  # cuBLAS's workspaces too: cleared before the cache was emptied
    # a vLLM juror opened next (vLLM's 0.92 of 24 GiB: 22.1 GiB) finds the classifier's memory free
    opened = []
    host.Host("sequential", 0.45, 0.45, lambda config, **options: opened.append(config) or ScriptedEngine()).open_juror(
        "j", EngineConfig(model="j"), "xgrammar"
    )
    assert opened


def test_closing_the_classifier_on_the_cpu_drops_its_model_and_leaves_cuda_alone(monkeypatch, tiny_classifier):
    from diagsafe_local.engines.classifier_engine import ClassifierEngine

    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    classifier = ClassifierEngine(EngineConfig(kind="classifier", model=str(tiny_classifier)))
    model = weakref.ref(classifier._model)
    classifier.close()
    assert model() is None and emptied == []
    classifier.close()  # a second close is harmless


def test_the_host_waits_for_memory_before_opening_a_classifier_on_cuda(gpu_node, monkeypatch):  # noqa: F811
    reads = iter([10, 20, 79])  # GiB free as the last vLLM engine's workers exit
    gpu_node(fake_gpu(0, free_gib=lambda: int(next(reads) * GIB)))
    monkeypatch.setattr(host, "cuda_available", lambda: True)
    monkeypatch.setattr(gpus.time, "sleep", lambda seconds: None)
    opened = []
    placed = host.Host("sequential", 0.45, 0.45, lambda config, **options: opened.append(config) or ScriptedEngine())
    placed.open_judge(EngineConfig(kind="classifier", model="c"), "xgrammar")
    assert opened and next(reads, None) is None  # it opened on the read that found 79 GiB free


def test_the_host_waits_for_no_memory_before_opening_an_engine_that_loads_on_the_cpu(gpu_node, monkeypatch):  # noqa: F811
    """The transformers engine loads its model on the CPU (transformers_engine.py): a full GPU is no reason to wait
    for it; an engine kind that says it allocates on CUDA (a plugin's, by default) still waits."""
    from diagsafe_local.engines.kinds import ENGINES, Capabilities, EngineKind

    gpu_node(fake_gpu(0, free_gib=1))  # another job holds the GPU
    monkeypatch.setattr(host, "cuda_available", lambda: True)
    monkeypatch.setattr(gpus.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(host, "MEMORY_WAIT_SECONDS", 0)
    monkeypatch.setitem(
        ENGINES._entries, "acme-gpu", EngineKind("acme-gpu", "a plugin's", ScriptedEngine, Capabilities())
    )
    opened = []
    placed = host.Host("sequential", 0.45, 0.45, lambda config, **options: opened.append(config) or ScriptedEngine())
    placed.open_judge(EngineConfig(kind="transformers", model="t"), "xgrammar")
    assert [config.kind for config in opened] == ["transformers"]
    with pytest.raises(RunFailed):
        placed.open_judge(EngineConfig(kind="acme-gpu", model="p"), "xgrammar")


# -- item 7: how SLURM jobs ask for GPUs: --gpus=N, --gres=gpu:N, or nothing for a job that needs none -----------


def _config(tmp_path, name: str, judge: dict) -> str:
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "a", "prompt": "q"}\n')
    served = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}
    config = tmp_path / f"{name}.yaml"
    config.write_text(
        yaml.safe_dump(
            {"dataset": {"path": str(items)}, "target": {"model": "t", **served},
             "judge": {"model": "j", **served} if judge == {} else judge, "output_dir": str(tmp_path / name)}
        )
    )  # fmt: skip
    return str(config)


def _sbatch_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("sbatch ")]


@pytest.mark.parametrize(
    ("args", "env", "asked"),
    [
        ([], None, "--gpus=2"),
        (["--gpu-request", "gres"], None, "--gres=gpu:2"),
        ([], "gres", "--gres=gpu:2"),
        (["--gpu-request", "gpus"], "gres", "--gpus=2"),  # the option overrides the site's setting
    ],
)
def test_submit_asks_for_gpus_in_the_form_the_site_takes(tmp_path, monkeypatch, args, env, asked):
    if env:
        monkeypatch.setenv("DIAGSAFE_SLURM_GPU_REQUEST", env)
    else:
        monkeypatch.delenv("DIAGSAFE_SLURM_GPU_REQUEST", raising=False)
    config = _config(tmp_path, "local", {"model": "Qwen2.5-7B-Instruct"})
    dry = CliRunner().invoke(app, ["submit", config, "--shards", "2", "--gpus-per-task", "2", *args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    array, merge = _sbatch_lines(dry.output)
    assert asked in array.split() and "--nodes=1" in array.split()
    assert sum(a.startswith(("--gpus", "--gres")) for a in array.split()) == 1  # one request, in one form
    assert "--gpus" not in merge and "--gres" not in merge
    # the array script's own #SBATCH lines ask for no GPU either: the command line's request is the only one
    assert "#SBATCH --gpus" not in dry.output and "#SBATCH --gres" not in dry.output


@pytest.mark.parametrize("form", ["gpus", "gres"])
def test_an_api_only_job_asks_slurm_for_no_gpu_at_all(tmp_path, form):
    config = _config(tmp_path, "api", {})
    dry = CliRunner().invoke(app, ["submit", config, "--shards", "2", "--gpu-request", form, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    asked = _sbatch_lines(dry.output) + [line for line in dry.output.splitlines() if line.startswith("#SBATCH")]
    assert len(asked) > 2 and not [line for line in asked if "--gpus" in line or "--gres" in line]


def test_an_unknown_gpu_request_is_one_line_naming_where_it_came_from(tmp_path, monkeypatch):
    config = _config(tmp_path, "api", {})
    monkeypatch.setenv("DIAGSAFE_SLURM_GPU_REQUEST", "gpus-per-node")
    result = CliRunner().invoke(app, ["submit", config, "--dry-run"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "DIAGSAFE_SLURM_GPU_REQUEST: expected gpus or gres, got 'gpus-per-node'" in result.output


@pytest.mark.parametrize(("form", "gpus", "asked"), [("gres", 1, ["--gres=gpu:1"]), ("gpus", 0, [])])
def test_watch_submits_checkpoints_with_the_same_gpu_request(tmp_path, monkeypatch, form, gpus, asked):
    from diagsafe_local.evaluation import watch
    from diagsafe_local.evaluation.slurm import Resources
    from diagsafe_local.runs.series_state import CheckpointEntry

    sent: list[list[str]] = []
    monkeypatch.setattr(watch, "sbatch", lambda args: sent.append(args) or "7")
    monkeypatch.setattr(watch, "set_status", lambda *args, **kwargs: None)
    spec = watch.SeriesSpec(tmp_path / "series", tmp_path / "train", Path(_config(tmp_path, "api", {})))
    entry = CheckpointEntry(
        name="checkpoint-5", step=5, path=str(tmp_path / "train" / "checkpoint-5"), status="seen",
        run_dir=str(tmp_path / "series" / "runs" / "checkpoint-5"), seen="now", updated="now",
    )  # fmt: skip
    watch.submit(spec, [entry], Resources(gpus_per_task=gpus, gpu_request=form))
    (args,) = sent
    assert [a for a in args if a.startswith(("--gpus", "--gres"))] == asked


class GpuSlurm(LocalSlurm):
    """The suite's one-node SLURM with two GPUs as SLURM knows them: generic resources of type gpu on two device
    files (SLURM only counts them and sets CUDA_VISIBLE_DEVICES; nothing uses a GPU)."""

    def _node_line(self) -> tuple[str, str]:
        name, line = super()._node_line()
        (self.root / "gres.conf").write_text("AutoDetect=off\nName=gpu File=/dev/null\nName=gpu File=/dev/zero\n")
        return name, f"GresTypes=gpu\n{line} Gres=gpu:2"


@pytest.mark.slow
def test_a_cluster_with_gpus_gives_the_jobs_submit_builds_their_gpus_in_either_form(tmp_path):
    """The array job's request as `submit` builds it (its script swapped for one that prints the GPUs it was
    given), on a real SLURM with two GPUs: both forms get both GPUs, an API-only job none."""
    local, api = _config(tmp_path, "local", {"model": "Qwen2.5-7B-Instruct"}), _config(tmp_path, "api", {})
    cluster = GpuSlurm(tmp_path / "slurm").start()  # raises, never skips, if SLURM cannot start
    try:
        jobs = {}
        two = ["--gpus-per-task", "2"]
        for name, config, form, gpus in (
            ("gres", local, "gres", two),
            ("gpus", local, "gpus", two),
            ("api", api, "gres", []),
        ):
            dry = CliRunner().invoke(
                app, ["submit", config, "--shards", "2", *gpus, "--gpu-request", form, "--dry-run"]
            )
            assert dry.exit_code == 0, dry.output
            args = shlex.split(_sbatch_lines(dry.output)[0])[1:]
            asked = [a for a in args[: args.index(str(slurm_file("array.sbatch")))] if not a.startswith("--output")]
            out = tmp_path / f"{name}-%a.out"
            wrap = 'echo "${CUDA_VISIBLE_DEVICES:-none}"'
            sent = subprocess.run(
                ["sbatch", "--parsable", *asked, "--cpus-per-task=1", "--mem=1G", f"--output={out}", "--wrap", wrap],
                capture_output=True, text=True, env=cluster.env, cwd=tmp_path,
            )  # fmt: skip
            assert sent.returncode == 0, sent.stderr
            jobs[name] = sent.stdout.strip()
        cluster.wait(list(jobs.values()), timeout=120)
        given = {name: (tmp_path / f"{name}-0.out").read_text().strip() for name in jobs}
        assert given == {"gres": "0,1", "gpus": "0,1", "api": "none"}
    finally:
        cluster.stop()
