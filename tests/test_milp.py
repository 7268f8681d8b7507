"""The PuLP portability layer solves a small MILP to the brute-force optimum (run under PuLP 3.x and 4.x)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pulp = pytest.importorskip("pulp")

from plansim.remat.milp import add_variable, run_solver  # noqa: E402

items = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=1, max_size=7)


@settings(max_examples=20, deadline=None)
@given(items=items, capacity=st.integers(1, 60))
def test_knapsack_matches_brute_force(items: list[tuple[int, int]], capacity: int) -> None:
    prob = pulp.LpProblem("knapsack", pulp.LpMaximize)
    x = [add_variable(prob, f"x{i}", 0, 1, "Binary") for i in range(len(items))]
    prob += pulp.lpSum(v * xi for (v, _), xi in zip(items, x, strict=True))
    prob += pulp.lpSum(w * xi for (_, w), xi in zip(items, x, strict=True)) <= capacity
    assert run_solver(prob).status == "optimal"
    best = max(
        sum(v for (v, _), c in zip(items, pick, strict=True) if c)
        for pick in itertools.product([0, 1], repeat=len(items))
        if sum(w for (_, w), c in zip(items, pick, strict=True) if c) <= capacity
    )
    assert round(pulp.value(prob.objective) or 0) == best


# --------------------------------------------------------------------------------------------------------------------
# run_solver reports only what the solver proved
# --------------------------------------------------------------------------------------------------------------------


def _toy_knapsack(constant: float = 0.0) -> tuple[pulp.LpProblem, float]:
    """min -(value picked) + constant with weights 3, 4, 5, 6 and capacity 10: best pick 4 + 6 (value 13)."""
    values, weights = [5, 6, 7, 7], [3, 4, 5, 6]
    prob = pulp.LpProblem("toy", pulp.LpMinimize)
    x = [add_variable(prob, f"x{i}", 0, 1, "Binary") for i in range(len(values))]
    prob += -pulp.lpSum(v * xi for v, xi in zip(values, x, strict=True)) + constant
    prob += pulp.lpSum(w * xi for w, xi in zip(weights, x, strict=True)) <= 10
    best = max(
        sum(v for v, c in zip(values, pick, strict=True) if c)
        for pick in itertools.product([0, 1], repeat=len(values))
        if sum(w for w, c in zip(weights, pick, strict=True) if c) <= 10
    )
    return prob, constant - best


@pytest.mark.parametrize("constant", [0.0, 100.0])
def test_run_solver_optimal_toy(constant: float) -> None:
    """A small MILP is proven optimal: objective (PuLP's constant term included) = brute force = the bound."""
    prob, best = _toy_knapsack(constant)
    assert best == constant - 13
    out = run_solver(prob, "highs")
    assert out.status == "optimal" and out.solver == "highs"
    assert out.objective == pytest.approx(best, abs=1e-9)
    assert out.bound == pytest.approx(best, abs=1e-6)
    assert out.gap == pytest.approx(0.0, abs=1e-9)


def test_run_solver_infeasible_toy() -> None:
    """Two binaries cannot sum to 3: 'infeasible', with no objective."""
    prob = pulp.LpProblem("infeasible", pulp.LpMinimize)
    x, y = add_variable(prob, "x", 0, 1, "Binary"), add_variable(prob, "y", 0, 1, "Binary")
    prob += x + y
    prob += x + y >= 3
    out = run_solver(prob, "highs")
    assert out.status == "infeasible" and out.objective is None


def test_run_solver_infeasible_only_by_integrality() -> None:
    """2x + 2y = 3 has LP solutions but no integer one: the MILP is proven 'infeasible', not 'no solution'."""
    prob = pulp.LpProblem("parity", pulp.LpMinimize)
    x, y = add_variable(prob, "x", 0, 5, "Integer"), add_variable(prob, "y", 0, 5, "Integer")
    prob += x + y
    prob += 2 * x + 2 * y == 3
    assert run_solver(prob, "highs").status == "infeasible"


def _hard_checkmate(layers: int = 30) -> tuple[object, dict[str, float], float]:
    """The Checkmate MILP of a chain at the sqrt(N) baseline's peak, and the sqrt plan as a start. With 30 layers
    HiGHS does not close the gap in 30 s (measured: objective 83, bound 81, from the sqrt plan's 86)."""
    from plansim.remat import linear_chain, run_baseline
    from plansim.remat.checkmate import build_milp, start_values
    from plansim.remat.schedule import plan_of

    graph = linear_chain(layers)
    sqrt = run_baseline(graph, "sqrt")
    milp = build_milp(graph, sqrt.peak_bytes)
    assert sqrt.schedule is not None
    return milp.prob, start_values(graph, *plan_of(graph, sqrt.schedule)), sqrt.cost


def test_run_solver_time_limit_is_not_optimal() -> None:
    """Stopped by a 0.05 s limit, a MILP that takes far longer to prove is 'feasible' (with a start: at most the
    start's cost, bound below the objective) or 'no solution', never 'optimal'."""
    prob, start, start_cost = _hard_checkmate()
    cold = run_solver(prob, "highs", time_limit_s=0.05)
    assert cold.status in ("feasible", "no solution"), cold
    if cold.status == "no solution":
        assert cold.objective is None
    warm = run_solver(prob, "highs", time_limit_s=0.05, start=start)
    assert warm.status == "feasible", warm
    assert warm.objective is not None and warm.objective <= start_cost + 1e-9
    assert warm.bound is None or warm.bound < warm.objective - 1e-6
    assert warm.gap is None or warm.gap > 0


def test_run_solver_gap_is_honest() -> None:
    """With a relative gap limit, 'optimal' means objective - bound <= gap x objective (the proof HiGHS gave)."""
    prob, start, _ = _hard_checkmate(12)
    out = run_solver(prob, "highs", time_limit_s=30, gap=0.1, start=start)
    assert out.status == "optimal", out
    assert out.objective is not None and out.bound is not None
    assert out.objective - out.bound <= 0.1 * out.objective + 1e-9


def test_run_solver_cbc_toy() -> None:
    """CBC (bundled with PuLP 3.x) solves the toy knapsack to the brute-force optimum; skipped without CBC."""
    from plansim.errors import PlansimError
    from plansim.remat.milp import make_solver

    try:
        make_solver("cbc")
    except PlansimError:
        pytest.skip("no CBC available")
    prob, best = _toy_knapsack(10.0)
    out = run_solver(prob, "cbc")
    assert out.status == "optimal" and out.solver == "cbc"
    assert out.objective == pytest.approx(best, abs=1e-9)
    assert out.bound is None or out.bound == pytest.approx(best, abs=1e-6)
    infeasible = pulp.LpProblem("infeasible", pulp.LpMinimize)
    x = add_variable(infeasible, "x", 0, 1, "Binary")
    infeasible += x
    infeasible += x >= 2
    assert run_solver(infeasible, "cbc").status == "infeasible"
