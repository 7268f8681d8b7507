"""The validator's real steps on the CPU (torch): the training loop is mixed-precision AdamW as plansim prices it,
the lean cross-entropy is cross-entropy, and plansim predicts the measured peak memory of tiny models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from plansim.cli.app import app  # noqa: E402
from plansim.validation.train import MixedPrecisionAdamW, adamw, cross_entropy  # noqa: E402

runner = CliRunner()


def test_lean_cross_entropy_equals_torch_loss_and_gradient():
    logits = torch.randn(3, 7, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (3, 7))
    mine = cross_entropy(logits, targets)
    (g_mine,) = torch.autograd.grad(mine, logits)
    ref = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    (g_ref,) = torch.autograd.grad(ref, logits)
    assert torch.allclose(mine, ref) and torch.allclose(g_mine, g_ref)


def test_mixed_precision_adamw_is_adamw_on_fp32_masters():
    """Pieces of at most 5 elements (a 4x3 weight: one row each; a 7-vector: 5 + 2): the bf16 weights after two
    steps are the bf16 rounding of torch's AdamW run on the fp32 masters with the fp32 copies of the bf16
    gradients, and the gradients stay allocated, zeroed."""
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(4, 3).bfloat16()), torch.nn.Parameter(torch.randn(7).bfloat16())]
    masters = [torch.nn.Parameter(w.detach().float()) for w in weights]
    reference = adamw(masters)
    mine = MixedPrecisionAdamW(weights, chunk_elements=5)
    assert len(mine.pieces) == 4 + 2  # one row of 3 per piece; the 7-vector in pieces of 5 and 2
    for _ in range(2):
        grads = [torch.randn_like(w) for w in weights]
        for w, g in zip(weights, grads, strict=True):
            w.grad = g.clone()
        for m, g in zip(masters, grads, strict=True):
            m.grad = g.float()
        mine.step()
        reference.step()
        for w, m in zip(weights, masters, strict=True):
            assert torch.equal(w.detach(), m.detach().bfloat16())
            assert w.grad is not None and not w.grad.any()


def test_cli_validate_on_the_cpu_predicts_peak_memory(tmp_path):
    """Three tiny configurations measured on the CPU (peak from the profiler's allocation events): the CSV has the
    required columns and plansim's peak memory is within 10 % of every measurement (step times are not comparable:
    the CPU is not the GPU predicted for)."""
    import pandas as pd

    out = tmp_path / "val"
    args = ["validate", "--device", "cpu", "--hardware", "dgx-h100", "--quick", "--warmup", "1", "--repeats", "1"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out / "validation.csv")
    assert len(frame) == 3 and (frame["measured_step_time_s"] > 0).all()
    assert frame["peak_memory_error"].abs().max() < 0.10, frame[["config", "peak_memory_error"]]
    assert "only the peak memory is comparable" in (out / "summary.md").read_text()
    again = runner.invoke(app, ["validate", "--from", str(out)])  # compared again from the saved measurements
    assert again.exit_code == 0 and pd.read_csv(out / "validation.csv").equals(frame)


def test_cli_validate_refuses_bad_hardware_before_any_step(tmp_path, monkeypatch):
    """A typo in --hardware is one line and exit 2, and no training step runs (without --hardware a CPU's run
    predicts on the default node type, as plan does: tests/test_cli_text.py)."""
    import plansim.validation.train as train

    def no_steps(*args, **kwargs):
        raise AssertionError("a training step ran before the hardware was checked")

    monkeypatch.setattr(train, "measure_point", no_steps)
    for extra in (["--hardware", "dgx-nosuch"],):
        result = runner.invoke(app, ["validate", "--device", "cpu", "--quick", "--out", str(tmp_path), *extra])
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "measured.csv").exists()
