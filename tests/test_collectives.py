"""Collective schedules checked three independent ways: volumes against the course table, data moved through the
schedule against numpy's answer, and alpha-beta times against the textbook closed forms (Thakur, Rabenseifner &
Gropp 2005; Patarasuk & Yuan 2009)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plansim.costs.collectives import (
    ALLREDUCE_ALGORITHMS,
    COLLECTIVES,
    MESSAGE_SIZE,
    Schedule,
    bytes_sent_per_rank,
    collective_time,
    schedule,
    simulate,
)
from plansim.errors import PlansimError

M = 1_000_003.0  # bytes per worker: odd, so a wrong factor cannot hide behind a round number
A, BW = 7e-6, 25e9  # alpha (s) and bandwidth (B/s) for the closed forms
B = 1.0 / BW


def _total(algorithm: str, n: int, local: int | None = None) -> float:
    return schedule("all_reduce", algorithm, n, local).total_bytes(M)


# ---- volumes: the course's table (dl-systems-intro, "Comparing different AllReduce Methods") -------------------


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16, 64])
def test_allreduce_total_volume_matches_course_table(n: int) -> None:
    assert _total("naive", n) == pytest.approx(n * (n - 1) * M, rel=1e-12)
    assert _total("ps", n) == pytest.approx(2 * n * M, rel=1e-12)
    assert _total("ring", n) == pytest.approx(2 * (n - 1) * M, rel=1e-12)
    assert _total("tree", n) == pytest.approx(2 * (n - 1) * M, rel=1e-12)  # the table's "2NM", exactly 2(N-1)M


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_butterfly_total_volume_is_n_m_log_n(n: int) -> None:
    assert _total("butterfly", n) == pytest.approx(n * M * math.log2(n), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 7, 8, 100])
def test_ring_worker_sends_2_n_minus_1_over_n(n: int) -> None:
    assert bytes_sent_per_rank("all_reduce", "ring", n, M) == pytest.approx(2 * (n - 1) * M / n, rel=1e-12)
    assert np.allclose(schedule("all_reduce", "ring", n).bytes_sent(M), 2 * (n - 1) * M / n)  # balanced


def test_parameter_server_carries_the_traffic_workers_do_not() -> None:
    sent = schedule("all_reduce", "ps", 6).bytes_sent(M)
    assert sent[:6].tolist() == [M] * 6 and sent[6] == pytest.approx(6 * M)
    assert bytes_sent_per_rank("all_reduce", "ps", 6, M) == M


# ---- moving real data: every schedule computes what its collective promises ------------------------------------


def _ints(seed: int, p: int, length: int) -> list[np.ndarray]:
    """Integer-valued floats, so sums are exact whatever the order of addition."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-1000, 1000, size=length).astype(float) for _ in range(p)]


def _check_allreduce(algorithm: str, p: int, length: int, seed: int, local: int | None = None) -> None:
    inputs = _ints(seed, p, length)
    out = simulate(schedule("all_reduce", algorithm, p, local), inputs)
    truth = np.sum(inputs, axis=0)
    assert len(out) == p
    for buffer in out:
        np.testing.assert_array_equal(buffer, truth)


@settings(max_examples=60, deadline=None)
@given(
    algorithm=st.sampled_from(["naive", "ps", "ring", "tree"]),
    p=st.integers(1, 9),
    length=st.integers(0, 23),
    seed=st.integers(0, 2**32 - 1),
)
def test_allreduce_sums_every_vector(algorithm: str, p: int, length: int, seed: int) -> None:
    _check_allreduce(algorithm, p, length, seed)


@settings(max_examples=30, deadline=None)
@given(log_p=st.integers(0, 4), length=st.integers(0, 40), seed=st.integers(0, 2**32 - 1))
def test_butterfly_allreduce_sums_every_vector(log_p: int, length: int, seed: int) -> None:
    _check_allreduce("butterfly", 2**log_p, length, seed)


