"""Data files are found from the editable install and from a built wheel alike."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from plansim.files.data import data_dir

ROOT = Path(__file__).resolve().parents[1]


def test_editable_install_reads_the_repository() -> None:
    assert data_dir("hardware_profiles") == ROOT / "hardware_profiles"
    assert data_dir("strategies") == ROOT / "strategies"


@pytest.mark.slow
def test_built_wheel_carries_its_data(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next((tmp_path / "dist").glob("plansim-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("plansim/_data/hardware_profiles/nodes/") for n in names)
    assert {"plansim/_data/frameworks/megatron.yaml", "plansim/_data/frameworks/fsdp.yaml"} <= set(names)
    assert any(n.startswith("plansim/workload/presets/") for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import plansim; from plansim.files.data import data_dir; print(data_dir('hardware_profiles')); "
        "print(len(plansim.list_models()), len(plansim.list_hardware())); "
        "print(plansim.simulate('gpt3-125m', 'dgx-a100', 'zero3', gpus=8).fits)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0].startswith(str(site))
    n_models, n_hw = map(int, lines[1].split())
    assert n_models >= 13 and n_hw >= 5
    assert lines[2] == "True"
