"""The Checkmate MILP (Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor Rematerialization",
MLSys 2020), written in the paper's notation and solved through PuLP.

Nodes ``v_0 .. v_{n-1}`` are in topological order; the schedule has ``n`` stages and stage ``t`` ends with the first
computation of ``v_t`` (sec 4.6, the *frontier-advancing* partition: ``R`` lower triangular with a unit diagonal,
``S`` strictly lower triangular), which cuts the variables from ``O(n^2)`` per stage to ``O(n)`` and loses nothing
once the order is fixed.

Variables (sec 4.1-4.5): ``R[t,i]`` = 1 if stage ``t`` computes ``v_i``; ``S[t,i]`` = 1 if ``v_i``'s result is in
memory when stage ``t`` starts; ``FREE[t,i,k]`` = 1 if ``v_i`` is freed right after ``v_k`` is computed in stage
``t`` (``i`` an operand of ``k``, or ``k`` itself; continuous here, see ``_freed``); ``U[t,k]`` the bytes in memory
while ``v_k`` is computed in stage ``t``. Two reductions leave the optimum unchanged: a zero-byte result is kept
once computed (``S = 1``, never recomputed), and a stage never recomputes a value it already holds
(``R + S <= 1``; recomputing costs time and adds memory).

Beyond the paper: with ``in_flight = m > 1`` micro-batches alive (pipeline parallelism), the other ``m - 1`` each
hold what this one keeps from its forward to its backward pass, ``held = sum_i M_i S[F, i]`` at the first backward
stage ``F``, so every ``U[t,k] + (m - 1) held`` must fit the budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import pulp

from plansim.remat.deadline import Deadline, TimeUp
from plansim.remat.graph import RematGraph
from plansim.remat.milp import add_variable, run_solver
from plansim.remat.result import RematResult, SolverReport
from plansim.remat.schedule import plan_of, replay, schedule_from_plan
from plansim.remat.start import rounded_start

__all__ = ["CheckmateMILP", "solve_milp"]

Expr = Any  # a PuLP affine expression or a number


@dataclass
class CheckmateMILP:
    """The built problem: PuLP model and the variables (constants where a reduction fixed them)."""

    graph: RematGraph
    prob: Any
    R: list[dict[int, Expr]]
    S: list[dict[int, Expr]]
    build_time_s: float
    memory_scale: float = 1.0
    cost_scale: float = 1.0

    @property
    def variables(self) -> int:
        """Number of variables."""
        return len(self.prob.variables())

    @property
    def constraints(self) -> int:
        """Number of constraints."""
        return int(self.prob.numConstraints())


def build_milp(
    graph: RematGraph, budget_bytes: float | None, in_flight: float = 1, *, deadline: Deadline | None = None
) -> CheckmateMILP:
    """The Checkmate MILP for ``graph`` within ``budget_bytes`` (None: unlimited). Building takes seconds for a
    few hundred nodes; past ``deadline`` it stops with ``TimeUp`` (checked once per stage)."""
    start = time.perf_counter()
    check = deadline.check if deadline is not None and deadline.limited else _no_check
    # Bytes (~1e8) beside seconds (~1e-5) make HiGHS's tolerances misjudge optimality: both are rescaled by powers
    # of two (exact) so that the largest node's memory and cost are about 1.
    mf, cf = _unit_scale(v.memory for v in graph.nodes), _unit_scale(v.cost for v in graph.nodes)
    n, mem, cost = len(graph), [v.memory * mf for v in graph.nodes], [v.cost * cf for v in graph.nodes]
    budget_bytes = None if budget_bytes is None else budget_bytes * mf
    zero = [m == 0 for m in mem]
    prob = pulp.LpProblem("checkmate", pulp.LpMinimize)
    R: list[dict[int, Expr]] = []
    S: list[dict[int, Expr]] = []
    for t in range(n):
        check()
        # sec 4.6 frontier-advancing: stage t computes v_t (R[t,t] = 1), may recompute only v_i, i < t
        R.append({i: 0 if zero[i] else add_variable(prob, f"R_{t}_{i}", 0, 1, "Binary") for i in range(t)} | {t: 1})
        # S[0, :] = 0 (sec 4.2, nothing is in memory before the first stage); zero-byte results stay once computed
        S.append({i: 1 if zero[i] else add_variable(prob, f"S_{t}_{i}", 0, 1, "Binary") for i in range(t)})
    # objective (sec 4.1, eq 1a): total cost of every computation in every stage; sum(cost): the frontier
    # computations, a constant
    recomputes = [(R[t][i], cost[i]) for t in range(n) for i in R[t] if cost[i] and not _const(R[t][i])]
    prob += pulp.LpAffineExpression(recomputes, constant=sum(cost))
    rows = _Rows()
    for t in range(n):
        check()
        _precedence(rows, graph, R, S, t)
        _dominance(rows, graph, R, S, t)
        if t + 1 < n:
            _keep(rows, R, S, t)
    held: Any = None
    first = graph.forward_count
    if in_flight > 1 and budget_bytes is not None and first < n:
        held = add_variable(prob, "held", 0, None)
        # held = sum_i M_i S[F, i]: what each of the other micro-batches in flight keeps
        rows.add("held", EQ, 0.0, [(held, 1), *((S[first][i], -mem[i]) for i in S[first] if mem[i])])
    _memory(prob, rows, graph, R, S, mem, budget_bytes, held, in_flight - 1, check)
    rows.into(prob)
    return CheckmateMILP(graph, prob, R, S, time.perf_counter() - start, mf, cf)


def _no_check() -> None:
    pass


def _unit_scale(values: Iterable[float]) -> float:
    """A power of two that brings the largest value to [1, 2)."""
    top = max(values, default=0.0)
    return 2.0 ** -(math.frexp(top)[1] - 1) if top > 0 else 1.0


LE, GE, EQ = pulp.LpConstraintLE, pulp.LpConstraintGE, pulp.LpConstraintEQ


class _Rows:
    """The constraints in the order they are written, each as its terms and constant, made into PuLP constraints
    in one go (``into``): one ``LpAffineExpression`` per row from its list of terms, the rows handed to the problem
    as one mapping (``LpProblem.extend``), instead of PuLP's operators building and copying an expression per term.
    Each row is the one the operators would give (``a <= b`` is ``a - b`` with sense LE; a constant on the left,
    ``1 <= e``, makes ``e - 1`` with sense GE), so HiGHS is handed the same model."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, float, list[tuple[Any, float]]]] = []

    def add(self, name: str, sense: int, constant: float, terms: list[tuple[Any, float]]) -> None:
        self.rows.append((name, sense, constant, terms))

    def into(self, prob: Any) -> None:
        expr, con = pulp.LpAffineExpression, pulp.LpConstraint
        prob.extend({name: con(expr(terms, constant), sense, name) for name, sense, constant, terms in self.rows})


