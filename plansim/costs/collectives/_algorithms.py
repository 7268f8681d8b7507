"""Each collective algorithm, defined once as a :class:`Schedule` of point-to-point transfers.

Every builder takes ``(p, local)`` and is called only with ``p >= 2`` (one worker never communicates). The all-reduce
family and its volumes follow the course slides (dl-systems-intro, "Different Ways to Perform AllReduce"); ring
phases follow Patarasuk & Yuan 2009; recursive doubling/halving and the binomial tree follow Thakur, Rabenseifner &
Gropp 2005, "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1).
"""

from __future__ import annotations

import numpy as np

from plansim.costs.collectives._patterns import (
    full,
    locked,
    log2_exact,
    recursive_doubling_gather,
    recursive_halving_scatter,
    ring_phase,
)
from plansim.costs.collectives._schedule import Placed, Schedule, Step, StepRun, Steps
from plansim.errors import PlansimError


def _whole(src: np.ndarray, dst: np.ndarray, *, reduce: bool = False) -> Step:
    """A step in which every transfer carries the whole message."""
    return Step(locked(src), locked(dst), full(len(src), 0.0), full(len(src), 1.0), reduce=reduce)


def _one_ring(p: int) -> tuple[np.ndarray, np.ndarray]:
    """``members`` and ``segment`` for a single ring of ranks ``0 .. p-1`` over the whole message."""
    return np.arange(p, dtype=np.int64)[None, :], np.zeros(1, dtype=np.int64)


# ---- all_reduce ------------------------------------------------------------------------------------------------


def allreduce_naive(p: int, local: int | None) -> Schedule:
    """Every worker sends its whole vector to every other worker, which adds it: one step, ``p(p-1)`` messages (built
    when read; each worker sends and receives ``p - 1`` whole vectors). Placed ``local`` workers per node, a worker
    on a node of ``k`` exchanges ``k - 1`` vectors with its own node and ``p - k`` with the others: the busiest is on
    the largest node inside and the smallest node across (the last node holds the ``p % local`` left over)."""

    def build(_: int) -> Step:
        src = np.repeat(np.arange(p, dtype=np.int64), p - 1)
        dst = (src + np.tile(np.arange(1, p, dtype=np.int64), p)) % p
        return _whole(src, dst, reduce=True)

    def placed(local: int) -> Placed:
        largest = min(local, p)
        smallest = p % local or largest
        return p > local, float(largest - 1), float(p - smallest)

    per_step = full(p, float(p - 1))
    run = StepRun(1, build, per_step, per_step, transfers=p * (p - 1), placed=placed)
    return Schedule("all_reduce/naive", p, Steps([run]))


def allreduce_ps(p: int, local: int | None) -> Schedule:
    """Parameter server at node ``p``: every worker pushes its vector (the server sums), then pulls the sum. A helper
    node: on one link a machine of its own (``2 (a + p n b)``); placed on nodes, it runs on worker 0's GPU
    (``Schedule.gpus``), which then receives ``p - 1`` vectors, those from other nodes through its own NIC."""
    workers, server = np.arange(p, dtype=np.int64), np.full(p, p, dtype=np.int64)
    push, pull = _whole(workers, server, reduce=True), _whole(server.copy(), workers.copy())
    return Schedule("all_reduce/ps", p, (push, pull), num_nodes=p + 1)


def allreduce_ring(p: int, local: int | None) -> Schedule:
    """Ring reduce-scatter then ring all-gather: ``2(p-1)`` steps of ``n/p`` (Patarasuk & Yuan 2009)."""
    members, segment = _one_ring(p)
    return Schedule(
        "all_reduce/ring",
        p,
        Steps([*ring_phase(members, segment, 1, reduce=True), *ring_phase(members, segment, 1, reduce=False)]),
    )


