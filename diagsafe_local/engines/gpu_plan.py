"""How a run uses a node's GPUs: tensor parallelism for a model too large for one GPU, data parallelism
(one replica of the whole pipeline per group of GPUs) for everything else.

The decision is a pure function of the visible GPUs, their memory, the models' weight sizes and the
placement, so it is tested without GPUs. Rules:

* An engine's weights must fit in `WEIGHT_SHARE` of the GPU memory it will run at (its placement's share,
  colocated or in sleep mode, or vLLM's default 0.92 when it has the GPU to itself); the rest is for
  activations and the KV cache. Tensor parallel size is the smallest that makes the weights fit, never less
  than the config's own `tensor_parallel_size`, that vLLM can build the model with: its attention heads, KV
  heads, padded vocabulary and MLP widths must split evenly (`ModelShape.refusal`, each rule vLLM's). A model
  whose config.json cannot be read gets a power of two, and the plan says so.
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

from pydantic import BaseModel, ConfigDict

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
SHOWN_REASONS = 4  # tensor parallel sizes passed over that a refusal names with vLLM's reason
VOCAB_PADDING = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE
# vllm/transformers_utils/model_arch_config_convertor.py, get_total_num_kv_heads: the first of these a config has
KV_HEAD_FIELDS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")
# MLP widths split over the GPUs: dense layers', routed experts' (Qwen-MoE, DeepSeek), shared experts' (Qwen2-MoE)
MLP_WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")


def weight_bits(config: EngineConfig) -> int:
    """Bits per weight of `config`'s model where its size is read from its name: 16 unless quantised."""
    method = str(config.engine_kwargs.get("quantization") or "").lower()
    tag = QUANTISED_TAG.search(Path(config.model).name.lower())
    return QUANTISED_BITS.get(method) or (QUANTISED_BITS[tag[1]] if tag else 16)


