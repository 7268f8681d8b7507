"""Simulating a traced module (``plansim.workload.traced``) against the builder's ``ModelSpec`` path and closed forms.

Three references:

1. The builder's own graph wrapped as a ``TracedModel``: both engines must give exactly the ``ModelSpec``'s result
   (the adapter adds nothing and drops nothing: stage split, remat, tied embeddings, data and pipeline traffic).
2. The validator's GPT and Llama (``plansim.profiling.torch_models``) traced and simulated against their ``ModelSpec``:
   communication bytes, model states and model FLOPs equal. What the trace saves for backward exceeds the builder's
   count by under 2 % (what that count leaves out: LayerNorm's fp32 mean and 1/std and RMSNorm's fp32 1/rms, the
   int64 position ids, and, charged to the first block, the causal mask and rotary tables that every block shares),
   and the simulated activations by at most that excess per micro-batch in flight plus one rebuilt working set
   (measured: at most +1.9 %, Llama, pp=2, selective recompute, where the stored activations are smallest); peak
   memory within 1 % (measured: at most +0.02 %). Step time on a GPU whose only cost is matmul FLOPs at one rate
   (memory-bound kernels, launches and the optimizer free): equal to float precision. On the H100 profile the traced
   step is slower, by exactly the kernels the eager module runs and the builder fuses (measured, dp=2: +26 % GPT,
   +67 % Llama; pp=2: +25 %, +63 %): the attention scale and mask as kernels of their own, the copies that make Q,
   K and V contiguous, RMSNorm as eight point-wise kernels, rotary as ten, SwiGLU's gate and up projections as two
   GEMMs; every one of those kernels is launch- and ramp-bound at hidden 256.
3. An ``nn.Sequential`` MLP: FLOPs (Narayanan et al. 2021 sec 5.1, 3 x forward GEMM FLOPs), ring all-reduce volume
   (Patarasuk & Yuan 2009: 2(p-1)/p of the gradient bytes), model states (ZeRO paper sec 3.1: 2 + 2 + 12 bytes per
   parameter) and, on the matmul-rate GPU, compute time from 2mnk per GEMM (backward 4mnk, 2mnk for the first
   layer, whose input needs no gradient).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import plansim  # noqa: E402
from plansim.costs.kernels import KernelCostModel, load_kernel_table  # noqa: E402
from plansim.costs.stragglers import expected_max_normal  # noqa: E402
from plansim.errors import PlansimError  # noqa: E402
from plansim.hardware import Cluster, load_hardware  # noqa: E402
from plansim.hardware.schema import EfficiencyCurves  # noqa: E402
from plansim.profiling.torch_models import build_model  # noqa: E402
from plansim.step import prepare  # noqa: E402
from plansim.strategy.frameworks import KernelLaunch, load_framework  # noqa: E402
from plansim.workload import ModelSpec, TracedModel, build_graph, graph_totals, model_flops  # noqa: E402
from plansim.workload.graph import MATMUL_KINDS  # noqa: E402

#: its module-scoped fixtures computed once: every test here on one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_traced_simulate")

HARDWARE = "dgx-h100"
MB, M = 2, 4  # micro-batch (the traced batch) and micro-batches per step
STRATEGIES = {
    "dp2": f"dp=2,micro_batch={MB},global_batch={2 * MB * M}",
    "pp2": f"dp=1,pp=2,schedule=1f1b,micro_batch={MB},global_batch={MB * M}",
}
SPECS = {
    "gpt": ModelSpec(name="gpt-4x256", family="gpt", layers=4, hidden=256, heads=8, seq_len=256, vocab=4096),
    "llama": ModelSpec(
        name="llama-4x256", family="llama", layers=4, hidden=256, heads=8, kv_heads=4, ffn_hidden=688, seq_len=256,
        vocab=4096,
    ),
}  # fmt: skip
MATMUL_EFFICIENCY = 0.5
_COMPARED = (
    "step_time_s", "tokens_per_s", "model_flops_per_step", "hardware_flops_per_step", "fits", "peak_memory_bytes",
    "memory_breakdown_bytes", "comm_bytes_per_gpu", "time_breakdown_s", "num_microbatches", "bubble_fraction",
    "stage_peak_memory_bytes", "stage_time_breakdown_s",
)  # fmt: skip


def _trace(spec: ModelSpec) -> TracedModel:
    """The validator's model for ``spec`` in bf16, traced with Megatron-LM's fp32 cross-entropy loss."""
    targets = torch.zeros(MB * spec.seq_len, dtype=torch.long, device="meta")
    module = build_model(spec, device="meta", dtype=torch.bfloat16)
    inputs = ((MB, spec.seq_len), torch.long)
    loss = lambda logits: F.cross_entropy(logits.float().flatten(0, 1), targets)  # noqa: E731
    return plansim.load_model(module, inputs=inputs, name=spec.name, loss=loss)


@pytest.fixture(scope="module")
def traced() -> dict[str, TracedModel]:
    return {family: _trace(spec) for family, spec in SPECS.items()}


@pytest.fixture
def host_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """The framework's host launches free as well (its ``kernel_launch`` rule at 0 s a kernel), for ``_matmul_rate``'s
    world in which a kernel costs its matmul FLOPs and nothing else."""
    real = prepare.load_framework

    def free(name: str):  # type: ignore[no-untyped-def]
        profile = real(name)
        launch = profile.rules.kernel_launch.model_copy(update={"value": KernelLaunch(mode="eager", host_s=0.0)})
        return profile.model_copy(update={"rules": profile.rules.model_copy(update={"kernel_launch": launch})})

    monkeypatch.setattr(prepare, "load_framework", free)
    prepare._kernel_rules.cache_clear()
    yield
    prepare._kernel_rules.cache_clear()


def _matmul_rate(cluster: Cluster) -> Cluster:
    """``cluster`` with a GPU on which a kernel costs its matmul FLOPs at half the bf16 peak and nothing else
    (memory-bound kernels, launches and the optimizer step free; every GEMM at one rate whatever its size), so that
    two graphs with the same GEMM FLOPs per layer take the same time; links unchanged."""
    gpu = cluster.gpu.model_copy(
        update={
            "name": "matmul-rate",
            "hbm_bandwidth_Bps": math.inf,
            "kernel_launch_s": 0.0,
            "peak_flops_by_dtype": {**cluster.gpu.peak_flops_by_dtype, "fp32": math.inf},
            "efficiency": EfficiencyCurves(matmul=((1.0, MATMUL_EFFICIENCY),), memory=((1.0, 1.0),)),
        }
    )
    return dataclasses.replace(cluster, gpu=gpu)


def _fields(result: plansim.Result) -> dict:
    return {k: getattr(result, k) for k in _COMPARED}


# ------------------------------------------------------------------------------------------------ loading


def test_load_model_traces_a_module_and_keeps_names(traced):
    gpt, llama = traced["gpt"], traced["llama"]
    spec = SPECS["gpt"]
    assert (gpt.batch, gpt.seq_len, gpt.dtype, gpt.layers) == (MB, spec.seq_len, "bf16", spec.layers)
    assert gpt.tied_params == spec.vocab * spec.hidden  # the head reads the word embedding (layers -1 and L)
    assert llama.tied_params == 0  # Llama's head is its own
    assert isinstance(plansim.load_model("gpt3-125m"), ModelSpec)


@pytest.mark.parametrize(
    ("args", "kwargs", "fragment"),
    [
        (("gpt3-125m",), {"inputs": (2, 8)}, "only a torch.nn.Module is traced"),
        ((nn.Linear(4, 4),), {}, "model: got Linear"),
        ((42,), {}, "model: got int"),
    ],
)
def test_load_model_bad_input_is_one_line(args, kwargs, fragment):
    with pytest.raises(PlansimError) as err:
        plansim.load_model(*args, **kwargs)
    assert fragment in str(err.value) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------------ the adapter


PIPELINES = {
    **STRATEGIES,
    "interleaved": f"dp=1,pp=2,schedule=interleaved,virtual_stages=2,micro_batch={MB},global_batch={MB * M}",
    "zb-h1": f"dp=1,pp=2,schedule=zb-h1,framework=fsdp,micro_batch={MB},global_batch={MB * M}",
}


@pytest.mark.parametrize("engine", ["analytic", "des"])
@pytest.mark.parametrize("strategy", sorted(PIPELINES))
@pytest.mark.parametrize("remat", ["none", "selective", "full", "sqrt"])
@pytest.mark.parametrize("family", sorted(SPECS))
def test_builder_graph_as_traced_model_prices_as_its_spec(family, remat, strategy, engine):
    """The builder's graph of one micro-batch, wrapped as a traced model (tied embeddings as the trace finds them:
    GPT's V*h parameters read by the embedding and the head), gives the spec's result exactly."""
    spec = SPECS[family]
    wrapped = TracedModel(
        spec.name, build_graph(spec, MB), spec.layers, None, batch=MB, seq_len=spec.seq_len, dtype="bf16",
        tied_params=spec.vocab * spec.hidden if spec.tied_embeddings else 0,
    )  # fmt: skip
    text = f"{PIPELINES[strategy]},remat={remat}"
    want = plansim.simulate(spec, HARDWARE, text, gpus=2, engine=engine)
    got = plansim.simulate(wrapped, HARDWARE, text, gpus=2, engine=engine)
    assert _fields(got) == _fields(want)


# ------------------------------------------------------------------------------------------------ real traces


@pytest.mark.parametrize("engine", ["analytic", "des"])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("family", sorted(SPECS))
def test_traced_validator_model_matches_its_spec(traced, family, strategy, engine, host_free):
    spec, text = SPECS[family], STRATEGIES[strategy]
    cluster = load_hardware(HARDWARE, gpus=2)
    # the validator's models write the attention core out: the spec is priced with attention unfused
    unfused = build_graph(spec, MB, attention="unfused")
    extra_saved = traced[family].totals()["saved_bytes"] - graph_totals(unfused)["saved_bytes"]
    causal = model_flops(unfused)
    every = 3 * sum(d["flops"] for _, d in unfused.nodes(data=True) if d["kind"] in MATMUL_KINDS)
    assert 0 < extra_saved < 0.02 * graph_totals(unfused)["saved_bytes"]
    for remat in ("none", "selective", "full"):
        got = plansim.simulate(traced[family], cluster, f"{text},remat={remat}", engine=engine)
        want = plansim.simulate(spec, cluster, f"{text},remat={remat},attention=unfused", engine=engine)
        assert got.comm_bytes_per_gpu == want.comm_bytes_per_gpu  # same parameters, messages, tied copy
        # the trace does not know the core's mask is causal: its model FLOPs count every score, the spec's half
        # (Megatron-LM's formula); both execute every score, unfused
        assert got.model_flops_per_step / want.model_flops_per_step == pytest.approx(every / causal, rel=1e-12)
        assert got.hardware_flops_per_step == want.hardware_flops_per_step  # recompute: same GEMMs rerun
        have, need = got.memory_breakdown_bytes, want.memory_breakdown_bytes
        # fragmentation: the allocator's rounding of each op's saved tensor, and the trace splits ops differently
        assert {k: v for k, v in have.items() if k not in ("activations", "fragmentation")} == {
            k: v for k, v in need.items() if k not in ("activations", "fragmentation")
        }
        # at most one micro-batch's extra per micro-batch in flight (at most M), plus one in the rebuilt working set
        assert 0 <= have["activations"] - need["activations"] <= (M + 1) * extra_saved, remat
        assert want.peak_memory_bytes <= got.peak_memory_bytes <= 1.01 * want.peak_memory_bytes
        assert got.step_time_s > want.step_time_s  # the eager module's unfused kernels (module docstring)
        flat = _matmul_rate(cluster)
        got = plansim.simulate(traced[family], flat, f"{text},remat={remat}", engine=engine)
        want = plansim.simulate(spec, flat, f"{text},remat={remat},attention=unfused", engine=engine)
        assert got.step_time_s == pytest.approx(want.step_time_s, rel=1e-9), remat
        assert got.time_breakdown_s == pytest.approx(want.time_breakdown_s, rel=1e-9, abs=1e-15)


def _kernel_seconds(graph, kernels: KernelCostModel) -> float:
    """Forward plus backward time of every op of ``graph`` (one micro-batch), summed kernel by kernel."""
    return sum(kernels.forward(d) + kernels.backward(d) for _, d in graph.nodes(data=True))


def _run_seconds(graph, kernels: KernelCostModel) -> float:
    """Forward plus backward time of ``graph``'s layers (one micro-batch, no collective splitting a pass): each
    layer's pass is one run of kernels, taking the longer of their GPU time and their launches on the host (one
    kernel an op forward; two a GEMM backward, one the rest)."""
    passes: dict[tuple[int, str], list[float]] = {}
    for _, d in graph.nodes(data=True):
        if d["kind"] == "collective":
            continue
        bwd_launches = 2 if d["kind"] in MATMUL_KINDS and d["kind"] != "attention" else 1
        for key, gpu, launches in (("fwd", kernels.forward(d), 1), ("bwd", kernels.backward(d), bwd_launches)):
            run = passes.setdefault((d["layer"], key), [0.0, 0.0])
            run[0] += gpu
            run[1] += launches * kernels.host_s
    return sum(max(gpu, host) for gpu, host in passes.values())


@pytest.mark.parametrize("engine", ["analytic", "des"])
@pytest.mark.parametrize("family", sorted(SPECS))
def test_traced_step_exceeds_spec_by_its_extra_kernels(traced, family, engine):
    """dp=2 without pipeline: the step is M micro-batches of compute, then the gradient all-reduce (one bucket,
    exposed whole) and the optimizer, which are the same for both; so the traced step exceeds the spec's by M times
    the difference of the two graphs' layer passes (each the longer of its kernels' GPU time and their launches on
    the host: the eager module's extra kernels cost launches too), and the wait for the slower of the two GPUs by
    its share of their kernel time (``gpu_to_gpu_cv`` times e_2, plansim.costs.stragglers; not of the host's)."""
    spec = SPECS[family]
    cluster = load_hardware(HARDWARE, gpus=2)
    got = plansim.simulate(traced[family], cluster, STRATEGIES["dp2"], engine=engine)
    want = plansim.simulate(spec, cluster, f"{STRATEGIES['dp2']},attention=unfused", engine=engine)
    host_s = load_framework("megatron").rules.kernel_launch.value.host_s
    kernels = KernelCostModel(cluster.gpu, "bf16", load_kernel_table(cluster.gpu.name), host_s=host_s)
    unfused = build_graph(spec, MB, attention="unfused")
    runs = _run_seconds(traced[family].graph, kernels) - _run_seconds(unfused, kernels)
    extra = _kernel_seconds(traced[family].graph, kernels) - _kernel_seconds(unfused, kernels)
    wait = cluster.gpu.gpu_to_gpu_cv * expected_max_normal(2)
    assert got.step_time_s - want.step_time_s == pytest.approx(M * (runs + extra * wait), rel=1e-9)


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("strategy", "fragment"),
    [
        ("dp=1,tp=2,micro_batch=2", "tp=2: a traced model runs with tp=1 only"),
        ("dp=2,micro_batch=2,sequence_parallel=true", "sequence_parallel=true"),
        ("dp=2,micro_batch=4", "micro_batch=4 but model 'gpt-4x256' was traced at batch 2"),
        ("dp=2,micro_batch=2,dtype=fp16", "dtype=fp16 but model 'gpt-4x256' was traced in bf16"),
    ],
)
@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_strategy_the_trace_cannot_take_is_one_line(traced, strategy, fragment, engine):
    with pytest.raises(PlansimError) as err:
        plansim.simulate(traced["gpt"], HARDWARE, strategy, gpus=2, engine=engine)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_micro_batch_and_dtype_left_out_come_from_the_trace(traced):
    """A strategy without micro_batch and dtype takes the traced batch and dtype, not its defaults (1, the GPU's)."""
    implicit = plansim.simulate(traced["gpt"], HARDWARE, f"dp=2,global_batch={2 * MB * M}", gpus=2)
    explicit = plansim.simulate(traced["gpt"], HARDWARE, f"{STRATEGIES['dp2']},dtype=bf16", gpus=2)
    assert (implicit.strategy["micro_batch"], implicit.strategy["dtype"], implicit.num_microbatches) == (MB, "bf16", M)
    assert _fields(implicit) == _fields(explicit)