@settings(max_examples=40, deadline=None)
@given(
    local=st.sampled_from([2, 4]),
    nodes=st.integers(1, 4),
    length=st.integers(0, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_hierarchical_allreduce_sums_every_vector(local: int, nodes: int, length: int, seed: int) -> None:
    _check_allreduce("hierarchical", local * nodes, length, seed, local=local)


def _power_of_two_or_any(algorithm: str) -> st.SearchStrategy[int]:
    return st.integers(0, 4).map(lambda k: 2**k) if algorithm == "butterfly" else st.integers(1, 9)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), algorithm=st.sampled_from(["ring", "butterfly"]), seed=st.integers(0, 2**32 - 1))
def test_all_gather_yields_the_concatenation(data: st.DataObject, algorithm: str, seed: int) -> None:
    p = data.draw(_power_of_two_or_any(algorithm))
    block = data.draw(st.integers(1, 5))
    full = _ints(seed, 1, p * block)[0]
    garbage = _ints(seed + 1, p, p * block)  # whatever a rank's buffer held outside its own shard
    for i, buffer in enumerate(garbage):
        buffer[i * block : (i + 1) * block] = full[i * block : (i + 1) * block]
    for out in simulate(schedule("all_gather", algorithm, p), garbage):
        np.testing.assert_array_equal(out, full)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), algorithm=st.sampled_from(["ring", "butterfly"]), seed=st.integers(0, 2**32 - 1))
def test_reduce_scatter_leaves_each_worker_its_reduced_shard(data: st.DataObject, algorithm: str, seed: int) -> None:
    p = data.draw(_power_of_two_or_any(algorithm))
    block = data.draw(st.integers(1, 5))
    inputs = _ints(seed, p, p * block)
    truth = np.sum(inputs, axis=0)
    for i, out in enumerate(simulate(schedule("reduce_scatter", algorithm, p), inputs)):
        np.testing.assert_array_equal(out[i * block : (i + 1) * block], truth[i * block : (i + 1) * block])


@settings(max_examples=30, deadline=None)
@given(algorithm=st.sampled_from(["tree", "ring"]), p=st.integers(1, 13), seed=st.integers(0, 2**32 - 1))
def test_broadcast_copies_rank_zero(algorithm: str, p: int, seed: int) -> None:
    inputs = _ints(seed, p, 11)
    for out in simulate(schedule("broadcast", algorithm, p), inputs):
        np.testing.assert_array_equal(out, inputs[0])


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 9), block=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_all_to_all_transposes_blocks(p: int, block: int, seed: int) -> None:
    inputs = _ints(seed, p, p * block)
    out = simulate(schedule("all_to_all", "direct", p), inputs)
    for i in range(p):
        for j in range(p):
            np.testing.assert_array_equal(out[j][i * block : (i + 1) * block], inputs[i][j * block : (j + 1) * block])


def test_send_recv_delivers_to_rank_one() -> None:
    a, b = np.array([1.0, 2.0, 3.0]), np.array([9.0, 9.0, 9.0])
    out = simulate(schedule("send_recv", "direct", 2), [a, b])
    np.testing.assert_array_equal(out[1], a)
    np.testing.assert_array_equal(out[0], a)


def test_ring_allreduce_exact_trace_for_three_workers() -> None:
    s = schedule("all_reduce", "ring", 3)
    trace = [(s_.src.tolist(), s_.dst.tolist(), (s_.lo * 3).round().tolist(), s_.reduce) for s_ in s.steps]
    assert trace == [
        ([0, 1, 2], [1, 2, 0], [2, 0, 1], True),  # reduce-scatter: rank i passes chunk i-1, then i-2
        ([0, 1, 2], [1, 2, 0], [1, 2, 0], True),  # ... so rank i ends holding the full sum of chunk i
        ([0, 1, 2], [1, 2, 0], [0, 1, 2], False),  # all-gather: rank i passes its own chunk, then the one it got
        ([0, 1, 2], [1, 2, 0], [2, 0, 1], False),
    ]
    assert all(np.allclose(step.hi - step.lo, 1 / 3) for step in s.steps)


# ---- alpha-beta times: textbook closed forms (a = alpha, b = 1/bandwidth) --------------------------------------


