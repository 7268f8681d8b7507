"""The search: frame every candidate with the analytic engine (``analytic.step_frame``: its memory, exact, and lower
bounds on its step time), drop what does not fit (counting why) without pricing its time, price in full, in order of
their bounds, only the candidates whose bound could still rank them among the best K or as a candidate the
explanation reads (``_Bounds``; the rest are ``SearchOutcome.pruned``, with their bounds), rank by the objective,
re-simulate the best K with the discrete-event engine and rank the finalists by that. Three refinements
are priced for the finalists only: Megatron-LM's ``--tp-comm-overlap`` where their framework runs it (unless the
constraints fix it: ``Constraints.tp_comm_overlap``), the layer split that balances the pipeline stages' time
(``split``), and ``remat: milp`` for those that recompute (where its schedule would fill what the stage leaves, on an
explicit ``remat_budget`` that leaves the headroom free: ``_within_headroom``).

Ranking (``ranked``): by the objective; plans within ``TIE`` of each other tie, and between them the one with the
lower peak memory ranks first, then the earlier in ``space.candidates`` order. A candidate that leaves less of the
GPU's memory free at its peak than ``Constraints.headroom`` is rejected with its own reason (kept in
``SearchOutcome.tight`` for the explanation). Finalists are distinct in what matters: a candidate that differs from
a better-ranked one only in its settings (``SETTINGS``: ZeRO stage, sequence parallelism, recomputation, the
all-reduce, ...) and prices alike within ``TIE`` in both step time and peak memory is its twin, left out and counted
(``SearchOutcome.equivalents``).

Deterministic: ties are broken by the ``space.candidates`` order, and pruning changes no outcome (its rule is exact;
``tests/test_pruning.py`` holds it to pricing everything). ``jobs > 1``
prices chunks of the space, and runs the finalists' discrete-event simulations, in worker processes; the outcome is
the same. Pricing shares one ``AnalyticCache`` per cluster (with ``--robust``, one per worst corner, ``_Pricing``)
with the cyclic garbage collector paused (``plansim.gc_pause``); the ``--tp-comm-overlap`` twins a finalist was priced
against are kept in ``SearchOutcome.overlap_tried`` for the explanation.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import TypeVar

from plansim.analytic import AnalyticCache, StepFrame, assemble_result, step_frame
from plansim.errors import PlansimError
from plansim.gc_pause import gc_paused
from plansim.hardware import Cluster
from plansim.pipeline.stages import EMBEDDING_LAYER, chunk_blocks
from plansim.planner.space import Constraints, candidates
from plansim.planner.split import balanced_chunks, balanced_split, bottleneck
from plansim.result import Result
from plansim.step.layers import rerun
from plansim.strategy.frameworks import load_framework
from plansim.strategy.schema import Strategy
from plansim.workload import ModelSpec

__all__ = [
    "ACTIVATIONS_EXCEED",
    "OBJECTIVES",
    "SETTINGS",
    "STATES_EXCEED",
    "TIE",
    "Finalist",
    "Priced",
    "SearchOutcome",
    "alike",
    "des_figures",
    "des_result",
    "differing_settings",
    "headroom_reason",
    "ranked",
    "search",
]

T = TypeVar("T")

#: Objective name -> sort key of a Result (smaller is better). With the GPU count and batch fixed, step time,
#: tokens/s and cost per token order candidates alike; they differ when plans are compared across clusters.
OBJECTIVES: dict[str, Callable[[Result], float]] = {
    "step_time": lambda r: r.step_time_s,
    "tokens_per_s": lambda r: -r.tokens_per_s,
    "cost": lambda r: r.step_time_s * r.gpus / max(r.tokens_per_s * r.step_time_s, 1e-300),
}


#: Two plans tie when their objectives (step time, or what ranks as it) differ by at most this fraction; between
#: them the lower peak memory ranks first, and two that also peak within it price alike (twins, when they differ only
#: in ``SETTINGS``). Why 0.1 %: it is an order of magnitude inside the 1 % within which the analytic engine and the
#: discrete-event engine, both exact models of the same step, are held to agree (ARCHITECTURE.md), so a smaller gain
#: is not one this model can tell from its own approximations; it is also the resolution the explanation states a
#: gain at (one decimal of a percent). At 1 s per step it is 1 ms; of 80 GB it is 80 MB.
TIE = 1e-3

#: Strategy fields that leave a plan's placement (the parallel degrees, micro-batch, schedule, layer split and
#: framework) as it is: candidates that differ only in these and price alike are twins.
SETTINGS = (
    "zero", "dp_shard", "sequence_parallel", "tp_comm_overlap", "remat", "remat_budget", "remat_granularity",
    "remat_time_limit_s", "dp_algorithm",
)  # fmt: skip

#: The settings a twin's description names (the remat solver's own knobs go with ``remat``).
_NAMED = ("zero", "dp_shard", "sequence_parallel", "tp_comm_overlap", "remat", "dp_algorithm")


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TIE * max(abs(a), abs(b))


def alike(a: Result, b: Result) -> bool:
    """Whether two results price alike: step times and peak memories each within ``TIE`` of each other.

    >>> from types import SimpleNamespace as R
    >>> alike(R(step_time_s=1.0, peak_memory_bytes=50e9), R(step_time_s=1.0009, peak_memory_bytes=50.04e9))
    True
    >>> alike(R(step_time_s=1.0, peak_memory_bytes=50e9), R(step_time_s=1.0, peak_memory_bytes=45e9))
    False
    """
    return _close(a.step_time_s, b.step_time_s) and _close(a.peak_memory_bytes, b.peak_memory_bytes)


def ranked(items: Iterable[T], key: Callable[[Result], float], result: Callable[[T], Result],
           later: Callable[[T], tuple[object, ...]]) -> list[T]:  # fmt: skip
    """``items`` best first: by ``key`` of their ``result``; those within ``TIE`` of the best of their run (each
    run begins at the best item not yet placed) by lower peak memory, then by ``key``, then ``later`` (the
    enumeration order and whatever else breaks a tie).

    >>> from types import SimpleNamespace as R
    >>> plans = [R(step_time_s=t, peak_memory_bytes=m, name=n)
    ...          for t, m, n in [(1.0, 26e9, "zero1"), (1.0004, 21e9, "zero2"), (1.01, 10e9, "slower")]]
    >>> [p.name for p in ranked(plans, lambda r: r.step_time_s, lambda p: p, lambda p: ())]
    ['zero2', 'zero1', 'slower']
    """
    ordered = sorted(items, key=lambda x: (key(result(x)), later(x)))
    out: list[T] = []
    i = 0
    while i < len(ordered):
        anchor = key(result(ordered[i]))
        j = i + 1
        while j < len(ordered) and key(result(ordered[j])) - anchor <= TIE * abs(anchor):
            j += 1
        run = ordered[i:j]
        out += sorted(run, key=lambda x: (result(x).peak_memory_bytes, key(result(x)), later(x)))
        i = j
    return out


def headroom_reason(headroom: float) -> str:
    """The rejection reason of a candidate that fits with less than ``headroom`` of memory free at its peak.

    >>> headroom_reason(0.05)
    'fits, but leaves less than 5% of memory free at the peak (--headroom 0.05)'
    """
    return f"fits, but leaves less than {headroom:.1%} of memory free at the peak (--headroom {headroom:g})".replace(
        ".0%", "%"
    )


def meets_headroom(r: Result, headroom: float) -> bool:
    """Whether ``r`` fits and leaves at least ``headroom`` of the GPU's memory free at its peak."""
    return r.fits and r.memory_margin >= headroom