class ModelShape(BaseModel):
    """The widths of a model that vLLM splits over its tensor parallel GPUs, read from its config.json as vLLM
    reads them (vllm/transformers_utils/model_arch_config_convertor.py, ModelArchConfigConvertorBase: the text
    config's `num_attention_heads`, `vocab_size`, and KV heads from the first of KV_HEAD_FIELDS, else the heads)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    heads: int
    kv_heads: int
    vocab: int | None
    widths: dict[str, int]  # the MLP widths by config field (dense, experts', shared experts')
    attention: int | None = None  # heads x head_dim: o_proj's input
    group_size: int | None = None  # a quantised checkpoint's quantization_config.group_size (None: none, or -1)

    def refusal(self, tensor_parallel: int, expert_parallel: bool = False) -> str | None:
        """Why vLLM 0.32 cannot build this model with `tensor_parallel` GPUs, or None where it can. Each rule is
        vLLM's, read in its source (paths under vllm/); tests/test_gpu_plan_shapes.py checks them against vLLM
        building published models."""
        tp = tensor_parallel
        # config/model.py, ModelConfig.verify_with_parallel_config
        if self.heads % tp:
            return f"its {self.heads} attention heads do not divide by {tp}"
        # model_executor/layers/linear.py, QKVParallelLinear.__init__: KV heads are split, or replicated evenly
        if tp % self.kv_heads if tp >= self.kv_heads else self.kv_heads % tp:
            return f"its {self.kv_heads} KV heads neither divide by {tp} nor divide {tp}"
        # model_executor/layers/vocab_parallel_embedding.py, VocabParallelEmbedding.__init__ (and ParallelLMHead):
        # the vocabulary padded by pad_vocab_size to DEFAULT_VOCAB_PADDING_SIZE is divided by the GPUs
        padded = -(-self.vocab // VOCAB_PADDING) * VOCAB_PADDING if self.vocab else 0
        if padded % tp:
            return f"its vocabulary of {self.vocab} ({padded} padded to {VOCAB_PADDING}) does not divide by {tp}"
        # model_executor/layers/linear.py, ColumnParallelLinear.__init__ and MergedColumnParallelLinear (gate/up)
        # divide the output, RowParallelLinear.__init__ (down) the input; the experts' width in
        # model_executor/layers/fused_moe/config.py, FusedMoEConfig.__post_init__
        for field, width in self.widths.items():
            if width % tp:
                return f"its {field} {width} does not divide by {tp}"
        return self._group_refusal(tp, expert_parallel)

    def _group_refusal(self, tp: int, expert_parallel: bool) -> str | None:
        """A quantised row-parallel layer's input per GPU must hold whole quantisation groups:
        model_executor/layers/quantization/auto_awq.py, BaseAWQLinearMethod.create_weights ("The input size is not
        aligned with the quantized weight shape"), utils/marlin_utils.py verify_marlin_supports_shape (AWQ/GPTQ
        Marlin), compressed_tensors/schemes/compressed_tensors_wNa4.py and wNa8.py create_weights (an assert).
        Row-parallel inputs: o_proj's (the attention width) and down_proj's (each MLP width); the experts' is not
        split under expert parallelism (fused_moe/config.py, FusedMoEParallelConfig.make: tp_size 1 with EP)."""
        if self.group_size is None or tp == 1:
            return None
        inputs = {"o_proj input": self.attention} | {
            "down_proj input" if field == "intermediate_size" else field: width
            for field, width in self.widths.items()
            if not (expert_parallel and field == "moe_intermediate_size")
        }
        for name, width in inputs.items():
            if width is not None and width // tp % self.group_size:
                return (
                    f"its {name} per GPU ({width} / {tp} = {width // tp}) is not a multiple of its "
                    f"{self.group_size}-wide quantisation groups"
                )
        return None


def expert_parallel(config: EngineConfig) -> bool:
    """Whether `config` asks vLLM for expert parallelism (its `enable_expert_parallel`, through engine_kwargs)."""
    return bool(config.engine_kwargs.get("enable_expert_parallel"))


def model_shape(model: str) -> ModelShape | None:
    """A local (or cached hub) model's shape; None when its config cannot be read."""
    found = model_json(model, "config.json")
    if found is None:
        return None
    config = found[0].get("text_config") or found[0]  # vLLM's hf_text_config
    heads = config.get("num_attention_heads")
    if not isinstance(heads, int) or heads < 1:
        return None
    kv = next((config[f] for f in KV_HEAD_FIELDS if f in config), heads)
    vocab = config.get("vocab_size")
    widths = {f: config[f] for f in MLP_WIDTHS if isinstance(config.get(f), int) and config[f] > 0}
    head_dim = config.get("head_dim") or (config.get("hidden_size") or 0) // heads
    quantisation = found[0].get("quantization_config") or config.get("quantization_config") or {}
    group = quantisation.get("group_size") if isinstance(quantisation, dict) else None
    return ModelShape(
        heads=heads,
        kv_heads=kv if isinstance(kv, int) and kv > 0 else heads,
        vocab=vocab if isinstance(vocab, int) and vocab > 0 else None,
        widths=widths,
        attention=heads * head_dim if isinstance(head_dim, int) and head_dim > 0 else None,
        group_size=group if isinstance(group, int) and group > 0 else None,
    )


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


def _tensor_parallel(
    weights: int | None,
    usable: float,
    configured: int,
    stages: int,
    shape: ModelShape | None,
    expert_parallel: bool = False,
) -> tuple[int, int | None, list[str]]:
    """The GPUs the weights need (at least the configured tensor parallel size; times the pipeline stages, they
    hold the weights), the smallest tensor parallel size from there that vLLM can build the model with (a power
    of two where its shape is unknown; None where no size can), and why each size passed over that divides the
    attention heads was (those that do not are refused by the first rule)."""
    need = max(1, configured)
    while weights is not None and weights > WEIGHT_SHARE * usable * need * stages:
        need += 1
    if shape is None:
        return need, max(configured, 1 << (need - 1).bit_length()), []
    passed: list[str] = []
    for tp in (d for d in range(need, shape.heads + 1) if shape.heads % d == 0):
        reason = shape.refusal(tp, expert_parallel)
        if reason is None:
            return need, tp, passed
        passed.append(f"{tp}: {reason}")
    return need, None, passed


def _passed_over(passed: Sequence[str], heads: int) -> str:
    """For a message: the sizes passed over that divide the attention heads, each with vLLM's reason (the first
    SHOWN_REASONS of them)."""
    more = f"; {len(passed) - SHOWN_REASONS} more" if len(passed) > SHOWN_REASONS else ""
    return f" (of those that divide its {heads} attention heads, {'; '.join(passed[:SHOWN_REASONS])}{more})"


