"""What a stage's data-parallel group issues in one training step, defined once for both engines.

``data_parallel_plan`` says, for a strategy's ZeRO stage, which collective reduces the gradients and how often, when
weights are all-gathered, with which algorithm and at which message size per parameter. The lowering issues those
collectives task by task (gradient buckets, per-layer ZeRO-3 gathers with their prefetch); the analytic engine prices
the same collectives in closed form (``plansim.analytic.data_parallel.data_parallel_comm``). Under hybrid sharding
the stage's collectives run on the ``dp_shard`` group and each reduction is followed by ``replicate``, an all-reduce
over ``dp_replicate``; with ``pp > 1`` and tied embeddings the first and last stage all-reduce the embedding's
gradient (``tied_gradient_bytes``).

When each collective is issued is defined here too, in the lowering's order on a compute and a dp stream, which the
analytic engine walks: ``bucketed_reduction`` (a bucket launched once its gradients are complete, never across two
model chunks), ``per_layer_overlap`` (ZeRO-3's gathers as far ahead as the framework prefetches, ``param_prefetch``,
and its per-layer reduce-scatters), ``weight_gathers`` and ``prefetched_gathers`` (ZeRO-1/2's weight buckets and
when each is gathered).

Sources: PyTorch DDP buckets gradients and all-reduces each bucket once backward has produced it (Li et al. 2020,
VLDB, sec 3.2.3); ZeRO (Rajbhandari et al. 2020, sec 5 and 7): stage 1 reduce-scatters the gradients once per step
and all-gathers the updated weights after the optimizer step; stage 2 also shards gradients, so it reduce-scatters
every micro-batch's; stage 3 also shards the weights, gathering each layer's before its forward and again before its
backward and reduce-scattering each layer's gradients as backward produces them (PyTorch FSDP does the same per
wrapped unit, Zhao et al. 2023, sec 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from plansim.costs.collectives import algorithm_entry
from plansim.hardware import Cluster
from plansim.step.prepare import shard_algorithm, tied_copy_params
from plansim.strategy.frameworks import FrameworkRules, ParamPrefetch, load_framework
from plansim.strategy.mesh import EXPERT_GRAD_AXES, GRAD_AXES, mesh_of
from plansim.strategy.schema import Strategy
from plansim.units import dtype_bytes
from plansim.workload.traced import Workload

__all__ = [
    "DataParallelPlan",
    "ExpertGroup",
    "GroupCollective",
    "LayerPass",
    "Overlapped",
    "bucket_launches",
    "bucketed_reduction",
    "data_parallel_plan",
    "experts_apart",
    "gathered_weight_bytes",
    "gathers_per_layer",
    "grad_copy_in_bytes",
    "param_prefetch",
    "per_layer_overlap",
    "sharded_params_are_master",
    "tied_gradient_bytes",
    "weights_kept_through_step",
]


@dataclass(frozen=True)
class GroupCollective:
    """One kind of collective over a data-parallel group: its name and algorithm (keys of ``COLLECTIVES``), the
    node-local group size for algorithms whose entry ``reads_local`` (else None), and the mesh axis of its group
    (``dp``, or under hybrid sharding ``dp_shard`` or ``dp_replicate``: ``plansim.strategy.mesh.DP_AXES``)."""

    collective: str
    algorithm: str
    local: int | None = None
    axis: str = "dp"


@dataclass(frozen=True)
class ExpertGroup:
    """The routed experts' gradients in buckets of their own, reduced (and under ZeRO-1/2 their weights gathered
    after the optimizer step) over the expert-data-parallel group of ``ranks`` (``EXPERT_GRAD_AXES``: ``edp``, or
    under hybrid sharding one replica's ``edp``, each reduction then all-reduced among the replicas as the dense
    buckets' are, ``DataParallelPlan.replicate``). Megatron-LM keeps expert parameters in buffers apart, each
    bucketed as the dense ones are, over ``intra_expt_dp_group`` (NVIDIA/Megatron-LM d98e8a64,
    ``megatron/core/distributed/distributed_data_parallel.py:283-290, 313-330``), their bucket groups partitioned
    and synchronised alike (``:349-355``, ``start_grad_sync`` and ``finish_grad_sync`` walk ``bucket_groups +
    expert_parallel_bucket_groups``, ``:664, 677``). ``reduce``/``gather``: None where ``ranks`` is 1 (nothing to
    reduce or gather)."""

    ranks: int
    reduce: GroupCollective | None
    gather: GroupCollective | None


@dataclass(frozen=True)
class DataParallelPlan:
    """The data-parallel and ZeRO traffic of one step (``dp`` > 1).

    ``reduce``: the gradient reduction (an all-reduce, or under ZeRO >= 1 a reduce-scatter), issued once per step of
    the accumulated gradients, or every micro-batch where gradients are sharded (``reduce_every_microbatch``);
    ``gather``: the weights' all-gather (ZeRO >= 1), after the optimizer step (``gather_after_step``: ZeRO-1/2) or,
    with ``per_layer`` (ZeRO-3), before each layer's forward and, with ``regather_backward``, again before its
    backward (without, FSDP's SHARD_GRAD_OP, the forward's gathered weights are kept until the layer's backward),
    gradients then reduced per layer rather than in buckets. ``grad_bytes``/``weight_bytes``: bytes per parameter of
    a gradient and of a gathered weight. Under hybrid sharding (HSDP) ``reduce`` and ``gather`` run over the
    ``dp_shard`` group and each reduction is followed by ``replicate``, an all-reduce of its output (1/``shard`` of
    the bytes) over the ``dp_replicate`` group; ``shard``: the ranks the states are sharded over (``dp`` without).
    ``prefetch``: how far ahead of a pass ZeRO-3's per-layer gathers are issued (the framework's rule).
    ``experts``: where the routed experts' parameters are kept apart (``experts_apart``), their buckets over the
    expert-data-parallel group (``ExpertGroup``); the gradients above are then the rest's, every layer's
    ``LayerPass.expert_params`` going to the experts' buckets instead. None: every gradient in one set of buckets.
    ``bucket_bytes`` and ``overlap``: gradient buckets launched as backward fills them (else one reduction after
    backward); a bucket never spans two model chunks (each chunk has buffers of its own), and where the framework
    buckets only the first pipeline stage's first model chunk (``first_chunk_buckets_only``) every other chunk is
    one bucket (``chunk_bucket_bytes``). ``gather_overlapped``: the ZeRO-1/2 gather runs under the next step's
    forward instead, in the same buckets (``weight_gathers``, ``prefetched_gathers``: Megatron-LM's
    ``--overlap-param-gather``)."""

    dp: int
    reduce: GroupCollective
    gather: GroupCollective
    reduce_every_microbatch: bool
    per_layer: bool
    gather_after_step: bool
    grad_bytes: int
    weight_bytes: int
    bucket_bytes: float
    overlap: bool
    gather_overlapped: bool = False
    first_chunk_buckets_only: bool = False
    regather_backward: bool = True
    replicate: GroupCollective | None = None
    shard: int = 0
    prefetch: ParamPrefetch = field(default_factory=lambda: ParamPrefetch(layers=1))
    experts: ExpertGroup | None = None

    def groups(self) -> tuple[bool, ...]:
        """The sets of buckets a backward fills, in the order a layer's are issued: the dense one (False), then,
        where kept apart, the experts' (True). ASSUMPTION: where both fill a bucket at the same layer the dense
        bucket is issued first; both run on the one dp stream in issue order (one stream beside compute, as
        ``_Streams`` has it; Megatron-LM issues each bucket group's collective once its gradients are ready)."""
        return (False,) if self.experts is None else (False, True)

    def grad_share(self, params: float, expert_params: float, expert: bool) -> float:
        """Of a layer's ``params`` (``expert_params`` of them the routed experts'), those whose gradients fill the
        ``expert`` set of buckets (``groups``)."""
        if self.experts is None:
            return params
        return expert_params if expert else params - expert_params

    @property
    def shard_ranks(self) -> int:
        """The ranks a reduce-scatter and a gather run over: ``shard`` under hybrid sharding, else ``dp``."""
        return self.shard or self.dp

    def chunk_bucket_bytes(self, first_stage: bool, chunk: int) -> float:
        """The bucket size of model chunk ``chunk`` (forward order) of a stage: ``bucket_bytes``, or, where the
        framework buckets only the first stage's first chunk, unbounded elsewhere (one bucket per chunk)."""
        if self.first_chunk_buckets_only and (not first_stage or chunk > 0):
            return math.inf
        return self.bucket_bytes

    def bucket_full(self, held_bytes: float, size: float | None = None) -> bool:
        """Whether a gradient bucket holding ``held_bytes`` is launched now, while backward goes on (else it waits
        for more gradients, or for the end of backward without overlap); ``size``: its chunk's bucket size
        (``chunk_bucket_bytes``; ``bucket_bytes`` by default). The lowering and ``bucket_launches`` ask this one
        rule."""
        return self.overlap and held_bytes >= (self.bucket_bytes if size is None else size)


@dataclass(frozen=True)
class LayerPass:
    """One layer's forward or backward on the compute stream, as the analytic engine sees it: ``work_s`` of kernels
    at full rate (a backward's recompute included), which a collective beside it slows
    (``plansim.costs.interference``), ``blocking_s`` of blocking collectives and their waits, which it does not, and
    the layer's ``params`` (whose weights ZeRO-3 gathers before the pass; whose gradients are complete once its
    backward ends), ``expert_params`` of them the routed experts' (``DataParallelPlan.experts``)."""

    work_s: float
    blocking_s: float
    params: float
    expert_params: float = 0.0


@dataclass(frozen=True)
class Overlapped:
    """Data-parallel collectives beside compute: ``exposed_s`` the compute stream waits for them (at the end of
    backward, or before a pass whose weights are not there yet), ``overlapped_s`` of compute beside them, the
    ``interference_s`` that compute lost, and the bytes one rank sends in the reductions and in the gathers."""

    exposed_s: float
    overlapped_s: float
    interference_s: float
    reduce_sent: float
    gather_sent: float


class _Streams:
    """The compute stream and the dp stream of one rank, timed in the order the lowering issues their tasks: every
    task depends only on tasks issued before it, so each one's start and end are final once issued. Collectives run
    one at a time in issue order (one NCCL communicator, one stream); compute runs at each collective's own rate
    while it runs."""

    def __init__(self) -> None:
        self.t = 0.0  # when the compute stream's last task ends
        self.free = 0.0  # when the dp stream's last collective ends
        self.spans: list[tuple[float, float, float]] = []  # (start, end, compute rate beside it)
        self.first = 0  # spans before it end before ``t``
        self.busy = self.overlapped = self.lost = 0.0

    def compute(self, work_s: float, blocking_s: float = 0.0, after: float = 0.0) -> None:
        """A compute task of ``work_s`` (at full rate) and ``blocking_s``, once the collective ending at ``after``
        has ended."""
        if after <= self.t and self.free <= self.t:  # no collective beside it: at full rate
            self.t = self.t + max(0.0, work_s) + blocking_s
            self.busy += work_s + blocking_s
            return
        t, work = max(self.t, after), work_s
        while self.first < len(self.spans) and self.spans[self.first][1] <= t:
            self.first += 1
        for lo, hi, rate in self.spans[self.first :]:
            if work <= 0:
                break
            if lo > t:  # at full rate until the collective starts
                if work <= lo - t:
                    break
                work -= lo - t
                t = lo
            beside = min(work / rate, hi - t)
            self.overlapped += beside
            self.lost += (1.0 - rate) * beside
            work = 0.0 if beside < hi - t else work - beside * rate
            t += beside
        self.t = t + max(0.0, work) + blocking_s
        self.busy += work_s + blocking_s

    def collective(self, seconds: float, ready: float, rate: float) -> float:
        """A collective of ``seconds`` that may start at ``ready``, compute beside it at ``rate``; returns when it
        ends."""
        start = max(ready, self.free)
        self.free = start + seconds
        self.spans.append((start, self.free, rate))
        return self.free

    def state(self) -> tuple[float, ...]:
        """What the next task's timing depends on, relative to the compute stream's time: the collectives not yet
        ended (their start, end, rate) and when the dp stream is free."""
        pending = [(max(0.0, lo - self.t), hi - self.t, r) for lo, hi, r in self.spans[self.first :] if hi > self.t]
        return (self.free - self.t, *(x for span in pending for x in span))

    def totals(self) -> tuple[float, float, float, float, float]:
        return self.t, self.free, self.busy, self.overlapped, self.lost

    def advance(self, delta: Sequence[float], times: int) -> None:
        """Repeat ``times`` more a period whose totals moved by ``delta`` and left ``state`` as it found it."""
        self.t, self.free, self.busy, self.overlapped, self.lost = (
            x + times * d for x, d in zip(self.totals(), delta, strict=True)
        )
        self.spans, self.first = [], 0

    def result(self, reduce_sent: float, gather_sent: float) -> Overlapped:
        exposed = max(self.t, self.free) - self.busy - self.lost
        return Overlapped(max(0.0, exposed), self.overlapped, self.lost, reduce_sent, gather_sent)


def bucket_launches(
    plan: DataParallelPlan, grad_bytes: Sequence[float], chunks: Sequence[tuple[int, float]] = ()
) -> list[tuple[int, float]]:
    """The gradient buckets of one backward as the lowering issues them: ``grad_bytes`` per layer in the order
    backward completes them fill a bucket, launched once full (``DataParallelPlan.bucket_full``) after the layer
    that filled it; the rest after the last layer with gradients. ``chunks``: (the index of each model chunk's last
    layer, its bucket size), in backward order: with overlap a chunk's rest is launched after its last layer (a
    bucket never spans chunks); by default one chunk at ``plan.bucket_bytes``. Returns (that layer's index, bucket
    bytes).

    >>> p = DataParallelPlan(2, *[GroupCollective("all_reduce", "ring")] * 2, False, False, False, 4, 2, 10.0, True)
    >>> bucket_launches(p, [6.0, 6.0, 0.0, 3.0, 0.0])
    [(1, 12.0), (3, 3.0)]
    >>> bucket_launches(p, [6.0, 3.0, 0.0, 6.0, 6.0], chunks=[(1, 10.0), (4, math.inf)])  # two chunks, one bucketed
    [(1, 9.0), (4, 12.0)]
    """
    ends = dict(chunks) if chunks else {len(grad_bytes) - 1: plan.bucket_bytes}
    size = ends[min(ends)]
    launches = []
    held, last = 0.0, -1
    for i, n_bytes in enumerate(grad_bytes):
        if n_bytes > 0:
            held, last = held + n_bytes, i
            if plan.bucket_full(held, size):
                launches.append((i, held))
                held = 0.0
        if i in ends:
            if plan.overlap and held > 0:
                launches.append((last, held))
                held = 0.0
            size = ends.get(min((e for e in ends if e > i), default=i), size)
    if held > 0:
        launches.append((last, held))
    return launches


#: A collective of that many bytes -> (its seconds, the bytes one rank sends, the compute stream's rate beside it:
#: ``plansim.costs.interference``, at the call's own pace).
Pricer = Callable[[float], tuple[float, float, float]]


#: When a weight gather is issued: at the step's start, once the gather before it has been waited for (a prefetch
#: of one), or (an int) when the stage's first forward of that model chunk begins.
START, CHAINED = "start", "chained"


@dataclass(frozen=True)
class WeightGather:
    """One bucket of an overlapped ZeRO-1/2 weight gather (``gather_overlapped``): its model ``chunk``, the position
    in the chunk's forward order of the first layer whose weights it holds (that layer's forward waits for it), its
    bytes of weights, and when it is issued (``START``, ``CHAINED`` or a chunk's index)."""

    chunk: int
    first: int
    n_bytes: float
    issue: str | int


def weight_gathers(
    plan: DataParallelPlan, first_stage: bool, chunk_params: Sequence[Sequence[float]]
) -> list[WeightGather]:
    """The weight gathers of one stage under ``--overlap-param-gather``, in issue order, from its layers'
    parameters per model chunk (forward order; a chunk's extra parameters, the tied embeddings' copy, with its last
    layer). Megatron-LM's buckets (``megatron/core/distributed/param_and_grad_buffer.py:639-667`` at core_v0.15.0)
    are its gradient buckets: built walking the parameters backwards, each closed once it holds the chunk's bucket
    size (``chunk_bucket_bytes``), so the first in forward order is the remainder. Without interleaving the first is
    issued in the step's first ``zero_grad`` and each forward pre-hook that waits for one issues the next
    (``distrib_optimizer.py:2590-2596``, ``param_and_grad_buffer.py:265-301``); with interleaving
    (``align_param_gather``, the training script's default) chunks 0 and 1 are issued at the start and chunk
    ``k + 1`` when the first micro-batch's forward of chunk ``k`` begins, every bucket of a chunk at once
    (``megatron/core/pipeline_parallel/schedules.py:1033-1036, 1150-1168``).

    >>> p = DataParallelPlan(2, *[GroupCollective("all_gather", "ring")] * 2, False, False, True, 4, 2, 40.0, True)
    >>> [(g.first, g.n_bytes, g.issue) for g in weight_gathers(p, True, [[3.0, 0.0, 6.0, 6.0, 4.0]])]
    [(0, 18.0, 'start'), (3, 20.0, 'chained')]
    """
    out: list[WeightGather] = []
    interleaved = len(chunk_params) > 1
    for c, params in enumerate(chunk_params):
        size = plan.chunk_bucket_bytes(first_stage, c) / plan.grad_bytes
        closed: list[tuple[int, float]] = []
        held = 0.0
        for i in range(len(params) - 1, -1, -1):
            held += params[i]
            if held >= size:
                closed.append((i, held))
                held = 0.0
        if held > 0 or not closed:
            closed.append((0, held))
        buckets = [(0 if k == 0 else i, n) for k, (i, n) in enumerate(closed[::-1])]
        for first, n in buckets:
            if n <= 0:
                continue
            if interleaved:
                issue: str | int = START if c <= 1 else c - 1
            else:
                issue = START if not out else CHAINED
            out.append(WeightGather(c, first, n * plan.weight_bytes, issue))
    return out


def prefetched_gathers(
    walk: Sequence[LayerPass],
    gathers: Sequence[tuple[int, float, int | None]],
    gather: Pricer,
    idle_s: float = 0.0,
) -> Overlapped:
    """A stage's first forward beside its overlapped ZeRO-1/2 weight gathers (``weight_gathers``), as the lowering
    issues them: ``walk``, the passes from the step's start until its first micro-batch has been through every model
    chunk; ``gathers`` in issue order, each (the walk index of the first pass that waits for it, its bytes, the walk
    index at whose start it is issued: -1 the step's start, None once the gather before it has been waited for);
    collectives one at a time on the dp stream, compute at each one's rate beside it; ``idle_s``: the pipeline's fill
    before the stage's first forward, which the gathers may use. ``exposed_s`` is what the passes are delayed by:
    the step's too, as every later pass of the stage follows them.

    >>> layers = [LayerPass(1.0, 0.0, 10.0), LayerPass(1.0, 0.0, 10.0)]  # two buckets, a gather 1.5 s each
    >>> r = prefetched_gathers(layers, [(0, 20.0, -1), (1, 20.0, None)], lambda n: (1.5, n, 1.0))
    >>> r.exposed_s, r.gather_sent  # layer 1 waits 1.5 s, layer 2 until its gather (issued at 1.5) ends at 3.0
    (2.0, 40.0)
    """
    streams = _Streams()
    ends: list[float | None] = [None] * len(gathers)
    sent = 0.0

    def issue(k: int, ready: float) -> None:
        nonlocal sent
        seconds, n_sent, rate = gather(gathers[k][1])
        sent += n_sent
        ends[k] = streams.collective(seconds, ready, rate)

    # the gathers by the walk index at whose start they are issued, and by the pass that waits for them (issue order)
    issued_at: dict[int, list[int]] = {}
    waited_at: dict[int, list[int]] = {}
    for k, (first, _, at) in enumerate(gathers):
        if at is not None and at >= 0:
            issued_at.setdefault(at, []).append(k)
        waited_at.setdefault(first, []).append(k)
    for k, (_, _, at) in enumerate(gathers):
        if at is not None and at < 0:
            issue(k, 0.0)
    if idle_s > 0:
        streams.compute(0.0, idle_s)
    for i, layer in enumerate(walk):
        for k in issued_at.get(i, ()):
            if ends[k] is None:
                issue(k, streams.t)
        after = 0.0
        for k in waited_at.get(i, ()):
            if ends[k] is None:  # not issued yet: a chained one whose turn came
                issue(k, streams.t)
            end = ends[k]
            assert end is not None
            after = max(after, end)
            if k + 1 < len(gathers) and gathers[k + 1][2] is None and ends[k + 1] is None:
                issue(k + 1, max(streams.t, end))
        streams.compute(layer.work_s, layer.blocking_s, after=after)
    for k in range(len(gathers)):  # a bucket no pass waits for (no parameters in the walk) still runs
        if ends[k] is None:
            issue(k, streams.t)
    return streams.result(0.0, sent)


def bucketed_reduction(
    plan: DataParallelPlan,
    layers: Sequence[LayerPass],
    price: Pricer,
    chunks: Sequence[tuple[int, float]] = (),
    then: Pricer | None = None,
    launches: Mapping[int, float] | None = None,
    experts: tuple[Pricer | None, Pricer | None, Mapping[int, float] | None] | None = None,
) -> Overlapped:
    """One backward (``layers`` in the order it runs them) and its gradient buckets on the dp stream, timed as the
    discrete-event engine runs them: a bucket is launched once backward has produced all its gradients (Li et al.
    2020, PyTorch DDP, sec 3.2.3; Megatron-LM's ``register_grad_ready``/``start_grad_sync`` in
    ``megatron/core/distributed/param_and_grad_buffer.py``), buckets run one after another in launch order, and
    compute runs at each one's rate while it runs. ``price``: (seconds, bytes sent, compute's rate beside it) of a
    bucket of that many bytes; ``chunks``: the model chunks' last layers and bucket sizes (``bucket_launches``);
    ``then``: the price of a collective following each reduction on the stream (hybrid sharding's all-reduce among
    replicas); ``launches``: the buckets as ``bucket_launches`` gives them for ``layers`` and ``chunks`` (the layer
    index after which each is launched -> its bytes), by default computed here. Where the plan keeps the experts'
    gradients apart (``DataParallelPlan.experts``) ``launches`` holds the rest's and ``experts`` gives the experts'
    buckets as (their reduction's price or None, the price of what follows it or None, their launches or None:
    computed here), issued after the rest's bucket launched at the same layer (``DataParallelPlan.groups``).
    Exposed is what the last bucket ends after backward does: backward's end waits for every bucket (PyTorch DDP's
    ``Reducer::finalize_backward``, FSDP's ``_post_backward_final_callback``, Megatron-LM's ``finish_grad_sync``).

    >>> p = DataParallelPlan(2, *[GroupCollective("all_reduce", "ring")] * 2, False, False, False, 4, 2, 1.0, True)
    >>> layers = [LayerPass(2.0, 0.0, 1.0), LayerPass(2.0, 0.0, 1.0)]
    >>> r = bucketed_reduction(p, layers, lambda n: (3.0, n, 0.5))
    >>> r.exposed_s, r.overlapped_s, r.interference_s  # bucket 1 runs 2-5 s, layer 2 ends at 5.5 s, bucket 2 at 8.5 s
    (3.0, 3.0, 1.5)
    """
    sets: list[tuple[Mapping[int, float], Pricer | None, Pricer | None]] = []
    for expert in plan.groups():
        given = launches
        pricers: tuple[Pricer | None, Pricer | None] = (price, then)
        if expert:
            assert experts is not None, "the experts' pricers where the plan keeps them apart"
            pricers, given = experts[:2], experts[2]
        if given is None:
            grads = [plan.grad_share(x.params, x.expert_params, expert) * plan.grad_bytes for x in layers]
            given = dict(bucket_launches(plan, grads, chunks))
        sets.append((given, *pricers))
    priced: list[dict[float, tuple[float, float, float]]] = [{}, {}]
    streams, sent, work = _Streams(), 0.0, 0.0
    for i, layer in enumerate(layers):
        work += layer.work_s  # layers between launches with nothing blocking run as one span of work
        n_sets = [(k, n_bytes) for k, (given, _, _) in enumerate(sets) if (n_bytes := given.get(i)) is not None]
        if layer.blocking_s > 0 or n_sets or i == len(layers) - 1:
            streams.compute(work, layer.blocking_s)
            work = 0.0
        for k, n_bytes in n_sets:
            _, first, follow = sets[k]
            if first is not None:
                if n_bytes not in priced[k]:
                    priced[k][n_bytes] = first(n_bytes)
                seconds, n_sent, rate = priced[k][n_bytes]
                streams.collective(seconds, streams.t, rate)
                sent += n_sent
            if follow is not None:
                seconds, n_sent, rate = follow(n_bytes)
                streams.collective(seconds, streams.t, rate)
                sent += n_sent
    return streams.result(sent, 0.0)


def per_layer_overlap(
    plan: DataParallelPlan,
    forward: Sequence[LayerPass],
    backward: Sequence[LayerPass],
    gather: Pricer,
    reduce: Pricer,
    microbatches: int,
    then: Pricer | None = None,
) -> Overlapped:
    """ZeRO-3's step as the lowering issues it, micro-batch after micro-batch (pp = 1): before each layer's forward
    and backward (forward only without ``plan.regather_backward``) its weights are all-gathered, with the gathers of
    the layers ``plan.prefetch`` keeps ahead issued at the same point (they may start once the pass before the
    current one has ended; FSDP's prefetch of one unit, Zhao et al. 2023, sec 3.3; DeepSpeed's and Megatron-FSDP's
    windows of elements), and each layer's gradients are reduce-scattered once its backward ends (FSDP's
    post-backward reduce-scatter); collectives run in issue order on the dp stream, compute at each one's rate
    beside it. ``forward``/``backward``: the layers' passes in the order each runs them; ``gather`` and ``reduce``:
    (seconds, bytes sent, compute's rate beside it) of a layer's collective of that many bytes; ``then``: the price
    of a collective following each reduce-scatter (hybrid sharding's all-reduce among replicas)."""
    streams = _Streams()
    sent = {"g": 0.0, "r": 0.0}
    priced: dict[tuple[str, float], tuple[float, float, float]] = {}
    pricers = {"g": gather, "r": reduce, "a": then if then is not None else reduce}

    def issue(kind: str, n_bytes: float) -> float:
        if (kind, n_bytes) not in priced:
            priced[kind, n_bytes] = pricers[kind](n_bytes)
        seconds, n_sent, rate = priced[kind, n_bytes]
        sent["g" if kind == "g" else "r"] += n_sent
        return streams.collective(seconds, streams.t, rate)

    previous: tuple[float, ...] | None = None
    ahead = {id(layers): plan.prefetch.windows([x.params for x in layers]) for layers in (forward, backward)}
    for k in range(microbatches):
        before = (*streams.totals(), sent["g"], sent["r"])
        for layers, reduces in ((forward, False), (backward, True)):
            gathered: dict[int, float] = {}
            gathers = not reduces or plan.regather_backward  # SHARD_GRAD_OP's backward uses the forward's gathers
            for pos, layer in enumerate(layers):
                for i in range(pos, pos + 1 + ahead[id(layers)][pos]):
                    if not gathers:
                        gathered[i] = 0.0
                    elif i < len(layers) and i not in gathered:
                        params = layers[i].params
                        gathered[i] = issue("g", params * plan.weight_bytes) if params > 0 else 0.0
                streams.compute(layer.work_s, layer.blocking_s, after=gathered[pos])
                if reduces and layer.params > 0:
                    issue("r", layer.params * plan.grad_bytes)
                    if then is not None:
                        issue("a", layer.params * plan.grad_bytes)
        state = streams.state()
        if (
            previous is not None
            and len(state) == len(previous)
            and all(abs(a - b) <= 1e-12 for a, b in zip(state, previous, strict=True))
        ):  # a micro-batch found and left the streams alike: every later one repeats it (exact, and quick)
            delta = [a - b for a, b in zip((*streams.totals(), sent["g"], sent["r"]), before, strict=True)]
            times = microbatches - k - 1
            streams.advance(delta[:5], times)
            sent["g"] += times * delta[5]
            sent["r"] += times * delta[6]
            break
        previous = state
    return streams.result(sent["r"], sent["g"])


def _on_dp(
    cluster: Cluster, s: Strategy, collective: str, algorithm: str, axis: str = "dp", expert: bool = False
) -> GroupCollective:
    """A collective over the data-parallel ``axis``'s gradient group (``GRAD_AXES``: with the context-parallel
    ranks; ``expert``: the routed experts' group, ``EXPERT_GRAD_AXES``)."""
    axis = (EXPERT_GRAD_AXES if expert else GRAD_AXES)[axis]
    local = None
    if algorithm_entry(collective, algorithm).reads_local:
        local = mesh_of(s).local_size(axis, cluster.gpus_per_node)
    return GroupCollective(collective, algorithm, local, axis)


def grad_ranks(s: Strategy) -> int:
    """The ranks ``s``'s gradients are reduced over: the data-parallel ranks of every context-parallel rank
    (``GRAD_AXES``; ``dp`` without context parallelism)."""
    return mesh_of(s).size(GRAD_AXES["dp"])


def experts_apart(s: Strategy) -> bool:
    """Whether the routed experts' gradients are reduced over a group of their own (``ExpertGroup``): where the
    experts are regrouped, ep > 1 or etp other than tp. Megatron-LM marks expert parameters ``allreduce=False``
    (kept in expert buffers over the expert-data-parallel group) only then (``use_expert_pgs``,
    ``megatron/core/extensions/transformer_engine.py:1235-1240, 1740-1745`` at d98e8a64); otherwise they sit in the
    dense buffers over dp x cp, the same ranks. ASSUMPTION: DeepSpeed's and torchtitan's alike (torchtitan puts the
    experts on the tp mesh without ep, ``models/llama4/infra/parallelize.py:558-562`` at v0.2.2)."""
    return s.ep > 1 or s.expert_tp != s.tp


def _framework_rules(s: Strategy) -> FrameworkRules:
    return load_framework(s.framework).rules


def weights_kept_through_step(s: Strategy) -> bool:
    """ZeRO-3 with pipelining where the framework keeps each layer's gathered weights through the step and
    reduce-scatters its whole gradients once at the end (torchtitan: its rule ``sharded_weights_kept_with_pipeline``):
    within the step, ZeRO-1's memory and traffic, each layer's gather under its first forward."""
    if s.zero < 3 or s.pp == 1:
        return False
    return _framework_rules(s).sharded_weights_kept_with_pipeline.value


def gathers_per_layer(s: Strategy) -> bool:
    """Whether the weights are sharded at rest and all-gathered layer by layer for each micro-batch's passes: ZeRO-3
    (but where ``weights_kept_through_step``), and ZeRO-2 where the framework's ZeRO-2 shards them (FSDP's
    SHARD_GRAD_OP: its rule ``zero2_shards_weights``)."""
    if s.zero == 2:
        return _framework_rules(s).zero2_shards_weights.value
    return s.zero >= 3 and not weights_kept_through_step(s)


def sharded_params_are_master(s: Strategy) -> bool:
    """Whether the parameters' shards are the fp32 master weights, so that the optimizer keeps only its moments (the
    framework's rule ``sharded_params_are_master`` at ``s``'s ZeRO stage, where the weights are sharded at rest and
    training is in mixed precision: FSDP2's fully_shard)."""
    if s.zero < 2:  # the planner asks it of every candidate: the common case first
        return False
    return s.mixed_precision and gathers_per_layer(s) and s.zero in _framework_rules(s).sharded_params_are_master.value


def grad_copy_in_bytes(s: Strategy) -> tuple[int, int]:
    """Bytes per parameter of what a unit holds for its gradients' reduction where the framework copies them into a
    flat buffer (its rule ``grad_reduce_copy_in`` at ``s``'s ZeRO stage, with per-layer reduce-scatters: FSDP2's
    foreach_reduce): the unsharded gradients autograd makes, in the compute dtype (the gathered weights' dtype),
    from the unit's backward to the copy, and the flat reduce-scatter input, in the reduce dtype (``s.grad_bytes``),
    from the copy to the next unit's copy (the last unit's: to the end of the pass). (0, 0) elsewhere: without data
    parallelism nothing is reduced.

    The reduce-scatter's output, 1/dp of the input, is allocated after the unsharded gradients are freed, so beside
    the input it holds less than they did for dp >= 2; the first micro-batch's becomes the sharded gradient the model
    states count, and a later one's is added to it and freed: it is not counted apart."""
    if s.zero < 2 or grad_ranks(s) <= 1 or not gathers_per_layer(s):
        return (0, 0)
    if s.zero not in _framework_rules(s).grad_reduce_copy_in.value:
        return (0, 0)
    return (dtype_bytes(s.compute_dtype), s.grad_bytes)


def gathered_weight_bytes(s: Strategy) -> int:
    """Bytes per parameter ZeRO's all-gathers move and a gathered layer holds: the compute dtype's, or 1 under
    ``fp8_param_gather`` (Megatron-LM's --fp8-param-gather, torchao's enable_fsdp_float8_all_gather: the weights
    cast to FP8 before the gather, torchtitan docs/float8.md:17,47 at v0.2.2). ASSUMPTION: every gathered parameter
    counted at 1 B; the bf16 ones (embedding, norms, output layer, biases) are a few percent of a stage's parameters
    where pipelining splits the model, more without it."""
    return 1 if s.fp8 and s.fp8_param_gather else dtype_bytes(s.compute_dtype)


def param_prefetch(s: Strategy) -> ParamPrefetch:
    """How far ahead of a pass ZeRO-3's per-layer gathers are issued (the framework's rule ``param_prefetch``): the
    lowering's gathers (``DataParallelPlan.prefetch``) and the layers the memory model holds gathered at once
    (``step.memory.static_bytes``)."""
    return _framework_rules(s).param_prefetch.value


def data_parallel_plan(cluster: Cluster, s: Strategy) -> DataParallelPlan | None:
    """The data-parallel traffic of ``s`` (resolved) on ``cluster``; None without data parallelism (nor context
    parallelism, whose ranks reduce their gradients as data-parallel ones do)."""
    dp = grad_ranks(s)
    if dp <= 1:
        return None
    assert s.grad_bucket_bytes is not None and s.overlap_grad_reduce is not None, "resolve the strategy first"
    sharded = shard_algorithm(s)
    axis = "dp_shard" if s.hybrid_shard else "dp"
    replicate = None
    if s.zero == 0:
        reduce = _on_dp(cluster, s, "all_reduce", s.dp_algorithm)
    else:
        reduce = _on_dp(cluster, s, "reduce_scatter", sharded, axis)
        if s.hybrid_shard:  # HSDP: the shard's reduced gradients all-reduced among its replicas
            replicate = _on_dp(cluster, s, "all_reduce", s.dp_algorithm, "dp_replicate")
    kept = weights_kept_through_step(s)  # torchtitan's FSDP with pipelining: ZeRO-1's traffic, one layer per bucket
    per_layer = gathers_per_layer(s)
    overlapped = kept or (s.zero in (1, 2) and not per_layer and bool(s.overlap_param_gather))
    experts = None
    # Not yet: ZeRO-3's per-layer gathers and ZeRO-1/2's overlapped weight gathers keep the experts with the rest
    # (over dp x cp, docs/strategies.md)
    if experts_apart(s) and not per_layer and not overlapped:
        ranks = mesh_of(s).size(EXPERT_GRAD_AXES[axis])
        on = ranks > 1
        experts = ExpertGroup(
            ranks,
            _on_dp(cluster, s, reduce.collective, reduce.algorithm, axis, True) if on else None,
            _on_dp(cluster, s, "all_gather", sharded, axis, True) if on and s.zero >= 1 else None,
        )
    return DataParallelPlan(
        dp=dp,
        reduce=reduce,
        gather=_on_dp(cluster, s, "all_gather", sharded, axis),
        reduce_every_microbatch=(
            s.zero >= 2 and not kept and _framework_rules(s).sharded_grads_reduced_every_microbatch.value
        ),
        per_layer=per_layer,
        regather_backward=s.zero >= 3,
        gather_after_step=kept or (s.zero in (1, 2) and not gathers_per_layer(s)),
        grad_bytes=s.grad_bytes,
        weight_bytes=gathered_weight_bytes(s),
        bucket_bytes=1.0 if kept else s.grad_bucket_bytes,  # each FSDP unit (a layer) reduces and gathers alone
        # the REDUCE_GRAD action after the stage's last backward: one reduction here, where torch issues one per layer
        # back to back (the same bytes, fewer launches)
        overlap=s.overlap_grad_reduce and not kept,
        gather_overlapped=overlapped,
        first_chunk_buckets_only=_framework_rules(s).grad_buckets_first_chunk_only.value,
        replicate=replicate,
        shard=s.shard_degree if s.hybrid_shard else 0,
        prefetch=param_prefetch(s),
        experts=experts,
    )


def tied_gradient_bytes(model: Workload, s: Strategy) -> float:
    """Bytes of the tied embeddings' gradient that the first and last pipeline stage all-reduce between their two
    copies after backward, before the optimizer step (Megatron-LM, ``_allreduce_word_embedding_grads``); 0 without
    a second copy."""
    return tied_copy_params(model, s) * s.grad_bytes
