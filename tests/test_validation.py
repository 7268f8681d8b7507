"""The validator (issue 6): the comparison math on known numbers, device names to profiles, predictions of saved
measurements without torch, and real CPU steps whose peak memory plansim predicts."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from plansim.api import simulate
from plansim.cli.app import app
from plansim.hardware import load_hardware
from plansim.hardware.devices import device_profile
from plansim.validation import REQUIRED_COLUMNS, default_points, point, summarize, validation_frame
from plansim.validation.compare import relative_error
from plansim.validation.run import MODEL_COLUMNS, compare_saved

runner = CliRunner()


def test_errors_and_mape_on_known_numbers():
    """Three rows: step times off by +10 %, -20 %, 0 %: MAPE 10 %; memory off by +3 %, -6 %, 0: worst 6 %."""
    frame = validation_frame(
        {"predicted_step_time_s": p, "measured_step_time_s": m, "predicted_peak_memory_bytes": pm,
         "measured_peak_memory_bytes": mm}
        for p, m, pm, mm in ((1.1, 1.0, 103, 100), (0.8, 1.0, 94, 100), (2.0, 2.0, 50, 50))
    )  # fmt: skip
    assert frame["step_time_error"].round(12).tolist() == [0.1, -0.2, 0.0]
    assert frame["peak_memory_error"].round(12).tolist() == [0.03, -0.06, 0.0]
    s = summarize(frame)
    assert math.isclose(s.step_time_mape, 0.1) and math.isclose(s.step_time_max_abs_error, 0.2)
    assert math.isclose(s.peak_memory_mape, 0.03) and math.isclose(s.peak_memory_max_abs_error, 0.06)
    assert not s.meets_targets  # memory 6 % > 5 %
    assert math.isnan(relative_error(1.0, 0.0))  # no measurement, no error


def test_targets_hold_exactly_at_the_bounds():
    frame = validation_frame(
        [{"predicted_step_time_s": 1.1, "measured_step_time_s": 1.0, "predicted_peak_memory_bytes": 105,
          "measured_peak_memory_bytes": 100}]
    )  # fmt: skip
    assert summarize(frame).meets_targets


def test_frame_names_missing_columns():
    with pytest.raises(ValueError, match="measured_step_time_s"):
        validation_frame([{"predicted_step_time_s": 1.0}])


@pytest.mark.parametrize(
    ("name", "gpu"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
        ("NVIDIA H200", "h200-sxm-141gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ],
)
def test_device_names_map_to_shipped_profiles(name, gpu):
    found = device_profile(name)
    assert found is not None and found[0] == gpu
    cluster = load_hardware(found[1])  # the node type exists and holds that GPU class
    assert cluster.gpu.name.lower().split("-")[0] == gpu.split("-")[0]


def _measured_rows(points) -> pd.DataFrame:
    rows = []
    for p in points:
        spec = p.model
        rows.append(
            {"config": p.label, "model": spec.name, "family": spec.family, "layers": spec.layers,
             "hidden": spec.hidden, "heads": spec.heads, "kv_heads": spec.kv_heads, "ffn_hidden": spec.ffn_hidden,
             "vocab": spec.vocab, "seq_len": spec.seq_len, "tied_embeddings": spec.tied_embeddings,
             "learned_positions": spec.learned_positions, "micro_batch": p.micro_batch, "remat": p.remat,
             "dtype": "bf16", "measured_step_time_s": 0.5, "measured_peak_memory_bytes": 4e9}
        )  # fmt: skip
    return pd.DataFrame(rows)


def test_saved_measurements_are_predicted_as_simulate_predicts_them(tmp_path):
    """--from: every row's prediction is plansim's own for one GPU at that micro-batch and remat (no torch)."""
    points = default_points("cuda", quick=True)
    _measured_rows(points).to_csv(tmp_path / "measured.csv", index=False)
    (tmp_path / "environment.json").write_text(json.dumps({"device_name": "NVIDIA H100 80GB HBM3",
                                                           "hardware": "dgx-h100"}))  # fmt: skip
    frame, summary, written = compare_saved(tmp_path)
    assert set(REQUIRED_COLUMNS) <= set(frame.columns) and set(MODEL_COLUMNS) <= set(frame.columns)
    assert summary.configs == len(points) >= 4
    for p, row in zip(points, frame.itertuples(), strict=True):
        strategy = dict(dp=1, tp=1, pp=1, micro_batch=p.micro_batch, global_batch=p.micro_batch, remat=p.remat,
                        attention="unfused")  # fmt: skip
        want = simulate(p.model, "dgx-h100", strategy, gpus=1)
        assert row.predicted_step_time_s == want.step_time_s
        left_out = sum(want.memory_breakdown_bytes[k] for k in ("workspace", "cuda_context", "nccl", "fragmentation"))
        assert row.predicted_peak_memory_bytes == want.peak_memory_bytes - left_out
        assert row.step_time_error == pytest.approx(want.step_time_s / 0.5 - 1)
    assert {p.name for p in written} >= {"validation.csv", "predicted_vs_measured.png", "summary.md"}
    assert (tmp_path / "predicted_vs_measured.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_gpu_grid_has_twelve_configurations_that_fit_one_h100():
    points = default_points("cuda")
    assert len(points) >= 12
    assert {p.remat for p in points} == {"none", "selective", "full"}
    assert len({p.model.name for p in points}) >= 4 and len({p.model.seq_len for p in points}) >= 3
    assert len({p.micro_batch for p in points}) >= 3
    for p in points:
        strategy = dict(dp=1, tp=1, pp=1, micro_batch=p.micro_batch, global_batch=p.micro_batch, remat=p.remat,
                        attention="unfused")  # fmt: skip
        assert simulate(p.model, "dgx-h100", strategy, gpus=1).fits, p.label


def test_cli_from_a_missing_folder_is_one_line(tmp_path):
    result = runner.invoke(app, ["validate", "--from", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "run validate first" in result.output


def test_point_changes_the_sequence_length():
    p = point("gpt3-125m", 4, "selective", seq_len=1024)
    assert (p.model.seq_len, p.model.layers, p.label) == (1024, 12, "gpt3-125m s1024 b4 selective")
