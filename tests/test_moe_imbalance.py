"""Routing imbalance of a mixture of experts (``moe_imbalance``, ``plansim.workload.moe.Routing``): 1.0 is the
balanced model to the last bit; the busiest expert-parallel rank's rows and all-to-all bytes against the closed
form; a capacity factor caps them; the step time grows monotonically with it in both engines, which agree within 2%;
peak memory grows, model FLOPs do not; a model without routed experts refuses it; the discrete-event engine's
per-micro-batch samples are reproducible by seed and their mean is the fixed pricing's."""

from __future__ import annotations

import math
import statistics
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plansim.api import simulate
from plansim.errors import PlansimError
from plansim.result import Result
from plansim.workload import ModelSpec, load_model, with_moe_imbalance
from plansim.workload.build import build_sharded
from plansim.workload.graph import Sharding, model_flops

STRATEGY = "dp=8,ep=8,micro_batch=1,global_batch=16,zero=1"
HARDWARE = "dgx-h100"


@cache
def small() -> ModelSpec:
    """Mixtral 8x7B cut to 2 blocks at 2,048 tokens: its MoE layer, seconds to price."""
    return load_model("mixtral-8x7b").model_copy(update={"layers": 2, "seq_len": 2048})


@cache
def run(x: float, engine: str, strategy: str = STRATEGY) -> Result:
    return simulate(small(), HARDWARE, strategy, gpus=8, engine=engine, moe_imbalance=x)


def figures(r: Result) -> tuple[object, ...]:
    return (
        r.step_time_s,
        r.peak_memory_bytes,
        r.mfu,
        r.hfu,
        tuple(r.time_breakdown_s.items()),
        tuple(r.comm_bytes_per_gpu.items()),
    )


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_imbalance_one_is_the_balanced_model_to_the_last_bit(engine: str) -> None:
    spec = small()
    assert spec.moe_imbalance == 1.0 and with_moe_imbalance(spec, 1.0) is spec
    given = ModelSpec.model_validate({**spec.file_fields(), "moe_imbalance": 1.0})
    assert "moe_imbalance" not in spec.file_fields()  # the default: a model file need not say it
    a = simulate(spec, HARDWARE, STRATEGY, gpus=8, engine=engine)
    b = simulate(given, HARDWARE, STRATEGY, gpus=8, engine=engine)
    assert figures(a) == figures(b) == figures(run(1.0, engine))


def test_the_busiest_rank_receives_x_times_the_mean_rows() -> None:
    """Closed form: the rank's tokens T = b s, its send buffer S = T k rows; the busiest of ep ranks receives
    ceil(x S) rows, which its dispatch and combine all-to-alls carry (x hidden x 2 bytes) and its experts run; the
    permutation over its own tokens stays at S."""
    b, s, k, h, E, ep = 1, 2048, 2, 4096, 8, 8
    S = b * s * k
    sh = Sharding(micro_batch=b, act_bytes=2, ep=ep)
    for x in (1.0, 1.3, 2.5):
        g = build_sharded(with_moe_imbalance(small(), x), sh)
        rows = math.ceil(x * S) if x != 1.0 else S
        for name in ("L1.dispatch", "L1.combine"):
            assert g.nodes[name]["comm_bytes"] == 2 * rows * h
        up = g.nodes["L1.experts_gate_up"]
        assert up["flops"] == 2 * rows * 2 * 14336 * h  # one local expert (E/ep = 1), gate and up
        assert g.nodes["L1.permute"]["bytes"] == 2 * (b * s * h + S * h)
        assert up.get("mean_share", 1.0) == pytest.approx(S / rows)
    assert E // ep == 1