@dataclass(frozen=True)
class Priced:
    """One candidate and its analytic result, with its position in the enumeration (the tie-break); ``cluster``: the
    corner of the uncertainty box it was priced at when the search ranks by the worst case (None: the cluster as
    profiled)."""

    index: int
    strategy: Strategy
    result: Result
    cluster: Cluster | None = None


@dataclass(frozen=True)
class Pruned:
    """A candidate that fits but whose step was not priced in full: its lower bound (``bound_s``,
    ``analytic.StepFrame.bound_s``) ranks it after the K-th finalist and after the best candidate of each group the
    explanation reads (``_Bounds``), so its step time could change no ranking, winner or figure. ``tight``: it fits
    with less than the headroom free. Its memory is exact (the worst stage's, by category)."""

    index: int
    strategy: Strategy
    resolved: Strategy
    bound_s: float
    memory: dict[str, float]
    peak_memory_bytes: int
    memory_margin: float
    tight: bool


class _Pricing:
    """The analytic engine over one cluster, or (a robust search) over several corners of the uncertainty box, each
    with its own ``AnalyticCache``: a strategy's result is its slowest corner's."""

    def __init__(self, model: ModelSpec, clusters: Sequence[Cluster], robust: bool = False) -> None:
        self.model = model
        self.caches = [AnalyticCache(model, c) for c in clusters]
        self.robust = robust  # the clusters are corners: a result says which one priced it

    def model_states_exceed(self, s: Strategy) -> bool:
        return self.caches[0].model_states_exceed(s)  # the uncertain inputs move time, never memory

    def price(self, s: Strategy) -> tuple[Result, Cluster | None]:
        return self.complete(self.frames(s))

    def frames(self, s: Strategy) -> list[StepFrame]:
        """``s``'s step up to its data-parallel traffic at each corner (``analytic.step_frame``): its memory (the
        first's: the uncertain inputs move time, never memory) and its bound (the slowest corner's)."""
        return [step_frame(self.model, c.cluster, s, cache=c) for c in self.caches]

    def complete(self, frames: Sequence[StepFrame]) -> tuple[Result, Cluster | None]:
        """The result of ``frames`` (``frames(s)``): the slowest corner's, and the corner when the search is
        robust."""
        if len(frames) == 1:
            return assemble_result(frames[0]), frames[0].cluster if self.robust else None
        results = [(assemble_result(f), f.cluster) for f in frames]
        return max(results, key=lambda rc: rc[0].step_time_s)


@dataclass(frozen=True)
class Finalist:
    """A finalist: its analytic result and the discrete-event engine's (None when the DES was skipped)."""

    priced: Priced
    des: Result | None

    @property
    def result(self) -> Result:
        """The result the finalists are ranked by: the DES's when it ran."""
        return self.des or self.priced.result


