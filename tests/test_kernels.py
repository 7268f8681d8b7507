"""Kernel costs: the roofline from the profile by hand, and a measured table taking precedence where it has rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.costs.kernels import KernelCostModel, load_kernel_table
from plansim.hardware import load_gpu

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


def test_measured_table_overrides_the_roofline(tmp_path: Path) -> None:
    name = "test-gpu-table"
    (tmp_path / f"{name}.csv").write_text(
        "kind,dtype,flops,bytes,time_s\n"
        "matmul,bf16,1e9,1e6,1e-5\n"  # 100 TFLOP/s at 1 GFLOP
        "matmul,bf16,1e11,1e8,5e-4\n"  # 200 TFLOP/s at 100 GFLOP
        "elementwise,fp32,0,1e9,1e-3\n"  # 1 TB/s
    )
    table = load_kernel_table(name, tmp_path)
    assert table is not None and load_kernel_table("no-such-gpu", tmp_path) is None
    k = KernelCostModel(GPU, "bf16", table)
    launch = GPU.kernel_launch_s
    assert k.kernel_time("matmul", 1e9, 0) == pytest.approx(1e-5 + launch)  # at a measured point
    assert k.kernel_time("matmul", 1e10, 0) == pytest.approx(1e10 / 150e12 + launch)  # halfway in log(size)
    assert k.kernel_time("matmul", 1e13, 0) == pytest.approx(1e13 / 200e12 + launch)  # clamped past the end
    assert k.kernel_time("softmax", 0, 2e9) == pytest.approx(2e-3 + launch)
    # fp16 has no rows: the roofline answers.
    assert KernelCostModel(GPU, "fp16", table).kernel_time("matmul", 1e9, 0) == pytest.approx(
        KernelCostModel(GPU, "fp16").kernel_time("matmul", 1e9, 0)
    )
