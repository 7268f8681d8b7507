"""One entry point for every rematerialization method, and the memory-vs-overhead trade-off curve.

``solve_remat`` runs a method of ``METHODS`` (the MILP, then the baselines of ``baselines``) on a remat graph within a
budget. The MILP starts from ``start.milp_start``; the cases its bounds decide (a budget below what one node needs,
or one the keep-everything schedule fits) need no solver. ``tradeoff`` runs every method at every budget. Every
method returns one ``RematResult``."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from plansim.errors import PlansimError
from plansim.gc_pause import gc_paused
from plansim.remat.baselines import BASELINES, FIXED, run_baseline
from plansim.remat.deadline import Deadline
from plansim.remat.graph import RematGraph
from plansim.remat.result import RematResult, SolverReport
from plansim.remat.start import milp_start

__all__ = ["METHODS", "solve_remat", "tradeoff"]

#: Every method by name: the MILP and the baselines (``plansim remat`` and the strategy's ``remat`` take these).
METHODS = ("milp", *BASELINES)


def solve_remat(
    graph: RematGraph,
    budget_bytes: float | None = None,
    method: str = "milp",
    *,
    in_flight: float = 1,
    solver: str = "highs",
    time_limit_s: float | None = None,
    gap: float | None = None,
    warm_start: bool = True,
    deadline: Deadline | None = None,
) -> RematResult:
    """Schedule ``graph`` within ``budget_bytes`` (None: unlimited) with ``method``.

    For the MILP, ``warm_start`` hands the solver the cheapest schedule that fits among the baselines' and the
    coarse MILP's, improved by a local search (``start.milp_start``), so a time limit never leaves it worse than the
    heuristics; ``gap`` (relative to the objective) bounds the search, and ``result.solver`` says whether the
    answer is proven optimal. A bad argument (a kind, or a number outside ``plansim.limits``) raises
    ``PlansimError`` before any work.

    ``time_limit_s`` is a wall-clock limit on the whole call, from here: the start's search (half of it at
    most), building the MILP, its LP relaxation and the solve (``checkmate.solve_milp``), and the schedule's
    extraction, for which a margin (``checkmate.FINAL_MARGIN_S``) is kept. When it runs out the best schedule found
    so far is returned with status ``feasible`` (not proven) and a ``reason`` saying where the time ran out; if
    none was found, the cheapest fixed baseline that fits (none, full, selective, sqrt: one schedule each, run even
    at 0 s), labelled the same way; if none fits, no schedule (status ``no solution``). Outside the limit: the
    bound checks (one schedule) and, for a 0 s limit, those fixed baselines. ``deadline`` (``remat.deadline``)
    replaces ``time_limit_s`` where a caller has started the clock already, or brings its own clock.

    Examples
    --------
    >>> from plansim.remat.graph import linear_chain
    >>> g = linear_chain(8)
    >>> sqrt = solve_remat(g, method="sqrt")
    >>> milp = solve_remat(g, sqrt.peak_bytes)
    >>> milp.solver.status, milp.solver.solver, milp.cost <= sqrt.cost
    ('optimal', 'highs', True)
    >>> solve_remat(g).solver.solver   # keeping everything fits: optimal by the lower bound, no solve
    'bounds'
    >>> late = solve_remat(g, sqrt.peak_bytes, time_limit_s=0)   # no time: the best baseline, labelled
    >>> late.feasible, late.solver.status, late.solver.start
    (True, 'feasible', 'sqrt')
    """
    _check_arguments(graph, budget_bytes, method, in_flight, solver, time_limit_s, gap, warm_start)
    if method not in METHODS:
        raise PlansimError(f"remat method {method!r}: choose one of {', '.join(METHODS)}")
    if budget_bytes is not None and budget_bytes < 0:
        raise PlansimError(f"remat budget {budget_bytes} B: must be >= 0")
    if in_flight < 1:
        raise PlansimError(f"in_flight={in_flight}: at least one micro-batch is in flight")
    if deadline is None:
        deadline = Deadline(time_limit_s)  # checks the limit, for the baselines too
    if method != "milp":
        return run_baseline(graph, method, budget_bytes, in_flight)
    from plansim.remat.checkmate import solve_milp  # PuLP is a heavy import: only where a MILP is solved

    decided = _decided_by_bounds(graph, budget_bytes, in_flight)
    if decided is not None:
        return decided
    began = time.perf_counter()
    start: RematResult | None = None
    with gc_paused():  # building a MILP makes tens of thousands of PuLP objects, none of them in a cycle
        if warm_start:
            start = milp_start(graph, budget_bytes, in_flight, deadline, partial(_coarse_solve, solver=solver, gap=gap))
        result = solve_milp(
            graph,
            budget_bytes,
            in_flight=in_flight,
            solver=solver,
            gap=gap,
            start=start,
            relax=warm_start,
            deadline=deadline,
        )
    if result.solver is None:  # pragma: no cover - solve_milp always reports
        return result
    if result.schedule is None and result.solver.status == "no solution":
        result = _fallback(graph, budget_bytes, in_flight, result)
    seconds = time.perf_counter() - began
    assert result.solver is not None
    report = replace(
        result.solver,
        time_limit_s=deadline.seconds,
        solve_time_s=seconds - result.solver.build_time_s,
    )
    return replace(result, solver=report, solve_time_s=seconds)


def _fallback(graph: RematGraph, budget: float | None, in_flight: float, result: RematResult) -> RematResult:
    """When the time ran out before any schedule: the cheapest fixed baseline that fits (one schedule each, so
    bounded), labelled as the time-out it is; ``result`` when none fits."""
    assert result.solver is not None
    fits = [r for r in (run_baseline(graph, m, budget, in_flight) for m in FIXED) if r.feasible]
    if not fits:
        return result
    best = min(fits, key=lambda r: r.cost)
    limit = result.solver.time_limit_s
    when = "the time limit" if limit is None else f"the time limit of {limit:g} s"
    report = replace(result.solver, status="feasible", objective=best.cost, start=best.method)
    if report.bound is not None:
        report = replace(report, gap=max(0.0, best.cost - report.bound) / max(abs(best.cost), 1e-300))
    reason = f"{when} came before the search found a schedule: the {best.method} baseline, not proven optimal"
    return replace(best, method="milp", solver=report, reason=reason)


def _coarse_solve(
    graph: RematGraph,
    budget: float | None,
    in_flight: float,
    deadline: Deadline,
    *,
    solver: str,
    gap: float | None,
) -> RematResult:
    return solve_remat(graph, budget, in_flight=in_flight, solver=solver, gap=gap, deadline=deadline)


def _decided_by_bounds(graph: RematGraph, budget: float | None, in_flight: float) -> RematResult | None:
    """The cases no solver is needed for: a budget below what computing the most demanding node needs (its operands
    and its result live at once) is infeasible; a budget the keep-everything schedule fits is solved by it, since
    no schedule costs less than computing each node once. Both are proofs, reported as such (solver ``bounds``)."""
    start = time.perf_counter()
    floor = graph.memory_floor
    if budget is not None and budget < floor:
        report = _bound_report("infeasible", None, time.perf_counter() - start)
        reason = f"no schedule fits {budget:.4g} B: computing one node needs {floor:.4g} B"
        return RematResult(
            "milp", graph.name, budget, in_flight, False, None, None, report.solve_time_s, report, reason
        )
    keep_all = run_baseline(graph, "none", budget, in_flight)
    if keep_all.feasible:
        report = _bound_report("optimal", keep_all.cost, time.perf_counter() - start)
        return replace(keep_all, method="milp", solver=report, solve_time_s=report.solve_time_s)
    return None


def _bound_report(status: str, objective: float | None, seconds: float) -> SolverReport:
    return SolverReport(
        "bounds", status, objective, objective, 0.0 if objective is not None else None, 0, 0, seconds, 0.0, None, None
    )


def tradeoff(
    graph: RematGraph,
    budgets: Iterable[float],
    methods: Sequence[str] = METHODS,
    *,
    in_flight: float = 1,
    **milp_options: Any,
) -> list[RematResult]:
    """Every method at every budget: the memory-vs-overhead trade-off (one result per method and budget). A
    ``time_limit_s`` among ``milp_options`` holds for each budget's MILP on its own (``solve_remat``)."""
    out = []
    for budget in budgets:
        for method in methods:
            options = milp_options if method == "milp" else {}
            out.append(solve_remat(graph, budget, method, in_flight=in_flight, **options))
    return out


def _check_arguments(
    graph: object,
    budget_bytes: object,
    method: object,
    in_flight: object,
    solver: object,
    time_limit_s: object,
    gap: object,
    warm_start: object,
) -> None:
    """``solve_remat``'s arguments at the boundary: kinds, and numbers within ``plansim.limits``."""
    from plansim.arguments import choice, flag, type_name
    from plansim.limits import number
    from plansim.remat.milp import SOLVERS

    if not isinstance(graph, RematGraph):
        raise PlansimError(f"graph: expected a RematGraph (plansim.remat.api.remat_graph), got {type_name(graph)}")
    if budget_bytes is not None:
        number(budget_bytes, "remat_budget", "--budget")
    choice(method, METHODS, "remat method")
    number(in_flight, "in_flight", "in_flight")
    choice(solver, SOLVERS, "--solver")
    if time_limit_s is not None:
        number(time_limit_s, "time_limit_s", "--time-limit")
    if gap is not None and not 0 <= number(gap, "gap", "--gap") < 1:
        raise PlansimError(f"--gap {gap}: must be in [0, 1), e.g. 0.01 for 1%")
    flag(warm_start, "warm_start")
