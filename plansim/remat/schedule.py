"""Executable rematerialization schedules: an ordered list of compute and free operations, built from a plan of
stages, and the replay that checks one.

A plan is Checkmate's partitioned schedule (Jain et al., MLSys 2020, sec 4.1-4.3): stage ``t`` computes the nodes
``R_t`` (in index order; frontier-advancing: the last is node ``t``) starting from the values ``S_t`` kept from
stage ``t - 1``. ``schedule_from_plan`` turns it into operations with Checkmate's deallocation rule (sec 4.5): a value
is freed right after its last use in the stage unless it is kept into stage ``t + 1``; a kept value that the stage
does not use is freed when the stage ends. ``replay`` executes the operations and measures what they cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from plansim.remat.graph import RematGraph

__all__ = ["InvalidSchedule", "Op", "Replay", "Schedule", "plan_of", "replay", "schedule_from_plan"]


class InvalidSchedule(ValueError):
    """A schedule that cannot run: an operand not in memory, a double allocation, a node never computed."""


@dataclass(frozen=True)
class Op:
    """Compute or free one node's result, as part of stage ``stage`` (the frontier node the stage advances to)."""

    action: Literal["compute", "free"]
    node: int
    stage: int


@dataclass(frozen=True)
class Schedule:
    """The operations in execution order."""

    ops: tuple[Op, ...]

    def computes(self) -> list[int]:
        """Node indices in the order they are computed (recomputations included)."""
        return [op.node for op in self.ops if op.action == "compute"]


@dataclass(frozen=True)
class Replay:
    """What executing a schedule measured.

    ``peak_bytes``: the most live bytes at any point of one micro-batch (an op's inputs and output are live
    together). ``held_bytes``: live bytes when the backward pass starts, which is what a micro-batch keeps while
    other micro-batches run (pipeline schedules keep several in flight). ``cost``: every compute op's cost;
    ``recompute_cost`` what exceeds computing each node once.
    """

    peak_bytes: float
    held_bytes: float
    cost: float
    recompute_cost: float
    recomputed_nodes: int

    def peak_with(self, in_flight: float = 1) -> float:
        """Peak bytes with ``in_flight`` micro-batches alive: the others hold ``held_bytes`` each."""
        return self.peak_bytes + max(in_flight - 1, 0) * self.held_bytes


def schedule_from_plan(graph: RematGraph, compute: Sequence[set[int]], keep: Sequence[set[int]]) -> Schedule:
    """Operations of a plan: ``compute[t]`` the nodes stage ``t`` computes, ``keep[t]`` the values alive when it
    starts (``keep[0]`` empty; ``keep[len(graph)]``, if given, is ignored: nothing outlives the last stage).

    >>> from plansim.remat.graph import linear_chain
    >>> g = linear_chain(1)          # f0, loss, grad:f0
    >>> s = schedule_from_plan(g, [{0}, {1}, {2}], [set(), {0}, {0, 1}])
    >>> [f"{o.action} {g.nodes[o.node].name}" for o in s.ops][:4]
    ['compute f0', 'compute loss', 'compute grad:f0', 'free f0']
    """
    n = len(graph)
    ops: list[Op] = []
    for t in range(n):
        nxt = keep[t + 1] if t + 1 < n else set()
        order = sorted(compute[t])
        live = set(keep[t])
        for pos, k in enumerate(order):
            ops.append(Op("compute", k, t))
            live.add(k)
            later = order[pos + 1 :]
            for i in sorted({*graph.nodes[k].deps, k}):
                if i in live and i not in nxt and not any(i in graph.nodes[j].deps for j in later):
                    ops.append(Op("free", i, t))
                    live.discard(i)
        ops.extend(Op("free", i, t) for i in sorted(live - nxt))
    return Schedule(tuple(ops))


def replay(graph: RematGraph, schedule: Schedule) -> Replay:
    """Execute ``schedule`` on ``graph``: every operand must be in memory when used, no value is allocated twice,
    every node is computed at least once. Raises ``InvalidSchedule`` otherwise.

    >>> from plansim.remat.graph import linear_chain
    >>> g = linear_chain(1)
    >>> r = replay(g, schedule_from_plan(g, [{0}, {1}, {2}], [set(), {0}, {0, 1}]))
    >>> r.peak_bytes, r.held_bytes, r.cost, r.recompute_cost
    (3.0, 2.0, 3.0, 0.0)
    """
    live: set[int] = set()
    live_bytes = peak = cost = 0.0
    held: float | None = None
    done = [False] * len(graph)
    recomputed = 0
    first_backward = graph.forward_count
    for op in schedule.ops:
        node = graph.nodes[op.node]
        if held is None and op.stage >= first_backward:
            held = live_bytes
        if op.action == "free":
            if op.node not in live:
                raise InvalidSchedule(f"free of {node.name!r}, which is not in memory (stage {op.stage})")
            live.discard(op.node)
            live_bytes -= node.memory
            continue
        if op.node in live:
            raise InvalidSchedule(f"{node.name!r} computed while already in memory (stage {op.stage})")
        missing = [graph.nodes[d].name for d in node.deps if d not in live]
        if missing:
            raise InvalidSchedule(f"{node.name!r} computed in stage {op.stage} without {', '.join(missing)} in memory")
        live.add(op.node)
        live_bytes += node.memory
        peak = max(peak, live_bytes)
        cost += node.cost
        recomputed += done[op.node]
        done[op.node] = True
    never = [graph.nodes[i].name for i, d in enumerate(done) if not d]
    if never:
        raise InvalidSchedule(f"never computed: {', '.join(never[:5])}")
    return Replay(peak, held or 0.0, cost, cost - graph.total_cost, recomputed)


def plan_of(graph: RematGraph, schedule: Schedule) -> tuple[list[set[int]], list[set[int]]]:
    """The plan a schedule executes: per stage, the nodes it computes and the values alive when it starts."""
    n = len(graph)
    compute: list[set[int]] = [set() for _ in range(n)]
    keep: list[set[int]] = [set() for _ in range(n)]
    live: set[int] = set()
    stage = -1
    for op in schedule.ops:
        while stage < op.stage:
            stage += 1
            keep[stage] = set(live)
        if op.action == "compute":
            compute[op.stage].add(op.node)
            live.add(op.node)
        else:
            live.discard(op.node)
    return compute, keep
