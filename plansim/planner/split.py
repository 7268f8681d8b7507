"""Uneven layer splits: how many transformer blocks each pipeline stage should run so that the slowest stage,
which sets a pipeline's pace, is as fast as it can be. The first stage also runs the embedding and the last the
output layer (Megatron-LM's ``--decoder-first/last-pipeline-num-layers`` exist for this: a large vocabulary makes
the last stage the slowest under an even split).

The partition is the classic linear-partition problem (contiguous parts, minimise the largest part sum): the
smallest feasible bottleneck is found by bisection over a greedy feasibility test (fill each stage but the first,
last stage first, with as many blocks as fit, leaving one per remaining stage), which is exact for contiguous
partitions. Filling from the back leaves the early stages the lighter ones where several splits tie: under 1F1B the
first stages hold the most micro-batches' activations.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["balanced_split", "bottleneck"]


def bottleneck(split: Sequence[int], block_s: Sequence[float], first_s: float, last_s: float) -> float:
    """The slowest stage's time under ``split`` (blocks per stage, in order).

    >>> bottleneck([2, 1], [1.0, 1.0, 1.0], first_s=0.0, last_s=1.5)
    2.5
    """
    times, start = [], 0
    for k, n in enumerate(split):
        t = sum(block_s[start : start + n]) + (first_s if k == 0 else 0.0) + (last_s if k == len(split) - 1 else 0.0)
        times.append(t)
        start += n
    return max(times)


def _greedy(block_s: Sequence[float], first_s: float, last_s: float, parts: int, limit: float) -> list[int] | None:
    """A split whose every stage takes at most ``limit`` (each at least one block), or None if there is none."""
    n = len(block_s)
    split, start = [], 0
    for k in range(parts - 1):
        load = first_s if k == 0 else 0.0
        count = 0
        most = n - start - (parts - 1 - k)  # leave a block for each later stage
        while count < most and load + block_s[start + count] <= limit:
            load += block_s[start + count]
            count += 1
        if count == 0:
            return None
        split.append(count)
        start += count
    if start >= n or sum(block_s[start:]) + last_s + (first_s if parts == 1 else 0.0) > limit:
        return None
    split.append(n - start)
    return split


def balanced_split(block_s: Sequence[float], first_s: float, last_s: float, parts: int) -> list[int]:
    """Blocks per stage (contiguous, each at least one) that minimise the slowest stage's time, where stage 0 also
    runs ``first_s`` and the last stage ``last_s``; within 1e-9 relative of the optimum.

    >>> balanced_split([1.0] * 8, first_s=0.0, last_s=2.0, parts=3)
    [2, 4, 2]
    """
    n = len(block_s)
    if not 1 <= parts <= n:
        raise ValueError(f"{parts} stages for {n} blocks: need 1 <= stages <= blocks")
    if parts == 1:
        return [n]
    lo = max(max(block_s), first_s + block_s[0], last_s + block_s[-1])
    hi = (sum(block_s) + first_s + last_s) * (1 + 1e-9)  # the margin covers summing in another order
    backwards = list(reversed(block_s))
    best = _greedy(backwards, last_s, first_s, parts, hi)
    assert best is not None  # the total always fits
    for _ in range(200):
        if hi - lo <= 1e-12 * hi:
            break
        mid = (lo + hi) / 2
        found = _greedy(backwards, last_s, first_s, parts, mid)
        if found is None:
            lo = mid
        else:
            hi, best = mid, found
    return best[::-1]
