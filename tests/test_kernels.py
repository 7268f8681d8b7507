"""Kernel costs: the roofline from the profile by hand, and a measured profile taking precedence inside its sizes."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plansim.costs.kernels import KernelCostModel, KernelTable, load_kernel_table
from plansim.hardware import load_gpu
from plansim.profiling.schema import Environment, KernelPoint, KernelProfile

GPU = load_gpu("a100-sxm4-80gb")


def test_roofline_by_hand() -> None:
    k = KernelCostModel(GPU, "bf16")
    flops, nbytes = 2 * 8192**3, 3 * 8192 * 8192 * 2  # a square bf16 GEMM: compute-bound
    expected = flops / (GPU.peak_flops("bf16") * GPU.matmul_efficiency(flops)) + GPU.kernel_launch_s
    assert k.kernel_time("matmul", flops, nbytes) == pytest.approx(expected)
    # An elementwise op is memory-bound and runs at fp32 CUDA-core rate, never at the tensor-core peak.
    n = 2**28
    expected = n / (GPU.hbm_bandwidth_Bps * GPU.memory_efficiency(n)) + GPU.kernel_launch_s
    assert k.kernel_time("elementwise", n / 8, n) == pytest.approx(expected)
    assert k.kernel_time("matmul", 0, 0) == 0.0


def test_backward_of_a_gemm_is_two_kernels() -> None:
    k = KernelCostModel(GPU, "bf16")
    op = {"kind": "matmul", "flops": 1e12, "bwd_flops": 2e12, "bytes": 1e8}
    assert k.backward(op) == pytest.approx(2 * k.forward(op))


def _profile(points: list[tuple[str, str, str, float, float, float]]) -> KernelProfile:
    """A measured profile of (op, pass, dtype, flops, bytes, time_s) points."""
    env = Environment(device="cuda", device_name="Test GPU", torch="2.13.0", python="3.11", platform="test",
                      date="2026-11-21T00:00:00+00:00", command="test")  # fmt: skip
    return KernelProfile(
        environment=env,
        points=[
            KernelPoint(op=op, direction=d, dtype=dt, shape=(1,), flops=f, bytes=b, time_s=t, repeats=3)  # type: ignore[arg-type]
            for op, d, dt, f, b, t in points
        ],
    )


def test_measured_profile_overrides_the_roofline_inside_its_sizes(tmp_path: Path) -> None:
    profile = _profile(
        [
            ("gemm", "fwd", "bf16", 1e9, 1e6, 1e-5),  # 100 TFLOP/s at 1 GFLOP
            ("gemm", "fwd", "bf16", 1e11, 1e8, 5e-4),  # 200 TFLOP/s at 100 GFLOP
            ("gemm", "bwd", "bf16", 2e9, 2e6, 4e-5),  # the backward pair: 50 TFLOP/s at 2 GFLOP
            ("gemm", "bwd", "bf16", 2e11, 2e8, 2e-3),  # 100 TFLOP/s at 200 GFLOP
            ("gelu", "fwd", "bf16", 0, 1e8, 1e-4),  # 1 TB/s
            ("silu", "fwd", "bf16", 0, 1e8, 2e-4),  # 0.5 TB/s at the same size: averaged with gelu
            ("gelu", "fwd", "bf16", 0, 1e10, 5e-3),  # 2 TB/s
            ("sdpa", "fwd", "bf16", 1e12, 1e9, 1e-3),  # prices fused attention only (test_measured_sdpa_...)
        ]
    )
    name = "test-gpu-profile"
    (tmp_path / f"{name}.yaml").write_text(profile.to_yaml())
    table = load_kernel_table(name, tmp_path)
    assert table is not None and load_kernel_table("no-such-gpu", tmp_path) is None
    k, roof = KernelCostModel(GPU, "bf16", table), KernelCostModel(GPU, "bf16")
    assert k.kernel_time("matmul", 1e9, 0) == pytest.approx(1e-5)  # a measured time, launch included
    assert k.kernel_time("matmul", 1e10, 0) == pytest.approx(1e10 / 150e12)  # halfway in log(size)
    for outside in (1e8, 1e13):  # beyond the measured sizes: the roofline
        assert k.kernel_time("matmul", outside, 1e6) == roof.kernel_time("matmul", outside, 1e6)
    assert k.kernel_time("elementwise", 0, 1e8) == pytest.approx(1e8 / 0.75e12)
    assert k.kernel_time("elementwise", 0, 1e9) == pytest.approx(1e9 / 1.375e12)
    assert k.kernel_time("norm", 0, 1e9) == roof.kernel_time("norm", 0, 1e9)  # no norm points
    assert k.kernel_time("conv", 1e10, 0) == roof.kernel_time("conv", 1e10, 0)  # conv is never measured
    op = {"kind": "matmul", "flops": 1e10, "bwd_flops": 2e10, "bytes": 1e7}
    assert k.backward(op) == pytest.approx(2e10 / 75e12)  # the measured pair at 20 GFLOP
    # fp16 has no gemm points: the roofline answers; memory-bound points serve any dtype.
    fp16 = KernelCostModel(GPU, "fp16", table)
    assert fp16.kernel_time("matmul", 1e10, 0) == KernelCostModel(GPU, "fp16").kernel_time("matmul", 1e10, 0)
    assert fp16.kernel_time("elementwise", 0, 1e8) == pytest.approx(1e8 / 0.75e12)
    assert "measured: test-gpu-profile.yaml (Test GPU, torch 2.13.0" in k.provenance
    assert roof.provenance.startswith("roofline: A100-SXM4-80GB")


#: FlashAttention papers' benchmark setting (Dao 2023 sec 4.1; Shah et al. 2024 sec 4.1): 16k tokens per batch,
#: hidden 2048 = 16 heads of 128; TFLOP/s by sequence length 512 ... 16k, causal FLOPs halved. Each kernel's forward
#: (causal) and backward (the papers show it without the causal mask) as Shah et al. 2024 (v2) Figures 5d and 6b print
#: them for H100, and FlashAttention-2's forward + backward (causal) as Dao 2023 Figure 4d prints it for A100.
_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
_H100 = {
    "flash3": ((292, 423, 521, 579, 602, 616), (316, 424, 501, 542, 559, 561)),
    "cudnn": ((315, 410, 484, 518, 529, 539), (305, 408, 465, 499, 518, 516)),
    "flash2": ((191, 260, 298, 319, 333, 335), (214, 260, 291, 310, 318, 322)),
}
_FA2_A100_FWD_BWD_CAUSAL = (99, 133, 155, 173, 182, 189)
#: cuDNN 9.19 on an H200, Llama-3.1 shape (64 heads of 128, batch 1), causal, seqlen 2k ... 32k: forward, backward
#: (NVIDIA/cudnn-frontend v1.19.0, benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn)
_H200_CUDNN = ((2048, 4096, 8192, 16384, 32768), (484, 591, 644, 673, 688), (370, 474, 541, 579, 581))


def _attention_op(seq: int, heads: int = 16, batch: int | None = None) -> dict[str, float]:
    """The fused causal kernel of the benchmark setting as the workload builder writes it: FLOPs over every score."""
    batch = 16384 // seq if batch is None else batch
    full = 4.0 * seq * seq * 128 * heads * batch  # QK^T and attention over V, no causal halving
    return {"kind": "attention", "flops": full, "bwd_flops": 2.5 * full, "bytes": 4 * 16384 * 2048 * 2, "causal": True}


@pytest.mark.parametrize("index", range(len(_SEQ)))
@pytest.mark.parametrize("kernel", sorted(_H100))
def test_fused_attention_meets_the_published_kernel_benchmarks(kernel: str, index: int) -> None:
    """At the papers' own setting, each kernel priced reproduces its published rate (well within 10%): on H100 its
    forward (causal) and its backward; the causal kernel executes half the scores' FLOPs (Dao 2023 sec 4.1). The
    backward curve is the non-causal one, indexed by the FLOPs executed: a causal backward of twice the benchmark's
    FLOPs executes exactly the benchmark's."""
    op = _attention_op(_SEQ[index])
    fwd, bwd = _H100[kernel]
    h100 = KernelCostModel(load_gpu("h100-sxm5-80gb"), "bf16", attention_kernel=kernel)
    assert h100.forward(op) == pytest.approx(op["flops"] / 2 / (fwd[index] * 1e12), rel=1e-3)
    twice = {**op, "bwd_flops": 2 * op["bwd_flops"]}
    assert h100.backward(twice) == pytest.approx(op["bwd_flops"] / (bwd[index] * 1e12), rel=1e-3)
    if kernel == "flash2":
        a100 = KernelCostModel(GPU, "bf16", attention_kernel="flash2")
        both = a100.forward(op) + a100.backward(op)
        assert both == pytest.approx(3.5 * op["flops"] / 2 / (_FA2_A100_FWD_BWD_CAUSAL[index] * 1e12), rel=1e-3)