@dataclass
class SearchOutcome:
    """Everything the search found: the ranked finalists, every fitting candidate (analytic order), what was
    rejected and why, and how long each phase took."""

    finalists: list[Finalist]
    fitting: list[Priced]
    candidates: int
    rejected: Counter[str] = field(default_factory=Counter)
    phase_s: dict[str, float] = field(default_factory=dict)
    #: the finalists' ``tp_comm_overlap`` twins the search priced (``_with_tp_comm_overlap``), fitting or not
    overlap_tried: list[Priced] = field(default_factory=list)
    #: the headroom the candidates were held to (``Constraints.headroom``)
    headroom: float = 0.0
    #: candidates that fit but leave less than ``headroom`` free at their peak, ranked (rejected: ``headroom_reason``)
    tight: list[Priced] = field(default_factory=list)
    #: a finalist's strategy -> the candidates that differ from it only in ``SETTINGS`` and price alike (its twins,
    #: left out), in rank order
    equivalents: dict[Strategy, list[Priced]] = field(default_factory=dict)
    #: candidates that fit (with the headroom or not: ``Pruned.tight``) whose step was not priced in full, by bound
    pruned: list[Pruned] = field(default_factory=list)
    #: the candidate ``search``'s ``reference`` picked, re-simulated beside the finalists (a finalist itself, if it is
    #: one)
    reference: Finalist | None = None

    @property
    def fit_count(self) -> int:
        """Candidates that fit with the headroom free: ``fitting`` and those of them pruned."""
        return len(self.fitting) + sum(1 for p in self.pruned if not p.tight)

    @property
    def tight_count(self) -> int:
        """Candidates that fit with less than the headroom free: ``tight`` and those of them pruned."""
        return len(self.tight) + sum(1 for p in self.pruned if p.tight)

    def equivalent_to(self, s: Strategy) -> list[Priced]:
        """The twins left out for finalist ``s`` (empty for any other strategy)."""
        return self.equivalents.get(s, [])


#: The two reasons a candidate does not fit: ``AnalyticCache.model_states_exceed`` (some stage's model states
#: alone), else the priced step's activations.
STATES_EXCEED = "does not fit: weights, gradients and optimizer states alone exceed memory"
ACTIVATIONS_EXCEED = "does not fit: activations exceed what model states leave"


def search(
    model: ModelSpec,
    cluster: Cluster,
    global_batch: int,
    constraints: Constraints | None = None,
    *,
    objective: str = "step_time",
    top_k: int = 10,
    des: bool = True,
    milp: bool = True,
    splits: bool = True,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
    phase: Callable[[str], None] | None = None,
    corners: Sequence[Cluster] = (),
    groups: Sequence[Callable[[Strategy], Hashable]] = (),
    reference: Callable[[Sequence[Priced]], Priced | None] | None = None,
) -> SearchOutcome:
    """Search the space (see the module docstring). ``splits`` tries the finalists' time-balanced layer splits,
    ``milp`` their ``remat: milp``. ``progress(done, total)`` is called while pricing and while the DES runs the
    finalists; ``phase(label)`` as each phase after the pricing begins. ``corners`` (a robust search: the clusters
    of ``uncertainty.worst_corners``) prices every candidate at each and ranks by the slowest; the DES re-simulates
    a finalist at its slowest corner. ``groups`` (each a strategy's group, None for none): the best candidate of each
    group is priced in full, as the explanation reads it (``_Bounds``); picklable (module-level functions) where
    ``jobs > 1``. ``reference(fitting)`` picks a candidate to re-simulate beside the finalists (``SearchOutcome.
    reference``: the explanation's Megatron-style configuration)."""
    if objective not in OBJECTIVES:
        raise PlansimError(f"--objective {objective}: choose one of {', '.join(OBJECTIVES)}")
    if top_k < 1:
        raise PlansimError(f"--top {top_k}: at least one finalist")
    key = OBJECTIVES[objective]
    c = constraints or Constraints()
    began = time.perf_counter()
    space = list(candidates(model, cluster, global_batch, c))
    enumerated = time.perf_counter()
    clusters = tuple(corners) or (cluster,)
    robust = bool(corners)
    bounds = _Bounds(objective, top_k, tuple(groups), c.headroom)
    found, pricing = _price_all(model, clusters, robust, space, jobs, progress, bounds)
    analytic = time.perf_counter()
    rejected: Counter[str] = Counter(found.errors)
    if found.too_big:
        rejected[ACTIVATIONS_EXCEED] += found.too_big
    fitting = [p for p in found.priced if meets_headroom(p.result, c.headroom)]
    tight = [p for p in found.priced if not meets_headroom(p.result, c.headroom)]
    tight_count = len(tight) + sum(1 for p in found.pruned if p.tight)
    if tight_count:
        rejected[headroom_reason(c.headroom)] += tight_count
    fitting = _ranked_priced(fitting, key)
    chosen = _without_twins(fitting, top_k)
    say = phase or (lambda label: None)
    tried: list[Priced] = []
    refined: list[Priced] = []  # the variants the refinements priced that meet the headroom
    if c.tp_comm_overlap is None and any(_overlappable(p.strategy) for p in chosen):
        say("trying --tp-comm-overlap on the finalists")
        chosen = _with_tp_comm_overlap(pricing, chosen, key, top_k, tried, c.headroom)
        refined += [p for p in tried if meets_headroom(p.result, c.headroom)]
    if splits and chosen:
        say("balancing the finalists' layer splits")
        chosen = _with_balanced_splits(model, pricing, chosen, key, top_k, c.headroom)
    split_done = time.perf_counter()
    if milp and chosen:
        say(f"remat=milp for up to {MILP_FINALISTS} finalists")
        chosen = _with_milp(model, pricing, chosen, key, top_k, c.headroom, refined)
    milp_done = time.perf_counter()
    weights: list[int] = []
    ref = reference(fitting) if reference else None
    extra = [ref] if ref is not None and des and chosen and ref.strategy not in {p.strategy for p in chosen} else []
    if des and chosen:
        say(f"sizing the {len(chosen)} finalists' discrete-event runs")
        weights = _refuse_des_work(model, cluster, chosen, progress)
        weights += _refuse_des_work(model, cluster, extra, None, bound=False)  # the reference's is not theirs to bound
        beside = " and the reference" if extra else ""
        say(f"re-simulating the {len(chosen)} finalists{beside} with the DES (counted in tasks and transfers)")
    des_results = _des_all(model, cluster, [*chosen, *extra], des, jobs, progress, weights)
    finalists = [Finalist(p, r) for p, r in zip(chosen, des_results, strict=False)]
    same = [f for f in finalists if ref is not None and f.priced.strategy == ref.strategy]
    reference_run = same[0] if same else (Finalist(ref, des_results[-1] if extra else None) if ref else None)
    finalists = [
        *ranked((f for f in finalists if f.result.fits), key, lambda f: f.result, lambda f: (f.priced.index,)),
        *ranked((f for f in finalists if not f.result.fits), key, lambda f: f.result, lambda f: (f.priced.index,)),
    ]
    equivalents = _twins_of([f.priced for f in finalists], [*fitting, *refined])
    done = time.perf_counter()
    return SearchOutcome(
        finalists,
        fitting,
        len(space),
        rejected,
        {
            "enumerate": enumerated - began,
            "analytic": analytic - enumerated,
            "splits": split_done - analytic,
            "milp": milp_done - split_done,
            "des": done - milp_done,
        },
        tried,
        c.headroom,
        _ranked_priced(tight, key),
        equivalents,
        found.pruned,
        reference_run,
    )


