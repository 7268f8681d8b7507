"""Flow-level network for the discrete-event engine: transfers share links weighted max-min fairly.

A transfer is a *bundle* of member flows that advance in lockstep at one common rate ``r`` (bytes/s per member).
``weights[l]`` is how many members cross link ``l``, so the bundle loads link ``l`` with ``weights[l] * r``. A plain
point-to-point flow has weight 1 on every link of its route; the simulator uses larger weights for the symmetric
copies of a flow sent by ranks it does not simulate, and for the member flows of one collective step.

Rates are weighted max-min fair, computed by progressive filling (Bertsekas & Gallager, *Data Networks*, 2nd ed.,
sec. 6.5.2; weighted form: every unfrozen bundle's rate rises together, link ``l`` saturates when
``sum(w * r) == capacity``, and the bundles that cross a saturated link freeze at the rate they reached). The result
is characterised by: every bundle has a bottleneck link, one that is saturated and on which no bundle has a higher
rate (ibid., sec. 6.5.2, "bottleneck link" condition).

Events happen only when a transfer starts or ends (flow-level simulation, as in SimGrid's fluid model: Velho et al.,
"On the validity of flow-level TCP network models for grid and cloud simulations", ACM TOMACS 23(4), 2013). On each,
the rates of the connected component of transfers sharing links (transitively) with the ones that started or ended
are recomputed; the others keep theirs. Starts and ends at one instant are batched: the transfers a collective step
starts together are allocated once (by a zero-delay event), and all transmissions due at one wake end before their
components are reallocated, once. Completion times live in the network's own heap, one entry per connected
component: its earliest end, valid while the component's version stamp holds (every reallocation of a component
restamps its transfers, so older entries are skipped when popped); one SimPy timeout stands for the earliest entry.
That costs one heap entry per reallocation instead of one SimPy event per rate change. A transfer alone in its
component (no other crosses its links) needs no wake at its end, since its end changes no other rate: it gets one
event, its completion, at the time the wake and the latency would give; it is taken off its links then, or as soon
as another transfer starts on one of them after its last byte (``_expire``); one that starts on one of them before
its last byte makes it an ordinary member of a component again (its completion event, stamped with an older version,
is ignored).

Examples
--------
>>> import simpy
>>> env = simpy.Environment()
>>> net = FlowNetwork(env, {("a", "b"): 10.0})
>>> done = []
>>> def send(delay):
...     yield env.timeout(delay)
...     yield net.transfer({("a", "b"): 1}, 100.0, latency_s=0.5)
...     done.append(env.now)
>>> for delay in (0.0, 0.0):
...     _ = env.process(send(delay))
>>> env.run()
>>> done  # two equal flows share the link: 100 B each at 5 B/s, then 0.5 s latency
[20.5, 20.5]
>>> net.link_bytes[("a", "b")], net.link_busy_s[("a", "b")]
(200.0, 20.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from heapq import heapify, heappop, heappush
from types import MappingProxyType

import simpy
from simpy.events import NORMAL, Event

__all__ = ["FlowNetwork", "LinkId", "Route"]

#: A directed edge ``(u, v)`` of the cluster topology graph. Links are full duplex: each direction has its own
#: capacity.
LinkId = tuple[str, str]

# Two rates closer than this (relative) count as equal: the transfer keeps its rate and its completion timeout.
_RATE_RTOL = 1e-12


class _Link:
    """State of one finite-capacity directed link: the transfers crossing it and its tallies."""

    __slots__ = ("busy_since", "capacity", "flows", "id", "index", "key", "load", "mark", "unfrozen", "wsum")

    def __init__(self, link_id: LinkId, capacity: float, index: int) -> None:
        self.id = link_id
        self.capacity = capacity
        self.index = index  # heap tie-break, so links are never compared
        self.flows: dict[_Transfer, float] = {}  # transfer -> weight
        self.busy_since = 0.0
        self.mark = 0  # epoch of the last component search that reached this link
        # Scratch space of the progressive filling.
        self.wsum = 0.0
        self.load = 0.0
        self.key = 0.0
        self.unfrozen = 0


class _Transfer:
    """One active bundle: its finite links with weights, bytes left per member, current rate and completion."""

    __slots__ = (
        "cap",
        "done",
        "end",
        "group",
        "inf_links",
        "kind",
        "last",
        "latency",
        "lazy",
        "lazy_token",
        "links",
        "mark",
        "n_bytes",
        "new_rate",
        "rate",
        "remaining",
        "version",
    )

    def __init__(
        self,
        links: list[tuple[_Link, float]],
        inf_links: list[tuple[LinkId, float]],
        n_bytes: float,
        latency: float,
        kind: str,
        done: _Completion,
        now: float,
    ) -> None:
        self.links = links
        self.inf_links = inf_links
        self.n_bytes = n_bytes
        self.remaining = n_bytes  # bytes left per member as of time ``last``
        self.latency = latency
        self.kind = kind
        self.done = done
        self.rate = 0.0
        self.new_rate = 0.0
        self.last = now
        self.version = 0
        self.mark = 0
        # alone in its component: when its last byte leaves (the wake's time), else -1.0 (see FlowNetwork._alone)
        self.lazy = -1.0
        self.lazy_token = 0  # stamps its completion event while alone; moved on when it no longer is
        self.cap = math.inf  # scratch: the tightest link only this transfer crosses, in rate per member
        self.end = math.inf  # when transmission ends at the current rate
        # Its connected component as of the last reallocation; dropped at the end (no reference cycle outlives it).
        self.group: list[_Transfer] = []


class Route:
    """A bundle's links, checked and split (``FlowNetwork.route``): finite ones with their ``_Link`` state, and
    infinite ones by id (tallied only)."""

    __slots__ = ("finite", "infinite")

    def __init__(self, finite: list[tuple[_Link, float]], infinite: list[tuple[LinkId, float]]) -> None:
        self.finite = finite
        self.infinite = infinite


class _Completion(Event):
    """The event a caller waits on; fired ``delay`` after transmission ends (as ``simpy.Timeout`` schedules)."""

    def fire(self, delay: float) -> None:
        self._ok = True
        self._value = None
        env = self.env
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), self))  # env.schedule, inlined


class _Call(Event):
    """A timeout with its one callback attached (one object instead of a ``Timeout`` plus a callback list edit)."""

    def __init__(self, env: simpy.Environment, delay: float, call: Callable[[], None]) -> None:
        self.env = env
        self.callbacks = [lambda _event: call()]
        self._value = None
        self._ok = True
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), self))  # env.schedule, inlined


class FlowNetwork:
    """Directed links with capacities, shared weighted max-min fairly by the transfers in flight.

    Parameters
    ----------
    env
        The SimPy environment that owns time.
    capacity_Bps
        Capacity of every link a transfer may name, bytes/s per direction (``math.inf``: no limit).

    Attributes
    ----------
    link_bytes
        Bytes carried per link: ``sum(weight * n_bytes)`` over the transfers that finished transmitting on it.
    link_busy_s
        Seconds during which at least one transfer was transmitting on the link (finite links only).
    bytes_by_kind
        ``n_bytes`` (bytes per member flow) summed over the transfers of each ``kind`` that finished transmitting.
    transfers_started
        Calls to ``transfer``.
    rate_updates
        Times a transfer's rate was set (once at its start, again whenever a neighbour's start or end changed it).

    The tallies count transmissions that have ended: read them after ``env.run()``.
    """

    def __init__(self, env: simpy.Environment, capacity_Bps: Mapping[LinkId, float]) -> None:
        self.env = env
        self._capacity: dict[LinkId, float] = {}
        for link, capacity in capacity_Bps.items():
            self._check_capacity(link, capacity)
            self._capacity[link] = float(capacity)
        self._links: dict[LinkId, _Link] = {}
        self._active: dict[_Transfer, None] = {}
        self._epoch = 0  # component searches so far (marks visited links and transfers)
        # Completion heap, one entry per component: (earliest end, sequence, transfer ending then, its version);
        # stale when the version moved on (the component was reallocated, or the transfer ended).
        self._ends: list[tuple[float, int, _Transfer, int]] = []
        self._sequence = 0
        self._wake_due = math.inf  # when the pending wake fires (inf: none pending)
        self._wake_token = 0
        self._dirty: list[_Link] = []  # links of transfers started at this instant, not yet allocated
        self.link_bytes: dict[LinkId, float] = {}
        self.link_busy_s: dict[LinkId, float] = {}
        self.bytes_by_kind: dict[str, float] = {}
        self.transfers_started = 0
        self.rate_updates = 0

    @property
    def capacity_Bps(self) -> Mapping[LinkId, float]:
        """Read-only view of the link capacities (change one with ``set_capacity`` before the run)."""
        return MappingProxyType(self._capacity)

    def set_capacity(self, link: LinkId, capacity_Bps: float) -> None:
        """Set one link's capacity; only before the first transfer starts.

        Raises
        ------
        RuntimeError
            If a transfer has already started.
        """
        if self.transfers_started:
            raise RuntimeError("link capacities can only be changed before the first transfer starts")
        if link in self._links:
            raise RuntimeError(f"link {link}: a route already uses it; set capacities before making routes")
        self._check_capacity(link, capacity_Bps)
        self._capacity[link] = float(capacity_Bps)

    def transfer(
        self, weights: Mapping[LinkId, float], n_bytes: float, latency_s: float = 0.0, kind: str = ""
    ) -> simpy.Event:
        """Start a bundle moving ``n_bytes`` per member flow; the event fires ``latency_s`` after the last byte.

        ``weights`` maps each link the bundle crosses to its number of member flows on that link (> 0). Links of
        infinite capacity impose no limit; with no finite link (or ``n_bytes == 0``) the event fires after
        ``latency_s`` alone. ``send(route(weights), ...)`` is the same for a caller that reuses one route.

        Raises
        ------
        KeyError
            If a link has no capacity.
        ValueError
            If a weight is not positive, or ``n_bytes`` or ``latency_s`` is negative.
        """
        return self.send(self.route(weights), n_bytes, latency_s, kind)

    def route(self, weights: Mapping[LinkId, float]) -> Route:
        """``weights`` checked and split into finite and infinite links, for ``send`` (see ``transfer``).

        Raises
        ------
        KeyError
            If a link has no capacity.
        ValueError
            If a weight is not positive.
        """
        finite: list[tuple[_Link, float]] = []
        infinite: list[tuple[LinkId, float]] = []
        links = self._links
        for link_id, weight in weights.items():
            if not weight > 0:
                raise ValueError(f"weight of link {link_id} must be positive, got {weight}")
            link = links.get(link_id)
            if link is None:
                link = self._new_link(link_id)
            if link is _INFINITE:
                infinite.append((link_id, weight))
            else:
                finite.append((link, weight))
        return Route(finite, infinite)

    def send(self, route: Route, n_bytes: float, latency_s: float = 0.0, kind: str = "") -> simpy.Event:
        """``transfer`` along a ``route`` made by this network's ``route``."""
        env = self.env
        if n_bytes < 0 or latency_s < 0:
            raise ValueError(f"n_bytes ({n_bytes}) and latency_s ({latency_s}) must not be negative")
        finite, infinite = route.finite, route.infinite
        self.transfers_started += 1
        if not finite or n_bytes == 0:
            self._tally(finite, infinite, n_bytes, kind)
            return env.timeout(latency_s)
        now = env._now
        done = _Completion(env)
        transfer = _Transfer(finite, infinite, n_bytes, latency_s, kind, done, now)
        alone = True
        for link, weight in finite:
            flows = link.flows
            if flows:
                self._expire(flows, now)
            if not flows:
                link.busy_since = now
            else:
                alone = False
            flows[transfer] = weight
        self._active[transfer] = None
        if alone:  # alone on its links: its rate is known now
            transfer.new_rate = min(link.capacity / weight for link, weight in finite)
            self._apply([transfer], now)
            self._arm()
            return done
        if not self._dirty:
            _Call(env, 0.0, self._flush)
        self._dirty.extend(link for link, _ in finite)
        return done

    def utilization(self, link: LinkId, horizon_s: float) -> float:
        """Fraction of ``link``'s capacity used over ``horizon_s`` seconds: ``link_bytes / (capacity * horizon)``.

        A link of infinite capacity is never loaded (0.0).
        """
        capacity = self._capacity[link]
        if math.isinf(capacity):
            return 0.0
        return self.link_bytes.get(link, 0.0) / (capacity * horizon_s)

    def active_rates(self) -> list[tuple[dict[LinkId, float], float]]:
        """Transfers transmitting now: their finite links with weights, and their rate per member (bytes/s)."""
        self._flush()
        self._expire(self._active, self.env.now)
        return [({link.id: w for link, w in t.links}, t.rate) for t in self._active]

    @property
    def active_transfers(self) -> int:
        """Transfers transmitting now."""
        self._expire(self._active, self.env.now)
        return len(self._active)

    # Internals.

    @staticmethod
    def _check_capacity(link: LinkId, capacity: float) -> None:
        if not capacity > 0:
            raise ValueError(f"capacity of link {link} must be positive (or math.inf), got {capacity}")

    def _new_link(self, link_id: LinkId) -> _Link:
        try:
            capacity = self._capacity[link_id]
        except KeyError:
            raise KeyError(f"link {link_id} has no capacity in this network") from None
        link = _INFINITE if math.isinf(capacity) else _Link(link_id, capacity, len(self._links))
        self._links[link_id] = link
        return link

    def _tally(
        self, finite: list[tuple[_Link, float]], infinite: list[tuple[LinkId, float]], n_bytes: float, kind: str
    ) -> None:
        link_bytes = self.link_bytes
        for link, weight in finite:
            link_bytes[link.id] = link_bytes.get(link.id, 0.0) + weight * n_bytes
        for link_id, weight in infinite:
            link_bytes[link_id] = link_bytes.get(link_id, 0.0) + weight * n_bytes
        self.bytes_by_kind[kind] = self.bytes_by_kind.get(kind, 0.0) + n_bytes

    def _flush(self) -> None:
        """Allocate rates to the transfers started at this instant (all at once: one reallocation per component)."""
        if self._dirty:
            seeds, self._dirty = self._dirty, []
            self._reallocate(seeds, self.env._now)
            self._arm()

    def _arm(self) -> None:
        """Make sure a wake is pending for the earliest current entry of the completion heap."""
        ends = self._ends
        while ends and ends[0][3] != ends[0][2].version:
            heappop(ends)  # stale
        if ends and ends[0][0] < self._wake_due:
            due = ends[0][0]
            self._wake_due = due
            self._wake_token += 1
            token = self._wake_token
            _Call(self.env, max(0.0, due - self.env._now), lambda: self._on_wake(due, token))

    def _on_wake(self, due: float, token: int) -> None:
        """End every transmission due by ``due``, then rebalance what they shared links with, once."""
        if token != self._wake_token:
            return  # replaced by an earlier wake, which re-armed
        self._wake_due = math.inf
        ends = self._ends
        now = self.env._now
        seeds = self._dirty  # transfers started at this instant join this reallocation
        self._dirty = []
        finished = []
        while ends and ends[0][0] <= due:
            _, _, first, version = heappop(ends)
            if version != first.version:
                continue  # stale
            for transfer in first.group:  # the component is as allocated: its ends are current
                if transfer.end <= due and transfer.version >= 0:
                    self._end(transfer, now, seeds)
                    finished.append(transfer)
        if seeds:
            self._reallocate(seeds, now)
        self._arm()
        for transfer in finished:
            transfer.done.fire(transfer.latency)

    def _expire(self, transfers: Mapping[_Transfer, object], now: float) -> None:
        """Take off their links the transfers among ``transfers`` that were alone and whose last byte has left by
        ``now`` (each at the time its wake would have come)."""
        done = [t for t in transfers if 0.0 <= t.lazy <= now]
        for transfer in done:
            at = transfer.lazy
            seeds: list[_Link] = []
            self._end(transfer, at, seeds)
            assert not seeds, "a transfer alone in its component shared a link"

    def _alone(self, transfer: _Transfer, now: float) -> None:
        """Schedule the completion of a transfer alone in its component, one event: at the time its wake would come
        (as ``_arm`` computes it) plus its latency; it is taken off its links then (``_complete``) unless a start on
        one of them did so first (``_expire``)."""
        ended = now + max(0.0, transfer.end - now)
        transfer.lazy = ended
        transfer.lazy_token += 1
        token = transfer.lazy_token
        env = self.env
        call = _Call.__new__(_Call)
        call.env = env
        call.callbacks = [lambda _event: self._complete(transfer, token)]
        call._value = None
        call._ok = True
        heappush(env._queue, (ended + transfer.latency, NORMAL, next(env._eid), call))

    def _complete(self, transfer: _Transfer, token: int) -> None:
        """The completion of a transfer that was alone (``_alone``); ignored when a start joined its component
        before its last byte left (its token moved on)."""
        if token != transfer.lazy_token:
            return
        if transfer.version >= 0:  # still on its links
            seeds: list[_Link] = []
            self._end(transfer, transfer.lazy, seeds)
            assert not seeds, "a transfer alone in its component shared a link"
        done = transfer.done  # fires now, as the event SimPy would have processed
        done._ok = True
        done._value = None
        callbacks, done.callbacks = done.callbacks, None  # type: ignore[assignment]
        for callback in callbacks:
            callback(done)

    def _end(self, transfer: _Transfer, now: float, seeds: list[_Link]) -> None:
        """Take ``transfer`` off its links (its last byte left at ``now``); add those still busy to ``seeds``."""
        del self._active[transfer]
        transfer.version = -1  # no entry of it is current any more
        transfer.group = []
        busy = self.link_busy_s
        for link, _ in transfer.links:
            flows = link.flows
            del flows[transfer]
            if flows:
                seeds.append(link)
            else:
                busy[link.id] = busy.get(link.id, 0.0) + (now - link.busy_since)
        self._tally(transfer.links, transfer.inf_links, transfer.n_bytes, transfer.kind)

    def _reallocate(self, seeds: list[_Link], now: float) -> None:
        """Recompute the max-min rates of the transfers connected to ``seeds``, component by component."""
        self._epoch += 1
        for component in _max_min(seeds, self._epoch):
            self._apply(component, now)

    def _apply(self, component: list[_Transfer], now: float) -> None:
        """Give each transfer of a connected component its ``new_rate`` and push the component's earliest end."""
        updates = 0
        first = component[0]
        for transfer in component:
            transfer.group = component
            transfer.version += 1
            rate = transfer.new_rate
            old = transfer.rate
            if abs(rate - old) > _RATE_RTOL * rate:
                if old > 0.0:
                    remaining = transfer.remaining - old * (now - transfer.last)
                    transfer.remaining = remaining if remaining > 0.0 else 0.0
                transfer.last = now
                transfer.rate = rate
                transfer.end = now + transfer.remaining / rate
                updates += 1
            if transfer.end < first.end:
                first = transfer
        self.rate_updates += updates
        if len(component) == 1:
            self._alone(first, now)
            return
        for transfer in component:
            if transfer.lazy >= 0.0:  # no longer alone: its completion event is void
                transfer.lazy = -1.0
                transfer.lazy_token += 1
        self._sequence += 1
        heappush(self._ends, (first.end, self._sequence, first, first.version))


