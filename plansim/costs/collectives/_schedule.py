"""Schedules of point-to-point transfers, their alpha-beta price, and a data-moving simulator.

A collective algorithm is a sequence of :class:`Step` s. Every transfer in a step starts at the same time; the step
ends when the busiest node is done. Volumes and times are derived from the steps, never written separately.

Long runs of like steps (a ring phase: ``p - 1`` steps of ``p`` transfers; the naive all-reduce; all-to-all) are
:class:`StepRun` s, built only when iterated and priced in closed form, so a schedule costs memory and time linear in
``p``. Placed on nodes (``Schedule.time(..., local=)``), each step's transfers are priced on the node-local or
inter-node link they cross; ``Schedule.gpus`` places a helper (the parameter server) on worker 0's GPU, for the
discrete-event engine too.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from plansim.errors import PlansimError

__all__ = ["Placed", "Schedule", "Step", "StepRun", "Steps", "simulate"]

#: One step as placed on nodes: (some transfer crosses nodes, the busiest GPU's fraction of the message over its
#: node-local link, the busiest GPU's fraction over its inter-node link), each the larger of sent and received.
Placed = tuple[bool, float, float]


def _locked(values: ArrayLike, dtype: type) -> NDArray:
    """A read-only 1-D array of ``dtype``; copied only if the input could still be written through."""
    arr: NDArray = np.asarray(values, dtype=dtype)
    if arr.flags.writeable:
        arr = arr.copy()
        arr.setflags(write=False)
    if arr.ndim != 1:
        raise PlansimError(f"schedule step arrays must be 1-D, got shape {arr.shape}")
    return arr


@dataclass(frozen=True, eq=False)
class Step:
    """One round of point-to-point transfers that all start together.

    Transfer ``j`` moves the chunk ``[lo[j], hi[j])`` of node ``src[j]``'s buffer (fractions of the message, so the
    chunk is ``(hi - lo) * n_bytes`` bytes) to node ``dst[j]``. With ``reduce`` the chunk is added into the
    destination, otherwise it overwrites it. It lands at offset ``dst_lo[j]`` (default: the same offset ``lo[j]``);
    only all-to-all, which transposes blocks, needs a different one. Which links a transfer crosses is not the
    step's to say: it follows from where the nodes sit (:meth:`Schedule.time` with ``local``).

    Examples
    --------
    >>> s = Step(src=[0, 1], dst=[1, 0], lo=[0.5, 0.0], hi=[1.0, 0.5], reduce=True)
    >>> s.loads(num_nodes=2)
    (array([0.5, 0.5]), array([0.5, 0.5]))
    """

    src: NDArray[np.int64]
    dst: NDArray[np.int64]
    lo: NDArray[np.float64]
    hi: NDArray[np.float64]
    reduce: bool = False
    dst_lo: NDArray[np.float64] | None = None

    def __post_init__(self) -> None:
        for name, dtype in (("src", np.int64), ("dst", np.int64), ("lo", np.float64), ("hi", np.float64)):
            object.__setattr__(self, name, _locked(getattr(self, name), dtype))
        if self.dst_lo is not None:
            object.__setattr__(self, "dst_lo", _locked(self.dst_lo, np.float64))
        sizes = {
            len(a) for a in (self.src, self.dst, self.lo, self.hi, self.lo if self.dst_lo is None else self.dst_lo)
        }
        if len(sizes) != 1:
            raise PlansimError(f"schedule step arrays must have one length, got lengths {sorted(sizes)}")

    def loads(self, num_nodes: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Fraction of the message each node sends and receives in this step (``(sent, received)``)."""
        size = self.hi - self.lo
        sent = np.bincount(self.src, weights=size, minlength=num_nodes).astype(np.float64)
        received = np.bincount(self.dst, weights=size, minlength=num_nodes).astype(np.float64)
        return sent, received

    def placed(self, gpus: NDArray[np.int64] | None, local: int) -> Placed | None:
        """The step with node ``i`` on GPU ``gpus[i]`` (None: on GPU ``i``) and GPU ``g`` on node ``g // local``:
        whether a transfer crosses nodes, and the busiest GPU's fraction of the message over its node-local link and
        over its inter-node link (the larger of what it sends and receives on each); None when no transfer leaves its
        GPU.

        >>> Step([0, 1, 2], [2, 2, 3], [0.0] * 3, [1.0] * 3).placed(None, local=2)
        (True, 1.0, 2.0)
        """
        src, dst = (self.src, self.dst) if gpus is None else (gpus[self.src], gpus[self.dst])
        size = self.hi - self.lo
        moves = (src != dst) & (size > 0)
        if not moves.any():
            return None
        cross = (src // local) != (dst // local)
        gpus_seen = int(max(src.max(), dst.max())) + 1
        weight, offset = np.where(moves, size, 0.0), cross * gpus_seen  # slot g: node-local, gpus_seen + g: NIC
        busiest = []
        for ends in (src, dst):
            load = np.bincount(ends + offset, weight, minlength=2 * gpus_seen)
            busiest.append((load[:gpus_seen].max(), load[gpus_seen:].max()))
        on_node, across = (max(a, b) for a, b in zip(*busiest, strict=True))
        return bool((moves & cross).any()), float(on_node), float(across)


@dataclass(frozen=True, eq=False)
class StepRun:
    """``count`` consecutive steps built on demand by ``build(i)``, with the run's loads in closed form.

    A ring phase over ``m`` ranks is ``m - 1`` steps of ``m`` transfers: kept as arrays it would hold ``m**2``
    numbers (a 65,536-way data-parallel ring: tens of GB). A run holds the recipe instead; its steps are built when
    someone iterates them (the discrete-event engine, ``simulate``), and the volumes and alpha-beta time read
    ``sent``/``received``: the fraction of the message node ``k`` sends and receives in *each* step of the run (the
    same for every step of the run; ``tests/test_collectives.py`` checks it against the built steps). Placed on nodes
    (:meth:`Step.placed`), a run's steps are read from ``placed(local)`` where the run gives that closed form, else
    from its first step where every step moves equal chunks between the same nodes (``same_pairs``), else built.
    """

    count: int
    build: Callable[[int], Step]
    sent: NDArray[np.float64]
    received: NDArray[np.float64]
    transfers: int = 0  # point-to-point transfers in each step (what a step built from the run holds)
    uniform: bool = False  # every step moves the same chunk sizes between the same nodes (bit for bit)
    same_pairs: bool = False  # every step moves equal chunks between the same nodes (only the offsets move)
    placed: Callable[[int], Placed | None] | None = None  # each step's Step.placed on workers 0..p-1, closed form

    def __len__(self) -> int:
        return self.count

    def step(self, i: int) -> Step:
        """Step ``i`` of the run (``0 <= i < count``), built now."""
        return self.build(i)


class Steps(Sequence[Step]):
    """A schedule's steps: plain :class:`Step` s and :class:`StepRun` s (built when read), as one sequence.

    >>> runs = Steps([Step([0], [1], [0.0], [1.0]), Step([1], [0], [0.0], [1.0])])
    >>> len(runs), runs[1].src.tolist(), [s.dst.tolist() for s in runs]
    (2, [1], [[1], [0]])
    """

    def __init__(self, parts: Iterable[Step | StepRun]) -> None:
        self.parts: tuple[Step | StepRun, ...] = tuple(parts)
        self._ends = list(itertools.accumulate(len(p) if isinstance(p, StepRun) else 1 for p in self.parts))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, index: int) -> Step: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Step]: ...
    def __getitem__(self, index: int | slice) -> Step | Sequence[Step]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError(f"step {index} of {len(self)}")
        k = bisect.bisect_right(self._ends, i)
        part = self.parts[k]
        return part.step(i - (self._ends[k - 1] if k else 0)) if isinstance(part, StepRun) else part

    def __iter__(self) -> Iterator[Step]:
        for part in self.parts:
            if isinstance(part, StepRun):
                yield from (part.step(i) for i in range(part.count))
            else:
                yield part