def _time(collective: str, algorithm: str, p: int, n: float, **kw: object) -> float:
    return collective_time(collective, algorithm, p, n, A, BW, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("p", [2, 3, 5, 8, 12, 64])
def test_ring_times_match_thakur_and_patarasuk_yuan(p: int) -> None:
    one_pass = (p - 1) * A + M * (p - 1) / p * B
    assert _time("all_gather", "ring", p, M) == pytest.approx(one_pass, rel=1e-12)
    assert _time("reduce_scatter", "ring", p, M) == pytest.approx(one_pass, rel=1e-12)
    assert _time("all_reduce", "ring", p, M) == pytest.approx(2 * (p - 1) * A + 2 * M * (p - 1) / p * B, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8, 32])
def test_recursive_doubling_and_halving_times(p: int) -> None:
    lg = math.log2(p)
    assert _time("all_reduce", "butterfly", p, M) == pytest.approx(lg * (A + M * B), rel=1e-12)
    assert _time("all_gather", "butterfly", p, M) == pytest.approx(lg * A + M * (p - 1) / p * B, rel=1e-12)
    assert _time("reduce_scatter", "butterfly", p, M) == pytest.approx(lg * A + M * (p - 1) / p * B, rel=1e-12)


@pytest.mark.parametrize("p", [2, 3, 9, 16])
def test_naive_and_parameter_server_times(p: int) -> None:
    assert _time("all_reduce", "naive", p, M) == pytest.approx(A + (p - 1) * M * B, rel=1e-12)
    assert _time("all_reduce", "ps", p, M) == pytest.approx(2 * (A + p * M * B), rel=1e-12)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 7, 8, 9, 16, 100])
def test_tree_allreduce_time_matches_derived_form(p: int) -> None:
    depth = math.floor(math.log2(p))
    lone_deepest_child = 1 if p & (p - 1) == 0 else 0
    expected = 2 * depth * A + 2 * (2 * depth - lone_deepest_child) * M * B
    assert _time("all_reduce", "tree", p, M) == pytest.approx(expected, rel=1e-12)


def test_tree_allreduce_small_cases_by_hand() -> None:
    # p=2: 1 up, 1 down. p=3: root hears two children (2n), then tells both (2n). p=4: levels {1,2} then {3}.
    assert _time("all_reduce", "tree", 2, M) == pytest.approx(2 * A + 2 * M * B, rel=1e-12)
    assert _time("all_reduce", "tree", 3, M) == pytest.approx(2 * A + 4 * M * B, rel=1e-12)
    assert _time("all_reduce", "tree", 4, M) == pytest.approx(4 * A + 6 * M * B, rel=1e-12)


@pytest.mark.parametrize(("p", "local"), [(8, 2), (8, 4), (16, 4), (12, 3), (8, 8), (8, 1)])
def test_hierarchical_time_prices_each_tier(p: int, local: int) -> None:
    inter_a, inter_bw = 3e-5, 5e9
    nodes = p // local
    expected = 2 * (local - 1) * (A + M / local * B) + 2 * (nodes - 1) * (inter_a + M / (local * nodes) / inter_bw)
    got = _time("all_reduce", "hierarchical", p, M, inter=(inter_a, inter_bw), local=local)
    assert got == pytest.approx(expected, rel=1e-12)
    # On one link the bandwidth term equals the flat ring's 2 n (p-1)/p; only the step count (alpha) differs.
    beta_only = collective_time("all_reduce", "hierarchical", p, M, 0.0, BW, local=local)
    assert beta_only == pytest.approx(collective_time("all_reduce", "ring", p, M, 0.0, BW), rel=1e-12)


@pytest.mark.parametrize("p", [2, 3, 8, 13])
def test_broadcast_all_to_all_send_recv_times(p: int) -> None:
    assert _time("broadcast", "tree", p, M) == pytest.approx(math.ceil(math.log2(p)) * (A + M * B), rel=1e-12)
    assert _time("broadcast", "ring", p, M) == pytest.approx((p - 1) * (A + M * B), rel=1e-12)
    # NCCL's grouped sends and receives: every block at once, one latency, (p-1)/p of the buffer out
    assert _time("all_to_all", "direct", p, M) == pytest.approx(A + (p - 1) / p * M * B, rel=1e-12)
    assert _time("send_recv", "direct", p, M) == pytest.approx(A + M * B, rel=1e-12)


