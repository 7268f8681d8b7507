"""Writing a matplotlib figure the way every plansim chart is written: an SVG (no timestamp, so it is reproducible)
with a PNG beside it, or a PNG alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["save_figure"]


def save_figure(fig: Any, path: str | Path) -> list[Path]:
    """Lay out ``fig`` and write it to ``path``: with a ``.svg`` path an SVG plus a PNG beside it, else a PNG.
    Returns the paths written."""
    path = Path(path)
    fig.tight_layout()
    written = []
    if path.suffix.lower() == ".svg":
        fig.savefig(path, format="svg", metadata={"Date": None})
        written.append(path)
        path = path.with_suffix(".png")
    fig.savefig(path, format="png")
    written.append(path)
    return written