@dataclass(frozen=True, eq=False)
class Schedule:
    """A collective algorithm as steps of point-to-point transfers among ``num_nodes`` nodes.

    Nodes ``0 .. p-1`` are the workers (GPUs); any node past them is a helper that holds no input, such as the
    parameter server at index ``p``. With ``out_of_place`` every transfer reads the sender's original input (a
    separate send buffer, as all-to-all needs) instead of its current buffer.

    Pricing is the alpha-beta (Hockney) model as used by Thakur, Rabenseifner & Gropp 2005, "Optimization of
    Collective Communication Operations in MPICH", IJHPCA 19(1), sec. 2: a step costs
    ``alpha + max over nodes of max(bytes sent, bytes received) / bandwidth``. Links are full duplex, so a node
    that sends and receives at once pays once; a node receiving from ``k`` peers pays for all ``k`` chunks. Placed
    on nodes (``time(..., local=)``), each GPU's node-local and inter-node transfers go over their own links at once.

    Examples
    --------
    >>> s = Schedule("send_recv/direct", p=2, steps=(Step([0], [1], [0.0], [1.0]),))
    >>> s.bytes_sent(100.0), s.total_bytes(100.0)
    (array([100.,   0.]), 100.0)
    >>> s.time(1e6, alpha_s=1e-6, bandwidth_Bps=1e9)
    0.001001
    """

    name: str
    p: int
    steps: Sequence[Step]
    num_nodes: int = 0
    out_of_place: bool = False
    _placed_terms: dict[int, dict[Placed, int]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.steps, Steps):
            object.__setattr__(self, "steps", Steps(self.steps))
        if self.num_nodes == 0:
            object.__setattr__(self, "num_nodes", self.p)
        if self.num_nodes < self.p:
            raise PlansimError(f"schedule {self.name}: num_nodes ({self.num_nodes}) is below p ({self.p})")

    def __repr__(self) -> str:
        return f"Schedule({self.name!r}, p={self.p}, steps={len(self.steps)}, num_nodes={self.num_nodes})"

    @property
    def workers(self) -> NDArray[np.int64]:
        """Indices of the ``p`` workers: always ``0 .. p-1``."""
        return np.arange(self.p, dtype=np.int64)

    @cached_property
    def gpus(self) -> NDArray[np.int64]:
        """The worker whose GPU runs each node: a worker its own, a helper (the parameter server) worker 0's. The
        one placement of helpers: the discrete-event engine sends a helper's transfers from and to that GPU, and
        ``time(..., local=)`` prices them there (worker 0's own push to the server never leaves its GPU).

        >>> Schedule("x", p=2, steps=(), num_nodes=3).gpus.tolist()
        [0, 1, 0]
        """
        return locked_array(np.concatenate([self.workers, np.zeros(self.num_nodes - self.p, dtype=np.int64)]))

    @cached_property
    def _totals(self) -> tuple[NDArray[np.float64], int, float]:
        """Fraction of the message each node sends in all, the number of steps and the sum over steps of the
        busiest node's fraction: everything the volumes and the one-link alpha-beta time need, as both are linear in
        n. A :class:`StepRun` adds its closed form, so a long ring costs memory and time linear in its size."""
        sent_total = np.zeros(self.num_nodes)
        count, load = 0, 0.0
        assert isinstance(self.steps, Steps)  # __post_init__
        for part in self.steps.parts:
            if isinstance(part, StepRun):
                sent, received, steps = _padded(part.sent, self.num_nodes), part.received, part.count
                sent_total += steps * sent
            else:
                sent, received = part.loads(self.num_nodes)
                sent_total += sent
                steps = 1
            busiest = max(float(np.amax(sent, initial=0.0)), float(np.amax(received, initial=0.0)))
            count, load = count + steps, load + steps * busiest
        return sent_total, count, load

    def placed_terms(self, local: int) -> dict[Placed, int]:
        """The steps placed ``local`` workers per node (worker ``r`` on node ``r // local``, a helper on its GPU in
        :attr:`gpus`), as each distinct :meth:`Step.placed` and how many steps have it (memoized per ``local``);
        steps in which no transfer leaves its GPU are left out. A run is read in closed form where it can be
        (:class:`StepRun`), so a long ring still costs time linear in its size."""
        if local < 1:
            raise PlansimError(f"schedule {self.name}: local (workers per node) must be at least 1, got {local}")
        terms = self._placed_terms.get(local)
        if terms is None:
            terms = {}
            assert isinstance(self.steps, Steps)  # __post_init__
            for part in self.steps.parts:
                for placed, count in _placed_part(part, self.gpus if self.num_nodes > self.p else None, local):
                    if placed is not None:
                        terms[placed] = terms.get(placed, 0) + count
            self._placed_terms[local] = terms
        return terms

    @property
    def transfers(self) -> int:
        """Point-to-point transfers over all steps, counted without building a run's steps (what iterating the
        schedule costs: the discrete-event engine walks every transfer).

        >>> Schedule("x", p=2, steps=(Step([0, 1], [1, 0], [0.0, 0.0], [1.0, 1.0]),)).transfers
        2
        """
        assert isinstance(self.steps, Steps)  # __post_init__
        return sum(p.count * p.transfers if isinstance(p, StepRun) else len(p.src) for p in self.steps.parts)

    @property
    def distinct_transfers(self) -> int:
        """Transfers over the steps that differ from the step before: what the discrete-event engine walks when it
        bundles consecutive identical steps into one phase (a ``uniform`` run is one step's worth); an upper bound,
        as steps of different runs may bundle too."""
        assert isinstance(self.steps, Steps)  # __post_init__
        return sum(
            (p.transfers if p.uniform else p.count * p.transfers) if isinstance(p, StepRun) else len(p.src)
            for p in self.steps.parts
        )

    def bytes_sent(self, n_bytes: float) -> NDArray[np.float64]:
        """Bytes each node sends over the whole schedule (length ``num_nodes``)."""
        return self._totals[0] * n_bytes

    def total_bytes(self, n_bytes: float) -> float:
        """Bytes sent by all nodes together."""
        return float(self._totals[0].sum() * n_bytes)

    def time(
        self,
        n_bytes: float,
        alpha_s: float,
        bandwidth_Bps: float,
        inter: tuple[float, float] | None = None,
        local: int | None = None,
    ) -> float:
        """Alpha-beta time in seconds.

        Without ``local``, every transfer on the one link (``alpha_s``, ``bandwidth_Bps``), each node a machine of
        its own (a helper too): the textbook closed forms. With ``local`` workers per node, placed as
        :meth:`placed_terms` says, each step's transfers go over the links they cross: a GPU's transfers to GPUs of
        its own node over its node-local link (``alpha_s``, ``bandwidth_Bps``), those to other nodes over its
        inter-node link (``inter=(alpha_s, bandwidth_Bps)``; default the node-local one), both at once. A step
        ends when the busiest GPU is done on its busiest link, and pays the inter-node latency if any transfer
        crosses nodes, else the node-local one.

        >>> s = Schedule("x", p=4, steps=(Step([0, 1, 2], [2, 2, 3], [0.0] * 3, [1.0] * 3),))
        >>> s.time(1.0, 0.0, 1.0), s.time(1.0, 0.0, 1.0, inter=(0.0, 0.5), local=2)  # GPU 2 receives 2 over its NIC
        (2.0, 4.0)
        """
        intra = (alpha_s, bandwidth_Bps)
        links = (intra, inter if inter is not None else intra)
        for name, (alpha, bandwidth) in zip(("node-local", "inter-node"), links, strict=True):
            if bandwidth <= 0 or alpha < 0:
                raise PlansimError(f"{name} link needs bandwidth_Bps > 0 and alpha_s >= 0, got {bandwidth}, {alpha}")
        if local is None:
            _, count, load = self._totals
            return count * alpha_s + load * n_bytes / bandwidth_Bps if count else 0.0
        (a_in, bw_in), (a_x, bw_x) = links
        return sum(
            count * ((a_x if crosses else a_in) + n_bytes * max(on_node / bw_in, across / bw_x))
            for (crosses, on_node, across), count in self.placed_terms(local).items()
        )