@pytest.mark.parametrize(("p", "local"), [(8, 4), (16, 8), (12, 8), (6, 2), (4, 8)])
def test_all_to_all_placed_on_nodes_is_its_busiest_links_share(p: int, local: int) -> None:
    """Placed on nodes, a rank of the smallest node sends what leaves its node through its NIC while the largest
    node's ranks exchange theirs over NVLink, at once (brute force over the built step agrees)."""
    nvlink, nic = 400e9, 50e9
    largest, smallest = min(local, p), p % local or min(local, p)
    expected = (A if p <= local else 2 * A) + max((largest - 1) / p * M / nvlink, (p - smallest) / p * M / nic)
    got = collective_time("all_to_all", "direct", p, M, A, nvlink, inter=(2 * A, nic), local=local)
    assert got == pytest.approx(expected, rel=1e-12)
    (step,) = list(schedule("all_to_all", "direct", p).steps)
    assert step.placed(None, local) == pytest.approx((p > local, (largest - 1) / p, (p - smallest) / p))


@settings(max_examples=60, deadline=None)
@given(
    algorithm=st.sampled_from(sorted(ALLREDUCE_ALGORITHMS)),
    log_p=st.integers(1, 7),
    n=st.floats(1.0, 1e10),
)
def test_no_allreduce_beats_the_bandwidth_lower_bound(algorithm: str, log_p: int, n: float) -> None:
    # Patarasuk & Yuan 2009, sec. 2: each of p nodes must send and receive at least 2 n (p-1)/p.
    p = 2**log_p
    t = collective_time("all_reduce", algorithm, p, n, 0.0, BW, local=2)
    assert t >= 2 * n * (p - 1) / p * B * (1 - 1e-12)


# ---- edges, caching and errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("collective", "algorithm"), [(c, a) for c, algs in COLLECTIVES.items() for a in algs])
def test_one_worker_never_communicates(collective: str, algorithm: str) -> None:
    assert collective_time(collective, algorithm, 1, M, A, BW, local=1) == 0.0
    assert bytes_sent_per_rank(collective, algorithm, 1, M, local=1) == 0.0
    assert collective in MESSAGE_SIZE


def test_schedule_is_cached_read_only_and_ignores_local_where_unused() -> None:
    s = schedule("all_reduce", "ring", 8)
    assert schedule("all_reduce", "ring", 8, local=4) is s
    with pytest.raises(ValueError, match="read-only"):
        s.steps[0].lo[0] = 0.5


def test_large_ring_is_cheap_to_build_and_price() -> None:
    s = schedule("all_reduce", "ring", 1024)
    assert len(s.steps) == 2046
    assert s.time(M, A, BW) == pytest.approx(2046 * A + 2 * M * 1023 / 1024 * B, rel=1e-12)


def test_registries_expose_the_documented_choices() -> None:
    # nccl: NCCL_ALGO unset (the ring's bytes, the time of the call NCCL's tuner picks), beside ZeRO too
    assert set(ALLREDUCE_ALGORITHMS) == {"naive", "ps", "ring", "nccl", "tree", "butterfly", "hierarchical"}
    assert {c: set(a) for c, a in COLLECTIVES.items() if c != "all_reduce"} == {
        "all_gather": {"ring", "nccl", "butterfly"},
        "reduce_scatter": {"ring", "nccl", "butterfly"},
        "broadcast": {"tree", "ring"},
        "all_to_all": {"direct"},
        "send_recv": {"direct"},
    }


def test_bad_names_raise_naming_the_choices() -> None:
    with pytest.raises(PlansimError, match="unknown collective 'allreduce': choose one of all_gather, all_reduce"):
        schedule("allreduce", "ring", 4)
    with pytest.raises(PlansimError, match="butterfly, hierarchical, naive, nccl, ps, ring, tree"):
        collective_time("all_reduce", "rng", 4, M, A, BW)
    with pytest.raises(PlansimError, match="unknown broadcast algorithm 'direct': choose one of ring, tree"):
        schedule("broadcast", "direct", 4)


def test_butterfly_needs_a_power_of_two() -> None:
    with pytest.raises(PlansimError) as err:
        schedule("all_reduce", "butterfly", 6)
    assert str(err.value) == "dp_algorithm=butterfly needs a power-of-two group, got 6: use ring"
    with pytest.raises(PlansimError, match="power-of-two group, got 12"):
        schedule("all_gather", "butterfly", 12)


