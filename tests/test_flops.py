"""MFU and HFU: what each counts (``plansim.result.FLOPS_CONVENTION``), and that HFU cannot pass 1.

Independent truth: a kernel cannot execute FLOPs faster than the GPU's dense peak, so a step's hardware FLOPs (what
the kernels execute, ``costs.kernels.executed_flops``) over its time, the GPUs and the peak is at most 1 whatever
the sequence length, heads, causal mask, recomputation and engine; model FLOPs (Megatron-LM's formula) never exceed
them.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plansim.api import load_hardware, simulate
from plansim.costs.kernels import KernelCostModel, executed_flops, executed_share
from plansim.hardware import load_gpu
from plansim.result import FLOPS_CONVENTION
from plansim.workload import ModelSpec, build_graph, model_flops
from plansim.workload.graph import MATMUL_KINDS


def _llama(seq: int, heads: int, head_dim: int, layers: int = 2) -> ModelSpec:
    h = heads * head_dim
    return ModelSpec(
        name="t", family="llama", layers=layers, hidden=h, heads=heads, kv_heads=heads, ffn_hidden=2 * h,
        seq_len=seq, vocab=1024,
    )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    seq=st.sampled_from([128, 1024, 4096, 16384, 65536, 131072]),
    heads=st.sampled_from([1, 4, 8, 32]),
    head_dim=st.sampled_from([64, 128]),
    attention=st.sampled_from(["flash", "unfused"]),
    remat=st.sampled_from(["none", "selective", "full"]),
    hardware=st.sampled_from(["dgx-a100", "dgx-h100"]),
)
def test_hfu_at_most_one_and_mfu_at_most_hfu(seq, heads, head_dim, attention, remat, hardware) -> None:
    spec = _llama(seq, heads, head_dim)
    r = simulate(
        spec, load_hardware(hardware, gpus=1), f"dp=1,micro_batch=1,global_batch=2,remat={remat},attention={attention}"
    )
    assert 0 < r.mfu <= r.hfu <= 1, (r.mfu, r.hfu)


@settings(max_examples=60, deadline=None)
@given(
    seq=st.sampled_from([128, 512, 2048, 8192, 32768, 131072]),
    heads=st.sampled_from([1, 8, 32]),
    head_dim=st.sampled_from([64, 128, 256]),
    causal=st.booleans(),
    gpu=st.sampled_from(["a100-sxm4-80gb", "a100-sxm4-40gb", "h100-sxm5-80gb", "h200-sxm-141gb"]),
)
def test_no_kernel_runs_above_the_peak(seq, heads, head_dim, causal, gpu) -> None:
    """Each kernel of a block, the attention core with or without its causal mask, takes at least its executed
    FLOPs at the dense peak: the per-kernel fact HFU <= 1 rests on."""
    graph = build_graph(_llama(seq, heads, head_dim, layers=1), 1)
    kernels = KernelCostModel(load_gpu(gpu), "bf16")
    peak = kernels.gpu.peak_flops("bf16")
    for _, op in graph.nodes(data=True):
        if op["kind"] not in MATMUL_KINDS:
            continue
        op = {**op, "causal": causal} if op.get("causal") is not None else op
        share = executed_share(op)
        assert kernels.forward(op) >= op["flops"] * share / peak * (1 - 1e-12)
        assert kernels.backward(op) >= op["bwd_flops"] * share / peak * (1 - 1e-12)


def test_causal_attention_counts_half_the_scores() -> None:
    """Megatron-LM's formula halves the core attention under the causal mask; the fused kernel executes that half
    forward and backward (2 B s^2 h and 5 B s^2 h a layer), the unfused core every score (4 and 8)."""
    spec = _llama(4096, 8, 128, layers=3)
    b, s, h, L = 1, spec.seq_len, spec.hidden, spec.layers
    flash, unfused = build_graph(spec, b), build_graph(spec, b, attention="unfused")
    linear = model_flops(flash) - 6 * b * s * s * h * L
    assert model_flops(flash) == model_flops(unfused)
    assert executed_flops(flash) == pytest.approx(linear + 7 * b * s * s * h * L)
    assert executed_flops(unfused) == pytest.approx(linear + 12 * b * s * s * h * L)


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_both_engines_state_the_convention(engine: str) -> None:
    r = simulate(
        _llama(8192, 8, 128), load_hardware("dgx-h100", gpus=8), "dp=8,micro_batch=1,global_batch=8", engine=engine
    )
    assert r.to_dict()["flops_convention"] == FLOPS_CONVENTION
    assert 0 < r.mfu <= r.hfu <= 1
