"""How a run uses a node's GPUs: tensor parallelism for a model too large for one GPU, data parallelism
(one replica of the whole pipeline per group of GPUs) for everything else.

The decision is a pure function of the visible GPUs, their memory, the models' weight sizes and the
placement, so it is tested without GPUs. Rules:

* An engine's weights must fit in `WEIGHT_SHARE` of the GPU memory it may use (its colocated share, or vLLM's
  default 0.9 when it has the GPU to itself); the rest is for activations and the KV cache. Tensor parallel
  size is the smallest power of two (vLLM shards attention heads evenly) that makes the weights fit, and
  never less than the config's own `tensor_parallel_size`.
* A replica needs the largest of the target's, the judge's (and an attacker's) tensor parallel sizes; the node
  runs as many replicas as whole groups fit (never more than there are items).
* Weight sizes come from the files of a local model, a cached hub model's safetensors index, or, failing those,
  the parameter count in the name at 16 bits ("Qwen2.5-72B-Instruct": 144 GB); the plan says which.
* A model whose size cannot be read (a hub id not in the local cache) is assumed to fit one GPU, and the plan
  says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpus import node_gpus
from diagsafe_local.engines.identity import model_json
from diagsafe_local.engines.kinds import capabilities
from diagsafe_local.runs.manifest import EnginePlan, GpuPlan

WEIGHT_SHARE = 0.6  # of an engine's GPU memory: the weights; the rest holds activations and the KV cache
ALONE_SHARE = 0.92  # vLLM's default gpu_memory_utilization, for an engine that has its GPUs to itself
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
GIB = 1024**3
# What a vLLM engine holds outside its gpu_memory_utilization share (estimates): its CUDA context, CUDA graphs
# unless eager, NCCL buffers with tensor parallelism. vLLM checks, as each engine starts, that its share of the
# GPU is free, so every engine opened before the last holds these on top of its share.
CUDA_CONTEXT = GIB // 2
CUDA_GRAPHS = GIB
NCCL_BUFFERS = GIB // 2
PARAMETERS_IN_NAME = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[bB](?![a-zA-Z0-9])")
# Bits per weight of a quantised model sized from its name: the engine's `quantization`, else a tag in the name.
QUANTISED_BITS = {"fp8": 8, "int8": 8, "w8a8": 8, "8bit": 8, "awq": 4, "gptq": 4, "int4": 4, "4bit": 4, "bnb": 4}
QUANTISED_TAG = re.compile(r"(?<![a-z0-9])(" + "|".join(QUANTISED_BITS) + r")(?![a-z0-9])")


def weight_bits(config: EngineConfig) -> int:
    """Bits per weight of `config`'s model where its size is read from its name: 16 unless quantised."""
    method = str(config.engine_kwargs.get("quantization") or "").lower()
    tag = QUANTISED_TAG.search(Path(config.model).name.lower())
    return QUANTISED_BITS.get(method) or (QUANTISED_BITS[tag[1]] if tag else 16)


def attention_heads(model: str) -> int | None:
    """A local (or cached hub) model's attention heads, which its tensor parallel size must divide (vLLM's
    rule); None when its config cannot be read."""
    found = model_json(model, "config.json")
    if found is None:
        return None
    config = found[0]
    heads = config.get("num_attention_heads") or (config.get("text_config") or {}).get("num_attention_heads")
    return heads if isinstance(heads, int) and heads > 0 else None


def weight_bytes(model: str, bits: int = 16) -> tuple[int | None, str]:
    """Size of a model's weights and where it came from: a local directory's weight files, a cached hub
    model's safetensors index, or the parameter count in its name ("...-72B-...") at `bits` each."""
    path = Path(model).expanduser()
    try:
        local = path.is_dir()
    except OSError:  # a name no file system holds (an API model name of 300 characters)
        return None, "unknown"
    if local:
        files = {f for pattern in WEIGHT_FILES for f in path.glob(pattern)}
        return sum(f.stat().st_size for f in files) or None, "weight files"
    if model.count("/") <= 1 and not path.is_absolute():
        from huggingface_hub import try_to_load_from_cache

        for name in ("model.safetensors.index.json", "model.safetensors"):
            cached = try_to_load_from_cache(model, name)
            if isinstance(cached, str):
                if name.endswith(".json"):
                    total = json.loads(Path(cached).read_text()).get("metadata", {}).get("total_size")
                    return (int(total), "hub cache") if total else (None, "unknown")
                return Path(cached).stat().st_size, "hub cache"
    named = PARAMETERS_IN_NAME.search(path.name)
    if named:
        return int(float(named[1]) * 1e9 * bits / 8), f"name, as {bits}-bit weights"
    return None, "unknown"


