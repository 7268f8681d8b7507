"""Framework profiles (frameworks/*.yaml, strategy.frameworks): every rule carries its source, and each rule does
what its source says it does, one test per rule (the source cited in each test's docstring is the profile's)."""

from __future__ import annotations

import itertools
import json
import math
import re

import pytest
from typer.testing import CliRunner

import plansim
from plansim.analytic.engine import simulate_analytic
from plansim.cli.app import app
from plansim.des.lower import lower
from plansim.des.taskgraph import Task
from plansim.errors import PlansimError
from plansim.hardware import Cluster, load_hardware
from plansim.pipeline.schedules import SCHEDULES
from plansim.planner import Constraints
from plansim.planner.space import candidates
from plansim.step.data_parallel import START, data_parallel_plan, weight_gathers
from plansim.strategy.checks import check_strategy
from plansim.strategy.frameworks import (
    FrameworkRules,
    GradBucket,
    framework_names,
    load_framework,
    modelled_zero_stages,
)
from plansim.strategy.schema import Strategy
from plansim.workload import load_model

runner = CliRunner()
#: a file and line of the framework's code: megatron/core/.../param_and_grad_buffer.py:379-405
CITATION = re.compile(r"[\w./-]+\.(?:py|md|yaml):\d+")


def _cluster(gpus: int = 32):  # type: ignore[no-untyped-def]
    return load_hardware("dgx-a100", gpus=gpus)


def _problems(strategy: str, gpus: int = 32) -> list[str]:
    return check_strategy(Strategy.parse(strategy), load_model("gpt3-1.3b"), _cluster(gpus))


def _resolved(strategy: str, gpus: int = 64) -> Strategy:
    return Strategy.parse(strategy).resolve(_cluster(gpus))


# ---- the profiles as data ---------------------------------------------------------------------------------------
def test_the_three_profiles_load_and_every_rule_cites_the_frameworks_code() -> None:
    assert framework_names() == ["deepspeed", "fsdp", "megatron"]
    for name in framework_names():
        profile = load_framework(name)
        assert profile.name == name and re.search(r"\d", profile.version), profile.version
        for rule_name in FrameworkRules.model_fields:
            source = getattr(profile.rules, rule_name).source
            assert CITATION.search(source), (name, rule_name, source)


def test_an_unknown_framework_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(PlansimError, match=r"^framework 'jax' is unknown: choose one of deepspeed, fsdp, megatron$"):
        load_framework("jax")
    with pytest.raises(ValueError, match="framework='jax' is unknown"):
        Strategy.parse("dp=8,framework=jax")


def test_a_bucket_rule_gives_one_size() -> None:
    with pytest.raises(ValueError, match="one of params"):
        GradBucket(params=1, bytes=2)
    with pytest.raises(ValueError, match="one of params"):
        GradBucket()


# ---- one test per rule ---------------------------------------------------------------------------------------------
def test_zero_stages_fsdp_has_no_zero1() -> None:
    """fsdp: ShardingStrategy has NO_SHARD, SHARD_GRAD_OP, FULL_SHARD, nothing that shards only the optimizer states
    (torch/distributed/fsdp/api.py:32-69); Megatron-LM's distributed optimizer and DeepSpeed's stage 1 are ZeRO-1."""
    (problem,) = _problems("tp=8,zero=1,framework=fsdp")
    assert problem == (
        "zero=1 with framework=fsdp: PyTorch FSDP (torchtitan) runs ZeRO 0, 2, 3 (frameworks/fsdp.yaml): use zero=3, "
        "or framework=deepspeed or megatron"
    )
    assert _problems("tp=8,zero=1,framework=megatron") == _problems("tp=8,zero=1,framework=deepspeed") == []
    stages = [load_framework(n).rules.zero_stages.value for n in framework_names()]
    assert stages == [[0, 1, 2, 3], [0, 2, 3], [0, 1, 2, 3]]  # deepspeed, fsdp, megatron


def test_zero_with_pipeline_deepspeed_refuses_zero2_naming_itself() -> None:
    """deepspeed: the pipeline engine asserts zero stage < 2 (deepspeed/runtime/pipe/engine.py:76-77); megatron:
    --use-torch-fsdp2 asserts pp == 1 (megatron/training/arguments.py:636-637)."""
    for name, title in (("deepspeed", "DeepSpeed"), ("megatron", "Megatron-LM")):
        (problem,) = _problems(f"tp=8,pp=2,zero=2,framework={name}")
        assert problem == (
            f"zero=2 with pp=2: {title} runs only ZeRO 0, 1 with pipeline parallelism (frameworks/{name}.yaml): use "
            "zero=1 or pp=1"
        )
        assert _problems(f"tp=8,pp=2,zero=1,framework={name}") == []
    # torchtitan runs FSDP with pipelining (zero=3, test_sharded_weights_kept_with_pipeline_...); its ZeRO-2 there is
    # the same step, so plansim asks for zero=3
    assert _problems("tp=8,pp=2,zero=3,framework=fsdp") == []
    (problem,) = _problems("tp=8,pp=2,zero=2,framework=fsdp")
    assert problem == (
        "zero=2 with pp=2 and framework=fsdp: PyTorch FSDP (torchtitan) runs it (frameworks/fsdp.yaml), but with "
        "pipelining its ZeRO-2 keeps the weights gathered through the step as its ZeRO-3 does: use zero=3"
    )


def test_grad_reduce_fp32_megatron_and_fsdp_reduce_fp32_deepspeed_bf16() -> None:
    """megatron: --bf16 turns on --accumulate-allreduce-grads-in-fp32 (megatron/training/arguments.py:733-748);
    fsdp: torchtitan's mixed_precision_reduce = "float32" (torchtitan/config/job_config.py:290); deepspeed:
    communication_data_type defaults to the training dtype (deepspeed/runtime/engine.py:1363-1375). The gradient
    buffer and the all-reduce's bytes follow."""
    model, cluster = load_model("gpt3-350m"), _cluster(8)
    params = model.num_parameters()
    for name, grad_bytes in (("megatron", 4), ("fsdp", 4), ("deepspeed", 2)):
        r = simulate_analytic(model, cluster, Strategy.parse(f"dp=8,micro_batch=1,global_batch=8,framework={name}"))
        assert r.memory_breakdown_bytes["gradients"] == pytest.approx(grad_bytes * params)
        assert r.comm_bytes_per_gpu["dp"] == pytest.approx(2 * 7 / 8 * params * grad_bytes)
    explicit = Strategy.parse("dp=8,framework=megatron,fp32_grad_accum=false").resolve(cluster)
    assert explicit.fp32_grad_accum is False  # a strategy's own setting wins


def test_grad_reduce_overlap_every_framework_overlaps_without_pipelining() -> None:
    """megatron --overlap-grad-reduce (megatron/core/distributed/param_and_grad_buffer.py:472-489), deepspeed
    overlap_comm (deepspeed/runtime/zero/config.py:383-386), fsdp's post-backward reduce-scatter (FSDP2
    _fsdp_param_group.py:496)."""
    for name in framework_names():
        assert _resolved(f"dp=64,framework={name}").overlap_grad_reduce is True
        assert _resolved(f"dp=64,overlap_grad_reduce=false,framework={name}").overlap_grad_reduce is False


def test_grad_reduce_overlap_with_pipeline_deepspeed_switches_it_off() -> None:
    """deepspeed: "Pipeline parallelism does not support overlapped communication, will be disabled."
    (deepspeed/runtime/engine.py:2346-2349): the whole reduction is exposed after the pipeline; megatron overlaps
    it with the last micro-batch's backward (megatron/core/pipeline_parallel/schedules.py:2220-2274)."""
    assert _resolved("dp=16,pp=4,framework=deepspeed").overlap_grad_reduce is False
    assert _resolved("dp=16,pp=4,framework=megatron").overlap_grad_reduce is True
    assert _resolved("dp=64,framework=deepspeed").overlap_grad_reduce is True
    (problem,) = _problems("tp=8,pp=4,overlap_grad_reduce=true,framework=deepspeed")
    assert problem.startswith("overlap_grad_reduce=true with pp=4: DeepSpeed does not overlap the gradient reduction")
    model, cluster = load_model("gpt3-350m"), _cluster(8)
    same = "dp=4,pp=2,micro_batch=1,global_batch=8,fp32_grad_accum=false,grad_bucket_bytes=26214400"
    ds = simulate_analytic(model, cluster, Strategy.parse(f"{same},framework=deepspeed"))
    mg = simulate_analytic(model, cluster, Strategy.parse(f"{same},framework=megatron"))
    assert ds.time_breakdown_s["exposed_comm"] > mg.time_breakdown_s["exposed_comm"]
    unoverlapped = simulate_analytic(
        model, cluster, Strategy.parse(f"{same},framework=megatron,overlap_grad_reduce=false")
    )
    # the reduction exposed alike: the steps differ only by the kernel launch after each of Megatron-LM's blocking
    # sends (its pipeline_sends rule: the host's launch and the GPU's start), a whole number on the critical path
    call = load_framework("megatron").rules.kernel_launch.value.host_s + cluster.gpu.kernel_launch_s
    launches = (unoverlapped.step_time_s - ds.step_time_s) / call
    assert launches == pytest.approx(round(launches), abs=1e-6) and 1 <= round(launches) <= 4 * ds.num_microbatches


def test_grad_bucket_megatron_scales_with_dp_deepspeed_counts_elements_fsdp_is_ddps() -> None:
    """megatron: max(40M, 1M x dp) parameters (megatron/training/training.py:979-987); deepspeed: reduce_bucket_size
    5e8 elements (deepspeed/runtime/zero/config.py:113); fsdp without sharding: PyTorch DDP's 25 MiB."""
    assert _resolved("dp=8,framework=megatron", 8).grad_bucket_bytes == 40_000_000 * 4  # fp32 gradients
    assert _resolved("dp=64,framework=megatron").grad_bucket_bytes == 64_000_000 * 4
    assert _resolved("dp=64,framework=deepspeed").grad_bucket_bytes == 500_000_000 * 2  # bf16 gradients
    assert _resolved("dp=64,framework=fsdp").grad_bucket_bytes == 25 * 2**20
    assert _resolved("dp=64,framework=megatron,grad_bucket_bytes=1e6").grad_bucket_bytes == 1_000_000


