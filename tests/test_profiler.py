"""``plansim profile`` on the CPU at tiny widths: it writes a schema-valid profile whose points carry the FLOPs and
bytes of their shapes (recomputed here from the shapes), and without torch it fails in one line. The sweep itself
needs torch (skipped without it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from plansim.cli.app import app
from plansim.profiling.schema import OPS, load_kernel_profile

runner = CliRunner()

TINY = "name: tiny\nfamily: gpt\nlayers: 2\nhidden: 64\nheads: 4\nffn_hidden: 256\nseq_len: 32\nvocab: 256\n"


def test_profile_without_torch_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    res = runner.invoke(app, ["profile", "--device", "cpu", "--quick"])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == ["error: plansim profile needs torch: pip install 'plansim[profile]'"]


def test_profile_writes_a_valid_profile(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model = tmp_path / "tiny.yaml"
    model.write_text(TINY)
    out = tmp_path / "measured" / "cpu.yaml"
    argv = ["profile", "--device", "cpu", "--dtype", "fp32", "--quick", "--model", str(model), "--warmup", "0",
            "--repeats", "2", "--out", str(out)]  # fmt: skip
    res = runner.invoke(app, argv)
    assert res.exit_code == 0, res.output
    p = load_kernel_profile(out)
    assert p.environment.device == "cpu" and p.environment.command.startswith("plansim profile")
    assert {x.op for x in p.points} == set(OPS) - {"h2d", "d2h"}  # host transfers are timed on CUDA only
    for x in p.points:
        assert x.time_s > 0 and x.repeats == 2
        if x.op == "gemm":
            m, n, k = x.shape
            assert x.flops == (2 if x.direction == "fwd" else 4) * m * n * k
            assert x.bytes == (1 if x.direction == "fwd" else 2) * 4 * (m * k + k * n + m * n)
        elif x.op in ("layernorm", "rmsnorm", "softmax", "gelu", "silu"):
            rows, cols = x.shape
            assert x.flops == 0 and x.bytes == (2 if x.direction == "fwd" else 3) * 4 * rows * cols
    gemm_shapes = {x.shape for x in p.points if x.op == "gemm"}
    for m in (128, 512):  # quick on a CPU: two token counts, tp 1 and 8, the five linear maps of a layer
        assert {(m, 3 * 64, 64), (m, 64, 64), (m, 256, 64), (m, 64, 256), (m, 256, 64)} <= gemm_shapes
        assert {(m, 24, 64), (m, 64, 8), (m, 32, 64), (m, 64, 32)} <= gemm_shapes


def test_profile_rejects_bad_options(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    for argv, words in (
        (["--dtype", "fp8"], "--dtype fp8"),
        (["--device", "tpu"], "--device tpu"),
        (["--repeats", "0"], "--repeats 0"),
    ):
        res = runner.invoke(app, ["profile", "--quick", *argv, "--out", str(tmp_path / "x.yaml")])
        assert res.exit_code == 2 and words in res.stderr, res.output


def _gemm_flops(sizes: Any) -> float:
    """FLOPs of one forward and backward of every GEMM a sweep times: 6 m n k per linear map (2 forward, 4
    backward), the maps of a layer (QKV, projection, MLP up and down, logits) sharded by tp."""
    h, f, v = sizes.hidden, sizes.ffn, sizes.vocab
    per_token = 3 * h * h + h * h + 2 * h * f + v * h
    return sum(6 * m * per_token / t for t in sizes.tp for m in sizes.tokens)


def test_cpu_quick_sweep_is_bounded() -> None:
    """``profile --device cpu --quick`` with the default model ran 15 minutes at 6.3 GB (issue 17): the GPU's sizes.
    On a CPU the quick sweep's GEMMs are a 16th of the GPU's, under a TFLOP (seconds on a CPU's 0.1-1 TFLOP/s);
    the GPU's sizes are unchanged."""
    pytest.importorskip("torch")
    from plansim.profiling.profiler import sweep_sizes
    from plansim.workload import load_model

    spec = load_model("gpt3-1.3b")
    cpu, gpu = sweep_sizes(spec, quick=True, device="cpu"), sweep_sizes(spec, quick=True)
    assert gpu.tokens == (2048, 8192) and gpu.seq_lens == (2048,) and gpu.tp == (1, 8)
    assert cpu.tokens == (128, 512) and cpu.seq_lens == (512,) and cpu.tp == (1, 8)
    assert _gemm_flops(cpu) < 1e12 < _gemm_flops(gpu) / 10
    full = sweep_sizes(spec, device="cpu")
    assert max(full.tokens) == 2048 and max(full.seq_lens) <= 1024


def test_kernel_groups_make_their_tensors_when_timed() -> None:
    """The sweep is listed without making a tensor (a GPU-sized sweep held every group's at once: 6.3 GB), and
    ``profile_kernels`` reports each group as it starts and ends."""
    torch = pytest.importorskip("torch")
    from plansim.profiling.profiler import SweepSizes, _groups, profile_kernels

    huge = SweepSizes(hidden=2**20, ffn=2**22, vocab=2**20, heads=8, tokens=(2**20,), seq_lens=(2**20,), tp=(1,),
                      adam_params=(2**40,))  # fmt: skip
    listed = _groups(huge, torch.device("cpu"), torch.float32, "fp32")  # terabytes, were they made
    assert len(listed) == 5
    tiny = SweepSizes(hidden=16, ffn=64, vocab=32, heads=2, tokens=(8, 16), seq_lens=(8,), tp=(1, 2),
                      adam_params=(64,))  # fmt: skip
    labels: list[str] = []
    counts: list[tuple[int, int]] = []
    p = profile_kernels(tiny, dtype="fp32", warmup=0, repeats=1, group=labels.append,
                        progress=lambda d, t: counts.append((d, t)))  # fmt: skip
    expected = [label for label, _ in _groups(tiny, torch.device("cpu"), torch.float32, "fp32")]
    assert labels == expected and len(expected) == 2 * 2 + 1 + 2 + 1 + 1
    assert counts == [(k, len(expected)) for k in range(len(expected) + 1)]
    assert len(p.points) == 2 * 2 * 5 * 2 + 4 + 2 * (7 + 4) + 1 + 2
