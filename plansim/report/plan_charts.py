"""The planner's charts, from its finalists' DataFrame (``PlanResult.frame``): the step time broken down by part
beside each plan's distance from the best, and peak memory by category against the device's capacity.
``*_figure`` returns the matplotlib Figure (``report.figures``: Agg, no pyplot state), ``*_chart`` writes it;
matplotlib is imported here and there only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plansim.report.figures import bar_figure, legend_right, nonzero_series, save_figure, stacked_barh
from plansim.step.result import MEMORY_CATEGORIES as _CATEGORIES
from plansim.step.result import TIME_PARTS as _PARTS
from plansim.units import GB, GiB

__all__ = ["capacity_label", "memory_chart", "memory_figure", "time_chart", "time_figure"]


def _labels(frame: Any) -> list[str]:
    return [
        f"#{int(r)} {s}" if role == "finalist" else f"Megatron-style: {s}"
        for r, role, s in zip(frame["rank"], frame["role"], frame["strategy"], strict=True)
    ]


def capacity_label(capacity_bytes: float) -> str:
    """A device's capacity in the SI gigabytes every plansim figure uses, with the binary gibibytes its maker
    states it in where those are whole (an 80 GiB A100 or H100: ``85.9 GB (80 GiB)``).

    >>> capacity_label(80 * 2**30), capacity_label(141e9)
    ('85.9 GB (80 GiB)', '141.0 GB')
    """
    gib = capacity_bytes / GiB
    exact = f" ({gib:.0f} GiB)" if abs(gib - round(gib)) < 1e-9 else ""
    return f"{capacity_bytes / GB:.1f} GB{exact}"


def time_figure(frame: Any, title: str) -> Any:
    """Left: each plan's step time by part (ms, stacked from 0), best at the top; parts that are zero for every plan
    are left out. Right: how much longer each plan's step takes than the best's (%), on an axis of its own, so
    that gaps of a fraction of a percent, invisible against whole step times, show."""
    fig, (ax, gap_ax) = bar_figure(len(frame), columns=2, width=14, sharey=True)
    series = {
        p.replace("_", " "): [float(v) * 1e3 for v in frame[f"time_{p}_s"]] for p in _PARTS if f"time_{p}_s" in frame
    }
    colours = {p.replace("_", " "): f"C{k}" for k, p in enumerate(_PARTS)}
    labels = _labels(frame)
    stacked_barh(ax, labels, nonzero_series(series), colours)
    ax.set_xlabel("step time (ms)")
    ax.set_title(f"{title}: step time by part", fontsize=10)
    ax.tick_params(axis="y", labelsize=7)
    steps = [float(v) for v in frame["step_time_s"]]
    best = min(steps)
    gaps = [100.0 * (t / best - 1.0) for t in steps]
    positions = list(range(len(labels)))[::-1]
    gap_ax.barh(positions, gaps, color="0.45")
    for y, g, t in zip(positions, gaps, steps, strict=True):
        gap_ax.annotate(f"{t * 1e3:,.1f} ms (+{g:.2f}%)", (g, y), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=7)  # fmt: skip
    gap_ax.set_xlim(0, max(max(gaps), 0.01) * 1.6)  # room for the labels
    gap_ax.set_xlabel("step time above the best (%)")
    gap_ax.set_title("distance from the best", fontsize=10)
    legend_right(gap_ax, handles=ax.get_legend_handles_labels()[0], labels=ax.get_legend_handles_labels()[1])
    return fig


def time_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Write ``time_figure`` to ``path`` (``figures.save_figure``)."""
    return save_figure(time_figure(frame, title), path)


def memory_figure(frame: Any, title: str) -> Any:
    """Horizontal bars: each plan's peak memory on its worst GPU by category (GB, stacked), against the device's
    capacity (dashed line)."""
    fig, (ax,) = bar_figure(len(frame))
    series = {c.replace("_", " "): [float(v) / GB for v in frame[f"mem_{c}_bytes"]] for c in _CATEGORIES
              if f"mem_{c}_bytes" in frame}  # fmt: skip
    colours = {c.replace("_", " "): f"C{k}" for k, c in enumerate(_CATEGORIES)}
    stacked_barh(ax, _labels(frame), nonzero_series(series), colours)
    capacity = float(frame["memory_capacity_bytes"].iloc[0])
    ax.axvline(capacity / GB, color="k", ls="--", lw=1.2, label=f"capacity {capacity_label(capacity)}")
    ax.set_xlabel("peak memory on the worst GPU (GB)")
    ax.set_title(f"{title}: memory at the peak by category", fontsize=10)
    legend_right(ax)
    ax.tick_params(axis="y", labelsize=7)
    return fig


def memory_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Write ``memory_figure`` to ``path``."""
    return save_figure(memory_figure(frame, title), path)