def locked_array(arr: NDArray) -> NDArray:
    """``arr`` marked read-only (a schedule's arrays are shared through caches)."""
    arr.setflags(write=False)
    return arr


def _placed_part(
    part: Step | StepRun, gpus: NDArray[np.int64] | None, local: int
) -> Iterator[tuple[Placed | None, int]]:
    """(placed step, how many steps) of one part of a schedule: a run by its closed form or first step if it can."""
    if not isinstance(part, StepRun):
        yield part.placed(gpus, local), 1
    elif part.placed is not None:
        yield part.placed(local), part.count
    elif part.same_pairs:
        yield part.step(0).placed(gpus, local), part.count
    else:
        for i in range(part.count):
            yield part.step(i).placed(gpus, local), 1


def _padded(values: NDArray[np.float64], length: int) -> NDArray[np.float64]:
    """``values`` with zeros appended up to ``length`` (nodes a run does not involve send nothing)."""
    if len(values) > length:
        raise PlansimError(f"schedule step run covers {len(values)} nodes, more than the schedule's {length}")
    return np.concatenate([values, np.zeros(length - len(values))]) if len(values) < length else values


def _bounds(fractions: NDArray[np.float64], length: int) -> NDArray[np.int64]:
    """Element index of each fraction; equal fractions always map to the same index, so chunks tile exactly."""
    return np.rint(fractions * length).astype(np.int64)