@pytest.mark.parametrize("local", [None, 3, 0])
def test_hierarchical_needs_a_local_size_that_divides_the_group(local: int | None) -> None:
    with pytest.raises(PlansimError, match="hierarchical needs local"):
        schedule("all_reduce", "hierarchical", 8, local)


def test_bad_group_size_and_links_raise() -> None:
    with pytest.raises(PlansimError, match="at least one worker"):
        schedule("all_reduce", "ring", 0)
    with pytest.raises(PlansimError, match="bandwidth_Bps > 0"):
        collective_time("all_reduce", "ring", 4, M, A, 0.0)
    with pytest.raises(PlansimError, match="4 workers, got 3"):
        simulate(schedule("all_reduce", "ring", 4), _ints(0, 3, 8))


# ---- long schedules: runs of steps built when read, loads in closed form ------------------------------------------


def _brute_totals(s: Schedule) -> tuple[np.ndarray, int, float]:
    """What the schedule's volumes and one-link time read, summed over its built steps one by one (the definition):
    each node's sends, the steps, and the sum over steps of the busiest node's fraction."""
    sent_total = np.zeros(s.num_nodes)
    count, load = 0, 0.0
    for step in s.steps:
        sent, received = step.loads(s.num_nodes)
        sent_total += sent
        count, load = count + 1, load + max(sent.max(), received.max())
    return sent_total, count, load


def _brute_placed_time(
    s: Schedule, local: int, n: float, intra: tuple[float, float], inter: tuple[float, float]
) -> float:
    """Placed pricing by its definition, transfer by transfer over the built steps: worker ``r`` on node
    ``r // local``, a helper on worker 0's GPU; per step, each GPU's bytes out and in on its node-local and on its
    inter-node link, the step taking the busiest (GPU, direction, link) at that link's bandwidth, plus the
    inter-node latency if any transfer crosses nodes, else the node-local one."""
    total = 0.0
    for step in s.steps:
        loads: dict[tuple[int, str, bool], float] = {}
        crosses = moved = False
        for a, b, lo, hi in zip(step.src.tolist(), step.dst.tolist(), step.lo, step.hi, strict=True):
            ga, gb = (a if a < s.p else 0), (b if b < s.p else 0)
            if ga == gb or hi <= lo:
                continue
            x = ga // local != gb // local
            moved, crosses = True, crosses or x
            for key in ((ga, "out", x), (gb, "in", x)):
                loads[key] = loads.get(key, 0.0) + (hi - lo)
        if moved:
            busiest = max(v / (inter if x else intra)[1] for (_, _, x), v in loads.items())
            total += (inter if crosses else intra)[0] + n * busiest
    return total


@pytest.mark.parametrize(
    ("collective", "algorithm", "p", "local"),
    [
        ("all_reduce", "ring", 7, 3),
        ("all_reduce", "ring", 96, 8),
        ("all_reduce", "hierarchical", 24, 8),
        ("all_reduce", "hierarchical", 12, 3),
        ("all_reduce", "naive", 9, 4),
        ("all_reduce", "naive", 9, 3),
        ("all_reduce", "naive", 5, 8),
        ("all_reduce", "tree", 13, 4),
        ("all_reduce", "ps", 10, 4),
        ("all_reduce", "butterfly", 16, 4),
        ("all_gather", "ring", 10, 5),
        ("reduce_scatter", "ring", 33, 8),
        ("all_to_all", "direct", 6, 2),
    ],
)
def test_step_runs_price_as_their_built_steps(collective: str, algorithm: str, p: int, local: int) -> None:
    """A run's closed forms (one-link loads; placed on nodes: the run's own ``placed`` or its first step) price
    exactly as its steps built one by one."""
    s = schedule(collective, algorithm, p, local)
    sent, count, load = _brute_totals(s)
    np.testing.assert_allclose(s.bytes_sent(1.0), sent, rtol=1e-12)
    assert s.time(M, A, BW) == pytest.approx(count * A + load * M / BW, rel=1e-12)
    assert len(s.steps) == count
    inter = (3 * A, BW / 4)
    expected = _brute_placed_time(s, local, M, (A, BW), inter)
    assert s.time(M, A, BW, inter, local) == pytest.approx(expected, rel=1e-12)
    assert [x.src.tolist() for x in s.steps[-2:]] == [x.src.tolist() for x in list(s.steps)[-2:]]


