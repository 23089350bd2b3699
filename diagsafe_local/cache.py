"""Where diagsafe-local keeps downloads and prepared data."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """DIAGSAFE_CACHE if set, else ~/.cache/diagsafe-local."""
    return Path(os.environ.get("DIAGSAFE_CACHE", Path.home() / ".cache" / "diagsafe-local"))