# ------------------------------------------------------------------------------------------------ a plain MLP


@pytest.mark.parametrize("engine", ["analytic", "des"])
@pytest.mark.parametrize("remat", ["none", "sqrt"])
def test_sequential_mlp_with_dp2_matches_closed_forms(engine, remat, host_free):
    """Flatten (no kernel: a block of zero cost), then Linear(k, n1) GELU Linear(n1, n2) ReLU Linear(n2, n3) on
    (B, k) in bf16, the output differentiated against ones; dp=2, M micro-batches."""
    B, (k, n1, n2, n3) = 64, (512, 1024, 768, 256)
    layers = (nn.Flatten(), nn.Linear(k, n1), nn.GELU(), nn.Linear(n1, n2), nn.ReLU(), nn.Linear(n2, n3))
    mlp = nn.Sequential(*layers).to(torch.bfloat16)
    traced = plansim.load_model(mlp, inputs=(B, k), name="mlp")
    assert (traced.layers, traced.batch, traced.seq_len, traced.dtype) == (6, B, 1, "bf16")
    cluster = _matmul_rate(load_hardware(HARDWARE, gpus=2))
    strategy = f"dp=2,micro_batch={B},global_batch={2 * B * M},remat={remat},framework=deepspeed"  # bf16 gradients
    r = plansim.simulate(traced, cluster, strategy, engine=engine)
    gemms = [(k, n1), (n1, n2), (n2, n3)]
    forward = sum(2 * B * a * b for a, b in gemms)
    backward = 2 * forward - 2 * B * k * n1  # the first layer's input needs no gradient
    assert r.model_flops_per_step == 3 * forward * 2 * M
    params = sum(a * b + b for a, b in gemms)
    assert r.comm_bytes_per_gpu["dp"] == 2 * (2 - 1) / 2 * params * 2  # ring all-reduce of bf16 gradients
    assert {part: r.memory_breakdown_bytes[part] for part in ("weights", "gradients", "optimizer")} == {
        "weights": 2 * params, "gradients": 2 * params, "optimizer": 12 * params,
    }  # fmt: skip
    rate = cluster.gpu.peak_flops("bf16") * MATMUL_EFFICIENCY
    assert r.time_breakdown_s["compute"] == pytest.approx(M * (forward + backward) / rate, rel=1e-9)
    recompute = M * forward / rate if remat == "sqrt" else 0.0  # sqrt(N) reruns every block's forward once
    assert r.time_breakdown_s["recompute"] == pytest.approx(recompute, rel=1e-9, abs=1e-15)