def test_sharded_grads_reduced_every_microbatch_zero2_reduce_scatters_each_one() -> None:
    """deepspeed: "ZeRO stage >= 2 communicates during non gradient accumulation boundaries as well"
    (deepspeed/runtime/engine.py:2857-2859): 4 micro-batches reduce-scatter 4 times what one does, ZeRO-1 once."""
    model, cluster = load_model("gpt3-350m"), _cluster(8)

    def dp_bytes(zero: int, m: int) -> float:
        s = Strategy.parse(f"dp=8,micro_batch=1,global_batch={8 * m},zero={zero},framework=deepspeed")
        return simulate_analytic(model, cluster, s).comm_bytes_per_gpu["dp"]

    assert dp_bytes(2, 4) == pytest.approx(4 * dp_bytes(2, 1))
    assert dp_bytes(1, 4) == pytest.approx(dp_bytes(1, 1))
    assert all(load_framework(n).rules.sharded_grads_reduced_every_microbatch.value for n in framework_names())


def _tasks(strategy: str, gpus: int = 16, model: str = "gpt3-350m") -> list[list[Task]]:
    return [st.tasks for st in lower(load_model(model), _cluster(gpus), Strategy.parse(strategy)).stages]


def test_param_gather_overlap_megatron_gathers_under_the_next_forward() -> None:
    """megatron --overlap-param-gather (megatron/core/optimizer/distrib_optimizer.py:2590-2596;
    param_and_grad_buffer.py:265-301): no weight all-gather after the optimizer step; each bucket's gather runs
    under the step's first forward, the first issued at the start, each later one by the pre-hook that waits for
    the one before; deepspeed all-gathers after the step (deepspeed/runtime/zero/stage_1_and_2.py:2366-2375)."""
    assert _resolved("dp=64,zero=1,framework=megatron").overlap_param_gather is True
    assert _resolved("dp=64,zero=1,framework=megatron,overlap_grad_reduce=false").overlap_param_gather is False
    assert _resolved("dp=64,zero=1,framework=deepspeed").overlap_param_gather is False
    same = "dp=16,micro_batch=1,global_batch=32,zero=1,framework=megatron,grad_bucket_bytes=40000000"
    (tasks,) = _tasks(same)
    gathers = [k for k, t in enumerate(tasks) if t.category == "param_gather"]
    forwards = [k for k, t in enumerate(tasks) if t.category == "forward"]
    optimizer = next(k for k, t in enumerate(tasks) if t.category == "optimizer")
    assert len(gathers) > 1 and all(k < optimizer for k in gathers)
    assert tasks[gathers[0]].deps == ((0, 0),)  # at the start, after the wait for the slowest GPU
    for k in gathers[1:]:  # a prefetch of one: after the gather before it and the forward before its issue point
        assert (0, gathers[gathers.index(k) - 1]) in tasks[k].deps
    waits = [k for k in forwards if any(d[1] in gathers for d in tasks[k].deps)]
    assert len(waits) == len(gathers)
    (after,) = _tasks(same.replace("framework=megatron", "framework=megatron,overlap_param_gather=false"))
    (late,) = [k for k, t in enumerate(after) if t.category == "param_gather"]
    assert after[late].deps == ((0, next(k for k, t in enumerate(after) if t.category == "optimizer")),)
    model, cluster = load_model("gpt3-350m"), _cluster(16)
    for engine in ("analytic", "des"):
        hidden = plansim.simulate(model, cluster, Strategy.parse(same), engine=engine)
        exposed = plansim.simulate(model, cluster, Strategy.parse(f"{same},overlap_param_gather=false"), engine=engine)
        assert hidden.comm_bytes_per_gpu["zero"] == pytest.approx(exposed.comm_bytes_per_gpu["zero"])
        assert hidden.step_time_s < exposed.step_time_s
    analytic = plansim.simulate(model, cluster, Strategy.parse(same), engine="analytic")
    des = plansim.simulate(model, cluster, Strategy.parse(same), engine="des")
    assert analytic.step_time_s == pytest.approx(des.step_time_s, rel=0.01)


def test_param_gather_overlap_set_where_it_cannot_run_is_refused_in_one_line() -> None:
    """overlap_param_gather=true under a framework that gathers after the step (deepspeed), with a ZeRO stage that
    has no such gather, or without the overlapped reduction Megatron-LM requires (arguments.py:625-631)."""
    (p,) = _problems("dp=32,zero=1,overlap_param_gather=true,framework=deepspeed")
    assert p.startswith("overlap_param_gather=true with framework=deepspeed: DeepSpeed all-gathers the parameters")
    assert p.endswith("or framework=megatron")
    (p,) = _problems("dp=32,zero=3,overlap_param_gather=true")
    assert p.startswith("overlap_param_gather=true with zero=3")
    (p,) = _problems("dp=32,zero=1,overlap_param_gather=true,overlap_grad_reduce=false")
    assert "requires --overlap-grad-reduce" in p
    assert not _problems("dp=32,zero=1,overlap_param_gather=true")
    with pytest.raises(PlansimError, match=r"^--schedule gpipe: Megatron-LM does not run it .* --framework fsdp"):
        Constraints(schedule="gpipe")
    assert Constraints(schedule="gpipe", framework="fsdp").schedule == "gpipe"


def test_param_gather_overlap_with_interleaving_issues_chunks_ahead() -> None:
    """megatron with interleaving (align_param_gather): chunks 0 and 1 at the start, chunk k+1 when chunk k's first
    micro-batch begins, every bucket of a chunk at once (megatron/core/pipeline_parallel/schedules.py:1033-1036,
    1150-1168)."""
    plan = data_parallel_plan(
        _cluster(16),
        Strategy.parse("dp=4,pp=2,tp=2,zero=1,schedule=interleaved,virtual_stages=2").resolve(_cluster(16)),
    )
    assert plan is not None and plan.gather_overlapped
    gathers = weight_gathers(plan, False, [[1.0, 2.0], [3.0], [4.0], [5.0, 6.0]])
    assert [(g.chunk, g.first, g.issue) for g in gathers] == [(0, 0, START), (1, 0, START), (2, 0, 1), (3, 0, 2)]
    assert [g.n_bytes for g in gathers] == [6.0, 6.0, 8.0, 22.0]  # one bucket per chunk off the first stage


def test_grad_buckets_first_chunk_only_megatron_buckets_only_the_first_stage() -> None:
    """megatron: bucketing off on every stage but the first (megatron/core/distributed/distributed_data_parallel.py:
    113-123) and on every model chunk but the first (megatron/training/training.py:992-1004): one reduction per
    chunk there, launched once the chunk's gradients are complete; fsdp (DDP at zero 0 under torchtitan) buckets
    every stage alike."""
    small = "grad_bucket_bytes=4000000,micro_batch=1,global_batch=16"

    def reductions(strategy: str) -> list[int]:
        return [sum(t.category == "grad_reduce" for t in tasks) for tasks in _tasks(f"{strategy},{small}")]

    first, second = reductions("dp=8,pp=2,zero=1,framework=megatron")
    assert first > 1 and second == 1
    assert min(reductions("dp=8,pp=2,zero=0,framework=fsdp")) > 1
    first, second = reductions("dp=8,pp=2,zero=1,schedule=interleaved,virtual_stages=2,framework=megatron")
    assert first > 2 and second == 2  # stage 1: one per model chunk
    assert load_framework("megatron").rules.grad_buckets_first_chunk_only.value is True
    assert not any(load_framework(n).rules.grad_buckets_first_chunk_only.value for n in ("deepspeed", "fsdp"))


def test_schedules_megatron_has_no_gpipe_or_zero_bubble_deepspeed_only_1f1b() -> None:
    """megatron: get_forward_backward_func returns 1F1B or interleaved 1F1B only (megatron/core/pipeline_parallel/
    schedules.py:40-132); deepspeed: the pipeline engine hard-codes TrainSchedule, 1F1B (deepspeed/runtime/pipe/
    engine.py:389-392); fsdp: torchtitan takes torch's GPipe, 1F1B, interleaved 1F1B and the zero-bubble schedule,
    ZB-H1 with one stage per rank (torch/distributed/pipelining/schedules.py:684, 803, 2507, 2621)."""
    assert load_framework("megatron").rules.schedules.value == ("1f1b", "interleaved")
    assert load_framework("deepspeed").rules.schedules.value == ("1f1b",)
    assert set(load_framework("fsdp").rules.schedules.value) == set(SCHEDULES)
    for name in framework_names():
        assert set(load_framework(name).rules.schedules.value) <= set(SCHEDULES)
    (problem,) = _problems("dp=2,pp=4,tp=4,global_batch=16,schedule=zb-h1")
    assert problem == (
        "schedule=zb-h1 with framework=megatron: Megatron-LM runs the 1f1b and interleaved schedules "
        "(frameworks/megatron.yaml): use schedule=1f1b, or framework=fsdp"
    )
    (problem,) = _problems("dp=2,pp=4,tp=4,global_batch=16,schedule=interleaved,virtual_stages=2,framework=deepspeed")
    assert problem == (
        "schedule=interleaved with framework=deepspeed: DeepSpeed runs only the 1f1b schedule "
        "(frameworks/deepspeed.yaml): use schedule=1f1b, or framework=fsdp or megatron"
    )
    assert not _problems("dp=2,pp=4,tp=4,global_batch=16,schedule=zb-h1,framework=fsdp")
    assert not _problems("dp=8,tp=4,global_batch=16,schedule=gpipe")  # one stage: no schedule runs
    model, cluster = load_model("gpt3-1.3b"), _cluster(16)
    for name in framework_names():
        searched = {s.schedule for s in candidates(model, cluster, 32, Constraints(framework=name)) if s.pp > 1}
        assert searched == set(load_framework(name).rules.schedules.value)


