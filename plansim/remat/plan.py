"""``remat: milp`` for one pipeline stage: the stage's blocks as a remat graph, the MILP within the activation
budget, and what both engines read from its schedule (recompute time, FLOPs and bytes per layer).

Solutions are memoized on the graph's content, the budget and the options (the time limit among them), so the
analytic engine, the discrete-event lowering and identical stages share one solve. The time limit is wall-clock for
the stage: building its graph, the solve (``solve_remat``) and, when no schedule fits, the tightest baseline; a
memoized stage costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from plansim.costs.kernels import KernelCostModel
from plansim.hardware import Cluster
from plansim.pipeline.schedules import get_schedule
from plansim.pipeline.stages import stage_layers
from plansim.remat.baselines import tightest_baseline
from plansim.remat.deadline import Deadline
from plansim.remat.graph import RematGraph
from plansim.remat.result import RematResult
from plansim.remat.solve import solve_remat
from plansim.remat.stage import stage_graph
from plansim.step.layers import CommPricer, LayerCost, layer_costs, layer_programs
from plansim.step.memory import (
    backward_workspace,
    ends_saved,
    fixed_bytes,
    stage_fp8,
    stage_params,
    static_bytes,
)
from plansim.step.prepare import PreparedStep, comm_pricer, rate_beside, tied_copy_params
from plansim.step.tp_overlap import tp_overlap
from plansim.strategy.mesh import mesh_of
from plansim.workload.traced import Workload

__all__ = ["LayerRemat", "StageRemat", "milp_stage_plans", "stage_remat"]


@dataclass(frozen=True)
class LayerRemat:
    """One layer under the schedule, per micro-batch: bytes it keeps from forward to backward, and the recompute
    run in the stages of its gradient nodes (seconds, of which communication, and bytes rebuilt)."""

    stored_bytes: float = 0.0
    recompute_s: float = 0.0
    recompute_comm_s: float = 0.0
    rebuilt_bytes: float = 0.0


@dataclass(frozen=True)
class StageRemat:
    """A stage's schedule and its figures per micro-batch (activation bytes with ``in_flight`` micro-batches)."""

    result: RematResult
    recompute_s: float
    recompute_comm_s: float
    recompute_flops: float
    activation_bytes: float
    layers: dict[int, LayerRemat]


def stage_remat(
    op_graph: nx.DiGraph,
    layers: Sequence[int],
    kernels: KernelCostModel,
    comm: CommPricer,
    *,
    in_flight: float,
    budget_bytes: float,
    granularity: str = "layer",
    time_limit_s: float = 20.0,
    gap: float = 0.01,
) -> StageRemat:
    """Schedule the blocks ``layers`` of ``op_graph`` within ``budget_bytes`` of activations, within
    ``time_limit_s`` seconds of wall-clock (the strategy's ``remat_time_limit_s``) from this call.

    When no schedule fits, the result is the baseline with the smallest peak (``result.feasible`` False), so the
    stage reports how much it needs and the strategy does not fit.
    """
    deadline = Deadline(time_limit_s, option="remat_time_limit_s")
    graph = stage_graph(op_graph, layers, kernels, comm, granularity=granularity)  # type: ignore[arg-type]
    key = (_Keyed(graph), float(in_flight), max(0.0, float(budget_bytes)), time_limit_s, gap)
    if key not in _MEMO:
        if len(_MEMO) >= _MEMO_SIZE:
            del _MEMO[next(iter(_MEMO))]  # the oldest
        _MEMO[key] = _solve(graph, key[1], key[2], gap, deadline)
    return _MEMO[key]


def _signature(graph: RematGraph) -> tuple:
    return tuple(
        (n.cost, n.memory, n.deps, n.backward, n.layer, n.selective, n.comm_cost, n.flops) for n in graph.nodes
    )


class _Keyed:
    """A graph hashed by content, for the memo."""

    def __init__(self, graph: RematGraph) -> None:
        self.graph = graph
        self.key = _signature(graph)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Keyed) and self.key == other.key


#: Solved stages by (graph, in_flight, budget, time limit, gap), oldest first; at most ``_MEMO_SIZE``.
_MEMO: dict[tuple[_Keyed, float, float, float, float], StageRemat] = {}
_MEMO_SIZE = 256


