"""Matplotlib, set up once for every plot longmoe writes: the Agg backend (files only, no display), and
imported lazily so commands that never plot do not pay for matplotlib's import."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend: plots are written to files, never shown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
