"""The planner's charts, from its finalists' DataFrame (``PlanResult.frame``): the step time broken down by part,
and peak memory against the device's capacity. ``*_figure`` returns the matplotlib Figure (``report.figures``: Agg,
no pyplot state), ``*_chart`` writes it; matplotlib is imported here and there only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plansim.report.figures import bar_figure, legend_right, nonzero_series, save_figure, stacked_barh
from plansim.step.result import TIME_PARTS as _PARTS
from plansim.units import GB

__all__ = ["memory_chart", "memory_figure", "time_chart", "time_figure"]


def _labels(frame: Any) -> list[str]:
    return [
        f"#{int(r)} {s}" if role == "finalist" else f"Megatron-style: {s}"
        for r, role, s in zip(frame["rank"], frame["role"], frame["strategy"], strict=True)
    ]


def time_figure(frame: Any, title: str) -> Any:
    """Stacked horizontal bars: each finalist's step time by part (ms), best at the top; parts that are zero for
    every finalist are left out."""
    fig, (ax,) = bar_figure(len(frame))
    series = {
        p.replace("_", " "): [float(v) * 1e3 for v in frame[f"time_{p}_s"]] for p in _PARTS if f"time_{p}_s" in frame
    }
    colours = {p.replace("_", " "): f"C{k}" for k, p in enumerate(_PARTS)}
    stacked_barh(ax, _labels(frame), nonzero_series(series), colours)
    ax.set_xlabel("step time (ms)")
    ax.set_title(f"{title}: step time by part", fontsize=10)
    legend_right(ax)
    ax.tick_params(axis="y", labelsize=7)
    return fig


def time_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Write ``time_figure`` to ``path`` (``figures.save_figure``)."""
    return save_figure(time_figure(frame, title), path)


def memory_figure(frame: Any, title: str) -> Any:
    """Horizontal bars: each finalist's peak memory (GB) against the device's capacity (dashed line)."""
    fig, (ax,) = bar_figure(len(frame))
    labels = _labels(frame)[::-1]
    peaks = [float(v) / GB for v in frame["peak_memory_bytes"]][::-1]
    ax.barh(range(len(labels)), peaks, color="C0")
    ax.set_yticks(range(len(labels)), labels)
    capacity = float(frame["memory_capacity_bytes"].iloc[0]) / GB
    ax.axvline(capacity, color="C3", ls="--", lw=1.2, label=f"capacity {capacity:.0f} GB")
    ax.set_xlabel("peak memory on the worst GPU (GB)")
    ax.set_title(f"{title}: memory", fontsize=10)
    legend_right(ax)
    ax.tick_params(axis="y", labelsize=7)
    return fig


def memory_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Write ``memory_figure`` to ``path``."""
    return save_figure(memory_figure(frame, title), path)