def test_one_rank_of_ep_receives_at_most_every_row_and_ep_1_changes_nothing() -> None:
    sh = Sharding(micro_batch=1, act_bytes=2, ep=2)
    at_ep = build_sharded(with_moe_imbalance(small(), 2.0), sh)
    beyond = build_sharded(with_moe_imbalance(small(), 7.0), sh)
    assert at_ep.nodes["L1.dispatch"]["comm_bytes"] == beyond.nodes["L1.dispatch"]["comm_bytes"] == 2 * 2 * 4096 * 4096
    one = Sharding(micro_batch=1, act_bytes=2, ep=1)
    a, b = build_sharded(small(), one), build_sharded(with_moe_imbalance(small(), 1.5), one)
    assert dict(a.nodes(data=True)) == dict(b.nodes(data=True))


def test_a_capacity_factor_caps_the_busiest_rank_and_its_tokens_are_dropped() -> None:
    from plansim.workload.moe import routing

    padded = small().model_copy(update={"capacity_factor": 1.25})
    sh = Sharding(micro_batch=1, act_bytes=2, ep=8)
    balanced = build_sharded(padded, sh)
    skewed = build_sharded(with_moe_imbalance(padded, 2.0), sh)
    assert dict(balanced.nodes(data=True)) == dict(skewed.nodes(data=True))
    assert routing(with_moe_imbalance(padded, 2.0), sh).dropped == pytest.approx(1 - 1.25 / 2.0)
    assert routing(with_moe_imbalance(padded, 1.2), sh).dropped == 0.0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(1.0, 3.0), st.floats(1.0, 3.0))
def test_step_time_grows_monotonically_with_the_imbalance(a: float, b: float) -> None:
    low, high = sorted((round(a, 3), round(b, 3)))
    for engine in ("analytic", "des"):
        assert run(low, engine).step_time_s <= run(high, engine).step_time_s
    if high > low + 0.05:  # strictly: the expert GEMMs and all-to-alls grow
        assert run(low, "analytic").step_time_s < run(high, "analytic").step_time_s


@pytest.mark.parametrize("strategy", [STRATEGY, "dp=8,ep=4,micro_batch=1,global_batch=16,zero=1"])
def test_engines_agree_within_two_percent_at_1_3(strategy: str) -> None:
    a, d = run(1.3, "analytic", strategy), run(1.3, "des", strategy)
    assert d.step_time_s == pytest.approx(a.step_time_s, rel=0.02)
    assert run(1.3, "analytic", strategy).step_time_s > run(1.0, "analytic", strategy).step_time_s


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_memory_grows_and_model_flops_do_not(engine: str) -> None:
    assert run(1.5, engine).peak_memory_bytes > run(1.0, engine).peak_memory_bytes
    assert run(1.5, engine).mfu < run(1.0, engine).mfu  # the same useful FLOPs in a longer step
    sh = Sharding(micro_batch=1, act_bytes=2, ep=8)
    balanced = model_flops(build_sharded(small(), sh))
    assert model_flops(build_sharded(with_moe_imbalance(small(), 1.5), sh)) == pytest.approx(balanced, rel=1e-12)


def test_a_model_without_routed_experts_or_a_value_below_one_is_refused_in_one_line() -> None:
    with pytest.raises(PlansimError, match="without routed experts") as err:
        simulate("llama3-8b", HARDWARE, "dp=8", moe_imbalance=1.3)
    assert "\n" not in str(err.value) and "--moe-imbalance" in str(err.value)
    with pytest.raises(PlansimError, match="at least 1"):
        with_moe_imbalance(small(), 0.9)
    with pytest.raises(ValueError, match="do not use 'moe_imbalance'"):
        ModelSpec.model_validate({**load_model("llama3-8b").file_fields(), "moe_imbalance": 1.2})


