"""The analytic memory model against the ZeRO paper's figures and hand-derived remat accounting."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plansim.costs.memory import LayerActivations, model_state_bytes
from plansim.costs.remat_policies import REMAT_POLICIES, stage_activation_bytes


@pytest.mark.parametrize("zero,published_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_model_states_match_rajbhandari_2020(zero: int, published_gb: float) -> None:
    # ZeRO (Rajbhandari et al. 2020) Figure 1: 7.5B parameters, N_d = 64, mixed-precision Adam (K = 12). The paper
    # prints one decimal, so the check is to half a unit of that (0.05 GB): stricter than 1% for 120, 31.4 and
    # 16.6 GB; for stage 3 the exact 16 * 7.5e9 / 64 = 1.875 GB is what the paper rounds to 1.9.
    states = model_state_bytes(7.5e9, 64, zero, mixed_precision=True)
    assert abs(states.total / 1e9 - published_gb) <= 0.05


def test_fp32_training_and_fp32_grad_buffers() -> None:
    fp32 = model_state_bytes(1e9, 1, 0, mixed_precision=False)
    assert (fp32.weights, fp32.gradients, fp32.optimizer) == (4e9, 4e9, 8e9)
    main_grad = model_state_bytes(1e9, 1, 0, mixed_precision=True, fp32_grad_accum=True)
    assert (main_grad.weights, main_grad.gradients, main_grad.optimizer) == (2e9, 4e9, 12e9)


@given(params=st.integers(1, 10**11), dp=st.integers(1, 1024), zero=st.integers(0, 3))
def test_zero_never_adds_memory_and_sharding_is_exact(params: int, dp: int, zero: int) -> None:
    s = model_state_bytes(params, dp, zero)
    assert s.total <= model_state_bytes(params, dp, zero - 1).total if zero else True
    # Every stage's total is the closed form from ZeRO sec 5.
    expected = {0: 16, 1: 4 + 12 / dp, 2: 2 + 14 / dp, 3: 16 / dp}[zero] * params
    assert s.total == pytest.approx(expected, rel=1e-12)


A = LayerActivations(full=34.0, selective=24.0, layer_input=2.0)


def test_remat_policies_by_hand() -> None:
    layers = [A] * 9
    assert stage_activation_bytes("none", layers, in_flight=3) == 3 * 9 * 34
    assert stage_activation_bytes("selective", layers, in_flight=3) == 3 * 9 * 24 + 10
    assert stage_activation_bytes("full", layers, in_flight=3) == 3 * 9 * 2 + 34
    # sqrt(9) = 3 segments of 3 layers: 3 segment inputs stored, one segment (3 layers) rebuilt.
    assert stage_activation_bytes("sqrt", layers, in_flight=3) == 3 * 3 * 2 + 3 * 34
    assert stage_activation_bytes("none", layers, in_flight=2, unrecomputed=5) == 2 * 9 * 34 + 5


@given(n=st.integers(1, 200), in_flight=st.integers(1, 16))
def test_remat_orders_memory(n: int, in_flight: int) -> None:
    layers = [A] * n
    none, sel, full, sq = (stage_activation_bytes(p, layers, in_flight) for p in ("none", "selective", "full", "sqrt"))
    # Per micro-batch full keeps least and none most; the rebuilt working set adds at most one layer (or core).
    assert full <= none + A.full
    assert sel <= none + (A.full - A.selective)
    assert in_flight * n * A.layer_input <= in_flight * n * A.selective <= in_flight * n * A.full
    k = math.ceil(math.sqrt(n))
    assert sq == in_flight * math.ceil(n / k) * A.layer_input + min(k, n) * A.full


def test_scheduled_remat_has_no_closed_form_storage() -> None:
    """milp keeps what its stage's MILP schedule says: asking its registry entry for a block's bytes is refused."""
    with pytest.raises(ValueError, match="schedule"):
        REMAT_POLICIES["milp"].stored(10.0, 4.0, 2.0, segment_start=True)