def _precedence(rows: _Rows, graph: RematGraph, R: list[dict[int, Expr]], S: list[dict[int, Expr]], t: int) -> None:
    """Eq 1b, ``R[t,k] <= R[t,i] + S[t,i]`` for each operand ``i`` of ``k`` (an operand is computed in this stage
    or kept into it), and the reduction ``R[t,i] + S[t,i] <= 1`` (never recompute what is held)."""
    Rt, St = R[t], S[t]
    for k, r in Rt.items():
        if _const(r):
            if r == 0:
                continue
            for i in graph.nodes[k].deps:  # 1 <= R + S, unless both are constants (then it holds)
                if not _const(Rt[i]):
                    rows.add(f"dep_{t}_{k}_{i}", GE, -1, [(Rt[i], 1), (St[i], 1)])
            continue
        for i in graph.nodes[k].deps:
            if _const(Rt[i]):  # a zero-byte operand: R = 0, S = 1
                rows.add(f"dep_{t}_{k}_{i}", LE, -1, [(r, 1)])
            else:
                rows.add(f"dep_{t}_{k}_{i}", LE, 0, [(r, 1), (Rt[i], -1), (St[i], -1)])
    for i, s in St.items():
        if not _const(s):
            rows.add(f"once_{t}_{i}", LE, -1, [(Rt[i], 1), (s, 1)])


def _keep(rows: _Rows, R: list[dict[int, Expr]], S: list[dict[int, Expr]], t: int) -> None:
    """Eq 1c: ``S[t+1,i] <= R[t,i] + S[t,i]``, keep only what was in memory during the previous stage."""
    for i, s in S[t + 1].items():
        if _const(s):
            continue
        if i == t:  # R[t,t] = 1
            rows.add(f"keep_{t + 1}_{i}", LE, -1, [(s, 1)])
        else:
            rows.add(f"keep_{t + 1}_{i}", LE, 0, [(s, 1), (R[t][i], -1), (S[t][i], -1)])


