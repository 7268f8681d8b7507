"""The flow-level network: hand-computed cases, then random networks against a brute-force reference."""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping
from typing import Any

import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plansim.des.network import FlowNetwork, LinkId

A: LinkId = ("a", "b")
B: LinkId = ("b", "c")
C: LinkId = ("c", "d")
INF: LinkId = ("x", "y")

Spec = tuple[float, dict[LinkId, float], float, float]  # start, weights, n_bytes, latency


def run(capacity: Mapping[LinkId, float], specs: list[Spec]) -> tuple[list[float], FlowNetwork]:
    """Start each transfer at its time; return the times their events fired, and the network."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacity)
    done = [math.nan] * len(specs)

    def one(i: int, start: float, weights: dict[LinkId, float], n_bytes: float, latency: float) -> Generator[Any]:
        yield env.timeout(start)
        yield net.transfer(weights, n_bytes, latency, kind=f"k{i % 2}")
        done[i] = env.now

    for i, spec in enumerate(specs):
        env.process(one(i, *spec))
    env.run()
    return done, net


# Hand-computed cases.


def test_one_flow_takes_bytes_over_capacity_plus_latency() -> None:
    done, net = run({A: 10.0}, [(0.0, {A: 1}, 100.0, 0.5)])
    assert done == [10.5]
    assert net.link_bytes == {A: 100.0}
    assert net.link_busy_s == {A: 10.0}
    assert net.transfers_started == 1
    assert net.rate_updates == 1
    assert net.utilization(A, 20.0) == 0.5


def test_two_equal_flows_sharing_a_link_take_twice_as_long() -> None:
    done, net = run({A: 10.0}, [(0.0, {A: 1}, 100.0, 0.0), (0.0, {A: 1}, 100.0, 0.0)])
    assert done == [20.0, 20.0]
    assert net.link_busy_s == {A: 20.0}
    assert net.bytes_by_kind == {"k0": 100.0, "k1": 100.0}


def test_partly_shared_route_gets_its_max_min_share() -> None:
    """Parking lot: f0 crosses A (10 B/s) and B (20 B/s), f1 only A, f2 only B.

    Progressive filling: all rise to 5, where A saturates (f0 + f1 = 10); f0 and f1 freeze at 5. f2 rises on alone
    until B saturates: 20 - 5 = 15. f0 (50 B) ends at t = 10. Then f1 has A alone (10 B/s, 50 B left): ends at 15;
    f2 has B alone (20 B/s, 300 - 150 = 150 B left): ends at 17.5.
    """
    specs: list[Spec] = [(0.0, {A: 1, B: 1}, 50.0, 0.0), (0.0, {A: 1}, 100.0, 0.0), (0.0, {B: 1}, 300.0, 0.0)]
    done, net = run({A: 10.0, B: 20.0}, specs)
    assert done == pytest.approx([10.0, 15.0, 17.5], rel=1e-12)
    assert net.link_bytes == {A: 150.0, B: 350.0}
    assert net.link_busy_s == pytest.approx({A: 15.0, B: 17.5})


def test_rates_of_the_parking_lot() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, {A: 10.0, B: 20.0})
    for weights in ({A: 1, B: 1}, {A: 1}, {B: 1}):
        net.transfer(weights, 1e3)
    assert sorted(rate for _, rate in net.active_rates()) == [5.0, 5.0, 15.0]


def test_flow_starting_halfway_through_another() -> None:
    """f0: 100 B from t=0 alone at 10 B/s (50 B by t=5); then both at 5 B/s: f0 ends at 15; f1 has 50 B left at
    t=15, alone at 10 B/s: ends at 20."""
    done, _ = run({A: 10.0}, [(0.0, {A: 1}, 100.0, 0.0), (5.0, {A: 1}, 100.0, 0.0)])
    assert done == pytest.approx([15.0, 20.0], rel=1e-12)


def test_weight_two_behaves_like_two_flows() -> None:
    bundle, net = run({A: 30.0}, [(0.0, {A: 2}, 100.0, 0.0), (0.0, {A: 1}, 100.0, 0.0)])
    flows, _ = run({A: 30.0}, [(0.0, {A: 1}, 100.0, 0.0)] * 3)
    assert bundle == [10.0, 10.0]
    assert flows == [10.0, 10.0, 10.0]
    assert net.link_bytes == {A: 300.0}
    alone, _ = run({A: 10.0}, [(0.0, {A: 2}, 100.0, 0.0)])
    assert alone == [20.0]


def test_bundle_on_a_link_with_a_single_member_elsewhere() -> None:
    """A bundle with 2 members on A (10 B/s) and 1 on B (12 B/s), and a plain flow on B.

    Both rise together: A saturates at 5 (2 x 5 = 10) before B would (5 + 5 < 12), so the bundle freezes at 5 and
    the flow takes the rest of B: 12 - 5 = 7.
    """
    env = simpy.Environment()
    net = FlowNetwork(env, {A: 10.0, B: 12.0})
    net.transfer({A: 2, B: 1}, 10.0)
    net.transfer({B: 1}, 10.0)
    assert sorted(rate for _, rate in net.active_rates()) == [5.0, 7.0]


def test_infinite_capacity_imposes_no_limit() -> None:
    done, net = run({A: 10.0, INF: math.inf}, [(1.0, {INF: 3}, 100.0, 0.25), (0.0, {A: 1, INF: 1}, 100.0, 0.0)])
    assert done == [1.25, 10.0]
    assert net.link_bytes == {INF: 400.0, A: 100.0}
    assert INF not in net.link_busy_s
    assert net.utilization(INF, 10.0) == 0.0


def test_zero_bytes_completes_after_latency_only() -> None:
    done, net = run({A: 10.0}, [(0.0, {A: 1}, 0.0, 0.5), (1.0, {}, 10.0, 0.0)])
    assert done == [0.5, 1.0]
    assert net.rate_updates == 0
    assert net.transfers_started == 2


def test_a_start_or_end_only_touches_its_component() -> None:
    """Transfers on disjoint links never reschedule each other: one rate update each."""
    specs: list[Spec] = [(0.0, {A: 1}, 100.0, 0.0), (1.0, {B: 1}, 10.0, 0.0), (2.0, {C: 1}, 10.0, 0.0)]
    done, net = run({A: 10.0, B: 10.0, C: 10.0}, specs)
    assert done == [10.0, 2.0, 3.0]
    assert net.rate_updates == 3


def test_transfers_starting_or_ending_together_are_allocated_once() -> None:
    """A collective step: 8 transfers start together on A (80 B/s), each also on a private link; 10 B/s each."""
    links = [(f"g{i}", "a") for i in range(8)]
    specs: list[Spec] = [(0.0, {A: 1, link: 1}, 80.0, 0.0) for link in links]
    done, net = run({A: 80.0, **dict.fromkeys(links, 100.0)}, specs)
    assert done == [8.0] * 8
    # The first is alone when it starts (rate 80 at once); the other 7 join at the same instant and the 8 are
    # allocated together, once: 1 + 8 updates, not 1 + 2 + ... + 8; none at the common end.
    assert net.rate_updates == 9


def test_simultaneous_ends_and_starts() -> None:
    """f1 starts just as f0 ends: f1 gets the link alone."""
    done, net = run({A: 10.0}, [(0.0, {A: 1}, 50.0, 0.0), (5.0, {A: 1}, 50.0, 0.0), (5.0, {A: 1}, 50.0, 0.0)])
    assert done == [5.0, 15.0, 15.0]
    assert net.link_busy_s == {A: 15.0}


def test_bad_calls_raise() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, {A: 10.0})
    net.set_capacity(A, 20.0)
    assert net.capacity_Bps[A] == 20.0
    with pytest.raises(KeyError, match="no capacity"):
        net.transfer({B: 1}, 1.0)
    with pytest.raises(ValueError, match="positive"):
        net.transfer({A: 0}, 1.0)
    with pytest.raises(ValueError, match="negative"):
        net.transfer({A: 1}, -1.0)
    with pytest.raises(ValueError, match="positive"):
        FlowNetwork(env, {A: 0.0})
    net.transfer({A: 1}, 1.0)
    with pytest.raises(RuntimeError, match="before the first transfer"):
        net.set_capacity(A, 5.0)


def test_a_route_is_fixed_once_made() -> None:
    """``send`` along a reused ``route`` is ``transfer``; a link a route uses keeps its capacity."""
    env = simpy.Environment()
    net = FlowNetwork(env, {A: 10.0, B: math.inf})
    route = net.route({A: 1, B: 2})
    with pytest.raises(RuntimeError, match="route already uses"):
        net.set_capacity(A, 5.0)
    ends = []

    def go(delay: float) -> Generator[simpy.Event, None, None]:
        yield env.timeout(delay)
        yield net.send(route, 50.0)
        ends.append(env.now)

    env.process(go(0.0))
    env.process(go(0.0))
    env.run()
    assert ends == [10.0, 10.0]  # two bundles share A's 10 B/s: 50 B each at 5 B/s
    assert net.link_bytes == {A: 100.0, B: 200.0}


# Random networks against a brute-force reference.


def reference_rates(capacity: Mapping[LinkId, float], flows: dict[int, dict[LinkId, float]]) -> dict[int, float]:
    """Weighted max-min rates by literal water filling: raise every unfrozen rate by the largest step that keeps
    all links feasible, freeze the flows of the links that saturated, repeat."""
    rate = dict.fromkeys(flows, 0.0)
    frozen: set[int] = set()
    links = {link for weights in flows.values() for link in weights}
    while len(frozen) < len(flows):
        step = math.inf
        for link in links:
            unfrozen = sum(weights.get(link, 0.0) for i, weights in flows.items() if i not in frozen)
            if unfrozen:
                used = sum(weights.get(link, 0.0) * rate[i] for i, weights in flows.items())
                step = min(step, (capacity[link] - used) / unfrozen)
        for i in flows:
            if i not in frozen:
                rate[i] += step
        for link in links:
            used = sum(weights.get(link, 0.0) * rate[i] for i, weights in flows.items())
            if used >= capacity[link] * (1 - 1e-12):
                frozen |= {i for i, weights in flows.items() if link in weights}
    return rate


def reference_times(capacity: Mapping[LinkId, float], specs: list[Spec]) -> list[float]:
    """Completion times, recomputing the whole allocation from scratch at every start and end."""
    finite = [{k: w for k, w in weights.items() if math.isfinite(capacity[k])} for _, weights, _, _ in specs]
    done = [math.nan] * len(specs)
    pending = sorted(range(len(specs)), key=lambda i: specs[i][0])
    active: dict[int, float] = {}  # transfer -> bytes left
    now = 0.0
    while pending or active:
        rates = reference_rates(capacity, {i: finite[i] for i in active})
        ends = {i: now + active[i] / rates[i] for i in active}
        next_start = specs[pending[0]][0] if pending else math.inf
        next_end = min(ends.values(), default=math.inf)
        later = min(next_start, next_end)
        for i in active:
            active[i] -= rates[i] * (later - now)
        now = later
        for i in [i for i, end in ends.items() if end <= now * (1 + 1e-12)]:
            done[i] = now + specs[i][3]
            del active[i]
        while pending and specs[pending[0]][0] <= now:
            i = pending.pop(0)
            if specs[i][2] == 0 or not finite[i]:
                done[i] = now + specs[i][3]
            else:
                active[i] = specs[i][2]
    return done


LINKS = [A, B, C, ("d", "e"), INF]
capacities = st.fixed_dictionaries(
    {
        link: st.sampled_from([1.0, 2.0, 3.0, 5.0, 10.0, math.inf] if link == INF else [1.0, 2.0, 3.0, 5.0, 10.0])
        for link in LINKS
    }
)
transfer_specs = st.lists(
    st.tuples(
        st.integers(0, 20).map(lambda t: t / 2),
        st.dictionaries(st.sampled_from(LINKS), st.sampled_from([0.5, 1.0, 2.0, 3.0]), min_size=1, max_size=3),
        st.integers(0, 60).map(float),
        st.sampled_from([0.0, 0.25]),
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=capacities, specs=transfer_specs)
def test_completion_times_match_a_from_scratch_reference(capacity: dict[LinkId, float], specs: list[Spec]) -> None:
    done, net = run(capacity, specs)
    assert done == pytest.approx(reference_times(capacity, specs), rel=1e-9, abs=1e-9)
    for link in capacity:  # conservation: every byte of every member crossed every link of its route
        expected = sum(weights.get(link, 0.0) * n_bytes for _, weights, n_bytes, _ in specs)
        assert net.link_bytes.get(link, 0.0) == pytest.approx(expected, rel=1e-12)
    assert sum(net.bytes_by_kind.values()) == pytest.approx(sum(spec[2] for spec in specs))
    assert net.transfers_started == len(specs)


@settings(max_examples=300, deadline=None)
@given(capacity=capacities, specs=transfer_specs, samples=st.lists(st.integers(0, 80).map(lambda t: t / 4), max_size=6))
def test_rates_are_feasible_and_every_transfer_has_a_bottleneck(
    capacity: dict[LinkId, float], specs: list[Spec], samples: list[float]
) -> None:
    """Sampled at random times: no link over capacity, and each active transfer crosses a saturated link on which
    no transfer runs faster (the bottleneck characterisation of max-min fairness, Bertsekas & Gallager 6.5.2)."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacity)
    snapshots: list[list[tuple[dict[LinkId, float], float]]] = []

    def one(start: float, weights: dict[LinkId, float], n_bytes: float, latency: float) -> Generator[Any]:
        yield env.timeout(start)
        yield net.transfer(weights, n_bytes, latency)

    def watch() -> Generator[Any]:
        for t in sorted(samples):
            yield env.timeout(t - env.now)
            snapshots.append(net.active_rates())

    for spec in specs:
        env.process(one(*spec))
    env.process(watch())
    env.run()
    for active in snapshots:
        load = {
            link: sum(w * rate for weights, rate in active for other, w in weights.items() if other == link)
            for link in LINKS
        }
        assert all(load[link] <= capacity[link] * (1 + 1e-9) for link in LINKS)
        for weights, rate in active:
            assert rate > 0
            assert any(
                load[link] >= capacity[link] * (1 - 1e-9)
                and all(other <= rate * (1 + 1e-9) for ws, other in active if link in ws)
                for link in weights
            ), (weights, rate, active)
