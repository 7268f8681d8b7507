"""The device mesh: the parallel axes as named dimensions over the global ranks, each group asked of it.

A rank's coordinate on an axis is ``(rank // stride) % size``, the axes listed fastest first. Today's order is
Megatron-LM's: tensor parallelism fastest (its ranks adjacent, so a group shares a node's NVLink), then context
parallelism, then data parallelism, then pipeline stages (Narayanan et al. 2021, sec 3.3; Megatron-LM
``parallel_state``'s default order ``tp-cp-ep-dp-pp``, fastest first, NVIDIA/Megatron-LM d98e8a64,
megatron/core/parallel_state.py ``initialize_model_parallel(order=...)``). A new kind of parallelism (context,
expert) is a new axis in ``AXIS_ORDER``, as PyTorch's ``DeviceMesh`` names its dimensions: every group, stride,
coordinate and link is asked of the mesh, never re-derived from an assumed rank order. The mesh also gives the
copies a symmetric simulation stands for, node-local group sizes and the links a group spans; both engines, the
lowering and ``plansim.step.prepare.comm_pricer`` ask it, and a ``TaskGraph`` carries it.

Context parallelism splits each sequence, not the weights: its ranks hold the same parameters, so the gradients are
reduced, and ZeRO's states sharded, over the data-parallel ranks of every context-parallel rank at once: the
flattened ``dp_cp`` (``cp`` then ``dp``, adjacent; Megatron-LM's data-parallel group "with context parallel",
torchtitan's ``dp_shard_cp``). ``GRAD_AXES`` names, for each data-parallel axis, the group its gradients and states
use; with ``cp = 1`` it is the same group.

Hybrid sharding (HSDP) splits the data-parallel axis in two, ``dp_shard`` (fastest: the group a ZeRO stage shards
over, within a node) and ``dp_replicate``, with ``dp`` their flattened pair, as torchtitan's mesh names them
(``dp_replicate``, ``dp_shard`` slowest to fastest, flattened to ``dp``): a flattened axis is asked like any other.

>>> m = DeviceMesh((("tp", 2), ("dp", 2), ("pp", 2)))
>>> m.coords(5), m.group("dp", 5), m.stride("pp"), m.shift("pp", 5, 1)
({'tp': 1, 'dp': 0, 'pp': 1}, (5, 7), 4, 1)
>>> c = DeviceMesh((("tp", 2), ("cp", 2), ("dp", 2), ("pp", 1)), (("dp_cp", ("cp", "dp")),))
>>> c.group("cp", 1), c.group("dp", 1), c.group("dp_cp", 1)
((1, 3), (1, 5), (1, 3, 5, 7))
>>> h = DeviceMesh((("tp", 2), ("dp_shard", 2), ("dp_replicate", 3), ("pp", 1)), (("dp", DP_PARTS),))
>>> h.group("dp", 1), h.group("dp_shard", 1), h.group("dp_replicate", 1)
((1, 3, 5, 7, 9, 11), (1, 3), (1, 5, 9))

Expert parallelism folds the ranks of one pipeline stage a second way, as Megatron-LM does: its expert layers see the
attention's tp x cp x dp ranks regrouped as ``etp`` (tensor parallelism inside the experts) x ``ep`` (the experts
split over ranks) x ``edp`` (expert data parallelism, the rest), fastest first, the pipeline stages unchanged
(``EXPERT_AXES``; NVIDIA/Megatron-LM d98e8a64, megatron/core/parallel_state.py:870-896: a second ``RankGenerator``
with ``tp=expert_tensor_parallel_size, ep=expert_model_parallel_size, dp=world_size // (etp * ep * pp), cp=1`` over
the same order ``tp-cp-ep-dp-pp``, so ``tp-ep-dp-pp`` with cp 1; :898-907 asserts both generators' pp groups equal).
A stage's ranks are adjacent, so each expert axis is an ordinary strided axis (``DeviceMesh.regrouped``) and every
group, stride, copy and link is asked of it by name. Expert gradients are reduced, and expert optimizer states
sharded, over ``edp`` (``EXPERT_GRAD_AXIS``: Megatron-LM's expert-data-parallel group, parallel_state.py:1429-1460,
``get_ranks("dp")`` of the expert generator).

>>> e = DeviceMesh((("tp", 2), ("cp", 1), ("dp", 4), ("pp", 2)), regrouped=(("etp", 1), ("ep", 4), ("edp", 2)))
>>> e.group("ep", 9), e.group("edp", 9), e.group("etp", 9), e.group("pp", 9)
((8, 9, 10, 11), (9, 13), (9,), (1, 9))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from plansim.hardware import Cluster, Link

__all__ = [
    "AXIS_ORDER",
    "COMM_KINDS",
    "COMM_KIND_OF",
    "DP_AXES",
    "DP_PARTS",
    "EXPERT_AXES",
    "EXPERT_GRAD_AXES",
    "EXPERT_GRAD_AXIS",
    "GRAD_AXES",
    "REPLICA_AXES",
    "STAGE_AXIS",
    "DeviceMesh",
    "comm_kind",
    "degree_splits",
    "degrees_of",
    "expert_fold",
    "grad_group_size",
    "mesh_of",
    "ranks_of",
    "span",
]

#: The strategy's parallel axes, fastest first: the rank layout of both engines.
AXIS_ORDER = ("tp", "cp", "dp", "pp")

#: The axes one model replica is split over: every axis but data parallelism's, fastest first. A strategy's GPUs are
#: ``dp`` replicas of their product.
REPLICA_AXES = tuple(axis for axis in AXIS_ORDER if axis != "dp")

#: ``Result.comm_bytes_per_gpu`` keys, in order: what one GPU sends along each axis, gradient reduction over the
#: data-parallel axis first, then the axes of one replica (tensor-parallel collectives, pipeline sends), then ZeRO's
#: parameter gathers (over the data-parallel axis, counted apart). The one list of the kinds: a new axis brings its
#: own (expert parallelism's ``ep``: the tokens' dispatch and combine all-to-alls; ``COMM_KIND_OF`` files the other
#: expert axes' collectives under an existing kind).
COMM_KINDS = ("dp", *REPLICA_AXES, "ep", "zero")

#: Hybrid sharding's two data-parallel axes, fastest first, whose flattened pair is ``dp``.
DP_PARTS = ("dp_shard", "dp_replicate")

#: The axes a data-parallel collective runs over: the whole group, or one of hybrid sharding's two.
DP_AXES = ("dp", *DP_PARTS, "dp_cp", "dp_shard_cp")

#: For each data-parallel axis, the group its gradients are reduced and ZeRO's states sharded over: with the
#: context-parallel ranks (they hold the same weights), flattened with them; hybrid sharding's replicas are whole
#: context-parallel groups already (torchtitan: ``dp_replicate`` beside ``dp_shard_cp``).
GRAD_AXES = {"dp": "dp_cp", "dp_shard": "dp_shard_cp", "dp_replicate": "dp_replicate"}

#: Expert parallelism's axes, fastest first: the ranks of one pipeline stage (tp x cp x dp) regrouped for the expert
#: layers as expert tensor parallelism, expert parallelism and expert data parallelism (Megatron-LM's expert
#: ``RankGenerator``, order ``tp-ep-dp-pp``: parallel_state.py:886-896 at d98e8a64). ``mesh_of`` names them on every
#: mesh (a dense strategy: ep 1, etp its tp, edp its cp x dp).
EXPERT_AXES = ("etp", "ep", "edp")

#: The group expert weights' gradients are reduced over and their ZeRO (distributed-optimizer) states sharded over:
#: the expert-data-parallel ranks (Megatron-LM's ``_EXPERT_DATA_PARALLEL_GROUP``, parallel_state.py:1429-1460 at
#: d98e8a64; torchtitan's ``efsdp``). Dense weights keep ``GRAD_AXES``.
EXPERT_GRAD_AXIS = "edp"

#: For each data-parallel axis, the group the expert weights' gradients and ZeRO states use in its place: ``edp``
#: (``EXPERT_GRAD_AXIS``); under hybrid sharding ``edp`` shards (it regroups one replica's ranks) and the replicas stay
#: ``dp_replicate`` (torchtitan's sparse mesh ``dp_replicate, efsdp, ep, etp``: parallel_dims.py:154-158 at v0.2.2).
EXPERT_GRAD_AXES = {"dp": EXPERT_GRAD_AXIS, "dp_shard": EXPERT_GRAD_AXIS, "dp_replicate": "dp_replicate"}

#: The ``COMM_KINDS`` key a mesh axis's layer collectives file their bytes under where it is not the axis's own name:
#: tensor parallelism inside the experts (``etp``: the routed tokens gathered and scattered around the experts) is
#: tensor-parallel traffic.
COMM_KIND_OF = {"etp": "tp"}


def comm_kind(axis: str) -> str:
    """The ``COMM_KINDS`` key the bytes of a layer's collective on ``axis`` are filed under.

    >>> comm_kind("tp"), comm_kind("etp"), comm_kind("ep")
    ('tp', 'tp', 'ep')
    """
    return COMM_KIND_OF.get(axis, axis)


#: The flattened axis of every rank of one pipeline stage (tp, cp and dp: all axes but pp), Megatron-LM's amax
#: reduction group (``parallel_state.get_amax_reduction_group``: FP8 delayed scaling, ``plansim.step.p2p``).
STAGE_AXIS = "stage"


class Degrees(Protocol):
    """What the mesh reads of a strategy (``plansim.strategy.schema.Strategy``, which imports the mesh): a field per
    axis of ``AXIS_ORDER`` holding its degree (``dp`` None until resolved, read by name), and hybrid sharding's
    split of ``dp``; expert parallelism's degree and its tensor parallelism inside the experts (``etp``, its default
    resolved)."""

    @property
    def hybrid_shard(self) -> bool: ...

    @property
    def dp_shard(self) -> int | None: ...

    @property
    def ep(self) -> int: ...

    @property
    def expert_tp(self) -> int: ...


@dataclass(frozen=True)
class DeviceMesh:
    """Named axes with their sizes, fastest first; ranks ``0 .. num_ranks-1``. ``flattened``: names for runs of
    adjacent axes (in order) asked as one axis, their sizes multiplied (PyTorch's ``DeviceMesh._flatten``).
    ``regrouped``: a second decomposition, fastest first, of the ranks of the fastest axes whose sizes multiply to
    the same product (Megatron-LM's expert axes over one pipeline stage's tp x cp x dp ranks: ``EXPERT_AXES``),
    each asked like any other axis (``coords`` and ``rank`` are of ``axes`` alone)."""

    axes: tuple[tuple[str, int], ...]
    flattened: tuple[tuple[str, tuple[str, ...]], ...] = ()
    regrouped: tuple[tuple[str, int], ...] = ()
    _sizes: dict[str, int] = field(init=False, repr=False, compare=False)
    _strides: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [name for name, _ in self.axes]
        if len(set(names)) != len(names) or any(size < 1 for _, size in self.axes):
            raise ValueError(f"mesh axes need distinct names and sizes >= 1, got {self.axes}")
        strides, stride = {}, 1
        for name, size in self.axes:
            strides[name] = stride
            stride *= size
        sizes = dict(self.axes)
        for name, parts in self.flattened:
            at = names.index(parts[0]) if parts and parts[0] in names else -1
            if name in sizes or at < 0 or tuple(names[at : at + len(parts)]) != parts:
                raise ValueError(f"flattened axis {name} needs adjacent axes of the mesh in order, got {parts}")
            strides[name] = strides[parts[0]]
            sizes[name] = math.prod(sizes[p] for p in parts)
        if self.regrouped:
            spans = {math.prod(size for _, size in self.axes[:k]) for k in range(len(self.axes) + 1)}
            regrouped = [name for name, _ in self.regrouped]
            if (
                len(set(regrouped)) != len(regrouped)
                or set(regrouped) & set(sizes)
                or any(size < 1 for _, size in self.regrouped)
                or math.prod(size for _, size in self.regrouped) not in spans
            ):
                raise ValueError(
                    f"regrouped axes need new distinct names and sizes multiplying to the ranks of the fastest axes, "
                    f"got {self.regrouped} over {self.axes}"
                )
            stride = 1
            for name, size in self.regrouped:
                strides[name], sizes[name] = stride, size
                stride *= size
        object.__setattr__(self, "_sizes", sizes)  # frozen: set once here, read on every group asked
        object.__setattr__(self, "_strides", strides)

    @property
    def names(self) -> tuple[str, ...]:
        """Axis names, fastest first."""
        return tuple(name for name, _ in self.axes)

    @property
    def num_ranks(self) -> int:
        """Ranks in the mesh: the product of the sizes."""
        return math.prod(size for _, size in self.axes)

    def size(self, axis: str) -> int:
        """Ranks along ``axis`` (the size of each of its groups)."""
        return self._sizes[axis]

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along ``axis``: the product of the faster axes' sizes."""
        return self._strides[axis]

    def coords(self, rank: int) -> dict[str, int]:
        """``rank``'s coordinate on every axis."""
        return {name: (rank // self.stride(name)) % size for name, size in self.axes}

    def rank(self, **coords: int) -> int:
        """The rank at these coordinates (axes left out are 0)."""
        return sum(coords.get(name, 0) * self.stride(name) for name in self.names)

    def group(self, axis: str, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group along ``axis`` (its other coordinates fixed), in axis order."""
        stride, size = self.stride(axis), self.size(axis)
        first = rank - ((rank // stride) % size) * stride
        return tuple(first + i * stride for i in range(size))

    def shift(self, axis: str, rank: int, steps: int) -> int:
        """The rank ``steps`` along ``axis`` from ``rank``, wrapping around (a pipeline send to the next stage)."""
        stride, size = self.stride(axis), self.size(axis)
        here = (rank // stride) % size
        return rank + (((here + steps) % size) - here) * stride

    def copies(self, axis: str, within: str) -> tuple[int, ...]:
        """The ranks below one index of the slower axis ``within`` (``0 .. stride(within)-1``) whose coordinate on
        ``axis`` is 0: one rank of each ``axis`` group there, all of them for ``axis == within``. A symmetric
        simulation's representative rank stands for these copies of its transfers.

        >>> DeviceMesh((("tp", 2), ("dp", 3), ("pp", 2))).copies("tp", "pp")
        (0, 2, 4)
        """
        stride, size = self.stride(axis), self.size(axis)
        return tuple(r for r in range(self.stride(within)) if (r // stride) % size == 0)

    def local_size(self, axis: str, gpus_per_node: int) -> int:
        """Members of an ``axis`` group that share one node, as the largest divisor of the group size not above what
        fits in a node: the node-local group of a two-level (hierarchical) collective."""
        size = self.size(axis)
        local = max(1, min(size, gpus_per_node // self.stride(axis)))
        while size % local:
            local -= 1
        return local

    def link(self, axis: str, cluster: Cluster) -> Link:
        """The effective per-rank link of a collective over an ``axis`` group (``Cluster.group_link``)."""
        return cluster.group_link(self.size(axis), self.stride(axis))

    def split_links(self, axis: str, cluster: Cluster) -> tuple[int, Link, Link | None]:
        """(node-local group size, its link, the link among the node-local groups' peers, None on one node): the two
        levels of a collective over an ``axis`` group."""
        local = self.local_size(axis, cluster.gpus_per_node)
        stride, size = self.stride(axis), self.size(axis)
        intra = cluster.group_link(local, stride)
        inter = cluster.group_link(size // local, stride * local) if local < size else None
        return local, intra, inter


def degrees_of(s: Degrees) -> dict[str, int]:
    """Each axis of ``AXIS_ORDER`` with its degree: the strategy's field of that name (``dp`` 1 until resolved).

    >>> from plansim.strategy.schema import Strategy
    >>> degrees_of(Strategy(tp=2, pp=3))
    {'tp': 2, 'cp': 1, 'dp': 1, 'pp': 3}
    """
    return {axis: getattr(s, axis) or 1 for axis in AXIS_ORDER}


def ranks_of(s: Degrees, *, besides: Collection[str] = (), only: Collection[str] | None = None) -> int:
    """The GPUs the strategy's axes span: the product of their degrees (``degrees_of``); ``besides``: of every axis
    but these (``besides=("dp",)``: one replica's GPUs; ``besides=("pp",)``: one pipeline stage's); ``only``: of
    these axes alone (``only=("dp", "pp")``: the ranks a global batch is split over, replicas times stages).

    >>> from plansim.strategy.schema import Strategy
    >>> s = Strategy(dp=4, tp=2, pp=3)
    >>> ranks_of(s), ranks_of(s, besides=("dp",)), ranks_of(s, besides=("pp",)), ranks_of(s, only=("dp", "pp"))
    (24, 6, 8, 12)
    """
    degrees = degrees_of(s).items()
    return math.prod(d for axis, d in degrees if axis not in besides and (only is None or axis in only))


def degree_splits(n: int, axes: Sequence[str], values: Callable[[str, int], Iterable[int]]) -> Iterator[dict[str, int]]:
    """Every way to give ``axes`` degrees whose product is ``n``, the first axis changing slowest: each axis but the
    last takes each of ``values(axis, ranks left)`` (divisors of the ranks left, in the order given), the last axis
    the ranks the others leave.

    >>> def divisors(n): return [d for d in range(1, n + 1) if n % d == 0]
    >>> [tuple(d.values()) for d in degree_splits(4, ("tp", "pp", "dp"), lambda axis, left: divisors(left))]
    [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    """
    if not axes:
        return
    *chosen, last = axes

    def split(k: int, left: int, given: dict[str, int]) -> Iterator[dict[str, int]]:
        if k == len(chosen):
            yield {**given, last: left}
            return
        for degree in values(chosen[k], left):
            yield from split(k + 1, left // degree, {**given, chosen[k]: degree})

    yield from split(0, n, {})


def span(degrees: Mapping[str, int], axes: Iterable[str]) -> int:
    """The ranks ``axes`` span together, from axis degrees by name (an axis left out: 1), for a search that has
    degrees before it has a strategy.

    >>> span({"tp": 8, "cp": 4, "dp": 2}, ("tp", "cp"))
    32
    """
    return math.prod(degrees.get(axis, 1) for axis in axes)


def grad_group_size(degrees: Mapping[str, int]) -> int:
    """The ranks the gradients are reduced over, from axis degrees by name (``GRAD_AXES``: the data-parallel ranks
    of every context-parallel rank).

    >>> grad_group_size({"tp": 8, "cp": 4, "dp": 2, "pp": 2})
    8
    """
    return span(degrees, ("cp", "dp"))


def expert_fold(s: Degrees) -> tuple[int, int]:
    """(the ranks the expert axes regroup, the ranks one expert layer's model is split over): one pipeline stage's
    tp x cp x dp ranks (Megatron-LM) -- under hybrid sharding tp x cp x dp_shard, torchtitan's ``efsdp x ep x etp``
    (torchtitan v0.2.2, torchtitan/distributed/parallel_dims.py:136-158) -- and etp x ep. The expert axes exist where
    the second divides the first (``plansim.strategy.checks`` refuses the rest).

    >>> from plansim.strategy.schema import Strategy
    >>> expert_fold(Strategy(dp=4, tp=2, cp=2, pp=2, ep=4, etp=1))
    (16, 4)
    """
    degrees = degrees_of(s)
    folded = span(degrees, ("tp", "cp", "dp"))
    if s.hybrid_shard:
        assert s.dp_shard is not None  # hybrid sharding names its shard group
        folded = span(degrees, ("tp", "cp")) * s.dp_shard
    return folded, s.expert_tp * s.ep


def _expert_axes(folded: int, etp: int, ep: int) -> tuple[tuple[str, int], ...]:
    """The expert axes regrouping ``folded`` ranks (``EXPERT_AXES``, ``expert_fold``); none where etp x ep does not
    divide them."""
    if folded % (etp * ep):
        return ()
    return tuple(zip(EXPERT_AXES, (etp, ep, folded // (etp * ep)), strict=True))


def mesh_of(s: Degrees) -> DeviceMesh:
    """The mesh of a resolved strategy: each axis of ``AXIS_ORDER`` sized by the strategy's field of that name
    (``dp`` 1 until resolved); under hybrid sharding (``Strategy.hybrid_shard``) ``dp`` is the flattened pair of
    ``dp_shard`` (``dp_shard`` ranks) and ``dp_replicate``. The data-parallel axes flattened with ``cp``
    (``GRAD_AXES``) are named too, and the expert axes regrouping a stage's ranks (``EXPERT_AXES``: under hybrid
    sharding, those of one ``dp_replicate`` index, as torchtitan's ``efsdp`` does).

    >>> from plansim.strategy.schema import Strategy
    >>> mesh_of(Strategy(dp=4, tp=2, pp=3)).axes
    (('tp', 2), ('cp', 1), ('dp', 4), ('pp', 3))
    >>> mesh_of(Strategy(dp=8, tp=2, zero=3, framework="fsdp", dp_shard=4)).axes
    (('tp', 2), ('cp', 1), ('dp_shard', 4), ('dp_replicate', 2), ('pp', 1))
    >>> mesh_of(Strategy(dp=4, tp=2, pp=3)).regrouped  # dense: etp = tp, ep 1, edp = cp x dp
    (('etp', 2), ('ep', 1), ('edp', 4))
    """
    shard = s.dp_shard if s.hybrid_shard else None
    return _mesh_of(tuple(getattr(s, axis) or 1 for axis in AXIS_ORDER), shard, s.ep, s.expert_tp)


@lru_cache(maxsize=4096)
def _mesh_of(degrees: tuple[int, ...], dp_shard: int | None, ep: int, etp: int) -> DeviceMesh:
    """``mesh_of`` from the degrees of ``AXIS_ORDER`` in order, hybrid sharding's shard group (None: no hybrid
    sharding), ep and etp (a planner asks it of thousands of candidates that share a few dozen meshes)."""
    named = dict(zip(AXIS_ORDER, degrees, strict=True))
    axes = tuple(named.items())
    if dp_shard is None:
        expert = _expert_axes(span(named, ("tp", "cp", "dp")), etp, ep)
        return DeviceMesh(axes, (("dp_cp", ("cp", "dp")), (STAGE_AXIS, ("tp", "cp", "dp"))), expert)
    expert = _expert_axes(span(named, ("tp", "cp")) * dp_shard, etp, ep)
    split = (("dp_shard", dp_shard), ("dp_replicate", named["dp"] // dp_shard))
    return DeviceMesh(
        tuple(x for axis in axes for x in (split if axis[0] == "dp" else (axis,))),
        (
            ("dp", DP_PARTS),
            ("dp_cp", ("cp", *DP_PARTS)),
            ("dp_shard_cp", ("cp", "dp_shard")),
            (STAGE_AXIS, ("tp", "cp", *DP_PARTS)),
        ),
        expert,
    )
