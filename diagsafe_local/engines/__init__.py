"""Engines behind one interface (`Engine`), created from config by `create_engine` through the registry of engine
kinds (`ENGINES`, with each kind's capabilities)."""

from __future__ import annotations

from typing import Any

from diagsafe_local.engines.base import Completion, Engine, EngineInfo, GenerationRequest
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.kinds import ENGINES, Capabilities, EngineKind, capabilities

__all__ = [
    "ENGINES",
    "Capabilities",
    "Completion",
    "Engine",
    "EngineInfo",
    "EngineKind",
    "GenerationRequest",
    "capabilities",
    "create_engine",
]


def create_engine(config: EngineConfig, **options: Any) -> Engine:
    """The engine for `config.kind`; heavy libraries are imported here, not at package import."""
    return ENGINES.get(config.kind).load(config, **options)
