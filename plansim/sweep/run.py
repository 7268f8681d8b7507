"""Sweeps: one planner run per point of a grid (models x hardware x GPU counts x global batches, and optionally x
sequence lengths), as one DataFrame.

``sweep(grid)`` plans every point (``point.run_point``: ``plansim.planner.plan`` with ``SweepSettings``) in this
process, in ``jobs`` local processes (joblib) or on a Dask cluster (``scheduler``), and returns a ``Sweep`` whose
``frame()`` is identical whichever executor ran it (rows in grid order, no timings in them). ``plansim sweep``
prints it and writes it (``sweep.output``) with its scaling charts (``report.sweep_charts``).

The default per-point settings use the analytic engine only (see ``point``'s docstring for why and what it costs);
``benchmarks/bench_sweep.py`` measures runs per second for each executor.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plansim.arguments import callback, type_name
from plansim.errors import PlansimError
from plansim.hardware import resize
from plansim.limits import refuse_work, whole, work_bound
from plansim.planner.space import search_work
from plansim.sweep.executors import Progress, check_scheduler, run_dask, run_joblib, run_serial
from plansim.sweep.grid import Point, SweepGrid, grid_from_options, load_grid, parse_grid
from plansim.sweep.point import COLUMNS, SweepSettings, rows_frame, run_point
from plansim.workload import with_seq_len

__all__ = [
    "COLUMNS",
    "Point",
    "Sweep",
    "SweepGrid",
    "SweepSettings",
    "grid_from_options",
    "load_grid",
    "parse_grid",
    "run_point",
    "sweep",
]


@dataclass(frozen=True)
class Sweep:
    """A finished sweep: the grid, the settings, the rows (``frame()``), which executor ran it and how long it took
    (wall time; not part of the rows)."""

    grid: SweepGrid
    settings: SweepSettings
    table: Any
    executor: str
    elapsed_s: float

    def frame(self) -> Any:
        """The rows as a pandas DataFrame (a copy), in grid order, with the columns of ``COLUMNS``."""
        return self.table.copy()

    @property
    def runs_per_s(self) -> float:
        """Planner runs per second of wall time."""
        return len(self.table) / max(self.elapsed_s, 1e-12)


def sweep(
    grid: SweepGrid,
    settings: SweepSettings | None = None,
    *,
    jobs: int = 1,
    scheduler: Any = None,
    progress: Progress | None = None,
    seq_len: int | None = None,
) -> Sweep:
    """Plan every point of ``grid``: serially (``jobs=1``), in ``jobs`` local processes, or on the Dask cluster at
    ``scheduler`` (an address, or a connected ``distributed.Client``); ``progress(done, total)`` as points finish.
    ``seq_len`` prices every model at that many tokens per sequence (``SweepGrid.at_seq_len``; a grid's
    ``seq_lens`` sweep several).

    Raises ``PlansimError`` (the CLI's one-line message) for a bad argument, before any point runs.

    Examples
    --------
    >>> grid = SweepGrid(("gpt3-125m",), ("dgx-a100",), (8, 16), (64,))
    >>> s = sweep(grid)
    >>> list(s.frame()["gpus"]), bool(s.frame()["fits"].all()), s.executor
    ([8, 16], True, 'serial')
    """
    if not isinstance(grid, SweepGrid):
        raise PlansimError(f"grid: expected a SweepGrid (or plansim.sweep.parse_grid/load_grid), got {type_name(grid)}")
    if settings is not None and not isinstance(settings, SweepSettings):
        raise PlansimError(f"settings: expected SweepSettings(...) or None, got {type_name(settings)}")
    settings = settings or SweepSettings()
    grid = grid.at_seq_len(seq_len)
    jobs = whole(jobs, "jobs", "--jobs")
    callback(progress, "progress")
    if scheduler is not None and jobs > 1:
        raise PlansimError("--jobs and --scheduler: give one (on a Dask cluster its workers set the parallelism)")
    if isinstance(scheduler, str):
        check_scheduler(scheduler)  # before any point runs or any connection is tried
    elif scheduler is not None and not callable(getattr(scheduler, "map", None)):
        raise PlansimError(
            f"scheduler: expected an address such as tcp://10.0.0.5:8786 or a distributed.Client, got "
            f"{type_name(scheduler)}"
        )
    subject = f"sweep of {grid.describe()}"
    refuse_work("sweep_points", len(grid), subject, "give fewer values per dimension")  # before loading any
    points = grid.points()
    _refuse_blocks(points, subject)
    began = time.perf_counter()
    if scheduler is not None:
        rows = run_dask(points, settings, scheduler, progress)
        executor = f"dask ({scheduler if isinstance(scheduler, str) else 'client'})"
    elif jobs > 1:
        rows = run_joblib(points, settings, jobs, progress)
        executor = f"joblib ({jobs} processes)"
    else:
        rows = run_serial(points, settings, progress)
        executor = "serial"
    elapsed = time.perf_counter() - began
    return Sweep(grid, settings, rows_frame(rows), executor, elapsed)


def _refuse_blocks(points: Sequence[Point], subject: str) -> None:
    """A ``PlansimError`` before any point runs when the points' searches walk more blocks together
    (``planner.space.search_work``, counted point by point until the bound is passed) than
    ``PLANSIM_MAX_SWEEP_BLOCKS``; a point that cannot run counts nothing (its row says why)."""
    bound, total = work_bound("sweep_blocks"), 0
    for point in points:
        try:
            model = with_seq_len(point.model, point.seq_len)
            total += search_work(model, resize(point.node, point.gpus), point.global_batch).block_walks
        except PlansimError:
            continue
        if total > bound:
            break
    refuse_work(
        "sweep_blocks", total, subject, "give fewer or smaller points (GPU counts and batches with fewer divisors)"
    )
