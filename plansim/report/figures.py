"""Making and writing a matplotlib figure the way every plansim chart is made: an Agg canvas with no pyplot state,
laid out by matplotlib's constrained layout (titles, tick labels, axis labels and legends all kept inside the
figure), legends narrowed to the figure's width, series that are zero everywhere left out; written as an SVG with a
PNG beside it, or a PNG alone, each file whole (``plansim.files.outputs.atomic_path``) and the same bytes for the same
figure (no date in the metadata, a fixed ``svg.hashsalt`` for the SVG's clip-path and glyph ids, which are otherwise
random). Each chart module has a ``*_figure`` function returning the Figure and a ``*_chart`` function writing it
(``tests/test_chart_layout.py`` checks the Figures)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "SVG_HASH_SALT",
    "bar_figure",
    "fitted_legend",
    "legend_right",
    "new_figure",
    "nonzero_series",
    "save_figure",
    "stacked_barh",
    "write_figure",
]

#: matplotlib's ``svg.hashsalt``: ids in an SVG derive from it and the content, so equal figures give equal bytes.
SVG_HASH_SALT = "plansim"


def save_figure(fig: Any, path: str | Path, *, top: float = 1.0) -> list[Path]:
    """Lay out ``fig`` (unless it has a layout engine of its own, as every ``new_figure`` has: then ``top`` is
    unused; else its axes below ``top``, a fraction of its height, leaving room for a figure legend) and write it to
    ``path``: with a ``.svg`` path an SVG plus a PNG beside it, else a PNG. Returns the paths written."""
    path = Path(path)
    if fig.get_layout_engine() is None:
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

    from plansim.files.outputs import atomic_path

    path = Path(path)
    fmt = fmt or path.suffix.lstrip(".").lower() or "png"
    metadata = {"Date": None} if fmt in ("svg", "pdf") else {"Software": None} if fmt == "png" else None
    with rc_context({"svg.hashsalt": SVG_HASH_SALT}), atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, metadata=metadata, **savefig)
    return path


def new_figure(width: float, height: float) -> Any:
    """A figure (Agg canvas, no pyplot state, 120 dpi) under constrained layout, which keeps every title, label and
    legend inside it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def bar_figure(rows: int, *, columns: int = 1, width: float = 10.0, sharey: bool = False) -> tuple[Any, list[Any]]:
    """A figure tall enough for ``rows`` horizontal bars, with ``columns`` axes side by side (sharing the y axis
    when ``sharey``: the later ones then show no tick labels of their own)."""
    fig = new_figure(width, 1.6 + 0.45 * rows)
    axes = [fig.add_subplot(1, columns, 1)]
    for k in range(1, columns):
        axes.append(fig.add_subplot(1, columns, k + 1, sharey=axes[0] if sharey else None))
        if sharey:
            axes[-1].tick_params(axis="y", labelleft=False)
    return fig, axes


def nonzero_series(series: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """``series`` without the ones that are zero (or NaN) everywhere: a legend entry for them draws nothing."""
    return {name: list(values) for name, values in series.items() if any(v and v == v for v in values)}


def stacked_barh(
    ax: Any, labels: list[str], series: Mapping[str, Sequence[float]], colours: Mapping[str, str] | None = None
) -> list[float]:
    """Horizontal bars for ``labels`` (first at the top, at y = n-1 down to 0), stacked by ``series`` (name -> one
    value per label), coloured by ``colours`` (name -> colour; C0, C1, ... in order by default: pass the colours of
    every possible series so that one keeps its colour when ``nonzero_series`` drops others); returns the bar
    totals in label order."""
    positions = list(range(len(labels)))
    left = [0.0] * len(labels)
    for k, (name, values) in enumerate(series.items()):
        shown = list(values)[::-1]
        colour = colours[name] if colours else f"C{k}"
        ax.barh(positions, shown, left=left, color=colour, label=name)
        left = [a + b for a, b in zip(left, shown, strict=True)]
    ax.set_yticks(positions, labels[::-1])
    return left[::-1]


def legend_right(ax: Any, **kwargs: Any) -> Any:
    """The axes' legend beside it on the right, one column: it never sits on the axes' labels or data."""
    return ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kwargs)


def fitted_legend(fig: Any, handles: Sequence[Any], labels: Sequence[str], *, columns: int, **kwargs: Any) -> Any:
    """A figure legend (``fig.legend(handles, labels, **kwargs)``) with the most columns, up to ``columns``, with
    which it is no wider than ``fig``."""
    renderer = fig.canvas.get_renderer()
    for n in range(max(columns, 1), 0, -1):
        legend = fig.legend(list(handles), list(labels), ncols=n, **kwargs)
        if n == 1 or legend.get_window_extent(renderer).width <= 0.97 * fig.bbox.width:
            return legend
        legend.remove()
    raise AssertionError("unreachable")
