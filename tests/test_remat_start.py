"""The MILP's starts and what they rest on: contracting a graph (``coarsen``), the local search over checkpoint sets
and the LP-rounded start (``start``), and the LP bound that can prove a start within the gap without branching."""

from __future__ import annotations

import itertools
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_remat import _lists, reference_optimum, training_dags

from plansim.api import load_hardware, load_model
from plansim.errors import PlansimError
from plansim.remat import RematGraph, linear_chain, replay, run_baseline, solve_remat, stage_graph
from plansim.remat.baselines import FIXED
from plansim.remat.checkmate import solve_milp
from plansim.remat.coarsen import coarse_checkpoints, contract, layer_parts
from plansim.remat.start import improve_checkpoints, rounded_start
from plansim.step.prepare import comm_pricer, prepare_step
from plansim.strategy.schema import Strategy


@cache
def _gpt_stage(layers: int, granularity: str) -> RematGraph:
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=8)
    prep = prepare_step(model, cluster, Strategy(dp=8, micro_batch=1, global_batch=8))
    return stage_graph(
        prep.graph,
        range(layers),
        prep.kernels,
        comm_pricer(cluster, prep.strategy),
        granularity=granularity,  # type: ignore[arg-type]
    )


# --------------------------------------------------------------------------------------------------------------------
# coarsen
# --------------------------------------------------------------------------------------------------------------------


@st.composite
def _contiguous_labels(draw: st.DrawFn, graph: RematGraph) -> list[int]:
    """Forward nodes cut into runs of consecutive nodes; each gradient node alone."""
    labels, group = [], 0
    for i in range(graph.forward_count):
        if i and draw(st.booleans()):
            group += 1
        labels.append(group)
    return labels + [group + 1 + k for k in range(len(graph) - graph.forward_count)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), graph=training_dags())
def test_contract_keeps_costs_bytes_and_edges(data: st.DataObject, graph: RematGraph) -> None:
    """A contracted graph has the same total cost and bytes, every fine edge between groups as a coarse edge (and no
    other), and its nodes in topological order (``RematGraph`` checks that on construction)."""
    labels = data.draw(_contiguous_labels(graph))
    coarse, group = contract(graph, labels)
    assert len(coarse) == len(set(labels))
    assert coarse.total_cost == pytest.approx(graph.total_cost)
    assert sum(n.memory for n in coarse.nodes) == pytest.approx(sum(n.memory for n in graph.nodes))
    fine_edges = {(group[d], group[i]) for i, n in enumerate(graph.nodes) for d in n.deps if group[d] != group[i]}
    coarse_edges = {(d, k) for k, n in enumerate(coarse.nodes) for d in n.deps}
    assert coarse_edges == fine_edges


def test_contract_rejects_a_cycle_and_mixed_groups() -> None:
    chain = linear_chain(3)  # f0 f1 f2 loss grad:f2 grad:f1 grad:f0
    with pytest.raises(PlansimError, match="cycle"):
        contract(chain, [0, 1, 0, 2, 3, 4, 5])  # {f0, f2} is read by f1 and reads it
    with pytest.raises(PlansimError, match="mixes forward and backward"):
        contract(chain, [0, 1, 2, 3, 3, 4, 5])


@pytest.mark.parametrize("layers", [1, 3])
def test_layer_granularity_is_the_op_graph_contracted(layers: int) -> None:
    """Four nodes per block, the block's cost and bytes; carried checkpoints replay on the op graph."""
    op, layer = _gpt_stage(layers, "op"), _gpt_stage(layers, "layer")
    labels = layer_parts(op)
    coarse, group = contract(op, labels)
    assert len(coarse) == len(layer) == 8 * layers
    assert [n.name for n in coarse.nodes] == [n.name for n in layer.nodes]
    assert coarse.total_cost == pytest.approx(op.total_cost)
    held = {k for k in range(coarse.forward_count) if not coarse.nodes[k].selective}  # selective, coarse
    carried = coarse_checkpoints(op, group, held)
    assert {op.nodes[i].name for i in carried} == {
        op.nodes[i].name for i in range(op.forward_count) if group[i] in held
    }
    assert carried == FIXED["selective"](op)  # the same decision at either granularity


def test_layer_parts_leave_chains_alone() -> None:
    """Every chain node is its own layer: contracting saves nothing, so no coarse start is tried."""
    g = linear_chain(6)
    assert len(set(layer_parts(g))) == len(g)


