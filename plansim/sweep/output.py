"""What ``plansim sweep`` prints and writes: a rich table of the points with how fast they ran, and into ``--out``
sweep.csv (one row per point, ``Sweep.frame()``), sweep.parquet where pyarrow is installed (the same frame with its
dtypes) and the scaling charts of ``report.sweep_charts``."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from rich.markup import escape
from rich.table import Table

from plansim.report.fit import print_fitted, terminal_console
from plansim.units import GB

if TYPE_CHECKING:
    from plansim.sweep import Sweep

__all__ = ["PARQUET_MISSING", "has_parquet", "print_sweep", "sweep_summary", "write_sweep"]

PARQUET_MISSING = "sweep.parquet not written: pyarrow is not installed (pip install 'plansim[parquet]'); CSV only"


def has_parquet() -> bool:
    """Whether pandas can write Parquet here (pyarrow importable)."""
    return importlib.util.find_spec("pyarrow") is not None


def write_sweep(s: Sweep, out: str | Path) -> list[Path]:
    """Write the files named in the module docstring into ``out``, all or none (``plansim.files.outputs.staged_folder``:
    an interrupted or failed run leaves the previous files); returns their paths."""
    from plansim.files.outputs import staged_folder
    from plansim.report.sweep_charts import sweep_charts

    with staged_folder(out) as stage:
        directory = stage.path
        frame = s.frame()
        written = [directory / "sweep.csv"]
        frame.to_csv(written[0], index=False)
        if has_parquet():
            frame.to_parquet(directory / "sweep.parquet", index=False)
            written.append(directory / "sweep.parquet")
        written += sweep_charts(frame, directory, "plansim sweep")
        files = stage.final(written)
    return files


def sweep_summary(s: Sweep) -> dict[str, Any]:
    """The sweep as plain data (``--format json``): grid, settings, executor and every row (None where a point has
    no value). No timings (``Sweep.elapsed_s`` keeps them): the same sweep gives the same JSON."""
    frame = s.frame()
    rows = [{k: _plain(v) for k, v in row.items()} for row in frame.to_dict("records")]
    return {
        "grid": s.grid.as_dict(),
        "points": len(frame),
        "settings": s.settings.as_dict(),
        "executor": s.executor,
        "fitting_points": int(frame["fits"].sum()),
        "notes": [] if has_parquet() else [PARQUET_MISSING],
        "rows": rows,
    }


def _plain(value: Any) -> Any:
    """A JSON-ready cell: numpy scalars as Python numbers, None, NaN and pandas' NA as None."""
    if pd.isna(value):
        return None
    return value.item() if hasattr(value, "item") else value


def print_sweep(s: Sweep, files: Sequence[object] = ()) -> None:
    """Print ``s`` for a terminal: one row per point (the winner, or why nothing fits), then the timing."""
    console = terminal_console()
    frame = s.frame()
    engines = ", ".join(sorted({str(e) for e in frame["engine"].dropna()})) or "no winner"
    t = Table(title=f"plansim sweep: {s.grid.describe()} ({engines} engine)")
    lengths = bool(s.grid.seq_lens)  # a column of the lengths where the grid gives them
    for name, justify in (
        ("model", "left"), *([("seq_len", "right")] if lengths else []), ("hardware", "left"), ("GPUs", "right"),
        ("batch", "right"), ("best plan", "left"), ("step", "right"), ("tokens/s", "right"), ("MFU", "right"),
        ("memory\n/ capacity", "right"), ("fit /\ncandidates", "right"),
    ):  # fmt: skip
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in frame.to_dict("records"):
        length = [] if not lengths else ["-" if pd.isna(row["seq_len"]) else f"{row['seq_len']:,}"]
        head = (row["model"], *length, row["hardware"], f"{row['gpus']:,}", f"{row['global_batch']:,}")
        counts = f"{row['fitting']:,} / {row['candidates']:,}"
        if not row["fits"]:
            t.add_row(*head, f"[red]{escape(row['reason'])}[/red]", "-", "-", "-", "-", counts)
            continue
        t.add_row(
            *head,
            row["strategy"],
            f"{row['step_time_s'] * 1e3:,.1f} ms",
            f"{row['tokens_per_s']:,.0f}",
            f"{row['mfu']:.1%}",
            f"{row['peak_memory_bytes'] / GB:.1f} / {row['memory_capacity_bytes'] / GB:.0f} GB",
            counts,
        )
    columns = (("hardware", "hardware"), ("model", "model"), ("GPUs", "gpus"), ("batch", "global_batch"),
               *([("seq_len", "seq_len")] if lengths else []))  # fmt: skip
    same = [k for k, c in columns if frame[c].nunique() == 1]
    optional = ("fit / candidates", *same)  # what a narrow terminal leaves out first; then abbreviates, then these:
    fitted = print_fitted(console, t, elastic="best plan", optional=optional, late=("memory / capacity", "MFU"))
    if fitted.cut_at is not None:  # a reason cut short in the table: whole, under it
        for row in frame.to_dict("records"):
            if not row["fits"] and len(row["reason"]) > fitted.cut_at:
                at = f" at seq_len {row['seq_len']:,}" if lengths and not pd.isna(row["seq_len"]) else ""
                where = f"{row['model']}{at} on {row['gpus']:,} x {row['hardware']}, batch {row['global_batch']:,}"
                console.print(f"{where}: {row['reason']}", markup=False)
    console.print(
        f"{len(frame):,} planner runs on {s.executor} in {s.elapsed_s:.1f} s ({s.runs_per_s:.2f} runs/s); "
        f"something fits at {int(frame['fits'].sum()):,} of {len(frame):,} points."
    )
    for path in files:
        console.print(f"wrote {path}")
    if files and not has_parquet():
        console.print(PARQUET_MISSING, markup=False)
