"""One pipeline stage in closed form: what one micro-batch costs it.

``StageSums`` sums a stage's layer costs once per layer list (``plansim.step.layers``); ``stage_sends`` prices its
pipeline sends as its framework issues them (``plansim.step.p2p``: blocking calls on the compute stream, or sends beside
compute at the interference model's rate, ``plansim.costs.interference``); ``stage_cost`` puts them together with the
remat policy's recompute (or a ``remat: milp`` schedule, ``plansim.remat.plan``) into a ``StageCost``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import networkx as nx

from plansim.costs.interference import Interference, interference_model, overlap_cost, send_load
from plansim.costs.kernels import KernelCostModel
from plansim.costs.remat_policies import REMAT_POLICIES, Recompute
from plansim.hardware import Cluster
from plansim.pipeline.schedules import get_schedule
from plansim.pipeline.stages import chunk_layers
from plansim.remat.plan import StageRemat
from plansim.step.data_parallel import LayerPass
from plansim.step.layers import (
    AxisComm,
    CommPricer,
    LayerCost,
    rerun,
    rerun_axis_bytes,
    rerun_host_s,
    rerun_sync_s,
)
from plansim.step.memory import stage_expert_params, stage_fp8
from plansim.step.offload import OffloadLayer
from plansim.step.p2p import OverlappedSends, amax_reduction_s, pipeline_sends, regather
from plansim.step.prepare import comm_pricer, p2p_message_bytes
from plansim.strategy.mesh import mesh_of
from plansim.strategy.schema import Strategy
from plansim.workload.traced import Workload


@dataclass(frozen=True)
class StageCost:
    """One pipeline stage, one rank: per-micro-batch times (s), per-step bytes, and memory (bytes).

    ``bwd_weight_s`` is the weight-gradient part of ``bwd_s``, which split-backward schedules (ZB-H1) run apart;
    ``axis_bytes`` the bytes one rank sends per micro-batch in the layers' blocking collectives, per mesh axis;
    ``sync_s`` what those collectives (and their rerun under remat) wait for their slowest member."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    comm_s: float
    axis_bytes: dict[str, float]
    params: int
    #: each layer's parameters, in the stage's forward order (ZeRO-3's gathered layers: ``step.memory.static_bytes``)
    layer_params: tuple[float, ...]
    #: parameters whose gradients backward produces last (the embedding, on the first stage): the last bucket
    tail_params: float
    activations: float
    recompute_matmul_flops: float
    p2p_bytes: float
    num_layers: int
    bwd_weight_s: float = 0.0
    sync_s: float = 0.0
    #: the caching allocator's rounding of ``activations``, allocation by allocation (``step.memory.activation_peak``)
    fragmentation: float = 0.0
    interference_s: float = 0.0
    overlapped_s: float = 0.0
    #: what the stage's sends that run beside compute add once per step (``OverlappedSends.chain_s``)
    send_chain_s: float = 0.0
    #: its layers' forward and backward passes in the order it runs them (gradient buckets, ZeRO-3's gathers)
    forward_layers: tuple[LayerPass, ...] = ()
    backward_layers: tuple[LayerPass, ...] = ()
    #: how many of ``backward_layers`` each of the stage's model chunks holds, in backward order (the last chunk's
    #: first); one entry without interleaving
    backward_chunks: tuple[int, ...] = ()
    #: the pipeline's first stage (where a framework buckets only the first stage, ``DataParallelPlan``)
    first_stage: bool = False
    #: the part of ``fwd_s + bwd_s`` the GPU waits for the host to launch kernels (``LayerCost.host_fwd_s``), and of
    #: ``recompute_s``
    host_s: float = 0.0
    recompute_host_s: float = 0.0

    @property
    def compute_s(self) -> float:
        """Forward + backward compute of one micro-batch."""
        return self.fwd_s + self.bwd_s

    @property
    def time_s(self) -> float:
        """Forward + backward + recompute + blocking communication (and its wait for the slowest member) of one
        micro-batch, and what its pipeline sends cost the compute running beside them (``interference_s``, over
        ``overlapped_s``)."""
        return self.compute_s + self.recompute_s + self.comm_s + self.sync_s + self.interference_s


