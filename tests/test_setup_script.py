"""scripts/setup.sh's decisions, run for real in its dry-run mode (DIAGSAFE_SETUP_DRY_RUN=1: each command that
would change the machine is printed, none runs) with a fake `nvidia-smi` on PATH and a fake
/proc/driver/nvidia/version: which vLLM and torch build for which driver, the exact pip commands, the check that
ends a GPU install, what it says when nvidia-smi fails; and that the command a refused run names is the one
setup.sh runs. This machine cannot reach the CUDA wheel indexes: only the dry run is tested here."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from fakes import fake_gpu
from test_gpu_node import gpu_node  # noqa: F401  (the fixture)

from diagsafe_local.core.errors import RunFailed
from diagsafe_local.engines import gpus
from diagsafe_local.engines.vllm_engine import check_vllm_version

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "scripts" / "setup.sh"
OPEN_MODULE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  (dvs-builder@U16-I3-B03-4-3)"
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Sun May 12 19:39:15 UTC 2024"
SMI_FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
    "NVIDIA driver is installed and running."
)


class Setup(NamedTuple):
    code: int
    out: str
    commands: list[list[str]]


def dry_run(tmp_path: Path, smi: str | None = None, proc: str | None = None, **env: str) -> Setup:
    """setup.sh in its dry run. `smi`: what the fake nvidia-smi prints for the driver (None: no nvidia-smi;
    "fail": it fails as it does without a loaded driver); `proc`: the kernel module's version file."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for guard in ("python-guard", "apt-get"):  # a dry run that ran python or apt-get fails loudly
        (fake / guard).write_text(f"#!/bin/sh\necho 'the dry run ran {guard}' >&2\nexit 97\n")
    smi_path = fake / "nvidia-smi"
    smi_path.unlink(missing_ok=True)
    if smi == "fail":
        smi_path.write_text(f'#!/bin/sh\necho "{SMI_FAILED}"\nexit 9\n')
    elif smi is not None:  # one line per GPU, as `--query-gpu=driver_version --format=csv,noheader` prints
        smi_path.write_text(
            '#!/bin/sh\n[ "$1 $2" = "--query-gpu=driver_version --format=csv,noheader" ] || exit 2\n'
            f"echo {smi}\necho {smi}\n"
        )
    for path in fake.iterdir():
        path.chmod(0o755)
    version_file = tmp_path / "nvidia-version"
    version_file.unlink(missing_ok=True)
    if proc is not None:
        version_file.write_text(proc + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("DIAGSAFE_", "PIP_"))}
    environment = {
        **keep,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "PYTHON": str(fake / "python-guard"),
        "DIAGSAFE_SETUP_DRY_RUN": "1",
        "DIAGSAFE_VENV": str(tmp_path / "venv"),
        "DIAGSAFE_NVIDIA_VERSION_FILE": str(version_file),
        "DIAGSAFE_WITH_SLURM": "0",
        "DIAGSAFE_WITH_BROWSER": "0",
        **({} if smi is not None else {"DIAGSAFE_NVIDIA_SMI": str(fake / "no-nvidia-smi")}),
        **env,
    }
    done = subprocess.run(
        ["bash", str(SETUP)], env=environment, capture_output=True, text=True, timeout=120, check=False
    )
    out = done.stdout + done.stderr
    commands = [shlex.split(line.partition(": would run: ")[2]) for line in out.splitlines() if ": would run: " in line]
    assert not (tmp_path / "venv").exists(), "the dry run created the virtualenv"
    return Setup(done.returncode, out, commands)


def installs(setup: Setup) -> list[list[str]]:
    """The pip installs of the package (not pip's own upgrade)."""
    return [c for c in setup.commands if c[1:4] == ["-m", "pip", "install"] and "pip" not in c[4:]]


