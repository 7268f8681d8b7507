"""The comparison charts of ``plansim compare``, made from ``Comparison.frame()`` / ``scaling_frame()`` (and, for
the timeline, the discrete-event engine's spans): step time by part, memory by category against each device's
capacity, communication by kind and by link tier, the pipeline timeline (Gantt), and throughput against GPU count.
Each ``*_figure`` function returns the matplotlib Figure (Agg, no pyplot state: ``report.figures``), each
``*_chart`` function writes it. Series that are zero in every run are left out of the bars and the legends."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plansim.report.figures import (
    bar_figure,
    fitted_legend,
    legend_right,
    new_figure,
    nonzero_series,
    save_figure,
    stacked_barh,
)
from plansim.step.result import MEMORY_CATEGORIES as _MEMORY
from plansim.step.result import TIME_PARTS as _PARTS
from plansim.strategy.mesh import COMM_KINDS
from plansim.units import GB

__all__ = [
    "communication_chart",
    "communication_figure",
    "memory_chart",
    "memory_figure",
    "scaling_chart",
    "scaling_figure",
    "time_chart",
    "time_figure",
    "timeline_chart",
    "timeline_figure",
]

#: Gantt colours by task category (the lowering's categories), one hue per kind of work.
_CATEGORY_COLOURS = {
    "forward": "C0",
    "backward": "C1",
    "weight_grad": "C9",
    "recompute": "C4",
    "optimizer": "C7",
    "tp_comm": "C2",
    "send": "C3",
    "grad_reduce": "C5",
    "param_gather": "C6",
    "embedding_sync": "C8",
}
#: Most pipeline stages drawn per run in the timeline (evenly picked, first and last included).
MAX_TIMELINE_STAGES = 16


def _colours(names: tuple[str, ...]) -> dict[str, str]:
    """One colour per possible series (C0, C1, ...), kept when some are left out."""
    return {name.replace("_", " "): f"C{k}" for k, name in enumerate(names)}


def time_figure(frame: Any, title: str) -> Any:
    """Stacked horizontal bars: each run's step time by part (ms)."""
    fig, (ax,) = bar_figure(len(frame))
    series = {
        p.replace("_", " "): [float(v) * 1e3 for v in frame[f"time_{p}_s"]] for p in _PARTS if f"time_{p}_s" in frame
    }
    stacked_barh(ax, list(frame["label"]), nonzero_series(series), _colours(_PARTS))
    ax.set_xlabel("step time (ms)")
    ax.set_title(f"{title}: step time by part", fontsize=10)
    legend_right(ax)
    ax.tick_params(axis="y", labelsize=7)
    return fig


def time_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Write ``time_figure`` to ``path`` (``figures.save_figure``)."""
    return save_figure(time_figure(frame, title), path)


def memory_figure(frame: Any, title: str) -> Any:
    """Stacked horizontal bars: each run's worst-GPU memory by category (GB), with its device's capacity marked."""
    fig, (ax,) = bar_figure(len(frame))
    labels = list(frame["label"])
    series = {k.replace("_", " "): [float(v) / GB for v in frame[f"mem_{k}_bytes"]] for k in _MEMORY}
    totals = stacked_barh(ax, labels, nonzero_series(series), _colours(_MEMORY))
    capacity = [float(v) / GB for v in frame["memory_capacity_bytes"]][::-1]
    ax.scatter(capacity, range(len(labels)), marker="|", s=600, color="black", zorder=3, label="device capacity")
    ax.set_xlim(0, max(*capacity, *totals) * 1.05)
    ax.set_xlabel("memory on the worst GPU (GB)")
    ax.set_title(f"{title}: memory against capacity", fontsize=10)
    legend_right(ax)
    ax.tick_params(axis="y", labelsize=7)
    return fig


def memory_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Write ``memory_figure`` to ``path``."""
    return save_figure(memory_figure(frame, title), path)


