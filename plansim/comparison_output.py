"""What ``plansim compare`` prints and writes: a rich table of the runs with a sentence on the fastest, and with
``--out DIR`` results.csv (one row per run), results.json (every run's full result), scaling.csv and the charts of
``report.compare_charts`` (time_breakdown, memory, communication, timeline for discrete-event runs, scaling)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from plansim.describe import compare_sentence
from plansim.report.text import results_table

if TYPE_CHECKING:
    from plansim.comparison import Comparison

__all__ = ["comparison_summary", "print_comparison", "write_comparison"]


def comparison_summary(c: Comparison) -> dict[str, Any]:
    """The comparison as plain data (``--format json`` and results.json)."""
    fastest = c.fastest()
    return {
        "model": c.model,
        "engine": c.engine,
        "runs": [_run_summary(r) for r in c.runs],
        "fastest": None if fastest is None else fastest.label,
        "summary": summary_sentence(c),
        "scaling_batch": c.scaling_batch,
        "scaling": c.scaling_rows(),
    }


def _run_summary(r: Any) -> dict[str, Any]:
    return {
        "label": r.label,
        "hardware": r.hardware,
        "memory_capacity_bytes": r.memory_capacity_bytes,
        "tier_bytes": r.tier_bytes(),
        "result": r.result.to_dict(),
    }


def summary_sentence(c: Comparison) -> str:
    """Which run is fastest among those that fit, and against the next one why; which do not fit."""
    fastest = c.fastest()
    out = []
    if fastest is None:
        out.append("No run fits in memory.")
    else:
        w = fastest.result
        out.append(f"Fastest: {fastest.label}, {w.step_time_s:.3f} s per step, {w.tokens_per_s:,.0f} tokens/s.")
        others = sorted((r for r in c.runs if r.result.fits and r is not fastest), key=lambda r: r.result.step_time_s)
        if others:
            out.append(compare_sentence(w, others[0].result, others[0].label))
    for r in c.runs:
        if not r.result.fits:
            out.append(f"{r.label} does not fit: {r.result.reason}.")
    return " ".join(out)


def print_comparison(c: Comparison, files: Sequence[object] = ()) -> None:
    """Print ``c`` for a terminal."""
    console = Console(width=max(200, Console().width))
    rows = (([row["label"], f"{row['gpus']:,}"], row, "") for row in c.frame().to_dict("records"))
    title = f"plansim compare: {c.model} ({c.engine} engine)"
    console.print(results_table(title, [("run", "left"), ("GPUs", "right")], rows))
    console.print(summary_sentence(c))
    if c.scaling:
        how = (
            "the global batch held: fewer micro-batches per replica"
            if c.scaling_batch == "fixed"
            else "micro-batches per replica held: the global batch grows"
        )
        s = Table(title=f"scaling: tp, pp and micro-batch held, dp grows; {how}")
        for name in ("run", "GPUs", "global batch", "step", "tokens/s", "MFU", "note"):
            s.add_column(name, justify="left" if name in ("run", "note") else "right")
        for row in c.scaling_frame().to_dict("records"):
            ran = row["tokens_per_s"] == row["tokens_per_s"] and row["tokens_per_s"] is not None  # not NaN/None
            s.add_row(
                row["label"],
                f"{row['gpus']:,}",
                f"{int(row['global_batch']):,}" if ran else "-",
                f"{row['step_time_s'] * 1e3:,.1f} ms" if ran else "-",
                f"{row['tokens_per_s']:,.0f}" if ran else "-",
                f"{row['mfu']:.1%}" if ran else "-",
                row["reason"] or "",
            )
        console.print(s)
    for path in files:
        console.print(f"wrote {path}")


def write_comparison(c: Comparison, out: str | Path) -> list[Path]:
    """Write the files named in the module docstring into ``out``, all or none (``plansim.outputs.staged_folder``:
    an interrupted or failed run leaves the previous files); returns their paths."""
    from plansim.outputs import staged_folder
    from plansim.report.compare_charts import (
        communication_chart,
        memory_chart,
        scaling_chart,
        time_chart,
        timeline_chart,
    )

    with staged_folder(out) as stage:
        directory = stage.path
        frame = c.frame()
        written = [directory / "results.csv", directory / "results.json"]
        frame.to_csv(written[0], index=False)
        written[1].write_text(json.dumps(comparison_summary(c), indent=2), encoding="utf-8")
        title = c.model
        written += time_chart(frame, directory / "time_breakdown.svg", title)
        written += memory_chart(frame, directory / "memory.svg", title)
        written += communication_chart(frame, directory / "communication.svg", title)
        timelines = [(r.label, r.result.timeline) for r in c.runs if r.result.timeline is not None]
        if timelines:
            written += timeline_chart(timelines, directory / "timeline.svg", title)
        if c.scaling:
            scaling = c.scaling_frame()
            scaling.to_csv(directory / "scaling.csv", index=False)
            written.append(directory / "scaling.csv")
            if scaling["tokens_per_s"].notna().any():
                batch = "global batch held" if c.scaling_batch == "fixed" else "micro-batches per replica held"
                written += scaling_chart(scaling, directory / "scaling.svg", f"{title}, {batch}")
        files = stage.final(written)
    return files