def _ranked_priced(items: Iterable[Priced], key: Callable[[Result], float], *flags: str) -> list[Priced]:
    """``ranked`` for priced candidates: ties broken by the enumeration order, then by each strategy field in
    ``flags`` (False, the candidate as enumerated, before its refinement)."""
    return ranked(items, key, lambda p: p.result, lambda p: (p.index, *(bool(getattr(p.strategy, f)) for f in flags)))


#: ``jobs > 1`` runs a phase in worker processes only where its work dwarfs a process's start (forked, with its
#: caches built anew): at least ``PARALLEL_CANDIDATES`` candidates to price, in ``CHUNKS_PER_JOB`` chunks a process
#: (each chunk prunes by its own priced candidates, so fewer chunks price fewer in full; more balance the load), and
#: finalists whose discrete-event work (``des.size.des_estimate``: tasks and transfers) comes to
#: ``PARALLEL_DES_WORK``, about a second of simulation.
PARALLEL_CANDIDATES = 500
CHUNKS_PER_JOB = 2
PARALLEL_DES_WORK = 100_000

#: A bound at most this many times a step time cannot rank with it: a candidate ranks with an anchor within ``TIE``
#: of it (``ranked``; for ``tokens_per_s`` the tie is ``1 / (1 - TIE)`` in step time), a finalist refined by the
#: search (``_with_tp_comm_overlap`` and the rest) lies within that of the K-th, and a twin within ``TIE`` of a
#: finalist (``alike``); the ``1e-9`` covers the rounding of the bound's own sum.
_BEYOND = (1 + 1e-9) / (1 - TIE) ** 2


class _Bounds:
    """Which candidates that fit must have their step priced in full, given those priced so far (``add``): those
    whose lower bound (``StepFrame.bound_s``) could still rank them among the best ``top_k`` distinct candidates
    (``_without_twins``) or beside one (a twin, a tie), or as the best of one of their ``groups`` (the
    Megatron-style reference, each framework's best, a robust rival's family), or, for those that fit with less than
    the headroom, as the best of them. Every objective orders plans by step time at a fixed GPU count and batch, so
    bounds on step time rank them. A candidate priced later only lowers what is needed, but for a twin that drops
    a finalist (``_without_twins``): ``_settle`` checks the pruned against the final state."""

    def __init__(
        self, objective: str, top_k: int, groups: tuple[Callable[[Strategy], Hashable], ...], headroom: float
    ) -> None:
        self.objective, self.top_k, self.groups, self.headroom = objective, top_k, groups, headroom
        self.contenders: list[Priced] = []
        self.best: dict[tuple[int, Hashable], float] = {}
        self.tight_best = math.inf
        self._kth: float | None = math.inf

    def fresh(self) -> _Bounds:
        """The same rule with nothing priced."""
        return _Bounds(self.objective, self.top_k, self.groups, self.headroom)

    def add(self, p: Priced) -> None:
        t = p.result.step_time_s
        if not meets_headroom(p.result, self.headroom):
            self.tight_best = min(self.tight_best, t)
            return
        self.contenders.append(p)
        if self._kth is None or t <= self._kth * _BEYOND:  # else it ranks after the K-th and changes nothing
            self._kth = None
        for n, group in enumerate(self.groups):
            g = group(p.strategy)
            if g is not None:
                self.best[n, g] = min(self.best.get((n, g), math.inf), t)

    def kth(self) -> float:
        """The slowest of the best ``top_k`` distinct candidates priced so far (inf before there are ``top_k``)."""
        if self._kth is None:
            chosen = _without_twins(_ranked_priced(self.contenders, OBJECTIVES[self.objective]), self.top_k)
            self._kth = max(p.result.step_time_s for p in chosen) if len(chosen) == self.top_k else math.inf
        return self._kth

    def needed(self, s: Strategy, bound: float, tight: bool) -> bool:
        """Whether a candidate with lower bound ``bound`` must be priced in full."""
        if tight:
            return bound <= self.tight_best * _BEYOND
        if bound <= self.kth() * _BEYOND:
            return True
        for n, group in enumerate(self.groups):
            g = group(s)
            if g is not None and bound <= self.best.get((n, g), math.inf) * _BEYOND:
                return True
        return False


