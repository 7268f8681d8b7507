"""Collective communication costs, each algorithm defined once as a schedule of point-to-point transfers.

``COLLECTIVES`` is the one list of algorithms (``Strategy.dp_algorithm`` is checked against its all-reduce entries):
each an :class:`Algorithm` entry holding what is particular to it (``reads_local``, ``power_of_two``,
``rings_per_local_rank``, ``sharded_with``, ``nccl``, ``library``), read where it matters, never by name.

Per-rank volume, total volume and alpha-beta time all derive from the one :class:`Schedule`, and
:func:`simulate` moves real data through it, so the tests check the schedule against both arithmetic and closed forms.

Message size ``n_bytes`` (see :data:`MESSAGE_SIZE`):

- ``all_reduce``, ``reduce_scatter``: the full vector each rank holds;
- ``all_gather``: the full gathered output (each rank contributes ``n/p``);
- ``broadcast``, ``send_recv``: the message;
- ``all_to_all``: each rank's whole send buffer (``p`` blocks of ``n/p``).

Sources: the course slides (dl-systems-intro, "Comparing different AllReduce Methods") for the all-reduce volume
table; Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1)
for the alpha-beta model, recursive doubling/halving and binomial trees; Patarasuk & Yuan 2009, "Bandwidth optimal
all-reduce algorithms for clusters of workstations", JPDC 69(2) for the ring.

Closed forms the schedules reproduce on one link (``a`` = alpha, ``b`` = 1/bandwidth, ``D = floor(log2 p)``):

=========================  ====================================================================
ring all-gather / r-s      ``(p-1) a + n (p-1)/p b``
ring all-reduce            ``2(p-1) a + 2 n (p-1)/p b``
butterfly all-reduce       ``log2 p (a + n b)``
butterfly all-gather       ``log2 p a + n (p-1)/p b``
naive all-reduce           ``a + (p-1) n b``
ps all-reduce              ``2 (a + p n b)`` (the server's link carries ``p n`` each way)
tree all-reduce            ``2 D a + 2 (2D - [p is a power of two]) n b``
=========================  ====================================================================

The tree form: the binary tree has ``D`` levels below the root and each is one step up and one step down. A parent
with two children receives (or sends) ``2n`` in that step; every level but the deepest has a two-child parent, and the
deepest has one unless ``p`` is a power of two (then its only node is a lone child). So each direction costs
``D a + (2D - 1) n b`` for ``p`` a power of two and ``D a + 2D n b`` otherwise.

Placed on nodes (``local`` ranks per node, rank ``r`` on node ``r // local``, a parameter server on rank 0's GPU),
the algorithms whose entry ``reads_local`` are priced on the links their transfers cross (``Schedule.time``): within a
step each GPU's transfers inside its node on the node-local link and those to other nodes on its inter-node link
(one NIC share), at once, so a tree level or a naive exchange that crosses nodes runs at one NIC's bandwidth, and
the parameter server's GPU takes the ``p - 1`` pushes, those from other nodes through its own NIC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import plansim.costs.collectives._algorithms as alg
from plansim.costs.collectives._schedule import Schedule, Step, simulate
from plansim.errors import PlansimError

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "COLLECTIVES",
    "MESSAGE_SIZE",
    "Algorithm",
    "Builder",
    "Schedule",
    "Step",
    "algorithm_entry",
    "bytes_sent_per_rank",
    "collective_time",
    "schedule",
    "simulate",
]

#: Builds one algorithm's schedule from ``(p, local)``; ``local`` matters only to algorithms that read it.
Builder = Callable[[int, "int | None"], Schedule]


@dataclass(frozen=True)
class Algorithm:
    """One registry entry: how a collective runs with this algorithm, and what is particular to it.

    ``build`` makes its schedule. ``reads_local``: both engines pass the ranks per node (``local``), and each
    transfer is priced on the link it crosses (``Schedule.time`` with ``local``: node-local ones on the node's link,
    inter-node ones on one rank's NIC share, at once); hierarchical also builds its phases by it. Every algorithm
    but NCCL's rings (``rings_per_local_rank``), whose channels spread a group's inter-node traffic over all NICs so
    that the group's bus bandwidth prices them. ``power_of_two``: the group size must be a power of two (recursive
    halving/doubling). ``rings_per_local_rank``: NCCL's multi-ring layout (one ring per local rank, each leaving the
    node from another GPU and NIC), which the discrete-event engine routes. ``sharded_with`` (all-reduce entries):
    the reduce-scatter/all-gather algorithm that ZeRO runs beside it.
    ``nccl``: how NCCL runs the call where the node profile times NCCL's calls (``plansim.costs.nccl_groups``): "ring"
    (``NCCL_ALGO=Ring``, the protocol NCCL's tuner picks), "auto" (``NCCL_ALGO`` unset: the algorithm and protocol
    NCCL's tuner picks, ``plansim.costs.nccl.nccl_call``); both engines then move its schedule's bytes at the bus
    bandwidth and add what the call costs beyond them. None: priced by the alpha-beta model alone.
    """

    build: Builder
    reads_local: bool = False
    power_of_two: bool = False
    rings_per_local_rank: bool = False
    sharded_with: str = "ring"
    nccl: str | None = None

    @property
    def library(self) -> str | None:
        """The communication library that runs this algorithm as one of its calls: ``"nccl"`` for NCCL's entries
        (those with an ``nccl`` mode: its tuner's pick, or ``NCCL_ALGO=Ring``); None for the textbook algorithms
        (the course's tree, butterfly, naive, parameter server, hierarchical), which no framework's library runs:
        what-ifs for ``simulate`` and ``compare``, never searched by the planner (``plansim.strategy.frameworks``'
        ``collective_library`` rule)."""
        return None if self.nccl is None else "nccl"

    @property
    def pinned(self) -> bool:
        """Whether the entry forces a choice its library's tuner makes per call itself (``NCCL_ALGO=Ring``): it then
        prices as the tuner's entry wherever the tuner picks the same, so the planner searches it only on request."""
        return self.nccl not in (None, "auto")


def _butterfly(build: Builder) -> Algorithm:
    """Recursive halving/doubling (Thakur et al. 2005, sec 4): a power-of-two group; its long-distance steps cross
    nodes; ZeRO shards with butterflies beside it."""
    return Algorithm(build, reads_local=True, power_of_two=True, sharded_with="butterfly")


#: The data-parallel all-reduce algorithms (``Strategy.dp_algorithm``).
ALLREDUCE_ALGORITHMS: dict[str, Algorithm] = {
    # NCCL_ALGO unset (what frameworks run, the default): NCCL's tuner picks ring or tree per call; the bytes move as
    # the ring's (a tree moves about as much per rank through each node boundary, 2 n), the time is the picked
    # call's (plansim.costs.nccl.nccl_call)
    "nccl": Algorithm(alg.allreduce_ring, rings_per_local_rank=True, sharded_with="nccl", nccl="auto"),
    # NCCL_ALGO=Ring: the ring, with the protocol NCCL's tuner picks
    "ring": Algorithm(alg.allreduce_ring, rings_per_local_rank=True, nccl="ring"),
    "tree": Algorithm(alg.allreduce_tree, reads_local=True),
    "butterfly": _butterfly(alg.allreduce_butterfly),
    "naive": Algorithm(alg.allreduce_naive, reads_local=True),
    "ps": Algorithm(alg.allreduce_ps, reads_local=True),
    "hierarchical": Algorithm(alg.allreduce_hierarchical, reads_local=True),
}

#: Collective -> algorithm name -> entry: the one list of algorithm names.
COLLECTIVES: dict[str, dict[str, Algorithm]] = {
    "all_reduce": ALLREDUCE_ALGORITHMS,
    "all_gather": {
        "ring": Algorithm(alg.all_gather_ring, rings_per_local_rank=True, nccl="ring"),
        "nccl": Algorithm(alg.all_gather_ring, rings_per_local_rank=True, nccl="auto"),
        "butterfly": _butterfly(alg.all_gather_butterfly),
    },
    "reduce_scatter": {
        "ring": Algorithm(alg.reduce_scatter_ring, rings_per_local_rank=True, nccl="ring"),
        "nccl": Algorithm(alg.reduce_scatter_ring, rings_per_local_rank=True, nccl="auto"),
        "butterfly": _butterfly(alg.reduce_scatter_butterfly),
    },
    "broadcast": {"tree": Algorithm(alg.broadcast_tree), "ring": Algorithm(alg.broadcast_ring)},
    # NCCL's grouped sends and receives, all peers at once: each transfer on the link it crosses
    "all_to_all": {"direct": Algorithm(alg.all_to_all_direct, reads_local=True)},
    "send_recv": {"direct": Algorithm(alg.send_recv_direct)},
}

#: What ``n_bytes`` means for each collective.
MESSAGE_SIZE: dict[str, str] = {
    "all_reduce": "the full vector each rank holds",
    "reduce_scatter": "the full vector each rank holds",
    "all_gather": "the full gathered output",
    "broadcast": "the message",
    "all_to_all": "each rank's whole send buffer",
    "send_recv": "the message",
}


def algorithm_entry(collective: str, algorithm: str) -> Algorithm:
    """The registry entry of ``algorithm`` for ``collective``; a ``PlansimError`` naming the choices otherwise."""
    if collective not in COLLECTIVES:
        raise PlansimError(f"unknown collective {collective!r}: choose one of {', '.join(sorted(COLLECTIVES))}")
    algorithms = COLLECTIVES[collective]
    if algorithm not in algorithms:
        choices = ", ".join(sorted(algorithms))
        raise PlansimError(f"unknown {collective} algorithm {algorithm!r}: choose one of {choices}")
    return algorithms[algorithm]


def schedule(collective: str, algorithm: str, p: int, local: int | None = None) -> Schedule:
    """The schedule of ``algorithm`` for ``collective`` among ``p`` workers (cached; its arrays are read-only).

    Parameters
    ----------
    collective : str
        A key of :data:`COLLECTIVES`.
    algorithm : str
        A key of ``COLLECTIVES[collective]``.
    p : int
        Number of workers; ``p = 1`` gives an empty schedule.
    local : int, optional
        Ranks per node: ``hierarchical`` splits by it (the other algorithms' steps do not depend on it).

    Examples
    --------
    >>> s = schedule("all_reduce", "ring", p=4)
    >>> len(s.steps), s.num_nodes, s.total_bytes(1.0)
    (6, 4, 6.0)
    """
    if p < 1:
        raise PlansimError(f"{collective}: the group needs at least one worker, got p={p}")
    entry = algorithm_entry(collective, algorithm)
    return _cached_schedule(collective, algorithm, int(p), local if entry.reads_local else None)


@lru_cache(maxsize=256)
def _cached_schedule(collective: str, algorithm: str, p: int, local: int | None) -> Schedule:
    if p == 1:
        return Schedule(f"{collective}/{algorithm}", 1, ())
    return COLLECTIVES[collective][algorithm].build(p, local)


def collective_time(
    collective: str,
    algorithm: str,
    p: int,
    n_bytes: float,
    alpha_s: float,
    bandwidth_Bps: float,
    *,
    inter: tuple[float, float] | None = None,
    local: int | None = None,
) -> float:
    """Alpha-beta time in seconds of one collective; see :data:`MESSAGE_SIZE` for what ``n_bytes`` means.

    With ``local`` (ranks per node) an algorithm whose entry ``reads_local`` is priced on the links its transfers
    cross: those between nodes on ``inter=(alpha_s, bandwidth_Bps)`` (one rank's NIC share), the others on
    ``alpha_s`` and ``bandwidth_Bps``, concurrently (``Schedule.time``). Without ``local``, or for the other
    algorithms, every step uses ``alpha_s`` and ``bandwidth_Bps``.

    Examples
    --------
    >>> t = collective_time("all_reduce", "ring", 4, 4e9, alpha_s=1e-5, bandwidth_Bps=100e9)
    >>> round(t, 6)  # 2(p-1) a + 2 n (p-1)/p / B
    0.06006
    >>> on_nics = collective_time("all_reduce", "naive", 4, 1e9, 0.0, 100e9, inter=(0.0, 25e9), local=2)
    >>> round(on_nics, 6)  # each GPU sends 1 vector over NVLink and 2 through its NIC, at once: 2 n / 25 GB/s
    0.08
    """
    placed = local if algorithm_entry(collective, algorithm).reads_local else None
    return schedule(collective, algorithm, p, local).time(n_bytes, alpha_s, bandwidth_Bps, inter, placed)


def bytes_sent_per_rank(collective: str, algorithm: str, p: int, n_bytes: float, *, local: int | None = None) -> float:
    """Bytes one worker sends, as the mean over the ``p`` workers (a parameter server's sends are not included).

    Examples
    --------
    >>> bytes_sent_per_rank("all_reduce", "ring", 8, 8e6)  # 2 (p-1)/p n
    14000000.0
    """
    return _mean_sent_per_byte(collective, algorithm, p, local) * n_bytes


@lru_cache(maxsize=1024)
def _mean_sent_per_byte(collective: str, algorithm: str, p: int, local: int | None) -> float:
    """What one worker sends per byte of message, on average (sends are linear in the message size)."""
    return float(np.mean(schedule(collective, algorithm, p, local).bytes_sent(1.0)[:p]))
