"""The measured kernel profile's schema (no torch needed): a profile round-trips through YAML, and a bad one is a
single error naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.errors import PlansimError
from plansim.profiling.schema import Environment, KernelPoint, KernelProfile, load_kernel_profile

ENV = Environment(
    device="cuda", device_name="NVIDIA H100 80GB HBM3", torch="2.13.0", cuda="13.0", driver="580.1",
    clocks={"sm_mhz": 1980.0}, memory_bytes=85_520_809_984, python="3.11.7", platform="Linux",
    date="2026-11-21T00:00:00+00:00", command="plansim profile --quick",
)  # fmt: skip


def _profile() -> KernelProfile:
    m, n, k = 4096, 6144, 2048
    point = KernelPoint(
        op="gemm", direction="fwd", dtype="bf16", shape=(m, n, k), flops=2 * m * n * k,
        bytes=2 * (m * k + k * n + m * n), time_s=2.1e-4, repeats=20,
    )  # fmt: skip
    return KernelProfile(environment=ENV, points=[point])


def test_a_profile_round_trips_with_its_rates(tmp_path: Path) -> None:
    p = _profile()
    path = tmp_path / "h100.yaml"
    path.write_text(p.to_yaml())
    assert load_kernel_profile(path) == p
    text = path.read_text()
    assert "pass: fwd" in text and f"tflops_per_s: {round(p.points[0].flops_per_s / 1e12, 6)}" in text


@pytest.mark.parametrize(
    "edit,words",
    [
        (("time_s: 0.00021", "time_s: 0"), "time_s"),
        (("op: gemm", "op: conv7"), "op"),
        (("pass: fwd", "pass: sideways"), "pass"),
        (("format: plansim-kernel-profile/1", "format: other/2"), "format"),
    ],
)
def test_a_bad_profile_names_the_field(tmp_path: Path, edit: tuple[str, str], words: str) -> None:
    path = tmp_path / "bad.yaml"
    text = _profile().to_yaml()
    assert edit[0] in text
    path.write_text(text.replace(*edit))
    with pytest.raises(PlansimError, match=words) as err:
        load_kernel_profile(path)
    assert "\n" not in str(err.value)


def test_a_missing_profile_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(PlansimError, match="plansim profile"):
        load_kernel_profile(tmp_path / "none.yaml")