def communication_figure(frame: Any, title: str) -> Any:
    """Left: bytes one GPU sends per step, by kind (GB, stacked). Right (discrete-event runs): bytes per step
    through the busiest port of each link tier (GB, one bar per tier; ``Run.port_bytes``: a trunk between switches
    counts per port, so that every tier's bar is one physical port's traffic and reads against the others)."""
    tiers = [c for c in frame.columns if c.startswith("port_") and c.endswith("_bytes")]
    tiers = [c for c in tiers if any(v == v and v > 0 for v in frame[c])]  # a tier no run uses is left out
    fig, axes = bar_figure(len(frame), columns=2 if tiers else 1, width=14 if tiers else 10, sharey=True)
    labels = list(frame["label"])
    ax = axes[0]
    series = {k: [float(v) / GB for v in frame[f"comm_{k}_bytes"]] for k in COMM_KINDS}
    stacked_barh(ax, labels, nonzero_series(series), _colours(COMM_KINDS))
    ax.set_xlabel("sent per GPU per step (GB)")
    ax.set_title(f"{title}: communication by kind", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        legend_right(ax)
    ax.tick_params(axis="y", labelsize=7)
    if tiers:
        _tier_bars(axes[1], frame, tiers, len(labels))
    return fig


def _tier_bars(ax: Any, frame: Any, tiers: list[str], rows: int) -> None:
    """One bar per tier and run, on a log axis (a switch port's share of a trunk is a few GB where a GPU's NVLink
    carries hundreds: on a linear axis it would not show), each labelled with its GB."""
    n = len(tiers)
    height = 0.8 / n
    shown = []
    for k, col in enumerate(tiers):
        values = [0.0 if v != v else float(v) / GB for v in frame[col]][::-1]  # NaN: no such tier in that run
        ys = [i + 0.4 - height * (k + 0.5) for i in range(rows)]  # the first tier on top in each group
        kept = [(y, v) for y, v in zip(ys, values, strict=True) if v > 0]
        ax.barh([y for y, _ in kept], [v for _, v in kept], height=height, color=f"C{k}",
                label=col[len("port_") : -len("_bytes")])  # fmt: skip
        for y, v in kept:
            ax.annotate(f"{v:,.3g}", (v, y), xytext=(2, 0), textcoords="offset points", va="center", fontsize=6)
        shown += [v for _, v in kept]
    ax.set_xscale("log")
    if shown:
        ax.set_xlim(min(shown) / 3, max(shown) * 4)  # room for each bar's label
    ax.set_xlabel("through the busiest port of the tier, per step (GB, log scale)")
    ax.set_title("by link tier (discrete-event engine; switch trunks per port)", fontsize=10)
    legend_right(ax)


def communication_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Write ``communication_figure`` to ``path``."""
    return save_figure(communication_figure(frame, title), path)


def timeline_figure(runs: Sequence[tuple[str, Any]], title: str) -> Any:
    """A Gantt chart per run (``(label, timeline)``; the discrete-event engine's): one row per pipeline stage for
    its compute stream and one for its communication streams, bars coloured by the kind of work. Every panel has
    the same time axis (the longest step's), so runs compare by eye."""
    from matplotlib.patches import Patch

    panels = [(label, _stage_rows(timeline)) for label, timeline in runs]
    heights = [max(2.0, 0.35 * len(rows) + 1.0) for _, rows in panels]
    fig = new_figure(14, sum(heights) + 1.0)
    grid = fig.add_gridspec(len(panels), 1, height_ratios=heights)
    seen: set[str] = set()
    first = None
    for k, (label, rows) in enumerate(panels):
        ax = fig.add_subplot(grid[k], sharex=first)
        first = first or ax
        names = list(rows)
        for y, name in enumerate(names):
            for category, bars in rows[name].items():
                # rasterized: a step has up to a million spans, which as SVG paths would weigh tens of MB
                ax.broken_barh(
                    bars, (y - 0.4, 0.8), facecolors=_CATEGORY_COLOURS.get(category, "grey"), rasterized=True
                )
                seen.add(category)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.tick_params(axis="x", labelbottom=True)
        ax.set_xlabel("time in the step (s)", fontsize=8)
    if first is not None:
        first.set_xlim(left=0)
    handles = [Patch(color=c, label=k.replace("_", " ")) for k, c in _CATEGORY_COLOURS.items() if k in seen]
    fig.suptitle(f"{title}: timeline (one time axis for every run)", fontsize=10)
    if handles:
        labels = [str(h.get_label()) for h in handles]
        fitted_legend(fig, handles, labels, columns=1, loc="outside right upper", fontsize=8, frameon=False)
    return fig


def timeline_chart(runs: Sequence[tuple[str, Any]], path: str | Path, title: str) -> list[Path]:
    """Write ``timeline_figure`` to ``path``."""
    return save_figure(timeline_figure(runs, title), path)


def _stage_rows(timeline: Any) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """Row name -> category -> (start, duration) bars, two rows per drawn stage (compute, comm)."""
    by_device: dict[str, list[Any]] = defaultdict(list)
    for span in timeline.spans:
        by_device[span.device].append(span)
    devices = sorted(by_device, key=_stage_of)
    if len(devices) > MAX_TIMELINE_STAGES:
        step = (len(devices) - 1) / (MAX_TIMELINE_STAGES - 1)
        devices = [devices[round(i * step)] for i in range(MAX_TIMELINE_STAGES)]
    rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for device in devices:
        stage = f"stage {_stage_of(device)}"
        compute: dict[str, list[tuple[float, float]]] = defaultdict(list)
        comm: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for span in by_device[device]:
            lane = compute if span.stream == "compute" and span.category != "tp_comm" else comm
            lane[span.category].append((span.start_s, span.end_s - span.start_s))
        rows[f"{stage} compute"] = dict(compute)
        rows[f"{stage} comm"] = dict(comm)
    return rows


def _stage_of(device: str) -> int:
    """``gpu12 (stage 3)`` -> 3."""
    return int(device.rsplit("stage ", 1)[1].rstrip(")"))


def scaling_figure(frame: Any, title: str) -> Any:
    """Left: throughput (tokens/s) against GPU count, one line per curve (``Comparison.curve_names``: named by what
    stays fixed along it, since dp follows the GPU count), with linear scaling from each curve's first point dashed.
    Right: the scaling efficiency, each point's tokens/s per GPU over its curve's first point's (100 %: linear), on a
    linear axis where a log-log plot would draw every curve straight. Points that fit are filled, those that do not
    fit in memory hollow (a hollow ring never hides a filled point at the same place), and GPU counts where the
    strategy cannot run at all (tp x pp or the batch does not divide: ``scaling.csv`` says why) are triangles on the
    bottom edge."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator, ScalarFormatter

    fig = new_figure(13, 6.5)
    ax, eff = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    key = "curve" if "curve" in frame.columns else "label"
    edge = ax.get_xaxis_transform()  # x in data, y in axes fractions
    unrunnable = False
    for k, (label, points) in enumerate(frame.groupby(key, sort=False)):
        colour = f"C{k % 10}"
        points = points.sort_values("gpus")
        ran = points[points["tokens_per_s"].notna()]
        gpus, rate = list(ran["gpus"]), [float(v) for v in ran["tokens_per_s"]]
        fits = [bool(v) for v in ran["fits"]]
        if gpus:
            relative = [100.0 * (r / g) / (rate[0] / gpus[0]) for r, g in zip(rate, gpus, strict=True)]
            for axis, ys in ((ax, rate), (eff, relative)):
                axis.plot(gpus, ys, "-", color=colour, label=label if axis is ax else None, zorder=2)
                for fit, face in ((False, "none"), (True, colour)):  # hollow first, filled on top
                    pts = [(g, y) for g, y, f in zip(gpus, ys, fits, strict=True) if f is fit]
                    axis.plot([g for g, _ in pts], [y for _, y in pts], "o", color=colour, mfc=face,
                              ms=7 if fit else 10, mew=1.5, zorder=3 if fit else 2.5)  # fmt: skip
            ax.plot(gpus, [rate[0] * g / gpus[0] for g in gpus], "--", color=colour, alpha=0.4, lw=1)
        missing = [int(g) for g in points[points["tokens_per_s"].isna()]["gpus"]]
        if missing:
            unrunnable = True
            bottom = 0.025 + 0.03 * (k % 4)  # curves' marks a little apart where several cannot run
            ax.plot(missing, [bottom] * len(missing), "v", color=colour, ms=8, transform=edge, clip_on=False,
                    label=None if gpus else label)  # fmt: skip
    counts = sorted({int(g) for g in frame["gpus"]})
    for axis in (ax, eff):
        axis.set_xscale("log", base=2)
        axis.set_xticks(counts, minor=False)  # every count asked for, marked or not
        axis.xaxis.set_major_formatter(ScalarFormatter())
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xlabel("GPUs")
        axis.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("tokens/s")
    eff.axhline(100.0, color="grey", ls="--", lw=1, alpha=0.6)
    eff.set_ylabel("scaling efficiency (% of linear from the first point)")
    engines = ", ".join(sorted({str(e) for e in frame["engine"].dropna()}))
    ax.set_title(f"{title}: throughput against GPU count ({engines})", fontsize=10)
    eff.set_title("tokens/s per GPU against the curve's first point", fontsize=10)
    keys = [
        Line2D([], [], color="grey", marker="o", label="fits"),
        Line2D([], [], color="grey", marker="o", mfc="none", ms=10, ls="none", label="does not fit in memory"),
        Line2D([], [], color="grey", ls="--", alpha=0.6, label="linear from the first point"),
    ]
    if unrunnable:
        keys.append(Line2D([], [], color="grey", marker="v", ls="none", ms=8, label="cannot run at that count"))
    handles, names = ax.get_legend_handles_labels()
    labels = [*names, *(str(h.get_label()) for h in keys)]
    fitted_legend(fig, [*handles, *keys], labels, columns=2, loc="outside lower center", fontsize=7, frameon=False)
    return fig


def scaling_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Write ``scaling_figure`` to ``path``."""
    return save_figure(scaling_figure(frame, title), path)
