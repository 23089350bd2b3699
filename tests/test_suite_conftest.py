"""The suite's own costs: what a pytest process leaves in the temporary folder, and the shared engine factory's
loads and evictions, told in a log when DIAGSAFE_TEST_ENGINE_LOG names one."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import SharedVLLMFactory, in_process_vllm_for_children

from diagsafe_local.engines.config import EngineConfig

TESTS = Path(__file__).parent


@pytest.mark.slow  # a pytest process of its own: ~4 s
def test_a_pytest_process_leaves_no_folder_of_its_own_in_the_temporary_folder(tmp_path):
    """conftest.py makes a judge cache and a hook-store folder for the session (under TMPDIR); both go at its end."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    env.pop("MLFLOW_TRACKING_URI", None)
    command = [sys.executable, "-m", "pytest", str(TESTS / "test_jsonl.py"), "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*command, "-k", "no_test_has_this_name", "--basetemp", str(tmp_path / "base")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 5, proc.stdout[-2000:] + proc.stderr[-2000:]  # 5: no test selected, as asked
    assert sorted(p.name for p in scratch.iterdir()) == []


class FakeEngine:
    """Stands for a VLLMEngine: the factory only creates and closes its engines."""

    def __init__(self, config: EngineConfig, **options: object) -> None:
        self.info = None

    def close(self) -> None:
        """Nothing to free."""


def test_the_shared_factory_logs_each_load_and_eviction_with_the_test_that_caused_it(tmp_path, monkeypatch):
    import diagsafe_local.engines.vllm_engine as vllm_engine

    log = tmp_path / "engines.log"
    monkeypatch.setattr(vllm_engine, "VLLMEngine", FakeEngine)
    monkeypatch.setenv("DIAGSAFE_TEST_ENGINE_LOG", str(log))
    monkeypatch.setenv("DIAGSAFE_TEST_ENGINES", "2")
    monkeypatch.setenv("DIAGSAFE_TEST_FREE_GB", "0")
    factory = SharedVLLMFactory()
    for test, model in [("t1", "a"), ("t2", "b"), ("t3", "a"), ("t4", "c"), ("t5", "b")]:
        factory.new_test(test)
        factory(EngineConfig(model=model))
    assert log.read_text().splitlines() == [
        "load a t1",
        "load b t2",
        "evict b t4",  # a was used by t3: b is the least recently used
        "load c t4",
        "evict a t5",
        "load b t5",
    ]
    assert factory.loads == 4


@pytest.mark.parametrize("value", [None, ""])
def test_without_the_variable_the_factory_writes_no_log(tmp_path, monkeypatch, value):
    import diagsafe_local.engines.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "VLLMEngine", FakeEngine)
    monkeypatch.chdir(tmp_path)
    if value is None:
        monkeypatch.delenv("DIAGSAFE_TEST_ENGINE_LOG", raising=False)
    else:
        monkeypatch.setenv("DIAGSAFE_TEST_ENGINE_LOG", value)
    factory = SharedVLLMFactory()
    factory.new_test("t1")
    factory(EngineConfig(model="a"))
    assert factory.loads == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("before", [None, "1"])
def test_in_process_vllm_is_in_the_environment_of_the_block_only(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    else:
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", before)
    with in_process_vllm_for_children():
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['VLLM_ENABLE_V1_MULTIPROCESSING'])"],
            capture_output=True,
            text=True,
        )
    assert child.stdout.strip() == "0"
    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == before


def test_tests_of_the_real_model_run_together_and_those_loading_engines_of_their_own_last():
    """Whatever the order they were collected in (conftest's pytest_collection_modifyitems): the tests using the
    real model run after every other test, so the tiny models' engines do not evict it between them; a test marked
    `own_engines` runs after all of them, so the shared engines are not evicted and loaded again midway."""
    files = [str(TESTS / name) for name in ("test_guards_2026.py", "test_cascade.py", "test_jsonl.py")]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *files, "--collect-only", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    order = [line for line in proc.stdout.splitlines() if "::" in line]
    assert proc.returncode == 0 and len(order) > 20, proc.stdout[-2000:]
    assert order[-1].endswith("test_each_2026_guard_judges_a_whole_run_on_its_tiny_model"), order[-3:]
    real = order.index(
        "tests/test_cascade.py::test_the_real_model_screened_by_a_keyword_metric_saves_requests_and_the_gate_weighs_the_audit"
    )
    assert all(line.startswith("tests/test_cascade.py") for line in order[real:-1]), order[real:]
    assert max(k for k, line in enumerate(order) if line.startswith("tests/test_jsonl.py")) < real


