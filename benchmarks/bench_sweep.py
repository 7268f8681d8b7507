"""How fast a sweep runs, and that it gives the same DataFrame whatever runs it (issue "sweeps that scale past one
machine": a sweep of at least 200 planner runs gives the same DataFrame with --jobs 1, --jobs 2 and a Dask
LocalCluster; runs per second for each).

The grid: GPT-3 125M and 350M on DGX A100, DGX H100, HGX H200 and 4 x RTX 4090 nodes, 8-128 GPUs, global batch
32-512: 2 x 4 x 5 x 5 = 200 planner runs, each the planner's full search with the sweep's default settings (analytic
engine, balanced layer splits, no DES or MILP). The same grid runs serially, in ``--jobs`` loky processes and on a
Dask ``LocalCluster(n_workers=--workers)`` (or the cluster at ``--scheduler``). The DataFrames must be equal (the
script fails otherwise). Runs per second are planner runs over each sweep's wall time; the loky pool's start is
inside it, the LocalCluster's start is printed apart (a real cluster is started once for many sweeps).

Run: python benchmarks/bench_sweep.py [--jobs 2] [--workers 2] [--scheduler ADDRESS]
"""

from __future__ import annotations

import argparse
import time

from pandas.testing import assert_frame_equal

from plansim.sweep import Sweep, SweepGrid, sweep

GRID = SweepGrid(
    models=("gpt3-125m", "gpt3-350m"),
    hardware=("dgx-a100", "dgx-h100", "hgx-h200", "pcie-4x4090"),
    gpus=(8, 16, 32, 64, 128),
    global_batches=(32, 64, 128, 256, 512),
)


def report(name: str, s: Sweep) -> None:
    """One line: the executor, runs, wall time and runs per second."""
    print(f"{name:<34} {len(s.table):>4} planner runs in {s.elapsed_s:7.1f} s: {s.runs_per_s:6.2f} runs/s")


def on_local_cluster(workers: int) -> Sweep:
    """The grid on a fresh ``LocalCluster`` of ``workers`` single-threaded worker processes."""
    from distributed import LocalCluster

    began = time.perf_counter()
    with LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None) as cluster:
        print(f"(LocalCluster of {workers} workers started in {time.perf_counter() - began:.1f} s, not counted)")
        return sweep(GRID, scheduler=cluster.scheduler_address)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="loky processes of the joblib run")
    parser.add_argument("--workers", type=int, default=2, help="workers of the Dask LocalCluster")
    parser.add_argument("--scheduler", help="use the Dask cluster at this address instead of a LocalCluster")
    args = parser.parse_args()
    print(f"grid: {GRID.describe()}; per point: analytic engine, balanced splits, no DES, no MILP")
    serial = sweep(GRID)
    report("serial (--jobs 1)", serial)
    local = sweep(GRID, jobs=args.jobs)
    report(f"joblib (--jobs {args.jobs})", local)
    if args.scheduler:
        dask = sweep(GRID, scheduler=args.scheduler)
        report(f"dask ({args.scheduler})", dask)
    else:
        dask = on_local_cluster(args.workers)
        report(f"dask LocalCluster(n_workers={args.workers})", dask)
    frame = serial.frame()
    assert_frame_equal(local.frame(), frame)
    assert_frame_equal(dask.frame(), frame)
    fits = int(frame["fits"].sum())
    print(f"the three DataFrames are equal: {len(frame)} rows x {len(frame.columns)} columns; {fits} points fit")


if __name__ == "__main__":
    main()