def visible_gpu_memory() -> list[int]:
    """Total memory of each GPU this process may use (empty without GPUs), read through NVML: no CUDA context
    in this process (the engines' workers must be the first to create one)."""
    node = node_gpus()
    return [g.total for g in node.gpus] if node else []


def _tensor_parallel(weights: int | None, usable: float, configured: int, stages: int, heads: int | None) -> int:
    """The smallest tensor parallel size, at least the configured one, whose GPUs (times the pipeline stages)
    hold the weights: a power of two, or where the model's attention heads are known the smallest number of
    GPUs that divides them (vLLM refuses the others: 28 heads take 1, 2, 4, 7, 14 or 28)."""
    size = max(1, configured)
    while weights is not None and weights > WEIGHT_SHARE * usable * size * stages:
        size += 1
    if heads is None:
        return max(configured, 1 << (size - 1).bit_length())
    return next(d for d in range(size, heads + 1) if heads % d == 0) if size <= heads else size


def _outside_share(config: EngineConfig, tensor_parallel: int) -> int:
    return CUDA_CONTEXT + (0 if config.enforce_eager else CUDA_GRAPHS) + (NCCL_BUFFERS if tensor_parallel > 1 else 0)


def _colocation_fits(
    gpu_engines: Sequence[tuple[str, EngineConfig, float]], engines: Sequence[EnginePlan], memory: int
) -> None:
    """Refuse, before any engine loads, colocated shares that vLLM would refuse at the last engine's start: the
    judge and an attacker open first and stay, then one target at a time, so the judge's and attacker's
    overheads come on top of every share."""
    resident: dict[
        str, tuple[float, int]
    ] = {}  # role kind -> (its share, its overhead if opened before the last), one target at a time
    for (role, config, share), plan in zip(gpu_engines, engines):
        kind = role.split(":")[0]
        overhead = 0 if kind == "target" else _outside_share(config, plan.tensor_parallel_size)
        resident[kind] = max(resident.get(kind, (0.0, 0)), (share, overhead))
    if len(resident) < 2:
        return
    shares = sum(share for share, _ in resident.values())
    outside = sum(overhead for _, overhead in resident.values())
    if shares * memory + outside > memory:
        fits = (memory - outside) / memory
        parts = " + ".join(f"{kind} {share:.2f}" for kind, (share, _) in resident.items())
        raise DiagsafeError(
            f"colocated engines do not fit {memory / GIB:.1f} GiB GPUs: their shares ({parts} = {shares:.2f}, "
            f"{shares * memory / GIB:.1f} GiB) plus about {outside / GIB:.1f} GiB the engines opened first hold "
            f"outside their shares (CUDA context, CUDA graphs unless enforce_eager, NCCL with tensor parallelism) "
            f"come to {(shares * memory + outside) / GIB:.1f} GiB, and vLLM would refuse the last engine at start; "
            f"give shares that sum to at most {fits:.2f}, or more GPU memory"
        )


