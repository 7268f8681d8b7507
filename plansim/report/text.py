"""A Result as a terminal report (rich), in human units: ms, GB, TFLOP/s; and ``results_table``, the table of
results that ``plan`` and ``compare`` print."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table

from plansim.result import Result
from plansim.step.result import TIME_PARTS
from plansim.strategy.mesh import COMM_KINDS
from plansim.units import GB

__all__ = ["FIGURE_COLUMNS", "OPTIONAL_COLUMNS", "print_result", "results_table"]

#: Every part of the step time (``TIME_PARTS``, in its order) as the tables' last column names it.
_PART_NAMES = {
    "compute": "compute", "recompute": "recompute", "exposed_comm": "comm", "bubble": "bubble",
    "optimizer": "optim", "sync_wait": "wait", "interference": "interf", "host_wait": "host",
}  # fmt: skip
assert tuple(_PART_NAMES) == TIME_PARTS, "a time part without its column name"
_PARTS_HEADER = "/".join(_PART_NAMES.values())
#: The kinds a table's comm column shows only where some row has such traffic (context and expert parallelism: most
#: runs have none, a column of zeros left out: ``_kinds``)
_OPTIONAL_KINDS = ("cp", "ep")
#: The kinds every table's comm column shows
_TABLE_KINDS = tuple(k for k in COMM_KINDS if k not in _OPTIONAL_KINDS)


def _figure_columns(kinds: Sequence[str]) -> tuple[str, ...]:
    return (
        "step", "tokens/s", "MFU", "memory\n/ capacity", f"comm per GPU\n{'/'.join(kinds)}",
        _PARTS_HEADER.replace("/comm/", "/\ncomm/"),
    )  # fmt: skip


#: The figure columns every table of results ends with (``plan``, ``compare``); long headers on two lines; a table
#: with context-parallel traffic names ``cp`` in its comm column too.
FIGURE_COLUMNS = _figure_columns(_TABLE_KINDS)


#: The figure columns a narrow terminal leaves out first (``report.fit``), as ``fit_table`` names them.
def _shown(used: Sequence[str]) -> tuple[str, ...]:
    """The comm column's kinds where the optional kinds ``used`` have traffic, in ``COMM_KINDS`` order."""
    return tuple(k for k in COMM_KINDS if k not in _OPTIONAL_KINDS or k in used)


OPTIONAL_COLUMNS = (
    _PARTS_HEADER,
    *(f"comm per GPU {'/'.join(_shown(used))}" for used in ((), ("cp",), ("ep",), _OPTIONAL_KINDS)),
)


def _kinds(rows: Sequence[dict]) -> tuple[str, ...]:
    """The communication kinds a table's rows show: an optional kind (``_OPTIONAL_KINDS``) where some row has it."""
    return _shown([k for k in _OPTIONAL_KINDS if any(row.get(f"comm_{k}_bytes", 0) > 0 for row in rows)])


def _figure_cells(row: dict, step_mark: str, kinds: Sequence[str] = _TABLE_KINDS) -> list[str]:
    """A frame row's (``plansim.result`` columns) figure cells: step time (``step_mark`` after it), tokens/s,
    MFU, memory against capacity, bytes per GPU by kind (GB, ``kinds``) and the step time by part (ms)."""
    comm = "/".join(f"{row[f'comm_{k}_bytes'] / GB:.1f}" for k in kinds)
    parts = "/".join(f"{row[f'time_{k}_s'] * 1e3:.0f}" for k in TIME_PARTS)
    return [
        f"{row['step_time_s'] * 1e3:,.1f} ms{step_mark}",
        f"{row['tokens_per_s']:,.0f}",
        f"{row['mfu']:.1%}",
        f"{row['peak_memory_bytes'] / GB:.1f} / {row['memory_capacity_bytes'] / GB:.1f} GB"
        + ("" if row["fits"] else " [red]OOM[/red]"),
        f"{comm} GB",
        f"{parts} ms",
    ]


def results_table(
    title: str, keys: Sequence[tuple[str, str]], rows: Iterable[tuple[Sequence[str], dict, str]]
) -> Table:
    """A table of results: the ``keys`` columns (name, justify; a left-justified one never wraps) then the figure
    columns; each row is (its key cells, its frame row, a mark after its step time)."""
    rows = list(rows)
    kinds = _kinds([row for _, row, _ in rows])
    t = Table(title=title)
    for name, justify in keys:
        t.add_column(name, justify=justify, no_wrap=justify == "left")  # type: ignore[arg-type]
    for name in _figure_columns(kinds):
        t.add_column(name, justify="right")
    for cells, row, step_mark in rows:
        t.add_row(*cells, *_figure_cells(row, step_mark, kinds))
    return t