def test_layer_split_deepspeed_places_the_blocks_itself() -> None:
    """deepspeed: PipelineModule partitions by its partition_method alone (deepspeed/runtime/pipe/module.py:396-420;
    Megatron-DeepSpeed's GPT passes type:transformer, gpt_model.py:463), so a strategy's own split is refused and the
    planner does not balance DeepSpeed's finalists; megatron (--decoder-first/last-pipeline-num-layers,
    --pipeline-model-parallel-layout) and fsdp (torchtitan's module_fqns_per_model_part) take one."""
    assert [load_framework(n).rules.layer_split.value for n in ("megatron", "deepspeed", "fsdp")] == [True, False, True]
    (problem,) = _problems("dp=2,pp=4,tp=4,global_batch=16,layer_split=5/7/7/5,framework=deepspeed")
    assert problem == (
        "layer_split with framework=deepspeed: DeepSpeed places the blocks over the stages by its own partition "
        "(frameworks/deepspeed.yaml: layer_split): leave layer_split out, or framework=fsdp or megatron"
    )
    assert not _problems("dp=2,pp=4,tp=4,global_batch=16,layer_split=5/7/7/5")
    assert not _problems("dp=2,pp=4,tp=4,global_batch=16,layer_split=5/7/7/5,framework=fsdp")
    splits = {}
    for name in ("megatron", "deepspeed"):
        r = plansim.plan("gpt3-1.3b", _cluster(16), global_batch=32, des=False, milp=False,
                         constraints=Constraints(framework=name, pp=4))  # fmt: skip
        splits[name] = [f.priced.strategy.layer_split for f in r.outcome.finalists]
    assert any(splits["megatron"]) and not any(splits["deepspeed"])


# ---- where the rules are read -------------------------------------------------------------------------------------
def test_the_planner_searches_what_the_framework_runs_and_plansim_models() -> None:
    model, cluster = load_model("gpt3-1.3b"), _cluster(16)
    for name in framework_names():
        seen = {(s.pp > 1, s.zero) for s in candidates(model, cluster, 64, Constraints(framework=name, tp=1))}
        for pipelined in (False, True):
            assert {z for p, z in seen if p == pipelined} == set(modelled_zero_stages(name, 4 if pipelined else 1))
        assert all(s.framework == name for s in candidates(model, cluster, 64, Constraints(framework=name, tp=8)))


def test_cli_framework_options() -> None:
    base = ["--model", "gpt3-1.3b", "--gpus", "16", "--format", "json"]
    ran = runner.invoke(
        app, ["simulate", *base, "-s", "dp=16,micro_batch=1,global_batch=16", "--framework", "deepspeed"]
    )
    assert ran.exit_code == 0, ran.output
    assert '"framework": "deepspeed"' in ran.stdout and '"fp32_grad_accum": false' in ran.stdout
    bad = runner.invoke(app, ["simulate", *base, "-s", "dp=16", "--framework", "jax"])
    assert (
        bad.exit_code == 2
        and bad.stderr.strip() == "error: framework 'jax' is unknown: choose one of deepspeed, fsdp, megatron"
    )
    refused = runner.invoke(app, ["simulate", *base, "-s", "tp=8,pp=2,zero=2", "--framework", "deepspeed"])
    assert refused.exit_code == 2 and "DeepSpeed runs only ZeRO 0, 1 with pipeline parallelism" in refused.stderr
    plan = runner.invoke(app, ["plan", "--model", "gpt3-350m", "--gpus", "8", "-B", "16", "--tp", "1", "--pp", "1",
                               "--no-des", "--framework", "fsdp", "--format", "json"])  # fmt: skip
    assert plan.exit_code == 0, plan.output
    finalists = json.loads(plan.stdout)["finalists"]
    assert finalists and all(f["analytic"]["strategy"]["zero"] != 1 for f in finalists)  # FSDP has no ZeRO-1
    assert all(f["analytic"]["strategy"]["framework"] == "fsdp" for f in finalists)


def test_simulate_api_takes_the_framework_field() -> None:
    r = plansim.simulate("gpt3-350m", "dgx-a100", "dp=8,micro_batch=1,global_batch=8,framework=deepspeed", gpus=8)
    assert r.to_dict()["strategy"]["framework"] == "deepspeed"


def test_compare_sets_one_strategy_under_every_framework_side_by_side() -> None:
    """``compare --framework`` (issue 19 item 4): one run per framework, labelled with it; a framework that cannot run
    the strategy is listed with its reason, and the others still run."""
    strategy = "dp=8,tp=8,micro_batch=1,global_batch=64,zero=1"
    c = plansim.compare(
        "gpt3-1.3b", [strategy], gpus=64, engine="analytic", frameworks=["megatron", "deepspeed", "fsdp"]
    )
    labels = [r.label for r in c.runs]
    base = labels[0].rsplit(" under ", 1)[0]
    assert labels == [f"{base} under megatron", f"{base} under deepspeed"]
    assert [r.strategy.framework for r in c.runs] == ["megatron", "deepspeed"]
    mg, ds = (r.result for r in c.runs)
    assert mg.memory_breakdown_bytes["gradients"] == pytest.approx(2 * ds.memory_breakdown_bytes["gradients"])
    ((label, why),) = c.refused
    assert label.endswith(" under fsdp") and why.startswith("zero=1 with framework=fsdp: PyTorch FSDP")
    ran = runner.invoke(app, ["compare", "--model", "gpt3-1.3b", "--gpus", "64", "-s", strategy, "--engine", "analytic",
                              "--framework", "fsdp", "--framework", "deepspeed", "--format", "json"])  # fmt: skip
    assert ran.exit_code == 0, ran.output
    data = json.loads(ran.stdout)
    assert [r["label"].rsplit(" ", 1)[-1] for r in data["runs"]] == ["deepspeed"]
    assert data["refused"][0]["label"].endswith("under fsdp")
    with pytest.raises(PlansimError, match=r"^zero=1 with framework=fsdp"):
        plansim.compare("gpt3-1.3b", [strategy], gpus=64, engine="analytic", frameworks=["fsdp"])
    with pytest.raises(PlansimError, match=r"^--framework jax: choose one of deepspeed, fsdp, megatron$"):
        plansim.compare("gpt3-1.3b", [strategy], gpus=64, engine="analytic", frameworks="jax")


def test_the_planner_searches_every_framework_with_all_and_names_what_differs() -> None:
    """``--framework all`` (issue 19 item 2): every framework's candidates, counted as built; the explanation names,
    per other framework, its best candidate and the rules in which it differs from the winner's."""
    from plansim.planner import plan
    from plansim.planner.space import count_candidates

    model, cluster = load_model("gpt3-1.3b"), _cluster(16)
    every = Constraints(framework="all", tp=1)
    assert count_candidates(model, cluster, 64, every) == sum(1 for _ in candidates(model, cluster, 64, every))
    assert count_candidates(model, cluster, 64, every) == sum(
        count_candidates(model, cluster, 64, Constraints(framework=n, tp=1)) for n in framework_names()
    )
    r = plan("gpt3-13b", "dgx-h100", gpus=64, global_batch=512, constraints={"framework": "all"}, des=False)
    winner = r.winner
    assert winner is not None
    others = [load_framework(n).title for n in framework_names() if n != winner.framework]
    for title in others:
        assert f"Best under {title}: " in r.explanation, r.explanation
    assert r.megatron is None or r.megatron.priced.strategy.framework == "megatron"  # the recipe is Megatron-LM's
    with pytest.raises(PlansimError, match=r"^--framework jax: choose one of deepspeed, fsdp, megatron, all$"):
        Constraints(framework="jax")


def test_rule_differences_are_the_rules_that_bear_on_the_strategy() -> None:
    from plansim.strategy.frameworks import rule_differences

    assert rule_differences("megatron", "megatron") == []
    assert "no overlap of the gradient reduction with pipelining" not in rule_differences("megatron", "deepspeed")
    assert "no overlap of the gradient reduction with pipelining" in rule_differences("megatron", "deepspeed", pp=2)
    assert (
        "ZeRO-2 with the weights sharded, gathered per layer in forward and kept until its backward (SHARD_GRAD_OP), "
        "not replicated"
    ) in rule_differences("deepspeed", "fsdp", zero=2)
    assert "hybrid sharding of ZeRO-3 (HSDP)" in rule_differences("megatron", "fsdp", zero=3)
    assert "no hybrid sharding of ZeRO-3 (HSDP)" in rule_differences("fsdp", "deepspeed", zero=3)
    assert not any("HSDP" in w for w in rule_differences("megatron", "fsdp", zero=1))
    sends = "1f1b pipeline sends beside compute, not blocking with a host synchronisation"
    assert sends in rule_differences("megatron", "fsdp", pp=2) and sends not in rule_differences("megatron", "fsdp")
    assert not any("sends" in w for w in rule_differences("megatron", "fsdp", pp=2, schedule="interleaved"))
    assert (
        rule_differences("megatron", "fsdp", zero=2, pp=2)[-1] == "ZeRO-2 with pipelining not modelled by plansim yet"
    )
    assert rule_differences("deepspeed", "megatron", zero=2, pp=2)[-1] == (
        "no ZeRO-2 with pipelining (it runs ZeRO 0, 1)"
    )


