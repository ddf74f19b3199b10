"""Matplotlib, set up once for every plot longmoe writes: the Agg backend (files only, no display), and
imported lazily so commands that never plot do not pay for matplotlib's import; ``save_figure`` writes
a finished figure and frees it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend: plots are written to files, never shown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Lay ``fig`` out, write it to ``path`` (its folder made), close it; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=dpi)
    pyplot().close(fig)
    return p
