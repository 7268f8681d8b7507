"""Pipeline schedules: closed forms against a brute-force list scheduler of forward/backward tasks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plansim.pipeline.orders import PipeOp
from plansim.pipeline.schedules import SCHEDULES, get_schedule

# Largest float comparisons here sum a few dozen passes: relative error well below this.
REL = 1e-9


def brute_force(
    name: str, tf: list[float], tb: list[float], m: int, v: int = 1, tw: list[float] | None = None
) -> tuple[float, list[float]]:
    """Makespan and peak micro-batches held per stage, by running each stage's order (``schedule.order``), every
    pass as soon as its input is ready.

    Per chunk of stage s: F takes tf[s]/v, B tb[s]/v and W tw[s]/v (split schedules; otherwise B includes W's time).
    With global chunk g = chunk * p + s: F(g, i) needs F(g-1, i); B(g, i) needs B(g+1, i), or F(g, i) on the last
    chunk; W(g, i) needs B(g, i). Held: forwards run whose backward has not, in units of the stage's layers.
    """
    p = len(tf)
    sched = get_schedule(name)
    tw = tw if tw is not None else [0.0] * p
    if not sched.split_backward:
        tb, tw = [b + w for b, w in zip(tb, tw, strict=True)], [0.0] * p
    orders = [sched.order(s, p, m, v) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    clock, pos, held, peak = [0.0] * p, [0] * p, [0] * p, [0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] == len(orders[s]):
                continue
            op = orders[s][pos[s]]
            g = op.chunk * p + s
            dep = {
                "F": ("F", g - 1, op.microbatch) if g > 0 else None,
                "B": ("B", g + 1, op.microbatch) if g < p * v - 1 else ("F", g, op.microbatch),
                "W": ("B", g, op.microbatch),
            }[op.kind]
            if dep is not None and dep not in done:
                continue
            start = max(clock[s], done[dep] if dep else 0.0)
            clock[s] = start + {"F": tf, "B": tb, "W": tw}[op.kind][s] / v
            done[(op.kind, g, op.microbatch)] = clock[s]
            held[s] += {"F": 1, "B": -1, "W": 0}[op.kind]
            peak[s] = max(peak[s], held[s])
            pos[s] += 1
            progressed = True
        assert progressed, f"{name} deadlocked"
    return max(clock), [x / v for x in peak]


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
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved", "zb-h1"}
    assert [n for n in SCHEDULES if SCHEDULES[n].split_backward] == ["zb-h1"]
    assert [n for n in SCHEDULES if SCHEDULES[n].model_chunks] == ["interleaved"]


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 6), rounds=st.integers(1, 4), v=st.integers(2, 4), tf=st.floats(0.5, 2.0))
def test_interleaved_orders_match_the_closed_forms(p: int, rounds: int, v: int, tf: float) -> None:
    m, tb = p * rounds, 2 * tf
    makespan, peak = brute_force("interleaved", [tf] * p, [tb] * p, m, v)
    sched = get_schedule("interleaved")
    assert sched.step_time([tf + tb] * p, m, v) == pytest.approx(makespan, rel=REL)  # (m + (p-1)/v) t
    assert [sched.in_flight(s, p, m, v) for s in range(p)] == pytest.approx(peak)


def chunk_peak(order: list[PipeOp], chunk: int) -> int:
    """The most micro-batches one chunk of a stage holds (forward run, backward not yet), from the order alone."""
    held = peak = 0
    for op in order:
        if op.chunk == chunk and op.kind != "W":
            held += 1 if op.kind == "F" else -1
            peak = max(peak, held)
    return peak


@given(name=st.sampled_from(["gpipe", "1f1b", "zb-h1"]), p=st.integers(1, 8), m=st.integers(1, 16))
def test_ends_in_flight_follow_the_orders(name: str, p: int, m: int) -> None:
    # The embedding lives in stage 0's first chunk, the output layer in the last stage's last chunk.
    sched = get_schedule(name)
    first, last = chunk_peak(sched.order(0, p, m, 1), 0), chunk_peak(sched.order(p - 1, p, m, 1), 0)
    assert sched.ends_in_flight(p, m, 1) == (first, last)


def test_interleaved_ends_in_flight_follow_the_order() -> None:
    sched = get_schedule("interleaved")
    for p, v, rounds in itertools.product((2, 4, 8), (2, 3), (1, 2, 3)):
        m = p * rounds
        first, last = chunk_peak(sched.order(0, p, m, v), 0), chunk_peak(sched.order(p - 1, p, m, v), v - 1)
        assert (first, last) == (min(2 * p, m), 1)
        assert sched.ends_in_flight(p, m, v) == (first, last)


# ZB-H1 for p equal stages, each pass's time given: the order run by the list scheduler against the closed form.
@settings(max_examples=80, deadline=None)
@given(
    p=st.integers(1, 6),
    m=st.integers(1, 12),
    tf=st.floats(0.25, 3.0),
    tb=st.floats(0.25, 3.0),
    w_share=st.floats(0.0, 1.0),
)
def test_zb_h1_equal_stages_match_the_closed_form(p: int, m: int, tf: float, tb: float, w_share: float) -> None:
    tw = w_share * min(tf, tb)  # W <= F and W <= B: what the cost model gives (see _zb_h1_step_time)
    makespan, peak = brute_force("zb-h1", [tf] * p, [tb] * p, m, tw=[tw] * p)
    sched = get_schedule("zb-h1")
    closed = sched.step_time([tf + tb + tw] * p, m, 1, weight_times=[tw] * p)
    assert closed == pytest.approx(makespan, rel=REL)
    if m >= p:  # Qi et al. 2024 sec 2.1: bubble (p-1)(T_F + T_B - T_W), against 1F1B's (p-1)(T_F + T_B + T_W)
        assert closed - m * (tf + tb + tw) == pytest.approx((p - 1) * (tf + tb - tw), rel=REL, abs=1e-12)
    # Between F and B: 1F1B's in-flight counts (what the held-back W passes keep: test_zb_h1_held_points_...).
    assert [sched.in_flight(s, p, m, 1) for s in range(p)] == peak
    assert sched.ends_in_flight(p, m, 1) == (peak[0], peak[-1])
    one_f_one_b, _ = brute_force("1f1b", [tf] * p, [tb] * p, m, tw=[tw] * p)
    assert makespan <= one_f_one_b * (1 + REL)


@settings(max_examples=40, deadline=None)
@given(
    p=st.integers(1, 6),
    m=st.integers(1, 12),
    tf=st.floats(0.25, 3.0),
    tb=st.floats(0.25, 3.0),
    tw=st.floats(0.0, 4.0),
)
def test_zb_h1_closed_form_is_a_lower_bound_when_w_outweighs_f_or_b(
    p: int, m: int, tf: float, tb: float, tw: float
) -> None:
    makespan, _ = brute_force("zb-h1", [tf] * p, [tb] * p, m, tw=[tw] * p)
    closed = get_schedule("zb-h1").step_time([tf + tb + tw] * p, m, 1, weight_times=[tw] * p)
    assert m * (tf + tb + tw) <= closed <= makespan * (1 + REL)


def test_zb_h1_figure_3_cuts_the_1f1b_bubble_to_a_third() -> None:
    # Qi et al. 2024 Fig. 3 (top): p=4, m=8, T_F = T_B = T_W; 1F1B's bubble is 3(p-1) passes, ZB-H1's p-1.
    makespan, _ = brute_force("zb-h1", [1.0] * 4, [1.0] * 4, 8, tw=[1.0] * 4)
    one_f_one_b, _ = brute_force("1f1b", [1.0] * 4, [1.0] * 4, 8, tw=[1.0] * 4)
    assert (makespan - 24, one_f_one_b - 24) == (3.0, 9.0)


@settings(max_examples=40, deadline=None)
@given(
    times=st.lists(st.tuples(st.floats(0.5, 2.0), st.floats(0.5, 2.0), st.floats(0.0, 1.0)), min_size=1, max_size=6),
    m=st.integers(1, 12),
)
def test_zb_h1_unequal_stages_stay_between_the_slowest_stage_and_1f1b(
    times: list[tuple[float, float, float]], m: int
) -> None:
    tw = [w * min(f, b) for f, b, w in times]
    t = [f + b + w for (f, b, _), w in zip(times, tw, strict=True)]
    zb, one_f_one_b = get_schedule("zb-h1"), get_schedule("1f1b")
    closed = zb.step_time(t, m, 1, weight_times=tw)
    assert m * max(t) <= closed <= one_f_one_b.step_time(t, m, 1) * (1 + REL)
    assert zb.step_time(t, m, 1) == pytest.approx(one_f_one_b.step_time(t, m, 1), rel=REL)  # no W: 1F1B


@pytest.mark.parametrize("p,m", [(4, 8), (8, 16), (8, 4), (16, 32)])
@pytest.mark.parametrize("head", [0.0, 0.3, 1.0])
def test_zb_h1_estimate_for_a_heavier_last_stage(p: int, m: int, head: float) -> None:
    # Equal blocks (T_F, T_B, T_W = 1, 1.1, 0.9), the embedding on stage 0 and a output layer of `head` blocks on the
    # last: the closed form against the order run pass by pass.
    tf, tb, tw = [1.0] * p, [1.1] * p, [0.9] * p
    tf[0], tb[0] = 1.05, 1.15
    tf[-1], tb[-1], tw[-1] = 1 + head, 1.1 + head, 0.9 + head
    makespan, _ = brute_force("zb-h1", tf, tb, m, tw=tw)
    t = [f + b + w for f, b, w in zip(tf, tb, tw, strict=True)]
    assert get_schedule("zb-h1").step_time(t, m, 1, weight_times=tw) == pytest.approx(makespan, rel=0.04)


def held_states(order: list[PipeOp]) -> dict[str, set[tuple[int, int]]]:
    """Every state of one stage's order as (micro-batches between F and B, between B and W), by where it is taken:
    at the start of a B (``start``), at its end (``end``: the micro-batch just through B counted between B and W),
    and after each forward or W (``other``). Walked pass by pass from the order alone."""
    stored = weight = 0
    states: dict[str, set[tuple[int, int]]] = {"start": set(), "end": set(), "other": set()}
    for op in order:
        if op.kind == "B":
            states["start"].add((stored, weight))
            stored, weight = stored - 1, weight + 1
            states["end"].add((stored, weight))
        else:
            stored, weight = (stored + 1, weight) if op.kind == "F" else (stored, weight - 1)
            states["other"].add((stored, weight))
    assert stored == weight == 0
    return states


# Bytes per stored and per weight-held micro-batch, and what a B's start and end add: weight-held ones below, equal
# to and above the stored ones (full recompute keeps less than W needs before B), extras from none to large.
MEMORY_WEIGHTS = [
    (stored, weight, start, end)
    for stored, weight in ((1.0, 0.0), (1.0, 0.3), (1.0, 1.0), (1.0, 2.5), (0.0, 1.0), (0.2, 7.0))
    for start, end in ((0.0, 0.0), (0.5, 0.1), (0.1, 0.5), (3.0, 2.0))
]


@pytest.mark.parametrize("p", range(2, 9))
def test_zb_h1_held_points_are_the_peaks_of_the_order(p: int) -> None:
    """``held`` (closed form) against every state of ``zb_h1_order`` walked pass by pass, for m in 1..3p: each of
    its points is a state of the order of its kind, and for any bytes per micro-batch the largest of its points is
    the order's peak (the ends of forwards and W passes, given a B start's extra, included)."""
    sched = get_schedule("zb-h1")
    for m, s in itertools.product(range(1, 3 * p + 1), range(p)):
        states = held_states(sched.order(s, p, m, 1))
        points = sched.held(s, p, m, 1)
        for h in points:
            assert (h.stored, h.weight) in states["end" if h.after_backward else "start"]
        for a, k, x, y in MEMORY_WEIGHTS:
            closed = max(h.stored * a + h.weight * k + (y if h.after_backward else x) for h in points)
            walked = max(
                max(sa * a + sk * k + x for sa, sk in states["start"] | states["other"]),
                max(sa * a + sk * k + y for sa, sk in states["end"]),
            )
            assert closed == pytest.approx(walked, rel=REL), (p, m, s, a, k, x, y)
        # Qi et al. 2024 sec 2.1: once m >= p every stage keeps p micro-batches between F and W, p - s of them whole
        if m >= p:
            assert max((h.stored, h.weight) for h in points if not h.after_backward) == (p - s, s)
            assert max(h.stored + h.weight for h in points) == p
        # with nothing kept for W the peak is 1F1B's in-flight count
        assert max(h.stored for h in points) == sched.in_flight(s, p, m, 1)


@given(name=st.sampled_from(["gpipe", "1f1b", "interleaved"]), p=st.integers(1, 8), m=st.integers(1, 16))
def test_unsplit_schedules_hold_their_in_flight_count(name: str, p: int, m: int) -> None:
    v = 2 if name == "interleaved" else 1
    m = m * p if name == "interleaved" else m
    sched = get_schedule(name)
    for s in range(p):
        assert [(h.stored, h.weight, h.after_backward) for h in sched.held(s, p, m, v)] == [
            (sched.in_flight(s, p, m, v), 0.0, False)
        ]
