"""Files the commands ship with: the bundled samples, example configs and SLURM templates.

They live at the top of the repository (`data/`, `configs/`, `slurm/`) and the build maps them into the
wheel as the package resources `diagsafe_local.bundled.*`, read here with importlib.resources. An editable
install of a checkout (`pip install -e .`) does not map them; there they are read from the checkout itself.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def bundled(kind: str, name: str) -> Path:
    """The bundled file `name` of `kind` ("data", "configs" or "slurm")."""
    try:
        return Path(str(importlib.resources.files(f"diagsafe_local.bundled.{kind}") / name))
    except ModuleNotFoundError:  # an editable install: the folders are at the top of the checkout
        return CHECKOUT / kind / name


def data_file(name: str) -> Path:
    """A bundled data file (data/NAME): the HarmMetric Eval sample, the sample prompts."""
    return bundled("data", name)


def slurm_file(name: str) -> Path:
    """An sbatch template (slurm/NAME)."""
    return bundled("slurm", name)
