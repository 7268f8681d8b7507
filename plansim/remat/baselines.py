"""The heuristics practitioners use, as plans over the same graph and with the same result type as the MILP.

Each baseline chooses which forward results are *checkpoints*, kept from the forward pass until the backward pass no
longer needs them; every other forward result is freed after its last forward use and recomputed (from the nearest
values in memory) by the first backward node that needs it, then kept until the backward pass is done with it. This
is the segment scheme of Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost", sec 4): a dropped
segment is rebuilt once, when its gradient is due. Results of zero bytes are always kept.

- ``none``: every forward result is a checkpoint.
- ``full``: the first node of each layer (its input, in plansim's transformer graphs) is (Korthikanti et al. 2022,
  sec 5, "full activation recomputation").
- ``selective``: all but the nodes marked ``selective``, the attention core (Korthikanti et al. 2022, sec 5).
- ``sqrt``: the first node of every ``ceil(sqrt(L))``-th layer (Chen et al. 2016, sec 4.1).
- ``greedy``: Chen et al. 2016 sec 4.2's greedy over the topological order (Checkmate's "linearized greedy"): walk
  forward accumulating bytes; when the sum passes a threshold ``b``, checkpoint the node and restart the sum. The
  thresholds tried are the graph's forward prefix sums; the cheapest schedule within the budget wins.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from plansim.remat.graph import RematGraph
from plansim.remat.result import RematResult
from plansim.remat.schedule import Replay, Schedule, replay, schedule_from_plan

if TYPE_CHECKING:
    from plansim.remat.deadline import Deadline

__all__ = [
    "BASELINES",
    "checkpoint_plan",
    "checkpoint_sets",
    "run_baseline",
    "run_checkpoints",
    "tighten",
    "tightest_baseline",
]


def _last_need(graph: RematGraph) -> list[int]:
    """The last stage at which each value can still be needed: its last reader, or for a forward value the last
    stage at which a forward node reading it may have to be recomputed."""
    need = [max(users, default=i) for i, users in enumerate(graph.users)]
    for i in reversed(range(graph.forward_count)):
        for u in graph.users[i]:
            if not graph.nodes[u].backward:
                need[i] = max(need[i], need[u])
    return need


def _closure(graph: RematGraph, wanted: Iterable[int], live: set[int]) -> set[int]:
    """The nodes to compute so that ``wanted`` can run: missing operands, recursively."""
    out: set[int] = set()
    stack = [d for w in wanted for d in graph.nodes[w].deps if d not in live]
    while stack:
        v = stack.pop()
        if v in out:
            continue
        out.add(v)
        stack.extend(d for d in graph.nodes[v].deps if d not in live and d not in out)
    return out


def checkpoint_sets(graph: RematGraph, checkpoints: set[int]) -> tuple[list[set[int]], list[set[int]]]:
    """The plan (per stage: nodes computed, values kept into it) that keeps ``checkpoints`` (plus zero-byte results)
    and recomputes the rest on demand, tightened so that no stage holds a value it neither reads nor passes on."""
    n, fwd = len(graph), graph.forward_count
    kept = set(checkpoints) | {i for i, node in enumerate(graph.nodes) if node.memory == 0}
    need = _last_need(graph)
    compute: list[set[int]] = []
    keep: list[set[int]] = [set()]
    for t in range(n):
        live = keep[t]
        todo = {t} | (_closure(graph, [t], live) if t >= fwd else set())
        compute.append(todo)
        alive = live | todo
        if t < fwd:  # forward: a non-checkpoint lives until its last forward reader
            nxt = {i for i in alive if need[i] > t and (i in kept or _forward_reader_after(graph, i, t))}
        else:
            nxt = {i for i in alive if need[i] > t}
        keep.append(nxt)
    return compute, tighten(graph, compute, keep[:n])


def tighten(graph: RematGraph, compute: list[set[int]], keep: list[set[int]]) -> list[set[int]]:
    """Drop from ``keep[t]`` every value stage ``t`` neither reads nor keeps into stage ``t + 1`` (it only takes
    memory), latest stage first so that the drops propagate backwards."""
    out = [set(k) for k in keep]
    for t in reversed(range(len(out))):
        nxt = out[t + 1] if t + 1 < len(out) else set()
        read = {d for k in compute[t] for d in graph.nodes[k].deps}
        out[t] = {i for i in out[t] if i in read or i in nxt}
    return out


def checkpoint_plan(graph: RematGraph, checkpoints: set[int]) -> Schedule:
    """The schedule of ``checkpoint_sets``."""
    return schedule_from_plan(graph, *checkpoint_sets(graph, checkpoints))


def _forward_reader_after(graph: RematGraph, i: int, t: int) -> bool:
    return any(u > t and not graph.nodes[u].backward for u in graph.users[i])


def _layer_starts(graph: RematGraph) -> list[int]:
    """The first forward node of each layer, in order."""
    first: dict[int, int] = {}
    for i in range(graph.forward_count):
        first.setdefault(graph.nodes[i].layer, i)
    return sorted(first.values())


def _none(graph: RematGraph) -> set[int]:
    return set(range(graph.forward_count))


def _full(graph: RematGraph) -> set[int]:
    return set(_layer_starts(graph))


def _selective(graph: RematGraph) -> set[int]:
    return {i for i in range(graph.forward_count) if not graph.nodes[i].selective}


def _sqrt(graph: RematGraph) -> set[int]:
    starts = _layer_starts(graph)
    k = max(1, math.ceil(math.sqrt(len(starts))))
    return set(starts[::k])


def _greedy(graph: RematGraph, threshold: float) -> set[int]:
    chosen: set[int] = set()
    acc = 0.0
    for i in range(graph.forward_count):
        acc += graph.nodes[i].memory
        if acc > threshold:
            chosen.add(i)
            acc = 0.0
    return chosen


#: Baselines with a fixed checkpoint set (greedy searches its threshold against the budget instead).
FIXED: dict[str, Callable[[RematGraph], set[int]]] = {
    "none": _none,
    "full": _full,
    "selective": _selective,
    "sqrt": _sqrt,
}
BASELINES = (*FIXED, "greedy")


def run_baseline(
    graph: RematGraph,
    method: str,
    budget_bytes: float | None = None,
    in_flight: float = 1,
    *,
    deadline: Deadline | None = None,
) -> RematResult:
    """Schedule ``graph`` with baseline ``method``; ``feasible`` says whether its peak fits ``budget_bytes``.
    ``deadline`` bounds greedy's search over thresholds (the best found when it passes; at least one is tried);
    the other baselines are one schedule each.

    >>> from plansim.remat.graph import linear_chain
    >>> r = run_baseline(linear_chain(16), "sqrt")   # 17 layers with the loss: 4 segments of 5 rebuilt, 13 nodes
    >>> r.feasible, r.recompute_cost
    (True, 13.0)
    """
    if method != "greedy":
        return run_checkpoints(graph, FIXED[method](graph), budget_bytes, in_flight, method)
    start = time.perf_counter()
    sched, rep = _best_greedy(graph, budget_bytes, in_flight, deadline)
    return _result(graph, method, sched, rep, budget_bytes, in_flight, time.perf_counter() - start)


def run_checkpoints(
    graph: RematGraph, checkpoints: set[int], budget_bytes: float | None, in_flight: float, method: str
) -> RematResult:
    """The schedule that keeps ``checkpoints`` (``checkpoint_plan``) as a result named ``method``."""
    start = time.perf_counter()
    sched = checkpoint_plan(graph, checkpoints)
    rep = replay(graph, sched)
    return _result(graph, method, sched, rep, budget_bytes, in_flight, time.perf_counter() - start)


def _result(
    graph: RematGraph,
    method: str,
    sched: Schedule,
    rep: Replay,
    budget_bytes: float | None,
    in_flight: float,
    seconds: float,
) -> RematResult:
    fits = budget_bytes is None or rep.peak_with(in_flight) <= budget_bytes * (1 + 1e-9)
    reason = "" if fits else f"peak {rep.peak_with(in_flight):.4g} B exceeds the budget {budget_bytes:.4g} B"
    return RematResult(method, graph.name, budget_bytes, in_flight, fits, sched, rep, seconds, reason=reason)


def _best_greedy(
    graph: RematGraph, budget: float | None, in_flight: float, deadline: Deadline | None = None
) -> tuple[Schedule, Replay]:
    prefix, acc = [0.0], 0.0
    for i in range(graph.forward_count):
        acc += graph.nodes[i].memory
        prefix.append(acc)
    best: tuple[tuple[bool, float, float], Schedule, Replay] | None = None
    for threshold in sorted(set(prefix)):
        if best is not None and deadline is not None and deadline.expired():
            break
        sched = checkpoint_plan(graph, _greedy(graph, threshold))
        rep = replay(graph, sched)
        peak = rep.peak_with(in_flight)
        fits = budget is None or peak <= budget * (1 + 1e-9)
        key = (not fits, rep.cost if fits else peak, peak)
        if best is None or key < best[0]:
            best = (key, sched, rep)
    assert best is not None
    return best[1], best[2]


def tightest_baseline(
    graph: RematGraph, budget_bytes: float | None = None, in_flight: float = 1, *, deadline: Deadline | None = None
) -> RematResult:
    """The baseline with the smallest peak (first in ``BASELINES`` order on ties); ``deadline`` bounds greedy's
    search (``run_baseline``)."""
    return min(
        (run_baseline(graph, m, budget_bytes, in_flight, deadline=deadline) for m in BASELINES),
        key=lambda r: r.peak_bytes,
    )