# ---- tensor-parallel communication beside the GEMMs ----------------------------------------------------------------
def _block_program(strategy: str, preset: str = "gpt3-1.3b", gpus: int = 8):  # type: ignore[no-untyped-def]
    """Block 0's program under ``strategy``, with the op graph and kernel model it was walked from."""
    from plansim.step.layers import layer_programs
    from plansim.step.prepare import prepare_step
    from plansim.step.tp_overlap import tp_overlap
    from plansim.strategy.mesh import mesh_of

    cluster = _cluster(gpus)
    prep = prepare_step(load_model(preset), cluster, Strategy.parse(strategy))
    programs = layer_programs(prep.graph, prep.kernels, mesh_of(prep.strategy), tp_overlap(prep.strategy, cluster))
    return programs[0], prep


def test_tp_grad_input_overlap_megatron_reduces_the_input_gradient_beside_the_weight_gradient() -> None:
    """megatron (Transformer Engine's linear.py:735-745, "Overlap dgrad-RS/AR with wgrad") launches a column-parallel
    linear's input-gradient reduction after its input-gradient GEMM and runs the weight gradient beside it:
    reduce-scatter with sequence parallelism, all-reduce without; deepspeed (Megatron-DeepSpeed, arguments.py:390-399,
    layers.py:339-357) only the reduce-scatter; fsdp (DTensor) neither. The asynchronous one is hidden behind
    exactly the weight-gradient GEMM of QKV and fc1 (the walk runs backward: fc1 first)."""
    from plansim.step.layers import weight_gradient_s

    cases = {
        ("megatron", True): ["reduce_scatter"] * 2,
        ("megatron", False): ["all_reduce"] * 2,
        ("deepspeed", True): ["reduce_scatter"] * 2,
        ("deepspeed", False): [],
        ("fsdp", True): [],
        ("fsdp", False): [],
    }
    for (framework, sp), expected in cases.items():
        lp, prep = _block_program(f"tp=4,dp=2,sequence_parallel={str(sp).lower()},framework={framework}")
        beside = [i for i, seg in enumerate(lp.bwd) if seg.comm is not None and seg.comm.collective != "all_gather"]
        hidden = [i for i in beside if lp.bwd[i].hidden_s > 0]
        assert [lp.bwd[i].comm.collective for i in hidden] == expected, (framework, sp)  # type: ignore[union-attr]
        if expected:
            wgrads = [weight_gradient_s(prep.graph.nodes[f"L0.{n}"], prep.kernels) for n in ("fc1", "qkv")]
            assert [lp.bwd[i].hidden_s for i in hidden] == pytest.approx(wgrads, rel=1e-12)
            assert [lp.bwd[i + 1].seconds for i in hidden] == pytest.approx(wgrads, rel=1e-12)
            # split backward (B without W) waits for the reduction at once
            blocking = [seg for seg in lp.bwd_input if seg.comm and seg.comm.collective == expected[0]]
            assert len(blocking) == 2 and all(seg.hidden_s == 0 for seg in blocking)
    model, cluster = load_model("gpt3-1.3b"), _cluster(8)
    for sp in ("true", "false"):
        s = Strategy.parse(f"tp=4,dp=2,micro_batch=1,global_batch=4,sequence_parallel={sp}")
        analytic = plansim.simulate(model, cluster, s, engine="analytic")
        des = plansim.simulate(model, cluster, s, engine="des")
        assert analytic.step_time_s == pytest.approx(des.step_time_s, rel=0.01)
        blocking = plansim.simulate(model, cluster, s.model_copy(update={"framework": "fsdp"}), engine="des")
        assert des.comm_bytes_per_gpu["tp"] == pytest.approx(blocking.comm_bytes_per_gpu["tp"])


def test_tp_comm_overlap_megatron_pipelines_the_blocks_gemms_with_their_collectives() -> None:
    """megatron --tp-comm-overlap (Transformer Engine v2.9 userbuffers, base.py:302-348): QKV and fc1's input
    all-gathers and proj and fc2's output-gradient all-gathers as ring exchanges beside tp chunks of their GEMM (the
    last chunk waits), on the copy engines; proj and fc2's forward in 4 chunks, each chunk's reduce-scatter beside
    the next chunk, the last one blocking; the GEMMs beside the SM kernels on 16 SMs fewer; each split GEMM's chunks
    on three compute streams in turn (base.py:63, comm_gemm_overlap.cpp:533-538, 967-972), so together they take the
    whole GEMM's time. Priced with a fixed time per collective and no interference, a block's exposed forward
    communication is the closed form of that pipeline; the bytes sent are those without the overlap."""
    from plansim.step.layers import layer_cost

    lp, prep = _block_program("tp=4,dp=2,sequence_parallel=true,tp_comm_overlap=true")
    plain, _ = _block_program("tp=4,dp=2,sequence_parallel=true")
    kernels, graph, tp, sms = prep.kernels, prep.graph, 4, _cluster(8).gpu.sm_count
    fwd_comms = [seg for seg in lp.fwd if seg.comm is not None]
    assert [(s.comm.collective, s.comm.engine, s.hidden_s > 0) for s in fwd_comms] == [  # type: ignore[union-attr]
        ("all_gather", "copy_engine", True),
        *[("reduce_scatter", "userbuffers", True)] * 3,
        ("reduce_scatter", "userbuffers", False),
        ("all_gather", "copy_engine", True),
        *[("reduce_scatter", "userbuffers", True)] * 3,
        ("reduce_scatter", "userbuffers", False),
    ]
    qkv, proj = graph.nodes["L0.qkv"], graph.nodes["L0.proj"]
    g_qkv = kernels.kernel_time("matmul", qkv["flops"], qkv["bytes"]) / tp
    g_proj = sms / (sms - 16) * kernels.kernel_time("matmul", proj["flops"], proj["bytes"]) / 4
    assert fwd_comms[0].hidden_s == pytest.approx((tp - 1) * g_qkv, rel=1e-12)
    assert fwd_comms[1].hidden_s == pytest.approx(g_proj, rel=1e-12)
    assert fwd_comms[1].comm.n_bytes == pytest.approx(graph.nodes["L0.attn_out"]["comm_bytes"] / 4)  # type: ignore[union-attr]
    for t in (0.2 * g_qkv, 5 * g_qkv):  # hidden, then exposed by what outlasts the compute beside

        def price(axis: str, coll: str, n: float, t: float = t) -> tuple[float, float]:
            return t, n

        cost = layer_cost(lp, price)
        fc1, fc2 = graph.nodes["L0.fc1"], graph.nodes["L0.fc2"]
        g_fc1 = kernels.kernel_time("matmul", fc1["flops"], fc1["bytes"]) / tp
        g_fc2 = sms / (sms - 16) * kernels.kernel_time("matmul", fc2["flops"], fc2["bytes"]) / 4
        expected = sum(max(0.0, t - (tp - 1) * g) for g in (g_qkv, g_fc1))
        expected += sum(3 * max(0.0, t - g) + t for g in (g_proj, g_fc2))
        assert cost.comm_fwd_s == pytest.approx(expected, rel=1e-9)
    sent = lambda axis, coll, n: (0.0, (tp - 1) / tp * n * (1 if coll != "all_reduce" else 2))  # noqa: E731
    assert layer_cost(lp, sent).comm_fwd_bytes == pytest.approx(layer_cost(plain, sent).comm_fwd_bytes, rel=1e-12)
    model, cluster = load_model("gpt3-1.3b"), _cluster(8)
    s = Strategy.parse("tp=4,dp=2,micro_batch=1,global_batch=4,sequence_parallel=true,tp_comm_overlap=true")
    analytic, des = (plansim.simulate(model, cluster, s, engine=e) for e in ("analytic", "des"))
    assert analytic.step_time_s == pytest.approx(des.step_time_s, rel=0.01)
    assert analytic.time_breakdown_s["interference"] == pytest.approx(des.time_breakdown_s["interference"], rel=0.05)
    tasks = lower(model, cluster, s).stages[0].tasks
    side = [t for t in tasks if t.stream == "tp"]
    # the output layer's re-gather stays NCCL's (Megatron's own ColumnParallelLinear, not Transformer Engine's)
    assert {t.comm.engine for t in side} == {"copy_engine", "userbuffers", "nccl"}  # type: ignore[union-attr]
    # Megatron passes TE one micro-batch's tokens x hidden (initialize.py:267-271): 12 such bf16 buffers
    buffers = 12 * model.seq_len * 1 * model.hidden * 2
    assert analytic.memory_breakdown_bytes["userbuffers"] == buffers == des.memory_breakdown_bytes["userbuffers"]
    off = plansim.simulate(model, cluster, s.model_copy(update={"tp_comm_overlap": False}), engine="des")
    assert off.memory_breakdown_bytes["userbuffers"] == 0
    assert des.time_breakdown_s["exposed_comm"] < off.time_breakdown_s["exposed_comm"]


@pytest.mark.parametrize(
    "strategy,message",
    [
        (
            "tp=4,sequence_parallel=true,tp_comm_overlap=true,framework=deepspeed",
            "tp_comm_overlap=true with framework=deepspeed: DeepSpeed does not pipeline GEMMs with their "
            "tensor-parallel collectives (frameworks/deepspeed.yaml): leave tp_comm_overlap out, or framework=megatron",
        ),
        (
            "tp=4,sequence_parallel=true,tp_comm_overlap=true,framework=fsdp",
            "tp_comm_overlap=true with framework=fsdp: PyTorch FSDP (torchtitan) does not pipeline GEMMs with their "
            "tensor-parallel collectives (frameworks/fsdp.yaml): leave tp_comm_overlap out, or framework=megatron",
        ),
        (
            "tp=4,tp_comm_overlap=true",
            "tp_comm_overlap=true without sequence parallelism: Megatron-LM overlaps them only with it "
            "(frameworks/megatron.yaml): set sequence_parallel=true",
        ),
        ("tp=1,tp_comm_overlap=true", "tp_comm_overlap=true with tp=1: there is no tensor-parallel communication"),
    ],
)
def test_tp_comm_overlap_where_it_cannot_run_is_refused_in_one_line(strategy: str, message: str) -> None:
    (problem,) = _problems(strategy)
    assert problem.startswith(message) and "\n" not in problem