@pytest.mark.parametrize("index", range(5))
def test_h200_cudnn_meets_its_published_benchmark(index: int) -> None:
    seqs, fwd, bwd = _H200_CUDNN
    op = _attention_op(seqs[index], heads=64, batch=1)
    h200 = KernelCostModel(load_gpu("h200-sxm-141gb"), "bf16", attention_kernel="cudnn")
    assert h200.forward(op) == pytest.approx(op["flops"] / 2 / (fwd[index] * 1e12), rel=1e-3)
    assert h200.backward(op) == pytest.approx(op["bwd_flops"] / 2 / (bwd[index] * 1e12), rel=1e-3)


def test_the_faster_kernel_is_priced_faster() -> None:
    """On H100 at long sequences FlashAttention-3 > cuDNN 9.1 > FlashAttention-2 (Shah et al. 2024 Figure 5d: 616,
    539 and 335 TFLOP/s at 16k); a kernel the profile lacks is a GEMM (V100 has none)."""
    op = _attention_op(16384)
    h100 = load_gpu("h100-sxm5-80gb")
    t = {k: KernelCostModel(h100, "bf16", attention_kernel=k).forward(op) for k in ("flash3", "cudnn", "flash2")}
    assert t["flash3"] < t["cudnn"] < t["flash2"]


