"""What ``plansim compare`` prints and writes: a rich table of the runs ranked by the objective (tokens/s unless
``--objective`` says otherwise) with a sentence on the best, and with
``--out DIR`` results.csv (one row per run), results.json (every run's full result), scaling.csv and the charts of
``report.compare_charts`` (time_breakdown, memory, communication, timeline for discrete-event runs, scaling)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from plansim.describe import objective_sentence
from plansim.report.fit import print_fitted, terminal_console
from plansim.report.text import OPTIONAL_COLUMNS, results_table

if TYPE_CHECKING:
    from plansim.comparison.compare import Comparison

__all__ = ["comparison_summary", "print_comparison", "write_comparison"]


def comparison_summary(c: Comparison) -> dict[str, Any]:
    """The comparison as plain data (``--format json`` and results.json): ``best`` by ``objective``, and ``fastest``
    (the shortest step, whatever its batch)."""
    fastest, best = c.fastest(), c.best()
    return {
        "model": c.model,
        "seq_len": c.seq_len,
        "engine": c.engine,
        "objective": c.objective,
        "runs": [_run_summary(r) for r in c.runs],
        "best": None if best is None else best.label,
        "fastest": None if fastest is None else fastest.label,
        "summary": summary_sentence(c),
        "scaling_batch": c.scaling_batch,
        "scaling": c.scaling_rows(),
        "refused": [{"label": label, "reason": why} for label, why in c.refused],
    }


def _run_summary(r: Any) -> dict[str, Any]:
    return {
        "label": r.label,
        "hardware": r.hardware,
        "memory_capacity_bytes": r.memory_capacity_bytes,
        "tier_bytes": r.tier_bytes(),
        "port_bytes": r.port_bytes(),
        "result": r.result.to_dict(),
    }


#: How the summary names each objective (``comparison.compare.COMPARE_OBJECTIVES``).
_OBJECTIVE_WORDS = {"tokens_per_s": "tokens/s", "step_time": "step time", "cost": "GPU-hours per token"}


def summary_sentence(c: Comparison) -> str:
    """Which run is best by the objective among those that fit, and against the next one why; which do not fit;
    where step times are ranked across different global batches, that they hold different work."""
    ranked = c.ranked()
    out = []
    if not ranked:
        out.append("No run fits in memory.")
    else:
        best = ranked[0]
        w = best.result
        out.append(
            f"Best by {_OBJECTIVE_WORDS[c.objective]}: {best.label}, {w.tokens_per_s:,.0f} tokens/s, "
            f"{w.step_time_s:.3f} s per step at global batch {best.strategy.batch:,}, MFU {w.mfu:.1%}."
        )
        if len(ranked) > 1:
            other = ranked[1]
            pair = (best.strategy.batch, other.strategy.batch)
            out.append(objective_sentence(w, other.result, other.label, c.objective, pair))
    for r in c.runs:
        if not r.result.fits:
            out.append(f"{r.label} does not fit: {r.result.reason}.")
    batches = sorted({r.strategy.batch for r in c.runs})
    if c.objective == "step_time" and len(batches) > 1:
        out.append(
            f"The global batches differ ({', '.join(f'{b:,}' for b in batches)}): a step holds different work in "
            f"each run; --objective tokens_per_s ranks by throughput."
        )
    return " ".join(out)


def print_comparison(c: Comparison, files: Sequence[object] = ()) -> None:
    """Print ``c`` for a terminal."""
    console = terminal_console()
    rank = {r.label: k for k, r in enumerate(c.ranked(), start=1)}
    rows = (
        ([str(rank.get(row["label"], "-")), row["label"], f"{row['gpus']:,}", f"{row['global_batch']:,}"], row, "")
        for row in c.frame().to_dict("records")
    )
    at = "" if c.seq_len is None else f" at seq_len {c.seq_len:,}"
    title = f"plansim compare: {c.model}{at} ({c.engine} engine), # by {_OBJECTIVE_WORDS[c.objective]}"
    keys = [("#", "right"), ("run", "left"), ("GPUs", "right"), ("global batch", "right")]
    print_fitted(console, results_table(title, keys, rows), elastic="run", optional=OPTIONAL_COLUMNS)
    console.print(summary_sentence(c))
    for label, why in c.refused:
        console.print(f"not run: {label}: {why}", markup=False, highlight=False)
    if c.scaling:
        how = (
            "the global batch held: fewer micro-batches per replica"
            if c.scaling_batch == "fixed"
            else "micro-batches per replica held: the global batch grows"
        )
        s = Table(title=f"scaling: tp, pp and micro-batch held, dp grows; {how}")
        for name in ("run", "GPUs", "global batch", "step", "tokens/s", "MFU", "note"):
            s.add_column(name, justify="left" if name in ("run", "note") else "right")
        notes: dict[str, int] = {}  # a point's reason -> its number, printed under the table
        for row in c.scaling_frame().to_dict("records"):
            ran = row["tokens_per_s"] == row["tokens_per_s"] and row["tokens_per_s"] is not None  # not NaN/None
            note = f"[{notes.setdefault(row['reason'], len(notes) + 1)}]" if row["reason"] else ""
            s.add_row(
                row["label"],
                f"{row['gpus']:,}",
                f"{int(row['global_batch']):,}" if ran else "-",
                f"{row['step_time_s'] * 1e3:,.1f} ms" if ran else "-",
                f"{row['tokens_per_s']:,.0f}" if ran else "-",
                f"{row['mfu']:.1%}" if ran else "-",
                note,
            )
        print_fitted(console, s, elastic="run")
        for reason, k in notes.items():
            console.print(f"[{k}] {reason}", markup=False)
    for path in files:
        console.print(f"wrote {path}")


def write_comparison(c: Comparison, out: str | Path) -> list[Path]:
    """Write the files named in the module docstring into ``out``, all or none (``plansim.files.outputs.staged_folder``:
    an interrupted or failed run leaves the previous files); returns their paths."""
    from plansim.files.outputs import staged_folder
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