#: A stage's pipeline traffic per micro-batch: (seconds on the compute stream, pp bytes, tp bytes, ((seconds, compute
#: rate beside it) per send that runs beside compute), those sends per direction)
StageSends = tuple[float, float, float, tuple[tuple[float, float], ...], OverlappedSends]


def stage_sends(
    cluster: Cluster,
    s: Strategy,
    stage: int,
    graph: nx.DiGraph,
    model: Interference,
    price: CommPricer | None = None,
) -> StageSends:
    """(seconds, pp bytes, tp bytes, sends beside compute, those sends per direction) of one micro-batch's pipeline
    traffic on ``stage``, as its framework issues it (``plansim.step.p2p``): its activation and gradient sends, each on
    its own boundary (the stage's first rank to its neighbour along the mesh's ``pp`` axis; interleaving wraps the
    last stage to the first). A blocking send is on the compute stream's critical path (the seconds), with the idle
    launch after each call; one that does not block runs beside the stage's compute (as the DES runs it on the p2p
    stream), so it is not in the seconds: each such send's seconds and the compute stream's rate beside it
    (``model``, ``plansim.costs.interference``), and their counts and transfers (``OverlappedSends``), of which the
    stage prices what its passes do not cover. The all-gather that rebuilds each received activation under the
    scatter/gather optimization is a tensor-parallel collective on the compute stream, in the seconds, priced by
    ``price`` (``step.prepare.comm_pricer`` of ``s`` by default; the stages of a pipeline may share one)."""
    sched = get_schedule(s.schedule)
    amax_s = _amax_reductions(s, stage, graph, price or comm_pricer(cluster, s)) if s.fp8 else 0.0
    fwd, bwd = sched.sends_per_microbatch(stage, s.pp, s.virtual_stages)
    if not fwd + bwd:
        return amax_s, 0.0, 0.0, (), OverlappedSends()
    n_bytes = p2p_message_bytes(graph, s)
    mesh = mesh_of(s)
    first = mesh.rank(pp=stage)
    plan = pipeline_sends(cluster.gpu, s)
    seconds = 0.0
    beside: list[tuple[float, float]] = []
    transfers = {+1: 0.0, -1: 0.0}
    for count, steps in ((fwd, +1), (bwd, -1)):
        if not count:
            continue
        peer = mesh.shift("pp", first, steps)
        link = cluster.p2p_link(first, peer)
        transfer = transfers[steps] = link.latency_s + n_bytes / link.bandwidth_Bps
        if plan.blocking:
            seconds += count * (transfer + plan.call_s)
        else:
            beside += [(transfer, model.rate(send_load(cluster, first, peer)))] * count
    overlapped = OverlappedSends() if plan.blocking else OverlappedSends(fwd, transfers[+1], bwd, transfers[-1])
    gather = regather(graph, s)
    if gather is None:
        return seconds + amax_s, (fwd + bwd) * n_bytes, 0.0, tuple(beside), overlapped
    received = sum(sched.receives_per_microbatch(stage, s.pp, s.virtual_stages))
    gather_s, gather_sent = (price or comm_pricer(cluster, s))(gather.axis, gather.collective, gather.n_bytes)
    seconds += received * gather_s + amax_s
    return seconds, (fwd + bwd) * n_bytes, received * gather_sent, tuple(beside), overlapped


def _amax_reductions(s: Strategy, stage: int, graph: nx.DiGraph, price: CommPricer) -> float:
    """Seconds of one micro-batch's FP8 amax all-reduces on ``stage``: one after each of its model chunks' forward
    and backward passes (``step.p2p.amax_reduction_s``), blocking on the compute stream as the pipeline sends' calls
    are."""
    linears: dict[int, int] = {}
    for _, op in graph.nodes(data=True):
        if op.get("fp8"):
            linears[op["layer"]] = linears.get(op["layer"], 0) + 1
    chunks = chunk_layers(graph.graph["spec"].layers, s.pp, s.virtual_stages, s.layer_split)[stage :: s.pp]
    return sum(
        amax_reduction_s(s, sum(linears.get(i, 0) for i in chunk), forward, price)
        for chunk in chunks
        for forward in (True, False)
    )