def test_fused_attention_without_a_benchmark_is_a_gemm_of_the_causal_half() -> None:
    """A GPU whose profile cites no fused-attention benchmark (V100) prices the kernel by the GEMM roofline at the
    FLOPs it executes; the backward is one kernel of bwd_flops, not a GEMM's pair."""
    v100 = load_gpu("v100-sxm2-32gb")
    k = KernelCostModel(v100, "fp16", attention_kernel="flash2")
    op = _attention_op(4096)

    def roofline(flops: float, nbytes: float) -> float:
        compute = flops / (v100.peak_flops("fp16") * v100.matmul_efficiency(flops))
        return max(compute, nbytes / (v100.hbm_bandwidth_Bps * v100.memory_efficiency(nbytes))) + v100.kernel_launch_s

    assert k.forward(op) == pytest.approx(roofline(op["flops"] / 2, op["bytes"]))
    assert k.backward(op) == pytest.approx(roofline(op["bwd_flops"] / 2, 2 * op["bytes"]))


def test_measured_sdpa_prices_fused_attention(tmp_path: Path) -> None:
    """``plansim profile`` times causal scaled_dot_product_attention and records half the full FLOPs (its
    ``_attention``): those points price the fused kernel at the FLOPs it executes, per pass; outside them the GPU
    profile's cited curve answers."""
    profile = _profile(
        [
            ("sdpa", "fwd", "bf16", 1e11, 1e8, 1e11 / 300e12),  # 300 TFLOP/s
            ("sdpa", "fwd", "bf16", 1e12, 1e9, 1e12 / 400e12),
            ("sdpa", "bwd", "bf16", 2.5e11, 2e8, 2.5e11 / 200e12),  # 200 TFLOP/s
            ("sdpa", "bwd", "bf16", 2.5e12, 2e9, 2.5e12 / 250e12),
        ]
    )
    (tmp_path / "t.yaml").write_text(profile.to_yaml())
    table = load_kernel_table("t", tmp_path)
    h100 = load_gpu("h100-sxm5-80gb")
    k = KernelCostModel(h100, "bf16", table, attention_kernel="cudnn")
    cited = KernelCostModel(h100, "bf16", attention_kernel="cudnn")
    op = {"kind": "attention", "flops": 2e12, "bwd_flops": 5e12, "bytes": 1e8, "causal": True}  # executes 1e12, 2.5e12
    assert k.forward(op) == pytest.approx(1e12 / 400e12)
    assert k.backward(op) == pytest.approx(2.5e12 / 250e12)
    small = {"kind": "attention", "flops": 2e10, "bwd_flops": 5e10, "bytes": 1e7, "causal": True}  # below them
    assert k.forward(small) == cited.forward(small)
    assert k.kernel_time("bmm", 1e11, 1e8) == cited.kernel_time("bmm", 1e11, 1e8)  # sdpa prices no bmm