def test_tp_comm_overlap_outside_transformer_blocks_is_refused_in_one_line() -> None:
    """Megatron-LM gives Transformer Engine's userbuffers only to its blocks' qkv, proj, fc1 and fc2 GEMMs."""
    s = Strategy.parse("tp=4,dp=1,sequence_parallel=true,tp_comm_overlap=true")
    assert check_strategy(s, load_model("mlp-small"), _cluster(4)) == [
        "tp_comm_overlap=true with a mlp model: Megatron-LM overlaps only transformer blocks' GEMMs: "
        "leave tp_comm_overlap out"
    ]
    with pytest.raises(PlansimError, match=r"^--tp-comm-overlap needs sequence parallelism"):
        Constraints(tp_comm_overlap=True, sequence_parallel=False)


def test_the_planner_tries_tp_comm_overlap_where_the_framework_runs_it() -> None:
    """The space holds no ``tp_comm_overlap`` by default; the search tries it on each sequence-parallel finalist
    under megatron (deepspeed and fsdp never get it) and keeps the better; ``Constraints(tp_comm_overlap=True)``
    searches only it, ``False`` never tries it."""
    from plansim.planner.search import TIE, search

    model, cluster = load_model("gpt3-350m"), _cluster(8)
    assert not any(s.tp_comm_overlap for s in candidates(model, cluster, 16, Constraints(framework="all", max_pp=1)))
    found = list(candidates(model, cluster, 16, Constraints(tp_comm_overlap=True, max_pp=1)))
    assert found and all(s.tp_comm_overlap and s.sequence_parallel and s.tp > 1 for s in found)
    for framework in ("deepspeed", "fsdp"):  # refused before any search (test_plan_tp_comm_overlap_under_...)
        with pytest.raises(PlansimError, match="does not run it"):
            Constraints(framework=framework, tp_comm_overlap=True)
    c = Constraints(max_pp=1, sequence_parallel=True, tp=2, remat=("none",))
    tried = search(model, cluster, 16, c, des=False, milp=False, splits=False, top_k=40).finalists
    plain = search(model, cluster, 16, Constraints(**{**c.__dict__, "tp_comm_overlap": False}), des=False,
                   milp=False, splits=False, top_k=40).finalists  # fmt: skip
    assert not any(f.priced.strategy.tp_comm_overlap for f in plain)
    overlapped = [f.priced for f in tried if f.priced.strategy.tp_comm_overlap]
    assert overlapped and len(plain) < 40  # every finalist fits in the 40, so each got its overlapped twin
    without = {f.priced.strategy: f.priced.result.step_time_s for f in tried if not f.priced.strategy.tp_comm_overlap}
    base = {f.priced.strategy: f.priced.result.step_time_s for f in plain}
    # each finalist kept is ranked with its overlapped twin, both priced by the analytic engine; the ranking is by
    # step time, plans within ``TIE`` of each other ordered by lower peak memory (``search.ranked``)
    times = sorted([*without.values(), *(p.result.step_time_s for p in overlapped)])
    assert times == sorted(f.priced.result.step_time_s for f in tried)
    ranks = [f.priced.result.step_time_s for f in tried]
    assert all(b >= a or a - b <= TIE * a for a, b in itertools.pairwise(ranks))
    assert set(without) <= set(base)
    for p in overlapped:
        twin = p.strategy.model_copy(update={"tp_comm_overlap": False})
        assert twin in base
        again = simulate_analytic(model, cluster, p.strategy)
        assert p.result.step_time_s == again.step_time_s


def test_zero2_shards_weights_fsdp_gathers_each_layer_once_and_keeps_it_until_its_backward() -> None:
    """fsdp's zero=2 is SHARD_GRAD_OP (torch/distributed/fsdp/api.py:32-69; FSDP2 reshard_after_forward=False): the
    weights sharded at rest, each layer all-gathered before its forward and kept until its backward, which gathers
    nothing, then resharded; gradients reduce-scattered per layer. So per micro-batch half of ZeRO-3's gather
    volume, and at the end of forward every weight of the stage gathered beside the shard: P (4 / dp + 2) bytes of
    weights (the fp32 shard, which is the master copy: ``sharded_params_are_master``, and the bf16 copies), where
    deepspeed's ZeRO-2 keeps them whole (2 P)."""
    same = "dp=16,micro_batch=1,global_batch=32,zero=2,framework=fsdp"
    (tasks,) = _tasks(same)
    gathers = [t for t in tasks if t.category == "param_gather"]
    assert gathers and all(t.name.startswith("gatherf") for t in gathers)  # no backward gathers
    for t in gathers:
        ((name, _, _),) = t.alloc
        freed = [u for u in tasks if name in u.free]
        assert len(freed) == 1 and freed[0].category == "backward", name  # kept until the layer's backward
        assert freed[0].name.split(".")[1] == t.name.split(".")[1]  # the same layer
    model, cluster = load_model("gpt3-350m"), _cluster(16)
    results = {}
    for z, fw in ((2, "fsdp"), (3, "fsdp"), (2, "deepspeed")):
        s = Strategy.parse(same.replace("zero=2,framework=fsdp", f"zero={z},framework={fw}"))
        for engine in ("analytic", "des"):
            results[z, fw, engine] = plansim.simulate(model, cluster, s, engine=engine)
    for engine in ("analytic", "des"):
        shard_grad_op, full_shard = results[2, "fsdp", engine], results[3, "fsdp", engine]
        assert shard_grad_op.comm_bytes_per_gpu["zero"] == pytest.approx(full_shard.comm_bytes_per_gpu["zero"] / 2)
        assert shard_grad_op.comm_bytes_per_gpu["dp"] == pytest.approx(full_shard.comm_bytes_per_gpu["dp"])
        params = model.num_parameters()
        weights = shard_grad_op.memory_breakdown_bytes["weights"]
        assert weights == pytest.approx(params * (4 / 16 + 2), rel=1e-6)
        assert results[2, "deepspeed", engine].memory_breakdown_bytes["weights"] == pytest.approx(2 * params, rel=1e-6)
    a, d = results[2, "fsdp", "analytic"], results[2, "fsdp", "des"]
    assert a.step_time_s == pytest.approx(d.step_time_s, rel=0.01)
    assert a.peak_memory_bytes == pytest.approx(d.peak_memory_bytes, rel=1e-9)
    assert 2 in modelled_zero_stages("fsdp", 1) and 2 not in modelled_zero_stages("fsdp", 2)


def test_plan_tp_comm_overlap_under_a_framework_without_it_is_one_line() -> None:
    res = runner.invoke(
        app, ["plan", "--model", "gpt3-350m", "--gpus", "8", "-B", "16", "--tp-comm-overlap", "--framework", "fsdp"]
    )
    assert res.exit_code == 2
    assert res.output.strip() == (
        "error: --tp-comm-overlap: PyTorch FSDP (torchtitan) does not run it (frameworks/fsdp.yaml): use --framework "
        "megatron, or leave --tp-comm-overlap out"
    )


def test_the_explanation_says_what_tp_comm_overlap_would_do_to_the_winner() -> None:
    """The twin tried on the winner is named with its analytic time, which re-pricing gives back."""
    r = plansim.plan("gpt3-1.3b", "dgx-a100", gpus=16, global_batch=64, constraints={"tp": 2, "max_pp": 1}, des=False)
    twin = r.winner.model_copy(update={"tp_comm_overlap": True})
    assert r.winner.sequence_parallel and not r.winner.tp_comm_overlap
    seconds = simulate_analytic(load_model("gpt3-1.3b"), _cluster(16), twin).step_time_s
    mine = simulate_analytic(load_model("gpt3-1.3b"), _cluster(16), r.winner).step_time_s
    assert (
        "With Megatron-LM's --tp-comm-overlap (tried on each finalist) the winner's configuration takes "
        f"{seconds:.3f} s by the analytic engine against {mine:.3f} s without" in r.explanation
    )


def test_a_pipeline_send_waits_for_the_input_gradients_reduction() -> None:
    """An MLP block opens with a column-parallel linear, so a chunk's backward ends with its input gradient's
    all-reduce running beside the weight gradient: the send of that gradient waits for the all-reduce, and the
    engines agree."""
    model, cluster = load_model("mlp-small"), _cluster(8)
    s = Strategy(tp=4, pp=2, dp=1, micro_batch=1, global_batch=8)
    tasks = lower(model, cluster, s).stages[1].tasks
    beside = {i for i, t in enumerate(tasks) if t.stream == "tp" and t.comm and t.comm.collective == "all_reduce"}
    sends = [t for t in tasks if t.category == "send" and t.name.startswith("sendB")]
    assert beside and sends and all(any(d[1] in beside for d in t.deps) for t in sends)
    analytic, des = (plansim.simulate(model, cluster, s, engine=e) for e in ("analytic", "des"))
    assert analytic.step_time_s == pytest.approx(des.step_time_s, rel=0.01)


