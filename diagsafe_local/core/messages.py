"""A chat message: the unit every conversation, engine request and judge input is made of."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant"] = Field(description="Who speaks.")
    content: str = Field(description="What they say.")