def test_an_old_driver_gets_vllm_and_torch_for_cuda_12_9_in_one_resolve_then_a_check(tmp_path):
    setup = dry_run(tmp_path, smi="535.104.05")
    assert setup.code == 0, setup.out
    assert "NVIDIA driver 535.104.05 (nvidia-smi)" in setup.out and "CUDA 12.9 (cu129)" in setup.out
    python = str(tmp_path / "venv" / "bin" / "python")
    (install,) = installs(setup)
    version = install[8].removeprefix("vllm==").removesuffix("+cu129")
    check_vllm_version(version)  # the release setup.sh installs is in the range the package is tested with
    extras = install[7]
    assert re.fullmatch(r"\.\[gpu(,\w+)*\]", extras), extras
    assert install == [
        python, "-m", "pip", "install", "-q", "--upgrade", "-e", extras, f"vllm=={version}+cu129",
        "torch", "torchvision", "torchaudio",
        "--extra-index-url", f"https://wheels.vllm.ai/{version}/cu129",
        "--extra-index-url", "https://download.pytorch.org/whl/cu129",
    ]  # fmt: skip
    flat = " ".join(" ".join(c) for c in setup.commands)
    assert "--no-deps" not in flat and "--force-reinstall" not in flat and "github.com" not in flat
    # it ends by proving the result works: torch uses the GPUs, vLLM imports
    assert setup.commands[-1][:2] == [python, "-c"]
    assert "torch.cuda.is_available()" in setup.commands[-1][2] and "import vllm" in setup.commands[-1][2]
    assert setup.commands.index(install) < len(setup.commands) - 1
    # mirrors replace the indexes (a node that cannot reach them)
    mirrored = dry_run(
        tmp_path, smi="535.104.05", DIAGSAFE_VLLM_INDEX="https://m/vllm", DIAGSAFE_TORCH_INDEX="https://m/torch"
    )
    assert installs(mirrored)[0][-4:] == ["--extra-index-url", "https://m/vllm", "--extra-index-url", "https://m/torch"]


def test_the_driver_that_cuda_13_builds_need_decides_the_build_and_a_user_may_choose(tmp_path):
    below, at = f"{gpus.CUDA13_DRIVER - 1}.99.01", f"{gpus.CUDA13_DRIVER}.65.06"
    assert "vllm==" in " ".join(installs(dry_run(tmp_path, smi=below))[0])
    current = dry_run(tmp_path, smi=at)
    assert current.code == 0 and "CUDA 13 (cu130)" in current.out, current.out
    (install,) = installs(current)
    assert install[4:] == ["-q", "-e", install[6]] and install[6].startswith(".[gpu,")  # PyPI's default build
    assert "torch.cuda.is_available()" in current.commands[-1][2]
    chosen = dry_run(tmp_path, smi="535.104.05", DIAGSAFE_CUDA="cu130")
    assert installs(chosen)[0][4:] == install[4:]
    wrong = dry_run(tmp_path, smi="535.104.05", DIAGSAFE_CUDA="cu118")
    assert wrong.code == 2 and "DIAGSAFE_CUDA=cu118" in wrong.out and "cu129 or cu130" in wrong.out
    assert not wrong.commands


def test_a_failing_nvidia_smi_is_said_and_the_driver_read_from_the_kernel_module(tmp_path):
    setup = dry_run(tmp_path, smi="fail", proc=OPEN_MODULE.format("535.183.01"))
    assert setup.code == 0, setup.out
    assert "nvidia-smi failed (exit 9: NVIDIA-SMI has failed" in setup.out
    assert f"NVIDIA driver 535.183.01 ({tmp_path / 'nvidia-version'})" in setup.out
    assert "vllm==" in " ".join(installs(setup)[0]) and "cu129" in " ".join(installs(setup)[0])
    # no nvidia-smi at all: the file alone (the proprietary module's wording)
    alone = dry_run(tmp_path, proc=PROPRIETARY.format("590.48.01"))
    assert alone.code == 0 and "nvidia-smi not found" in alone.out and "CUDA 13 (cu130)" in alone.out, alone.out
    # nvidia-smi failing and no driver file: said, and nothing is installed
    lost = dry_run(tmp_path, smi="fail")
    assert lost.code == 2 and "nvidia-smi failed (exit 9" in lost.out and "DIAGSAFE_ENGINE=cpu" in lost.out
    assert "Traceback" not in lost.out and not installs(lost)
    # chosen by hand, it installs what was asked
    assert installs(dry_run(tmp_path, smi="fail", DIAGSAFE_ENGINE="cpu"))[0][6].startswith(".[cpu,")


