"""Communication patterns shared by several algorithms: ring phases, recursive doubling and halving.

Sources: ring phases follow Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 69(2); recursive doubling and halving follow Thakur, Rabenseifner & Gropp 2005, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 19(1), sec. 4.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from plansim.costs.collectives._schedule import Step, StepRun
from plansim.errors import PlansimError


def locked(arr: NDArray) -> NDArray:
    """Mark a freshly built array read-only so a :class:`Step` can keep it without copying."""
    arr.setflags(write=False)
    return arr


def full(count: int, value: float) -> NDArray[np.float64]:
    """A read-only float array of ``count`` copies of ``value``."""
    return locked(np.full(count, value, dtype=np.float64))


def log2_exact(p: int, who: str) -> int:
    """``log2(p)`` for a power of two; otherwise a :class:`PlansimError` that points to the ring algorithm."""
    if p < 1 or p & (p - 1):
        raise PlansimError(f"{who}=butterfly needs a power-of-two group, got {p}: use ring")
    return p.bit_length() - 1


def ring_phase(
    members: NDArray[np.int64], segment: NDArray[np.int64], segments: int, *, reduce: bool
) -> list[Step | StepRun]:
    """Steps of a ring reduce-scatter (``reduce=True``) or ring all-gather (``reduce=False``), one ring per row.

    Row ``r`` of ``members`` (shape ``(rings, m)``) lists the nodes of one ring in order; that ring works on segment
    ``segment[r]`` of the message cut into ``segments`` equal segments, itself cut into ``m`` chunks. Position ``i``
    of a ring ends a reduce-scatter holding reduced chunk ``i``, and starts an all-gather holding chunk ``i``. Each
    of the ``m - 1`` steps sends one chunk to the next position (Patarasuk & Yuan 2009, sec. 3).

    The steps come as one :class:`StepRun`, built when read: in every step each ring member sends one chunk,
    ``1 / (segments * m)`` of the message, to its successor and receives one from its predecessor, so a node in
    ``k`` rings sends and receives ``k / (segments * m)`` per step, between the same nodes every step.
    """
    m = members.shape[1]
    if m < 2:
        return []
    position = np.arange(m)
    src = locked(members.ravel().copy())
    dst = locked(members[:, (position + 1) % m].ravel())
    first = segment[:, None] * m
    denominator = segments * m
    lag = 1 if reduce else 0

    def build(s: int) -> Step:
        chunk = (first + (position - s - lag) % m).ravel()
        lo, hi = locked(chunk / denominator), locked((chunk + 1) / denominator)
        return Step(src, dst, lo, hi, reduce=reduce)

    per_step = locked(np.bincount(src) / denominator)
    # chunk bounds c / denominator are exact in binary floating point when the denominator is a power of two, so then
    # every step moves bit-for-bit the same sizes
    uniform = denominator & (denominator - 1) == 0
    return [StepRun(m - 1, build, per_step, per_step, transfers=len(src), uniform=uniform, same_pairs=True)]


def recursive_doubling_gather(p: int) -> list[Step]:
    """All-gather by recursive doubling: in step ``k`` each rank swaps its aligned block of ``2**k`` shards with
    rank ``i XOR 2**k`` (Thakur et al. 2005, sec. 4.1)."""
    ranks = locked(np.arange(p, dtype=np.int64))
    steps = []
    for k in range(log2_exact(p, "all_gather algorithm")):
        distance = 1 << k
        start = (ranks >> k) << k
        steps.append(Step(ranks, locked(ranks ^ distance), locked(start / p), locked((start + distance) / p)))
    return steps


def recursive_halving_scatter(p: int) -> list[Step]:
    """Reduce-scatter by recursive halving: at distance ``d = p/2, p/4, ..., 1`` each rank sends the partner the half
    of its current block that holds the partner's shard and keeps the half that holds its own (Thakur et al. 2005,
    sec. 4.2). Rank ``i`` ends with reduced shard ``i``."""
    ranks = locked(np.arange(p, dtype=np.int64))
    steps = []
    for k in reversed(range(log2_exact(p, "reduce_scatter algorithm"))):
        distance = 1 << k
        partner = locked(ranks ^ distance)
        start = (partner >> k) << k
        steps.append(Step(ranks, partner, locked(start / p), locked((start + distance) / p), reduce=True))
    return steps
