"""Uneven layer splits: how many transformer blocks each pipeline stage should run so that the slowest stage,
which sets a pipeline's pace, is as fast as it can be. The first stage also runs the embedding and the last the
output layer (Megatron-LM's ``--decoder-first/last-pipeline-num-layers`` exist for this: a large vocabulary makes
the last stage the slowest under an even split).

With one model chunk per stage the partition is the classic linear-partition problem (contiguous parts, minimise the
largest part sum): the smallest feasible bottleneck is found by bisection over a greedy feasibility test (fill each
stage but the first, last stage first, with as many blocks as fit, leaving one per remaining stage), which is exact
for contiguous partitions. Filling from the back leaves the early stages the lighter ones where several splits tie:
under 1F1B the first stages hold the most micro-batches' activations.

With ``v`` model chunks per stage (interleaved 1F1B) a stage runs chunks ``s, s + p, ...``, which are not contiguous,
so ``balanced_chunks`` splits in two steps: each stage's blocks, then each stage's blocks over its chunks, each step
handing out blocks one at a time to the stage (chunk) that stays fastest with it, which is optimal when blocks cost
alike (a transformer's); a pass moving single blocks across chunk boundaries then trims what blocks of different
costs leave. The embedding and the output layer make the first and the last chunk the lighter ones, as Llama 3
405B's run did (Dubey et al. 2024, sec 3.3.2: one block fewer in the first and the last stage) and torchtitan's
default split does (``generate_llm_fqn_per_model_part``, the embedding and the output counted as a block each,
torchtitan/distributed/pipeline_parallel.py:236-340 at v0.2.2).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["balanced_chunks", "balanced_split", "bottleneck", "chunk_least"]


def _chunk_times(split: Sequence[int], block_s: Sequence[float], first_s: float, last_s: float) -> list[float]:
    """Each part's time under ``split`` (blocks per part, in model order), the first with ``first_s``, the last with
    ``last_s``."""
    times, start = [], 0
    for k, n in enumerate(split):
        t = sum(block_s[start : start + n]) + (first_s if k == 0 else 0.0) + (last_s if k == len(split) - 1 else 0.0)
        times.append(t)
        start += n
    return times


def bottleneck(
    split: Sequence[int], block_s: Sequence[float], first_s: float, last_s: float, stages: int | None = None
) -> float:
    """The slowest stage's time under ``split`` (blocks per model chunk, in model order; chunk ``k`` on stage
    ``k % stages``, by default one chunk per stage).

    >>> bottleneck([2, 1], [1.0, 1.0, 1.0], first_s=0.0, last_s=1.5)
    2.5
    >>> bottleneck([1, 1, 1, 1], [1.0] * 4, first_s=0.5, last_s=0.0, stages=2)  # stage 0: chunks 0 and 2
    2.5
    """
    times = _chunk_times(split, block_s, first_s, last_s)
    stages = stages or len(split)
    return max(sum(times[s::stages]) for s in range(stages))


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


def _hand_out(extra: Sequence[float], step_s: float, least: Sequence[int], total: int) -> list[int]:
    """Counts of at least ``least[k]`` for parts costing ``extra[k] + count * step_s``, summing to ``total``: each
    block beyond the least to the part that stays fastest with it, the last such part where several tie (the early
    parts the lighter ones)."""
    counts = list(least)
    for _ in range(total - sum(least)):
        k = min(range(len(extra)), key=lambda j: (extra[j] + (counts[j] + 1) * step_s, -j))
        counts[k] += 1
    return counts


def chunk_least(pp: int, v: int) -> list[int]:
    """The fewest blocks each model chunk may hold (``check_strategy``): one, but none in the first and the last
    chunk, which hold the embedding and the output layer (Llama 3 405B's first and last chunks)."""
    least = [1] * (pp * v)
    least[0] = least[-1] = 0
    return least


def balanced_chunks(block_s: Sequence[float], first_s: float, last_s: float, pp: int, v: int) -> list[int]:
    """Blocks per model chunk (``pp * v`` in model order, chunk ``k`` on stage ``k % pp``; ``chunk_least`` each at
    least) that make the slowest stage as fast as they can, then the slowest chunk, where chunk 0 also runs
    ``first_s`` and the last chunk ``last_s``: optimal for blocks of equal cost, then improved block by block for
    unequal ones.

    >>> balanced_chunks([1.0] * 24, first_s=0.1, last_s=1.2, pp=4, v=2)
    [3, 3, 3, 3, 3, 3, 4, 2]
    >>> balanced_chunks([1.0] * 8, first_s=0.0, last_s=0.0, pp=2, v=2)
    [2, 2, 2, 2]
    >>> balanced_chunks([1.0] * 6, first_s=0.2, last_s=1.0, pp=2, v=4)  # as Llama 3 405B: 126 blocks, 16 x 8 chunks
    [0, 1, 1, 1, 1, 1, 1, 0]
    """
    n, chunks = len(block_s), pp * v
    least = chunk_least(pp, v)
    if pp < 2 or v < 2 or n < sum(least):
        raise ValueError(f"{chunks} chunks ({pp} stages of {v}) for {n} blocks: need pp, v >= 2, blocks >= chunks - 2")
    mean = sum(block_s) / n
    extra = [0.0] * pp
    extra[0] += first_s
    extra[-1] += last_s
    per_stage = _hand_out(extra, mean, [sum(least[s::pp]) for s in range(pp)], n)
    split = [0] * chunks
    for s in range(pp):
        own = [first_s if c * pp + s == 0 else last_s if c * pp + s == chunks - 1 else 0.0 for c in range(v)]
        for c, count in enumerate(_hand_out(own, mean, least[s::pp], per_stage[s])):
            split[c * pp + s] = count
    return _trimmed(split, least, block_s, first_s, last_s, pp)


def _trimmed(
    split: list[int], least: Sequence[int], block_s: Sequence[float], first_s: float, last_s: float, pp: int
) -> list[int]:
    """``split`` with single blocks moved across chunk boundaries while that makes the slowest stage, then the
    slowest chunk, faster (blocks of unequal cost; nothing to move for equal ones)."""

    def score(sp: Sequence[int]) -> tuple[float, float]:
        times = _chunk_times(sp, block_s, first_s, last_s)
        return max(sum(times[s::pp]) for s in range(pp)), max(times)

    best = score(split)
    for _ in range(len(block_s) * len(split)):  # each move lowers the score: a bound, never reached in practice
        moves = []
        for k in range(len(split) - 1):
            for a, b in ((k, k + 1), (k + 1, k)):
                if split[a] > least[a]:
                    trial = list(split)
                    trial[a] -= 1
                    trial[b] += 1
                    moves.append((score(trial), trial))
        better = min(moves, default=None, key=lambda m: m[0])
        if better is None or not _faster(better[0], best):
            return split
        best, split = better
    return split


def _faster(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether score ``a`` beats ``b`` beyond rounding: a faster slowest stage, or as fast and a faster slowest
    chunk."""
    if a[0] < b[0] * (1 - 1e-12):
        return True
    return a[0] <= b[0] * (1 + 1e-12) and a[1] < b[1] * (1 - 1e-12)
