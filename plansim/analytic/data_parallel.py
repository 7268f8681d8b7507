"""The data-parallel plan in closed form (``plansim.step.data_parallel`` says what the lowering issues: gradient
buckets, ZeRO's gathers and reduce-scatters, hybrid sharding's replicas' all-reduce): each collective priced on its mesh
axis's links, and per stage how much of it backward (and the next step's first forwards) does not hide, walking the
same issue order as the lowering. Volumes follow Rajbhandari et al. 2020, sec 7. Also the tied embeddings' gradient
all-reduce between the first and last stage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from plansim.analytic.stages import StageCost
from plansim.costs.collectives import algorithm_entry, bytes_sent_per_rank, collective_time
from plansim.costs.interference import Beside, Interference
from plansim.hardware import Cluster, Link
from plansim.step.data_parallel import (
    CHAINED,
    START,
    DataParallelPlan,
    GroupCollective,
    LayerPass,
    Overlapped,
    bucket_launches,
    bucketed_reduction,
    per_layer_overlap,
    prefetched_gathers,
    tied_gradient_bytes,
    weight_gathers,
)
from plansim.step.prepare import beside, ring_call_s
from plansim.strategy.mesh import mesh_of
from plansim.strategy.schema import Strategy
from plansim.workload.traced import Workload

Sent = tuple[float, float]  # (seconds, bytes this rank sends)


DpMessage = tuple[GroupCollective, float]  # a collective of the data-parallel plan and its message bytes
DpPricer = Callable[[GroupCollective, float], Sent]
#: What the data-parallel plan's reduction, gather and replicas' all-reduce, and the experts' reduction and gather
#: (``DataParallelPlan.experts``), take from compute beside them (None: the plan has no such collective)
DpBesides = tuple["Beside | None", "Beside | None", "Beside | None", "Beside | None", "Beside | None"]


def price_collective(
    coll: str, algorithm: str, p: int, n_bytes: float, link: Link, ring: tuple[Cluster, int] | None = None, **kw: Any
) -> tuple[float, float]:
    """(seconds, bytes one rank sends) of one collective among ``p`` ranks on ``link``; a ring given ``ring=(cluster,
    nodes it spans)`` is priced as NCCL runs it (``ring_call_s``), as is an entry with an ``nccl`` mode."""
    if p <= 1 or n_bytes <= 0:
        return 0.0, 0.0
    if algorithm_entry(coll, algorithm).nccl is not None and ring is not None and not kw:
        seconds = ring_call_s(ring[0], coll, p, ring[1], n_bytes, link, algorithm)
    else:
        seconds = collective_time(coll, algorithm, p, n_bytes, link.latency_s, link.bandwidth_Bps, **kw)
    local = kw.get("local")
    return seconds, bytes_sent_per_rank(coll, algorithm, p, n_bytes, local=local)


@dataclass(frozen=True)
class DataParallelComm:
    """Per step: exposed seconds, bytes one GPU sends for gradient reduction (dp) and for parameter gathers (zero),
    and the seconds compute ran beside them and lost to them (``plansim.costs.interference``)."""

    exposed_s: float
    dp_bytes: float
    zero_bytes: float
    interference_s: float = 0.0
    overlapped_s: float = 0.0
    #: what the stage's first forwards wait for an overlapped ZeRO-1/2 gather, and what they lose to it beside them
    #: (``step.data_parallel.prefetched_gathers``); not in the fields above
    lead_s: float = 0.0
    lead_interference_s: float = 0.0
    lead_overlapped_s: float = 0.0


def _dp_links(cluster: Cluster, s: Strategy, c: GroupCollective) -> tuple[Link, dict[str, Any]]:
    """The link of the collective's data-parallel group (its mesh axis: ``dp``, or under hybrid sharding
    ``dp_shard`` or ``dp_replicate``) and, where the algorithm prices each transfer on the link it crosses (its entry
    ``reads_local``: every one but NCCL's rings), the node-local group size and the inter-node link (one rank per
    node: a GPU's own NIC share) as keyword arguments of ``collective_time``: hierarchical's inter-node phase, a
    butterfly's steps between ranks ``local`` or more apart (recursive halving and doubling move their largest
    blocks over the longest distances, Thakur et al. 2005 sec 4), a tree's levels, a naive exchange and a parameter
    server's pushes and pulls between nodes each go through the sending or receiving GPU's NIC."""
    mesh = mesh_of(s)
    if c.local is None:
        return mesh.link(c.axis, cluster), {}
    local, intra, inter = mesh.split_links(c.axis, cluster)
    if inter is None:  # one node: no step crosses (hierarchical's inter-node phase is among one rank)
        return intra, {"local": local}
    return intra, {"local": local, "inter": (inter.latency_s, inter.bandwidth_Bps)}


def price_dp(
    cluster: Cluster, s: Strategy, plan: DataParallelPlan, c: GroupCollective, n_bytes: float
) -> tuple[float, float]:
    """(seconds, bytes one rank sends) of one collective of ``plan`` over its data-parallel group."""
    link, kw = _dp_links(cluster, s, c)
    mesh = mesh_of(s)
    ranks = mesh.size(c.axis)
    nodes = max(1, ranks // mesh.local_size(c.axis, cluster.gpus_per_node))
    return price_collective(c.collective, c.algorithm, ranks, n_bytes, link, (cluster, nodes), **kw)


def data_parallel_comm(
    s: Strategy,
    plan: DataParallelPlan | None,
    price: DpPricer,
    stage: StageCost,
    backward_s: float,
    fwd_s: float,
    besides: DpBesides = (None, None, None, None, None),
    memo: DpMemo | None = None,
) -> DataParallelComm:
    """The closed form of ``plan`` (``plansim.step.data_parallel``) for one stage: its gradient reductions and weight
    gathers, how much of them backward does not hide, and what compute loses beside them; ``price`` is ``price_dp``
    of a collective of ``plan``, ``besides`` what the reductions, the gathers and hybrid sharding's all-reduce among
    replicas that follows each reduction (``DataParallelPlan.replicate``) take from compute beside them
    (``plansim.costs.interference``: the compute stream's rate beside each call, at its own pace).

    Overlap: the stage's layers' passes and the dp stream walked in the lowering's issue order
    (``step.data_parallel``): gradient buckets launched once backward has completed their gradients and run one
    after another, backward's end waiting for them (``bucketed_reduction``); ZeRO-3's gathers as far ahead as the
    framework prefetches and per-layer reduce-scatters (``per_layer_overlap``); compute at ``rate`` while a
    collective runs. Volumes are ZeRO's 2x (stages 1-2) and 3x (stage 3) the parameter bytes (Rajbhandari et al.
    2020, sec 7).

    ``memo``: what is memoized for ``plan``'s data-parallel key (``DpMemo``, held by ``AnalyticCache``); a fresh one
    by default.
    """
    if plan is None:
        return DataParallelComm(0.0, 0.0, 0.0)
    m = s.num_microbatches
    rated = (memo if memo is not None else DpMemo()).rated(price, plan, besides)
    reduce, gather = rated.reduce, rated.gather
    then = None
    if plan.replicate is not None:
        replicated = rated.replicate
        then = lambda n_bytes: replicated(n_bytes / plan.shard_ranks)  # noqa: E731
    if plan.per_layer:  # one gather and one reduce-scatter per layer, each a call of its own (FSDP's units)
        z = per_layer_overlap(
            plan,
            stage.forward_layers or (LayerPass(fwd_s, 0.0, stage.params),),
            stage.backward_layers or (LayerPass(backward_s, 0.0, stage.params),),
            gather,
            reduce,
            m,
            then,
        )
        return DataParallelComm(z.exposed_s, z.reduce_sent, z.gather_sent, z.interference_s, z.overlapped_s)
    t_ag, ag_sent, lead = (0.0, 0.0, None)
    if plan.gather_after_step and plan.gather_overlapped:  # under the next step's first forward, bucket by bucket
        lead = rated.lead(s, plan, stage, fwd_s)
        ag_sent = lead.gather_sent
    elif plan.gather_after_step:  # exposed: nothing beside it; the experts' weights over their own group after
        experts = sum(x.expert_params for x in stage.backward_layers) if plan.experts is not None else 0.0
        t_ag, ag_sent = price(plan.gather, (stage.params - experts) * plan.weight_bytes)
        if plan.experts is not None and plan.experts.gather is not None and experts > 0:
            t_e, e_sent = price(plan.experts.gather, experts * plan.weight_bytes)
            t_ag, ag_sent = t_ag + t_e, ag_sent + e_sent
    layers = stage.backward_layers or (LayerPass(backward_s, 0.0, stage.params),)
    sizes = stage.backward_chunks if len(stage.backward_chunks) > 1 else (len(layers),)
    if not plan.reduce_every_microbatch:  # the last micro-batch's backward, chunk by chunk with interleaving
        layers = _last_backwards(s, layers, stage.backward_chunks)
    else:
        sizes = (len(layers),)
    chunks = _chunk_ends(plan, stage.first_stage, sizes)
    expert_set = None
    if plan.experts is not None:
        e_then = None
        if plan.replicate is not None:
            replicated, ranks = rated.replicate, plan.experts.ranks
            e_then = lambda n_bytes: replicated(n_bytes / ranks)  # noqa: E731
        e_reduce = rated.expert_reduce if plan.experts.reduce is not None else None
        expert_set = (e_reduce, e_then, rated.launches(plan, layers, chunks, True))
    launches = rated.launches(plan, layers, chunks)
    r = bucketed_reduction(plan, layers, reduce, chunks, then, launches, expert_set)
    exposed, r_sent, lost, overlapped = r.exposed_s, r.reduce_sent, r.interference_s, r.overlapped_s
    reductions = m if plan.reduce_every_microbatch else 1
    out = DataParallelComm(
        reductions * exposed + t_ag, reductions * r_sent, ag_sent, reductions * lost, reductions * overlapped
    )
    if lead is not None:
        out = replace(
            out, lead_s=lead.exposed_s, lead_interference_s=lead.interference_s, lead_overlapped_s=lead.overlapped_s
        )
    return out


def _chunk_ends(plan: DataParallelPlan, first_stage: bool, sizes: tuple[int, ...]) -> list[tuple[int, float]]:
    """(the index of each model chunk's last pass, its bucket size) in the walk ``_last_backwards`` builds from
    ``sizes`` passes per chunk (backward order: the last chunk first; a filler pass between two chunks)."""
    out, end = [], -1
    for i, n in enumerate(sizes):
        end += n + (1 if i else 0)
        out.append((end, plan.chunk_bucket_bytes(first_stage, len(sizes) - 1 - i)))
    return out


def _first_forwards(
    s: Strategy, plan: DataParallelPlan, forward: tuple[LayerPass, ...], stage: StageCost
) -> tuple[tuple[LayerPass, ...], list[tuple[int, float, int | None]]]:
    """The passes a stage runs from the step's start until its first micro-batch has been through every one of its
    model chunks, and its weight gathers (``step.data_parallel.weight_gathers``) as (the walk index of the pass that
    waits for it, bytes, the walk index at whose start it is issued: -1 the step's start, None chained). Interleaved
    1F1B's warm-up runs the first ``p`` micro-batches' forwards chunk by chunk (``pipeline.orders.interleaved_order``),
    so after the first micro-batch's forward of a chunk come the other ``p - 1`` micro-batches' forwards of that
    chunk (one filler pass), then the first's of the next. The stage's extra parameters (the tied embeddings' copy
    on the last stage) go with its last layer, whose weights the gather also brings."""
    extra = stage.params - sum(x.params for x in forward)
    if extra > 0 and forward:
        last = forward[-1]
        forward = (*forward[:-1], LayerPass(last.work_s, last.blocking_s, last.params + extra))
    sizes = stage.backward_chunks[::-1] or (len(forward),)
    walk: list[LayerPass] = []
    starts: list[int] = []
    chunk_params: list[list[float]] = []
    start = 0
    for i, n in enumerate(sizes):
        chunk = forward[start : start + n]
        start += n
        starts.append(len(walk))
        chunk_params.append([x.params for x in chunk])
        walk.extend(chunk)
        if i < len(sizes) - 1:
            work = sum(x.work_s for x in chunk) * (s.pp - 1)
            blocking = sum(x.blocking_s for x in chunk) * (s.pp - 1)
            walk.append(LayerPass(work, blocking, 0))
    gathers: list[tuple[int, float, int | None]] = []
    for g in weight_gathers(plan, stage.first_stage, chunk_params):
        issue = -1 if g.issue == START else None if g.issue == CHAINED else starts[int(g.issue)]
        gathers.append((starts[g.chunk] + g.first, g.n_bytes, issue))
    return tuple(walk), gathers


def _rated(
    price: DpPricer, c: GroupCollective | None, beside: Beside | None, memo: dict[float, tuple[float, float, float]]
) -> Callable[[float], tuple[float, float, float]]:
    """``price`` of collective ``c`` with the compute stream's rate beside each call (``Beside.rate``), memoized in
    ``memo`` by message bytes (it reads nothing else)."""

    def priced(n_bytes: float) -> tuple[float, float, float]:
        hit = memo.get(n_bytes)
        if hit is None:
            assert c is not None and beside is not None, "a collective the plan issues"
            seconds, sent = price(c, n_bytes)
            hit = memo[n_bytes] = (seconds, sent, beside.rate(seconds, sent))
        return hit

    return priced


class _Rated:
    """A data-parallel key's collectives priced with what they take from compute beside them (``_rated``: the
    reduction, the gather and hybrid sharding's all-reduce among replicas), and each stage's overlapped ZeRO-1/2
    gathers under its first forwards (``lead``)."""

    def __init__(self, price: DpPricer, plan: DataParallelPlan, besides: DpBesides) -> None:
        self.reduce = _rated(price, plan.reduce, besides[0], {})
        self.gather = _rated(price, plan.gather, besides[1], {})
        self.replicate = _rated(price, plan.replicate, besides[2], {})
        experts = plan.experts
        self.expert_reduce = _rated(price, experts.reduce if experts is not None else None, besides[3], {})
        #: (the stage's forward passes by identity, its params, chunks, place, forward time) -> (those passes, lead)
        self._leads: dict[tuple[Any, ...], tuple[tuple[LayerPass, ...], Overlapped]] = {}
        #: (each backward pass's parameters in the set, the chunks' last passes and bucket sizes) -> its buckets
        self._launches: dict[tuple[tuple[float, ...], tuple[tuple[int, float], ...]], dict[int, float]] = {}

    def launches(
        self,
        plan: DataParallelPlan,
        layers: Sequence[LayerPass],
        chunks: Sequence[tuple[int, float]],
        expert: bool = False,
    ) -> dict[int, float]:
        """``bucket_launches`` of a backward walk (the pass after which each bucket is launched -> its bytes) for
        one set of buckets (``expert``: the experts', ``DataParallelPlan.groups``), memoized: it reads the plan's
        buckets and gradient bytes (the data-parallel key) and the passes' parameters in the set only, which remat
        and the micro-batch size do not change."""
        key = (tuple(plan.grad_share(x.params, x.expert_params, expert) for x in layers), tuple(chunks))
        hit = self._launches.get(key)
        if hit is None:
            hit = self._launches[key] = dict(bucket_launches(plan, [p * plan.grad_bytes for p in key[0]], chunks))
        return hit

    def lead(self, s: Strategy, plan: DataParallelPlan, stage: StageCost, fwd_s: float) -> Overlapped:
        """``prefetched_gathers`` of the stage's first forwards (``_first_forwards``), memoized: it reads the
        data-parallel key (the plan, the gather's price, the pipeline's stages for the walk's filler passes) and the
        stage's forward passes, parameters, chunks, place and forward time, not its backward (remat) nor the
        micro-batches. The passes are keyed by identity (one tuple per stage's layer list: ``StageSums.forward``) and
        kept in the entry, so an identity is not reused while it is a key."""
        key = (id(stage.forward_layers), stage.params, stage.backward_chunks, stage.first_stage, fwd_s)
        hit = self._leads.get(key)
        if hit is None or hit[0] is not stage.forward_layers:
            forward = stage.forward_layers or (LayerPass(fwd_s, 0.0, stage.params),)
            walk, gathers = _first_forwards(s, plan, forward, stage)
            # a later stage's first forward waits for the pipeline's fill: at least the stage before it running its
            # first chunk's forward (taken as this stage's own), which the gathers may use
            idle = 0.0 if stage.first_stage else fwd_s / max(1, len(stage.backward_chunks))
            hit = self._leads[key] = (stage.forward_layers, prefetched_gathers(walk, gathers, self.gather, idle))
        return hit[1]


class DpMemo:
    """What ``data_parallel_comm`` memoizes for one data-parallel key (``AnalyticCache.data_parallel``: its plan and
    its collectives' prices), per what the plan's collectives take from compute beside them (``DpBesides``, which
    follow from the key and the cluster): ``_Rated``."""

    def __init__(self) -> None:
        self._rated: dict[DpBesides, _Rated] = {}

    def rated(self, price: DpPricer, plan: DataParallelPlan, besides: DpBesides) -> _Rated:
        hit = self._rated.get(besides)
        if hit is None:
            hit = self._rated[besides] = _Rated(price, plan, besides)
        return hit


def dp_besides(cluster: Cluster, s: Strategy, plan: DataParallelPlan, model: Interference) -> DpBesides:
    """What the plan's reduction, gather and replicas' all-reduce take from compute beside them, each on its own
    group (``plansim.step.prepare.beside``; under hybrid sharding the shard group's and the replicas')."""
    mesh = mesh_of(s)

    def of(c: GroupCollective | None) -> Beside | None:
        return None if c is None else beside(cluster, mesh, model, c.axis, c.collective, c.algorithm, "nccl")

    experts = plan.experts
    return (
        of(plan.reduce),
        of(plan.gather),
        of(plan.replicate),
        of(experts.reduce if experts is not None else None),
        of(experts.gather if experts is not None else None),
    )


def embedding_sync(cluster: Cluster, s: Strategy, model: Workload) -> tuple[float, float]:
    """(seconds, bytes sent) of the all-reduce between the two copies of tied embeddings' gradients (first and last
    pipeline stage), which Megatron-LM runs after backward, before the optimizer step."""
    grad_bytes = tied_gradient_bytes(model, s)
    if not grad_bytes:
        return 0.0, 0.0
    ends = mesh_of(s).group("pp", 0)
    link = cluster.p2p_link(ends[0], ends[-1])
    nodes = 1 if cluster.node_of(ends[0]) == cluster.node_of(ends[-1]) else 2
    return price_collective("all_reduce", "ring", 2, grad_bytes, link, (cluster, nodes))


def _last_backwards(s: Strategy, layers: tuple[LayerPass, ...], sizes: tuple[int, ...]) -> tuple[LayerPass, ...]:
    """The passes a stage runs from its last micro-batch's first chunk backward on, in order (``layers`` as one
    backward runs them, ``sizes`` per chunk). Interleaved 1F1B ends with the last ``p`` micro-batches' backwards
    chunk by chunk, the last chunk first (``pipeline.orders.interleaved_order``; Megatron-LM's cooldown): after the
    last micro-batch's backward of one chunk come the other ``p - 1`` micro-batches' backwards of the next chunk,
    then its last micro-batch's. Those others produce no gradient the reduction waits for; they are compute that
    the chunks' buckets, launched as each chunk completes its gradients, run beside (Megatron-LM launches each
    chunk's reduction after its last backward, ``megatron/core/pipeline_parallel/schedules.py:1234-1271`` at
    core_v0.15.0). The pipeline's idle waits between them are left out (none in the closed form of a stage's
    compute), so the walk hides a little less than the discrete-event engine's timeline."""
    if len(sizes) <= 1:
        return layers
    out: list[LayerPass] = []
    start = 0
    for i, n in enumerate(sizes):
        chunk = layers[start : start + n]
        start += n
        if i:
            work = sum(x.work_s for x in chunk) * (s.pp - 1)
            blocking = sum(x.blocking_s for x in chunk) * (s.pp - 1)
            out.append(LayerPass(work, blocking, 0))
        out.extend(chunk)
    return tuple(out)