class StageSums:
    """The parts of a stage's cost that depend only on its layers (and, for recompute and activations, the remat
    policy): summed once per layer list and reused by every strategy with the same layers and layer costs."""

    def __init__(self, layers: list[int], costs: dict[int, LayerCost], model: Workload, layer_input: float) -> None:
        self.blocks = [costs[i] for i in layers if 0 <= i < model.layers]
        every = self.blocks + [costs[i] for i in layers if not 0 <= i < model.layers and i in costs]
        self.fwd_s = sum(c.fwd_s for c in every)
        self.bwd_s = sum(c.bwd_s for c in every)
        self.comm_s = sum(c.comm_fwd_s + c.comm_bwd_s for c in every)
        self.sync_s = sum(c.sync_fwd_s + c.sync_bwd_s for c in every)
        self.host_s = sum(c.host_fwd_s + c.host_bwd_s for c in every)
        # compute lost beside the layers' asynchronous tensor-parallel collectives, and how long both ran
        self.interference_s = sum(c.interference_s for c in every)
        self.overlapped_s = sum(c.overlapped_s for c in every)
        # the forward passes' share of the compute stream (kernels, blocking collectives and their waits)
        self.fwd_pass_s = sum(c.fwd_s + c.comm_fwd_s + c.sync_fwd_s + c.interference_fwd_s for c in every)
        self.axis_bytes = _axis_sums(every, lambda a: a.fwd_bytes + a.bwd_bytes)
        self.axis_fwd_bytes_blocks = _axis_sums(self.blocks, lambda a: a.fwd_bytes)
        self.tail_params = sum(costs[i].params for i in layers if i < 0 and i in costs)
        self.bwd_weight_s = sum(c.bwd_weight_s for c in every)
        self.params = round(sum(costs[i].params for i in layers if i in costs))
        #: its FP8 linear layers' weight elements and count (``step.memory.stage_fp8``)
        self.fp8 = stage_fp8(layers, costs)
        self.expert_params = stage_expert_params(layers, costs)  # of ``params``, the routed experts'
        # (is a block, its costs) in the order backward runs the layers; the forward passes in theirs (one tuple per
        # layer list: ``data_parallel.DpMemo`` keys a stage's overlapped gathers on its identity)
        self.backward = tuple((0 <= i < model.layers, costs[i]) for i in reversed(layers) if i in costs)
        self.forward = tuple(
            LayerPass(c.fwd_s, c.comm_fwd_s + c.sync_fwd_s + c.interference_fwd_s, c.params, c.expert_params)
            for _, c in self.backward[::-1]
        )
        self.layer_params = tuple(x.params for x in self.forward)  # in the stage's forward order
        self.layer_input = layer_input
        self._recompute: dict[str, Recompute] = {}
        self._rerun_sync: dict[str, float] = {}
        self._rerun_host: dict[str, float] = {}
        self.backward_passes: dict[tuple[int, float, float], tuple[LayerPass, ...]] = {}
        #: ``stage_cost``'s fields but the activations', by (remat, pipeline traffic, params, chunks, first stage)
        self.parts: dict[tuple[Any, ...], dict[str, Any]] = {}

    def recompute(self, remat: str) -> Recompute:
        if remat not in self._recompute:
            self._recompute[remat] = rerun(remat, self.blocks)
        return self._recompute[remat]

    def rerun_host(self, remat: str) -> float:
        if remat not in self._rerun_host:
            self._rerun_host[remat] = rerun_host_s(remat, self.blocks)
        return self._rerun_host[remat]

    def rerun_sync(self, remat: str) -> float:
        if remat not in self._rerun_sync:
            self._rerun_sync[remat] = rerun_sync_s(remat, self.blocks)
        return self._rerun_sync[remat]