def _dominance(rows: _Rows, graph: RematGraph, R: list[dict[int, Expr]], S: list[dict[int, Expr]], t: int) -> None:
    """Cuts that remove only dominated schedules (not in the paper): a value recomputed in stage ``t``, or held into
    it, is read in the stage or kept into the next; else dropping it costs nothing and frees memory."""
    nxt = S[t + 1] if t + 1 < len(graph) else {}
    Rt, St = R[t], S[t]
    for i in range(t):
        if _const(St[i]):
            continue
        readers: list[tuple[Any, float]] = [] if i not in nxt else [(nxt[i], -1)]
        ones = 0
        for j in graph.users[i]:  # users come after i
            if j > t:
                break
            if _const(Rt[j]):
                ones += Rt[j]
            else:
                readers.append((Rt[j], -1))
        constant = 0 - (0.0 + ones)  # as PuLP's operators sum it: 0.0, not -0.0, when nothing is constant
        if not _const(Rt[i]):
            rows.add(f"use_r_{t}_{i}", LE, constant, [(Rt[i], 1), *readers])
        rows.add(f"use_s_{t}_{i}", LE, constant, [(St[i], 1), *readers])


def _const(x: Expr) -> bool:
    return isinstance(x, int | float)


def _memory(
    prob: Any,
    rows: _Rows,
    graph: RematGraph,
    R: list[dict[int, Expr]],
    S: list[dict[int, Expr]],
    mem: list[float],
    budget: float | None,
    held: Any,
    others: float,
    check: Callable[[], None] = _no_check,
) -> None:
    """Memory accounting (sec 4.5): ``U[t,0] = sum_i M_i S[t,i] + M_0 R[t,0]``, and
    ``U[t,k] = U[t,k-1] + M_k R[t,k] - mem_freed_t(v_{k-1})`` with ``mem_freed_t(v_k) = sum M_i FREE[t,i,k]`` over
    ``i`` in ``DEPS[k] + {k}``; ``U[t,k] + others * held <= budget`` (``held`` None: ``U[t,k] <= budget``, a bound)."""
    n = len(graph)
    bound = budget if held is None else None
    for t in range(n):
        check()
        Rt, St = R[t], S[t]
        prev: Any = None
        for k in range(t + 1):
            u = add_variable(prob, f"U_{t}_{k}", 0, bound)
            r = Rt[k]
            if k == 0:
                terms = [(u, 1), *((St[i], -mem[i]) for i in St if mem[i] and not _const(St[i]))]
            else:
                terms = [(u, 1), (prev, -1)]
                terms += _freed(prob, rows, graph, R, S, mem, t, k - 1)
            if _const(r):
                constant = 0 - (0.0 + mem[k] * r)  # as PuLP's operators sum it (0.0, never -0.0)
            else:
                constant = 0.0
                terms.append((r, -mem[k]))
            rows.add(f"U_{t}_{k}", EQ, constant, terms)
            if held is not None:
                rows.add(f"budget_{t}_{k}", LE, -budget, [(u, 1), (held, others)])  # type: ignore[operator]
            prev = u