def simulate(s: Schedule, inputs: list[NDArray]) -> list[NDArray[np.float64]]:
    """Run the schedule on real data and return each worker's final buffer.

    Every node holds a buffer as long as the inputs (helper nodes start at zero). Before each step the source
    chunks are copied, so transfers within a step see the buffers as they were when the step began.

    Parameters
    ----------
    s : Schedule
        The schedule to run.
    inputs : list of 1-D arrays
        One buffer per worker, all the same length.

    Returns
    -------
    list of 1-D float arrays
        Each worker's buffer after the last step.

    Examples
    --------
    >>> s = Schedule("all_reduce/pair", p=2, steps=(Step([0, 1], [1, 0], [0.0, 0.0], [1.0, 1.0], reduce=True),))
    >>> [b.tolist() for b in simulate(s, [np.array([1.0, 2.0]), np.array([10.0, 20.0])])]
    [[11.0, 22.0], [11.0, 22.0]]
    """
    if len(inputs) != s.p:
        raise PlansimError(f"simulate: {s.name} has {s.p} workers, got {len(inputs)} input buffers")
    length = len(inputs[0]) if inputs else 0
    if any(np.ndim(x) != 1 or len(x) != length for x in inputs):
        raise PlansimError("simulate: inputs must be 1-D arrays of one length")
    buffers = [np.array(x, dtype=np.float64) for x in inputs]
    buffers += [np.zeros(length) for _ in range(s.num_nodes - s.p)]
    sources = [b.copy() for b in buffers] if s.out_of_place else buffers
    for step in s.steps:
        _apply(step, sources, buffers, length)
    return buffers[: s.p]


def _apply(step: Step, sources: list[NDArray], buffers: list[NDArray], length: int) -> None:
    """Move one step's chunks: snapshot every source chunk first, then add or write them into their destinations."""
    lo, hi = _bounds(step.lo, length), _bounds(step.hi, length)
    at = lo if step.dst_lo is None else _bounds(step.dst_lo, length)
    chunks = [sources[src][a:b].copy() for src, a, b in zip(step.src, lo, hi, strict=True)]
    for dst, start, chunk in zip(step.dst, at, chunks, strict=True):
        target = buffers[dst][start : start + len(chunk)]
        if step.reduce:
            target += chunk
        else:
            target[:] = chunk