@dataclass(frozen=True)
class _Framed:
    """A candidate that fits, its step framed (``_Pricing.frames``) and not yet priced in full, with the best lower
    bound on its step time known so far."""

    index: int
    strategy: Strategy
    frames: list[StepFrame]
    bound: float
    tight: bool

    def pruned(self) -> Pruned:
        f = self.frames[0]
        return Pruned(self.index, self.strategy, f.s, self.bound, f.memory(), f.peak_memory_bytes, f.memory_margin,
                      self.tight)  # fmt: skip


@dataclass
class _Found:
    """What pricing the space found: the candidates priced in full (fitting), the pruned, how many do not fit
    (activations), and the candidates that cannot run, by reason."""

    priced: list[Priced] = field(default_factory=list)
    pruned: list[Pruned] = field(default_factory=list)
    too_big: int = 0
    errors: Counter[str] = field(default_factory=Counter)


def _price_all(
    model: ModelSpec,
    clusters: tuple[Cluster, ...],
    robust: bool,
    space: Sequence[Strategy],
    jobs: int,
    progress: Callable[[int, int], None] | None,
    bounds: _Bounds,
) -> tuple[_Found, _Pricing]:
    """Every candidate's memory, then the step of those that fit and could matter (``_Bounds``), in ``jobs``
    processes by chunks of the space (each prunes by its own; ``_settle`` by all); with the pricing whose caches
    the later phases share (this process's, warm where it priced)."""
    if jobs > 1 and len(space) >= PARALLEL_CANDIDATES:
        size = math.ceil(len(space) / (CHUNKS_PER_JOB * jobs))
        chunks = [(model, clusters, robust, list(space[i : i + size]), i, bounds) for i in range(0, len(space), size)]
        found, pricing = _Found(), _Pricing(model, clusters, robust)
        done = 0
        # unpickling the workers' results makes thousands of objects: with the collector running that took 30 times
        # as long (0.95 s against 0.03 s for the README plan's four chunks)
        with gc_paused(), ProcessPoolExecutor(max_workers=jobs) as pool:
            for part, n in zip(pool.map(_price_chunk, chunks), (len(ch[3]) for ch in chunks), strict=True):
                found.priced += part.priced
                found.pruned += part.pruned
                found.too_big += part.too_big
                found.errors.update(part.errors)
                done += n
                if progress:
                    progress(done, len(space))
    else:
        pricing = _Pricing(model, clusters, robust)
        found = _price_chunk((model, clusters, robust, list(space), 0, bounds), progress, len(space), pricing)
    _settle(found, pricing, clusters, bounds.fresh())
    found.priced.sort(key=lambda p: p.index)
    found.pruned.sort(key=lambda p: (p.bound_s, p.index))
    return found, pricing


def _price_chunk(
    job: tuple[ModelSpec, tuple[Cluster, ...], bool, list[Strategy], int, _Bounds],
    progress: Callable[[int, int], None] | None = None,
    total: int = 0,
    pricing: _Pricing | None = None,
) -> _Found:
    model, clusters, robust, strategies, offset, bounds = job
    with gc_paused():
        pricing = pricing or _Pricing(model, clusters, robust)
        found = _Found()
        framed = _frame_strategies(pricing, strategies, offset, progress, total, found, bounds.headroom)
        _price_framed(pricing, framed, bounds.fresh(), found)
        return found


def _frame_strategies(
    pricing: _Pricing,
    strategies: list[Strategy],
    offset: int,
    progress: Callable[[int, int], None] | None,
    total: int,
    found: _Found,
    headroom: float,
) -> list[_Framed]:
    """Each strategy's step up to its data-parallel traffic: what does not fit is counted and dropped (model states
    first, without pricing the step), what fits is kept with its bound and memory."""
    clusters = [c.cluster for c in pricing.caches]
    framed = []
    step = max(1, len(strategies) // 200)
    for k, s in enumerate(strategies):
        try:
            resolved = s.resolve(clusters[0])  # once, for both calls
            if pricing.model_states_exceed(resolved):  # no activations can make it fit: the step is not priced
                found.errors[STATES_EXCEED] += 1
            else:
                frames = pricing.frames(resolved)
                first = frames[0]
                if not first.fits:
                    found.too_big += 1
                else:
                    tight = first.memory_margin < headroom
                    framed.append(_Framed(offset + k, s, frames, max(f.least_s() for f in frames), tight))
        except PlansimError as exc:
            found.errors[f"cannot run: {str(exc).split(';')[0]}"] += 1
        if progress and (k % step == 0 or k + 1 == len(strategies)):
            progress(k + 1, total)
    return framed


def _price_framed(pricing: _Pricing, framed: list[_Framed], bounds: _Bounds, found: _Found) -> None:
    """Price in full, in order of their least bounds (``StepFrame.least_s``), the framed candidates ``bounds`` needs
    by their pipelines' bounds (``StepFrame.bound_s``, priced only for those the least bound does not rule out);
    prune the rest."""
    for f in sorted(framed, key=lambda f: (f.bound, f.index)):
        if bounds.needed(f.strategy, f.bound, f.tight):
            f = dataclasses.replace(f, bound=max(x.bound_s() for x in f.frames))
            if bounds.needed(f.strategy, f.bound, f.tight):
                result, corner = pricing.complete(f.frames)
                p = Priced(f.index, f.strategy, result, corner)
                found.priced.append(p)
                bounds.add(p)
                continue
        found.pruned.append(f.pruned())


def _settle(found: _Found, pricing: _Pricing, clusters: tuple[Cluster, ...], bounds: _Bounds) -> None:
    """Price in full every pruned candidate that the rule, over everything priced (every chunk's), still needs,
    until none is: what each chunk pruned by its own candidates, and what a twin's cascade re-opened."""
    for p in found.priced:
        bounds.add(p)
    while todo := [u for u in found.pruned if bounds.needed(u.strategy, u.bound_s, u.tight)]:
        for u in sorted(todo, key=lambda u: (u.bound_s, u.index)):
            found.pruned.remove(u)
            result, corner = pricing.price(u.strategy.resolve(clusters[0]))
            p = Priced(u.index, u.strategy, result, corner)
            found.priced.append(p)
            bounds.add(p)


def _placement(s: Strategy) -> tuple[object, ...]:
    """A strategy less its ``SETTINGS``: what twins share."""
    rest = s.model_dump(exclude=set(SETTINGS))
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(rest.items()))