def test_sharded_weights_kept_with_pipeline_fsdp_runs_zero3_as_zero1_within_the_step() -> None:
    """fsdp with pipelining (torchtitan: reshard_after_forward off, parallelize.py:319-331; torch's stage runs every
    backward without resharding or reducing, stage.py:989-1021, and a REDUCE_GRAD action after the last): each
    layer all-gathered once, under its first forward, kept through the step; whole fp32 gradients reduce-scattered
    once per step after the stage's last backward. So Megatron-LM's ZeRO-1 memory and volumes, one layer per gather
    bucket and the reduction not overlapped; deepspeed and megatron refuse ZeRO-3 with pipelining."""
    model, cluster = load_model("gpt3-1.3b"), _cluster(16)
    fsdp = Strategy.parse("dp=4,pp=4,micro_batch=1,global_batch=32,zero=3,framework=fsdp")
    zero1 = Strategy.parse("dp=4,pp=4,micro_batch=1,global_batch=32,zero=1,framework=megatron")
    (tasks,) = [st.tasks for st in lower(model, cluster, fsdp).stages[1:2]]
    gathers = [k for k, t in enumerate(tasks) if t.category == "param_gather"]
    reduces = [k for k, t in enumerate(tasks) if t.category == "grad_reduce"]
    backwards = [k for k, t in enumerate(tasks) if t.category == "backward"]
    blocks = sum(1 for t in tasks if t.category == "forward" and t.microbatch == 0)
    assert len(gathers) == blocks  # one gather per layer and step
    # one reduction after the stage's last backward (torch issues one per layer back to back: the same bytes)
    assert len(reduces) == 1 and reduces[0] > max(backwards)
    for engine in ("analytic", "des"):
        a = plansim.simulate(model, cluster, fsdp, engine=engine)
        b = plansim.simulate(model, cluster, zero1, engine=engine)
        for key in ("weights", "gradients", "optimizer"):
            assert a.memory_breakdown_bytes[key] == pytest.approx(b.memory_breakdown_bytes[key], rel=1e-12)
        assert a.comm_bytes_per_gpu == pytest.approx(b.comm_bytes_per_gpu, rel=1e-12)
    analytic, des = (plansim.simulate(model, cluster, fsdp, engine=e) for e in ("analytic", "des"))
    assert analytic.step_time_s == pytest.approx(des.step_time_s, rel=0.01)
    assert 3 in modelled_zero_stages("fsdp", 4) and 3 not in modelled_zero_stages("deepspeed", 4)


def test_hybrid_shard_fsdp_shards_within_a_group_and_all_reduces_across() -> None:
    """fsdp's HSDP (ShardingStrategy.HYBRID_SHARD / _HYBRID_SHARD_ZERO2; FSDP2 on a (replicate, shard) mesh; the
    profile's ``hybrid_shard`` source): states sharded over ``dp_shard`` ranks (a node's), each layer's gradients
    reduce-scattered among them and the result all-reduced among the shard's replicas, weights gathered within the
    shard group only. Checked against the ring's closed forms: a reduce-scatter among S ranks sends (S-1)/S of the
    bytes, an all-reduce of 1/S of them among R replicas 2(R-1)/R of that; megatron and deepspeed refuse it."""
    model, cluster = load_model("gpt3-1.3b"), _cluster(32)
    hsdp = Strategy.parse("dp=32,micro_batch=1,global_batch=64,zero=3,framework=fsdp,dp_shard=8")
    full = Strategy.parse("dp=32,micro_batch=1,global_batch=64,zero=3,framework=fsdp")
    plan = data_parallel_plan(cluster, hsdp.resolve(cluster))
    assert plan is not None and plan.replicate is not None
    assert (plan.reduce.axis, plan.gather.axis, plan.replicate.axis) == ("dp_shard_cp", "dp_shard_cp", "dp_replicate")
    assert plan.replicate.collective == "all_reduce" and plan.shard_ranks == 8
    tasks = lower(model, cluster, hsdp).stages[0].tasks
    rs = [t for t in tasks if t.category == "grad_reduce" and t.comm is not None and t.comm.axis == "dp_shard_cp"]
    ar = [t for t in tasks if t.category == "grad_reduce" and t.comm is not None and t.comm.axis == "dp_replicate"]
    assert len(rs) == len(ar) > 0
    assert all(b.comm.n_bytes * 8 == pytest.approx(a.comm.n_bytes) for a, b in zip(rs, ar, strict=True))
    s, r = 8, 4
    grads = sum(t.comm.n_bytes for t in rs)  # every layer's gradients, every micro-batch
    for engine in ("analytic", "des"):
        a = plansim.simulate(model, cluster, hsdp, engine=engine)
        b = plansim.simulate(model, cluster, full, engine=engine)
        assert a.comm_bytes_per_gpu["dp"] == pytest.approx(grads * ((s - 1) / s + 2 * (r - 1) / r / s), rel=1e-9)
        assert a.comm_bytes_per_gpu["zero"] == pytest.approx(b.comm_bytes_per_gpu["zero"] * (s - 1) / s * 32 / 31)
        for key in ("gradients", "optimizer"):  # sharded 8 ways, not 32
            assert a.memory_breakdown_bytes[key] == pytest.approx(4 * b.memory_breakdown_bytes[key], rel=1e-9)
    analytic, des = (plansim.simulate(model, cluster, hsdp, engine=e) for e in ("analytic", "des"))
    assert analytic.step_time_s == pytest.approx(des.step_time_s, rel=0.01)
    for framework in ("megatron", "deepspeed"):
        (problem,) = _problems(f"dp=32,zero=3,framework={framework},dp_shard=8")
        assert problem.startswith(f"dp_shard=8 with framework={framework}: ") and "framework=fsdp" in problem


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ("dp=32,zero=3,framework=fsdp,dp_shard=5", "dp_shard=5 does not divide dp=32: use a divisor of dp"),
        ("dp=32,zero=0,framework=fsdp,dp_shard=8", "dp_shard=8 with zero=0: PyTorch FSDP (torchtitan) hybrid-shards"),
        ("dp=32,zero=3,framework=fsdp,dp_shard=1", "dp_shard=1 shards nothing: use zero=0"),
    ],
)
def test_hybrid_shard_that_cannot_run_is_refused_in_one_line(strategy: str, message: str) -> None:
    (problem,) = _problems(strategy)
    assert problem.startswith(message) and "\n" not in problem


