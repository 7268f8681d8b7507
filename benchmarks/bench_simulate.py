"""How fast the analytic engine answers: GPT-3 175B on 1024 A100s (Megatron 3D strategy).

Run: python benchmarks/bench_simulate.py   (prints wall-clock seconds; the target is under 2 s for the CLI)
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time

ARGS = [
    "--model",
    "gpt3-175b",
    "--hardware",
    "dgx-a100",
    "--gpus",
    "1024",
    "--strategy",
    "tp=8,pp=8,dp=16,micro_batch=1,global_batch=1536,schedule=interleaved,virtual_stages=2,"
    "sequence_parallel=true,remat=selective,zero=1",
    "--format",
    "json",
]


def api_seconds(repeats: int = 5) -> tuple[float, float]:
    """First call (cold: files parsed, schedules built) and the median of warm calls, in one process."""
    import plansim

    strategy = ARGS[ARGS.index("--strategy") + 1]
    start = time.perf_counter()
    plansim.simulate("gpt3-175b", "dgx-a100", strategy, gpus=1024)
    cold = time.perf_counter() - start
    warm = []
    for _ in range(repeats):
        start = time.perf_counter()
        plansim.simulate("gpt3-175b", "dgx-a100", strategy, gpus=1024)
        warm.append(time.perf_counter() - start)
    return cold, statistics.median(warm)


def cli_seconds(repeats: int = 3) -> float:
    """Median wall clock of the whole `plansim simulate` command, interpreter start-up included."""
    exe = shutil.which("plansim")
    cmd = [exe, "simulate", *ARGS] if exe else [sys.executable, "-m", "plansim.cli.app", "simulate", *ARGS]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


if __name__ == "__main__":
    cold, warm = api_seconds()
    print(f"api   simulate gpt3-175b x 1024 GPUs: cold {cold:.3f} s, warm median {warm:.3f} s")
    print(f"cli   plansim simulate (whole command, median of 3): {cli_seconds():.3f} s  (target < 2 s)")
