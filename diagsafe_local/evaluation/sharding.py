"""Deterministic sharding by item id: the same item lands in the same shard on every machine and rerun."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core.errors import DiagsafeError


class Shard(BaseModel):
    """Shard `index` of `count` (0-based)."""

    model_config = ConfigDict(frozen=True)

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
        if not match or not 0 <= int(match[1]) < int(match[2]):
            raise DiagsafeError(f"--shard expects i/N with 0 <= i < N, got '{text}'")
        return cls(index=int(match[1]), count=int(match[2]))

    def owns(self, item_id: str) -> bool:
        return shard_of(item_id, self.count) == self.index

    def directory(self, output_dir: str | Path) -> Path:
        return Path(output_dir) / "shards" / f"shard-{self.index:04d}-of-{self.count:04d}"


def shard_of(item_id: str, count: int) -> int:
    """The shard (0..count-1) an item id belongs to: a hash, not Python's salted hash()."""
    return int.from_bytes(hashlib.sha256(item_id.encode()).digest()[:8], "big") % count
