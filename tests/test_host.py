"""Host-bound steps: eager PyTorch launches each kernel from the host (the framework's ``kernel_launch`` rule), so a
run of kernels takes at least its launches' host time, and a tiny model's step is priced at that launch floor."""

from __future__ import annotations

import pytest

import plansim
from plansim.hardware import load_hardware
from plansim.step.layers import layer_programs
from plansim.step.prepare import build_step, kernel_model
from plansim.strategy.frameworks import framework_names, load_framework
from plansim.strategy.mesh import mesh_of
from plansim.strategy.schema import Strategy
from plansim.workload import ModelSpec, load_model

#: the host's time per kernel of every framework plansim knows: eager PyTorch's submit time of one op on the CUDA
#: path, 8 us on an A100 host (flagos-ai/Torch-FL PR #27); each framework's rule cites why it runs eager
HOST_S = 8e-6

#: A GPT block's ops as the builder lays them out, each one kernel in forward (layer norm, QKV GEMM, fused attention,
#: output GEMM, dropout, residual add, layer norm, two MLP GEMMs with GeLU between, dropout, residual add), and in
#: backward two per GEMM (input and weight gradients) and one for the rest: counted by hand.
BLOCK_FWD, BLOCK_BWD = 12, 12 + 4


def _tiny() -> ModelSpec:
    """A model so small that every kernel is shorter on the GPU than its launch on the host."""
    return ModelSpec(name="tiny", family="gpt", layers=2, hidden=64, heads=2, seq_len=16, vocab=128)


@pytest.mark.parametrize("framework", ["megatron", "fsdp", "deepspeed"])
def test_every_framework_launches_eagerly_at_the_cited_host_time(framework: str) -> None:
    """Megatron-LM: --cuda-graph-impl none by default (arguments.py:1405); torchtitan: compile off
    (job_config.py:721-722); DeepSpeed: compiles only on engine.compile() (engine.py:5620). Each at eager PyTorch's
    host time per kernel."""
    rule = load_framework(framework).rules.kernel_launch
    assert rule.value.mode == "eager" and rule.value.host_s == HOST_S
    assert "8 us" in rule.source and "Torch-FL PR #27" in rule.source
    assert kernel_model(load_hardware("dgx-a100", gpus=1), Strategy.parse(f"framework={framework}")).host_s == HOST_S


def test_a_tiny_model_is_priced_at_the_launch_floor() -> None:
    """One GPU, no collective: each layer's forward and backward is one run of kernels, every one of them quicker on
    the GPU than its launch, so each pass takes exactly its kernel count times the host's time per kernel, and the
    breakdown says the GPU waited. Counted by hand: the embedding's lookup, learned positions and dropout (one
    backward kernel each); the blocks (``BLOCK_FWD``, ``BLOCK_BWD``); the output layer's norm, logits GEMM and loss
    (the GEMM two in backward)."""
    model, cluster = _tiny(), load_hardware("dgx-a100", gpus=1)
    s = "dp=1,micro_batch=1,global_batch=4"
    launches = {-1: (3, 3), 0: (BLOCK_FWD, BLOCK_BWD), 1: (BLOCK_FWD, BLOCK_BWD), 2: (3, 4)}
    prep = build_step(model, cluster, Strategy.parse(s).resolve(cluster))
    programs = layer_programs(prep.graph, prep.kernels, mesh_of(prep.strategy))
    assert set(programs) == set(launches)
    for layer, (fwd, bwd) in launches.items():
        lp = programs[layer]
        assert [seg.seconds for seg in lp.fwd] == pytest.approx([fwd * HOST_S])
        assert [seg.seconds for seg in lp.bwd] == pytest.approx([bwd * HOST_S])
        assert all(0 < seg.host_wait_s < seg.seconds for seg in lp.fwd + lp.bwd)
    floor = sum(f + b for f, b in launches.values()) * HOST_S
    for engine in ("analytic", "des"):
        r = plansim.simulate(model, cluster, s, engine=engine)
        t = r.time_breakdown_s
        assert t["compute"] + t["host_wait"] == pytest.approx(r.num_microbatches * floor)
        assert t["host_wait"] > 0.5 * (t["compute"] + t["host_wait"])  # mostly waiting for the host


