"""The planner's answer as a terminal report (rich): the finalists' table, the explanation, the rejected
candidates by reason, time to train, and the files written."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.table import Table

from plansim.report.fit import print_fitted, terminal_console
from plansim.report.text import OPTIONAL_COLUMNS, results_table

if TYPE_CHECKING:
    from plansim.planner import PlanResult

__all__ = ["print_plan"]


def _with_twins(row: dict[str, Any]) -> str:
    """A finalist's strategy cell: its description, and the count of its equivalents left out (``+2: zero=1/0``)."""
    n = row.get("equivalent") or 0
    return f"{row['strategy']} (+{n}: {row['equivalent_settings']})" if n else str(row["strategy"])


def print_plan(r: PlanResult, files: Sequence[object] = ()) -> None:
    """Print ``r`` for a terminal."""
    console = terminal_console()
    frame = r.frame()
    rows = (
        (
            [str(int(row["rank"])) if row["role"] == "finalist" else "M", _with_twins(row)],
            row,
            "" if row["engine"] == "des" else "*",
        )
        for row in frame.to_dict("records")
    )
    at = "" if r.seq_len is None else f", seq_len {r.seq_len:,}"
    title = f"plansim plan: {r.model} on {r.gpus} x {r.hardware}, global batch {r.global_batch}{at}"
    table = results_table(title, [("#", "right"), ("strategy", "left")], rows)
    print_fitted(console, table, elastic="strategy", optional=OPTIONAL_COLUMNS)
    if len(frame) and (frame["engine"] != "des").any():
        console.print("* analytic engine (the discrete-event re-simulation was skipped)")
    if len(frame) and (frame["equivalent"] > 0).any():
        console.print(
            "(+N: ...) N equivalent candidates left out: they differ only in the settings named and price alike"
        )
    if len(frame) and (frame["role"] != "finalist").any():
        console.print(
            "M: the Megatron-style configuration (tp within a node, pp to fit, mb 1, selective), for reference"
        )
    console.print(r.explanation)
    if r.training is not None:
        tc = r.training
        cost = f", cost {tc.cost:,.0f}" if tc.cost is not None else ""
        worst = " in the worst case" if r.robust is not None else ""
        console.print(
            f"Training on {tc.tokens:,.0f} tokens{worst}: {tc.steps:,} steps, {tc.days:,.1f} days, "
            f"{tc.gpu_hours:,.0f} GPU-hours{cost}."
        )
    rejected = r.rejected_summary()
    if rejected:
        rt = Table(title=f"rejected: {sum(n for _, n in rejected):,} of {r.outcome.candidates:,} candidates")
        rt.add_column("reason")
        rt.add_column("candidates", justify="right")
        for reason, n in rejected:
            rt.add_row(reason, f"{n:,}")
        console.print(rt)
    times = ", ".join(f"{k} {v:.2f} s" for k, v in r.outcome.phase_s.items())
    console.print(f"search: {times}")
    for path in files:
        console.print(f"wrote {path}")