# --------------------------------------------------------------------------------------------------------------------
# local search and LP rounding
# --------------------------------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=training_dags(), method=st.sampled_from(sorted(FIXED)), slack=st.floats(0, 1))
def test_local_search_never_worse_and_replays(graph: RematGraph, method: str, slack: float) -> None:
    """From a baseline that fits, the local search ends no costlier and within the budget; its schedule replays."""
    base = run_baseline(graph, method)
    budget = base.peak_bytes * (1 + slack)
    start = FIXED[method](graph)
    out = improve_checkpoints(graph, start, budget)
    assert out.feasible and out.peak_bytes <= budget * (1 + 1e-9)
    assert out.cost <= base.cost + 1e-9
    assert out.schedule is not None
    assert replay(graph, out.schedule).cost == pytest.approx(out.cost)


def test_local_search_reaches_a_fit_from_keep_all() -> None:
    """Keeping everything does not fit sqrt(N)'s peak on chain-16; from there the search finds a schedule that does
    (while nothing fits it lowers the peak)."""
    g = linear_chain(16)
    budget = run_baseline(g, "sqrt").peak_bytes
    assert run_baseline(g, "none").peak_bytes > budget
    out = improve_checkpoints(g, FIXED["none"](g), budget)
    assert out.feasible and out.peak_bytes <= budget


def test_rounded_start_thresholds() -> None:
    """Integral held fractions give back the checkpoints they encode (here sqrt's) before the local search."""
    g = linear_chain(9)
    sqrt = run_baseline(g, "sqrt")
    holds = {i: float(i in FIXED["sqrt"](g)) for i in range(g.forward_count)}
    out = rounded_start(g, holds, sqrt.peak_bytes)
    assert out is not None and out.feasible and out.cost <= sqrt.cost
    assert rounded_start(g, holds, 1.0) is None  # nothing fits one byte


# --------------------------------------------------------------------------------------------------------------------
# the gap, proven by the LP bound or by branching
# --------------------------------------------------------------------------------------------------------------------


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=training_dags(max_forward=4), pick=st.integers(0, 10), gap=st.sampled_from([0.05, 0.2, 0.5]))
def test_gap_is_proven(graph: RematGraph, pick: int, gap: float) -> None:
    """With a gap limit, an 'optimal' answer's bound is a true lower bound (<= the exhaustive optimum) and its cost
    is within gap x total cost of it, whether the LP bound proved it or branching did."""
    total = int(sum(n.memory for n in graph.nodes))
    ref = reference_optimum(*_lists(graph), list(range(total + 1)))
    fits = sorted(b for b, c in ref.items() if c is not None)
    budget = fits[pick % len(fits)]
    optimum = ref[budget]
    assert optimum is not None
    res = solve_remat(graph, budget, gap=gap)
    assert res.solver is not None and res.solver.status == "optimal" and res.feasible
    assert res.peak_bytes <= budget
    assert res.cost >= optimum - 1e-6
    assert res.cost - optimum <= gap * graph.total_cost + 1e-6
    assert res.solver.bound is not None and res.solver.bound <= optimum + 1e-6


def test_lp_bound_proves_the_op_stage_start() -> None:
    """Two GPT-3 1.3B blocks at op granularity, at the selective peak: the answer within 1 % is within 1 % of the
    MILP solved to optimality (no start, no relaxation), and the bound is below that optimum."""
    g = _gpt_stage(2, "op")
    budget = run_baseline(g, "selective").peak_bytes
    exact = solve_milp(g, budget, time_limit_s=60)
    assert exact.solver is not None and exact.solver.status == "optimal"
    fast = solve_remat(g, budget, gap=0.01, time_limit_s=60)
    assert fast.solver is not None and fast.solver.status == "optimal" and fast.solver.start
    assert exact.cost - 1e-12 <= fast.cost <= exact.cost + 0.01 * g.total_cost
    assert fast.solver.bound is not None and fast.solver.bound <= exact.cost * (1 + 1e-9)
    assert fast.cost <= run_baseline(g, "selective").cost


@pytest.mark.parametrize("in_flight", [1, 3])
def test_solve_milp_relax_agrees_with_branching(in_flight: int) -> None:
    """``relax=True`` with a start changes how the optimum is reached, not the optimum (chains, gap 0)."""
    for layers, budget in itertools.product([4, 7], [4.0, 6.0]):
        g = linear_chain(layers)
        plain = solve_milp(g, budget * in_flight, in_flight=in_flight)
        start = improve_checkpoints(g, set(), budget * in_flight, in_flight)
        relaxed = solve_milp(
            g, budget * in_flight, in_flight=in_flight, relax=True, start=start if start.feasible else None
        )
        assert plain.feasible == relaxed.feasible
        if plain.feasible:
            assert relaxed.cost == pytest.approx(plain.cost)