def _outside_share(config: EngineConfig, tensor_parallel: int) -> int:
    return CUDA_CONTEXT + (0 if config.enforce_eager else CUDA_GRAPHS) + (NCCL_BUFFERS if tensor_parallel > 1 else 0)


def _colocation_fits(
    gpu_engines: Sequence[tuple[str, EngineConfig, float | None]], engines: Sequence[EnginePlan], memory: int
) -> None:
    """Refuse, before any engine loads, colocated shares that vLLM would refuse at the last engine's start: the
    judge and an attacker open first and stay, then one target at a time, so the judge's and attacker's
    overheads come on top of every share."""
    resident: dict[
        str, tuple[float, int]
    ] = {}  # role kind -> (its share, its overhead if opened before the last), one target at a time
    for (role, config, _), plan in zip(gpu_engines, engines):
        kind = role.split(":")[0]
        overhead = 0 if kind == "target" else _outside_share(config, plan.tensor_parallel_size)
        resident[kind] = max(resident.get(kind, (0.0, 0)), (plan.memory_share, overhead))
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
    # Each engine is planned at the share it will run at, as engines/host.py gives it: the placement's share for
    # target and judge (0.8 each in sleep mode), none in sequential mode and none for a juror (vLLM's default,
    # ALONE_SHARE), its own for an attacker; the engine's gpu_memory_utilization above all (vllm_engine.py).
    placed = mode != "sequential"
    gpu_engines = [(f"target:{getattr(t, 'label', t.model)}", t, target_memory if placed else None) for t in local]
    if judge is not None and capabilities(judge.kind).local:
        gpu_engines.append(("judge", judge, judge_memory if placed else None))
    if attacker is not None and capabilities(attacker[0].kind).local:
        gpu_engines.append(("attacker", *attacker))
    alone = [(f"jury:{name}", config, None) for name, config in jurors if capabilities(config.kind).local]
    for role, config, placed_share in [*gpu_engines, *alone]:
        share = config.gpu_memory_utilization or placed_share or ALONE_SHARE
        stages = config.pipeline_stages
        shape = model_shape(config.model)
        refused = shape.refusal(config.tensor_parallel_size, expert_parallel(config)) if shape else None
        if refused:
            raise DiagsafeError(
                f"{config.model}: vLLM cannot load it with tensor_parallel_size {config.tensor_parallel_size}: "
                f"{refused}"
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
        need, tp, passed = (
            _tensor_parallel(
                weights, share * memory, config.tensor_parallel_size, stages, shape, expert_parallel(config)
            )
            if gpus
            else (1, 1, [])
        )
        gib = (weights or 0) / GIB
        fits = f"{gib:.1f} GiB of weights, at most {WEIGHT_SHARE:.0%} of its {share:.0%} memory share per GPU"
        skipped = _passed_over(passed, shape.heads) if shape and passed else ""
        if tp is None:
            none = f" (none that divides its {shape.heads} attention heads)" if shape else ""
            raise DiagsafeError(
                f"{role.split(':')[0]} {config.model} needs at least {need * stages} GPUs of {memory / GIB:.0f} GiB "
                f"({fits}), and vLLM can build it with no tensor parallel size from {need} up{skipped or none}" + hint
            )
        if tp > 1 and not capabilities(config.kind).tensor_parallel:
            raise DiagsafeError(
                f"{config.model} ({gib:.1f} GiB) does not fit one GPU and engine kind '{config.kind}' "
                "cannot shard it; use kind: vllm"
            )
        if tp > 1 and shape is None:
            notes.append(
                f"{config.model}: config.json not readable, so tensor parallel {tp} (a power of two) is unchecked "
                "against vLLM's rules"
            )
        if tp * stages > max(gpus, 1):
            layout = f"tensor parallel {tp} x {stages} pipeline stages" if stages > 1 else f"tensor parallel {tp}"
            smallest = f"; {tp} is the smallest size vLLM builds it with{skipped}" if shape else ""
            raise DiagsafeError(
                f"{role.split(':')[0]} {config.model} needs {tp * stages} GPUs of {memory / GIB:.0f} GiB "
                f"({layout}: {fits}{smallest}), but {gpus} are visible" + hint + " (a model must fit one node)"
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