@settings(max_examples=100, deadline=None)
@given(
    points=st.lists(  # sizes 1e3-1e15, at least 1e-6 decades apart (closer ones are one size to log10)
        st.tuples(st.floats(3, 15).map(lambda e: 10**e), st.floats(1e9, 1e15)),
        min_size=2,
        max_size=8,
        unique_by=lambda p: round(math.log10(p[0]), 6),
    ),
    where=st.floats(0, 1),
)
def test_measured_rates_interpolate_monotonically(points: list[tuple[float, float]], where: float) -> None:
    """Between two adjacent measured sizes the rate stays between theirs; at a measured size it is the measured
    rate; outside the measured range there is none (the roofline answers)."""
    pts = sorted(points)
    table = KernelTable({("gemm", "fwd", "bf16"): pts})
    for (x0, r0), (x1, r1) in itertools.pairwise(pts):
        x = min(max(x0 * (x1 / x0) ** where, x0), x1)  # rounding must not step outside [x0, x1]
        rate = table.rate("gemm", "fwd", "bf16", x)
        assert rate is not None and min(r0, r1) * (1 - 1e-9) <= rate <= max(r0, r1) * (1 + 1e-9)
    for x, r in pts:
        assert table.rate("gemm", "fwd", "bf16", x) == pytest.approx(r)
    assert table.rate("gemm", "fwd", "bf16", pts[0][0] * 0.5) is None
    assert table.rate("gemm", "fwd", "bf16", pts[-1][0] * 2) is None


def test_both_engines_use_and_name_a_measured_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile at ``measured/<gpu>.yaml`` changes both engines' step, and each Result names it."""
    import plansim
    from plansim.costs import kernels

    strategy = "dp=1,tp=1,pp=1,micro_batch=1,global_batch=1"
    before = {e: plansim.simulate("gpt3-125m", "dgx-a100", strategy, engine=e) for e in ("analytic", "des")}
    assert all(r.cost_model.startswith("roofline: A100-SXM4-80GB") for r in before.values())
    slow = [("gemm", "fwd", "bf16", f, f / 1e3, f / 50e12) for f in (1e6, 1e9, 1e12, 1e15)]  # 50 TFLOP/s flat
    (tmp_path / "a100-sxm4-80gb.yaml").write_text(_profile(slow).to_yaml())
    monkeypatch.setattr(kernels, "_measured_dir", lambda: tmp_path)
    for engine, old in before.items():
        r = plansim.simulate("gpt3-125m", "dgx-a100", strategy, engine=engine)
        assert r.cost_model.startswith("measured: a100-sxm4-80gb.yaml (Test GPU")
        assert r.time_breakdown_s["compute"] > old.time_breakdown_s["compute"]  # 50 TFLOP/s is slower than the roofline


def test_pointwise_kernels_meet_the_roofline_not_the_gemm_ramp():
    """Williams et al. 2009: a point-wise kernel takes max(FLOPs / fp32 peak, bytes / achieved bandwidth) + launch.
    The GEMM efficiency curve (tile ramp-up) does not apply to it: a 1 MFLOP, 4 MB element-wise kernel on an H100
    is memory-bound (about 2.5 us), not 75 us of a GEMM's ramp at fp32 peak."""
    gpu = load_gpu("h100-sxm5-80gb")
    model = KernelCostModel(gpu, "bf16")
    nbytes, flops = 4e6, 1e6
    memory = nbytes / (gpu.hbm_bandwidth_Bps * gpu.memory_efficiency(nbytes))
    assert model.kernel_time("elementwise", flops, nbytes) == pytest.approx(memory + gpu.kernel_launch_s)
    heavy = 1e12  # FLOPs far past the ridge for these bytes: the flat fp32 ceiling
    expected = heavy / gpu.peak_flops("fp32") + gpu.kernel_launch_s
    assert model.kernel_time("norm", heavy, nbytes) == pytest.approx(expected)
    # A GEMM of the same FLOPs still ramps up: slower per FLOP than the same GEMM at full size.
    small, large = model.kernel_time("matmul", 1e8, 1e6), model.kernel_time("matmul", 1e12, 1e6)
    assert small / 1e8 > large / 1e12
