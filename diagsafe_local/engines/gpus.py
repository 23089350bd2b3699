"""This node's NVIDIA GPUs, read through NVML (the driver's own library, package `nvidia-ml-py`), which creates no
CUDA context in this process: vLLM's engines must be the first to create one (else vLLM switches to spawn, and
this process holds memory on every GPU). And whether torch can use them: a node whose GPUs torch cannot use (a
CUDA 13 torch on a driver older than 580, a CPU-only torch) stops a run at once, never taking the CPU's branches.
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from diagsafe_local.core.errors import RunFailed

_NVIDIA_DRIVER = (Path("/proc/driver/nvidia"), Path("/dev/nvidiactl"))
# CUDA_VISIBLE_DEVICES values that hide every GPU: a CPU run on a GPU node, on purpose.
_HIDDEN = {"", "-1", "none", "void", "nodevfiles"}
GIB = 1024**3
# The oldest driver CUDA 13 builds (torch 2.13, vLLM 0.32's default wheels) run on.
CUDA13_DRIVER = 580
# The vLLM release whose CUDA 12.9 build is the fix on older drivers where no vLLM is installed to name its own
# (scripts/setup.sh installs the same by default: DIAGSAFE_VLLM_VERSION).
VLLM_CUDA12_RELEASE = "0.32.0"
SETUP_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"  # present in a checkout only


class Gpu(BaseModel):
    """One GPU this process may use, as NVML reports it."""

    device: str  # as CUDA_VISIBLE_DEVICES names it: an index or a UUID
    name: str
    total: int
    free: int
    capability: tuple[int, int]


class NodeGpus(BaseModel):
    """The driver, the CUDA version it supports, and the GPUs this process may use."""

    driver: str
    cuda: str
    gpus: list[Gpu]

    @property
    def before_cuda13(self) -> bool:
        """Whether the driver is older than CUDA 13 builds need (they then need the CUDA 12 builds)."""
        return int(self.driver.split(".")[0]) < CUDA13_DRIVER

    def describe(self) -> str:
        names = sorted({g.name for g in self.gpus})
        return f"{len(self.gpus)} x {', '.join(names)} (driver {self.driver}, CUDA {self.cuda})"


def driver_present() -> bool:
    """Whether the NVIDIA kernel driver is loaded (the node has GPUs), told without importing torch."""
    return any(path.exists() for path in _NVIDIA_DRIVER)


def gpus_hidden() -> bool:
    """Whether CUDA_VISIBLE_DEVICES hides every GPU from this process."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.strip().lower() in _HIDDEN


def visible_devices(count: int) -> list[str]:
    """The device names this process's CUDA_VISIBLE_DEVICES gives (indices or UUIDs), else 0..count-1."""
    listed = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return listed[:count] if listed else [str(k) for k in range(count)]


def _nvml() -> ModuleType | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # not installed, or no NVML library (no driver): nothing to read
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_devices() -> tuple[ModuleType, list[tuple[str, Any]]] | None:
    """NVML and, for each GPU this process may use, its name in CUDA_VISIBLE_DEVICES and NVML handle: None without
    the driver, with every GPU hidden, or where NVML cannot be read."""
    if not driver_present() or gpus_hidden():
        return None
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        return nvml, [
            (d, nvml.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit() else nvml.nvmlDeviceGetHandleByUUID(d))
            for d in visible_devices(nvml.nvmlDeviceGetCount())
        ]
    except nvml.NVMLError:
        return None


def node_gpus() -> NodeGpus | None:
    """The GPUs this process may use, read now (free memory changes): None without the driver, with every GPU
    hidden, or where NVML cannot be read."""
    found = nvml_devices()
    if found is None:
        return None
    nvml, devices = found
    try:
        gpus = []
        for device, handle in devices:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = _text(nvml.nvmlDeviceGetName(handle))
            gpus.append(Gpu(device=device, name=name, total=memory.total, free=memory.free, capability=(major, minor)))
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError:
        return None
    return NodeGpus(driver=driver, cuda=f"{cuda // 1000}.{cuda % 1000 // 10}", gpus=gpus)


def cuda12_pip(vllm_version: str) -> list[str]:
    """The pip arguments that put vLLM's and torch's CUDA 12.9 builds over an install, in one resolve: vLLM's
    per-release cu129 index and PyTorch's cu129 index (torch with its nvidia-*-cu12 libraries). scripts/setup.sh
    runs the same on drivers older than CUDA13_DRIVER."""
    return [
        "install",
        "--upgrade",
        f"vllm=={vllm_version}+cu129",
        "torch",
        "torchvision",
        "torchaudio",
        "--extra-index-url",
        f"https://wheels.vllm.ai/{vllm_version}/cu129",
        "--extra-index-url",
        "https://download.pytorch.org/whl/cu129",
    ]


