"""Context parallelism (strategy field ``cp``): the sequence split over a mesh axis, attention by ring or
all-to-all, gradients over dp x cp. Checked against closed forms, hand-computed activations, the cp = 1 step, the
two engines against each other and the frameworks' rules."""

from __future__ import annotations

import pytest

import plansim
from plansim.errors import PlansimError
from plansim.hardware import load_hardware
from plansim.planner import Constraints
from plansim.planner.space import CP_FROM_SEQ_LEN, candidates, count_candidates
from plansim.step.data_parallel import data_parallel_plan
from plansim.step.prepare import prepare_step
from plansim.strategy.checks import check_strategy
from plansim.strategy.frameworks import load_framework
from plansim.strategy.mesh import mesh_of
from plansim.strategy.schema import Strategy
from plansim.workload import ModelSpec, load_model
from plansim.workload.build import build_sharded
from plansim.workload.graph import Sharding, model_flops

#: A small Llama (grouped-query attention) at a long sequence: 8 heads, 4 key/value heads of 64.
LLAMA = ModelSpec(
    name="cp-llama", family="llama", layers=4, hidden=512, heads=8, kv_heads=4, ffn_hidden=1408, vocab=32000,
    seq_len=16384,
)  # fmt: skip
E = 2  # bf16


def _run(strategy: str, engine: str, gpus: int = 16, model: ModelSpec = LLAMA) -> plansim.Result:
    return plansim.simulate(model, "dgx-h100", strategy, engine=engine, gpus=gpus)


def _kv_local(model: ModelSpec, tp: int, cp: int, micro_batch: int = 1) -> int:
    """Bytes of K and V on one rank: its s/cp tokens on its kv_heads/tp heads."""
    return E * micro_batch * model.seq_len // cp * 2 * (model.kv_heads // tp) * model.head_dim


@pytest.mark.parametrize("engine", ["analytic", "des"])
@pytest.mark.parametrize("tp,cp", [(1, 2), (2, 4), (1, 8)])
def test_ring_sends_each_block_cp_minus_one_times_forward_and_twice_that_backward(
    engine: str, tp: int, cp: int
) -> None:
    """Ring attention (Liu et al. 2023; Transformer Engine's p2p): forward, each rank passes its K/V block on
    cp - 1 times; backward, the blocks and their gradients, twice that. Per step: layers x micro-batches of it."""
    dp = 16 // (tp * cp)
    r = _run(f"dp={dp},tp={tp},cp={cp},micro_batch=1,global_batch={2 * dp},cp_algorithm=ring", engine)
    per_layer = 3 * (cp - 1) * _kv_local(LLAMA, tp, cp)
    assert r.comm_bytes_per_gpu["cp"] == pytest.approx(LLAMA.layers * 2 * per_layer, rel=1e-12)


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_selective_recompute_runs_the_ring_again(engine: str) -> None:
    """Selective recompute reruns the attention forward, which under context parallelism is Transformer Engine's
    ring attention whole (AttnFuncWithCPAndKVP2P.forward, context_parallel.py:1691-1720 at d0067d0d): the K/V blocks
    pass around the ring once more, 4 (cp - 1) blocks a layer in all; full recompute likewise (the block's forward),
    none only 3 (cp - 1). The rerun's ring runs beside its steps: the step grows by less than the exchange takes."""
    tp, cp, dp = 2, 4, 2
    base = f"dp={dp},tp={tp},cp={cp},micro_batch=1,global_batch={2 * dp},cp_algorithm=ring"
    kv = _kv_local(LLAMA, tp, cp)
    for remat, blocks in (("none", 3), ("selective", 4), ("full", 4)):
        r = _run(f"{base},remat={remat}", engine)
        assert r.comm_bytes_per_gpu["cp"] == pytest.approx(LLAMA.layers * 2 * blocks * (cp - 1) * kv, rel=1e-12)
    none, selective = _run(f"{base},remat=none", engine), _run(f"{base},remat=selective", engine)
    assert selective.time_breakdown_s["recompute"] > 0 and selective.step_time_s > none.step_time_s


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_all_to_all_sends_the_swapped_tensors_share_for_the_other_ranks(engine: str) -> None:
    """DeepSpeed-Ulysses (Jacobs et al. 2023, sec 3): Q, K, V swapped before attention and its output after, each
    all-to-all sending (cp - 1)/cp of the rank's buffer, and the same in backward for their gradients."""
    tp, cp = 1, 4
    r = _run(f"dp=4,tp={tp},cp={cp},micro_batch=1,global_batch=8,cp_algorithm=all_to_all", engine)
    rows = LLAMA.seq_len // cp
    q, kv = LLAMA.heads * LLAMA.head_dim, LLAMA.kv_heads * LLAMA.head_dim
    buffers = E * rows * (q + 2 * kv) + E * rows * q
    per_layer = 2 * buffers * (cp - 1) / cp  # forward and backward
    assert r.comm_bytes_per_gpu["cp"] == pytest.approx(LLAMA.layers * 2 * per_layer, rel=1e-12)


