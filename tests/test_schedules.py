"""Pipeline schedules: closed forms against a brute-force list scheduler of forward/backward tasks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plansim.schedules import SCHEDULES, get_schedule


def _stage_orders(name: str, p: int, m: int) -> list[list[tuple[str, int]]]:
    """Per-stage task order: GPipe all forwards then all backwards; 1F1B warm-up p-s-1 forwards, then alternate."""
    orders = []
    for s in range(p):
        if name == "gpipe":
            orders.append([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            continue
        warm = min(p - s - 1, m)
        order = [("F", i) for i in range(warm)]
        f, b = warm, 0
        while b < m:
            if f < m:
                order.append(("F", f))
                f += 1
            order.append(("B", b))
            b += 1
        orders.append(order)
    return orders


def brute_force(name: str, tf: list[float], tb: list[float], m: int) -> tuple[float, list[int]]:
    """Makespan and peak micro-batches held per stage, by running every task as soon as its inputs are ready.

    F(s,i) needs F(s-1,i); B(s,i) needs B(s+1,i) (and F(p-1,i) on the last stage); each stage runs its own order.
    """
    p = len(tf)
    orders = _stage_orders(name, p, m)
    done: dict[tuple[str, int, int], float] = {}
    clock, pos, held, peak = [0.0] * p, [0] * p, [0] * p, [0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = ("F", s - 1, i) if kind == "F" else (("B", s + 1, i) if s < p - 1 else ("F", s, i))
            if kind == "F" and s == 0:
                ready = 0.0
            elif dep in done:
                ready = done[dep]
            else:
                continue
            start = max(clock[s], ready)
            clock[s] = start + (tf[s] if kind == "F" else tb[s])
            done[(kind, s, i)] = clock[s]
            held[s] += 1 if kind == "F" else -1
            peak[s] = max(peak[s], held[s])
            pos[s] += 1
            progressed = True
        assert progressed, "schedule deadlocked"
    return max(clock), peak


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), name=st.sampled_from(["gpipe", "1f1b"]))
def test_equal_stages_match_brute_force_and_bubble(p: int, m: int, name: str) -> None:
    tf, tb = 1.0, 2.0
    makespan, peak = brute_force(name, [tf] * p, [tb] * p, m)
    closed = get_schedule(name).step_time([tf + tb] * p, m, 1)
    assert closed == pytest.approx(makespan)
    bubble = (closed - m * (tf + tb)) / closed
    assert bubble == pytest.approx((p - 1) / (m + p - 1))  # GPipe sec 2.3; Narayanan et al. 2021 sec 2.2.1
    for s in range(p):
        assert get_schedule(name).in_flight(s, p, m, 1) == peak[s]
    # The embedding lives with stage 0's first chunk, the output layer with the last stage's last chunk.
    assert get_schedule(name).ends_in_flight(p, m, 1) == (peak[0], peak[-1])


@given(p=st.integers(1, 8), v=st.integers(1, 4), name=st.sampled_from(list(SCHEDULES)))
def test_every_chunk_boundary_sends_once_each_way(p: int, v: int, name: str) -> None:
    v = v if name == "interleaved" else 1
    sends = [get_schedule(name).sends_per_microbatch(s, p, v) for s in range(p)]
    boundaries = p * v - 1 if p > 1 else 0  # p*v chunks in a chain
    assert sum(f for f, _ in sends) == boundaries
    assert sum(b for _, b in sends) == boundaries


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.floats(0.5, 3.0), min_size=1, max_size=5), m=st.integers(1, 10))
def test_unequal_stages_never_beat_the_closed_form_for_gpipe(times: list[float], m: int) -> None:
    # With forward = backward = t/2 per stage, the list schedule's makespan equals (m-1)*max + sum.
    makespan, _ = brute_force("gpipe", [t / 2 for t in times], [t / 2 for t in times], m)
    assert get_schedule("gpipe").step_time(times, m, 1) == pytest.approx(makespan)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (8, 16, 4), (2, 4, 3)])
def test_interleaved_bubble_shrinks_by_v(p: int, m: int, v: int) -> None:
    t = 1.0
    one_f_one_b = get_schedule("1f1b").step_time([t] * p, m, 1) - m * t
    interleaved = get_schedule("interleaved").step_time([t] * p, m, v) - m * t
    assert interleaved == pytest.approx(one_f_one_b / v)  # Narayanan et al. 2021 sec 2.2.2


def test_interleaved_first_stage_memory_factor() -> None:
    # Korthikanti et al. 2022 sec 4.2.3: the first stage holds p * (1 + (p-1)/(p v)) micro-batches' worth.
    p, v, m = 8, 4, 64
    assert get_schedule("interleaved").in_flight(0, p, m, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_registry_names() -> None:
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved"}
