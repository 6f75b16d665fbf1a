"""One way to draw and save figures: matplotlib on the Agg backend (no display needed),
PNGs written atomically (temporary file renamed into place)."""

from __future__ import annotations

import io
import os
from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Lay out, render and atomically write ``fig`` as a PNG; closes the figure."""
    from bigrate.files import atomic_write_bytes

    plt = pyplot()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
