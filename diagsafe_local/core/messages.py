"""A chat message: the unit every conversation, engine request and judge input is made of."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str
