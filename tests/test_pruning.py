"""The planner prices in full only what could win or be read (``planner.search._Bounds``): its outcome (winner,
finalists and their figures, twins, rejections, the explanation, the Megatron-style reference, the tight
candidates' best) is identical to pricing every candidate, checked against a search whose rule prices everything,
on the README's cases and a hypothesis sweep of small ones; a pruned candidate's bound is below its step time."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plansim.analytic import simulate_analytic
from plansim.api import load_hardware, load_model
from plansim.pipeline.schedules import SCHEDULES
from plansim.planner import Constraints, plan
from plansim.planner.output import plan_summary
from plansim.planner.search import _Bounds


def _everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Price every candidate that fits in full (the search before pruning)."""
    monkeypatch.setattr(_Bounds, "needed", lambda self, s, bound, tight: True)


def _outcome(r: Any) -> str:
    """Everything a plan says, as the JSON it writes, with the best tight candidate's figures."""
    data = plan_summary(r)
    tight = r.outcome.tight[:1]
    data["tight"] = [(p.strategy.model_dump_json(), p.result.to_dict()) for p in tight]
    data["tight_count"] = r.outcome.tight_count
    return json.dumps(data, sort_keys=True, default=str)


def _both(monkeypatch: pytest.MonkeyPatch, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    pruned = plan(*args, **kwargs)
    with monkeypatch.context() as m:
        _everything(m)
        full = plan(*args, **kwargs)
    return pruned, full


@pytest.mark.parametrize(
    "model,hardware,gpus,batch,extra",
    [
        ("gpt3-175b", "dgx-a100", 1024, 1536, {}),  # the README's main job (its DES aside)
        ("gpt3-1.3b", "dgx-a100", 16, 64, {"constraints": {"pp": 4, "schedule": "1f1b"}}),  # the README's split
        ("gpt3-1.3b", "dgx-a100", 32, 128, {"robust": True}),  # a robust search: each family's best read
        ("gpt3-1.3b", "dgx-h100", 16, 64, {"constraints": {"framework": "all"}}),  # each framework's best read
    ],
)
def test_pruning_changes_no_outcome(
    monkeypatch: pytest.MonkeyPatch, model: str, hardware: str, gpus: int, batch: int, extra: dict[str, Any]
) -> None:
    pruned, full = _both(monkeypatch, model, hardware, gpus=gpus, global_batch=batch, des=False, **extra)
    assert _outcome(pruned) == _outcome(full)
    assert not full.outcome.pruned and pruned.outcome.fit_count == full.outcome.fit_count
    assert len(pruned.outcome.fitting) < len(full.outcome.fitting)  # it prunes
    exact = {p.strategy: p.result for p in full.outcome.fitting}
    for p in pruned.outcome.fitting:  # what it prices, it prices alike
        assert p.result.to_dict() == exact[p.strategy].to_dict()
    for q in pruned.outcome.pruned:
        if not q.tight:
            assert exact[q.strategy].step_time_s >= q.bound_s * (1 - 1e-12)
            assert exact[q.strategy].peak_memory_bytes == q.peak_memory_bytes


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    model=st.sampled_from(["gpt3-125m", "gpt3-350m", "gpt3-1.3b", "llama2-7b"]),
    gpus=st.sampled_from([8, 16]),
    batch=st.sampled_from([8, 16, 32, 64]),
    top_k=st.integers(1, 6),
    headroom=st.sampled_from([0.0, 0.05, 0.3]),
    objective=st.sampled_from(["step_time", "tokens_per_s"]),
    framework=st.sampled_from(["megatron", "all"]),
)
def test_pruning_changes_no_outcome_on_small_cases(
    model: str, gpus: int, batch: int, top_k: int, headroom: float, objective: str, framework: str
) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        c = Constraints(headroom=headroom, framework=framework, remat=("none", "full"))
        try:
            pruned, full = _both(
                monkeypatch, model, "dgx-a100", gpus=gpus, global_batch=batch, constraints=c, des=False, milp=False,
                top_k=top_k, objective=objective,
            )  # fmt: skip
        except Exception as exc:  # a space with no candidate is refused alike either way
            assert "PlansimError" in type(exc).__name__, exc
            return
        assert _outcome(pruned) == _outcome(full)


def test_a_bound_is_below_the_step_time_and_memory_is_the_results() -> None:
    from plansim.analytic import step_frame
    from plansim.strategy.schema import Strategy

    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=16)
    for s in (
        Strategy(dp=2, tp=2, pp=4, micro_batch=1, global_batch=32, schedule="1f1b", zero=1),
        Strategy(dp=4, tp=1, pp=4, micro_batch=2, global_batch=32, schedule="interleaved", virtual_stages=2),
        Strategy(dp=16, micro_batch=2, global_batch=32, zero=3),
        Strategy(
            dp=8, tp=2, micro_batch=4, global_batch=32, remat="full", tp_comm_overlap=True, sequence_parallel=True
        ),
    ):
        frame = step_frame(model, cluster, s)
        r = simulate_analytic(model, cluster, s)
        assert r.step_time_s >= frame.bound_s() * (1 - 1e-12) >= frame.least_s() * (1 - 2e-12) and frame.least_s() > 0
        assert (frame.peak_memory_bytes, frame.fits, frame.memory_margin) == (
            r.peak_memory_bytes,
            r.fits,
            r.memory_margin,
        )
        assert {k: round(v) for k, v in frame.memory().items()} == {
            k: v for k, v in r.memory_breakdown_bytes.items() if k in frame.memory()
        }


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    schedule=st.sampled_from(sorted(SCHEDULES)),
    p=st.integers(1, 8),
    v=st.integers(1, 3),
    rounds=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_a_schedule_takes_at_least_every_micro_batch_of_its_busiest_stage(
    schedule: str, p: int, v: int, rounds: int, seed: int
) -> None:
    """What ``StepFrame.least_s`` rests on: each stage runs every micro-batch, so no schedule's closed form is
    shorter than ``m`` times its busiest stage's time per micro-batch."""
    import random

    from plansim.pipeline.schedules import get_schedule

    rng = random.Random(seed)
    v = v if schedule == "interleaved" else 1
    m = rounds * p
    times = [rng.uniform(0.1, 5.0) for _ in range(p)]
    weights = [t * rng.uniform(0.0, 0.6) for t in times]
    step = get_schedule(schedule).step_time(times, m, v, weight_times=weights)
    assert step >= m * max(times) * (1 - 1e-12)
