"""Shared fixtures: paths, a CLI runner, and small benchmark files we write in each layout."""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import typer.testing
from helpers import current_rows, wide_rows, write_jsonl
from hypothesis import settings

from diagsafe_local.engines.base import BorrowedEngine

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
os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{_STORES}/mlflow.db")
os.environ.setdefault("WANDB_DIR", _STORES)
os.environ.setdefault("WANDB_MODE", "offline")
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


# -- the real vLLM engine, shared across tests (each start costs ~45 s on this machine) --------------


class SharedVLLMFactory:
    """An engine factory that loads each (model, adapter) once and keeps it for later tests, with the judge's
    structured-output backend (requests without a schema are unaffected by it).

    Kept engines are bounded: each holds ~2-3 GB (weights, torch, a 1 GiB KV cache), and a whole-suite run that kept
    all ten it loads was OOM-killed on this 24 GB machine (the kernel killed vLLM workers mid-test; every later call
    on them was EngineDeadError). Before a load, the least recently used engines that the current test has not
    borrowed are shut down while more than DIAGSAFE_TEST_ENGINES (default 4) would be kept, or while less than
    DIAGSAFE_TEST_FREE_GB (default 6) of memory is available. With DIAGSAFE_TEST_ENGINE_LOG naming a file, each
    load and eviction appends a line to it: `load MODEL TEST` or `evict MODEL TEST` (the test that caused it).
    """

    def __init__(self) -> None:
        self.engines: dict[tuple, Any] = {}  # in order of last use, oldest first
        self.loads = 0
        self.borrowed_since = 0  # a counter value: engines borrowed at or after it belong to the current test
        self._clock = 0
        self._last_borrowed: dict[tuple, int] = {}
        self.keep = int(os.environ.get("DIAGSAFE_TEST_ENGINES", "4"))
        self.free_bytes = float(os.environ.get("DIAGSAFE_TEST_FREE_GB", "6")) * 2**30
        self.log = os.environ.get("DIAGSAFE_TEST_ENGINE_LOG") or None
        self.test = ""

    def new_test(self, test: str = "") -> None:
        """Mark the start of a test's setup: what it borrows from here on is in use until the next test starts."""
        self._clock += 1
        self.borrowed_since = self._clock
        self.test = test

    def _note(self, event: str, key: tuple) -> None:
        if self.log:
            with open(self.log, "a") as log:
                log.write(" ".join([event, *(str(part) for part in key if part), self.test]) + "\n")

    def __call__(self, config, **options):
        from diagsafe_local.engines.vllm_engine import VLLMEngine

        key = (config.model, getattr(config, "lora", None))
        if key not in self.engines:
            self._make_room()
            self._note("load", key)
            self.loads += 1
            self.engines[key] = VLLMEngine(config, structured_backend="xgrammar")
        self.engines[key] = self.engines.pop(key)  # most recently used last
        self._last_borrowed[key] = self._clock
        return BorrowedEngine(self.engines[key])

    def _make_room(self) -> None:
        import psutil

        idle = [key for key in self.engines if self._last_borrowed[key] < self.borrowed_since]
        while idle and (len(self.engines) >= self.keep or psutil.virtual_memory().available < self.free_bytes):
            key = idle.pop(0)
            self._note("evict", key)
            self.engines.pop(key).close()
            del self._last_borrowed[key]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()


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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Before a test's fixtures are set up: the engines it borrows from now on are the ones it may be using."""
    if _FACTORY is not None:
        _FACTORY.new_test(item.nodeid)
