"""What ``plansim validate`` writes into its output folder:

- ``measured.csv``: the raw measurements (enough to predict them again: ``plansim validate --from DIR``);
- ``validation.csv``: one row per configuration with predicted and measured step time and peak memory and the errors;
- ``predicted_vs_measured.png`` / ``.svg``: two panels, each point a configuration against the diagonal and the
  target band;
- ``summary.json`` and ``summary.md``: MAPE and the worst error of each figure, the targets, the environment and the
  exact command.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from plansim.validation.compare import TARGETS, Summary

__all__ = ["chart_figure", "summary_text", "write_chart", "write_report"]


#: Units for an axis, largest first: (name, size in the column's unit). Bytes in binary units, seconds in SI.
_BYTE_UNITS = (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10))
_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6))


def _unit(values: pd.Series, units: tuple[tuple[str, float], ...]) -> tuple[str, float]:
    """The largest unit in which the values' middle (the geometric mean of the smallest and the largest) is at
    least 1, so that the numbers on the axis read plainly (the smallest unit when none is)."""
    positive = values[values > 0]
    middle = math.sqrt(float(positive.min()) * float(positive.max())) if len(positive) else 1.0
    return next(((name, size) for name, size in units if middle >= size), units[-1])


def _plain(value: float, _position: int) -> str:
    """A tick label without exponents: 0.5, 3, 20, 1500."""
    return f"{value:,.6g}"


def chart_figure(frame: pd.DataFrame, title: str) -> Any:
    """Predicted against measured step time and peak memory, log-log, with y = x and the target bands; each axis in
    the unit that keeps its numbers plain (GiB, MiB or KiB; s, ms or us)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from plansim.report.figures import new_figure

    fig = new_figure(11, 4.8)
    axes = [fig.add_subplot(1, 2, k + 1) for k in range(2)]
    panels = (
        ("step time", "measured_step_time_s", "predicted_step_time_s", TARGETS["step_time_mape"], _TIME_UNITS),
        ("peak memory", "measured_peak_memory_bytes", "predicted_peak_memory_bytes",
         TARGETS["peak_memory_max_abs_error"], _BYTE_UNITS),
    )  # fmt: skip
    for ax, (what, measured, predicted, band, units) in zip(axes, panels, strict=True):
        unit, scale = _unit(pd.concat([frame[measured], frame[predicted]]), units)
        x, y = frame[measured] / scale, frame[predicted] / scale
        low, high = min(x.min(), y.min()) / 1.3, max(x.max(), y.max()) * 1.3
        line = pd.Series([low, high])
        ax.plot(line, line, color="black", lw=1, label="predicted = measured")
        ax.fill_between(line, line * (1 - band), line * (1 + band), color="tab:green", alpha=0.15,
                        label=f"within {band:.0%}")  # fmt: skip
        for remat, marker in (("none", "o"), ("selective", "s"), ("full", "^")):
            chosen = frame["remat"] == remat
            if chosen.any():
                ax.scatter(x[chosen], y[chosen], marker=marker, s=36, label=f"remat {remat}", zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(_plain))
            if high / low < 30:  # under a decade and a half, label 2x and 5x too; else only the powers of ten
                axis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
                axis.set_minor_formatter(FuncFormatter(_plain))
            else:
                axis.set_minor_formatter(NullFormatter())
        ax.tick_params(which="both", labelsize=8)
        ax.set_xlabel(f"measured {what} ({unit})")
        ax.set_ylabel(f"predicted {what} ({unit})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return fig


def write_chart(frame: pd.DataFrame, out: Path, title: str) -> list[Path]:
    """``chart_figure`` as predicted_vs_measured.svg and .png in ``out`` (``report.figures.save_figure``)."""
    from plansim.report.figures import save_figure

    return save_figure(chart_figure(frame, title), out / "predicted_vs_measured.svg")


def summary_text(frame: pd.DataFrame, summary: Summary, context: dict[str, Any]) -> str:
    """The summary as Markdown: the figures against the targets, then every row."""
    lines = [
        f"# plansim validation: {context.get('device_name', '?')}",
        "",
        f"- command: `{context.get('command', '')}`",
        f"- kernel costs: {frame['cost_model'].iloc[0] if len(frame) else '?'}",
        f"- configurations: {summary.configs}",
        f"- step time: MAPE {summary.step_time_mape:.1%}, worst {summary.step_time_max_abs_error:.1%} "
        f"(target: MAPE <= {TARGETS['step_time_mape']:.0%})",
        f"- peak memory: MAPE {summary.peak_memory_mape:.1%}, worst {summary.peak_memory_max_abs_error:.1%} "
        f"(target: every row within {TARGETS['peak_memory_max_abs_error']:.0%})",
        f"- targets met: {'yes' if summary.meets_targets else 'no'}",
        *(
            [
                "- device cpu: step times are measured on the CPU but predicted for the GPU of --hardware, so only the "
                "peak memory is comparable"
            ]
            if context.get("environment", {}).get("device") == "cpu"
            else []
        ),
        "",
        "| configuration | predicted step (s) | measured step (s) | error | predicted peak (GB) | measured peak (GB) "
        "| error |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in frame.itertuples(index=False):
        lines.append(
            f"| {row.config} | {row.predicted_step_time_s:.4g} | {row.measured_step_time_s:.4g} "
            f"| {row.step_time_error:+.1%} | {row.predicted_peak_memory_bytes / 1e9:.3f} "
            f"| {row.measured_peak_memory_bytes / 1e9:.3f} | {row.peak_memory_error:+.1%} |"
        )
    return "\n".join(lines) + "\n"


def write_report(
    frame: pd.DataFrame, summary: Summary, out: Path, context: dict[str, Any], copies: dict[str, str] | None = None
) -> list[Path]:
    """validation.csv, the chart, summary.json and summary.md in ``out``, with ``copies`` (file name -> text: the
    measurements, when the report goes to another folder than theirs), all or none
    (``plansim.files.outputs.staged_folder``)."""
    from plansim.files.outputs import staged_folder

    with staged_folder(out) as stage:
        d = stage.path
        for name, text in (copies or {}).items():
            (d / name).write_text(text, encoding="utf-8")
        written = [d / name for name in copies or {}]
        written.append(d / "validation.csv")
        frame.to_csv(written[-1], index=False)
        written += write_chart(frame, d, f"plansim against real steps on {context.get('device_name', '?')}")
        (d / "summary.json").write_text(json.dumps({**summary.to_dict(), **context}, indent=2) + "\n", encoding="utf-8")
        (d / "summary.md").write_text(summary_text(frame, summary, context), encoding="utf-8")
        files = stage.final([*written, d / "summary.json", d / "summary.md"])
    return files
