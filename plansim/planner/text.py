"""The planner's answer as a terminal report (rich): the finalists' table, the explanation, the rejected
candidates by reason, time to train, and the files written."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from plansim.report.text import breakdown_cells
from plansim.units import GB

if TYPE_CHECKING:
    from plansim.planner import PlanResult

__all__ = ["print_plan"]


def print_plan(r: PlanResult, files: Sequence[object] = ()) -> None:
    """Print ``r`` for a terminal."""
    console = Console(width=max(200, Console().width))
    t = Table(title=f"plansim plan: {r.model} on {r.gpus} x {r.hardware}, global batch {r.global_batch}")
    for name, justify in (
        ("#", "right"), ("strategy", "left"), ("step", "right"), ("tokens/s", "right"), ("MFU", "right"),
        ("memory / capacity", "right"), ("comm per GPU dp/tp/pp/zero", "right"),
        ("compute/recompute/comm/bubble/optim", "right"),
    ):  # fmt: skip
        t.add_column(name, justify=justify, no_wrap=name == "strategy")  # type: ignore[arg-type]
    frame = r.frame()
    for row in frame.to_dict("records"):
        comm, parts = breakdown_cells(row)
        t.add_row(
            str(int(row["rank"])) if row["role"] == "finalist" else "M",
            row["strategy"],
            f"{row['step_time_s'] * 1e3:,.1f} ms" + ("" if row["engine"] == "des" else "*"),
            f"{row['tokens_per_s']:,.0f}",
            f"{row['mfu']:.1%}",
            f"{row['peak_memory_bytes'] / GB:.1f} / {row['memory_capacity_bytes'] / GB:.0f} GB"
            + ("" if row["fits"] else " [red]OOM[/red]"),
            comm,
            parts,
        )
    console.print(t)
    if len(frame) and (frame["engine"] != "des").any():
        console.print("* analytic engine (the discrete-event re-simulation was skipped)")
    if len(frame) and (frame["role"] != "finalist").any():
        console.print(
            "M: the Megatron-style configuration (tp within a node, pp to fit, mb 1, selective), for reference"
        )
    console.print(r.explanation)
    if r.training is not None:
        tc = r.training
        cost = f", cost {tc.cost:,.0f}" if tc.cost is not None else ""
        console.print(
            f"Training on {tc.tokens:,.0f} tokens: {tc.steps:,} steps, {tc.days:,.1f} days, "
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