def test_the_factory_shuts_every_engine_down_and_raises_what_failed(monkeypatch):
    import diagsafe_local.engines.vllm_engine as vllm_engine

    closed: list[str] = []

    class Closing(FakeEngine):
        def __init__(self, config: EngineConfig, **options: object) -> None:
            super().__init__(config)
            self.model = config.model

        def close(self) -> None:
            closed.append(self.model)
            if self.model in ("b", "c"):
                raise RuntimeError(f"{self.model} did not stop")

    monkeypatch.setattr(vllm_engine, "VLLMEngine", Closing)
    monkeypatch.delenv("DIAGSAFE_TEST_ENGINE_LOG", raising=False)
    monkeypatch.setenv("DIAGSAFE_TEST_ENGINES", "4")
    monkeypatch.setenv("DIAGSAFE_TEST_FREE_GB", "0")
    factory = SharedVLLMFactory()
    for model in "abcd":
        factory.new_test(model)
        factory(EngineConfig(model=model))
    with pytest.raises(ExceptionGroup) as raised:
        factory.close()
    assert sorted(closed) == ["a", "b", "c", "d"] and not factory.engines
    assert sorted(str(e) for e in raised.value.exceptions) == ["b did not stop", "c did not stop"]


class WithCore(FakeEngine):
    """A fake engine whose load starts a process named as vLLM names its engine core, and another process (one a
    second thread might start meanwhile) that ends at once."""

    started: list = []  # noqa: RUF012  every process the fakes started, for the test to stop
    closed: list[str] = []  # noqa: RUF012

    def __init__(self, config: EngineConfig, **options: object) -> None:
        super().__init__(config)
        self.model = config.model
        fork = multiprocessing.get_context("fork")
        for name, seconds in [("EngineCore", 60.0), ("Unrelated", 0.0)]:
            process = fork.Process(target=time.sleep, args=(seconds,), name=name)
            process.start()
            self.started.append(process)

    def close(self) -> None:
        self.closed.append(self.model)


@pytest.fixture
def with_core(monkeypatch):
    import diagsafe_local.engines.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "VLLMEngine", WithCore)
    monkeypatch.delenv("DIAGSAFE_TEST_ENGINE_LOG", raising=False)
    monkeypatch.setenv("DIAGSAFE_TEST_ENGINES", "4")
    monkeypatch.setenv("DIAGSAFE_TEST_FREE_GB", "0")
    WithCore.started, WithCore.closed = [], []
    yield SharedVLLMFactory()
    for process in WithCore.started:
        process.kill()
        process.join()


def test_an_engine_whose_core_was_killed_is_shut_down_named_and_loaded_again(with_core):
    """conftest's teardown check: a test that killed an engine's core fails by name, and the next test that needs
    the engine loads it again instead of meeting EngineDeadError. A process that was not the engine core's ending
    (the "Unrelated" one each load starts) marks nothing dead."""
    factory = with_core
    for model in "ab":
        factory.new_test(model)
        factory(EngineConfig(model=model))
    for process in WithCore.started:
        if process.name == "Unrelated":
            process.join()
    assert factory.drop_dead() == [] and WithCore.closed == []
    core_of_b = WithCore.started[2]
    core_of_b.kill()
    core_of_b.join()
    dead = factory.drop_dead()
    assert len(dead) == 1 and dead[0].startswith("b (EngineCore pid ") and dead[0].endswith("exit code -9)")
    assert WithCore.closed == ["b"] and list(factory.engines) == [("a", None)]
    factory.new_test("next")
    factory(EngineConfig(model="b"))
    assert factory.loads == 3 and factory.drop_dead() == []


def test_an_engine_vllm_marked_dead_is_dropped_and_an_evicted_one_is_not_watched(with_core, monkeypatch):
    monkeypatch.setenv("DIAGSAFE_TEST_ENGINES", "1")
    factory = SharedVLLMFactory()
    factory.new_test("t1")
    factory(EngineConfig(model="a"))
    factory.new_test("t2")
    factory(EngineConfig(model="b"))  # evicts a
    WithCore.started[0].kill()  # a's core, after its eviction: nothing of the factory's
    WithCore.started[0].join()
    assert factory.drop_dead() == [] and WithCore.closed == ["a"]
    kept = factory.engines[("b", None)]
    kept._llm = SimpleNamespace(
        llm_engine=SimpleNamespace(engine_core=SimpleNamespace(resources=SimpleNamespace(engine_dead=True)))
    )
    assert factory.drop_dead() == ["b (marked dead by vLLM)"] and not factory.engines and WithCore.closed == ["a", "b"]
