"""The routed experts' gradients reduced over the expert-data-parallel group (``DataParallelPlan.experts``): in
buckets of their own over ``edp``, the rest over dp x cp (Megatron-LM's expert buffers over
``intra_expt_dp_group``), in both engines; against the closed form by hand from the rank's op graph."""

from __future__ import annotations

from functools import cache

import pytest

import plansim
from plansim.hardware import Cluster, load_hardware
from plansim.step.data_parallel import data_parallel_plan
from plansim.strategy.schema import Strategy

MIXTRAL = "mixtral-8x7b"


@cache
def _cluster(gpus: int) -> Cluster:
    return load_hardware("dgx-h100", gpus=gpus)


def _params(strategy: Strategy) -> tuple[float, float]:
    """(the rest's, the routed experts') parameters one rank holds, from its op graph."""
    from plansim.step.prepare import sharding_of
    from plansim.workload import load_model
    from plansim.workload.build import build_sharded

    graph = build_sharded(load_model(MIXTRAL).model_copy(update={"seq_len": 4096}), sharding_of(strategy))
    params = sum(d.get("params", 0) for _, d in graph.nodes(data=True))
    experts = sum(d.get("params", 0) for _, d in graph.nodes(data=True) if d.get("expert"))
    return params - experts, experts


@pytest.mark.parametrize(("zero", "etp", "ep"), [(0, 1, 8), (1, 1, 8), (1, 2, 4), (2, 1, 4), (1, 1, 2)])
def test_dp_and_zero_bytes_are_each_groups_closed_form(zero: int, etp: int, ep: int) -> None:
    """Mixtral on 16 H100s, tp 2, dp 8, pp 1, so edp = 16 / (etp x ep). Bytes one rank sends: a ring's all-reduce
    2 (p-1)/p of its buffer, a reduce-scatter's and an all-gather's (p-1)/p; the rest's gradients over p = 8, the
    experts' over p = edp (none where edp = 1); ZeRO-1/2 gathers the weights (2 B) over the same groups."""
    strategy = (
        f"dp=8,tp=2,ep={ep},etp={etp},micro_batch=1,global_batch=16,sequence_parallel=true,zero={zero},"
        "overlap_param_gather=false"
    )
    cluster = _cluster(16)
    s = Strategy.parse(strategy).resolved(cluster)
    plan = data_parallel_plan(cluster, s)
    assert plan is not None and plan.experts is not None
    dense, experts = _params(s)
    edp = 16 // (etp * ep)
    assert plan.experts.ranks == edp

    def share(p: int) -> float:
        return (p - 1) / p

    reduce = 2.0 if zero == 0 else 1.0
    grads = s.grad_bytes
    reductions = s.num_microbatches if plan.reduce_every_microbatch else 1  # ZeRO-2 reduce-scatters every one's
    dp = reductions * reduce * grads * (share(8) * dense + share(edp) * experts)
    gathered = 0.0 if zero == 0 else 2 * (share(8) * dense + share(edp) * experts)
    for engine in ("analytic", "des"):
        r = plansim.simulate(MIXTRAL, cluster, strategy, seq_len=4096, engine=engine)
        assert r.comm_bytes_per_gpu["dp"] == pytest.approx(dp, rel=1e-6), engine
        assert r.comm_bytes_per_gpu["zero"] == pytest.approx(gathered, rel=1e-6), engine


def test_an_expert_data_parallel_group_of_one_reduces_no_expert_bytes() -> None:
    """edp = 1 (tp 2, dp 8, etp 2, ep 8 on 16 GPUs): only the rest's gradients are reduced."""
    strategy = "dp=8,tp=2,ep=8,etp=2,micro_batch=1,global_batch=16,sequence_parallel=true,zero=0"
    cluster = _cluster(16)
    s = Strategy.parse(strategy).resolved(cluster)
    plan = data_parallel_plan(cluster, s)
    assert plan is not None and plan.experts is not None and plan.experts.ranks == 1
    assert plan.experts.reduce is None and plan.experts.gather is None
    dense, _ = _params(s)
    for engine in ("analytic", "des"):
        r = plansim.simulate(MIXTRAL, cluster, strategy, seq_len=4096, engine=engine)
        assert r.comm_bytes_per_gpu["dp"] == pytest.approx(2 * s.grad_bytes * 7 / 8 * dense, rel=1e-6), engine


def test_experts_at_ep_1_and_etp_tp_stay_in_the_dense_buckets() -> None:
    """Megatron-LM keeps expert parameters apart only with ep > 1 or etp other than tp."""
    cluster = _cluster(16)
    s = Strategy.parse("dp=8,tp=2,micro_batch=1,global_batch=16,zero=1").resolved(cluster)
    plan = data_parallel_plan(cluster, s)
    assert plan is not None and plan.experts is None


#: (strategy on 64 H100s): the ep cases of tests/test_expert_parallel.py with the weights gathered after the step
EP_CASES = [
    "dp=8,tp=2,pp=4,ep=8,etp=1,micro_batch=1,global_batch=64,sequence_parallel=true,zero=1,overlap_param_gather=false",
    "dp=8,tp=2,pp=4,ep=4,etp=1,micro_batch=1,global_batch=64,sequence_parallel=true,zero=1,overlap_param_gather=false",
    "dp=16,tp=1,pp=4,ep=8,micro_batch=1,global_batch=64,sequence_parallel=true,zero=0",
]


@pytest.mark.parametrize("strategy", EP_CASES)
def test_engines_agree_with_expert_buckets(strategy: str) -> None:
    cluster = _cluster(64)
    plan = data_parallel_plan(cluster, Strategy.parse(strategy).resolved(cluster))
    assert plan is not None and plan.experts is not None and plan.experts.reduce is not None
    analytic, des = (plansim.simulate(MIXTRAL, cluster, strategy, seq_len=4096, engine=e) for e in ("analytic", "des"))
    assert des.step_time_s == pytest.approx(analytic.step_time_s, rel=0.02), strategy


#: the network's rates and latencies the experts' buckets ride on (tests/test_monotone.py's scalings)
NETWORK = ["nics.bandwidth_Bps", "nics.latency_s", "intra_node.bandwidth_per_gpu_Bps", "intra_node.allreduce_busbw_Bps"]


@pytest.mark.parametrize("field", NETWORK)
@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_more_network_bandwidth_never_slows_a_step_with_expert_buckets(field: str, engine: str) -> None:
    """Monotone physics (tests/test_monotone.py): more of a network rate, or less of its latency, never makes a step
    whose experts' gradients go over edp slower."""
    from test_monotone import FIELDS

    strategy = EP_CASES[0]
    base = plansim.simulate(MIXTRAL, _cluster(64), strategy, seq_len=4096, engine=engine).step_time_s
    for factor in (1.25, 4.0):
        better = plansim.simulate(MIXTRAL, FIELDS[field](_cluster(64), factor), strategy, seq_len=4096, engine=engine)
        assert better.step_time_s <= base * (1 + 1e-9), (field, factor, base, better.step_time_s)
