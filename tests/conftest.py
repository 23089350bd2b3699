"""Shared fixtures: paths, a CLI runner, and small benchmark files we write in each layout."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

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
os.environ["DIAGSAFE_JUDGE_CACHE"] = tempfile.mkdtemp(prefix="diagsafe-judge-cache-")
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


@pytest.fixture
def current_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "bench.jsonl", current_rows())


@pytest.fixture
def wide_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "bench_v1.jsonl", wide_rows())


# -- the real vLLM engine, shared across tests (each start costs ~45 s on this machine) --------------


class SharedVLLMFactory:
    """An engine factory that loads each (model, adapter) once per test session, with the judge's
    structured-output backend (requests without a schema are unaffected by it)."""

    def __init__(self) -> None:
        self.engines = {}
        self.loads = 0

    def __call__(self, config, **options):
        from diagsafe_local.engines.vllm_engine import VLLMEngine

        key = (config.model, getattr(config, "lora", None))
        if key not in self.engines:
            self.loads += 1
            self.engines[key] = VLLMEngine(config, structured_backend="xgrammar")
        return BorrowedEngine(self.engines[key])

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()


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


@pytest.fixture(scope="session")
def vllm_engines():
    factory = SharedVLLMFactory()
    yield factory
    factory.close()
