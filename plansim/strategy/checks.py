"""A strategy's checks against a model and a cluster: every violation, each message naming the field and the fix.

It sits above the strategy schema, the workloads (a traced model has rules of its own, ``plansim.workload.traced``)
and the hardware, so that none of them needs another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from plansim.costs.collectives import ALLREDUCE_ALGORITHMS
from plansim.hardware import Cluster
from plansim.pipeline.schedules import SCHEDULES
from plansim.strategy.frameworks import (
    RECIPE_ARCHITECTURES,
    framework_names,
    load_framework,
    modelled_zero_stages,
    unmodelled,
)
from plansim.strategy.mesh import GRAD_AXES, REPLICA_AXES, degrees_of, expert_fold, mesh_of, ranks_of
from plansim.strategy.schema import Strategy
from plansim.strategy.traced import traced_problems
from plansim.workload.families import axis_problems, family_of
from plansim.workload.spec import ModelSpec
from plansim.workload.torch_trace import TracedModel
from plansim.workload.traced import Workload
from plansim.workload.transformer import heads_swap_problems

__all__ = ["check_strategy", "expert_problems", "fp8_problems"]


def check_strategy(strategy: Strategy, model: Workload, cluster: Cluster) -> list[str]:
    """Every way ``strategy`` cannot run ``model`` on ``cluster``; empty when it can. Each message names the fix.
    A traced model (``plansim.workload.traced``) also needs tp=1, its traced batch as micro-batch and its dtype.
    ``strategy`` as written or resolved (``Strategy.resolved``)."""
    s = strategy.resolved(cluster)
    dp = s.dp or 1
    problems: list[str] = []
    if s.num_gpus != cluster.num_gpus:
        axes, degrees = ("dp", *REPLICA_AXES), degrees_of(s)
        problems.append(
            f"{'*'.join(axes)} = {'*'.join(str(degrees[axis]) for axis in axes)} = {s.num_gpus} "
            f"but --gpus is {cluster.num_gpus}: make them equal"
        )
    problems += _check_model_split(s, model)
    problems += _check_batch(s, dp)
    problems += _check_framework(strategy, s)
    grads = mesh_of(s).size(GRAD_AXES["dp"])  # the gradients' group: dp x cp
    if ALLREDUCE_ALGORITHMS[s.dp_algorithm].power_of_two and grads & (grads - 1):
        what = f"dp={dp}" if grads == dp else f"dp*cp={grads}"
        problems.append(
            f"dp_algorithm={s.dp_algorithm} needs a power-of-two gradient group, got {what}: use dp_algorithm=ring"
        )
    problems += _check_context_parallel(s)
    if s.tp > cluster.gpus_per_node:
        problems.append(
            f"tp={s.tp} spans more than one node ({cluster.gpus_per_node} GPUs): use tp <= {cluster.gpus_per_node}"
        )
    if s.fp8:
        problems += fp8_problems(s, model, cluster)
    elif not cluster.gpu.supports(s.compute_dtype):
        problems.append(f"dtype={s.dtype}: {cluster.gpu.name} does not support it: use dtype=fp16 or fp32")
    if s.offload:
        problems += _offload_problems(s, model, cluster)
    problems += expert_problems(s, model)
    return problems


def expert_problems(s: Strategy, model: Workload) -> list[str]:
    """What keeps ``ep`` and ``etp`` from running: either on a model without experts (its spec's ``experts``, 0 or
    absent: Megatron-LM refuses expert parallelism without --num-experts, arguments.py:1655-1656 at d98e8a64); ep
    not dividing the experts (arguments.py:1657-1658; DeepSpeed, deepspeed/moe/layer.py:59); a framework that runs no
    ep, or not this etp, or not beside context parallelism (its ``expert_parallel`` rule); etp x ep not dividing
    the ranks it regroups (Megatron-LM's check that world_size divides etp x ep x pp, parallel_state.py:881-884;
    torchtitan's efsdp, parallel_dims.py:138); tensor parallelism without sequence parallelism where the framework's
    MoE layer refuses it (Megatron-LM, moe_layer.py:636-640)."""
    experts = getattr(model, "experts", 0) or 0
    if not experts:
        given = [f"ep={s.ep}"] if s.ep > 1 else []
        if s.etp is not None and s.etp != s.tp:
            given.append(f"etp={s.etp}")
        if given:
            return [
                f"{' and '.join(given)} on model '{model.name}', which has no experts: leave "
                f"{' and '.join(g.split('=')[0] for g in given)} out (they split a mixture-of-experts model's experts)"
            ]
        return []
    profile = load_framework(s.framework)
    rule = profile.rules.expert_parallel.value
    where = f"{profile.title} (frameworks/{s.framework}.yaml)"
    problems = []
    if s.ep > 1 and not rule.ep:
        fix = _others(s, lambda n: load_framework(n).rules.expert_parallel.value.ep)
        return [f"ep={s.ep} with framework={s.framework}: {where} runs no expert parallelism: use ep=1{fix}"]
    if experts % s.ep:
        fits = [d for d in range(1, experts + 1) if experts % d == 0]
        problems.append(
            f"ep={s.ep} must divide the model's {experts} experts: use ep in {', '.join(map(str, fits[-6:]))}"
        )
    etp, allowed = s.expert_tp, rule.etp_values(s.tp, s.ep)
    if allowed is not None and etp not in allowed:
        problems.append(
            f"etp={etp} with tp={s.tp} ep={s.ep}: {where} runs etp {' or '.join(map(str, allowed))} there: "
            f"use etp={allowed[0]} (or leave etp out)"
        )
    if s.ep > 1 and s.cp > 1 and not rule.with_cp:
        problems.append(f"ep={s.ep} with cp={s.cp}: {where} runs no expert parallelism beside context "
                        "parallelism: use cp=1 or ep=1")  # fmt: skip
    folded, width = expert_fold(s)
    if folded % width:
        ranks = "tp*cp*dp_shard" if s.hybrid_shard else "tp*cp*dp"
        problems.append(
            f"etp*ep = {etp}*{s.ep} = {width} must divide {ranks} = {folded}, the ranks the expert layers regroup "
            "(Megatron-LM's expert rank generator): change ep or etp"
        )
    if rule.needs_sequence_parallel and s.tp > 1 and not s.sequence_parallel:
        problems.append(
            f"tp={s.tp} on mixture-of-experts model '{model.name}' without sequence parallelism: {where} does not "
            "train an MoE layer so: set sequence_parallel=true"
        )
    return problems


def _offload_problems(s: Strategy, model: Workload, cluster: Cluster) -> list[str]:
    """What is wrong with ``offload``: a node without host data, a combination or ZeRO stage the framework does not
    offload (its ``offload`` rule), and Megatron-LM's limits on activation offloading (a layer count below the
    model's blocks; no pipelining, no recomputation where the framework says so)."""
    offload = "/".join(s.offload)
    if cluster.node.host is None:
        return [
            f"offload={offload} on {cluster.node.name}: its node profile describes no host memory or host link "
            "(hardware_profiles/nodes, host:): leave offload out or use a node with a host section (dgx-h100)"
        ]
    profile = load_framework(s.framework)
    rule = profile.rules.offload.value
    stages = rule.zero_stages(s.offload)
    if not stages:
        runs = " or ".join("/".join(f.kinds) for f in rule.forms) or "nothing"
        return [
            f"offload={offload} with framework={s.framework}: {profile.title} offloads {runs} "
            f"(frameworks/{s.framework}.yaml): use offload={runs.split(' or ')[0]}"
            if rule.forms
            else f"offload={offload} with framework={s.framework}: {profile.title} offloads nothing "
            f"(frameworks/{s.framework}.yaml): leave offload out"
        ]
    problems = []
    if s.zero not in stages:
        problems.append(
            f"offload={offload} with zero={s.zero}: {profile.title} offloads it under ZeRO {_stages(stages)} "
            f"(frameworks/{s.framework}.yaml): use zero={max(stages)}"
        )
    if "activations" in s.offload:
        n, blocks = s.offload_activation_layers, model.layers
        if n is None or not 0 < n < blocks:
            problems.append(
                f"offload_activation_layers={n} with offload=activations: give the blocks to offload, 1 to "
                f"{blocks - 1} (fewer than the model's {blocks}; Megatron-LM's --cpu-offloading-num-layers)"
            )
        if s.pp > 1 and not rule.activations_with_pipeline:
            problems.append(
                f"offload=activations with pp={s.pp}: {profile.title} does not offload activations with pipelining "
                f"(frameworks/{s.framework}.yaml): use pp=1 or drop activations from offload"
            )
        if s.remat != "none" and not rule.activations_with_remat:
            problems.append(
                f"offload=activations with remat={s.remat}: {profile.title} does not offload activations beside "
                f"recomputation (frameworks/{s.framework}.yaml): use remat=none or drop activations from offload"
            )
    return problems


def fp8_problems(s: Strategy, model: Workload, cluster: Cluster) -> list[str]:
    """What keeps ``dtype=fp8`` from running: a framework that trains in no FP8, a GPU without FP8 tensor cores (no
    ``fp8`` peak in its profile) or whose architecture does not run the recipe (``RECIPE_ARCHITECTURES``: Transformer
    Engine's checks), an AMD GPU (its FP8 stack is not modelled), a recipe or an FP8 parameter gather the framework
    does not run, a traced model (its layers are not the blocks' linear layers plansim prices in FP8)."""
    profile = load_framework(s.framework)
    fp8 = profile.rules.fp8.value
    gpu = cluster.gpu
    if not fp8.recipes:
        fix = _others(s, lambda n: bool(load_framework(n).rules.fp8.value.recipes))
        return [f"dtype=fp8 with framework={s.framework}: {profile.title} trains in no FP8 (frameworks/"
                f"{s.framework}.yaml): use dtype=bf16{fix}"]  # fmt: skip
    if not gpu.supports("fp8"):
        return [f"dtype=fp8: {gpu.name} has no FP8 tensor cores: use dtype=bf16 or an FP8 GPU (H100, H200, B200)"]
    if gpu.vendor != "nvidia":
        return [f"dtype=fp8 on {gpu.name}: plansim models FP8 training on NVIDIA GPUs (Transformer Engine, torchao) "
                "only: use dtype=bf16"]  # fmt: skip
    if isinstance(model, TracedModel) or not family_of(model).transformer:
        return [f"dtype=fp8 with model '{model.name}': plansim prices FP8 for the linear layers of the transformer "
                "blocks it builds (gpt, llama families): use dtype=bf16"]  # fmt: skip
    if gpu.efficiency.matmul_fp8 is None:
        return [f"dtype=fp8: {gpu.name}'s profile has no efficiency.matmul_fp8 curve: add one "
                "(docs/hardware-profiles.md) or use dtype=bf16"]  # fmt: skip
    recipe = s.fp8_recipe or fp8.default
    problems: list[str] = []
    if recipe not in fp8.recipes:
        problems.append(
            f"fp8_recipe={recipe} with framework={s.framework}: {profile.title} runs {', '.join(fp8.recipes)} "
            f"(frameworks/{s.framework}.yaml): use fp8_recipe={fp8.default}"
        )
    elif gpu.architecture not in RECIPE_ARCHITECTURES[str(recipe)]:
        runs = [r for r in fp8.recipes if gpu.architecture in RECIPE_ARCHITECTURES[r]]
        fix = f"use fp8_recipe={runs[0]}" if runs else "use dtype=bf16"
        problems.append(
            f"fp8_recipe={recipe} on {gpu.name} ({gpu.architecture}): Transformer Engine runs it on "
            f"{', '.join(RECIPE_ARCHITECTURES[str(recipe)])} GPUs: {fix}"
        )
    if s.tp_comm_overlap:  # its chunked GEMMs (step.layers) are priced at the model's dtype, without FP8's casts
        problems.append("tp_comm_overlap=true with dtype=fp8: plansim does not model Transformer Engine's FP8 "
                        "userbuffers overlap yet: leave tp_comm_overlap out or use dtype=bf16")  # fmt: skip
    if s.fp8_param_gather and s.zero == 0:
        problems.append("fp8_param_gather=true with zero=0: FP8 parameter all-gather needs sharded weights or a "
                        "distributed optimizer: set zero=1 or higher, or leave fp8_param_gather out")  # fmt: skip
    elif s.fp8_param_gather and recipe not in fp8.param_gather:
        can = ", ".join(fp8.param_gather) or "no recipe"
        problems.append(
            f"fp8_param_gather=true with fp8_recipe={recipe}: {profile.title} gathers parameters in FP8 under {can} "
            f"(frameworks/{s.framework}.yaml): leave fp8_param_gather out"
        )
    return problems


def _stages(stages: Sequence[int]) -> str:
    return ", ".join(str(z) for z in stages)


def _others(s: Strategy, allows: Callable[[str], bool]) -> str:
    """ ", or framework=X" for the other frameworks ``allows`` (a name's test: it runs, and plansim models, what
    ``s``'s framework does not); empty where none does."""
    names = [n for n in framework_names() if n != s.framework and allows(n)]
    return f", or framework={' or '.join(names)}" if names else ""


def _check_framework(given: Strategy, s: Strategy) -> list[str]:
    """What ``s``'s framework cannot run (its profile's rules, each naming the framework), and what plansim does not
    model of what it can. ``given``: the strategy as written (before ``resolve`` filled the framework's defaults)."""
    profile = load_framework(s.framework)
    rules, title = profile.rules, profile.title
    problems: list[str] = []
    if s.layer_split is not None and s.pp > 1 and not rules.layer_split.value:
        problems.append(
            f"layer_split with framework={s.framework}: {title} places the blocks over the stages by its own partition "
            f"(frameworks/{s.framework}.yaml: layer_split): leave layer_split out"
            + _others(s, lambda n: load_framework(n).rules.layer_split.value)
        )
    if s.zero not in rules.zero_stages.value:
        problems.append(
            f"zero={s.zero} with framework={s.framework}: {title} runs ZeRO {_stages(rules.zero_stages.value)} "
            f"(frameworks/{s.framework}.yaml): use zero={rules.zero_stages.value[-1]}"
            + _others(s, lambda n: s.zero in modelled_zero_stages(n, s.pp))
        )
    elif s.pp > 1 and s.zero not in rules.zero_with_pipeline.value:
        problems.append(
            f"zero={s.zero} with pp={s.pp}: {title} runs only ZeRO {_stages(rules.zero_with_pipeline.value)} with "
            f"pipeline parallelism (frameworks/{s.framework}.yaml): use zero={max(rules.zero_with_pipeline.value)} "
            "or pp=1" + _others(s, lambda n: s.zero in modelled_zero_stages(n, s.pp))
        )
    elif (why := unmodelled(s.framework, s.zero, s.pp)) is not None:
        fix = f"use zero={max(modelled_zero_stages(s.framework, s.pp))}"
        if s.pp > 1 and max(modelled_zero_stages(s.framework, s.pp)) < s.zero:
            fix = "use pp=1"
        problems.append(
            f"zero={s.zero} with pp={s.pp} and framework={s.framework}: {title} runs it "
            f"(frameworks/{s.framework}.yaml), but {why}: {fix}"
            + _others(s, lambda n: s.zero in modelled_zero_stages(n, s.pp))
        )
    if given.overlap_param_gather:
        problems += _param_gather_problems(s, rules.param_gather_overlap.value, title)
    # a schedule that splits the backward changes the step even without pipelining (its W passes apart from B)
    pipelined = s.pp > 1 or SCHEDULES[s.schedule].split_backward
    if pipelined and s.schedule not in rules.schedules.value:
        problems.append(
            f"schedule={s.schedule} with framework={s.framework}: {title} runs "
            + (
                f"the {' and '.join(rules.schedules.value)} schedules"
                if len(rules.schedules.value) > 1
                else f"only the {rules.schedules.value[0]} schedule"
            )
            + f" (frameworks/{s.framework}.yaml): use schedule={rules.schedules.value[0]}"
            + _others(s, lambda n: s.schedule in load_framework(n).rules.schedules.value)
        )
    if s.tp_comm_overlap:
        problems += _tp_comm_overlap_problems(s, title)
    if s.dp_shard is not None:
        problems += _hybrid_shard_problems(s, rules.hybrid_shard.value, title)
    if given.overlap_grad_reduce and s.pp > 1 and not rules.grad_reduce_overlap_with_pipeline.value:
        problems.append(
            f"overlap_grad_reduce=true with pp={s.pp}: {title} does not overlap the gradient reduction with "
            f"pipelining (frameworks/{s.framework}.yaml): leave overlap_grad_reduce out or use pp=1"
            + _others(s, lambda n: load_framework(n).rules.grad_reduce_overlap_with_pipeline.value)
        )
    return problems


def _tp_comm_overlap_problems(s: Strategy, title: str) -> list[str]:
    """What is wrong with ``tp_comm_overlap=true``: a framework that does not pipeline GEMMs with their
    tensor-parallel collectives, no tensor parallelism, or (Megatron-LM) no sequence parallelism."""
    pipelined = load_framework(s.framework).rules.tp_comm_overlap.value
    if pipelined is None:
        return [
            f"tp_comm_overlap=true with framework={s.framework}: {title} does not pipeline GEMMs with their "
            f"tensor-parallel collectives (frameworks/{s.framework}.yaml): leave tp_comm_overlap out"
            + _others(s, lambda n: load_framework(n).rules.tp_comm_overlap.value is not None)
        ]
    if s.tp == 1:
        return ["tp_comm_overlap=true with tp=1: there is no tensor-parallel communication to overlap: use tp>1"]
    if pipelined.needs_sequence_parallel and not s.sequence_parallel:
        return [
            f"tp_comm_overlap=true without sequence parallelism: {title} overlaps them only with it "
            f"(frameworks/{s.framework}.yaml): set sequence_parallel=true"
        ]
    return []


def _hybrid_shard_problems(s: Strategy, stages: Sequence[int], title: str) -> list[str]:
    """What is wrong with ``dp_shard``: a framework that does not hybrid-shard this ZeRO stage (its ``hybrid_shard``
    rule), a shard group that does not divide dp, or one rank that shards nothing."""
    dp, shard = s.dp or 1, s.dp_shard
    if s.zero not in stages:
        if not stages:
            return [
                f"dp_shard={shard} with framework={s.framework}: {title} does not shard over part of the "
                f"data-parallel group (frameworks/{s.framework}.yaml): leave dp_shard out"
                + _others(s, lambda n: s.zero in load_framework(n).rules.hybrid_shard.value)
            ]
        return [
            f"dp_shard={shard} with zero={s.zero}: {title} hybrid-shards ZeRO {_stages(stages)} only "
            f"(frameworks/{s.framework}.yaml): use zero={max(stages)} or leave dp_shard out"
        ]
    assert shard is not None, "called for a dp_shard given"
    if shard > dp or dp % shard:
        how = "exceeds" if shard > dp else "does not divide"
        return [
            f"dp_shard={shard} {how} dp={dp}: use a divisor of dp (a node's data-parallel ranks shard within a node)"
        ]
    if shard == 1:
        return ["dp_shard=1 shards nothing: use zero=0 for plain replicas, or dp_shard > 1"]
    return []


def _param_gather_problems(s: Strategy, runs: bool, title: str) -> list[str]:
    """What is wrong with ``overlap_param_gather=true`` as written: a framework that gathers after the optimizer
    step, a ZeRO stage without that gather, or (Megatron-LM's ``validate_args``, ``arguments.py:625-631``) no
    overlapped gradient reduction."""
    if not runs:
        return [
            f"overlap_param_gather=true with framework={s.framework}: {title} all-gathers the parameters after the "
            f"optimizer step (frameworks/{s.framework}.yaml): leave overlap_param_gather out"
            + _others(s, lambda n: load_framework(n).rules.param_gather_overlap.value)
        ]
    if s.zero not in (1, 2):
        return [
            f"overlap_param_gather=true with zero={s.zero}: only ZeRO-1/2 gather the weights after the step: use zero=1"
        ]
    if not s.overlap_grad_reduce:
        return [
            "overlap_param_gather=true needs the gradient reduction overlapped too (Megatron-LM's "
            "--overlap-param-gather requires --overlap-grad-reduce): leave overlap_grad_reduce=false out"
        ]
    return []


def _check_context_parallel(s: Strategy) -> list[str]:
    """What the framework runs of context parallelism (its ``context_parallel`` rule)."""
    if s.cp == 1 and s.cp_algorithm is None:
        return []
    rule = load_framework(s.framework).rules.context_parallel.value
    title = load_framework(s.framework).title
    if s.cp > 1 and not rule.algorithms:
        return [f"cp={s.cp} with framework={s.framework}: plansim models no context parallelism of {title}: use cp=1"]
    if s.cp_algorithm is not None and s.cp_algorithm not in rule.algorithms:
        runs = ", ".join(rule.algorithms) or "none"
        return [
            f"cp_algorithm={s.cp_algorithm} with framework={s.framework}: {title} runs {runs} "
            f"(frameworks/{s.framework}.yaml): use cp_algorithm={rule.algorithms[0] if rule.algorithms else 'ring'}"
            + _others(s, lambda n: s.cp_algorithm in load_framework(n).rules.context_parallel.value.algorithms)
        ]
    if s.cp > 1 and s.sequence_parallel and not rule.with_sequence_parallel:
        return [
            f"cp={s.cp} with sequence_parallel=true: {title}'s context parallelism cannot be combined with "
            f"Megatron-LM's sequence parallelism (frameworks/{s.framework}.yaml): set sequence_parallel=false"
        ]
    return []


def _check_model_split(s: Strategy, model: Workload) -> list[str]:
    problems = traced_problems(s, model) if isinstance(model, TracedModel) else _check_family(s, model)
    chunks = s.pp * s.virtual_stages
    chunked = SCHEDULES[s.schedule].model_chunks
    if s.layer_split is not None:
        problems += _split_problems(s.layer_split, s.pp, s.virtual_stages, model.layers)
    if model.layers < chunks and s.layer_split is None:
        problems.append(f"pp*virtual_stages={chunks} exceeds layers={model.layers}: use fewer pipeline stages")
    elif chunked and model.layers % chunks and s.layer_split is None:
        # Megatron-LM's even split asserts it (megatron/core/transformer/transformer_block.py:157, 174-177 at
        # core_v0.15.0); an explicit split is its --pipeline-model-parallel-layout, counted chunk by chunk
        # (transformer_block.py:90-93, pipeline_parallel_layer_layout.py:136-152), which needs none
        problems.append(
            f"schedule={s.schedule} needs layers={model.layers} divisible by pp*virtual_stages={chunks}: "
            "change pp or virtual_stages, or give a layer_split"
        )
    if chunked and s.pp == 1:
        problems.append(f"schedule={s.schedule} needs pp > 1: use schedule=1f1b")
    if chunked and s.virtual_stages < 2:
        problems.append(
            f"schedule={s.schedule} needs virtual_stages >= 2 (model chunks per stage): "
            "set virtual_stages=2 or use schedule=1f1b"
        )
    return problems


def _split_problems(split: Sequence[int], pp: int, v: int, layers: int) -> list[str]:
    """What is wrong with ``layer_split`` (``plansim.pipeline.stages.chunk_blocks`` reads it): blocks per stage
    (``pp`` entries, each at least one), or with ``v > 1`` model chunks per stage either blocks per chunk in model
    order (``pp * v`` entries, Megatron-LM's ``--pipeline-model-parallel-layout``), each at least one but the first
    and the last, which hold the embedding and the output layer and may hold no block (the layout allows empty
    stages, ``docs/source/api-guide/pipeline_parallel_layout.md:26`` at core_v0.15.0; Llama 3 405B's first chunk
    held only the embedding and its last only the output layer, Dubey et al. 2024, sec 3.3.2), or blocks per stage,
    each spread evenly over its chunks (a multiple of v, as Megatron-LM's ``--decoder-first/last-pipeline-num-layers``
    with virtual stages); all of them summing to the model's layers."""
    shown_split = list(split)
    if v == 1:
        if len(split) != pp or min(split) < 1 or sum(split) != layers:
            return [f"layer_split={shown_split}: needs pp={pp} entries of at least 1 block summing to layers={layers}"]
        return []
    if len(split) not in (pp, pp * v):
        return [
            f"layer_split={shown_split}: needs pp*virtual_stages={pp * v} entries, the blocks of each model chunk in "
            f"model order (chunk c runs on stage c % pp), or pp={pp} entries, each stage's blocks (a multiple of "
            f"virtual_stages={v}), summing to layers={layers}"
        ]
    if len(split) == pp:
        if any(n % v for n in split):
            return [
                f"layer_split={shown_split}: a stage's blocks spread evenly over its virtual_stages={v} chunks: give "
                f"multiples of {v}, or pp*virtual_stages={pp * v} entries, one per model chunk in model order"
            ]
        if min(split) < v or sum(split) != layers:
            return [
                f"layer_split={shown_split}: needs an entry per stage of at least {v} blocks (1 a chunk), summing to "
                f"layers={layers}"
            ]
        return []
    if min(split[1:-1], default=1) < 1 or sum(split) != layers:
        return [
            f"layer_split={shown_split}: needs an entry per model chunk (in model order) of at least 1 block (0 for "
            f"the first and the last, which hold the embedding and the output layer), summing to layers={layers}"
        ]
    return []


def _check_family(s: Strategy, model: ModelSpec) -> list[str]:
    """What a model family allows of each parallel axis (its entry's rules, ``plansim.workload.families``)."""
    problems = [p for axis, degree in degrees_of(s).items() for p in axis_problems(model, axis, degree)]
    if s.cp > 1 and s.cp_algorithm == "all_to_all" and family_of(model).transformer:
        problems += heads_swap_problems(model, ranks_of(s, only=("tp", "cp")))
    if s.tp_comm_overlap and not family_of(model).transformer:
        # Megatron-LM gives Transformer Engine userbuffers only for its blocks' qkv, proj, fc1 and fc2 GEMMs
        # (megatron/core/extensions/transformer_engine.py:302-312 at core_v0.15.0)
        problems.append(
            f"tp_comm_overlap=true with a {model.family} model: Megatron-LM overlaps only transformer blocks' GEMMs: "
            "leave tp_comm_overlap out"
        )
    return problems


def _check_batch(s: Strategy, dp: int) -> list[str]:
    if s.global_batch is None:  # one micro-batch per step (Strategy.num_microbatches)
        if SCHEDULES[s.schedule].model_chunks and s.pp > 1:
            return [
                f"schedule={s.schedule} needs the micro-batch count (1 without global_batch) to be a multiple of "
                f"pp={s.pp} (Megatron-LM): set global_batch={s.micro_batch * ranks_of(s, only=('dp', 'pp'))}"
            ]
        return []
    per_step = s.micro_batch * dp
    if s.global_batch % per_step:
        return [
            f"global_batch={s.global_batch} is not a multiple of micro_batch*dp={per_step}: "
            f"use global_batch={max(per_step, s.global_batch // per_step * per_step)}"
        ]
    m = s.global_batch // per_step
    if SCHEDULES[s.schedule].model_chunks and m % s.pp:
        return [
            f"schedule={s.schedule} needs the micro-batch count {m} to be a multiple of pp={s.pp} "
            "(Megatron-LM): change global_batch"
        ]
    return []
