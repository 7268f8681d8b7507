"""PuLP across its versions: PuLP 3.3 (what Python 3.11 gets; bundles CBC) and PuLP 4.x (Python >= 3.12; bundles no
CBC, and variables are made by the problem, not by the ``LpVariable`` constructor). HiGHS, through highspy, is the
default solver on both. Import this module only where a MILP is solved: PuLP is a heavy import.

``run_solver`` solves with HiGHS or CBC, from a start solution where given, and reports what is proven
(``SolveOutcome``): ``optimal`` only when the solver proved it, a time-out with a solution ``feasible``; bound and gap
from HiGHS (PuLP's CBC interface gives none). An infeasibility from HiGHS is confirmed without presolve before it is
reported: HiGHS 1.16's presolve calls some feasible remat MILPs infeasible.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import pulp

from plansim.errors import PlansimError
from plansim.files.outputs import c_stdout_silenced

__all__ = ["SOLVERS", "SolveOutcome", "add_variable", "make_solver", "run_solver"]

_PULP_MAJOR = int(pulp.__version__.split(".")[0])


def add_variable(
    prob: Any,
    name: str,
    low: float | None = None,
    up: float | None = None,
    cat: Literal["Continuous", "Integer", "Binary"] = "Continuous",
) -> Any:
    """A new variable of ``prob``: ``LpProblem.add_variable`` exists on PuLP >= 3.3 and is the only way on 4.x.

    >>> prob = pulp.LpProblem("p", pulp.LpMinimize)
    >>> add_variable(prob, "x", 0, 1, "Binary").name
    'x'
    """
    return prob.add_variable(name, low, up, cat)


@dataclass(frozen=True)
class SolveOutcome:
    """An honest account of one solve.

    ``status``: ``optimal`` (proven, within the gap limit), ``feasible`` (a solution, unproven: a limit stopped the
    search), ``infeasible``, ``unbounded`` or ``no solution``. ``bound`` and ``gap`` as the solver reports them
    (HiGHS does; PuLP's CBC interface does not: None).
    """

    solver: str
    status: str
    objective: float | None
    bound: float | None
    gap: float | None
    solve_time_s: float


#: ``--solver`` choices: HiGHS through highspy, or CBC (bundled with PuLP 3.x; on PATH for PuLP 4.x).
SOLVERS = ("highs", "cbc")


def make_solver(
    name: str,
    msg: bool = False,
    time_limit_s: float | None = None,
    gap_abs: float | None = None,
    start: dict[str, float] | None = None,
    gap_rel: float | None = None,
    mip: bool = True,
    presolve: bool = True,
) -> Any:
    """A PuLP solver object for ``name`` (``highs`` or ``cbc``); PlansimError naming the fix when unavailable.

    ``gap_abs`` stops the search once objective and bound are that close; ``start`` (variable name -> value) is a
    feasible solution to start from (HiGHS: ``Highs.setSolution``; CBC: PuLP's warm start). ``mip=False`` solves
    the LP relaxation (integrality dropped by the solver, the problem left as it is)."""
    available = set(pulp.listSolvers(onlyAvailable=True))
    if name == "highs":
        if "HiGHS" not in available:
            raise PlansimError("solver highs: highspy is not installed (pip install highspy), or use --solver cbc")
        return _StartedHiGHS(
            start, mip=mip, msg=msg, timeLimit=time_limit_s, gapAbs=gap_abs, gapRel=0.0 if gap_abs else gap_rel,
            **({} if presolve else {"presolve": "off"}),
        )  # fmt: skip
    if name == "cbc":
        for cls in ("PULP_CBC_CMD", "COIN_CMD"):
            if cls in available:
                return getattr(pulp, cls)(
                    mip=mip,
                    msg=msg,
                    timeLimit=time_limit_s,
                    gapAbs=gap_abs,
                    gapRel=0.0 if gap_abs else gap_rel,
                    warmStart=bool(start),
                )
        raise PlansimError(
            "solver cbc: no CBC found (PuLP >= 4 bundles none: install coinor-cbc), or use --solver highs"
        )
    raise PlansimError(f"unknown solver {name!r}: choose one of {', '.join(SOLVERS)}")


# PuLP's solution-status codes (``LpProblem.sol_status``): unlike the solve status, they tell a proven optimum (1)
# from a solution found before a time limit (2), in 3.x and 4.x alike.
_SOLUTION_STATUS = {1: "optimal", 2: "feasible", 0: "no solution", -1: "infeasible", -2: "unbounded"}


def run_solver(
    prob: Any,
    solver: str = "highs",
    *,
    time_limit_s: float | None = None,
    gap: float | None = None,
    start: dict[str, float] | None = None,
    relax: bool = False,
) -> SolveOutcome:
    """Solve ``prob`` and report what is proven: a time-out with a solution is ``feasible``, not ``optimal``. The
    solver prints nothing (``msg`` off; its banner, written by C code on file descriptor 1, silenced), so
    ``--format json`` stays JSON.
    ``bound`` and ``gap`` assume a minimization (the remat MILP's sense). ``relax`` solves the LP relaxation
    instead: its optimum is then the bound (a lower bound on the MILP's).

    ``gap`` is relative to the whole objective, constant term included (PuLP hands the solver the objective without
    it, so it becomes an absolute gap of ``gap * constant``, which implies the relative one)."""
    constant = float(prob.objective.constant)
    gap_abs = gap * abs(constant) if gap and constant else None
    gap_rel = gap if gap and not constant else None
    if start and solver == "cbc":
        for var in prob.variables():
            if var.name in start:
                var.setInitialValue(start[var.name])
    began = time.perf_counter()
    status = _solve(prob, solver, time_limit_s, gap_abs, gap_rel, start, relax, presolve=True)
    if status == "infeasible" and solver == "highs":
        # HiGHS 1.16's presolve declares some feasible remat MILPs infeasible (an 8-node training graph at a budget
        # of 11 B, tests/test_remat.py: CBC and HiGHS without presolve both find the optimum, cost 3): an
        # infeasibility is confirmed without presolve before it is reported
        left = None if time_limit_s is None else max(MIN_RESOLVE_S, time_limit_s - (time.perf_counter() - began))
        status = _solve(prob, solver, left, gap_abs, gap_rel, start, relax, presolve=False)
    elapsed = time.perf_counter() - began
    objective = pulp.value(prob.objective) if status in ("optimal", "feasible") else None
    bound = _highs_bound(prob) if solver == "highs" and not relax else None
    if bound is not None:  # HiGHS is given the objective without PuLP's constant term
        bound += float(prob.objective.constant)
    if status == "optimal" and bound is None and not gap:
        bound = objective
    rel_gap = None
    if objective is not None and bound is not None:
        rel_gap = max(0.0, objective - bound) / max(abs(objective), 1e-300)
    return SolveOutcome(solver, status, objective, bound, rel_gap, elapsed)


_STATUS_FALLBACK = {1: "optimal", -1: "infeasible", -2: "unbounded"}

#: Seconds given at least to the re-solve that confirms an infeasibility without presolve (past the time limit, it
#: ends without a solution: reported as not proven, never as infeasible).
MIN_RESOLVE_S = 0.05


def _solve(
    prob: Any,
    solver: str,
    time_limit_s: float | None,
    gap_abs: float | None,
    gap_rel: float | None,
    start: dict[str, float] | None,
    relax: bool,
    *,
    presolve: bool,
) -> str:
    """One solver call: the solution's status."""
    backend = make_solver(
        solver, time_limit_s=time_limit_s, gap_abs=gap_abs, gap_rel=gap_rel, start=start, mip=not relax,
        presolve=presolve,
    )  # fmt: skip
    with c_stdout_silenced(), _variables_listed(prob):  # HiGHS prints a banner on fd 1 when its first model is made
        outcome = prob.solve(backend)
    code = int(getattr(outcome, "status", outcome))
    sol = getattr(prob, "sol_status", None)
    status = (
        _SOLUTION_STATUS.get(int(sol), "no solution") if sol is not None else _STATUS_FALLBACK.get(code, "no solution")
    )
    return "infeasible" if code == -1 else status


@contextmanager
def _variables_listed(prob: Any) -> Iterator[None]:
    """``prob.variables()`` listed once for the length of a solve: PuLP 3.x rescans every constraint and sorts the
    columns on each call (``LpProblem.variables``), and its HiGHS interface calls it several times a solve over a
    model that does not change once the solve has begun (the same list, in the same order)."""
    scan = prob.variables
    columns: list[Any] = []

    def listed() -> list[Any]:
        # on first call, within the solve: after PuLP's ``fixObjective`` adds its dummy column to an empty objective
        if not columns:
            columns.extend(scan())
        return columns

    prob.variables = listed  # an instance attribute over the method, removed after the solve
    try:
        yield
    finally:
        del prob.variables


def _highs_bound(prob: Any) -> float | None:
    """HiGHS's proven lower bound (minimization), read from the highspy model PuLP keeps on the problem."""
    model = getattr(prob, "solverModel", None)
    if model is None or not hasattr(model, "getInfo"):
        return None
    bound = getattr(model.getInfo(), "mip_dual_bound", None)
    return float(bound) if bound is not None and math.isfinite(bound) else None


class _StartedHiGHS(pulp.HiGHS):
    """PuLP's highspy interface, handing HiGHS a start solution before it runs (PuLP's own has no warm start), and
    the model in bulk (``buildSolverModel``)."""

    def __init__(self, start: dict[str, float] | None, **options: Any) -> None:
        super().__init__(**options)
        self.start = start

    def buildSolverModel(self, lp: Any) -> None:
        """The model as PuLP 3.x's ``HiGHS.buildSolverModel`` hands it to HiGHS (the same columns in the same order,
        with their costs, bounds and integrality, the same rows, their bounds and nonzero coefficients; each
        variable's and constraint's ``index`` set for reading the solution back), in three calls (``addCols``,
        ``changeColsIntegrality``, ``addRows``) instead of one call per column and per row; ``tests/test_milp.py``
        compares the two models HiGHS holds. PuLP 4.x, whose interface differs, builds its own way."""
        if _PULP_MAJOR >= 4:  # pragma: no cover - PuLP 3.3 is what Python 3.11 gets
            super().buildSolverModel(lp)
            return
        import highspy
        import numpy as np

        inf = highspy.kHighsInf
        columns = lp.variables()
        sign = -1 if lp.sense == pulp.LpMaximize else 1
        objective = lp.objective
        costs, lower, upper, integer = [], [], [], []
        for i, var in enumerate(columns):
            var.index = i
            costs.append(sign * objective.get(var, 0.0))
            lower.append(-inf if var.lowBound is None else var.lowBound)
            upper.append(inf if var.upBound is None else var.upBound)
            if var.cat == pulp.LpInteger and self.mip:
                integer.append(i)
        model = lp.solverModel
        n = len(columns)
        model.addCols(
            n, np.array(costs, dtype=np.float64), np.array(lower, dtype=np.float64),
            np.array(upper, dtype=np.float64), 0, np.zeros(n, dtype=np.int32), np.zeros(0, dtype=np.int32),
            np.zeros(0, dtype=np.float64),
        )  # fmt: skip
        if integer:
            model.changeColsIntegrality(
                len(integer), np.array(integer, dtype=np.int32),
                np.full(len(integer), highspy.HighsVarType.kInteger.value, dtype=np.uint8),
            )  # fmt: skip
        row_lower: list[float] = []
        row_upper: list[float] = []
        starts: list[int] = []
        indices: list[int] = []
        values: list[float] = []
        for i, constraint in enumerate(lp._constraints.values()):
            constraint.index = i
            starts.append(len(indices))
            for var, coefficient in constraint.items():
                if coefficient != 0:
                    indices.append(var.index)
                    values.append(coefficient)
            lb, ub = constraint.getLb(), constraint.getUb()
            row_lower.append(-inf if lb is None else lb)
            row_upper.append(inf if ub is None else ub)
        if row_lower:
            model.addRows(
                len(row_lower), np.array(row_lower, dtype=np.float64), np.array(row_upper, dtype=np.float64),
                len(indices), np.array(starts, dtype=np.int32), np.array(indices, dtype=np.int32),
                np.array(values, dtype=np.float64),
            )  # fmt: skip

    def callSolver(self, lp: Any) -> None:
        if self.start:
            import highspy

            # the columns in the order PuLP built them: ``exported_variables`` on 4.x, ``variables`` on 3.x
            columns = getattr(lp, "exported_variables", lp.variables)()
            cols = [self.start.get(var.name, 0.0) for var in columns]
            solution = highspy.HighsSolution()
            solution.col_value = cols
            solution.value_valid = True
            lp.solverModel.setSolution(solution)
        super().callSolver(lp)
