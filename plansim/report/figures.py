"""Writing a matplotlib figure the way every plansim chart is written: an SVG with a PNG beside it, or a PNG alone;
each file whole (``plansim.outputs.atomic_path``) and the same bytes for the same figure (no date in the metadata, a
fixed ``svg.hashsalt`` for the SVG's clip-path and glyph ids, which are otherwise random)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["SVG_HASH_SALT", "bar_figure", "save_figure", "stacked_barh", "write_figure"]

#: matplotlib's ``svg.hashsalt``: ids in an SVG derive from it and the content, so equal figures give equal bytes.
SVG_HASH_SALT = "plansim"


def save_figure(fig: Any, path: str | Path, *, top: float = 1.0) -> list[Path]:
    """Lay out ``fig`` (its axes below ``top``, a fraction of its height, leaving room for a figure legend) and
    write it to ``path``: with a ``.svg`` path an SVG plus a PNG beside it, else a PNG. Returns the paths written."""
    path = Path(path)
    fig.tight_layout(rect=(0, 0, 1, top))
    written = []
    if path.suffix.lower() == ".svg":
        written.append(write_figure(fig, path))
        path = path.with_suffix(".png")
    written.append(write_figure(fig, path, fmt="png"))
    return written


def write_figure(fig: Any, path: str | Path, *, fmt: str | None = None, **savefig: Any) -> Path:
    """``fig.savefig`` to ``path`` (format from ``fmt`` or the suffix), whole and reproducible: written under a
    temporary name and renamed, no date in the metadata, SVG ids from a fixed salt. Returns the path."""
    from matplotlib import rc_context

    from plansim.outputs import atomic_path

    path = Path(path)
    fmt = fmt or path.suffix.lstrip(".").lower() or "png"
    metadata = {"Date": None} if fmt in ("svg", "pdf") else {"Software": None} if fmt == "png" else None
    with rc_context({"svg.hashsalt": SVG_HASH_SALT}), atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, metadata=metadata, **savefig)
    return path


def bar_figure(rows: int, *, columns: int = 1, width: float = 10.0) -> tuple[Any, list[Any]]:
    """A figure (Agg canvas, no pyplot state) tall enough for ``rows`` horizontal bars, with ``columns`` axes side
    by side."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 1.6 + 0.45 * rows), dpi=120)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, columns, k + 1) for k in range(columns)]


def stacked_barh(ax: Any, labels: list[str], series: dict[str, list[float]]) -> list[float]:
    """Horizontal bars for ``labels`` (first at the top), stacked by ``series`` (name -> one value per label,
    colours C0, C1, ... in order); returns the bar totals in label order."""
    order = labels[::-1]
    left = [0.0] * len(labels)
    for k, (name, values) in enumerate(series.items()):
        shown = list(values)[::-1]
        ax.barh(order, shown, left=left, color=f"C{k}", label=name)
        left = [a + b for a, b in zip(left, shown, strict=True)]
    return left[::-1]