def allreduce_tree(p: int, local: int | None) -> Schedule:
    """Binary tree rooted at 0 (children of ``i``: ``2i+1``, ``2i+2``): each level, deepest first, sends its whole
    vector to its parent, which adds it; then the sum goes back down, level by level."""
    depth = p.bit_length() - 1
    levels = [np.arange(2**d - 1, min(2 ** (d + 1) - 1, p), dtype=np.int64) for d in range(1, depth + 1)]
    up = [_whole(nodes, (nodes - 1) // 2, reduce=True) for nodes in reversed(levels)]
    down = [_whole((nodes - 1) // 2, nodes.copy()) for nodes in levels]
    return Schedule("all_reduce/tree", p, tuple(up + down))


def allreduce_butterfly(p: int, local: int | None) -> Schedule:
    """Recursive doubling: in step ``k`` every worker swaps its whole vector with worker ``i XOR 2**k`` and adds
    (Thakur et al. 2005, sec. 4.4, short-message all-reduce). Placed ``local`` ranks per node, the steps whose
    partner is ``local`` or more ranks away cross nodes."""
    ranks = np.arange(p, dtype=np.int64)
    steps = [_whole(ranks.copy(), ranks ^ (1 << k), reduce=True) for k in range(log2_exact(p, "dp_algorithm"))]
    return Schedule("all_reduce/butterfly", p, tuple(steps))


def allreduce_hierarchical(p: int, local: int | None) -> Schedule:
    """Two-level all-reduce over ``p // local`` nodes of ``local`` consecutive ranks each.

    1. intra-node ring reduce-scatter: local rank ``l`` ends with its node's sum of shard ``l`` (of ``local``);
    2. inter-node ring all-reduce of shard ``l`` among the ranks with local index ``l`` (its steps cross nodes);
    3. intra-node ring all-gather of the shards.
    """
    if local is None or local < 1 or p % local:
        raise PlansimError(
            f"dp_algorithm=hierarchical needs local (ranks per node) dividing the group of {p}, got {local}"
        )
    by_node = np.arange(p, dtype=np.int64).reshape(p // local, local)
    by_local_index = np.ascontiguousarray(by_node.T)
    whole, shard = np.zeros(p // local, dtype=np.int64), np.arange(local, dtype=np.int64)
    steps = (
        ring_phase(by_node, whole, 1, reduce=True)
        + ring_phase(by_local_index, shard, local, reduce=True)
        + ring_phase(by_local_index, shard, local, reduce=False)
        + ring_phase(by_node, whole, 1, reduce=False)
    )
    return Schedule("all_reduce/hierarchical", p, Steps(steps))


# ---- the other collectives -------------------------------------------------------------------------------------


def all_gather_ring(p: int, local: int | None) -> Schedule:
    """Ring all-gather: ``p-1`` steps of ``n/p``; rank ``i`` starts with shard ``i`` of the output."""
    return Schedule("all_gather/ring", p, Steps(ring_phase(*_one_ring(p), 1, reduce=False)))


def all_gather_butterfly(p: int, local: int | None) -> Schedule:
    """Recursive-doubling all-gather: step ``k`` sends ``2**k * n/p`` (steps ``local`` or more ranks apart cross
    nodes)."""
    return Schedule("all_gather/butterfly", p, tuple(recursive_doubling_gather(p)))


def reduce_scatter_ring(p: int, local: int | None) -> Schedule:
    """Ring reduce-scatter: ``p-1`` steps of ``n/p``; rank ``i`` ends with reduced shard ``i``."""
    return Schedule("reduce_scatter/ring", p, Steps(ring_phase(*_one_ring(p), 1, reduce=True)))


def reduce_scatter_butterfly(p: int, local: int | None) -> Schedule:
    """Recursive-halving reduce-scatter: sends ``n/2, n/4, ..., n/p`` (steps ``local`` or more ranks apart cross
    nodes)."""
    return Schedule("reduce_scatter/butterfly", p, tuple(recursive_halving_scatter(p)))


def broadcast_tree(p: int, local: int | None) -> Schedule:
    """Binomial tree from rank 0: in step ``k`` ranks ``i < 2**k`` send the whole message to ``i + 2**k``."""
    steps = []
    for k in range((p - 1).bit_length()):
        senders = np.arange(min(1 << k, p - (1 << k)), dtype=np.int64)
        steps.append(_whole(senders, senders + (1 << k)))
    return Schedule("broadcast/tree", p, tuple(steps))


def broadcast_ring(p: int, local: int | None) -> Schedule:
    """A chain ``0 -> 1 -> ... -> p-1`` passing the whole message on each step; not pipelined into chunks."""
    steps = [_whole(np.array([s]), np.array([s + 1])) for s in range(p - 1)]
    return Schedule("broadcast/ring", p, tuple(steps))


def all_to_all_direct(p: int, local: int | None) -> Schedule:
    """Rank ``i`` sends block ``j`` of its send buffer to rank ``j``, which stores it as block ``i``; a rank's own
    block stays where it is. Out of place: sends read the untouched send buffer. One step: NCCL runs an all-to-all
    as one group of ``p - 1`` sends and ``p - 1`` receives (nccl-tests' alltoall, ``ncclGroupStart``, a
    ``ncclSend``/``ncclRecv`` per peer, ``ncclGroupEnd``; torch's ``all_to_all_single`` the same), and NCCL
    schedules every send and receive of a group into one kernel over its channels (``scheduleP2pTasksToPlan``,
    NVIDIA/nccl 5067397c ``src/enqueue.cc:1140-1200``, peers in the order of ``init.cc:930-952``), so all blocks
    move at once: one latency, each rank's ``(p-1)/p`` of its buffer out and as much in (nccl-tests' alltoall bus
    bandwidth, ``algbw x (p-1)/p``). Placed ``local`` ranks per node, a rank on a node of ``k`` sends ``(k-1)/p``
    over its node's links and ``(p-k)/p`` through its NIC, at once: the busiest is on the largest node inside and
    the smallest across (the last node holds the ``p % local`` left over)."""
    ranks = np.arange(p, dtype=np.int64)

    def build(_: int) -> Step:
        src = np.tile(ranks, p - 1)
        peer = (src + np.repeat(np.arange(1, p, dtype=np.int64), p)) % p
        return Step(locked(src), locked(peer), locked(peer / p), locked((peer + 1) / p), dst_lo=locked(src / p))

    def placed(local: int) -> Placed:
        largest = min(local, p)
        smallest = p % local or largest
        return p > local, float(largest - 1) / p, float(p - smallest) / p

    per_step = full(p, (p - 1) / p)  # p - 1 blocks of n/p out and as many in
    run = StepRun(1, build, per_step, per_step, transfers=p * (p - 1), placed=placed)
    return Schedule("all_to_all/direct", p, Steps([run]), out_of_place=True)


def send_recv_direct(p: int, local: int | None) -> Schedule:
    """One transfer of the whole message from rank 0 to rank 1 (any other ranks stay idle)."""
    return Schedule("send_recv/direct", p, (_whole(np.array([0]), np.array([1])),))