def test_a_large_model_is_not_host_bound() -> None:
    """GPT-3 175B's kernels (tp8, 2048 tokens) run far longer than their launches: the host never holds the GPU."""
    r = plansim.simulate("gpt3-175b", "dgx-a100", "tp=8,pp=8,dp=1,micro_batch=1,global_batch=16", gpus=64)
    assert r.time_breakdown_s["host_wait"] < 1e-3 * r.step_time_s


def test_a_run_takes_the_longer_of_its_kernels_and_their_launches() -> None:
    """Every run of kernels takes at least its GPU time and at least its launches' host time, and a slower host
    never makes it shorter (monotone), on a small model where some runs are host-bound and some are not."""
    cluster = load_hardware("dgx-a100", gpus=2)
    s = Strategy.parse("tp=2,sequence_parallel=true,micro_batch=1,global_batch=1").resolve(cluster)
    prep = build_step(load_model("gpt3-125m"), cluster, s)
    mesh = mesh_of(prep.strategy)
    runs = {}
    for host in (0.0, 4e-6, HOST_S, 16e-6):
        prep.kernels.host_s = host
        prep.kernels._memo.clear()
        runs[host] = [
            (seg.seconds, seg.host_wait_s)
            for lp in layer_programs(prep.graph, prep.kernels, mesh).values()
            for seg in lp.fwd + lp.bwd
            if seg.comm is None
        ]
    gpu = [seconds for seconds, _ in runs[0.0]]
    assert all(wait == 0.0 for _, wait in runs[0.0])
    for host in (4e-6, HOST_S, 16e-6):
        assert all(sec == pytest.approx(g + wait) and sec >= g for (sec, wait), g in zip(runs[host], gpu, strict=True))
    assert any(wait > 0 for _, wait in runs[16e-6]) and any(wait == 0 for _, wait in runs[16e-6])
    for slower, faster in ((16e-6, HOST_S), (HOST_S, 4e-6), (4e-6, 0.0)):
        assert all(a[0] >= b[0] for a, b in zip(runs[slower], runs[faster], strict=True))


def test_the_optimizer_step_clips_by_the_global_norm_where_the_framework_does() -> None:
    """Megatron-LM (--clip-grad 1.0), torchtitan (max_norm 1.0) and DeepSpeed (gradient_clipping 1.0) clip by
    default: the step reads the gradients once for the norm and reads and writes them once to scale them, each a
    memory-bound pass; then fused Adam."""
    for name in framework_names():
        assert load_framework(name).rules.grad_clip.value is True
    from plansim.step.optimizer import optimizer_step_s

    cluster = load_hardware("dgx-a100", gpus=8)
    s = Strategy.parse("dp=8,zero=1,framework=megatron,micro_batch=1,global_batch=8").resolve(cluster)
    kernels = kernel_model(cluster, s)
    params = 1.3e9
    local = params / 8
    grad = s.grad_bytes
    adam = kernels.kernel_time("elementwise", 0.0, local * (26 + grad))
    clip = kernels.kernel_time("elementwise", 0.0, local * grad) + kernels.kernel_time(
        "elementwise", 0.0, local * 2 * grad
    )
    assert optimizer_step_s(kernels, s, params) == pytest.approx(adam + clip)


def test_the_planner_names_a_difference_in_how_kernels_are_launched(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rule_differences`` (what ``plan --framework all`` explains) names the kernel launch and the clipping where
    two frameworks differ in them, and nothing where they agree (today all three launch eagerly and clip)."""
    from plansim.strategy import frameworks

    assert not any("launched" in w or "clip" in w for w in frameworks.rule_differences("megatron", "fsdp"))
    real = frameworks.load_framework

    def faster_host(name: str) -> frameworks.FrameworkProfile:
        profile = real(name)
        if name != "fsdp":
            return profile
        rules = profile.rules.model_copy(
            update={
                "kernel_launch": profile.rules.kernel_launch.model_copy(
                    update={"value": frameworks.KernelLaunch(mode="eager", host_s=4e-6)}
                ),
                "grad_clip": profile.rules.grad_clip.model_copy(update={"value": False}),
            }
        )
        return profile.model_copy(update={"rules": rules})

    monkeypatch.setattr(frameworks, "load_framework", faster_host)
    words = frameworks.rule_differences("megatron", "fsdp")
    assert "kernels launched eager, 4 us of host time each, not eager, 8 us of host time each" in words
    assert "no gradient clipping" in words
