"""PuLP across its versions: PuLP 3.3 (what Python 3.11 gets; bundles CBC) and PuLP 4.x (Python >= 3.12; bundles no
CBC, and variables are made by the problem, not by the ``LpVariable`` constructor). HiGHS, through highspy, is the
default solver on both. Import this module only where a MILP is solved: PuLP is a heavy import.
"""

from __future__ import annotations

from typing import Any, Literal

import pulp

from plansim.errors import PlansimError

__all__ = ["add_variable", "default_solver", "solve"]


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


def default_solver(msg: bool = False, time_limit_s: float | None = None) -> Any:
    """HiGHS via highspy when available, else PuLP's bundled CBC (PuLP 3.x only)."""
    available = set(pulp.listSolvers(onlyAvailable=True))
    if "HiGHS" in available:
        return pulp.HiGHS(msg=msg, timeLimit=time_limit_s)
    if "PULP_CBC_CMD" in available:  # pragma: no cover - only without highspy
        return getattr(pulp, "PULP_CBC_CMD")(msg=msg, timeLimit=time_limit_s)  # noqa: B009 - absent from PuLP 4
    raise PlansimError("no MILP solver found: install highspy (pip install highspy)")  # pragma: no cover


# PuLP's status codes, the same in 3.x (an int from ``solve``) and 4.x (``LpSolveStats.status``, an int enum).
_STATUS_NAMES = {1: "Optimal", 0: "Not Solved", -1: "Infeasible", -2: "Unbounded", -3: "Undefined", -4: "TimeLimit"}


def solve(prob: Any, msg: bool = False, time_limit_s: float | None = None) -> str:
    """Solve ``prob`` with the default solver; return the status name ("Optimal", "Infeasible", ...)."""
    outcome = prob.solve(default_solver(msg, time_limit_s))
    code = int(getattr(outcome, "status", outcome))
    return _STATUS_NAMES.get(code, f"status {code}")
