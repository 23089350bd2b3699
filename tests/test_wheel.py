"""The wheel carries what the commands need: installed outside this checkout, the CLI finds its bundled
sample, prompts and sbatch templates as package resources."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow


def test_the_wheel_works_outside_the_checkout(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next(dist.glob("diagsafe_local-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # The dependencies come from this test's environment (no second install of vLLM); the package itself
    # only from the wheel: a path added by a .pth file does not run that directory's own .pth files.
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "deps.pth").write_text(site.getsitepackages()[0] + "\n")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(python), "-m", "diagsafe_local.cli", *args],
            cwd=work,
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )

    where = subprocess.run(
        [str(python), "-c", "import diagsafe_local; print(diagsafe_local.__file__)"],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
    )
    assert where.stdout.startswith(str(env_dir)), where.stdout + where.stderr
    assert cli("demo", "--help").returncode == 0
    demo = cli("demo", "--no-selftest", "--out", str(work / "out"))
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert (work / "out" / "bench" / "leaderboard.csv").is_file() and "site-packages" in demo.stdout
    items = work / "items.jsonl"
    items.write_text('{"id": "a", "prompt": "hi"}\n')
    config = work / "run.yaml"
    config.write_text(
        f"dataset: {{path: {items}}}\ntarget: {{model: m}}\njudge: {{model: j}}\noutput_dir: {work / 'r'}\n"
    )
    dry = cli("submit", str(config), "--shards", "2", "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "bundled/slurm/array.sbatch" in dry.stdout and "#SBATCH" in dry.stdout
