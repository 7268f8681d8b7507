"""The rematerialization trade-off chart: peak memory against recompute overhead, the MILP's curve over budgets and
each baseline's point. ``tradeoff_figure`` returns the matplotlib Figure (``report.figures``: Agg, no pyplot
state), ``tradeoff_chart`` writes it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plansim.report.figures import new_figure, save_figure
from plansim.units import GB

__all__ = ["tradeoff_chart", "tradeoff_figure"]

_MARKERS = {"none": "s", "full": "^", "selective": "D", "sqrt": "v", "greedy": "P"}


def tradeoff_chart(frame: Any, path: str | Path, title: str, *, budget_bytes: float | None = None) -> list[Path]:
    """Write ``tradeoff_figure`` to ``path``: a PNG, or with a ``.svg`` path an SVG plus a PNG beside it. Returns
    the paths written."""
    return save_figure(tradeoff_figure(frame, title, budget_bytes=budget_bytes), path)


def tradeoff_figure(frame: Any, title: str, *, budget_bytes: float | None = None) -> Any:
    """Draw ``frame`` (``plansim.remat.api.tradeoff_frame``: columns method, budget_bytes, feasible, peak_bytes,
    overhead and, for MILP rows, status) as a matplotlib Figure.

    x is the peak memory (GB), y the recompute overhead (% of the step's compute). The MILP is a line over its
    feasible budgets, proven-optimal points filled, time-limited ones hollow; a budget where it has no schedule is
    an x on the x axis (proven infeasible, or none found before the time limit); each baseline is one labeled point
    per distinct schedule (greedy may have several, one per budget); ``budget_bytes`` is a dashed vertical line.
    """
    fig = new_figure(8, 5)
    ax = fig.add_subplot()
    rows = frame[frame["peak_bytes"].map(_finite) & frame["overhead"].map(_finite)]

    milp = rows[(rows["method"] == "milp") & rows["feasible"].astype(bool)]
    cap = _cap(rows, milp)
    if len(milp):
        milp = milp.sort_values(["budget_bytes", "peak_bytes"])
        x, y = milp["peak_bytes"] / GB, milp["overhead"] * 100
        if cap is not None:  # a time-limited MILP far above everything else: draw it at the top edge, labeled
            for px, py in zip(x[y > cap], y[y > cap], strict=True):
                ax.annotate(
                    f"{py:,.0f}% ↑", (px, cap), textcoords="offset points", xytext=(6, -12), fontsize=8, color="C0"
                )
            y = y.clip(upper=cap)
        ax.plot(x, y, "-", color="C0", lw=1.5, zorder=2)
        proven = milp["status"] == "optimal" if "status" in milp.columns else milp["feasible"].astype(bool)
        ax.plot(x[proven], y[proven], "o", color="C0", ms=6, label="MILP (proven optimal)", zorder=3)
        if (~proven).any():
            ax.plot(
                x[~proven],
                y[~proven],
                "o",
                mfc="white",
                mec="C0",
                mew=1.5,
                ms=7,
                label="MILP (time limit, not proven)",
                zorder=3,
            )

    labels: dict[tuple[float, float], list[str]] = {}
    for k, (method, group) in enumerate((m, g) for m, g in rows.groupby("method", sort=False) if m != "milp"):
        pairs = zip(group["peak_bytes"], group["overhead"], strict=True)
        points = sorted({(round(p / GB, 6), round(o * 100, 6)) for p, o in pairs})
        ax.plot(
            [p for p, _ in points],
            [o for _, o in points],
            _MARKERS.get(str(method), "X"),
            color=f"C{k + 1}",
            ms=8,
            ls="none",
            label=str(method),
            zorder=4,
        )
        for point in points:
            labels.setdefault(point, []).append(str(method))
    for (px, py), names in labels.items():
        ax.annotate(", ".join(names), (px, py), textcoords="offset points", xytext=(6, 6), fontsize=8)

    _unscheduled(ax, frame)
    if budget_bytes is not None and math.isfinite(budget_bytes):
        ax.axvline(budget_bytes / GB, color="grey", ls="--", lw=1, label=f"budget {budget_bytes / GB:.3g} GB")
    ax.set_xlabel("peak activation memory per micro-batch (GB)")
    ax.set_ylabel("recompute overhead (% of the step's compute)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    bottom = min(0.0, ax.get_ylim()[0])
    ax.set_ylim(bottom, cap * 1.04 if cap is not None else None)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper right")
    return fig


def _unscheduled(ax: Any, frame: Any) -> None:
    """An x at each budget where the MILP has no schedule, labeled with why."""
    none = frame[(frame["method"] == "milp") & ~frame["feasible"].astype(bool)]
    if "status" not in none.columns:
        return
    for status, label, color in (
        ("infeasible", "MILP: no schedule fits (proven)", "C3"),
        ("no solution", "MILP: no schedule found in the time limit", "grey"),
    ):
        budgets = none[none["status"] == status]["budget_bytes"].map(float)
        if len(budgets):
            ax.plot(budgets / GB, [0.0] * len(budgets), "x", color=color, ms=9, mew=2, ls="none", label=label)


def _cap(rows: Any, milp: Any) -> float | None:
    """The y limit (%) that keeps a time-limited MILP point far above the baselines and the proven MILP points from
    flattening the chart; None when no point is that far above."""
    proven = milp[milp["status"] == "optimal"] if "status" in milp.columns else milp
    reference = [*rows[rows["method"] != "milp"]["overhead"], *proven["overhead"]]
    top = max((float(v) * 100 for v in reference), default=0.0)
    if top <= 0 or not len(milp) or float(milp["overhead"].max()) * 100 <= 1.5 * top:
        return None
    return 1.25 * top


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
