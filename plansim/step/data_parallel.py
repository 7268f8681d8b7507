"""What a stage's data-parallel group issues in one training step, defined once for both engines.

``data_parallel_plan`` says, for a strategy's ZeRO stage, which collective reduces the gradients and how often, when
weights are all-gathered, with which algorithm and at which message size per parameter. The lowering issues those
collectives task by task (gradient buckets, per-layer ZeRO-3 gathers with their prefetch); the analytic engine prices
the same collectives in closed form (``plansim.analytic._dp_comm``).

Sources: PyTorch DDP buckets gradients and all-reduces each bucket once backward has produced it (Li et al. 2020,
VLDB, sec 3.2.3); ZeRO (Rajbhandari et al. 2020, sec 5 and 7): stage 1 reduce-scatters the gradients once per step
and all-gathers the updated weights after the optimizer step; stage 2 also shards gradients, so it reduce-scatters
every micro-batch's; stage 3 also shards the weights, gathering each layer's before its forward and again before its
backward and reduce-scattering each layer's gradients as backward produces them (PyTorch FSDP does the same per
wrapped unit, Zhao et al. 2023, sec 3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from plansim.costs.collectives import algorithm_entry
from plansim.costs.optimizer import grad_bytes_per_param
from plansim.frameworks import FrameworkRules, load_framework
from plansim.hardware import Cluster
from plansim.mesh import mesh_of
from plansim.step.prepare import shard_algorithm, tied_copy_params
from plansim.strategy import Strategy
from plansim.units import dtype_bytes
from plansim.workload.traced import Workload

__all__ = [
    "DataParallelPlan",
    "GroupCollective",
    "LayerPass",
    "Overlapped",
    "bucket_launches",
    "bucketed_reduction",
    "data_parallel_plan",
    "per_layer_overlap",
    "tied_gradient_bytes",
]


@dataclass(frozen=True)
class GroupCollective:
    """One kind of collective over the ``dp`` group: its name and algorithm (keys of ``COLLECTIVES``), and the
    node-local group size for algorithms whose entry ``reads_local`` (else None)."""

    collective: str
    algorithm: str
    local: int | None = None


@dataclass(frozen=True)
class DataParallelPlan:
    """The data-parallel and ZeRO traffic of one step (``dp`` > 1).

    ``reduce``: the gradient reduction (an all-reduce, or under ZeRO >= 1 a reduce-scatter), issued once per step of
    the accumulated gradients, or every micro-batch where gradients are sharded (``reduce_every_microbatch``);
    ``gather``: the weights' all-gather (ZeRO >= 1), after the optimizer step (``gather_after_step``: ZeRO-1/2) or,
    with ``per_layer`` (ZeRO-3), before each layer's forward and backward, gradients then reduced per layer rather
    than in buckets. ``grad_bytes``/``weight_bytes``: bytes per parameter of a gradient and of a gathered weight.
    ``bucket_bytes`` and ``overlap``: gradient buckets launched as backward fills them (else one reduction after
    backward)."""

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

    def bucket_full(self, held_bytes: float) -> bool:
        """Whether a gradient bucket holding ``held_bytes`` is launched now, while backward goes on (else it waits
        for more gradients, or for the end of backward without overlap). The lowering and ``bucket_launches`` ask
        this one rule."""
        return self.overlap and held_bytes >= self.bucket_bytes


@dataclass(frozen=True)
class LayerPass:
    """One layer's forward or backward on the compute stream, as the analytic engine sees it: ``work_s`` of kernels
    at full rate (a backward's recompute included), which a collective beside it slows
    (``plansim.costs.interference``), ``blocking_s`` of blocking collectives and their waits, which it does not, and
    the layer's ``params`` (whose weights ZeRO-3 gathers before the pass; whose gradients are complete once its
    backward ends)."""

    work_s: float
    blocking_s: float
    params: float


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
    one at a time in issue order (one NCCL communicator, one stream); compute runs at ``rate`` while one runs."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.t = 0.0  # when the compute stream's last task ends
        self.free = 0.0  # when the dp stream's last collective ends
        self.spans: list[tuple[float, float]] = []
        self.first = 0  # spans before it end before ``t``
        self.busy = self.overlapped = 0.0

    def compute(self, work_s: float, blocking_s: float = 0.0, after: float = 0.0) -> None:
        """A compute task of ``work_s`` (at full rate) and ``blocking_s``, once the collective ending at ``after``
        has ended."""
        t, work = max(self.t, after), work_s
        while self.first < len(self.spans) and self.spans[self.first][1] <= t:
            self.first += 1
        for lo, hi in self.spans[self.first :]:
            if work <= 0:
                break
            if lo > t:  # at full rate until the collective starts
                if work <= lo - t:
                    break
                work -= lo - t
                t = lo
            beside = min(work / self.rate, hi - t)
            self.overlapped += beside
            work = 0.0 if beside < hi - t else work - beside * self.rate
            t += beside
        self.t = t + max(0.0, work) + blocking_s
        self.busy += work_s + blocking_s

    def collective(self, seconds: float, ready: float) -> float:
        """A collective of ``seconds`` that may start at ``ready``; returns when it ends."""
        start = max(ready, self.free)
        self.free = start + seconds
        self.spans.append((start, self.free))
        return self.free

    def state(self) -> tuple[float, ...]:
        """What the next task's timing depends on, relative to the compute stream's time: the collectives not yet
        ended (their start, end) and when the dp stream is free."""
        pending = [(max(0.0, lo - self.t), hi - self.t) for lo, hi in self.spans[self.first :] if hi > self.t]
        return (self.free - self.t, *(x for span in pending for x in span))

    def totals(self) -> tuple[float, float, float, float]:
        return self.t, self.free, self.busy, self.overlapped

    def advance(self, delta: Sequence[float], times: int) -> None:
        """Repeat ``times`` more a period whose totals moved by ``delta`` and left ``state`` as it found it."""
        self.t, self.free, self.busy, self.overlapped = (
            x + times * d for x, d in zip(self.totals(), delta, strict=True)
        )
        self.spans, self.first = [], 0

    def result(self, reduce_sent: float, gather_sent: float) -> Overlapped:
        lost = (1.0 - self.rate) * self.overlapped
        exposed = max(self.t, self.free) - self.busy - lost
        return Overlapped(max(0.0, exposed), self.overlapped, lost, reduce_sent, gather_sent)


def bucket_launches(plan: DataParallelPlan, grad_bytes: Sequence[float]) -> list[tuple[int, float]]:
    """The gradient buckets of one backward as the lowering issues them: ``grad_bytes`` per layer in the order
    backward completes them fill a bucket, launched once full (``DataParallelPlan.bucket_full``) after the layer
    that filled it; the rest after the last layer with gradients. Returns (that layer's index, bucket bytes).

    >>> p = DataParallelPlan(2, *[GroupCollective("all_reduce", "ring")] * 2, False, False, False, 4, 2, 10.0, True)
    >>> bucket_launches(p, [6.0, 6.0, 0.0, 3.0, 0.0])
    [(1, 12.0), (3, 3.0)]
    """
    launches = []
    held, last = 0.0, -1
    for i, n_bytes in enumerate(grad_bytes):
        if n_bytes <= 0:
            continue
        held, last = held + n_bytes, i
        if plan.bucket_full(held):
            launches.append((i, held))
            held = 0.0
    if held > 0:
        launches.append((last, held))
    return launches


Pricer = Callable[[float], tuple[float, float]]


def bucketed_reduction(plan: DataParallelPlan, layers: Sequence[LayerPass], price: Pricer, rate: float) -> Overlapped:
    """One backward (``layers`` in the order it runs them) and its gradient buckets on the dp stream, timed as the
    discrete-event engine runs them: a bucket is launched once backward has produced all its gradients (Li et al.
    2020, PyTorch DDP, sec 3.2.3; Megatron-LM's ``register_grad_ready``/``start_grad_sync`` in
    ``megatron/core/distributed/param_and_grad_buffer.py``), buckets run one after another in launch order, and
    compute runs at ``rate`` while one runs. ``price``: (seconds, bytes sent) of a bucket of that many bytes.
    Exposed is what the last bucket ends after backward does: backward's end waits for every bucket (PyTorch DDP's
    ``Reducer::finalize_backward``, FSDP's ``_post_backward_final_callback``, Megatron-LM's ``finish_grad_sync``).

    >>> p = DataParallelPlan(2, *[GroupCollective("all_reduce", "ring")] * 2, False, False, False, 4, 2, 1.0, True)
    >>> layers = [LayerPass(2.0, 0.0, 1.0), LayerPass(2.0, 0.0, 1.0)]
    >>> r = bucketed_reduction(p, layers, lambda n: (3.0, n), 0.5)
    >>> r.exposed_s, r.overlapped_s, r.interference_s  # bucket 1 runs 2-5 s, layer 2 ends at 5.5 s, bucket 2 at 8.5 s
    (3.0, 3.0, 1.5)
    """
    launches = dict(bucket_launches(plan, [x.params * plan.grad_bytes for x in layers]))
    priced: dict[float, tuple[float, float]] = {}
    streams, sent, work = _Streams(rate), 0.0, 0.0
    for i, layer in enumerate(layers):
        work += layer.work_s  # layers between launches with nothing blocking run as one span of work
        n_bytes = launches.get(i)
        if layer.blocking_s > 0 or n_bytes is not None or i == len(layers) - 1:
            streams.compute(work, layer.blocking_s)
            work = 0.0
        if n_bytes is not None:
            if n_bytes not in priced:
                priced[n_bytes] = price(n_bytes)
            seconds, n_sent = priced[n_bytes]
            streams.collective(seconds, streams.t)
            sent += n_sent
    return streams.result(sent, 0.0)


def per_layer_overlap(
    plan: DataParallelPlan,
    forward: Sequence[LayerPass],
    backward: Sequence[LayerPass],
    gather: Pricer,
    reduce: Pricer,
    rate: float,
    microbatches: int,
) -> Overlapped:
    """ZeRO-3's step as the lowering issues it, micro-batch after micro-batch (pp = 1): before each layer's forward
    and backward its weights are all-gathered, with the next layer's gather issued at the same point (a prefetch of
    one layer: it may start once the pass before the current one has ended), and each layer's gradients are
    reduce-scattered once its backward ends (PyTorch FSDP's forward and backward prefetch and post-backward
    reduce-scatter, Zhao et al. 2023, sec 3.3); collectives run in issue order on the dp stream, compute at
    ``rate`` beside them. ``forward``/``backward``: the layers' passes in the order each runs them; ``gather`` and
    ``reduce``: (seconds, bytes sent) of a layer's collective of that many bytes."""
    streams = _Streams(rate)
    sent = {"g": 0.0, "r": 0.0}
    priced: dict[tuple[str, float], tuple[float, float]] = {}

    def issue(kind: str, n_bytes: float) -> float:
        if (kind, n_bytes) not in priced:
            priced[kind, n_bytes] = (gather if kind == "g" else reduce)(n_bytes)
        seconds, n_sent = priced[kind, n_bytes]
        sent[kind] += n_sent
        return streams.collective(seconds, streams.t)

    previous: tuple[float, ...] | None = None
    for k in range(microbatches):
        before = (*streams.totals(), sent["g"], sent["r"])
        for layers, reduces in ((forward, False), (backward, True)):
            gathered: dict[int, float] = {}
            for pos, layer in enumerate(layers):
                for i in (pos, pos + 1):
                    if i < len(layers) and i not in gathered:
                        params = layers[i].params
                        gathered[i] = issue("g", params * plan.weight_bytes) if params > 0 else 0.0
                streams.compute(layer.work_s, layer.blocking_s, after=gathered[pos])
                if reduces and layer.params > 0:
                    issue("r", layer.params * plan.grad_bytes)
        state = streams.state()
        if (
            previous is not None
            and len(state) == len(previous)
            and all(abs(a - b) <= 1e-12 for a, b in zip(state, previous, strict=True))
        ):  # a micro-batch found and left the streams alike: every later one repeats it (exact, and quick)
            delta = [a - b for a, b in zip((*streams.totals(), sent["g"], sent["r"]), before, strict=True)]
            times = microbatches - k - 1
            streams.advance(delta[:4], times)
            sent["g"] += times * delta[4]
            sent["r"] += times * delta[5]
            break
        previous = state
    return streams.result(sent["r"], sent["g"])


