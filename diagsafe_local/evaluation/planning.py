"""How a run uses a node's GPUs: tensor parallel sizes from the models' sizes, data-parallel replicas from the
GPUs left (see `engines.gpu_plan`), for this process or for another node (`diagsafe-local plan`)."""

from __future__ import annotations

from collections.abc import Sequence

from diagsafe_local.core.cpus import usable_cpus
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpu_plan import plan_gpus, visible_gpu_memory
from diagsafe_local.engines.gpus import cuda_available
from diagsafe_local.engines.kinds import capabilities
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.passes import PASSES
from diagsafe_local.judging.config import JuryMember
from diagsafe_local.runs.manifest import GpuPlan

# A client process is worth starting for this many requests: about 20 s of one core's work through the
# OpenAI client (~1 ms of CPU a request; `scripts/bench_api.py --server scripted --clients`).
REQUESTS_PER_CLIENT = 20_000


def _models(config: RunConfig) -> list[EngineConfig]:
    """Every model the run loads or calls: its targets, a model judge, its own attacker, the jury's members."""
    own = config.attack.own_attacker if config.attack else None
    judge = [config.judge] if config.judge.needs_model else []
    return [*config.targets, *judge, *([own] if own else []), *_jurors(config)]


def api_only(config: RunConfig) -> bool:
    """Whether every model of the run is behind an API (none loads on this node)."""
    return not any(capabilities(m.kind).local for m in _models(config))


def local_models(config: RunConfig) -> list[EngineConfig]:
    """The run's models that load on this node."""
    return [m for m in _models(config) if capabilities(m.kind).local]


def api_endpoints(config: RunConfig) -> list[str]:
    """The base URLs of the run's models behind an API, each once."""
    return sorted({m.base_url for m in _models(config) if capabilities(m.kind).remote and m.base_url})


def _jurors(config: RunConfig) -> list[JuryMember]:
    """The jury's members that load a model."""
    jury = config.judge.jury
    return [m for m in jury.members if m.needs_model] if jury is not None else []


def api_requests(config: RunConfig, n_items: int | None) -> int:
    """The requests of a run of `n_items`: an answer and a verdict per item, sample and target."""
    return 2 * (n_items or 0) * sum(t.sampling.n for t in config.targets)


def client_processes(config: RunConfig, n_items: int | None) -> int:
    """Processes for a run whose every model is behind an API: one per REQUESTS_PER_CLIENT of its requests, at
    most one per CPU this process may use, and no more than the smallest `concurrency` of its endpoints (each
    process keeps at least one request in flight at each). A Python client keeps one core busy at a few hundred
    requests a second; a fast server answers more."""
    in_flight = min((m.concurrency for m in _models(config) if capabilities(m.kind).remote), default=1)
    wanted = api_requests(config, n_items) // REQUESTS_PER_CLIENT
    return max(1, min(usable_cpus(), in_flight, wanted))


def pass_costs(config: RunConfig) -> list[str]:
    """What each judging pass adds to a run of `config`, one line per pass that adds something (from the passes'
    declarations)."""
    return [line for judging in PASSES if (line := judging.cost(config)) is not None]


def plan_run(
    config: RunConfig, n_items: int | None, gpu_memory: Sequence[int] | None = None, replicate: bool = True
) -> GpuPlan:
    """The GPU plan of a run on this process's visible GPUs (or on `gpu_memory`, to plan for another node);
    without `replicate`, one replica (a process that runs its share itself)."""
    placement = config.placement
    attack = config.attack
    own = attack.own_attacker if attack else None
    remote = api_only(config)
    if gpu_memory is None and not remote:
        cuda_available()  # a node whose GPUs torch cannot use stops here, before any engine loads
    memory = visible_gpu_memory() if gpu_memory is None else gpu_memory
    plan = plan_gpus(
        memory,
        config.targets,
        config.judge if config.judge.needs_model else None,
        placement.mode,
        placement.target_memory,
        placement.judge_memory,
        n_items,
        attacker=None if attack is None or own is None else (own, attack.memory),
        attacked=attack is not None,
        jurors=[(m.label, m) for m in _jurors(config)],
    )
    if config.judge.one_process is not None and placement.replicas not in ("auto", 1):
        raise DiagsafeError(
            f"{config.judge.one_process} runs as one process (its sample is drawn from the whole dataset): "
            "set placement.replicas to 1 or auto"
        )
    if not replicate or config.judge.one_process is not None:
        plan = plan.model_copy(update={"replicas": 1})
    elif placement.replicas == "auto" and remote:
        plan = plan.model_copy(update={"replicas": client_processes(config, n_items)})
    elif placement.replicas != "auto":
        group = max(plan.gpus_per_replica, len(memory) // placement.replicas)
        if memory and group * placement.replicas > len(memory):
            raise DiagsafeError(
                f"placement.replicas {placement.replicas} needs {placement.replicas * plan.gpus_per_replica} GPUs "
                f"({plan.gpus_per_replica} per replica); {len(memory)} are visible"
            )
        plan = plan.model_copy(update={"replicas": placement.replicas, "gpus_per_replica": group if memory else 1})
    return plan