def test_the_cli_takes_it_on_simulate_and_refuses_it_for_a_dense_model() -> None:
    from typer.testing import CliRunner

    from plansim.cli.app import app

    args = ["simulate", "-m", "llama3-8b", "-H", HARDWARE, "-s", "dp=8", "--moe-imbalance", "1.3"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code != 0 and "without routed experts" in out.output


def sampled(seed: int, spread: float = 0.5) -> float:
    r = simulate(small(), HARDWARE, STRATEGY, gpus=8, engine="des", moe_imbalance=1.3, moe_imbalance_spread=spread,
                 seed=seed)  # fmt: skip
    return r.step_time_s


def test_sampled_imbalance_is_reproducible_by_seed_and_its_mean_is_the_fixed_pricing() -> None:
    assert sampled(3) == sampled(3)
    draws = [sampled(seed) for seed in range(12)]
    assert len(set(draws)) == len(draws)  # each seed draws apart
    fixed = run(1.3, "des").step_time_s
    # 16 micro-batches a step, each's excess log-normal with sigma 0.5: the step's mean is the fixed pricing's
    # (each task is linear in the draw, and one stage adds its tasks up); 12 steps leave ~1.5% of sampling error
    assert statistics.mean(draws) == pytest.approx(fixed, rel=0.03)
    assert min(draws) < fixed < max(draws)


def test_sampling_needs_an_imbalance_and_the_discrete_event_engine() -> None:
    with pytest.raises(PlansimError, match="balanced"):
        simulate(small(), HARDWARE, STRATEGY, gpus=8, engine="des", moe_imbalance_spread=0.5)
    with pytest.raises(PlansimError, match="discrete-event"):
        simulate(small(), HARDWARE, STRATEGY, gpus=8, moe_imbalance=1.3, moe_imbalance_spread=0.5)
    with pytest.raises(PlansimError, match="moe-imbalance-spread"):
        simulate(small(), HARDWARE, STRATEGY, gpus=8, engine="des", moe_imbalance=1.3, moe_imbalance_spread=-1)


def test_robust_planning_prices_the_worst_imbalance_and_reports_its_sensitivity() -> None:
    from plansim.planner import Constraints, plan
    from plansim.planner.robust import Rival, robust_report
    from plansim.uncertainty import IMBALANCE_HIGH, model_ranges

    assert model_ranges(load_model("llama3-8b")) == {}  # a dense model has no such input
    r = plan(small(), HARDWARE, gpus=8, global_batch=16, des=False, robust=True, moe_imbalance=1.2, jobs=1,
             constraints=Constraints(remat=("full",), zero=1, ep=8))  # fmt: skip
    assert r.robust is not None and r.robust.worst["moe_imbalance"] == IMBALANCE_HIGH
    assert r.robust.nominal["moe_imbalance"] == 1.2
    sens = next(s for s in r.robust.sensitivities if s.name == "moe_imbalance")
    assert (sens.low, sens.high) == (1.0, IMBALANCE_HIGH) and sens.at_high_s > sens.at_low_s
    assert "routing imbalance 1.5x" in r.robust.sentences()[0]
    # the break-even imbalance: an ep=8 plan against one without expert parallelism, which the imbalance leaves be
    cluster_model = small()
    from plansim.hardware import load_hardware
    from plansim.strategy.schema import Strategy

    cluster = load_hardware(HARDWARE, gpus=8)
    ep8 = Strategy.model_validate(dict(dp=8, ep=8, micro_batch=1, global_batch=16, zero=1))
    tp8 = Strategy.model_validate(dict(dp=1, tp=8, sequence_parallel=True, micro_batch=1, global_batch=16, zero=1))
    report = robust_report(cluster_model, cluster, ep8, [Rival("tp8", tp8)])
    even = next(s for s in report.sensitivities if s.name == "moe_imbalance").break_evens[0]
    if not even.already:  # ep8 is faster balanced: it stops being so at a finite imbalance, where the two tie
        assert even.above is not None and even.above > 1.0
        at = with_moe_imbalance(small(), even.above)
        a = simulate(at, cluster, ep8).step_time_s
        b = simulate(at, cluster, tp8).step_time_s
        assert a == pytest.approx(b, rel=0.01)
