"""Files the commands ship with: the bundled samples, example configs and SLURM templates."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def data_file(name: str) -> Path:
    """A bundled data file (data/NAME): the HarmMetric Eval sample, the sample prompts."""
    return ROOT / "data" / name


def slurm_dir() -> Path:
    """The sbatch templates."""
    return ROOT / "slurm"