def _freed(
    prob: Any,
    rows: _Rows,
    graph: RematGraph,
    R: list[dict[int, Expr]],
    S: list[dict[int, Expr]],
    mem: list[float],
    t: int,
    k: int,
) -> list[tuple[Any, float]]:
    """The terms of ``mem_freed_t(v_k) = sum M_i FREE[t,i,k]`` (sec 4.5, eq 4-5), as ``U[t,k+1]``'s row holds them:
    ``v_i`` may be freed after ``v_k`` only if ``v_k`` is computed, ``v_i`` is not kept into stage ``t + 1`` and no
    later node of the stage reads it, i.e. only if ``num_hazards = (1 - R[t,k]) + S[t+1,i] + sum_{j in USERS[i],
    j > k} R[t,j]`` is 0.

    The paper makes ``FREE`` binary and ties it to ``num_hazards`` both ways with a big-M pair. Here each hazard
    bounds ``FREE`` on its own (``FREE <= R[t,k]``, ``FREE <= 1 - S[t+1,i]``, ``FREE <= 1 - R[t,j]``) and ``FREE`` is
    continuous in [0, 1]: for integral ``R`` and ``S`` its bounds are 0 or 1, and the memory constraints only gain
    from freeing, so the optimum is the paper's; a solution that frees less than it may still fits, and its
    schedule (``schedule_from_plan``) frees everything Checkmate's rule allows. The disaggregated bounds also give a
    tighter LP relaxation than the big-M pair, and ~60 % fewer binaries."""
    Rt = R[t]
    run = Rt[k]
    if _const(run) and run == 0:
        return []
    nxt = S[t + 1] if t + 1 < len(graph) else None
    terms = []
    for i in sorted({*graph.nodes[k].deps, k}):
        if not mem[i]:
            continue
        free = add_variable(prob, f"FREE_{t}_{i}_{k}", 0, 1)
        if not _const(run):
            rows.add(f"free_run_{t}_{i}_{k}", LE, 0, [(free, 1), (run, -1)])
        keep_next: Expr = nxt[i] if nxt is not None else 0
        if _const(keep_next):
            if keep_next:  # pragma: no cover - only zero-byte values are kept as constants, and those are skipped
                rows.add(f"free_kept_{t}_{i}_{k}", LE, 0, [(free, 1)])
        else:
            rows.add(f"free_kept_{t}_{i}_{k}", LE, -1, [(free, 1), (keep_next, 1)])
        for j in graph.users[i]:
            if k < j <= t:
                r = Rt[j]
                if not _const(r):
                    rows.add(f"free_read_{t}_{i}_{k}_{j}", LE, -1, [(free, 1), (r, 1)])
                elif r:
                    rows.add(f"free_read_{t}_{i}_{k}_{j}", LE, 0, [(free, 1)])
        terms.append((free, mem[i]))
    return terms


#: What one solver call costs outside the solver's own clock (PuLP's ``variables()``, handing the model to HiGHS,
#: reading the solution back), before the first call has been timed, as a multiple of the time ``build_milp`` took:
#: 0.5-0.75 measured on GPT-3 stages of 76,661 and ~200,000 variables (HiGHS through PuLP 3.3); 1.0 leaves room.
TRANSFER_PER_BUILD = 1.0
#: Once a call has been timed, the next is expected to cost this much more outside the solver (it also hands over
#: a start solution).
TRANSFER_GROWTH = 1.25
#: Seconds kept back at the end of the limit: for what follows the MILP solve (the solver overrunning its limit, as
#: HiGHS checks its clock between steps: ~0.2 s seen past a 0.5 s limit on 76,661 variables; reading the schedule off
#: ``R`` and ``S`` and replaying it: ~5 ms for 192 nodes), or, when the build is stopped this long before the
#: deadline, for freeing the half-built problem (0.04-0.2 s for ~1e5 variables on 2 shared cores).
FINAL_MARGIN_S = 0.25
#: A solver call given less than this is not made.
MIN_SOLVE_S = 0.05