def _without_twins(fitting: list[Priced], top_k: int) -> list[Priced]:
    """The best ``top_k`` of ``fitting`` (ranked), leaving out each twin of an earlier one: a candidate that differs
    from it only in ``SETTINGS`` and prices alike (``alike``: ZeRO-0 beside ZeRO-1 where sharding the optimizer
    states saves nothing that matters; ``ring`` beside ``nccl`` where NCCL picks the ring; a ``remat: milp`` schedule
    that recomputes nothing beside ``remat: none``): the DES would re-simulate one plan twice and the runner-up would
    be the winner again. The earlier one stays."""
    chosen: list[Priced] = []
    by_placement: dict[tuple[object, ...], list[Priced]] = {}
    for p in fitting:
        if len(chosen) == top_k:
            break
        same = by_placement.setdefault(_placement(p.strategy), [])
        if any(alike(p.result, q.result) for q in same):
            continue
        same.append(p)
        chosen.append(p)
    return chosen


def _twins_of(finalists: Sequence[Priced], pool: Iterable[Priced]) -> dict[Strategy, list[Priced]]:
    """Each finalist's twins in ``pool`` (every candidate that fits, and the refinements' variants), each counted for
    the first finalist it is a twin of; only candidates whose step time lies within ``TIE`` of a finalist's are
    compared field by field."""
    out: dict[Strategy, list[Priced]] = {}
    mine = {p.strategy for p in finalists}
    times = [p.result.step_time_s for p in finalists]
    places: list[tuple[object, ...] | None] = [None] * len(finalists)
    for q in pool:
        if q.strategy in mine or not any(_close(q.result.step_time_s, t) for t in times):
            continue
        where = _placement(q.strategy)
        for k, p in enumerate(finalists):
            if places[k] is None:
                places[k] = _placement(p.strategy)
            if places[k] == where and alike(q.result, p.result):
                twins = out.setdefault(p.strategy, [])
                if all(t.strategy != q.strategy for t in twins):
                    twins.append(q)
                break
    return out


def differing_settings(s: Strategy, twins: Sequence[Strategy]) -> str:
    """The settings in which ``twins`` differ from ``s``, each with ``s``'s value first: ``zero=0/1``.

    >>> s = Strategy(dp=8, zero=1)
    >>> twins = [s.model_copy(update={"zero": 0}), s.model_copy(update={"zero": 0, "dp_algorithm": "ring"})]
    >>> differing_settings(s, twins)
    'zero=1/0, dp_algorithm=nccl/ring'
    """
    parts = []
    for name in _NAMED:
        values = [getattr(s, name)]
        for t in twins:
            if getattr(t, name) not in values:
                values.append(getattr(t, name))
        if len(values) > 1:
            parts.append(f"{name}={'/'.join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)}")
    return ", ".join(parts)


#: ``remat: milp`` is tried for this many of the best finalists that recompute, whose stages hold at most
#: ``MILP_MAX_BLOCKS`` blocks. GPT-3 175B's 24-block stages (pp 4) took 102 s for three finalists in
#: benchmarks/bench_plan.py, longer than the rest of the search; 8-block stages (megatron-1t at pp 16) 29 s.
MILP_FINALISTS = 3
MILP_MAX_BLOCKS = 12


def _with_milp(
    model: ModelSpec,
    pricing: _Pricing,
    chosen: list[Priced],
    key: Callable[[Result], float],
    top_k: int,
    headroom: float,
    refined: list[Priced],
) -> list[Priced]:
    """The finalists plus, for the best ``MILP_FINALISTS`` that recompute (stages of at most ``MILP_MAX_BLOCKS``
    blocks), the same strategy with ``remat: milp`` (the Checkmate MILP per stage within the memory the stage
    leaves), kept when it fits with ``headroom`` (appended to ``refined``); the best ``top_k`` of all, a schedule
    that recomputes nothing left out as the twin of ``remat: none`` (``_without_twins``)."""
    out = list(chosen)
    seen = {p.strategy for p in chosen}
    eligible = [p for p in chosen if p.strategy.remat != "none" and _most_blocks(model, p.strategy) <= MILP_MAX_BLOCKS][
        :MILP_FINALISTS
    ]
    for p in eligible:
        s = p.strategy.model_copy(update={"remat": "milp"})
        if s in seen:
            continue
        seen.add(s)
        try:
            r, corner = pricing.price(s)
            if r.fits and not meets_headroom(r, headroom):  # the schedule filled what the stage leaves
                s, (r, corner) = _within_headroom(pricing, s, r, headroom)
        except PlansimError:
            continue
        if meets_headroom(r, headroom):
            out.append(Priced(p.index, s, r, corner))
            refined.append(out[-1])
    return _without_twins(ranked(out, key, lambda q: q.result, lambda q: (q.index, q.strategy.remat == "milp")), top_k)


