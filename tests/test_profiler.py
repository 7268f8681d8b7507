"""``plansim profile`` on the CPU at tiny widths: it writes a schema-valid profile whose points carry the FLOPs and
bytes of their shapes (recomputed here from the shapes), and without torch it fails in one line. The sweep itself
needs torch (skipped without it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plansim.cli import app
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
    for m in (2048, 8192):  # quick: two token counts, tp 1 and 8, the five linear maps of a layer
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
