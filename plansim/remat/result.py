"""The one result type of every rematerialization method, optimal or baseline (Checkmate's practice: ``feasible``, the
schedule, its cost and the solve time for each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plansim.remat.schedule import Replay, Schedule

__all__ = ["RematResult", "SolverReport"]


@dataclass(frozen=True)
class SolverReport:
    """How a MILP was solved.

    ``status``: ``optimal`` (proven within ``gap_limit``), ``feasible`` (a schedule, not proven optimal: the time
    limit came first), ``infeasible`` (proven: no schedule fits the budget) or ``no solution`` (the time limit came
    before any schedule was found). ``bound`` is the solver's proven lower bound on the objective, ``gap`` the
    relative distance between objective and bound (None where the solver does not report them: CBC). ``start``
    names the schedule the solver started from (a baseline, or ``coarse`` for the layer-granularity MILP's mapped
    to this graph; empty without one); ``solve_time_s`` includes finding it.
    """

    solver: str
    status: str
    objective: float | None
    bound: float | None
    gap: float | None
    variables: int
    constraints: int
    solve_time_s: float
    build_time_s: float
    time_limit_s: float | None
    gap_limit: float | None
    start: str = ""


@dataclass(frozen=True)
class RematResult:
    """A method's schedule for a graph at a budget.

    ``feasible`` is False when the method has no schedule within ``budget_bytes`` (then ``schedule`` is the
    method's best effort, or None when there is none, as for an infeasible MILP). ``peak_bytes`` includes the
    other micro-batches in flight (``Replay.peak_with``). ``cost`` and ``recompute_cost`` come from the replay.
    """

    method: str
    graph: str
    budget_bytes: float | None
    in_flight: float
    feasible: bool
    schedule: Schedule | None
    replay: Replay | None
    solve_time_s: float
    solver: SolverReport | None = None
    reason: str = ""

    @property
    def cost(self) -> float:
        """Total compute cost of the schedule (inf without one)."""
        return self.replay.cost if self.replay else float("inf")

    @property
    def recompute_cost(self) -> float:
        """Cost beyond computing every node once (inf without a schedule)."""
        return self.replay.recompute_cost if self.replay else float("inf")

    @property
    def peak_bytes(self) -> float:
        """Peak live bytes, other micro-batches in flight included (inf without a schedule)."""
        return self.replay.peak_with(self.in_flight) if self.replay else float("inf")

    def to_row(self) -> dict[str, Any]:
        """One flat row for a DataFrame; no timings (``solve_time_s`` and the solver's times stay on the objects), so
        the same input gives the same rows."""
        row: dict[str, Any] = {
            "method": self.method,
            "graph": self.graph,
            "budget_bytes": self.budget_bytes,
            "feasible": self.feasible,
            "cost": self.cost,
            "recompute_cost": self.recompute_cost,
            "peak_bytes": self.peak_bytes,
            "held_bytes": self.replay.held_bytes if self.replay else None,
            "recomputed_nodes": self.replay.recomputed_nodes if self.replay else None,
            "reason": self.reason,
        }
        if self.solver:
            row.update(
                solver=self.solver.solver,
                status=self.solver.status,
                bound=self.solver.bound,
                gap=self.solver.gap,
                variables=self.solver.variables,
                constraints=self.solver.constraints,
                start=self.solver.start,
            )
        return row
