"""remat: milp in the strategy, the analytic engine and the discrete-event lowering."""

from __future__ import annotations

import pytest

from plansim.api import simulate
from plansim.errors import PlansimError
from plansim.strategy.schema import Strategy

BASE = "dp=2,pp=2,micro_batch=1,global_batch=8"


def test_strategy_accepts_milp_and_budget_units() -> None:
    """The budget takes a unit (GB = 1e9 bytes) or bytes; a bad size names the accepted form."""
    s = Strategy.parse("remat=milp,remat_budget=20GB")
    assert (s.remat, s.remat_budget) == ("milp", 20e9)
    assert Strategy.parse("remat=milp,remat_budget=1GiB").remat_budget == 2**30
    with pytest.raises((PlansimError, ValueError), match="20GB"):
        Strategy.parse("remat=milp,remat_budget=lots")


def test_milp_with_room_equals_no_remat() -> None:
    """When keeping every activation fits, the MILP recomputes nothing: the step equals remat=none."""
    none = simulate("gpt3-125m", "dgx-a100", f"{BASE},remat=none", gpus=4)
    milp = simulate("gpt3-125m", "dgx-a100", f"{BASE},remat=milp", gpus=4)
    assert milp.time_breakdown_s["recompute"] == 0.0
    assert milp.step_time_s == pytest.approx(none.step_time_s, rel=1e-12)
    assert milp.peak_memory_bytes == pytest.approx(none.peak_memory_bytes, rel=1e-9)


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_milp_under_a_tight_budget_recomputes_and_fits_it(engine: str) -> None:
    """A budget below the keep-everything activations forces recompute, no more than full recompute's, and the
    activations the engine reports stay within the budget plus the embedding/output layers'."""
    full = simulate("gpt3-125m", "dgx-a100", f"{BASE},remat=full", gpus=4, engine=engine)
    none = simulate("gpt3-125m", "dgx-a100", f"{BASE},remat=none", gpus=4, engine=engine)
    budget = 0.25e9  # below the blocks' activations of either stage (flash attention: 0.39 and 0.32 GB)
    milp = simulate("gpt3-125m", "dgx-a100", f"{BASE},remat=milp,remat_budget={budget:.0f}", gpus=4, engine=engine)
    assert 0 < milp.time_breakdown_s["recompute"] <= full.time_breakdown_s["recompute"] * (1 + 1e-9)
    assert milp.memory_breakdown_bytes["activations"] < none.memory_breakdown_bytes["activations"]


def test_engines_agree_on_milp_recompute() -> None:
    """Both engines read one schedule: the same recompute time per step and the same FLOPs."""
    strat = f"{BASE},remat=milp,remat_budget=600MB"
    a = simulate("gpt3-125m", "dgx-a100", strat, gpus=4)
    d = simulate("gpt3-125m", "dgx-a100", strat, gpus=4, engine="des")
    assert d.time_breakdown_s["recompute"] == pytest.approx(a.time_breakdown_s["recompute"], rel=1e-6)
    assert d.hfu == pytest.approx(a.hfu, rel=0.02)