def _setup_command() -> str | None:
    """`bash scripts/setup.sh` into the virtualenv this process runs from (None outside a checkout)."""
    if not SETUP_SCRIPT.exists():
        return None
    into = "" if Path(sys.prefix).resolve() == SETUP_SCRIPT.parents[1] / ".venv" else f"DIAGSAFE_VENV={sys.prefix} "
    return f"{into}bash {SETUP_SCRIPT}"


def _cuda12_fix() -> str:
    """The commands that install the CUDA 12 builds into the environment this process runs from."""
    from diagsafe_local.engines.identity import package_versions

    installed = package_versions("vllm").get("vllm")
    release = installed.split("+")[0] if installed else VLLM_CUDA12_RELEASE
    pip = f"`{shlex.join([sys.executable, '-m', 'pip', *cuda12_pip(release)])}`"
    setup = _setup_command()
    return f"`{setup}` (it picks them on this driver), or {pip}" if setup else pip


def _unusable(torch: Any) -> str:
    gpus = node_gpus()
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    on_cpu = (
        "to run on the CPU on purpose (a CPU-only job on a GPU node), hide the GPUs: start the command with "
        "CUDA_VISIBLE_DEVICES=''"
    )
    if gpus is not None and not gpus.gpus:
        return (
            f"this node has the NVIDIA driver {gpus.driver} (CUDA {gpus.cuda}) but NVML shows this process no GPU (a "
            f"job given none?), and torch {torch.__version__} ({built}) finds none: ask for GPUs (srun --gpus=N), "
            f"or {on_cpu}"
        )
    found = gpus.describe() if gpus else "the NVIDIA driver (/dev/nvidiactl), but NVML could not be read"
    if gpus is not None and gpus.before_cuda13:
        fix = (
            f"this driver is older than {CUDA13_DRIVER}, which CUDA 13 builds need: install the CUDA 12 builds of "
            f"vLLM and torch (cu129) with {_cuda12_fix()}; or update the driver"
        )
    else:  # pip keeps a torch already installed that satisfies vLLM's pin, a CPU build included
        setup = f"`DIAGSAFE_VENV=NEW_FOLDER bash {SETUP_SCRIPT}` on this node, or " if _setup_command() else ""
        fix = f"install the GPU build into a new virtualenv ({setup}pip install 'diagsafe-local[gpu]' into it)"
    return f"this node has {found}, but torch {torch.__version__} ({built}) cannot use them; {fix}. Or, {on_cpu}"


@functools.cache
def cuda_available() -> bool:
    """Whether this process runs its models on CUDA GPUs: False without GPUs (or with every one hidden); on a node
    with GPUs that torch cannot use, `RunFailed` (exit 3) naming torch's CUDA build, the driver and the fix."""
    if not driver_present() or gpus_hidden():
        return False
    try:
        import torch
    except ImportError:  # no local engine can run here anyway; the API path needs no GPU
        return False
    if torch.cuda.is_available():
        return True
    raise RunFailed(_unusable(torch))


def wait_for_memory(share: float, devices: int, timeout: float = 60.0, interval: float = 1.0) -> None:
    """Wait until each of the first `devices` GPUs has `share` of its memory free, as vLLM's start-up check
    requires (an engine closed a moment ago may still be releasing its memory: its worker processes get 5 s to
    exit); `RunFailed` naming what is still held after `timeout` seconds. Without NVML there is nothing to wait
    on, and vLLM's own check decides."""
    waited = 0.0
    while True:
        gpus = node_gpus()
        if gpus is None:
            return
        short = [g for g in gpus.gpus[:devices] if g.free < share * g.total]
        if not short:
            return
        if waited >= timeout:
            held = "; ".join(
                f"GPU {g.device} has {g.free / GIB:.1f} of {g.total / GIB:.1f} GiB free, the engine needs "
                f"{share * g.total / GIB:.1f} ({share:.2f})"
                for g in short
            )
            raise RunFailed(
                f"GPU memory still held {timeout:.0f} s after the last engine closed: {held}. Another process holds "
                "it (nvidia-smi names it), or lower the engine's share (gpu_memory_utilization)"
            )
        time.sleep(interval)
        waited += interval
