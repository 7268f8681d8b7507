"""A stage's pass order as nested runs: a block of passes repeated in a row is one node (block, repeats), so a walk
over the order (the activation peak, ``plansim.step.memory``) costs what the schedule's phases do, not its passes.
A schedule entry gives its runs in closed form (``PipelineSchedule.runs``) or its passes (``passes``, ``order``),
compressed here; ``tests/test_activation_walk.py`` holds the runs equal to the orders."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from plansim.pipeline.schedules import get_schedule

__all__ = ["Node", "order_runs"]

#: A pass (chunk, kind), or (a block of nodes, how many times it repeats in a row).
Node = tuple[Any, Any]


@lru_cache(maxsize=16384)
def order_runs(schedule: str, stage: int, pp: int, num_microbatches: int, virtual_stages: int) -> tuple[Node, ...]:
    """A stage's passes under ``schedule`` (``PipelineSchedule.order``) as nested runs: a block repeated in a row is
    one node (block, repeats), so a walk costs what the schedule's phases do, not its passes. GPipe, 1F1B and ZB-H1
    in closed form from their orders' rules (``plansim.pipeline.orders``; tests hold them equal to the orders);
    others by compressing the order: passes first (a chunk's warm-up forwards, forward-backward pairs), then those
    runs (the interleaved schedule cycling through its chunks)."""
    m, s, entry = num_microbatches, stage, get_schedule(schedule)
    if entry.runs is not None:
        return tuple(((block, k) for block, k in entry.runs(s, pp, m) if k > 0))
    if entry.passes is not None:
        ops = entry.passes(s, pp, m, virtual_stages)
    else:
        ops = [(op.chunk, op.kind) for op in entry.order(s, pp, m, virtual_stages)]
    passes = _compress(ops, (1, 2, 3))
    return tuple(_compress(passes, tuple(range(1, min(4 * virtual_stages + 4, len(passes) // 2) + 1))))


def _compress(seq: list[Any], lengths: tuple[int, ...]) -> list[Any]:
    """``seq`` with each block of one of ``lengths`` items that repeats in a row replaced by (block, repeats),
    greedily from the start, the block covering most items first."""
    out: list[Any] = []
    i, n = 0, len(seq)
    while i < n:
        best_len, best_k = 1, 1
        for length in lengths:
            if i + length > n:
                break
            if i + 2 * length > n or seq[i + length] != seq[i]:  # its block cannot repeat in a row here
                continue
            block = seq[i : i + length]
            k = 1
            while seq[i + k * length : i + (k + 1) * length] == block:
                k += 1
            if k > 1 and k * length > best_len * best_k:
                best_len, best_k = length, k
        out.append(seq[i] if best_k == 1 else (tuple(seq[i : i + best_len]), best_k))
        i += best_len * best_k
    return out