class StageHeld(NamedTuple):
    """What a pipeline stage holds, known before its time is priced: its layers' sums, its parameters and its
    activations' peak (bytes, reserved bytes, the gradient buffers' bytes among them:
    ``step.memory.activation_peak``)."""

    sums: StageSums
    params: int
    peak: tuple[float, float, float]
    #: what offloading (``Strategy.offload``) reads: its layers as ``step.offload`` reads them, forward order, and
    #: the saved bytes of one micro-batch its offloaded blocks keep in host memory
    offload: tuple[OffloadLayer, ...] = ()
    host_activations: float = 0.0


def stage_cost(
    sums: StageSums,
    remat: str,
    p2p: StageSends,
    params: int,
    peak: tuple[float, float, float],
    plan: StageRemat | None = None,
    chunks: tuple[int, ...] = (),
    first: bool = False,
) -> StageCost:
    """One stage from its layers' sums, ``p2p`` (seconds, pp bytes, tp bytes, each send beside compute) of its
    pipeline traffic (``stage_sends``), ``params`` it holds and its activations' ``peak`` (bytes, reserved bytes: the
    difference is the caching allocator's rounding, ``fragmentation``; ``step.memory.activation_peak``); ``plan``:
    the stage's ``remat: milp`` schedule, which says what it recomputes; ``chunks``: how many of its layers with a
    cost (``sums.backward``) each of its model chunks holds, in backward order (the last chunk's first; one entry, or
    none, without interleaving), which its gradient buckets read (``StageCost.backward_chunks``).

    Each send that does not block runs beside the compute that follows it, an equal share of the micro-batch's
    compute per send (``overlap_cost``); of its transfer the stage's time per micro-batch holds only what outlasts one
    of its ``chunks``' passes of the send's direction, taken as their mean (``OverlappedSends.excess_s``; exact for
    equal chunks, and zero wherever a transfer is shorter than the lightest chunk's pass), and the step once the
    chain of one micro-batch's transfers (``send_chain_s``, added by ``Pipeline``).

    Without ``plan``, all but the activations are memoized in ``sums`` (``StageSums.parts``): a pipeline's stages
    alike but for their place in the schedule (their activations' peak) share them."""
    if plan is None:
        key = (remat, p2p, params, chunks, first)
        parts = sums.parts.get(key)
        if parts is None:
            parts = sums.parts[key] = _stage_parts(sums, remat, p2p, params, None, chunks, first)
    else:
        parts = _stage_parts(sums, remat, p2p, params, plan, chunks, first)
    return StageCost(**parts, activations=peak[0] - peak[2], fragmentation=peak[1] - peak[0])


def _stage_parts(
    sums: StageSums,
    remat: str,
    p2p: StageSends,
    params: int,
    plan: StageRemat | None,
    chunks: tuple[int, ...],
    first: bool,
) -> dict[str, Any]:
    """``stage_cost``'s fields but the activations' (``activations``, ``fragmentation``)."""
    if plan is not None:  # remat: milp, the stage's schedule (plansim/remat/plan.py)
        recompute_s, recompute_comm_s, recompute_flops = plan.recompute_s, plan.recompute_comm_s, plan.recompute_flops
        rerun_sync = 0.0  # the schedule's recompute runs as one task, its collectives priced inside it
        rerun_host = 0.0  # and its time is its ops' kernels'
    else:
        recompute_s, recompute_comm_s, recompute_flops = sums.recompute(remat)
        rerun_sync = sums.rerun_sync(remat)
        rerun_host = sums.rerun_host(remat)
    sends, overlapped_sends = p2p[3], p2p[4]
    fwd_pass = sums.fwd_pass_s
    bwd_pass = sums.comm_s + sums.sync_s + sums.interference_s + sums.fwd_s + sums.bwd_s - fwd_pass
    bwd_pass += recompute_s + recompute_comm_s
    bwd_pass += rerun_sync
    count = max(1, len(chunks))
    send_excess = overlapped_sends.excess_s(fwd_pass / count, bwd_pass / count)
    beside = (sums.fwd_s + sums.bwd_s + recompute_s) / max(1, len(sends))
    lost = overlapped = 0.0
    for seconds, rate in sends:
        ov, cost = overlap_cost(beside, seconds, rate)
        overlapped += ov
        lost += cost
    return dict(
        forward_layers=sums.forward,
        backward_layers=_backward_layers(sums, params, recompute_s, recompute_comm_s + rerun_sync),
        backward_chunks=chunks or (len(sums.backward),),
        first_stage=first,
        fwd_s=sums.fwd_s,
        bwd_s=sums.bwd_s,
        recompute_s=recompute_s,
        comm_s=sums.comm_s + recompute_comm_s + p2p[0] + send_excess,
        axis_bytes=_plus(_rerun_bytes(sums, remat), "tp", p2p[2]),
        params=params,
        layer_params=sums.layer_params,
        tail_params=sums.tail_params,
        recompute_matmul_flops=recompute_flops,
        p2p_bytes=p2p[1],
        num_layers=max(1, len(sums.blocks)),
        bwd_weight_s=sums.bwd_weight_s,
        sync_s=sums.sync_s + rerun_sync,
        interference_s=lost + sums.interference_s,
        overlapped_s=overlapped + sums.overlapped_s,
        send_chain_s=overlapped_sends.chain_s,
        host_s=sums.host_s,
        recompute_host_s=rerun_host,
    )