def test_a_machine_without_the_nvidia_driver_gets_the_cpu_build(tmp_path):
    setup = dry_run(tmp_path)
    assert setup.code == 0, setup.out
    python = str(tmp_path / "venv" / "bin" / "python")
    assert setup.commands[0][1:] == ["-m", "venv", str(tmp_path / "venv")]
    (install,) = installs(setup)
    assert install == [python, "-m", "pip", "install", "-q", "-e", install[6]] and install[6].startswith(".[cpu,")
    assert setup.commands[-1] == [
        python,
        "-m",
        "pip",
        "uninstall",
        "-q",
        "-y",
        "torchvision",
        "torchaudio",
        "torchcodec",
    ]
    assert "torch.cuda" not in setup.out


def _quoted_pip(message: str) -> list[str]:
    (command,) = [c for c in re.findall(r"`([^`]+)`", message) if " pip install" in c]
    return shlex.split(command)


def test_the_refusal_on_an_old_driver_names_the_commands_setup_runs_there(gpu_node, tmp_path, monkeypatch):  # noqa: F811
    gpu_node(fake_gpu(0), driver="535.104.05")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CUDA 13 torch on this driver
    with pytest.raises(RunFailed) as raised:
        gpus.cuda_available()
    message = str(raised.value)
    assert f"`bash {SETUP}`" in message  # this package's checkout, into the virtualenv this runs from
    pip = _quoted_pip(message)
    assert pip[:4] == [sys.executable, "-m", "pip", "install"]
    version = pip[5].removeprefix("vllm==").removesuffix("+cu129")
    (install,) = installs(dry_run(tmp_path, smi="535.104.05", DIAGSAFE_VLLM_VERSION=version))
    assert pip[4:] == [install[5], *install[8:]]  # setup.sh's own install, less the package itself
    # from another virtualenv, setup.sh is told to install into that one
    gpus.cuda_available.cache_clear()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other-venv"))
    with pytest.raises(RunFailed, match=re.escape(f"`DIAGSAFE_VENV={tmp_path / 'other-venv'} bash {SETUP}`")):
        gpus.cuda_available()


def test_when_pip_finds_no_cuda_12_9_build_setup_names_the_mirrors_glibc_and_the_driver(tmp_path):
    """pip failing on the cu129 resolve (run for real against a virtualenv whose python fails that one install):
    exit 3, and the reasons a node gets no wheel: the indexes unreachable (mirrors), a glibc older than the wheels'
    manylinux_2_28, a driver older than CUDA 12's 525 (NVIDIA's minor version compatibility)."""
    venv = tmp_path / "fake-venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text('#!/bin/sh\ncase "$*" in *vllm==*) echo "ERROR: No matching distribution" >&2; exit 1;; esac\n')
    python.chmod(0o755)
    setup = dry_run(tmp_path, smi="535.104.05", DIAGSAFE_SETUP_DRY_RUN="0", DIAGSAFE_VENV=str(venv))
    assert setup.code == 3, setup.out
    assert "DIAGSAFE_VLLM_INDEX and DIAGSAFE_TORCH_INDEX to mirrors" in setup.out
    assert "glibc 2.28 or later" in setup.out and "manylinux_2_28" in setup.out
    assert "driver 525 or later" in setup.out
    assert not (venv / ".diagsafe-installed").exists()
