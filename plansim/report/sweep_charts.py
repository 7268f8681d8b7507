"""The scaling charts of ``plansim sweep``, made from ``Sweep.frame()``: tokens/s and MFU of each point's winner
against the GPU count, one line per model x hardware (x sequence length, where the sweep has several), one panel per
global batch (strong scaling: the batch is held along a line). Points where nothing fits are left out of the lines.
``scaling_figure`` returns the matplotlib Figure (``report.figures``: Agg, no pyplot state), ``scaling_chart``
writes it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plansim.report.figures import fitted_legend, new_figure, save_figure

__all__ = ["METRICS", "scaling_chart", "scaling_figure", "sweep_charts"]

#: Column -> (axis label, log scale, how a value is shown on the axis) of each chart.
METRICS: dict[str, tuple[str, bool, float]] = {
    "tokens_per_s": ("tokens/s", True, 1.0),
    "mfu": ("MFU (%)", False, 100.0),
}
#: Panels per row of a chart.
MAX_COLUMNS = 4


def sweep_charts(frame: Any, directory: str | Path, title: str) -> list[Path]:
    """Write one chart per metric of ``METRICS`` (``scaling_<metric>.svg`` and ``.png``) into ``directory``;
    returns the paths written (none when no point fits)."""
    if not frame["fits"].any():
        return []
    written: list[Path] = []
    for metric in METRICS:
        written += scaling_chart(frame, metric, Path(directory) / f"scaling_{metric}.svg", title)
    return written


def scaling_figure(frame: Any, metric: str, title: str) -> Any:
    """``metric`` of each fitting point against its GPU count: a panel per global batch, a line (same colour in
    every panel) per model x hardware, log2 GPU axis; one legend below the panels, as many columns as fit."""
    from matplotlib.ticker import EngFormatter, ScalarFormatter

    label, log, scale = METRICS[metric]
    fitting = frame[frame["fits"]]
    batches = sorted(int(b) for b in fitting["global_batch"].unique())
    several = "seq_len" in frame and frame["seq_len"].nunique() > 1  # a frame of an older sweep has no lengths
    keys = ["model", "seq_len", "hardware"] if several else ["model", "hardware"]
    lines = list(dict.fromkeys(_line(frame, keys)))  # grid order
    colours = {line: f"C{k % 10}" for k, line in enumerate(lines)}
    columns = min(MAX_COLUMNS, len(batches))
    rows = math.ceil(len(batches) / columns)
    fig = new_figure(4.2 * columns + 1.0, 3.4 * rows + 1.4)
    axes = [fig.add_subplot(rows, columns, k + 1) for k in range(len(batches))]
    for ax, batch in zip(axes, batches, strict=True):
        panel = fitting[fitting["global_batch"] == batch]
        for line, points in panel.groupby(_line(panel, keys), sort=False):
            points = points.sort_values("gpus")
            ax.plot(
                list(points["gpus"]), [float(v) * scale for v in points[metric]], "o-", ms=4,
                color=colours[line], label=line,
            )  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))
            ax.yaxis.set_minor_formatter(EngFormatter(sep=""))
        ax.set_title(f"global batch {batch:,}", fontsize=9)
        ax.set_xlabel("GPUs", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(which="both", labelsize=7)
        ax.grid(True, which="both", alpha=0.3)
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(name, handle)
    engines = ", ".join(sorted({str(e) for e in fitting["engine"]}))
    fig.suptitle(f"{title}: {label} of the best plan against GPU count ({engines})", fontsize=10)
    fitted_legend(
        fig, list(handles.values()), list(handles), columns=4, loc="outside lower center", fontsize=8, frameon=False
    )
    return fig


def _line(frame: Any, keys: list[str]) -> Any:
    """Each row's line (a Series on the frame's index): ``model @ hardware``, with ``s<seq_len>`` after the model
    where ``keys`` hold the length (a model without one, a cnn, has none)."""
    import pandas as pd

    lengths = frame["seq_len"] if "seq_len" in keys else [None] * len(frame)
    names = [
        f"{model}{'' if pd.isna(length) else f' s{int(length)}'} @ {hardware}"
        for model, length, hardware in zip(frame["model"], lengths, frame["hardware"], strict=True)
    ]
    return pd.Series(names, index=frame.index)


def scaling_chart(frame: Any, metric: str, path: str | Path, title: str) -> list[Path]:
    """Write ``scaling_figure`` to ``path`` (``figures.save_figure``)."""
    return save_figure(scaling_figure(frame, metric, title), path)
