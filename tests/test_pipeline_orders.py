"""Per-stage pipeline orders: the published figures, written out by hand, and the invariants of every order.

Timing (bubbles, in-flight counts) against the closed forms is in tests/test_schedules.py, which runs these orders.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plansim.pipeline.orders import PipeOp, gpipe_order, interleaved_order, one_f_one_b_order, zb_h1_order
from plansim.pipeline.schedules import SCHEDULES, get_schedule


def figure(row: str) -> list[PipeOp]:
    """One device's row of a paper's figure, as the figures number things: micro-batches from 1, and a prime for
    the second model chunk of a stage (the lighter shade in Narayanan et al. 2021 Fig. 4)."""
    return [PipeOp(tok[0], int(tok[1:].rstrip("'")) - 1, 1 if tok.endswith("'") else 0) for tok in row.split()]


def test_gpipe_matches_huang_2019_figure_2() -> None:
    # Huang et al. 2019 Fig. 2(c), p=4, m=4: every device runs F0..F3, then B3..B0 (the backward half mirrors the
    # forward half).
    for stage in range(4):
        assert gpipe_order(stage, 4, 4) == figure("F1 F2 F3 F4 B4 B3 B2 B1")


def test_1f1b_matches_narayanan_2021_figure_4_top() -> None:
    # Narayanan et al. 2021 Fig. 4 (top), p=4, m=8; devices 1..4 are stages 0..3.
    rows = [
        "F1 F2 F3 F4 B1 F5 B2 F6 B3 F7 B4 F8 B5 B6 B7 B8",
        "F1 F2 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 F8 B6 B7 B8",
        "F1 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 F8 B7 B8",
        "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 F8 B8",
    ]
    for stage, row in enumerate(rows):
        assert one_f_one_b_order(stage, 4, 8) == figure(row)


def test_interleaved_matches_narayanan_2021_figure_4_bottom() -> None:
    # Narayanan et al. 2021 Fig. 4 (bottom), p=4, m=8, two chunks per device (primed: the second, lighter chunk).
    rows = [
        "F1 F2 F3 F4 F1' F2' F3' F4' F5 F6 F7 B1' F8 B2' F5' B3' F6' B4' F7' B1 F8' B2 "
        "B3 B4 B5' B6' B7' B8' B5 B6 B7 B8",
        "F1 F2 F3 F4 F1' F2' F3' F4' F5 B1' F6 B2' F7 B3' F8 B4' F5' B1 F6' B2 F7' B3 F8' B4 "
        "B5' B6' B7' B8' B5 B6 B7 B8",
        "F1 F2 F3 F4 F1' F2' F3' B1' F4' B2' F5 B3' F6 B4' F7 B1 F8 B2 F5' B3 F6' B4 F7' B5' F8' B6' "
        "B7' B8' B5 B6 B7 B8",
        "F1 F2 F3 F4 F1' B1' F2' B2' F3' B3' F4' B4' F5 B1 F6 B2 F7 B3 F8 B4 F5' B5' F6' B6' F7' B7' F8' B8' "
        "B5 B6 B7 B8",
    ]
    for stage, row in enumerate(rows):
        assert interleaved_order(stage, 4, 8, 2) == figure(row)


def test_zb_h1_matches_qi_2024_figure_3_top() -> None:
    # Qi et al. 2024 Fig. 3 (top), p=4, m=8: 1F1B's F and B; worker i (from 0) holds back its first i W passes, then
    # runs the oldest held W after each B, and the rest at the end (worker 4: W1 right after B4, W6..W8 last).
    rows = [
        "F1 F2 F3 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 F8 B5 W5 B6 W6 B7 W7 B8 W8",
        "F1 F2 F3 B1 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 F8 B6 W5 B7 W6 B8 W7 W8",
        "F1 F2 B1 F3 B2 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 F8 B7 W5 B8 W6 W7 W8",
        "F1 B1 F2 B2 F3 B3 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 F8 B8 W5 W6 W7 W8",
    ]
    for stage, row in enumerate(rows):
        assert zb_h1_order(stage, 4, 8) == figure(row)


def test_zb_h1_with_few_microbatches_still_holds_back_the_first_w_passes() -> None:
    # m < p: the first `stage` backwards keep their W; here stage 2 of 4 never gets past them.
    assert zb_h1_order(2, 4, 2) == figure("F1 F2 B1 B2 W1 W2")
    assert zb_h1_order(1, 4, 2) == figure("F1 F2 B1 B2 W1 W2")
    assert zb_h1_order(0, 4, 2) == figure("F1 F2 B1 W1 B2 W2")


@given(
    name=st.sampled_from(sorted(SCHEDULES)),
    p=st.integers(1, 6),
    m=st.integers(1, 14),
    v=st.integers(1, 4),
)
def test_every_pass_once_and_in_order(name: str, p: int, m: int, v: int) -> None:
    sched = get_schedule(name)
    if name == "interleaved":
        m = p * (1 + m % 3)  # Megatron-LM needs m to be a multiple of p
    else:
        v = 1
    kinds = ("F", "B", "W") if sched.split_backward else ("F", "B")
    for stage in range(p):
        order = sched.order(stage, p, m, v)
        expected = {PipeOp(k, i, c) for k in kinds for i in range(m) for c in range(v)}
        assert len(order) == len(expected) and set(order) == expected
        pos = {op: n for n, op in enumerate(order)}
        for i in range(m):
            for c in range(v):
                ranks = [pos[PipeOp(k, i, c)] for k in kinds]
                assert ranks == sorted(ranks), f"{name} stage {stage}: {kinds} of ({i}, {c}) out of order"


@given(p=st.integers(1, 8), m=st.integers(1, 16))
def test_zb_h1_keeps_the_same_number_of_microbatches_between_f_and_w_on_every_stage(p: int, m: int) -> None:
    # Qi et al. 2024 sec 2.1: ZB-H1 "ensures all workers maintain the same number of in-flight microbatches".
    for stage in range(p):
        held = peak = 0
        for op in zb_h1_order(stage, p, m):
            held += {"F": 1, "B": 0, "W": -1}[op.kind]
            peak = max(peak, held)
        assert peak == min(p, m)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="multiple of p"):
        interleaved_order(0, 4, 6, 2)
    with pytest.raises(ValueError, match="one model chunk"):
        zb_h1_order(0, 4, 8, 2)
    with pytest.raises(ValueError, match="stage 4"):
        one_f_one_b_order(4, 4, 8)
    with pytest.raises(ValueError, match="m, v >= 1"):
        gpipe_order(0, 4, 0)