def plan_gpus(
    gpu_memory: Sequence[int],
    targets: Sequence[EngineConfig],
    judge: EngineConfig | None,  # None: the judge needs no model
    mode: str,
    target_memory: float,
    judge_memory: float,
    n_items: int | None = None,
    sizes: dict[str, int | None] | None = None,
    attacker: tuple[EngineConfig, float] | None = None,
    attacked: bool = False,
    jurors: Sequence[tuple[str, EngineConfig]] = (),
) -> GpuPlan:
    """Decide tensor and data parallelism for a run on GPUs of `gpu_memory` bytes each. `sizes` maps a model
    to its weight bytes (read from disk when not given); `attacker` is an adaptive attack's own model and its
    colocated memory share, `attacked` whether the run attacks at all (its models must stay colocated);
    `jurors` a jury's members by name, each loaded alone once the other engines are closed. Raises when a model
    cannot fit the visible GPUs."""
    gpus = len(gpu_memory)
    memory = min(gpu_memory) if gpu_memory else 0
    sizes = dict(sizes or {})
    notes: list[str] = []
    engines: list[EnginePlan] = []
    local = [t for t in targets if capabilities(t.kind).local]
    if attacked:
        hint = "; an attack keeps every model resident: give this one a larger memory share, or more GPUs"
    else:
        hint = "; placement sequential gives each model the whole GPU" if mode == "colocate" else ""
    gpu_engines = [(f"target:{getattr(t, 'label', t.model)}", t, target_memory) for t in local]
    if judge is not None and capabilities(judge.kind).local:
        gpu_engines.append(("judge", judge, judge_memory))
    if attacker is not None and capabilities(attacker[0].kind).local:
        gpu_engines.append(("attacker", *attacker))
    alone = [(f"jury:{name}", config, ALONE_SHARE) for name, config in jurors if capabilities(config.kind).local]
    for role, config, colocated_share in [*gpu_engines, *alone]:
        share = colocated_share if mode == "colocate" else ALONE_SHARE
        stages = config.pipeline_stages
        heads = attention_heads(config.model)
        if heads is not None and heads % config.tensor_parallel_size:
            raise DiagsafeError(
                f"{config.model} has {heads} attention heads: its tensor_parallel_size must divide them "
                f"(vLLM's rule), and {config.tensor_parallel_size} does not"
            )
        if config.model in sizes:
            weights = sizes[config.model]
        else:
            weights, source = weight_bytes(config.model, weight_bits(config))
            if weights is None:
                notes.append(
                    f"{config.model}: weight size unknown (not local, cached, or in its name); assumed to fit one GPU"
                )
            elif source != "weight files":
                notes.append(f"{config.model}: size from the {source}")
        tp = _tensor_parallel(weights, share * memory, config.tensor_parallel_size, stages, heads) if gpus else 1
        gib = (weights or 0) / GIB
        if tp > 1 and not capabilities(config.kind).tensor_parallel:
            raise DiagsafeError(
                f"{config.model} ({gib:.1f} GiB) does not fit one GPU and engine kind '{config.kind}' "
                "cannot shard it; use kind: vllm"
            )
        if tp * stages > max(gpus, 1):
            layout = f"tensor parallel {tp} x {stages} pipeline stages" if stages > 1 else f"tensor parallel {tp}"
            divides = f"; {tp} is the smallest that divides its {heads} attention heads" if heads else ""
            raise DiagsafeError(
                f"{role.split(':')[0]} {config.model} needs {tp * stages} GPUs of {memory / GIB:.0f} GiB "
                f"({layout}: {gib:.1f} GiB of weights, at most {WEIGHT_SHARE:.0%} of its "
                f"{share:.0%} memory share per GPU{divides}), but {gpus} are visible" + hint + " (a model must fit "
                "one node)"
            )
        engines.append(
            EnginePlan(
                role=role,
                model=config.model,
                weight_bytes=weights,
                memory_share=share,
                tensor_parallel_size=tp,
                pipeline_parallel_size=stages,
            )
        )
    if mode == "colocate" and gpus:
        _colocation_fits(gpu_engines, engines, memory)
    group = max((e.gpus for e in engines), default=1)
    replicas = max(1, min(gpus // group if gpus else 1, n_items or gpus))
    if gpus and gpus % group:
        notes.append(f"{gpus % group} of {gpus} GPUs stay idle: a replica needs {group}")
    return GpuPlan(
        gpus=gpus, gpu_memory_bytes=memory, replicas=replicas, gpus_per_replica=group, engines=engines, notes=notes
    )
