"""Collective communication costs, each algorithm defined once as a schedule of point-to-point transfers.

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

Closed forms the schedules reproduce (``a`` = alpha, ``b`` = 1/bandwidth, ``D = floor(log2 p)``):

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
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from plansim.costs.collectives import _algorithms as alg
from plansim.costs.collectives._schedule import Schedule, Step, Tier, simulate
from plansim.errors import PlansimError

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "COLLECTIVES",
    "MESSAGE_SIZE",
    "Builder",
    "Schedule",
    "Step",
    "Tier",
    "bytes_sent_per_rank",
    "collective_time",
    "schedule",
    "simulate",
]

#: Builds one algorithm's schedule from ``(p, local)``; ``local`` matters only to ``hierarchical``.
Builder = Callable[[int, "int | None"], Schedule]

ALLREDUCE_ALGORITHMS: dict[str, Builder] = {
    "naive": alg.allreduce_naive,
    "ps": alg.allreduce_ps,
    "ring": alg.allreduce_ring,
    "tree": alg.allreduce_tree,
    "butterfly": alg.allreduce_butterfly,
    "hierarchical": alg.allreduce_hierarchical,
}

COLLECTIVES: dict[str, dict[str, Builder]] = {
    "all_reduce": ALLREDUCE_ALGORITHMS,
    "all_gather": {"ring": alg.all_gather_ring, "butterfly": alg.all_gather_butterfly},
    "reduce_scatter": {"ring": alg.reduce_scatter_ring, "butterfly": alg.reduce_scatter_butterfly},
    "broadcast": {"tree": alg.broadcast_tree, "ring": alg.broadcast_ring},
    "all_to_all": {"direct": alg.all_to_all_direct},
    "send_recv": {"direct": alg.send_recv_direct},
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


def _builder(collective: str, algorithm: str) -> Builder:
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
        Ranks per node: ``hierarchical`` splits by it; ``butterfly`` tags the steps that cross nodes (ignored by
        the other algorithms).

    Examples
    --------
    >>> s = schedule("all_reduce", "ring", p=4)
    >>> len(s.steps), s.num_nodes, s.total_bytes(1.0)
    (6, 4, 6.0)
    """
    _builder(collective, algorithm)
    if p < 1:
        raise PlansimError(f"{collective}: the group needs at least one worker, got p={p}")
    return _cached_schedule(collective, algorithm, int(p), local if algorithm in _LOCAL_AWARE else None)


#: Algorithms whose schedule reads ``local`` (ranks per node): hierarchical's inter-node phase, and butterflies, whose
#: steps between ranks ``local`` or more apart cross nodes (tagged ``"inter"`` for the alpha-beta time).
_LOCAL_AWARE = ("hierarchical", "butterfly")


@lru_cache(maxsize=256)
def _cached_schedule(collective: str, algorithm: str, p: int, local: int | None) -> Schedule:
    if p == 1:
        return Schedule(f"{collective}/{algorithm}", 1, ())
    return COLLECTIVES[collective][algorithm](p, local)


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

    ``inter=(alpha_s, bandwidth_Bps)`` prices the inter-node steps (``hierarchical``'s inter-node phase; a
    ``butterfly``'s steps between ranks ``local`` or more apart); without it every step uses ``alpha_s`` and
    ``bandwidth_Bps``.

    Examples
    --------
    >>> t = collective_time("all_reduce", "ring", 4, 4e9, alpha_s=1e-5, bandwidth_Bps=100e9)
    >>> round(t, 6)  # 2(p-1) a + 2 n (p-1)/p / B
    0.06006
    """
    return schedule(collective, algorithm, p, local).time(n_bytes, alpha_s, bandwidth_Bps, inter)


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
