"""What a pipeline stage holds for the whole step, defined once for both engines: its parameters (the tied
embedding copy included), its model states and workspace, and the embedding/output activations in flight; and the
``remat: milp`` schedule of each stage, which is budgeted from them.

Sources: ZeRO's model-state formulas (Rajbhandari et al. 2020, sec 3 and 5, via ``plansim.costs.memory``); the
tied-embedding copy on Megatron-LM's last stage (``plansim.step.prepare.tied_copy_params``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from plansim.costs.memory import model_state_bytes
from plansim.hardware import Cluster
from plansim.mesh import mesh_of
from plansim.schedules import get_schedule
from plansim.stages import stage_layers
from plansim.step.layers import LayerCost, layer_costs, layer_programs
from plansim.step.prepare import PreparedStep, comm_pricer, tied_copy_params
from plansim.strategy import Strategy
from plansim.units import dtype_bytes
from plansim.workload.traced import Workload

if TYPE_CHECKING:
    from plansim.remat.plan import StageRemat

__all__ = [
    "backward_workspace",
    "ends_saved",
    "milp_stage_plans",
    "model_states",
    "stage_params",
    "static_bytes",
    "workspace_peak",
]


class _HasParams(Protocol):
    @property
    def params(self) -> float: ...


def stage_params(layers: Sequence[int], costs: Mapping[int, _HasParams], s: Strategy, model: Workload, idx: int) -> int:
    """Parameters stage ``idx`` holds on one rank: its layers' (``LayerCost`` or ``LayerProgram``), plus the
    tied-embedding copy on the last stage."""
    params = round(sum(costs[i].params for i in layers if i in costs))
    return params + (tied_copy_params(model, s) if idx == s.pp - 1 else 0)


def ends_saved(
    layers: Sequence[int], costs: dict[int, LayerCost], ends_in_flight: tuple[float, float], model: Workload
) -> float:
    """Activations of the embedding and output layer on this stage, every micro-batch in flight there included
    (``ends_in_flight``: the schedule's micro-batches in flight at the first and the last chunk)."""
    first, last = ends_in_flight
    return sum(
        costs[i].saved_bytes * (first if i < 0 else last) for i in layers if not 0 <= i < model.layers and i in costs
    )


def backward_workspace(blocks: Sequence[int], costs: Mapping[int, LayerCost]) -> float:
    """The most bytes one block's backward allocates for its length only (a fused attention kernel's accumulators:
    ``LayerCost.bwd_workspace_bytes``); one block's backward runs at a time."""
    return max((costs[i].bwd_workspace_bytes for i in blocks if i in costs), default=0.0)


def workspace_peak(layers: Sequence[int], costs: Mapping[int, LayerCost], model: Workload, split: bool) -> float:
    """What a fused attention kernel's backward workspace adds to a stage's activation peak: the largest of its blocks'
    (``backward_workspace``), less what the output layer, on the stage that holds it, has freed by then: its backward
    runs first in each micro-batch's backward and frees what it saved, but for its weight GEMM's input under a split
    backward, which waits for the W pass (as the lowering allocates and frees them)."""
    workspace = backward_workspace([i for i in layers if 0 <= i < model.layers], costs)
    out = model.layers
    if out not in layers or out not in costs:
        return workspace
    kept = min(costs[out].saved_bytes, costs[out].wgrad_saved_bytes) if split else 0.0
    return max(0.0, workspace - (costs[out].saved_bytes - kept))


def model_states(cluster: Cluster, s: Strategy, params: float) -> dict[str, float]:
    """What a rank holding ``params`` keeps for the whole step, by memory category: its weights, gradients and
    optimizer states under the strategy's ZeRO stage, and the device's workspace reserve. The DES holds these static
    and allocates ZeRO-3's gathered layers as they are gathered; the analytic engine adds those (``static_bytes``)."""
    states = model_state_bytes(
        params, s.dp or 1, s.zero, mixed_precision=s.mixed_precision, fp32_grad_accum=s.fp32_grad_accum
    )
    return {
        "weights": states.weights,
        "gradients": states.gradients,
        "optimizer": states.optimizer,
        "workspace": float(cluster.gpu.workspace_reserve_bytes),
    }


def static_bytes(cluster: Cluster, s: Strategy, params: float, largest_layer_params: float) -> dict[str, int]:
    """``model_states`` in whole bytes, ZeRO-3's weights with the two gathered layers in flight (the one in use and
    the one prefetched, as the DES's gathers hold them)."""
    states = model_states(cluster, s, params)
    gathering = s.zero >= 3 and (s.dp or 1) > 1
    gathered = 2 * largest_layer_params * dtype_bytes(s.compute_dtype) if gathering else 0.0
    return {
        "weights": round(states["weights"] + gathered),
        "gradients": round(states["gradients"]),
        "optimizer": round(states["optimizer"]),
        "workspace": int(states["workspace"]),
    }


def milp_stage_plans(
    prep: PreparedStep, cluster: Cluster, model: Workload, costs: dict[int, LayerCost] | None = None
) -> dict[int, StageRemat]:
    """``remat: milp``: each stage's schedule within its activation budget (``remat_budget``, or what the device
    leaves after model states, workspace and the embedding/output activations), with the stage's micro-batches in
    flight. Both engines price the stage from it."""
    from plansim.remat.plan import stage_remat

    s, graph, kernels = prep.strategy, prep.graph, prep.kernels
    comm = comm_pricer(cluster, s)
    if costs is None:
        costs = layer_costs(layer_programs(graph, kernels, mesh_of(s)), comm)
    sched = get_schedule(s.schedule)
    plans = {}
    for idx, layers in enumerate(stage_layers(model.layers, s.pp, s.virtual_stages, s.layer_split)):
        blocks = [i for i in layers if 0 <= i < model.layers]
        params = stage_params(layers, costs, s, model, idx)
        largest = max(costs[i].params for i in layers if i in costs)
        static = sum(static_bytes(cluster, s, params, largest).values())
        budget = s.remat_budget
        if budget is None:
            ends = sched.ends_in_flight(s.pp, s.num_microbatches, s.virtual_stages)
            budget = cluster.gpu.memory_bytes - static - ends_saved(layers, costs, ends, model)
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