def _within_headroom(
    pricing: _Pricing, s: Strategy, r: Result, headroom: float
) -> tuple[Strategy, tuple[Result, Cluster | None]]:
    """``s`` (``remat: milp`` on its default budget, what each stage leaves, whose peak ``r`` leaves less than
    ``headroom`` free) again on an explicit activation budget (``remat_budget``, every stage's) short by the missing
    bytes of what its schedule held: the held bytes are its activations less those of a schedule with no budget
    (everything recomputed that can be), and each try lowers the budget by what is still missing, at most
    ``_HEADROOM_TRIES`` times; the caller checks the last result. Written into the strategy, the budget makes the
    winner reproducible."""
    capacity = r.peak_memory_bytes / (1 - r.memory_margin)

    def missing(x: Result) -> float:
        return x.peak_memory_bytes - capacity * (1 - headroom)

    floor, _ = pricing.price(s.model_copy(update={"remat_budget": 0.0}))
    held = float(r.memory_breakdown_bytes.get("activations", 0) - floor.memory_breakdown_bytes.get("activations", 0))
    budget, t = held, s
    priced: tuple[Result, Cluster | None] = (r, None)
    for _ in range(_HEADROOM_TRIES):
        budget = float(math.floor(max(0.0, budget - missing(priced[0]))))
        t = s.model_copy(update={"remat_budget": budget})
        priced = pricing.price(t)
        if meets_headroom(priced[0], headroom) or budget == 0.0:
            break
    return t, priced


#: Tries at a ``remat: milp`` budget that leaves the headroom free (``_within_headroom``): each is a MILP solve per
#: stage, and the held bytes fall about as the budget does, so one usually suffices.
_HEADROOM_TRIES = 3


def _with_tp_comm_overlap(
    pricing: _Pricing,
    chosen: list[Priced],
    key: Callable[[Result], float],
    top_k: int,
    tried: list[Priced],
    headroom: float,
) -> list[Priced]:
    """The finalists plus, for each with sequence parallelism under a framework that pipelines GEMMs with their
    tensor-parallel collectives (its ``tp_comm_overlap`` rule: Megatron-LM), the same strategy with
    ``tp_comm_overlap``, kept when it fits with ``headroom``; the best ``top_k`` of all, twins left out. Searching it
    over the whole space would price every sequence-parallel candidate twice for a choice that changes only the
    blocks' tensor-parallel overlap. Each twin priced is appended to ``tried``."""
    out = list(chosen)
    seen = {p.strategy for p in chosen}
    for p in chosen:
        if not _overlappable(p.strategy):
            continue
        t = p.strategy.model_copy(update={"tp_comm_overlap": True})
        if t in seen:
            continue
        seen.add(t)
        try:
            r, corner = pricing.price(t)
        except PlansimError:  # a model whose blocks Megatron-LM does not overlap (check_strategy says so)
            continue
        tried.append(Priced(p.index, t, r, corner))
        if meets_headroom(r, headroom):
            out.append(tried[-1])
    return _without_twins(_ranked_priced(out, key, "tp_comm_overlap"), top_k)


def _overlappable(s: Strategy) -> bool:
    """Whether ``s`` could run with ``tp_comm_overlap`` and does not: sequence parallel, under a framework whose rule
    pipelines GEMMs with their tensor-parallel collectives."""
    pipelined = load_framework(s.framework).rules.tp_comm_overlap.value
    return not s.tp_comm_overlap and s.sequence_parallel and pipelined is not None


def _with_balanced_splits(
    model: ModelSpec,
    pricing: _Pricing,
    chosen: list[Priced],
    key: Callable[[Result], float],
    top_k: int,
    headroom: float,
) -> list[Priced]:
    """The finalists plus, for each with pipeline stages and no split of its own, the same strategy with the layer
    split that balances its stages' per-micro-batch time (the embedding on the first stage's first chunk and the
    output layer on the last stage's last chunk counted): blocks per stage (``split.balanced_split``), or, with
    interleaved chunks, blocks per chunk in model order (``split.balanced_chunks``: Megatron-LM runs it as a
    ``--pipeline-model-parallel-layout``, torchtitan as ``module_fqns_per_model_part``), where that split is not the
    even one and the result fits with ``headroom``, priced by the analytic engine (an uneven interleaved split's
    order run pass by pass); the best ``top_k`` of all."""
    out = list(chosen)
    seen = {p.strategy for p in chosen}
    for p in chosen:
        s = p.strategy
        if s.pp == 1 or s.layer_split is not None or not load_framework(s.framework).rules.layer_split.value:
            continue  # a framework placing the blocks itself runs the even split only (its layer_split rule)
        split = _balanced(model, pricing.caches[0], s)
        if split is None:
            continue
        t = s.model_copy(update={"layer_split": split})
        if t in seen:
            continue
        seen.add(t)
        r, corner = pricing.price(t)
        if meets_headroom(r, headroom):
            out.append(Priced(p.index, t, r, corner))
    return _without_twins(_ranked_priced(out, key, "layer_split"), top_k)


