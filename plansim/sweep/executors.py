"""Where a sweep's points run: in this process (``serial``), in local worker processes (``joblib``, loky backend),
or on a Dask cluster (``dask``, any scheduler address ``distributed.Client`` accepts). Each returns the points'
``(grid position, row)`` pairs in any order, with ``progress(done, total)`` called as points finish; the sweep sorts
them by position, so its DataFrame is the same whichever ran it.

Dask is optional (the ``dask`` extra): ``distributed`` is imported only when a scheduler is given. Its workers need
plansim installed; the points carry their model and node type, so model and hardware files need not be on them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from plansim.errors import PlansimError
from plansim.sweep.grid import Point
from plansim.sweep.point import SweepSettings, run_point

__all__ = ["DASK_MISSING", "Progress", "Row", "run_dask", "run_joblib", "run_serial"]

#: ``progress(done, total)``: points finished so far, of all.
Progress = Callable[[int, int], None]
#: A point's grid position and its row.
Row = tuple[int, dict[str, Any]]

DASK_MISSING = "--scheduler needs Dask, which is not installed: pip install 'plansim[dask]'"


def run_serial(points: Sequence[Point], settings: SweepSettings, progress: Progress | None = None) -> list[Row]:
    """Every point in this process, one after another."""
    rows = []
    for point in points:
        rows.append(run_point(point, settings))
        if progress:
            progress(len(rows), len(points))
    return rows


def run_joblib(
    points: Sequence[Point], settings: SweepSettings, jobs: int, progress: Progress | None = None
) -> list[Row]:
    """The points in ``jobs`` local worker processes (joblib's loky backend), one planner run per task."""
    from joblib import Parallel, delayed

    parallel = Parallel(n_jobs=jobs, backend="loky", return_as="generator")
    rows = []
    for row in parallel(delayed(run_point)(point, settings) for point in points):
        rows.append(row)
        if progress:
            progress(len(rows), len(points))
    return rows


def run_dask(
    points: Sequence[Point],
    settings: SweepSettings,
    scheduler: Any,
    progress: Progress | None = None,
    connect_timeout_s: float = 30.0,
) -> list[Row]:
    """The points as tasks on the Dask cluster at ``scheduler`` (an address such as ``tcp://10.0.0.5:8786``, or a
    ``distributed.Client`` already connected), one planner run per task, collected as they complete."""
    distributed = _distributed()
    client, owned = _client(distributed, scheduler, connect_timeout_s)
    try:
        futures = client.map(run_point, list(points), settings=settings, pure=False)
        rows = []
        for future in distributed.as_completed(futures, loop=client.loop):
            rows.append(future.result())
            if progress:
                progress(len(rows), len(points))
        return rows
    finally:
        if owned:
            client.close()


def _distributed() -> Any:
    """The ``distributed`` module, or the one-line error that says how to install it."""
    try:
        import distributed
    except ImportError:
        raise PlansimError(DASK_MISSING) from None
    return distributed


def _client(distributed: Any, scheduler: Any, timeout_s: float) -> tuple[Any, bool]:
    """A client of ``scheduler`` and whether this call opened it (and so closes it)."""
    if not isinstance(scheduler, str):
        return scheduler, False
    try:
        return distributed.Client(scheduler, timeout=timeout_s, set_as_default=False), True
    except (OSError, TimeoutError, ValueError) as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PlansimError(
            f"--scheduler {scheduler}: cannot reach a Dask scheduler there ({why}): check the address, "
            "e.g. tcp://10.0.0.5:8786, and that `dask scheduler` runs"
        ) from None
