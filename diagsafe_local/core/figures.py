"""One way to draw a figure file: matplotlib off-screen (no display on a compute node), one axes, laid out and
written as PNG. No pyplot: a bare `Figure` draws on Agg without a backend or a global figure list (nothing to
close, so a long report run piles no figures up), and pyplot's import is not paid."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@contextmanager
def png_figure(path: Path, size: tuple[float, float], dpi: int = 120) -> Iterator[Axes]:
    """Axes to draw on; on leaving the block the figure is written to `path` as a PNG of `size` inches."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    ax = fig.subplots()
    yield ax
    fig.tight_layout()
    fig.set_layout_engine(None)  # laid out once: with no engine left, savefig draws the figure once, not twice
    fig.savefig(path, format="png", dpi=dpi)
