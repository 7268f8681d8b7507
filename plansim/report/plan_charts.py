"""The planner's charts, from its finalists' DataFrame (``PlanResult.frame``): the step time broken down by part,
and peak memory against the device's capacity. Matplotlib (Agg, no pyplot state) is imported here only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plansim.report.figures import bar_figure, save_figure, stacked_barh
from plansim.units import GB

__all__ = ["memory_chart", "time_chart"]

_PARTS = ("compute", "recompute", "exposed_comm", "bubble", "optimizer")


def _labels(frame: Any) -> list[str]:
    return [
        f"#{int(r)} {s}" if role == "finalist" else f"Megatron-style: {s}"
        for r, role, s in zip(frame["rank"], frame["role"], frame["strategy"], strict=True)
    ]


def time_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Stacked horizontal bars: each finalist's step time by part (ms), best at the top."""
    fig, (ax,) = bar_figure(len(frame))
    stacked_barh(
        ax, _labels(frame), {p.replace("_", " "): [float(v) * 1e3 for v in frame[f"time_{p}_s"]] for p in _PARTS}
    )
    ax.set_xlabel("step time (ms)")
    ax.set_title(f"{title}: step time by part", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(_PARTS), frameon=False)
    ax.tick_params(axis="y", labelsize=7)
    return save_figure(fig, path)


def memory_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Horizontal bars: each finalist's peak memory (GB) against the device's capacity (dashed line)."""
    fig, (ax,) = bar_figure(len(frame))
    labels = _labels(frame)[::-1]
    peaks = [float(v) / GB for v in frame["peak_memory_bytes"]][::-1]
    ax.barh(labels, peaks, color="C0")
    capacity = float(frame["memory_capacity_bytes"].iloc[0]) / GB
    ax.axvline(capacity, color="C3", ls="--", lw=1.2, label=f"capacity {capacity:.0f} GB")
    ax.set_xlabel("peak memory on the worst GPU (GB)")
    ax.set_title(f"{title}: memory", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    ax.tick_params(axis="y", labelsize=7)
    return save_figure(fig, path)
