"""Sweeps: one planner run per point of a grid (models x hardware x GPU counts x global batches), as one DataFrame.

``sweep(grid)`` plans every point (``point.run_point``: ``plansim.planner.plan`` with ``SweepSettings``) in this
process, in ``jobs`` local processes (joblib) or on a Dask cluster (``scheduler``), and returns a ``Sweep`` whose
``frame()`` is identical whichever executor ran it (rows in grid order, no timings in them). ``plansim sweep``
prints it and writes it (``sweep.output``) with its scaling charts (``report.sweep_charts``).

The default per-point settings use the analytic engine only (see ``point``'s docstring for why and what it costs);
``benchmarks/bench_sweep.py`` measures runs per second for each executor.
"""

from plansim.sweep.run import (
    COLUMNS,
    Point,
    Sweep,
    SweepGrid,
    SweepSettings,
    grid_from_options,
    load_grid,
    parse_grid,
    run_point,
    sweep,
)

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
