"""One way to draw a figure file: matplotlib off-screen (no display on a compute node), one axes, laid out and
written as PNG, the figure closed even when drawing fails (a long report run must not pile figures up)."""

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=dpi)
    finally:
        plt.close(fig)
