"""The analytic engine's caches key on strategy projections (``plansim.strategy.schema.StrategyProjection``): strategies
equal in a projection share what was computed for it. If a computation read a field its projection leaves out, two
strategies differing only in that field would get the same (wrong) value. So: price strategies that differ in one
field at a time through one shared cache, and compare each with a pricing that shares nothing."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from plansim.analytic import AnalyticCache, simulate_analytic
from plansim.analytic.data_parallel import DpMemo, data_parallel_comm, dp_besides
from plansim.analytic.stages import StageCost, interference_of
from plansim.errors import PlansimError
from plansim.hardware import load_hardware
from plansim.step.data_parallel import LayerPass
from plansim.strategy.schema import Strategy
from plansim.workload import load_model

#: Per strategy field, values that change what a step costs (each must be valid beside the bases below).
ALTERNATES: dict[str, list[Any]] = {
    "dp": [],  # dp, tp, pp and cp vary together over MESHES (their product is the cluster's GPU count)
    "tp": [],
    "pp": [],
    "cp": [],
    "cp_algorithm": ["ring", "all_to_all"],
    "sequence_parallel": [True],
    "zero": [0, 1, 2, 3],
    "micro_batch": [1, 2],
    "global_batch": [16, 32],
    "schedule": ["gpipe", "1f1b", "zb-h1"],
    "virtual_stages": [1],
    "layer_split": [None],
    "remat": ["none", "full", "selective", "sqrt"],
    "remat_budget": [None],
    "remat_granularity": ["op"],
    "remat_time_limit_s": [5.0],
    "attention": ["unfused", "flash"],
    "dtype": ["fp16", "bf16", "fp32"],
    "dp_algorithm": ["ring", "tree", "butterfly", "hierarchical"],
    "framework": ["deepspeed", "fsdp", "megatron"],
    "fp32_grad_accum": [True, False],
    "overlap_grad_reduce": [False, True],
    "grad_bucket_bytes": [2**20, 2**26],
    "overlap_param_gather": [False, True],
    "tp_comm_overlap": [True],  # with sequence parallelism, which it needs
    "dp_shard": [2, 4],  # hybrid sharding: valid under the fsdp bases
    "offload": [("optimizer",), ("optimizer", "params")],  # per framework rule: refused where it does not run
    "offload_activation_layers": [2, 5],
    # expert parallelism: these dense bases refuse ep > 1 and an etp other than tp (the checks); etp=2 equals the
    # default beside tp=2 (the Sharding and the mesh read its resolved value, Strategy.expert_tp)
    "ep": [2],
    "etp": [2],  # with offload=activations (Megatron-LM, pp=1, no recompute)
    # FP8 needs an FP8 GPU (these A100 bases refuse it): tests/test_fp8.py varies them through one cache on H100s
    "fp8_recipe": [None],
    "fp8_param_gather": [None],
}

#: Values that need a pipeline (interleaving, an uneven split) and remat=milp, which is priced uncached.
PIPELINED: dict[str, list[Any]] = {
    "schedule": ["interleaved"],
    "virtual_stages": [2, 3],
    "layer_split": ["uneven"],  # one block more on the first stage
    "remat": ["milp"],
    "remat_budget": [4e9],
}

#: (dp, tp, pp, cp) on the 8 GPUs of the cluster.
MESHES = [
    (8, 1, 1, 1), (4, 2, 1, 1), (2, 2, 2, 1), (4, 1, 2, 1), (2, 4, 1, 1), (1, 2, 4, 1), (2, 1, 4, 1),
    (4, 1, 1, 2), (2, 2, 1, 2), (1, 2, 2, 2), (2, 1, 1, 4), (1, 1, 2, 4),
]  # fmt: skip

BASES = [
    Strategy(dp=2, tp=2, pp=2, micro_batch=1, global_batch=16),
    Strategy(dp=4, tp=2, pp=1, micro_batch=2, global_batch=32, zero=1),
    Strategy(dp=2, tp=1, pp=2, micro_batch=1, global_batch=16, remat="full", schedule="gpipe"),
    Strategy(dp=8, micro_batch=1, global_batch=32, zero=3, dp_algorithm="butterfly"),
    # framework rules that change what a field means: fsdp's ZeRO-2 shards the weights, tp overlaps per framework
    Strategy(dp=4, tp=2, micro_batch=2, global_batch=32, zero=2, sequence_parallel=True, framework="fsdp"),
    Strategy(dp=4, tp=2, micro_batch=2, global_batch=32, zero=1, sequence_parallel=True, tp_comm_overlap=True),
    Strategy(dp=4, tp=1, pp=2, micro_batch=1, global_batch=16, zero=3, framework="fsdp", dp_shard=2),  # HSDP
    # valid under every framework (1F1B, tp=1, ZeRO-0): their pipeline sends differ (rule pipeline_sends)
    Strategy(dp=2, tp=1, pp=4, micro_batch=1, global_batch=16),
    # context parallelism: its gradients reduced over dp x cp, its attention by ring or all-to-all
    Strategy(dp=2, tp=2, cp=2, micro_batch=1, global_batch=16, zero=1, sequence_parallel=True),
]


def test_every_strategy_field_is_varied() -> None:
    """A new strategy field needs its alternates here, so that its effect on every cache is checked."""
    assert set(ALTERNATES) == set(Strategy.model_fields)


def _variants(layers: int) -> list[Strategy]:
    out = []
    for base in BASES:
        for dp, tp, pp, cp in MESHES:
            out.append(base.model_copy(update={"dp": dp, "tp": tp, "pp": pp, "cp": cp, "layer_split": None}))
        for name, values in ALTERNATES.items():
            pipelined = PIPELINED.get(name, []) if base.pp > 1 else []
            for value in values + pipelined:
                if value == "uneven":
                    value = (layers // 2 + 1, layers - layers // 2 - 1)
                update = {name: value}
                if name == "virtual_stages" and value > 1:
                    update["schedule"] = "interleaved"
                if name == "remat_budget" and value is not None:
                    update["remat"] = "milp"
                if name == "tp_comm_overlap":
                    update["sequence_parallel"] = True
                if name == "offload_activation_layers":
                    update["offload"] = ("activations",)
                try:
                    out.append(Strategy.model_validate({**base.model_dump(), **update}))
                except ValueError:
                    continue
    return out


@pytest.mark.parametrize("model_name", ["gpt3-125m"])
def test_a_shared_cache_prices_every_strategy_as_a_fresh_one(model_name: str) -> None:
    model, cluster = load_model(model_name), load_hardware("dgx-a100", gpus=8)
    shared = AnalyticCache(model, cluster)
    priced = 0
    for s in _variants(model.layers):
        try:
            fresh = simulate_analytic(model, cluster, s, cache=AnalyticCache(model, cluster))
        except PlansimError:
            continue
        cached = simulate_analytic(model, cluster, s, cache=shared)
        assert cached.to_dict() == fresh.to_dict(), s
        priced += 1
    assert priced >= 100


def test_a_shared_cache_prunes_every_strategy_as_a_fresh_one() -> None:
    """The model states the planner prunes by, through one cache, equal a fresh cache's, on a model whose states fit
    some of the variants and not others."""
    model, cluster = load_model("gpt3-13b"), load_hardware("dgx-a100", gpus=8)
    shared = AnalyticCache(model, cluster)
    answers = []
    for s in _variants(model.layers):
        states = shared.model_states_bytes(s)
        assert states == AnalyticCache(model, cluster).model_states_bytes(s), s
        answers.append(shared.model_states_exceed(s))
    assert any(answers) and not all(answers)


def test_the_data_parallel_memo_keys_a_stage_on_what_it_reads() -> None:
    """``DpMemo`` (one per data-parallel key) shares a stage's overlapped ZeRO-1/2 gathers under its first forwards
    between stages alike in what they read (forward passes, parameters, chunks, place, forward time), and its
    gradient buckets between backward walks alike in their passes' parameters, and never between stages that
    differ in one of them: each variant through one memo equals it through a fresh one, and the variants differ."""
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    s = Strategy(dp=4, tp=1, pp=2, micro_batch=1, global_batch=16, zero=1, overlap_param_gather=True)
    s = s.resolved(cluster)
    shared = AnalyticCache(model, cluster)
    plan, price, memo = shared.data_parallel(s)
    assert plan is not None and plan.gather_overlapped
    besides = dp_besides(cluster, s, plan, interference_of(cluster, shared.priced(s).prep.kernels))
    passes = tuple(LayerPass(1e-4 * (1 + i % 3), 1e-5, 5e7) for i in range(8))  # gathers longer than the passes
    base = StageCost(
        fwd_s=1e-3, bwd_s=2e-3, recompute_s=0.0, comm_s=0.0, axis_bytes={}, params=400_000_000,
        layer_params=tuple(x.params for x in passes), tail_params=0.0, activations=0.0, recompute_matmul_flops=0.0,
        p2p_bytes=0.0, num_layers=8, forward_layers=passes, backward_layers=passes[::-1], backward_chunks=(8,),
    )  # fmt: skip
    odd = tuple(replace(x, params=x.params * (i % 2)) for i, x in enumerate(passes))  # every other pass's gradients
    variants = [
        base,
        replace(base, fwd_s=2e-3),
        replace(base, params=500_000_000),
        replace(base, first_stage=True),
        replace(base, backward_chunks=(4, 4)),
        replace(base, forward_layers=tuple(replace(x, work_s=2 * x.work_s) for x in passes)),
        replace(base, forward_layers=tuple(replace(x, params=2 * x.params) for x in passes)),
        # buckets of the first stage's first chunk only (Megatron-LM's rule): the same buckets, then other ones
        replace(base, first_stage=True, backward_layers=tuple(replace(x, work_s=2 * x.work_s) for x in passes)),
        replace(base, first_stage=True, backward_layers=odd),
    ]
    results = set()
    for st in variants:
        got = data_parallel_comm(s, plan, price, st, st.bwd_s, st.fwd_s, besides, memo)
        assert got == data_parallel_comm(s, plan, price, st, st.bwd_s, st.fwd_s, besides, DpMemo()), st
        results.add(got)
    assert len(results) == len(variants)


def test_the_fixed_memory_key_reads_what_the_communicators_read() -> None:
    """``AnalyticCache.fixed`` (CUDA context, NCCL's buffers, userbuffers per stage) keys on ``FixedKey``: on a
    cluster where the dp group spans nodes, ZeRO-0's all-reduce builds NCCL's tree and ZeRO-1 does not, and
    interleaving adds the wrap-around peer; strategies differing there get their own entry (each through one cache
    equals it through a fresh one), those differing only in what the key leaves out (2 or 3 virtual stages, the
    micro-batch without userbuffers) share one."""
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=64)
    shared = AnalyticCache(model, cluster)
    seen = set()
    for zero, v, sp, micro_batch, ub in itertools.product((0, 1), (1, 2, 3), (False, True), (1, 2), (False, True)):
        if ub and not sp:  # userbuffers need sequence parallelism
            continue
        s = Strategy(dp=8, tp=2, pp=4, micro_batch=micro_batch, global_batch=64, zero=zero, sequence_parallel=sp,
                     tp_comm_overlap=ub, schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v)  # fmt: skip
        s = s.resolved(cluster)
        assert not shared.problems(s), s
        got = shared.fixed(s)
        assert got == AnalyticCache(model, cluster).fixed(s), s
        seen.add(tuple(tuple(x.values()) for x in got))
    assert len(seen) > 1
    # all-reduce or not, wraps or not, and the tp group's all-reduce (no sequence parallelism) or its userbuffers
    # (one micro-batch's activation: per micro-batch size) or neither
    assert len(shared._fixed) == 2 * 2 * (1 + 2 + 1)