def solve_milp(
    graph: RematGraph,
    budget_bytes: float | None,
    *,
    in_flight: float = 1,
    solver: str = "highs",
    time_limit_s: float | None = None,
    gap: float | None = None,
    start: RematResult | None = None,
    relax: bool = False,
    deadline: Deadline | None = None,
) -> RematResult:
    """Build and solve the MILP; the schedule is extracted from ``R`` and ``S`` and checked by ``replay``.

    ``start`` is a schedule that fits (e.g. the best baseline's) for the solver to start from. With ``relax``, the
    LP relaxation is solved first: its bound, and its held values rounded to a schedule (``start.rounded_start``,
    after Checkmate sec 5), which becomes the start when cheaper. When the start is then within ``gap`` of the LP
    bound, it is returned as proven (status ``optimal`` within the gap, the LP's bound) without branching.

    ``time_limit_s`` (or ``deadline``, which takes precedence) is wall-clock for the whole call: the build stops
    when it passes, each solver is handed what is left less what its call costs outside the solver's clock
    (``TRANSFER_PER_BUILD``) and ``FINAL_MARGIN_S``, and a call not worth making is skipped. When time runs out
    before the MILP's own answer, the best schedule found so far (the start, or the rounded relaxation) is
    returned with status ``feasible`` and a ``reason`` saying so; with none, status ``no solution``.

    >>> from plansim.remat.graph import linear_chain
    >>> r = solve_milp(linear_chain(4), budget_bytes=4)
    >>> r.solver.status, r.cost, r.peak_bytes <= 4
    ('optimal', 12.0, True)
    """
    began = time.perf_counter()
    deadline = Deadline(time_limit_s) if deadline is None else deadline
    out = _Outcome(graph, budget_bytes, in_flight, solver, deadline.seconds, gap, began)
    if deadline.expired():
        return out.time_up(start, "before the MILP was built")
    try:
        milp = build_milp(graph, budget_bytes, in_flight, deadline=deadline.less(FINAL_MARGIN_S))
    except TimeUp:
        return out.time_up(start, "while building the MILP")
    out.milp = milp
    total_cost = graph.total_cost
    overhead = TRANSFER_PER_BUILD * milp.build_time_s
    if relax:
        # the LP first when time is short: its bound may prove the start, its rounding improve it; the MILP gets
        # what the LP leaves
        lp_limit = deadline.solver_limit(overhead + FINAL_MARGIN_S)
        if lp_limit is None or lp_limit >= MIN_SOLVE_S:
            out.bound, holds, measured = _relaxation(milp, solver, lp_limit)
            if measured is not None:
                overhead = TRANSFER_GROWTH * measured
            rounded = (
                rounded_start(graph, holds, budget_bytes, in_flight, deadline=deadline.share(0.5)) if holds else None
            )
            if rounded is not None and (start is None or rounded.cost < start.cost * (1 - 1e-12)):
                start = rounded
        bound = out.bound
        if (
            start is not None
            and bound is not None
            and start.cost - bound <= (gap or 0.0) * total_cost + 1e-12 * total_cost
        ):
            report = out.report("optimal", start.cost, start.method)
            return replace(start, method="milp", solve_time_s=report.solve_time_s, solver=report, reason="")
    values = None
    if start is not None and start.schedule is not None:
        values = start_values(graph, *plan_of(graph, start.schedule), memory_scale=milp.memory_scale)
    limit = deadline.solver_limit(overhead + FINAL_MARGIN_S)
    if limit is not None and limit < MIN_SOLVE_S:
        return out.time_up(start, "before the MILP solve")
    outcome = run_solver(milp.prob, solver, time_limit_s=limit, gap=gap, start=values)
    if outcome.status == "no solution" and start is not None:  # the limit came before the solver's first schedule
        return out.time_up(start, "during the MILP solve")
    report = SolverReport(
        solver=outcome.solver,
        status=outcome.status,
        objective=None if outcome.objective is None else outcome.objective / milp.cost_scale,
        bound=None if outcome.bound is None else outcome.bound / milp.cost_scale,
        gap=outcome.gap,
        variables=milp.variables,
        constraints=milp.constraints,
        solve_time_s=time.perf_counter() - began - milp.build_time_s,
        build_time_s=milp.build_time_s,
        time_limit_s=deadline.seconds,
        gap_limit=gap,
        start=start.method if start is not None else "",
    )
    total = time.perf_counter() - began
    if outcome.status not in ("optimal", "feasible"):
        reason = (
            f"no schedule fits {budget_bytes:.4g} B"
            if outcome.status == "infeasible"
            else "time limit before any schedule"
        )
        return RematResult("milp", graph.name, budget_bytes, in_flight, False, None, None, total, report, reason)
    compute = [{i for i, r in milp.R[t].items() if _value(r) > 0.5} for t in range(len(graph))]
    keep = [{i for i, s in milp.S[t].items() if _value(s) > 0.5} for t in range(len(graph))]
    sched = schedule_from_plan(graph, compute, keep)
    rep = replay(graph, sched)
    return RematResult("milp", graph.name, budget_bytes, in_flight, True, sched, rep, total, report)