def test_the_planner_searches_hybrid_sharding_within_a_node_under_fsdp_only() -> None:
    model, cluster = load_model("gpt3-1.3b"), _cluster(32)
    for framework in framework_names():
        shards = {(s.tp, s.zero, s.dp_shard) for s in candidates(model, cluster, 64, Constraints(framework=framework))}
        hybrid = {x for x in shards if x[2] is not None}
        if framework == "fsdp":  # a node's data-parallel ranks: 8 // tp, for ZeRO-2 and 3 where it splits dp
            assert hybrid and all(shard == 8 // tp and zero in (2, 3) for tp, zero, shard in hybrid)
        else:
            assert not hybrid


def test_pipeline_sends_megatron_blocks_and_synchronises_deepspeed_blocks_fsdp_overlaps() -> None:
    """Megatron-LM's 1F1B sends are blocking batch_isend_irecv calls ending in torch.cuda.synchronize()
    (p2p_communication.py:390-398): the stage's compute waits for each send, then idles one kernel launch; DeepSpeed's
    blocking dist.send (pipe/p2p.py:46-84) makes it wait without the launch; torch's pipelining waits a send only in a
    batch with the receive the next pass needs, or at the end (pipelining/schedules.py:732-736, 906, 928): nothing
    waits for the send alone. Megatron-LM's interleaved sends block nothing (overlap_p2p_comm)."""
    model, cluster = load_model("gpt3-1.3b"), _cluster(16)
    launch = load_framework("megatron").rules.kernel_launch.value.host_s + cluster.gpu.kernel_launch_s
    waits = {}
    for framework in framework_names():
        s = Strategy.parse(f"dp=2,tp=2,pp=4,micro_batch=1,global_batch=32,schedule=1f1b,framework={framework}")
        tasks = lower(model, cluster, s).stages[1].tasks
        sends = {k for k, t in enumerate(tasks) if t.category == "send"}
        calls = [t for t in tasks if t.category == "p2p_call"]
        assert all(len(t.deps) == 1 and t.deps[0][1] in sends for t in calls)  # each waits for its own send
        waits[framework] = (len(calls) == len(sends) > 0, {t.duration_s for t in calls})
    assert waits == {"megatron": (True, {launch}), "deepspeed": (True, {0.0}), "fsdp": (False, set())}
    interleaved = Strategy.parse("dp=2,tp=2,pp=4,micro_batch=1,global_batch=32,schedule=interleaved,virtual_stages=2")
    assert not any(t.category == "p2p_call" for t in lower(model, cluster, interleaved).stages[1].tasks)


def test_param_prefetch_fsdp_one_unit_megatron_a_window_deepspeed_a_live_cap() -> None:
    """ZeRO-3's gathers ahead of each pass: FSDP one unit (_fsdp_param_group.py:634-647; FSDP1's limit of 1);
    Megatron-FSDP the following units until 5e8 elements, the one crossing it included (megatron_fsdp.py:355-380,
    AllGatherPipeline.all_gather_params); DeepSpeed while the live gathered elements stay within
    stage3_max_live_parameters = 1e9 (zero/config.py:238-248, partitioned_param_coordinator.py:451-485). Counted on
    the lowering's first forward of GPT-3 1.3B (embedding 107.1M parameters, blocks 50.4M), against the same walk done
    by hand; deeper windows hide more of a gather-bound step, both engines agreeing."""
    model, cluster = load_model("gpt3-1.3b"), _cluster(16)
    first = {}
    for framework in framework_names():
        s = Strategy.parse(f"dp=16,micro_batch=1,global_batch=16,zero=3,framework={framework}")
        tasks = lower(model, cluster, s).stages[0].tasks
        ahead_of_first = next(i for i, t in enumerate(tasks) if t.category == "forward")
        gathers = [t.comm.n_bytes / 2 for t in tasks[:ahead_of_first] if t.category == "param_gather" and t.comm]
        first[framework] = gathers
    embedding, block = first["fsdp"]
    assert embedding == (model.vocab + model.seq_len) * model.hidden and embedding > 2 * block  # learned positions
    k_megatron = math.ceil(5e8 / block)  # blocks until 5e8 elements, the crossing one included
    k_deepspeed = int((1e9 - embedding) // block)  # blocks the live cap leaves beside the embedding
    assert [len(first[f]) for f in ("fsdp", "megatron", "deepspeed")] == [2, 1 + k_megatron, 1 + k_deepspeed]
    assert (k_megatron, k_deepspeed) == (10, 17)
    # a gather-bound step (GPT-3 350M on 96 A100s), the other rules set alike, the attention kernel among them (a
    # profile without fused-attention curves prices both frameworks' kernel as a GEMM): the windows hide more of it
    same = "dp=96,micro_batch=1,global_batch=96,zero=3,fp32_grad_accum=true,grad_bucket_bytes=26214400"
    a100 = load_hardware("dgx-a100", gpus=96)
    alike = Cluster(a100.node, a100.gpu.model_copy(update={"attention_kernels": {}}), a100.num_gpus)
    exposed = {}
    for framework in ("fsdp", "megatron"):
        a, d = (
            plansim.simulate("gpt3-350m", alike, f"{same},framework={framework}", engine=e) for e in ("analytic", "des")
        )
        assert a.step_time_s == pytest.approx(d.step_time_s, rel=0.01)
        exposed[framework] = d.time_breakdown_s["exposed_comm"]
    assert exposed["megatron"] < 0.9 * exposed["fsdp"]


def test_a_split_backward_schedule_needs_its_framework_without_pipelining_too() -> None:
    """ZB-H1 splits each backward into B and W passes, which changes the step at pp=1 too (the input gradient's
    reduction no longer runs beside the weight-gradient GEMM of the same pass), so Megatron-LM, which does not run
    it (frameworks/megatron.yaml ``schedules``), refuses it at pp=1 as at pp>1; torch's pipelining runs it."""
    cluster = load_hardware("dgx-a100", gpus=2)
    model = load_model("gpt3-125m")
    for pp_one in ("dp=1,tp=2,pp=1", "dp=2,tp=1,pp=1"):
        refused = check_strategy(Strategy.parse(f"{pp_one},schedule=zb-h1"), model, cluster)
        assert any("schedule=zb-h1 with framework=megatron" in p for p in refused), refused
        assert check_strategy(Strategy.parse(f"{pp_one},schedule=zb-h1,framework=fsdp"), model, cluster) == []
    assert check_strategy(Strategy.parse("dp=1,tp=2,pp=1,schedule=gpipe"), model, cluster) == []  # no split: alike


@pytest.mark.parametrize(
    ("framework", "hardware", "kernel"),
    [
        # Megatron-LM's auto backend leaves Transformer Engine's choice: cuDNN's FusedAttention from sm90 up, else
        # FlashAttention-2 (TransformerEngine v2.18 dot_product_attention/utils.py:1554-1560)
        ("megatron", "dgx-h100", "cudnn"),
        ("megatron", "hgx-h200", "cudnn"),
        ("megatron", "dgx-a100", "flash2"),
        # torchtitan puts cuDNN first in sdpa_kernel's priority (torchtitan v0.2.2 models/attention.py:174-178)
        ("fsdp", "dgx-h100", "cudnn"),
        ("fsdp", "dgx-a100", "cudnn"),
        # Megatron-DeepSpeed's --use-flash-attn-v2: the flash-attn package (transformer.py:607-612)
        ("deepspeed", "dgx-h100", "flash2"),
        ("deepspeed", "dgx-a100", "flash2"),
    ],
)
def test_attention_kernel_rule_picks_the_cited_kernel(framework: str, hardware: str, kernel: str) -> None:
    from plansim.step.prepare import kernel_model

    cluster = load_hardware(hardware, gpus=8)
    s = Strategy.parse(f"dp=8,micro_batch=1,global_batch=8,framework={framework}")
    model = kernel_model(cluster, s)
    assert model.attention_kernel == kernel
    assert kernel in cluster.gpu.attention_kernels
    assert model.provenance.endswith(f"fused attention: {kernel}")


def test_fsdp2_shards_are_the_fp32_master_weights() -> None:
    """FSDP2 (torchtitan) steps AdamW on the fp32 shards themselves (FSDPParam.init_dtype_attrs: the shard keeps the
    model's dtype; MixedPrecisionPolicy's bf16 is the gathered copy's): per parameter 4 bytes of shard, 4 of fp32
    gradient (reduce_dtype float32) and 8 of moments, over dp; plus the bf16 copies gathered at once, here the layer in
    use and the one prefetched (the embedding, 128,256 x 4,096, with block 0, or the output head with the last block).
    DeepSpeed's ZeRO-3 keeps bf16 partitions and an fp32 master in the optimizer: 2 + 12 bytes, gradients in bf16.
    Hand computation from Llama 3 8B's published dimensions (Llama Team 2024, Table 3)."""
    h, layers, vocab, ffn, kv = 4096, 32, 128256, 14336, 1024
    block = h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h  # QKV (grouped K, V), output, SwiGLU, two RMSNorms
    params = 2 * vocab * h + layers * block + h  # input embedding, blocks, final norm, output head (untied)
    held = vocab * h + block + h  # the output head (with the final norm) and the last block, gathered in backward
    dp = 8
    r = plansim.simulate("llama3-8b", "dgx-h100", "dp=8,zero=3,micro_batch=1,global_batch=8,framework=fsdp", gpus=8)
    m = r.memory_breakdown_bytes
    assert m["weights"] == pytest.approx(4 * params / dp + 2 * held, abs=2)
    assert m["gradients"] == pytest.approx(4 * params / dp, abs=2)
    assert m["optimizer"] == pytest.approx(8 * params / dp, abs=2)
    ds = plansim.simulate(
        "llama3-8b", "dgx-h100", "dp=8,zero=3,micro_batch=1,global_batch=8,framework=deepspeed", gpus=8
    )
    assert ds.memory_breakdown_bytes["optimizer"] == pytest.approx(12 * params / dp, abs=2)
    assert ds.memory_breakdown_bytes["gradients"] == pytest.approx(2 * params / dp, abs=2)
    # the optimizer step reads and writes the fp32 shard and moments (3 x 8 bytes) and reads the fp32 gradient: no
    # bf16 copy to write back
    from plansim.step.prepare import kernel_model

    s = Strategy.parse("dp=8,zero=3,micro_batch=1,global_batch=8,framework=fsdp")
    kernels = kernel_model(load_hardware("dgx-h100", gpus=8), s)
    step = kernels.kernel_time("elementwise", 0.0, params / dp * (24 + 4))
    # torchtitan clips by the global norm first (grad_clip): the norm reads the fp32 gradient, the scaling rewrites it
    clip = kernels.kernel_time("elementwise", 0.0, params / dp * 4) + kernels.kernel_time(
        "elementwise", 0.0, params / dp * 8
    )
    assert r.time_breakdown_s["optimizer"] == pytest.approx(step + clip)


def _llama3_8b_units() -> tuple[int, int, int]:
    """Llama 3 8B's FSDP units as torchtitan wraps them (parallelize.py:333-354), from its published dimensions
    (Llama Team 2024, Table 3): (all parameters, one transformer block, the [norm, output] unit)."""
    h, layers, vocab, ffn, kv = 4096, 32, 128256, 14336, 1024
    block = h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h  # QKV (grouped K, V), output, SwiGLU, two RMSNorms
    head = vocab * h + h  # the output projection (untied) with the final norm
    return vocab * h + layers * block + head, block, head


def _compute_stream_peak(tasks: list[Task]) -> tuple[float, float, float]:
    """What the DES's memory tracker sees of the allocations made on one rank's compute stream, replayed in the
    stream's order (each task allocates at its start and frees at its end; the stream runs one task at a time): at the
    point with the most bytes reserved, (bytes, reserved, gradient buffers' bytes). The gathered weights (``g/``,
    allocated by the dp stream's gathers) are left out: what ``step.memory.activation_peak`` walks."""
    live: dict[str, tuple[float, bool]] = {}
    n = res = g = 0.0
    top = (0.0, 0.0, 0.0)
    for t in tasks:
        if t.stream != "compute":
            continue
        for name, size, category in t.alloc:
            live[name] = (size, category == "gradients")
            res += size
            n += 0.0 if name.endswith("#rounding") else size
            g += size if category == "gradients" else 0.0
        if res > top[1]:
            top = (n, res, g)
        for name in t.free:
            for key in (name, f"{name}#rounding"):
                if key in live:
                    size, grad = live.pop(key)
                    res -= size
                    n -= 0.0 if key.endswith("#rounding") else size
                    g -= size if grad else 0.0
    return top


def test_grad_reduce_copy_in_fsdp_holds_each_units_fp32_reduce_scatter_input() -> None:
    """FSDP2's post-backward (foreach_reduce, torchtitan's reduce_dtype float32: parallelize.py:313): a unit's bf16
    unsharded gradients, made by its backward, are copied into one flat fp32 reduce-scatter input of the unit's
    unsharded size and then freed; that input stays until the next unit's post-backward has waited for its
    reduce-scatter, the last unit's until the end of backward. Hand computation for Llama 3 8B on 8 H100s, dp8
    zero3, 2,048 tokens and full recompute, whose peak is at the start of block 31's backward: the [norm, output]
    unit's fp32 input (4 bytes x 525.3M) and block 31's bf16 gradients (2 x 218.1M) beside the fp32 gradient shards
    (4 P / 8), with blocks 31 and 30 gathered in bf16 (31 in use, 30 prefetched) beside the fp32 shards. Both engines
    hold the same gradient buffers over the step's compute stream; the analytic engine's peak adds its gathered
    weights at their most (the head with block 31), so it is above the DES's by less than those. megatron reduces
    in place and deepspeed into a bucket allocated at start-up: neither copies per unit."""
    from plansim.analytic.engine import step_frame
    from plansim.workload import ModelSpec

    params, block, head = _llama3_8b_units()
    spec = load_model("llama3-8b")
    assert isinstance(spec, ModelSpec)
    model = spec.model_copy(update={"seq_len": 2048})
    cluster = load_hardware("dgx-h100", gpus=8)
    s = Strategy.parse("dp=8,zero=3,micro_batch=1,global_batch=8,framework=fsdp,remat=full")
    (tasks,) = [st.tasks for st in lower(model, cluster, s).stages]
    # each unit: its bf16 gradients at its backward's first task, its fp32 input at its copy, freed by the next unit
    made = {name: n for t in tasks for name, n, cat in t.alloc if cat == "gradients"}
    assert made["ug/0/32"] == 2 * head and made["rs_in/0/32"] == 4 * head
    assert made["ug/0/31"] == 2 * block and made["rs_in/0/31"] == 4 * block
    freed_by = {name: t.name for t in tasks for name in t.free}
    assert freed_by["ug/0/32"] == "copyin0.L32"  # once copied into the input
    assert freed_by["rs_in/0/32"].startswith("B0.L31")  # block 31's backward drops the head's input
    assert freed_by["rs_in/0/-1"] == "copyin0.L-1"  # the embedding's, the last, at the end of backward
    a = plansim.simulate(model, cluster, s)
    d = plansim.simulate(model, cluster, s, engine="des")
    assert d.memory_breakdown_bytes["gradients"] == pytest.approx(4 * params / 8 + 4 * head + 2 * block, abs=2)
    assert d.memory_breakdown_bytes["weights"] == pytest.approx(4 * params / 8 + 2 * 2 * block, abs=2)
    # the analytic walk's peak is the head's copy: its bf16 gradients and fp32 input, 6 bytes a parameter
    assert a.memory_breakdown_bytes["gradients"] == pytest.approx(4 * params / 8 + 6 * head, abs=2)
    walk = step_frame(model, cluster, s).held[0].peak
    assert _compute_stream_peak(tasks) == pytest.approx(walk, rel=1e-12)  # the same buffers, alloc by alloc
    # the analytic engine's peak is above the DES's by less than the bf16 weights it holds gathered (head, block 31)
    assert 0 < a.peak_memory_bytes - d.peak_memory_bytes < 2 * (head + block)
    for framework in ("megatron", "deepspeed"):
        other = lower(model, cluster, Strategy.parse(f"dp=8,zero=3,micro_batch=1,global_batch=8,framework={framework}"))
        assert not any(cat == "gradients" for t in other.stages[0].tasks for _, _, cat in t.alloc)


def test_remat_policies_each_framework_runs_its_own_and_the_planner_searches_them() -> None:
    """megatron: --recompute-granularity None, selective (--recompute-modules, core_attn by default) or full, each
    layer's input under uniform with one layer (megatron/training/arguments.py:2010-2017, 2045-2059;
    megatron/core/transformer/transformer_config.py:943-944; transformer_block.py:466-476); deepspeed:
    Megatron-DeepSpeed's --checkpoint-activations checkpoints every layer (megatron/arguments.py:864-872,
    megatron/model/gpt_model.py:446-462) and its selective only the unfused core attention
    (megatron/model/transformer.py:620-629), not the flash-attn path; fsdp: torchtitan's mode none, full or selective,
    selective per op ("op") or every n-th block ("2" by default) (torchtitan/config/job_config.py:651-658;
    torchtitan/distributed/activation_checkpoint.py:27-49, 52-137, 140-156)."""
    rules = {name: load_framework(name).rules.remat_policies.value for name in framework_names()}
    assert rules == {
        "megatron": ("none", "selective", "full"),
        "deepspeed": ("none", "full"),
        "fsdp": ("none", "full", "op_sac", "layer_sac"),
    }
    model, cluster = load_model("gpt3-1.3b"), _cluster(8)
    for name, runs in rules.items():
        searched = [s.remat for s in candidates(model, cluster, 16, Constraints(framework=name, tp=1, pp=1))]
        assert searched[: len(runs)] == list(runs) and set(searched) == set(runs)
    every = [s for s in candidates(model, cluster, 16, Constraints(framework="all", tp=1, pp=1, remat=("selective",)))]
    assert every and {s.framework for s in every} == {"megatron"}
    # Megatron-LM's searched set is the one searched before the rule: the same candidates, in the same order
    named = Constraints(tp=2, remat=("none", "selective", "full"))
    assert list(candidates(model, cluster, 16, Constraints(tp=2))) == list(candidates(model, cluster, 16, named))
    with pytest.raises(PlansimError) as refused:
        Constraints(framework="fsdp", remat=("selective",))
    assert str(refused.value) == (
        "--remat selective: PyTorch FSDP (torchtitan) does not run it (frameworks/fsdp.yaml: remat_policies): use "
        "--framework megatron, or price it as a what-if with plansim compare -s '...,remat=selective'"
    )
    with pytest.raises(PlansimError, match=r"^--remat sqrt: Megatron-LM does not run it .*price it as a what-if"):
        Constraints(remat=("sqrt",))
    data = load_framework("megatron").rules.model_dump()
    for wrong in (["none", "milp"], ["none", "jax"], [], ["full", "full"]):
        with pytest.raises(ValueError, match="name each policy it runs once"):
            FrameworkRules.model_validate({**data, "remat_policies": {**data["remat_policies"], "value": wrong}})


# ---- expert parallelism -----------------------------------------------------------------------------------------


class _WithExperts:
    """A dense model seen as one with ``experts`` experts, as the checks read a mixture-of-experts spec
    (``getattr(model, "experts", 0)``), before the MoE family lands."""

    def __init__(self, model: object, experts: int) -> None:
        self._model, self.experts = model, experts

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)


def _expert_problems(strategy: str, experts: int = 8, gpus: int = 32) -> list[str]:
    model = _WithExperts(load_model("gpt3-1.3b"), experts)
    return check_strategy(Strategy.parse(strategy), model, _cluster(gpus))  # type: ignore[arg-type]


def test_expert_parallel_each_framework_runs_ep_its_etp_default_and_dispatchers() -> None:
    """Megatron-LM: any etp, default the attention's tp (arguments.py:587-588), dispatchers allgather (default),
    alltoall, flex/DeepEP; torchtitan: etp tp or 1, default 1 with ep; DeepSpeed: etp = tp, all-to-all only."""
    rules = {n: load_framework(n).rules.expert_parallel.value for n in framework_names()}
    assert all(r.ep for r in rules.values())
    assert (rules["megatron"].dispatcher, rules["deepspeed"].dispatcher, rules["fsdp"].dispatcher) == (
        "allgather",
        "alltoall",
        "alltoall",
    )
    assert "deepep" in rules["megatron"].dispatchers and "deepep" not in rules["deepspeed"].dispatchers
    expert_tp = {n: Strategy.parse(f"tp=4,dp=8,ep=8,framework={n}").expert_tp for n in rules}
    assert expert_tp == {"megatron": 4, "deepspeed": 4, "fsdp": 1}
    assert {n: Strategy.parse(f"tp=4,dp=8,framework={n}").expert_tp for n in rules} == dict.fromkeys(rules, 4)
    # each default runs under its framework (ep 8 divides the 8 experts; etp x ep divides tp x dp = 32)
    for n in rules:
        seq = ",sequence_parallel=true" if rules[n].needs_sequence_parallel else ""
        assert _expert_problems(f"tp=4,dp=8,ep=8,framework={n}{seq}") == [], n
        assert _expert_problems(f"tp=4,dp=8,ep=2,framework={n}{seq}") == [], n


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        # torchtitan: "Currently we only support ETP=TP or ETP=1" (parallel_dims.py:58-59)
        (
            "tp=4,dp=8,ep=2,etp=2,framework=fsdp",
            "etp=2 with tp=4 ep=2: PyTorch FSDP (torchtitan) (frameworks/fsdp.yaml) runs etp 4 or 1",
        ),
        ("tp=4,dp=8,etp=1,framework=fsdp", "etp=1 with tp=4 ep=1: PyTorch FSDP (torchtitan)"),  # no ep: the tp mesh
        # DeepSpeed: expert groups keep the tensor-parallel ranks whole (groups.py:541-568)
        ("tp=2,dp=16,ep=4,etp=1,framework=deepspeed", "etp=1 with tp=2 ep=4: DeepSpeed (frameworks/deepspeed.yaml)"),
        # DeepSpeed: no expert groups beside Ulysses (groups.py:771-782)
        ("dp=16,cp=2,ep=2,framework=deepspeed", "ep=2 with cp=2: DeepSpeed (frameworks/deepspeed.yaml) runs no"),
        # Megatron-LM: an MoE layer with tp > 1 trains only with sequence parallelism (moe_layer.py:636-640)
        ("tp=2,dp=16,ep=2", "tp=2 on mixture-of-experts model 'gpt3-1.3b' without sequence parallelism: Megatron-LM"),
    ],
)
def test_expert_parallel_where_the_framework_cannot_run_it_is_refused_in_one_line(strategy: str, message: str) -> None:
    (problem,) = _expert_problems(strategy)
    assert problem.startswith(message) and "\n" not in problem


def test_expert_parallel_megatron_runs_any_etp_that_folds_with_context_parallelism() -> None:
    """Megatron-LM's etp is free (etp 1 beside tp 2, etp 4 above tp 2) so long as etp x ep divides tp x cp x dp
    (parallel_state.py:881-884): the expert generator regroups the context-parallel ranks too."""
    sp = ",sequence_parallel=true"
    assert _expert_problems("tp=2,dp=16,ep=8,etp=1" + sp) == []
    assert _expert_problems("tp=2,dp=16,ep=2,etp=4" + sp) == []
    assert _expert_problems("tp=2,cp=2,dp=8,ep=8,etp=1" + sp) == []
    (problem,) = _expert_problems("tp=2,dp=16,ep=8,etp=8" + sp)
    assert problem.startswith("etp*ep = 8*8 = 64 must divide tp*cp*dp = 32")