def _fp8_rows(r: Result) -> list[tuple[str, str]]:
    """Under ``dtype: fp8``, a row saying so (the recipe; MFU and HFU still over the bf16 peak); none otherwise."""
    if r.strategy.get("dtype") != "fp8":
        return []
    return [("dtype (MFU: bf16 peak)", f"fp8 ({r.strategy.get('fp8_recipe')})")]


def _headline(r: Result) -> Table:
    t = Table(title=f"{r.model} on {r.gpus} x {r.hardware} ({r.engine})", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    fit = "[green]yes[/green]" if r.fits else f"[red]no[/red]: {r.reason}"
    rows = [
        ("step time", f"{r.step_time_s * 1e3:,.1f} ms"),
        ("tokens/s", f"{r.tokens_per_s:,.0f}"),
        *_fp8_rows(r),
        ("model TFLOP/s per GPU (MFU)", f"{r.model_tflops_per_gpu:.1f} ({r.mfu:.1%})"),
        ("hardware TFLOP/s per GPU (HFU)", f"{r.hardware_tflops_per_gpu:.1f} ({r.hfu:.1%})"),
        ("micro-batches per step", str(r.num_microbatches)),
        *((("tokens per sequence", f"{r.seq_len:,}"),) if r.seq_len else ()),
        ("peak memory (worst GPU)", f"{r.peak_memory_bytes / GB:.2f} GB"),
        ("fits", fit),
        ("memory free at the peak", f"{r.memory_margin:.1%}"),
        *(("[yellow]warning[/yellow]", w) for w in r.warnings),
    ]
    for row in rows:
        t.add_row(*row)
    return t


def _breakdown(title: str, values: dict[str, float], unit: str, scale: float) -> Table:
    t = Table(title=title)
    t.add_column("part")
    t.add_column(unit, justify="right")
    for key, value in values.items():
        t.add_row(key, f"{value / scale:,.3f}")
    return t


def _host_tier(host: dict) -> Table:
    """The memory's second tier where the strategy offloads (``Result.host_memory``): one GPU's host bytes by
    category, then the node's against its host memory."""
    t = _breakdown(
        "host memory (offloaded), per GPU", {k: float(v) for k, v in host["per_gpu_bytes"].items()}, "GB", GB
    )
    t.add_row("per node / capacity", f"{host['per_node_bytes'] / GB:,.1f} / {host['capacity_bytes'] / GB:,.1f}")
    t.add_row("fits", "yes" if host["fits"] else "no")
    return t


def print_result(r: Result, console: Console | None = None) -> None:
    """Print a result's headline figures and its time, memory and communication breakdowns."""
    console = console or Console()
    console.print(_headline(r))
    console.print(_breakdown("time per step", r.time_breakdown_s, "ms", 1e-3))
    console.print(
        _breakdown("memory on the worst GPU", {k: float(v) for k, v in r.memory_breakdown_bytes.items()}, "GB", GB)
    )
    if r.host_memory:
        console.print(_host_tier(r.host_memory))
    console.print(_breakdown("bytes sent per GPU per step", r.comm_bytes_per_gpu, "GB", GB))
    if r.stage_time_breakdown_s:
        console.print(_stages(r))
    if r.busiest_links:
        t = Table(title="busiest links")
        for col in ("link", "GB", "utilization"):
            t.add_column(col, justify="left" if col == "link" else "right")
        for link in r.busiest_links[:5]:
            t.add_row(link["link"], f"{link['bytes'] / GB:,.2f}", f"{link['utilization']:.1%}")
        console.print(t)


def _stages(r: Result) -> Table:
    """Per pipeline stage: where its step time goes (the discrete-event engine's view) and its memory peak."""
    t = Table(title="per stage (ms; peak GB)")
    parts = list(r.stage_time_breakdown_s[0])
    for col in ("stage", *parts, "peak GB"):
        t.add_column(col, justify="right")
    for i, parts_s in enumerate(r.stage_time_breakdown_s):
        peak = r.stage_peak_memory_bytes[i] / GB if i < len(r.stage_peak_memory_bytes) else float("nan")
        t.add_row(str(i), *(f"{parts_s[p] * 1e3:,.1f}" for p in parts), f"{peak:.2f}")
    return t