# Shared marker for every link of infinite capacity: it never constrains a rate, so it keeps no state.
_INFINITE = _Link(("", ""), math.inf, -1)


def _max_min(seeds: list[_Link], epoch: int) -> list[list[_Transfer]]:
    """Set ``new_rate`` of the transfers connected to ``seeds`` to their weighted max-min fair rates.

    Returns the connected components (transfers linked through shared links), each found by a depth-first search
    from a seed and marked ``epoch``. A link that only one transfer crosses is folded into that transfer's ``cap``.
    """
    components = []
    for seed in seeds:  # seeds may repeat a link
        if seed.mark == epoch:
            continue
        seed.mark = epoch
        transfers, heap = _component(seed, epoch)
        if len(transfers) == 1:
            transfer = transfers[0]
            transfer.new_rate = min(link.capacity / weight for link, weight in transfer.links)
        elif transfers:
            _progressive_filling(transfers, heap, epoch)
        if transfers:
            components.append(transfers)
    return components


def _component(seed: _Link, epoch: int) -> tuple[list[_Transfer], list[tuple[float, int, _Link]]]:
    """The transfers connected to ``seed``, and the heap entries of the links they share (scratch state reset)."""
    stack = [seed]
    transfers: list[_Transfer] = []
    heap: list[tuple[float, int, _Link]] = []
    while stack:
        link = stack.pop()
        flows = link.flows
        if len(flows) > 1:
            link.wsum = wsum = sum(flows.values())
            link.load = 0.0
            link.unfrozen = len(flows)
            link.key = key = link.capacity / wsum
            heap.append((key, link.index, link))
        else:
            link.unfrozen = 0  # a seed crossed by one transfer (or none): part of that transfer's cap
        for transfer in flows:
            if transfer.mark == epoch:
                continue
            transfer.mark = epoch
            transfer.new_rate = -1.0  # unfrozen
            transfers.append(transfer)
            cap = math.inf
            for other, weight in transfer.links:
                if len(other.flows) == 1:
                    if other.capacity < cap * weight:
                        cap = other.capacity / weight
                elif other.mark != epoch:
                    other.mark = epoch
                    stack.append(other)
            transfer.cap = cap
    return transfers, heap