def test_placed_on_one_node_is_the_one_link_price_but_for_the_server() -> None:
    """On one node every transfer is node-local: the placed price is the one-link price, except the parameter
    server's, which runs on rank 0's GPU (as the DES places it), so it takes ``p - 1`` pushes, not ``p``."""
    p = 8
    for algorithm in ("ring", "tree", "naive", "butterfly"):
        s = schedule("all_reduce", algorithm, p)
        assert s.time(M, A, BW, local=p) == pytest.approx(s.time(M, A, BW), rel=1e-12)
    ps = schedule("all_reduce", "ps", p)
    assert ps.time(M, A, BW) == pytest.approx(2 * (A + p * M * B), rel=1e-12)
    assert ps.time(M, A, BW, local=p) == pytest.approx(2 * (A + (p - 1) * M * B), rel=1e-12)


def test_placed_tree_ps_and_naive_by_hand() -> None:
    """16 ranks on 2 nodes of 8, node-local link BW, inter-node link BW/4 (latencies A and 3A), by hand.
    Naive: each GPU sends 7 vectors inside its node and 8 to the other, at once: max(7 b, 8 * 4 b).
    ps: the server on GPU 0 takes 7 pushes over NVLink and 8 through its NIC, then sends them back: twice
    (3A + 32 M b). Tree (children of i: 2i+1, 2i+2; levels 1-2, 3-6, 7-14, 15): levels 1 and 2 stay on node 0 (a
    parent takes 2 vectors over NVLink: A + 2 M b); level 3 sends ranks 8-14 on node 1 to parents 3-6 on node 0
    (parents 4-6 take 2 vectors through their NIC: 3A + 8 M b); level 4 sends rank 15 to 7 across (3A + 4 M b). Down
    the same: 2 (2 (A + 2 M b) + 3A + 8 M b + 3A + 4 M b)."""
    inter = (3 * A, BW / 4)

    def t(algorithm: str) -> float:
        return collective_time("all_reduce", algorithm, 16, M, A, BW, inter=inter, local=8)

    assert t("naive") == pytest.approx(3 * A + 32 * M * B, rel=1e-12)
    assert t("ps") == pytest.approx(2 * (3 * A + 32 * M * B), rel=1e-12)
    assert t("tree") == pytest.approx(2 * (2 * (A + 2 * M * B) + 3 * A + 8 * M * B + 3 * A + 4 * M * B), rel=1e-12)


def test_a_65536_way_ring_is_priced_in_linear_memory() -> None:
    import tracemalloc

    p = 65_536
    tracemalloc.start()
    try:
        s = schedule("all_reduce", "ring", p)
        t = s.time(M, A, BW)
        per_rank = bytes_sent_per_rank("all_reduce", "ring", p, M)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert t == pytest.approx(2 * (p - 1) * A + 2 * M * (p - 1) / p * B, rel=1e-12)
    assert per_rank == pytest.approx(2 * (p - 1) / p * M, rel=1e-12)
    assert peak < 50 * p * 8  # a few arrays of p numbers; the built steps would be (p-1) x p of them, 34 GB


def test_a_65536_way_naive_exchange_is_placed_in_closed_form() -> None:
    """Placed on nodes of 8, the naive exchange's one step of p (p-1) transfers (4.3e9) is read in closed form: each
    GPU sends 7 vectors over its node and p - 8 through its NIC."""
    p = 65_536
    t = schedule("all_reduce", "naive", p).time(M, A, BW, (3 * A, BW / 4), local=8)
    assert t == pytest.approx(3 * A + (p - 8) * M * 4 * B, rel=1e-12)


@pytest.mark.parametrize(("algorithm", "p"), [("ring", 12), ("naive", 5), ("hierarchical", 16), ("tree", 9)])
def test_transfers_count_without_building_the_steps(algorithm: str, p: int) -> None:
    s = schedule("all_reduce", algorithm, p, 4)
    assert s.transfers == sum(len(step.src) for step in s.steps)
