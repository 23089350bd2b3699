"""Engines behind one interface (`Engine`), created from config by `create_engine`."""

from __future__ import annotations

from typing import Any

from diagsafe_local.engines.base import Completion, Engine, EngineInfo, GenerationRequest
from diagsafe_local.engines.config import EngineConfig

__all__ = ["Completion", "Engine", "EngineInfo", "GenerationRequest", "create_engine"]


def create_engine(config: EngineConfig, **options: Any) -> Engine:
    """The engine for `config.kind`; heavy libraries are imported here, not at package import."""
    if config.kind == "vllm":
        from diagsafe_local.engines.vllm_engine import VLLMEngine

        return VLLMEngine(config, **options)
    if config.kind == "openai":
        from diagsafe_local.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(config)
    if config.kind == "transformers":
        from diagsafe_local.engines.transformers_engine import TransformersEngine

        return TransformersEngine(config)
    if config.kind == "classifier":
        from diagsafe_local.engines.classifier_engine import ClassifierEngine

        return ClassifierEngine(config)
    raise ValueError(f"unknown engine kind '{config.kind}'")
