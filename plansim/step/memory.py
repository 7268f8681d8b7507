"""What a pipeline stage holds for the whole step, defined once for both engines: its parameters (the tied
embedding copy included), its model states and workspace, and the embedding/output activations in flight; and the
``remat: milp`` schedule of each stage, which is budgeted from them.

It also holds what a real run loses beside the tensors (``fixed_bytes``, ``rounding_ratio``): the CUDA context (the
GPU profile's ``cuda_context_bytes``), NCCL's buffers for the communicators the stage's ranks belong to
(``plansim.costs.nccl_memory``, from the node profile's ``nccl`` channels) and the caching allocator's block rounding
of the stored activations (``plansim.costs.allocator``). Both engines add them: the DES holds the first two static
and rounds each activation it allocates by the stage's ratio; the analytic engine adds the same figures in closed form.

Sources: ZeRO's model-state formulas (Rajbhandari et al. 2020, sec 3 and 5, via ``plansim.costs.memory``); the
tied-embedding copy on Megatron-LM's last stage (``plansim.step.prepare.tied_copy_params``); NCCL's buffers
(NVIDIA/nccl at 5067397c, see ``plansim.costs.nccl_memory``); PyTorch's caching allocator
(``c10/cuda/CUDACachingAllocator.cpp``, see ``plansim.costs.allocator``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple, Protocol

from plansim.costs.allocator import reserved_bytes
from plansim.costs.memory import LayerActivations, model_state_bytes
from plansim.costs.nccl_memory import Communicator, NcclChannels, communicator_bytes
from plansim.costs.remat_policies import REMAT_POLICIES, weight_grad_kept
from plansim.hardware import Cluster
from plansim.mesh import mesh_of
from plansim.schedules import HeldPoint, get_schedule
from plansim.stages import stage_layers
from plansim.step.layers import LayerCost, LayerProgram, layer_costs, layer_programs
from plansim.step.prepare import PreparedStep, comm_pricer, tied_copy_params
from plansim.strategy import Strategy
from plansim.units import dtype_bytes
from plansim.workload.traced import Workload

if TYPE_CHECKING:
    from plansim.remat.plan import StageRemat

__all__ = [
    "FIXED_CATEGORIES",
    "SplitHeld",
    "backward_workspace",
    "communicators",
    "ends_saved",
    "fixed_bytes",
    "held_peak",
    "milp_stage_plans",
    "model_states",
    "rounding_ratio",
    "saved_figures",
    "scheduled_split_extra",
    "split_backward_held",
    "stage_params",
    "static_bytes",
    "workspace_peak",
]

#: The memory categories a real run holds beside the tensors torch's allocator counts: the CUDA context and NCCL's
#: buffers (static, per stage), and the allocator's rounding of the activations (``fragmentation``).
FIXED_CATEGORIES = ("cuda_context", "nccl")


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


def _channels(cluster: Cluster) -> NcclChannels | None:
    """The node profile's NCCL channels, with the channels per network peer that NCCL derives from the NICs
    (``src/graph/paths.cc`` ``ncclTopoGetNchannels``: one per local NIC at least, and ``ceil(NIC GB/s / 14)``)."""
    setup = cluster.node.nccl
    if setup is None:
        return None
    nics = cluster.node.nics
    per_gpu = max(1, nics.count // cluster.gpus_per_node)
    net = max(per_gpu, math.ceil(nics.bandwidth_Bps / 1e9 / 14))
    return NcclChannels(setup.channels, setup.p2p_channels_per_peer, setup.nvls_channels, net)


def communicators(cluster: Cluster, s: Strategy, stage: int, tied: bool) -> list[Communicator]:
    """The NCCL communicators a rank of pipeline stage ``stage`` uses in the step: its tp group, its dp group, one
    point-to-point pair per pipeline neighbour (interleaving wraps the last stage to the first) and, with tied
    embeddings (``tied``) on the first and last stage, Megatron-LM's embedding group of those two."""
    mesh = mesh_of(s)
    gpn = cluster.gpus_per_node
    first = mesh.rank(pp=stage)
    out = [
        Communicator("tp", s.tp, mesh.local_size("tp", gpn), all_reduce=not s.sequence_parallel),
        Communicator("dp", s.dp or 1, mesh.local_size("dp", gpn), all_reduce=s.zero == 0),
    ]
    if s.pp > 1:
        wraps = s.virtual_stages > 1
        peers = {
            mesh.shift("pp", first, step)
            for step, present in ((-1, stage > 0 or wraps), (+1, stage < s.pp - 1 or wraps))
            if present
        }
        for peer in sorted(peers - {first}):
            out.append(Communicator("pp", 2, 2 if peer // gpn == first // gpn else 1, p2p=True))
        if tied and stage in (0, s.pp - 1):
            last = mesh.rank(pp=s.pp - 1 if stage == 0 else 0)
            out.append(Communicator("embedding", 2, 2 if last // gpn == first // gpn else 1, all_reduce=True))
    return out


def fixed_bytes(cluster: Cluster, s: Strategy, stage: int, tied: bool) -> dict[str, float]:
    """What a rank of ``stage`` holds beside its tensors for the whole run, by category (``FIXED_CATEGORIES``):
    the CUDA context and NCCL's buffers of its communicators (0 where the node profile names no NCCL channels)."""
    channels = _channels(cluster)
    nccl = (
        0 if channels is None else sum(communicator_bytes(c, channels) for c in communicators(cluster, s, stage, tied))
    )
    return {"cuda_context": float(cluster.gpu.cuda_context_bytes), "nccl": float(nccl)}


#: A layer's saved bytes and what the allocator reserves for them: (saved, selective_saved, saved reserved,
#: selective_saved reserved).
Saved = tuple[float, float, float, float]


def saved_figures(layer: LayerCost | LayerProgram) -> Saved:
    """``Saved`` of a layer's cost (the analytic engine) or program (the lowering)."""
    if isinstance(layer, LayerCost):
        return (layer.saved_bytes, layer.selective_saved_bytes, layer.saved_reserved_bytes,
                layer.selective_saved_reserved_bytes)  # fmt: skip
    return layer.saved, layer.selective_saved, layer.saved_reserved, layer.selective_saved_reserved


@lru_cache(maxsize=4096)
def rounding_ratio(remat: str, blocks: tuple[Saved, ...], ends: tuple[Saved, ...], layer_input: float) -> float:
    """Reserved over allocated bytes of what a stage stores for one micro-batch under ``remat`` (its blocks'
    stored and working activations and the embedding/output layer's), with each op's saved tensor rounded as the
    caching allocator rounds it (``reserved_bytes``); 1.0 when nothing is stored. A scheduled policy (``milp``)
    takes the ratio of everything the blocks save. Both engines multiply the stage's activations by it less one to
    get the ``fragmentation`` category."""
    policy = REMAT_POLICIES[remat].activations or REMAT_POLICIES["none"].activations
    assert policy is not None

    def total(exact: bool) -> float:
        at = 0 if exact else 2
        acts = [
            LayerActivations(
                full=b[at], selective=b[at] - b[at + 1],
                layer_input=layer_input if exact else reserved_bytes(layer_input),
            )
            for b in blocks
        ]  # fmt: skip
        st = policy(acts)
        ends_bytes = sum(e[at] for e in ends)
        return st.stored_per_microbatch + st.working + ends_bytes

    allocated = total(True)
    return total(False) / allocated if allocated > 0 else 1.0


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


class SplitHeld(NamedTuple):
    """A stage's bytes per micro-batch under a split backward (ZB-H1), beside its blocks' stored bytes (the remat
    policy's ``stored_per_microbatch``): ``ends_stored`` the embedding's and output layer's saved activations;
    ``kept`` what all its layers keep from B to W (``weight_grad_kept``); ``after_backward`` the most that a B pass
    holds of its micro-batch beyond ``kept`` (the layers not yet through B, the one in B with what its recompute
    rebuilt and its backward workspace), which at the B's end is what a ``HeldPoint(after_backward=True)`` adds."""

    ends_stored: float
    kept: float
    after_backward: float


def split_backward_held(
    remat: str, head: Sequence[LayerCost], blocks: Sequence[LayerCost], tail: Sequence[LayerCost], layer_input: float
) -> SplitHeld:
    """``SplitHeld`` of a stage with layers ``head`` (the embedding), ``blocks`` and ``tail`` (the output layer), in
    forward order, as the lowering allocates and frees them (``plansim.lower``): a layer stores its policy's bytes
    (the ends all they save), its recompute brings it to ``max(saved, stored)`` just before its B (a sqrt(N)
    segment's, before the B of the segment's last block, for the whole segment), its B frees all but
    ``weight_grad_kept`` and its backward workspace. Backward runs the layers in reverse."""
    policy = REMAT_POLICIES[remat]
    k_seg = math.ceil(math.sqrt(len(blocks) or 1))
    rows = []  # (segment, stored, held while in B, kept, workspace), forward order
    for i, c in enumerate(blocks):
        stored = policy.stored(c.saved_bytes, c.selective_saved_bytes, layer_input, i % k_seg == 0)
        rows.append((i // k_seg if policy.segments else None, stored, max(c.saved_bytes, stored), c))
    ends = [(None, c.saved_bytes, c.saved_bytes, c) for c in (*head, *tail)]
    every = [*ends[: len(head)], *rows, *ends[len(head) :]]
    kept = [weight_grad_kept(c.saved_bytes, stored, c.wgrad_saved_bytes) for _, stored, _, c in every]
    extra = 0.0
    for j in reversed(range(len(every))):  # B of layer j: the layers before it not yet through B
        seg = every[j][0]
        waiting = sum(
            (held if seg is not None and s == seg else stored) - kept[u]
            for u, (s, stored, held, _) in enumerate(every[:j])
        )
        extra = max(extra, waiting + every[j][2] - kept[j] + every[j][3].bwd_workspace_bytes)
    return SplitHeld(sum(c.saved_bytes for c in (*head, *tail)), sum(kept), extra)


def held_peak(points: Sequence[HeldPoint], stored: float, kept: float, between: float, after_backward: float) -> float:
    """A stage's activation peak over its schedule's ``held`` points: ``stored`` bytes per micro-batch between F and
    B, ``kept`` per micro-batch between B and W, plus ``between`` at a B's start (the working set and workspace, as
    1F1B's peak adds them) or ``after_backward`` at its end (``SplitHeld.after_backward``).

    >>> held_peak([HeldPoint(2, 1), HeldPoint(1, 2, after_backward=True)], 10.0, 4.0, 3.0, 1.0)
    27.0
    """
    return max(h.stored * stored + h.weight * kept + (after_backward if h.after_backward else between) for h in points)


def scheduled_split_extra(
    points: Sequence[HeldPoint],
    in_flight: float,
    plan: StageRemat,
    layers: Sequence[int],
    costs: Mapping[int, LayerCost],
    model: Workload,
) -> float:
    """``remat: milp`` under a split backward: what the schedule's held points add to the stage's plan, whose peak
    counts ``in_flight`` micro-batches stored. Each block stores what the plan keeps (the ends all they save) and keeps
    of it for W its weight GEMMs' inputs; what the plan rebuilds goes after B (as the lowering allocates them), so the
    peaks are at B starts and a B's end adds nothing beyond them."""
    stored = {
        i: min(costs[i].saved_bytes, plan.layers[i].stored_bytes) if 0 <= i < model.layers else costs[i].saved_bytes
        for i in layers
        if i in costs
    }
    per_mb = sum(stored.values())
    kept = sum(min(b, costs[i].wgrad_saved_bytes) for i, b in stored.items())
    return max(0.0, *((h.stored - in_flight) * per_mb + h.weight * kept for h in points if not h.after_backward))


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
    leaves after model states, workspace, CUDA context, NCCL buffers and the embedding/output activations), with
    the stage's micro-batches in flight. Both engines price the stage from it."""
    from plansim.remat.plan import stage_remat

    s, graph, kernels = prep.strategy, prep.graph, prep.kernels
    comm = comm_pricer(cluster, s)
    if costs is None:
        costs = layer_costs(layer_programs(graph, kernels, mesh_of(s)), comm)
    sched = get_schedule(s.schedule)
    tied = tied_copy_params(model, s) > 0
    plans = {}
    for idx, layers in enumerate(stage_layers(model.layers, s.pp, s.virtual_stages, s.layer_split)):
        blocks = [i for i in layers if 0 <= i < model.layers]
        params = stage_params(layers, costs, s, model, idx)
        largest = max(costs[i].params for i in layers if i in costs)
        static = sum(static_bytes(cluster, s, params, largest).values())
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
