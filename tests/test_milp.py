"""The PuLP portability layer solves a small MILP to the brute-force optimum (run under PuLP 3.x and 4.x)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

pulp = __import__("pytest").importorskip("pulp")

from plansim.milp import add_variable, solve  # noqa: E402

items = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=1, max_size=7)


@settings(max_examples=20, deadline=None)
@given(items=items, capacity=st.integers(1, 60))
def test_knapsack_matches_brute_force(items: list[tuple[int, int]], capacity: int) -> None:
    prob = pulp.LpProblem("knapsack", pulp.LpMaximize)
    x = [add_variable(prob, f"x{i}", 0, 1, "Binary") for i in range(len(items))]
    prob += pulp.lpSum(v * xi for (v, _), xi in zip(items, x, strict=True))
    prob += pulp.lpSum(w * xi for (_, w), xi in zip(items, x, strict=True)) <= capacity
    assert solve(prob) == "Optimal"
    best = max(
        sum(v for (v, _), c in zip(items, pick, strict=True) if c)
        for pick in itertools.product([0, 1], repeat=len(items))
        if sum(w for (_, w), c in zip(items, pick, strict=True) if c) <= capacity
    )
    assert round(pulp.value(prob.objective) or 0) == best