def _balanced(model: ModelSpec, cache: AnalyticCache, s: Strategy) -> tuple[int, ...] | None:
    """The time-balanced split of ``s``'s blocks over its stages (over its model chunks, in model order, where it
    interleaves them), or None where the even split is as good."""
    costs = cache.priced(s.resolve(cache.cluster)).costs

    def seconds(i: int) -> float:
        c = costs.get(i)
        if c is None:
            return 0.0
        again = rerun(s.remat, [c], start=i) if 0 <= i < model.layers else None  # remat reruns blocks only
        busy = c.fwd_s + c.bwd_s + c.comm_fwd_s + c.comm_bwd_s + c.interference_s
        return busy + (again.compute_s + again.tp_comm_s if again else 0.0)

    blocks = [seconds(i) for i in range(model.layers)]
    first, last = seconds(EMBEDDING_LAYER), seconds(model.layers)
    v = s.virtual_stages
    even = chunk_blocks(model.layers, s.pp, v)
    split = balanced_chunks(blocks, first, last, s.pp, v) if v > 1 else balanced_split(blocks, first, last, s.pp)
    if bottleneck(split, blocks, first, last, s.pp) >= bottleneck(even, blocks, first, last, s.pp) * (1 - 1e-9):
        return None
    return tuple(split)


def _most_blocks(model: ModelSpec, s: Strategy) -> int:
    """Blocks on the most loaded pipeline stage (its layer split, else the even one), over all its model chunks."""
    if s.layer_split is None:
        return math.ceil(model.layers / s.pp)
    sizes = chunk_blocks(model.layers, s.pp, s.virtual_stages, s.layer_split)
    return max(sum(sizes[stage :: s.pp]) for stage in range(s.pp))


def des_result(model: ModelSpec, cluster: Cluster, s: Strategy, presized: bool = False) -> Result:
    """One strategy through the discrete-event engine (symmetric mode), as the finalists are re-simulated;
    ``presized``: its work is known to be within the bound (``_des_all``: its ceiling), so it is lowered at once."""
    from plansim.des.engine import simulate_des

    return simulate_des(model, cluster, s, presized=presized)


def des_figures(model: ModelSpec, cluster: Cluster, s: Strategy, presized: bool = False) -> Result:
    """A finalist's discrete-event result without its timeline: a large step's spans run to millions of objects,
    which ten finalists would hold in memory and a worker process would pickle back (``des_result`` on the chosen
    strategy gives the timeline)."""
    return dataclasses.replace(des_result(model, cluster, s, presized), timeline=None)


def _des(job: tuple[ModelSpec, Cluster, Strategy, bool]) -> Result:
    return des_figures(*job)


def _refuse_des_work(
    model: ModelSpec,
    cluster: Cluster,
    chosen: Sequence[Priced],
    progress: Callable[[int, int], None] | None = None,
    bound: bool = True,
) -> list[int]:
    """Each finalist's discrete-event work (tasks and transfers), refused with a ``PlansimError`` before the first run
    when they come to more than ``PLANSIM_MAX_FINALIST_TASKS`` together (naming the ``--top`` that fits; not with
    ``bound`` false); a finalist the DES cannot run counts nothing (its own run says why). The works are their
    ceilings (``des.size.des_ceiling``, one small lowering each) where those are within the bound, else their
    estimates (``des_estimate``)."""
    from plansim.des.size import des_ceiling, des_estimate
    from plansim.limits import refuse_work, work_bound

    def works(size: Callable[[ModelSpec, Cluster, Strategy], int]) -> list[int]:
        out = []
        for p in chosen:
            try:
                out.append(size(model, p.cluster or cluster, p.strategy.resolve(p.cluster or cluster)))
            except PlansimError:
                out.append(0)
            if progress:
                progress(len(out), len(chosen))
        return out

    most = work_bound("finalist_tasks")
    weights = works(des_ceiling)
    if not bound or sum(weights) <= most:
        return weights
    weights = works(des_estimate)
    total = sum(weights)
    if total > most:
        top = next(k for k in range(len(weights) + 1) if k == len(weights) or sum(weights[: k + 1]) > most)
        fewer = f"use --top {top}" if top else "use a smaller model or batch"
        refuse_work(
            "finalist_tasks", total, f"re-simulating the {len(chosen)} finalists with the discrete-event engine",
            f"{fewer} or --no-des",
        )  # fmt: skip
    return weights


def _des_all(
    model: ModelSpec,
    cluster: Cluster,
    chosen: Sequence[Priced],
    des: bool,
    jobs: int,
    progress: Callable[[int, int], None] | None = None,
    weights: Sequence[int] = (),
) -> list[Result | None]:
    """The discrete-event results of the finalists (None each without ``des``), in ``jobs`` processes, the largest
    started first; ``progress(done, total)`` after each, counted in ``weights`` (each finalist's work; default one
    each), so that the time left can be estimated from the rate."""
    if not des:
        return [None] * len(chosen)
    from plansim.limits import work_bound

    # a finalist whose work (its ceiling, ``_refuse_des_work``) is within the run's bound is lowered once
    known = len(weights) == len(chosen)
    most = work_bound("des_tasks")
    work = [(model, p.cluster or cluster, p.strategy, known and 0 < weights[k] <= most) for k, p in enumerate(chosen)]
    sizes = [max(1, w) for w in weights] if known else [1] * len(work)
    total = sum(sizes)
    out: list[Result | None] = [None] * len(work)
    done = 0
    if jobs > 1 and len(work) > 1 and total >= PARALLEL_DES_WORK:
        with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
            largest = sorted(range(len(work)), key=lambda k: (-sizes[k], k))
            futures = {pool.submit(_des, work[k]): k for k in largest}
            for future in as_completed(futures):
                k = futures[future]
                out[k] = future.result()
                done += sizes[k]
                if progress:
                    progress(done, total)
        return out
    for k, w in enumerate(work):
        out[k] = _des(w)
        done += sizes[k]
        if progress:
            progress(done, total)
    return out
