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
from pathlib import Path
from typing import Any

import pandas as pd

from plansim.validation.compare import TARGETS, Summary

__all__ = ["summary_text", "write_chart", "write_report"]


def write_chart(frame: pd.DataFrame, out: Path, title: str) -> list[Path]:
    """Predicted against measured step time and peak memory, log-log, with y = x and the target bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    panels = (
        ("step time (s)", "measured_step_time_s", "predicted_step_time_s", TARGETS["step_time_mape"], 1.0),
        ("peak memory (GB)", "measured_peak_memory_bytes", "predicted_peak_memory_bytes",
         TARGETS["peak_memory_max_abs_error"], 1e9),
    )  # fmt: skip
    for ax, (what, measured, predicted, band, scale) in zip(axes, panels, strict=True):
        x, y = frame[measured] / scale, frame[predicted] / scale
        low, high = min(x.min(), y.min()) / 1.3, max(x.max(), y.max()) * 1.3
        line = pd.Series([low, high])
        ax.plot(line, line, color="black", lw=1, label="predicted = measured")
        ax.fill_between(line, line * (1 - band), line * (1 + band), color="tab:green", alpha=0.15,
                        label=f"within {band:.0%}")  # fmt: skip
        for remat, marker in (("none", "o"), ("selective", "s"), ("full", "^")):
            chosen = frame["remat"] == remat
            ax.scatter(x[chosen], y[chosen], marker=marker, s=36, label=f"remat {remat}", zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_xlabel(f"measured {what}")
        ax.set_ylabel(f"predicted {what}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    from plansim.report.figures import write_figure

    paths = [out / "predicted_vs_measured.png", out / "predicted_vs_measured.svg"]
    try:
        for path in paths:
            write_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
    return paths


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


def write_report(frame: pd.DataFrame, summary: Summary, out: Path, context: dict[str, Any]) -> list[Path]:
    """validation.csv, the chart, summary.json and summary.md in ``out``, all or none
    (``plansim.outputs.staged_folder``)."""
    from plansim.outputs import staged_folder

    with staged_folder(out) as stage:
        d = stage.path
        written = [d / "validation.csv"]
        frame.to_csv(written[0], index=False)
        written += write_chart(frame, d, f"plansim against real steps on {context.get('device_name', '?')}")
        (d / "summary.json").write_text(json.dumps({**summary.to_dict(), **context}, indent=2) + "\n", encoding="utf-8")
        (d / "summary.md").write_text(summary_text(frame, summary, context), encoding="utf-8")
        files = stage.final([*written, d / "summary.json", d / "summary.md"])
    return files