def _on_dp(cluster: Cluster, s: Strategy, collective: str, algorithm: str) -> GroupCollective:
    local = None
    if algorithm_entry(collective, algorithm).reads_local:
        local = mesh_of(s).local_size("dp", cluster.gpus_per_node)
    return GroupCollective(collective, algorithm, local)


def _framework_rules(s: Strategy) -> FrameworkRules:
    return load_framework(s.framework).rules


def data_parallel_plan(cluster: Cluster, s: Strategy) -> DataParallelPlan | None:
    """The data-parallel traffic of ``s`` (resolved) on ``cluster``; None without data parallelism."""
    dp = s.dp or 1
    if dp <= 1:
        return None
    assert s.grad_bucket_bytes is not None and s.overlap_grad_reduce is not None, "resolve the strategy first"
    sharded = shard_algorithm(s)
    if s.zero == 0:
        reduce = _on_dp(cluster, s, "all_reduce", s.dp_algorithm)
    else:
        reduce = _on_dp(cluster, s, "reduce_scatter", sharded)
    return DataParallelPlan(
        dp=dp,
        reduce=reduce,
        gather=_on_dp(cluster, s, "all_gather", sharded),
        reduce_every_microbatch=s.zero >= 2 and _framework_rules(s).sharded_grads_reduced_every_microbatch.value,
        per_layer=s.zero >= 3,
        gather_after_step=s.zero in (1, 2),
        grad_bytes=grad_bytes_per_param(s),
        weight_bytes=dtype_bytes(s.compute_dtype),
        bucket_bytes=s.grad_bucket_bytes,
        overlap=s.overlap_grad_reduce,
    )


def tied_gradient_bytes(model: Workload, s: Strategy) -> float:
    """Bytes of the tied embeddings' gradient that the first and last pipeline stage all-reduce between their two
    copies after backward, before the optimizer step (Megatron-LM, ``_allreduce_word_embedding_grads``); 0 without
    a second copy."""
    return tied_copy_params(model, s) * grad_bytes_per_param(s)
