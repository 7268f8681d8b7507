"""The DES memory tracker: hand-computed sequences, OOM recording, caller bugs, and random sequences vs brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plansim.des.memory import MemoryTracker, OutOfMemory


def test_hand_computed_sequence_peak_and_timeline() -> None:
    m = MemoryTracker("gpu 0 (stage 0)", capacity_bytes=100.0)
    m.alloc("w", 40.0, 0.0, "weights")
    m.alloc("opt", 20.0, 0.0, "optimizer")  # same time as w: one timeline point
    m.alloc("a0", 10.0, 1.0, "activations")
    m.alloc("a1", 10.0, 2.0, "activations")
    m.free("a0", 3.0)
    m.alloc("g", 15.0, 3.0, "gradients")  # same time as the free: collapses to the last value
    m.free("a1", 4.0)
    m.free("g", 4.0)
    assert m.timeline == [(0.0, 60.0), (1.0, 70.0), (2.0, 80.0), (3.0, 85.0), (4.0, 60.0)]
    assert (m.live_bytes, m.peak_bytes, m.peak_time_s) == (60.0, 85.0, 3.0)
    assert m.peak_by_category == {"weights": 40.0, "optimizer": 20.0, "activations": 10.0, "gradients": 15.0}
    assert m.live_tensors() == {"w": 40.0, "opt": 20.0}
    assert m.live_by_category() == {"weights": 40.0, "optimizer": 20.0, "activations": 0.0, "gradients": 0.0}
    assert m.oom is None


def test_peak_by_category_is_a_snapshot_of_the_first_peak() -> None:
    m = MemoryTracker("d", 1e12)
    m.alloc("a", 5.0, 0.0, "activations")
    m.alloc("b", 5.0, 1.0, "workspace")
    m.free("b", 2.0)
    m.alloc("c", 5.0, 3.0, "comm_buffer")  # equals the peak: not a new one
    m.free("a", 4.0)
    assert (m.peak_bytes, m.peak_time_s) == (10.0, 1.0)
    assert m.peak_by_category == {"activations": 5.0, "workspace": 5.0}
    m.alloc("big", 100.0, 5.0, "activations")
    assert m.peak_by_category == {"activations": 100.0, "workspace": 0.0, "comm_buffer": 5.0}


def test_zero_byte_allocation_is_tracked() -> None:
    m = MemoryTracker("d", 0.0)
    m.alloc("empty", 0.0, 0.5, "workspace")
    assert m.live_tensors() == {"empty": 0.0}
    assert m.timeline == [(0.5, 0.0)]
    assert m.oom is None  # 0 live bytes do not exceed 0 capacity
    with pytest.raises(ValueError, match="empty"):
        m.alloc("empty", 0.0, 0.5, "workspace")
    m.free("empty", 0.6)
    assert m.live_tensors() == {}


def test_oom_is_recorded_once_with_the_five_largest() -> None:
    m = MemoryTracker("gpu 3 (stage 1)", capacity_bytes=80e9)
    sizes = {"w": 30e9, "opt": 40e9, "act mb0": 2e9, "act mb1": 2.5e9, "act mb2": 1e9, "tiny": 3e6}
    for i, (name, n) in enumerate(sizes.items()):
        m.alloc(name, n, 0.1 * i, "x")
    assert m.oom is None  # 75.503 GB so far
    m.alloc("act mb3 L12", 5.7e9, 1.234, "activations")
    oom = m.oom
    assert oom == OutOfMemory(
        "gpu 3 (stage 1)",
        1.234,
        81.203e9,
        80e9,
        (("opt", 40e9), ("w", 30e9), ("act mb3 L12", 5.7e9), ("act mb1", 2.5e9), ("act mb0", 2e9)),
    )
    assert oom.message() == (
        "gpu 3 (stage 1) ran out of memory at 1.234 s: 81.2 GB live of 80.0 GB; largest: opt (40.0 GB), "
        "w (30.0 GB), act mb3 L12 (5.7 GB), act mb1 (2.5 GB), act mb0 (2.0 GB)"
    )
    # Still over, and over again later: the first record stays.
    m.alloc("more", 10e9, 2.0, "x")
    m.free("more", 2.5)
    m.free("opt", 2.5)
    m.alloc("again", 50e9, 3.0, "x")
    assert m.oom is oom
    assert m.peak_bytes == pytest.approx(91.203e9)


def test_oom_message_keeps_live_and_capacity_apart() -> None:
    msg = OutOfMemory("gpu0", 0.0, 80.04e9, 80e9, (("act", 3e5),)).message()
    assert "80.04 GB live of 80.00 GB" in msg
    assert "act (300.0 kB)" in msg


@pytest.mark.parametrize(
    "ops,match",
    [
        ([("alloc", "a", 1.0, 0.0), ("alloc", "a", 1.0, 1.0)], "'a'.*already live"),
        ([("free", "b", 0.0)], "'b'.*not live"),
        ([("alloc", "a", 1.0, 0.0), ("free", "a", 1.0), ("free", "a", 2.0)], "'a'.*not live"),
        ([("alloc", "a", 1.0, 2.0), ("alloc", "c", 1.0, 1.0)], "'c'.*backwards"),
        ([("alloc", "a", 1.0, 2.0), ("free", "a", 1.0)], "'a'.*backwards"),
        ([("alloc", "a", -1.0, 0.0)], "'a'.*>= 0"),
    ],
)
def test_caller_bugs_raise_value_error(ops: list[tuple], match: str) -> None:
    m = MemoryTracker("d", 100.0)
    *setup, bad = ops
    for op in setup:
        getattr(m, op[0])(*op[1:], **({"category": "x"} if op[0] == "alloc" else {}))
    before = (m.live_tensors(), m.live_bytes, list(m.timeline))
    with pytest.raises(ValueError, match=match) as exc:
        getattr(m, bad[0])(*bad[1:], **({"category": "x"} if bad[0] == "alloc" else {}))
    assert type(exc.value) is ValueError  # a bug, not a PlansimError
    assert (m.live_tensors(), m.live_bytes, m.timeline) == before  # a refused call changes nothing


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 7), st.integers(0, 10**12), st.sampled_from([0.0, 0.0, 0.5, 1.0]), st.integers(0, 2)),
        max_size=60,
    ),
    capacity=st.integers(0, 4 * 10**12),
)
def test_random_sequences_match_brute_force(ops: list[tuple[int, int, float, int]], capacity: int) -> None:
    # Each op toggles tensor k: allocate it if not live, free it if live. Integer byte counts keep sums exact.
    m = MemoryTracker("d", float(capacity))
    live: dict[str, tuple[float, str]] = {}
    t = 0.0
    sums, points, first_oom = [], [], None
    peak, peak_cats = 0.0, {}
    for k, n, dt, c in ops:
        t += dt
        name, cat = f"t{k}", f"c{c}"
        if name in live:
            m.free(name, t)
            del live[name]
        else:
            m.alloc(name, float(n), t, cat)
            live[name] = (float(n), cat)
        total = sum(b for b, _ in live.values())
        sums.append(total)
        points = [*points[:-1], (t, total)] if points and points[-1][0] == t else [*points, (t, total)]
        if total > peak:
            peak = total
            peak_cats = {}
            for b, cc in live.values():
                peak_cats[cc] = peak_cats.get(cc, 0.0) + b
        if first_oom is None and total > capacity:
            first_oom = (t, total, sorted((b for b, _ in live.values()), reverse=True)[:5])
        assert m.live_bytes == total
        assert m.live_tensors() == {k: b for k, (b, _) in live.items()}
    assert m.peak_bytes == max([0.0, *sums])
    assert m.timeline == points
    assert {k: v for k, v in m.peak_by_category.items() if v} == {k: v for k, v in peak_cats.items() if v}
    if first_oom is None:
        assert m.oom is None
    else:
        assert m.oom is not None
        assert (m.oom.time_s, m.oom.live_bytes, [b for _, b in m.oom.largest]) == first_oom
    for name in list(live):
        m.free(name, t + 1.0)
    assert m.live_bytes == 0.0
    assert m.live_tensors() == {}
    assert all(v == 0.0 for v in m.live_by_category().values())


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.floats(0, 1e10, allow_nan=False), min_size=1, max_size=40))
def test_arbitrary_float_sizes_return_to_exactly_zero(sizes: list[float]) -> None:
    m = MemoryTracker("d", 1e12)
    for i, n in enumerate(sizes):
        m.alloc(f"t{i}", n, float(i), "activations" if i % 2 else "weights")
    assert m.live_bytes == pytest.approx(sum(sizes), rel=1e-9)
    assert m.peak_bytes == pytest.approx(max(sum(sizes[: i + 1]) for i in range(len(sizes))), rel=1e-9)
    for i in range(len(sizes)):
        m.free(f"t{i}", float(len(sizes)))
    assert m.live_bytes == 0.0
    assert m.live_by_category() == {k: 0.0 for k in m.live_by_category()}
    assert m.timeline[-1] == (float(len(sizes)), 0.0)