def _backward_layers(
    sums: StageSums, params: int, recompute_s: float, rerun_blocking_s: float
) -> tuple[LayerPass, ...]:
    """The stage's layers' backward in the order it runs them (``step.data_parallel.LayerPass``): a block's
    share of the stage's recompute (and its collectives) runs before its backward; the output layer also holds the
    tied embeddings' copy (``params`` beyond its layers', on the last stage with pp > 1)."""
    key = (params, recompute_s, rerun_blocking_s)
    hit = sums.backward_passes.get(key)
    if hit is not None:  # one tuple per stage's layers and remat
        return hit
    blocks = max(1, len(sums.blocks))
    out = []
    for is_block, c in sums.backward:
        work, blocking, layer_params = c.bwd_s, c.comm_bwd_s + c.sync_bwd_s + c.interference_bwd_s, c.params
        if is_block:
            work += recompute_s / blocks
            blocking += rerun_blocking_s / blocks
        elif c is sums.backward[0][1]:  # the output layer (or, without one, the stage's first layer in backward)
            layer_params += params - sums.params
        out.append(LayerPass(work, blocking, layer_params, c.expert_params))
    hit = sums.backward_passes[key] = tuple(out)
    return hit


def _plus(axis_bytes: dict[str, float], axis: str, n_bytes: float) -> dict[str, float]:
    """``axis_bytes`` with ``n_bytes`` more on ``axis`` (a new dict; unchanged when there are none)."""
    if not n_bytes:
        return axis_bytes
    return {**axis_bytes, axis: axis_bytes.get(axis, 0.0) + n_bytes}


def _axis_sums(costs: list[LayerCost], part: Callable[[AxisComm], float]) -> dict[str, float]:
    """Per mesh axis, the sum of ``part`` of the layers' blocking collectives."""
    out: dict[str, float] = {}
    for c in costs:
        for a in c.comm:
            out[a.axis] = out.get(a.axis, 0.0) + part(a)
    return out


def _rerun_bytes(sums: StageSums, remat: str) -> dict[str, float]:
    """Per axis, bytes one rank sends per micro-batch: the layers' collectives, and again those the policy reruns
    (``step.layers.rerun_axis_bytes``: the checkpointed blocks' forward ones, or a per-op policy's)."""
    policy = REMAT_POLICIES[remat]
    if policy.reruns == "block_forward" and not policy.every:  # every block's forward ones, summed once per stage
        again = sums.axis_fwd_bytes_blocks
    else:
        again = rerun_axis_bytes(remat, sums.blocks)
    if not again:
        return sums.axis_bytes
    return {a: b + again.get(a, 0.0) for a, b in sums.axis_bytes.items()}


def interference_of(cluster: Cluster, kernels: KernelCostModel) -> Interference:
    """The GPU's interference model, from the measured profile's overlap section when it has one."""
    return interference_model(cluster.gpu, kernels.table.overlap if kernels.table is not None else None)
