"""Shared fixtures: paths, a CLI runner, and small benchmark files we write in each layout."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import typer.testing
from helpers import SharedVLLMFactory, current_rows, wide_rows, write_jsonl
from hypothesis import settings

# vLLM attaches its log handler to whatever sys.stdout is when it is first imported; inside a CliRunner call
# that stream is closed when the call returns, and vLLM's later log lines then break pytest's capture. Tests
# leave vLLM's logging to Python's defaults (a test that checks the engine logs sets it back on).
os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
# The progress interval in logs comes from the environment; tests that count progress lines set it themselves.
os.environ.pop("DIAGSAFE_PROGRESS_SECONDS", None)
# `validate` stores each validation by the judge's identity; the suite keeps those in a folder of its own, never in
# the user's cache, where a later run with `judge.validation: auto` would find them.
_JUDGE_CACHE = tempfile.mkdtemp(prefix="diagsafe-judge-cache-")
os.environ["DIAGSAFE_JUDGE_CACHE"] = _JUDGE_CACHE
# A test that fires the built-in hooks without choosing their stores writes W&B and MLflow's database here, not
# into the working directory (an MLflow sqlite store still puts artifacts in MLflow's default ./mlruns, which
# .gitignore names); tests that read a store set their own.
_STORES = tempfile.mkdtemp(prefix="diagsafe-hook-stores-")
# Set whatever the developer's environment holds: a test must never log to their real server or project.
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_STORES}/mlflow.db"
os.environ["WANDB_DIR"] = _STORES
os.environ["WANDB_MODE"] = "offline"
# A hook's first MLflow call creates and migrates a fresh sqlite store: on a loaded 2-core machine that passed the
# 30 s default, the hook's process was killed mid-migration, and the next call found a half-made database ("table
# already exists"). Tests of the time limit set their own.
os.environ.setdefault("DIAGSAFE_HOOK_TIMEOUT", "600")
# Property tests draw the same examples on every run: a failure in CI is a failure anyone can reproduce. No
# deadline: a property is about what the code returns, and a loaded machine (2 cores, several test runs) made a
# 200 ms deadline fail on examples that pass in milliseconds alone.
settings.register_profile("diagsafe", derandomize=True, print_blob=True, deadline=None)
settings.load_profile("diagsafe")
# typer builds an app's click command on every CliRunner call (~40 ms for the whole CLI: it reads every command's
# signature); tests invoke the CLI tens of thousands of times (the gate fuzzer alone ~33,000), so each app's
# command is built once, as a process that runs one command builds it once.
typer.testing._get_command = functools.cache(typer.testing._get_command)


def pytest_unconfigure(config) -> None:
    """The session's own folders above go with it: one pytest process left two in /tmp, and they piled up."""
    for folder in (_JUDGE_CACHE, _STORES):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def current_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "bench.jsonl", current_rows())


@pytest.fixture
def wide_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "bench_v1.jsonl", wide_rows())


# -- the real vLLM engine, shared across tests (each start costs ~45 s on this machine; helpers.SharedVLLMFactory)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Tiny random-weight target and judge chat models, and a LoRA adapter for the target."""
    from diagsafe_local.selftest.tiny_models import build_tiny_chat_model, build_tiny_lora

    root = tmp_path_factory.mktemp("models")
    target = build_tiny_chat_model(root / "target", seed=1)
    return {
        "target": target,
        "judge": build_tiny_chat_model(root / "judge", seed=2),
        "lora": build_tiny_lora(target, root / "lora", seed=3),
    }


_FACTORY: SharedVLLMFactory | None = None


@pytest.fixture(scope="session")
def vllm_engines():
    global _FACTORY
    _FACTORY = SharedVLLMFactory()
    yield _FACTORY
    _FACTORY.close()
    _FACTORY = None


# Session-scoped model fixtures whose tests run together (pytest_collection_modifyitems).
_GROUPED_MODELS = ("real_model",)


def pytest_collection_modifyitems(config, items) -> None:
    """Order the tests so that each engine of the shared factory (helpers.SharedVLLMFactory: 4 kept, the least
    recently used idle one evicted at a load) is loaded once. A stable sort, so tests keep their order inside
    each group:

    1. every other test, first: those of the tiny target and judge (and their adapters), which many modules share;
    2. then the tests that use a model fixture of `_GROUPED_MODELS` (the real model, ~45-100 s a load), together,
       whichever module they are in: spread over the run, the tiny models' engines evicted it between them and it
       was loaded three times (test_cascade, test_real_model, test_robustness);
    3. last, tests marked `own_engines` (they load models no other test uses), in their order: before, the 2026 and
       the reasoning guards' engines evicted the shared target, judge and real-model engines in the middle of the
       run, and the modules after them loaded those again (DIAGSAFE_TEST_ENGINE_LOG)."""

    def group(item: pytest.Item) -> int:
        if item.get_closest_marker("own_engines") is not None:
            return 2
        return int(any(name in _GROUPED_MODELS for name in getattr(item, "fixturenames", ())))

    items.sort(key=group)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Before a test's fixtures are set up: the engines it borrows from now on are the ones it may be using."""
    if _FACTORY is not None:
        _FACTORY.drop_dead()  # one that died after the last test's teardown: this test loads it again
        _FACTORY.new_test(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    """A shared engine that died during a test fails that test, by name, and is loaded again by the next test that
    needs it: one test that killed the engine cores (a child-process cleanup that took every child of the test's
    process) made four later tests fail with EngineDeadError instead. Where the test's own teardown failed, that
    failure is the one reported; the dead engine still goes."""
    try:
        result = yield
    except BaseException:
        if _FACTORY is not None:
            _FACTORY.drop_dead()
        raise
    if _FACTORY is not None and (dead := _FACTORY.drop_dead()):
        pytest.fail(f"a shared engine died during this test: {'; '.join(dead)}", pytrace=False)
    return result