def _solve(graph: RematGraph, in_flight: float, budget: float, gap: float, deadline: Deadline) -> StageRemat:
    result = solve_remat(graph, budget, "milp", in_flight=in_flight, gap=gap, deadline=deadline)
    if not result.feasible:
        tightest = tightest_baseline(graph, budget, in_flight, deadline=deadline)
        result = RematResult(
            "milp", graph.name, budget, in_flight, False, tightest.schedule, tightest.replay,
            result.solve_time_s, result.solver, result.reason,
        )  # fmt: skip
    return _figures(graph, result)


def _figures(graph: RematGraph, result: RematResult) -> StageRemat:
    assert result.schedule is not None and result.replay is not None
    first_backward = graph.forward_count
    computed: set[int] = set()
    live: set[int] = set()
    held: set[int] | None = None
    per: dict[int, dict[str, float]] = {}
    totals = {"s": 0.0, "comm": 0.0, "flops": 0.0}
    for op in result.schedule.ops:
        if held is None and op.stage >= first_backward:
            held = set(live)
        node = graph.nodes[op.node]
        if op.action == "free":
            live.discard(op.node)
            continue
        live.add(op.node)
        if op.node not in computed:
            computed.add(op.node)
            continue
        layer = per.setdefault(graph.nodes[op.stage].layer, {"s": 0.0, "comm": 0.0, "bytes": 0.0})
        layer["s"] += node.cost
        layer["comm"] += node.comm_cost
        layer["bytes"] += node.memory
        totals["s"] += node.cost - node.comm_cost
        totals["comm"] += node.comm_cost
        totals["flops"] += node.flops
    stored: dict[int, float] = {}
    for i in held or set():
        stored[graph.nodes[i].layer] = stored.get(graph.nodes[i].layer, 0.0) + graph.nodes[i].memory
    layers = {
        layer: LayerRemat(
            stored.get(layer, 0.0),
            per.get(layer, {}).get("s", 0.0),
            per.get(layer, {}).get("comm", 0.0),
            per.get(layer, {}).get("bytes", 0.0),
        )
        for layer in sorted({n.layer for n in graph.nodes})
    }
    return StageRemat(result, totals["s"], totals["comm"], totals["flops"], result.peak_bytes, layers)


def milp_stage_plans(
    prep: PreparedStep, cluster: Cluster, model: Workload, costs: dict[int, LayerCost] | None = None
) -> dict[int, StageRemat]:
    """``remat: milp``: each stage's schedule within its activation budget (``remat_budget``, or what the device
    leaves after model states, workspace, CUDA context, NCCL buffers and the embedding/output activations), with
    the stage's micro-batches in flight. Both engines price the stage from it."""
    s, graph, kernels = prep.strategy, prep.graph, prep.kernels
    comm = comm_pricer(cluster, s)
    if costs is None:
        costs = layer_costs(
            layer_programs(graph, kernels, mesh_of(s), tp_overlap(s, cluster)), comm, rate_beside(cluster, s, kernels)
        )
    sched = get_schedule(s.schedule)
    tied = tied_copy_params(model, s) > 0
    plans = {}
    for idx, layers in enumerate(stage_layers(model.layers, s.pp, s.virtual_stages, s.layer_split)):
        blocks = [i for i in layers if 0 <= i < model.layers]
        params = stage_params(layers, costs, s, model, idx)
        layer_params = [costs[i].params for i in layers if i in costs]
        static = sum(static_bytes(cluster, s, params, layer_params, stage_fp8(layers, costs)).values())
        budget = s.remat_budget
        if budget is None:
            ends = sched.ends_in_flight(s.pp, s.num_microbatches, s.virtual_stages)
            fixed = sum(fixed_bytes(cluster, s, idx, tied).values())
            budget = cluster.gpu.memory_bytes - static - fixed - ends_saved(layers, costs, ends, model)
        # a fused attention kernel's backward workspace comes on top of what the schedule holds (both engines add it)
        budget = max(0.0, budget - backward_workspace(blocks, costs))
        plans[idx] = stage_remat(
            graph,
            blocks,
            kernels,
            comm,
            in_flight=sched.in_flight(idx, s.pp, s.num_microbatches, s.virtual_stages),
            budget_bytes=budget,
            granularity=s.remat_granularity,
            time_limit_s=s.remat_time_limit_s,
        )
    return plans
