"""The suite's own environment: a developer's tracking settings never reach a test (a hook a test fires would
log to their real MLflow server or W&B project)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_the_suite_replaces_a_developers_tracking_environment(tmp_path):
    mine = {
        "MLFLOW_TRACKING_URI": "http://tracking.example:5000",
        "WANDB_MODE": "online",
        "WANDB_DIR": "/home/someone/wandb",
    }
    shown = subprocess.run(  # conftest as pytest imports it, in a process holding the developer's settings
        [
            sys.executable,
            "-c",
            f"import conftest, json, os; print(json.dumps({{k: os.environ[k] for k in {list(mine)}}}))",
        ],
        cwd=Path(__file__).parent,
        env={**os.environ, **mine, "TMPDIR": str(tmp_path)},  # the suite's stores made under tmp_path
        capture_output=True,
        text=True,
        check=True,
    )
    suite = json.loads(shown.stdout.splitlines()[-1])
    assert suite["MLFLOW_TRACKING_URI"].startswith(f"sqlite:///{tmp_path}/"), suite
    assert suite["WANDB_MODE"] == "offline" and suite["WANDB_DIR"].startswith(str(tmp_path)), suite
