"""The comparison charts of ``plansim compare``, made from ``Comparison.frame()`` / ``scaling_frame()`` (and, for
the timeline, the discrete-event engine's spans): step time by part, memory by category against each device's
capacity, communication by kind and by link tier, the pipeline timeline (Gantt), and throughput against GPU count.
Matplotlib (Agg, no pyplot state) is imported only here and in ``figures``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plansim.report.figures import bar_figure, save_figure, stacked_barh
from plansim.units import GB

__all__ = ["communication_chart", "memory_chart", "scaling_chart", "time_chart", "timeline_chart"]

_PARTS = ("compute", "recompute", "exposed_comm", "bubble", "optimizer")
_MEMORY = ("weights", "gradients", "optimizer", "activations", "workspace")
_KINDS = ("dp", "tp", "pp", "zero")
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


def _legend(ax: Any, columns: int) -> None:
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=columns, frameon=False)


def time_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Stacked horizontal bars: each run's step time by part (ms)."""
    fig, (ax,) = bar_figure(len(frame))
    series = {p.replace("_", " "): [float(v) * 1e3 for v in frame[f"time_{p}_s"]] for p in _PARTS}
    stacked_barh(ax, list(frame["label"]), series)
    ax.set_xlabel("step time (ms)")
    ax.set_title(f"{title}: step time by part", fontsize=10)
    _legend(ax, len(_PARTS))
    ax.tick_params(axis="y", labelsize=7)
    return save_figure(fig, path)


def memory_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Stacked horizontal bars: each run's worst-GPU memory by category (GB), with its device's capacity marked."""
    fig, (ax,) = bar_figure(len(frame))
    labels = list(frame["label"])
    series = {k: [float(v) / GB for v in frame[f"mem_{k}_bytes"]] for k in _MEMORY}
    stacked_barh(ax, labels, series)
    capacity = [float(v) / GB for v in frame["memory_capacity_bytes"]][::-1]
    ax.scatter(capacity, labels[::-1], marker="|", s=600, color="black", zorder=3, label="device capacity")
    ax.set_xlim(0, max(capacity) * 1.05)
    ax.set_xlabel("memory on the worst GPU (GB)")
    ax.set_title(f"{title}: memory against capacity", fontsize=10)
    _legend(ax, len(_MEMORY) + 1)
    ax.tick_params(axis="y", labelsize=7)
    return save_figure(fig, path)


def communication_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Left: bytes one GPU sends per step, by kind (GB, stacked). Right (discrete-event runs): bytes per step on
    the busiest link of each tier (GB, one bar per tier)."""
    tiers = [c for c in frame.columns if c.startswith("tier_") and c.endswith("_bytes")]
    fig, axes = bar_figure(len(frame), columns=2 if tiers else 1, width=14 if tiers else 10)
    labels = list(frame["label"])
    ax = axes[0]
    stacked_barh(ax, labels, {k: [float(v) / GB for v in frame[f"comm_{k}_bytes"]] for k in _KINDS})
    ax.set_xlabel("sent per GPU per step (GB)")
    ax.set_title(f"{title}: communication by kind", fontsize=10)
    _legend(ax, len(_KINDS))
    ax.tick_params(axis="y", labelsize=7)
    if tiers:
        ax = axes[1]
        n = len(tiers)
        height = 0.8 / n
        for k, col in enumerate(tiers):
            values = [0.0 if v != v else float(v) / GB for v in frame[col]][::-1]  # NaN: no such tier in that run
            ys = [i - 0.4 + height * (k + 0.5) for i in range(len(labels))]
            ax.barh(ys, values, height=height, color=f"C{k}", label=col[len("tier_") : -len("_bytes")])
        ax.set_yticks(range(len(labels)), labels[::-1])
        ax.set_xlabel("on the busiest link of the tier, per step (GB)")
        ax.set_title("by link tier (discrete-event engine)", fontsize=10)
        _legend(ax, n)
        ax.tick_params(axis="y", labelsize=7)
    return save_figure(fig, path)


def timeline_chart(runs: Sequence[tuple[str, Any]], path: str | Path, title: str) -> list[Path]:
    """A Gantt chart per run (``(label, timeline)``; the discrete-event engine's): one row per pipeline stage for
    its compute stream and one for its communication streams, bars coloured by the kind of work."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    panels = [(label, _stage_rows(timeline)) for label, timeline in runs]
    heights = [max(2.0, 0.35 * len(rows) + 1.0) for _, rows in panels]
    fig = Figure(figsize=(14, sum(heights) + 0.8), dpi=120)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(len(panels), 1, height_ratios=heights)
    seen: set[str] = set()
    for k, (label, rows) in enumerate(panels):
        ax = fig.add_subplot(grid[k])
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
        ax.set_xlabel("time in the step (s)", fontsize=8)
    handles = [Patch(color=c, label=k.replace("_", " ")) for k, c in _CATEGORY_COLOURS.items() if k in seen]
    inches = sum(heights) + 0.8
    fig.suptitle(f"{title}: timeline", fontsize=10, y=1 - 0.05 / inches, va="top")
    fig.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.3 / inches), ncol=len(handles), fontsize=8,
        frameon=False,
    )  # fmt: skip
    return save_figure(fig, path, top=1 - 0.65 / inches)


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


def scaling_chart(frame: Any, path: str | Path, title: str) -> list[Path]:
    """Throughput (tokens/s) against GPU count per run, with linear scaling from each run's smallest count dashed;
    points that do not fit are crosses, counts that could not run are left out."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for k, (label, points) in enumerate(frame[frame["tokens_per_s"].notna()].groupby("label", sort=False)):
        points = points.sort_values("gpus")
        gpus, rate = list(points["gpus"]), [float(v) for v in points["tokens_per_s"]]
        fits = [bool(v) for v in points["fits"]]
        colour = f"C{k}"
        ax.plot(gpus, rate, "-", color=colour, label=label)
        ax.plot([g for g, f in zip(gpus, fits, strict=True) if f], [r for r, f in zip(rate, fits, strict=True) if f],
                "o", color=colour)  # fmt: skip
        ax.plot(
            [g for g, f in zip(gpus, fits, strict=True) if not f],
            [r for r, f in zip(rate, fits, strict=True) if not f],
            "x", color=colour, markersize=9,
        )  # fmt: skip
        ax.plot(gpus, [rate[0] * g / gpus[0] for g in gpus], "--", color=colour, alpha=0.4, lw=1)
    from matplotlib.ticker import ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s")
    engines = ", ".join(sorted({str(e) for e in frame["engine"].dropna()}))
    ax.set_title(f"{title}: throughput against GPU count ({engines}; dashed: linear; x: does not fit)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, path)