@pytest.mark.parametrize("algorithm", ["ring", "all_to_all"])
def test_a_ranks_activations_are_those_of_its_share_of_the_sequence(algorithm: str) -> None:
    """With flash attention every saved tensor is linear in the tokens (Korthikanti et al. 2022, sec 4.1: the
    Llama block keeps E sb(4h/d + 2q + 2h_kv + 3f/t) and the kernel's log-sum-exp 4 a s b / t), so a rank of cp
    keeps what the model at seq_len / cp keeps without it; its model FLOPs are 1/cp of the model's (the causal
    chunks balance the attention)."""
    cp, tp = 4, 1
    short = LLAMA.model_copy(update={"seq_len": LLAMA.seq_len // cp})
    split = build_sharded(LLAMA, Sharding(micro_batch=1, tp=tp, cp=cp, cp_algorithm=algorithm))
    alone = build_sharded(short, Sharding(micro_batch=1, tp=tp))
    for layer in (0, LLAMA.layers):
        saved = sum(a["saved_bytes"] for _, a in split.nodes(data=True) if a["layer"] == layer)
        assert saved == sum(a["saved_bytes"] for _, a in alone.nodes(data=True) if a["layer"] == layer)
    s, h, q, kv, f, a = LLAMA.seq_len // cp, LLAMA.hidden, 512, 256, 1408, LLAMA.heads
    block = sum(x["saved_bytes"] for _, x in split.nodes(data=True) if x["layer"] == 0)
    assert block == E * s * (4 * h + 2 * q + 2 * kv + 3 * f) + 4 * a * s
    whole = build_sharded(LLAMA, Sharding(micro_batch=1, tp=tp))
    assert model_flops(split) * cp == pytest.approx(model_flops(whole), rel=1e-12)


@pytest.mark.parametrize(
    "strategy",
    [
        "dp=2,tp=2,cp=4,micro_batch=1,global_batch=4,sequence_parallel=true,zero=1",
        "dp=1,tp=2,cp=4,pp=2,micro_batch=1,global_batch=4,sequence_parallel=true,zero=1",
        "dp=1,tp=4,cp=4,micro_batch=1,global_batch=2,sequence_parallel=true,zero=1",  # the ring across two nodes
        "dp=2,tp=1,cp=4,pp=2,micro_batch=1,global_batch=8,schedule=interleaved,virtual_stages=2,cp_algorithm=all_to_all",
        "dp=2,cp=8,micro_batch=1,global_batch=4,zero=3,framework=fsdp",
        "dp=4,tp=2,cp=2,micro_batch=1,global_batch=8,zero=1,framework=deepspeed",
        "dp=2,tp=2,cp=4,micro_batch=1,global_batch=4,sequence_parallel=true,zero=1,remat=selective",
        "dp=1,tp=2,cp=4,pp=2,micro_batch=1,global_batch=4,sequence_parallel=true,remat=selective",
    ],
)
def test_the_two_engines_agree_with_context_parallelism(strategy: str) -> None:
    analytic, des = _run(strategy, "analytic"), _run(strategy, "des")
    assert des.step_time_s == pytest.approx(analytic.step_time_s, rel=0.02)
    assert des.peak_memory_bytes == pytest.approx(analytic.peak_memory_bytes, rel=0.02)
    assert des.comm_bytes_per_gpu["cp"] == pytest.approx(analytic.comm_bytes_per_gpu["cp"], rel=1e-12)
    # with pipelining the engines' data-parallel bytes differ by a few kB, as without context parallelism
    assert des.comm_bytes_per_gpu == pytest.approx(analytic.comm_bytes_per_gpu, rel=1e-4)


def test_gradients_and_zero_states_are_over_dp_times_cp() -> None:
    """The context-parallel ranks hold the same weights: gradients reduced and ZeRO's states sharded over the
    data-parallel ranks of every context-parallel rank (Megatron-LM's dp_cp group), so even dp = 1 reduces them."""
    cluster = load_hardware("dgx-h100", gpus=16)
    s = Strategy.parse("dp=1,tp=2,cp=8,micro_batch=1,global_batch=2,zero=1").resolved(cluster)
    plan = data_parallel_plan(cluster, s)
    assert plan is not None and plan.dp == 8 and plan.reduce.axis == "dp_cp"
    assert mesh_of(s).group("dp_cp", 0) == tuple(range(0, 16, 2))
    assert s.shard_degree == 8
    one = _run("dp=1,tp=2,cp=8,micro_batch=1,global_batch=2,zero=1", "analytic")
    whole = _run("dp=8,tp=2,micro_batch=1,global_batch=16,zero=1", "analytic")
    # the same weights and the same group: the same optimizer states per rank, and the same reduce-scatter bytes
    assert one.memory_breakdown_bytes["optimizer"] == whole.memory_breakdown_bytes["optimizer"]
    assert one.comm_bytes_per_gpu["dp"] == pytest.approx(whole.comm_bytes_per_gpu["dp"], rel=1e-12)


def test_more_context_parallel_ranks_hold_fewer_activations() -> None:
    results = [
        _run(f"dp={16 // cp},cp={cp},micro_batch=1,global_batch={16 // cp},zero=1", "analytic") for cp in (1, 2, 4)
    ]
    activations = [r.memory_breakdown_bytes["activations"] for r in results]
    assert activations[0] > activations[1] > activations[2]


@pytest.mark.parametrize(
    "strategy,fragment",
    [
        ("dp=1,cp=16,micro_batch=1", "2*cp=32"),  # at seq_len 16,432 (below), which 32 does not divide
        ("dp=2,tp=2,cp=4,cp_algorithm=all_to_all,micro_batch=1", "tp*cp=8"),
        ("dp=2,tp=2,cp=4,sequence_parallel=true,framework=deepspeed,micro_batch=1", "sequence_parallel=false"),
        ("dp=4,cp=4,cp_algorithm=ring,framework=deepspeed,micro_batch=1", "use cp_algorithm=all_to_all"),
    ],
)
def test_what_context_parallelism_cannot_run_is_refused_in_one_line(strategy: str, fragment: str) -> None:
    cluster = load_hardware("dgx-h100", gpus=16)
    model = LLAMA if "cp=16" not in strategy else LLAMA.model_copy(update={"seq_len": 16384 + 48})
    problems = check_strategy(Strategy.parse(strategy), model, cluster)
    assert any(fragment in p for p in problems), problems
    with pytest.raises(PlansimError) as err:  # and what runs a step says the same, in one line
        prepare_step(model, cluster, Strategy.parse(strategy))
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert all("\n" not in p for p in problems)


def test_unfused_attention_and_models_without_a_sequence_refuse_cp() -> None:
    with pytest.raises(PlansimError, match="attention=flash"):
        Strategy.parse("cp=2,attention=unfused")
    problems = check_strategy(
        Strategy.parse("dp=2,cp=2,micro_batch=4"), load_model("mlp-small"), load_hardware("dgx-a100", gpus=4)
    )
    assert any("no sequence to split" in p for p in problems)


def test_each_framework_runs_its_cited_forms() -> None:
    """Megatron-LM: --cp-comm-type p2p by default, a2a too; DeepSpeed: Ulysses' all-to-all, not with Megatron's
    sequence parallelism; torchtitan: the ring (rotate method alltoall)."""
    rules = {n: load_framework(n).rules.context_parallel for n in ("megatron", "deepspeed", "fsdp")}
    assert rules["megatron"].value.algorithms == ("ring", "all_to_all")
    assert (
        rules["deepspeed"].value.algorithms == ("all_to_all",) and not rules["deepspeed"].value.with_sequence_parallel
    )
    assert rules["fsdp"].value.algorithms == ("ring",)
    assert "3221-3226" in rules["megatron"].source and "974-975" in rules["deepspeed"].source
    cluster = load_hardware("dgx-h100", gpus=16)
    for framework, default in (("megatron", "ring"), ("deepspeed", "all_to_all"), ("fsdp", "ring")):
        s = Strategy.parse(f"dp=4,cp=4,micro_batch=1,framework={framework}").resolved(cluster)
        assert s.cp_algorithm == default


def test_the_planner_searches_cp_for_long_sequences_only() -> None:
    """From CP_FROM_SEQ_LEN tokens the planner tries every cp; below, cp = 1 and the space is what it was."""
    cluster = load_hardware("dgx-h100", gpus=16)
    short = LLAMA.model_copy(update={"seq_len": CP_FROM_SEQ_LEN // 2})
    assert {s.cp for s in candidates(short, cluster, 16)} == {1}
    assert count_candidates(short, cluster, 16) == count_candidates(short, cluster, 16, Constraints(cp=1))
    long = list(candidates(LLAMA, cluster, 16))
    assert {s.cp for s in long} == {1, 2, 4, 8, 16}
    assert len(long) == count_candidates(LLAMA, cluster, 16)
    assert all(check_strategy(s, LLAMA, cluster) == [] for s in long if s.cp > 1)
    fixed = list(candidates(LLAMA, cluster, 16, Constraints(cp=4, cp_algorithm="all_to_all")))
    assert fixed and all(s.cp == 4 and s.cp_algorithm == "all_to_all" and s.tp <= 2 for s in fixed)


def test_tables_name_cp_traffic_where_a_row_has_some() -> None:
    """``plansim compare``'s comm column shows dp/tp/pp/zero for runs without context parallelism (no column of
    zeros) and every kind, cp's bytes among them, as soon as one row has context-parallel traffic."""
    from typer.testing import CliRunner

    from plansim.cli.app import app

    def table(*strategies: str) -> str:
        argv = ["compare", "-m", "llama3-8b", "-H", "dgx-h100", "--gpus", "16", "--engine", "analytic"]
        for s in strategies:
            argv += ["-s", s]
        res = CliRunner().invoke(app, argv, env={"COLUMNS": "400"})
        assert res.exit_code == 0, res.output
        return res.stdout

    plain, ring = "dp=16,micro_batch=1,global_batch=16,zero=1", "dp=4,cp=4,micro_batch=1,global_batch=4,zero=1"
    without = table(plain, "dp=8,tp=2,micro_batch=1,global_batch=16,zero=1")
    assert "dp/tp/pp/zero" in without and "dp/tp/cp/pp/zero" not in without
    text = table(plain, ring)
    sent = plansim.simulate("llama3-8b", "dgx-h100", ring, gpus=16).comm_bytes_per_gpu["cp"]
    assert "dp/tp/cp/pp/zero" in text and sent > 0
    assert f"/{sent / 1e9:.1f}/" in text


def test_the_plan_says_what_cp_bought_against_the_best_plan_without_it() -> None:
    """Where the winner runs context parallelism, the explanation names the best candidate without it, by brute
    force the best cp = 1 candidate that fits with the headroom free, and its analytic step."""
    from plansim.describe import describe
    from plansim.planner import plan
    from plansim.step.result import THIN_MARGIN

    cluster = load_hardware("dgx-h100", gpus=16)
    long = LLAMA.model_copy(update={"seq_len": 65536})
    r = plan(long, cluster, global_batch=4, des=False, jobs=1)
    assert r.winner is not None and r.winner.cp > 1, r.explanation
    results = [
        (s, plansim.simulate(long, cluster, s)) for s in candidates(long, cluster, 4) if s.cp == 1
    ]  # fmt: skip
    fit = [(s, x) for s, x in results if x.fits and x.memory_margin >= THIN_MARGIN]
    best_s, best = min(fit, key=lambda sx: sx[1].step_time_s)
    assert f"against the best candidate without it, {describe(best_s)}, {best.step_time_s:.3f} s" in r.explanation