def _progressive_filling(transfers: list[_Transfer], heap: list[tuple[float, int, _Link]], epoch: int) -> None:
    """Weighted max-min fair ``new_rate`` of a component's transfers (Bertsekas & Gallager, sec. 6.5.2).

    Every unfrozen transfer runs at a common level; a shared link saturates at
    ``(capacity - frozen load) / (sum of unfrozen weights)``, a transfer reaches its cap at ``cap``. The next event
    comes from the heap of shared links keyed by that level (stale entries skipped) merged with the sorted caps; the
    transfers it freezes raise the keys of the other links they cross.
    """
    heapify(heap)
    caps = sorted([(t.cap, i, t) for i, t in enumerate(transfers) if t.cap < math.inf], reverse=True)
    while heap or caps:
        if caps and (not heap or caps[-1][0] <= heap[0][0]):
            level, _, transfer = caps.pop()
            if transfer.new_rate < 0.0:
                _freeze(transfer, level, None, epoch, heap)
            continue
        level, _, link = heappop(heap)
        if link.unfrozen <= 0 or level != link.key:
            continue  # done, or a stale entry
        for transfer in link.flows:
            if transfer.new_rate < 0.0:
                _freeze(transfer, level, link, epoch, heap)
        link.unfrozen = 0


def _freeze(
    transfer: _Transfer, level: float, saturated: _Link | None, epoch: int, heap: list[tuple[float, int, _Link]]
) -> None:
    """Fix ``transfer``'s rate at ``level``; raise the keys of the other shared links it crosses."""
    transfer.new_rate = level
    for other, weight in transfer.links:
        if other is saturated or other.mark != epoch:
            continue  # the link being saturated, or one only this transfer crosses
        other.unfrozen -= 1
        if other.unfrozen <= 0:
            continue
        other.load += weight * level
        other.wsum -= weight
        key = (other.capacity - other.load) / other.wsum
        other.key = key = key if key > level else level  # exact arithmetic never lowers it; rounding might
        heappush(heap, (key, other.index, other))
