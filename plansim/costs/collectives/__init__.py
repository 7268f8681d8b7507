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

from plansim.costs.collectives.registry import (
    ALLREDUCE_ALGORITHMS,
    COLLECTIVES,
    MESSAGE_SIZE,
    Algorithm,
    Builder,
    Schedule,
    Step,
    algorithm_entry,
    bytes_sent_per_rank,
    collective_time,
    schedule,
    simulate,
)

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
