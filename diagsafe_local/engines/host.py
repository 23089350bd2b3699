"""The host places engines on this node's GPUs: how the target under test and the judge share memory.

`sequential`: one engine at a time, each with the whole GPU (the target generates everything, is freed, then
the judge loads). `colocate`: both resident, each with its share of GPU memory. `sleep`: both loaded, vLLM's
sleep mode offloads the idle one's weights (CUDA only; elsewhere it falls back to `sequential`).

A remote endpoint's `concurrency` is the whole run's, shared by its processes (shards): process i of N keeps
`concurrency // N` requests in flight, one more for the first `concurrency % N`, so the shares sum to it. Where
N is larger than the concurrency, each process keeps one in flight while it holds one of `concurrency` slots (a
lock file under the run's directory, taken when the engine opens and held until the run ends): a process beyond
them waits, asleep on the lock, until one is free.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal
from weakref import WeakKeyDictionary

from diagsafe_local.core.locking import file_lock
from diagsafe_local.engines.base import Engine
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpu_plan import ALONE_SHARE
from diagsafe_local.engines.gpus import cuda_available, wait_for_memory
from diagsafe_local.engines.kinds import capabilities
from diagsafe_local.runs.manifest import GpuPlan

log = logging.getLogger(__name__)
MEMORY_WAIT_SECONDS = 60.0  # an engine closed a moment ago gets this long to give its GPU memory back
Need = tuple[float, int]  # what an engine on CUDA needs free: this share of each of the first this many GPUs
Mode = Literal["colocate", "sequential", "sleep"]


class Host:
    """Opens engines with the options their placement needs, and records what it loaded (for the manifest)."""

    def __init__(
        self,
        mode: Mode,
        target_memory: float,
        judge_memory: float,
        factory: Callable[..., Engine],
        loaded: dict[str, Any] | None = None,
        plan: GpuPlan | None = None,
        processes: int = 1,
        process: int = 0,
        slots: Path | None = None,
    ) -> None:
        if mode == "sleep" and not cuda_available():
            log.warning("placement 'sleep' needs CUDA; falling back to 'sequential'")
            mode = "sequential"
        self.mode: Mode = mode
        self.target_memory = target_memory
        self.judge_memory = judge_memory
        self.factory = factory
        self.loaded: dict[str, Any] = dict(loaded or {})
        self.plan = plan
        self.processes = processes  # the run's processes (its shards): an endpoint's concurrency is shared by all
        self.process = process  # this process's index among them
        self.slots = slots  # where the slots of an endpoint shared by more processes than its concurrency are
        self._held = ExitStack()
        self._slots: set[Path] = set()
        self._needs: WeakKeyDictionary[Engine, Need] = WeakKeyDictionary()  # each open engine's, for its wake

    def _open(self, role: str, config: EngineConfig, **options: Any) -> Engine:
        start = time.perf_counter()
        if capabilities(config.kind).remote and self.processes > 1:
            config = config.model_copy(update={"concurrency": self._share(role, config.concurrency)})
        planned = self.plan.tensor_parallel(role) if self.plan else 1
        if capabilities(config.kind).tensor_parallel and planned > config.tensor_parallel_size:
            config = config.model_copy(update={"tensor_parallel_size": planned})
        need: Need | None = None
        if capabilities(config.kind).local and capabilities(config.kind).on_cuda and cuda_available():
            need = (
                config.gpu_memory_utilization or options.get("memory_share") or ALONE_SHARE,
                config.tensor_parallel_size * config.pipeline_stages,
            )
            self._wait(need)
        engine = self.factory(config, **options)
        if need is not None:
            self._needs[engine] = need
        self.loaded[role] = {
            **engine.info.model_dump(mode="json"),
            "load_seconds": round(time.perf_counter() - start, 2),
        }
        return engine

    def _wait(self, need: Need) -> None:
        """Wait until `need` (a share of each of the first GPUs) is free, naming what is held if it never comes.
        vLLM refuses to start an engine unless its share of each GPU is free (v1/worker/utils.py `request_memory`),
        and a parked engine's wake re-allocates what its sleep freed (device_allocator/cumem.py
        `CuMemAllocator.wake_up`): the engine closed a moment ago may still hold it, its workers exiting
        (v1/utils.py `shutdown`: SIGTERM, 5 s, then a kill of the engine core only, not its TP workers)."""
        wait_for_memory(*need, timeout=MEMORY_WAIT_SECONDS)

    def _share(self, role: str, concurrency: int) -> int:
        """This process's share of an endpoint's `concurrency` (see the module docstring); with fewer slots than
        processes, wait for this process's slot first."""
        if self.processes <= concurrency:
            return concurrency // self.processes + (self.process < concurrency % self.processes)
        if self.slots is None:
            raise ValueError("a run of more processes than an endpoint's concurrency needs a directory for its slots")
        slot = self.slots / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', role)}-{self.process % concurrency}.lock"
        if slot not in self._slots:
            log.info("%s: one request in flight, in slot %s of %d (waits while another process holds it)",
                     role, slot.stem, concurrency)  # fmt: skip
            self._held.enter_context(file_lock(slot))
            self._slots.add(slot)
        return 1

    def close(self) -> None:
        """Give back the endpoints' slots this process holds."""
        self._held.close()
        self._slots.clear()

    def open_target(self, role: str, config: EngineConfig) -> Engine:
        share = self.target_memory if self.mode != "sequential" else None
        return self._open(role, config, memory_share=share, enable_sleep=self.mode == "sleep")

    def open_judge(
        self, config: EngineConfig, structured_backend: str, template_arguments: Mapping[str, str] | None = None
    ) -> Engine:
        """`template_arguments`: those of every judge that renders through it (default: `config`'s own)."""
        share = self.judge_memory if self.mode != "sequential" else None
        return self._open(
            "judge",
            config,
            memory_share=share,
            structured_backend=structured_backend,
            enable_sleep=self.mode == "sleep",
            template_arguments=template_arguments,
        )

    def open_juror(
        self,
        name: str,
        config: EngineConfig,
        structured_backend: str,
        template_arguments: Mapping[str, str] | None = None,
    ) -> Engine:
        """A jury member's model, loaded alone (the run's other engines are closed while the jury sits)."""
        return self._open(
            f"jury:{name}", config, structured_backend=structured_backend, template_arguments=template_arguments
        )

    def open_attacker(self, config: EngineConfig, memory: float, structured_backend: str) -> Engine:
        """An attacker model of its own, resident beside target and judge (its replies are JSON-constrained)."""
        return self._open("attacker", config, memory_share=memory, structured_backend=structured_backend)

    def park(self, engine: Engine | None) -> None:
        """Offload an idle engine's weights while another works (sleep mode only)."""
        if engine is not None and self.mode == "sleep":
            engine.sleep()

    def unpark(self, engine: Engine | None) -> None:
        """Wake a parked engine once the memory it needs awake is free again, as opening it waited."""
        if engine is not None and self.mode == "sleep":
            if engine in self._needs:
                self._wait(self._needs[engine])
            engine.wake_up()