@dataclass
class _Outcome:
    """What ``solve_milp`` reports when it returns early: the problem's size once built, the LP bound once solved."""

    graph: RematGraph
    budget: float | None
    in_flight: float
    solver: str
    time_limit_s: float | None
    gap_limit: float | None
    began: float
    milp: CheckmateMILP | None = None
    bound: float | None = None

    def report(self, status: str, objective: float | None, start: str) -> SolverReport:
        seconds = time.perf_counter() - self.began
        build = self.milp.build_time_s if self.milp is not None else seconds
        gap = None
        if objective is not None and self.bound is not None:
            gap = max(0.0, objective - self.bound) / max(abs(objective), 1e-300)
        return SolverReport(
            self.solver,
            status,
            objective,
            self.bound,
            gap,
            self.milp.variables if self.milp is not None else 0,
            self.milp.constraints if self.milp is not None else 0,
            seconds - build,
            build,
            self.time_limit_s,
            self.gap_limit,
            start,
        )

    def time_up(self, found: RematResult | None, where: str) -> RematResult:
        """The best schedule found before the deadline (``found``, checked by replay), labelled ``feasible`` (not
        proven); without one, no schedule (status ``no solution``)."""
        limit = "the time limit" if self.time_limit_s is None else f"the time limit of {self.time_limit_s:g} s"
        if found is not None and found.feasible and found.schedule is not None:
            report = self.report("feasible", found.cost, found.method)
            reason = f"{limit} came {where}: the {found.method} schedule, not proven optimal"
            return replace(found, method="milp", solve_time_s=time.perf_counter() - self.began, solver=report,
                           reason=reason)  # fmt: skip
        report = self.report("no solution", None, "")
        reason = f"{limit} came {where}, before any schedule within the budget was found"
        seconds = time.perf_counter() - self.began
        return RematResult("milp", self.graph.name, self.budget, self.in_flight, False, None, None, seconds, report,
                           reason)  # fmt: skip


def _relaxation(
    milp: CheckmateMILP, solver: str, time_limit_s: float | None
) -> tuple[float | None, dict[int, float], float | None]:
    """The LP relaxation's bound on the objective (unscaled; None if not solved to optimality), the fraction of
    each forward value it holds when the backward pass starts (``S[F, i]``), and the seconds the call took outside
    the solver's own clock (HiGHS reports its run time; None for CBC)."""
    outcome = run_solver(milp.prob, solver, time_limit_s=time_limit_s, relax=True)
    run_time = getattr(getattr(milp.prob, "solverModel", None), "getRunTime", None)
    measured = max(0.0, outcome.solve_time_s - float(run_time())) if solver == "highs" and run_time else None
    if outcome.status != "optimal" or outcome.objective is None:
        return None, {}, measured
    first = milp.graph.forward_count
    holds = {i: _value(s) for i, s in milp.S[first].items()} if first < len(milp.graph) else {}
    return outcome.objective / milp.cost_scale, holds, measured


def start_values(
    graph: RematGraph, compute: list[set[int]], keep: list[set[int]], *, memory_scale: float = 1.0
) -> dict[str, float]:
    """Every variable's value (by name) for a plan, e.g. a baseline's: a MILP start the solver can improve on.

    The plan must satisfy the reductions (``R + S <= 1``, nothing held that is neither read nor kept: see
    ``baselines.tighten``); ``U`` and ``FREE`` follow from it as in ``_memory``."""
    n, mem = len(graph), [v.memory * memory_scale for v in graph.nodes]
    values: dict[str, float] = {}
    for t in range(n):
        nxt = keep[t + 1] if t + 1 < n else set()
        for i in range(t):
            if mem[i]:
                values[f"R_{t}_{i}"] = float(i in compute[t])
                values[f"S_{t}_{i}"] = float(i in keep[t])
        used = sum(mem[i] for i in keep[t] if i < t)
        for k in range(t + 1):
            if k > 0 and k - 1 in compute[t]:
                later = [j for j in compute[t] if j > k - 1]
                for i in sorted({*graph.nodes[k - 1].deps, k - 1}):
                    if not mem[i]:
                        continue
                    free = i not in nxt and not any(i in graph.nodes[j].deps for j in later)
                    values[f"FREE_{t}_{i}_{k - 1}"] = float(free)
                    used -= mem[i] * free
            if k in compute[t]:
                used += mem[k]
            values[f"U_{t}_{k}"] = used
    first = graph.forward_count
    if first < n:
        values["held"] = sum(mem[i] for i in keep[first] if i < first)
    return values


def _value(x: Expr) -> float:
    return float(x) if _const(x) else float(x.varValue or 0.0)
