"""Where the MILP starts: the cheapest schedule that fits among the baselines, the coarse MILP's carried to the fine
graph, the LP relaxation's rounded (``rounded_start``, used by ``checkmate.solve_milp``), and what a local search over
checkpoint sets makes of the best of them.

A MIP start only adds an incumbent: the solver still proves its bound, and every start is a schedule that ``replay``
has checked against the budget, so the result can only get better and its status stays honest. Starting near the
optimum matters on op-granularity stage graphs, where HiGHS's own heuristics take most of a minute to find a
schedule as good as the one the root bound already certifies within 1 %.

- ``coarse``: the layer-granularity MILP (``coarsen``), whose held values become checkpoints of the fine graph.
- the local search: from a checkpoint set, put the same node (by position in its layer) of every layer at once in or
  out of it, since a stage's blocks are alike, or one forward node; keep a flip that fits and lowers the cost (or,
  while nothing fits, the peak); stop when no flip helps. First improvement, in a fixed order: deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from plansim.errors import PlansimError
from plansim.remat.baselines import BASELINES, run_baseline, run_checkpoints
from plansim.remat.coarsen import coarse_checkpoints, contract, layer_parts
from plansim.remat.deadline import Deadline
from plansim.remat.graph import RematGraph
from plansim.remat.result import RematResult
from plansim.remat.schedule import plan_of

__all__ = ["improve_checkpoints", "milp_start", "rounded_start"]

#: A coarse solve for ``_coarse``: (graph, budget, in_flight, deadline) -> result.
CoarseSolver = Callable[[RematGraph, float | None, float, Deadline], RematResult]


def milp_start(
    graph: RematGraph,
    budget: float | None,
    in_flight: float,
    deadline: Deadline,
    coarse_solver: CoarseSolver,
) -> RematResult | None:
    """The start for ``graph``'s MILP, its method naming where it came from (``selective``, ``coarse+local``, ...);
    None when no schedule found fits the budget. The search ends at half the time ``deadline`` leaves: the fixed
    baselines always run (they are the fallback, one schedule each), greedy's threshold search stops at a quarter,
    ``coarse_solver`` solves the layer-granularity graph (the MILP) within a quarter of what is left then, and the
    local search stops at the half."""
    phase = deadline.share(0.5)
    greedy = phase.share(0.5)
    results = [run_baseline(graph, m, budget, in_flight, deadline=greedy) for m in BASELINES]
    coarse = None if phase.expired() else _coarse(graph, budget, in_flight, deadline.share(0.25), coarse_solver)
    if coarse is not None:
        results.append(coarse)
    fits = [r for r in results if r.feasible]
    best = min(fits, key=lambda r: r.cost) if fits else min(results, key=lambda r: r.peak_bytes)
    if best.schedule is None:  # pragma: no cover - baselines always have a schedule
        return None
    if not phase.expired():
        improved = improve_checkpoints(graph, _checkpoints(graph, best), budget, in_flight, deadline=phase)
        if improved.feasible and (not best.feasible or improved.cost < best.cost * (1 - 1e-12)):
            best = replace(improved, method=f"{best.method}+local")
    return best if best.feasible and best.schedule is not None else None


def rounded_start(
    graph: RematGraph,
    holds: Mapping[int, float],
    budget: float | None,
    in_flight: float = 1,
    *,
    deadline: Deadline | None = None,
) -> RematResult | None:
    """A schedule from the LP relaxation (after Checkmate sec 5, which rounds the relaxation's ``S`` and then
    re-solves for ``R``): keep as checkpoints the forward values held into the backward pass with a fraction of at
    least ``theta`` (``holds``: node -> ``S[F, i]``), for every distinct ``theta``; the cheapest that fits (or, if none
    does, the smallest peak) is improved by the local search. None when nothing fits. Past ``deadline`` no further
    threshold is tried (at least one is) and the local search stops.

    >>> from plansim.remat.graph import linear_chain
    >>> r = rounded_start(linear_chain(8), {i: 1.0 if i % 3 == 0 else 0.2 for i in range(9)}, budget=6)
    >>> r.feasible, r.method
    (True, 'lp-rounding+local')
    """
    forward = {i: v for i, v in holds.items() if i < graph.forward_count}
    results: list[RematResult] = []
    for theta in sorted({*forward.values(), 0.5}):
        if results and deadline is not None and deadline.expired():
            break
        chosen = {i for i, v in forward.items() if v >= theta - 1e-9}
        results.append(run_checkpoints(graph, chosen, budget, in_flight, "lp-rounding"))
    fits = [r for r in results if r.feasible]
    best = min(fits, key=lambda r: r.cost) if fits else min(results, key=lambda r: r.peak_bytes)
    improved = improve_checkpoints(graph, _checkpoints(graph, best), budget, in_flight, deadline=deadline)
    if improved.feasible and (not best.feasible or improved.cost < best.cost * (1 - 1e-12)):
        best = replace(improved, method="lp-rounding+local")
    return best if best.feasible else None


def _checkpoints(graph: RematGraph, result: RematResult) -> set[int]:
    """The forward nodes a schedule holds when the backward pass starts."""
    assert result.schedule is not None
    keep = plan_of(graph, result.schedule)[1]
    held = keep[graph.forward_count] if graph.forward_count < len(graph) else set()
    return {i for i in held if i < graph.forward_count}


def _coarse(
    graph: RematGraph,
    budget: float | None,
    in_flight: float,
    deadline: Deadline,
    solve: CoarseSolver,
) -> RematResult | None:
    """The layer-granularity schedule carried to ``graph``: what it holds into the backward pass becomes the
    checkpoints. None when contracting saves little (fewer than half the nodes go) or the coarse program has no
    schedule."""
    labels = layer_parts(graph)
    if len(set(labels)) > len(graph) // 2:
        return None
    try:
        coarse, group = contract(graph, labels)
    except PlansimError:
        return None
    r = solve(coarse, budget, in_flight, deadline)
    if not r.feasible or r.schedule is None:
        return None
    return run_checkpoints(
        graph, coarse_checkpoints(graph, group, _checkpoints(coarse, r)), budget, in_flight, "coarse"
    )


def improve_checkpoints(
    graph: RematGraph,
    checkpoints: set[int],
    budget: float | None,
    in_flight: float = 1,
    *,
    deadline: Deadline | None = None,
) -> RematResult:
    """A local search from ``checkpoints`` (see the module's docstring); the result is the best checkpoint schedule
    found (method ``local``), feasible or, when none fits, the one with the smallest peak. Past ``deadline`` no
    further flip is tried (the start's schedule is always evaluated).

    >>> from plansim.remat.graph import linear_chain
    >>> r = improve_checkpoints(linear_chain(8), set(), budget=6)
    >>> r.feasible, r.peak_bytes <= 6
    (True, True)
    """

    def key(r: RematResult) -> tuple[bool, float, float]:
        return (not r.feasible, r.cost if r.feasible else r.peak_bytes, r.peak_bytes)

    moves = _moves(graph)
    current = set(checkpoints)
    best = run_checkpoints(graph, current, budget, in_flight, "local")
    improved = True
    while improved and (deadline is None or not deadline.expired()):
        improved = False
        for move in moves:
            for wanted in (True, False):
                trial = current | move if wanted else current - move
                if trial == current:
                    continue
                r = run_checkpoints(graph, trial, budget, in_flight, "local")
                if key(r) < key(best):
                    current, best, improved = trial, r, True
            if deadline is not None and deadline.expired():
                break
    return best


def _moves(graph: RematGraph) -> list[frozenset[int]]:
    """The flips: each forward node that holds bytes, then, for each position within a layer, that node of every
    layer."""
    singles = [frozenset({i}) for i in range(graph.forward_count) if graph.nodes[i].memory > 0]
    rank: dict[int, int] = {}
    by_position: dict[int, set[int]] = {}
    for i in range(graph.forward_count):
        node = graph.nodes[i]
        position = rank.get(node.layer, 0)
        rank[node.layer] = position + 1
        if node.memory > 0:
            by_position.setdefault(position, set()).add(i)
    columns = [frozenset(v) for _, v in sorted(by_position.items()) if len(v) > 1]
    return columns + singles
