"""Where a sweep's points run: in this process (``serial``), in local worker processes (``joblib``, loky backend),
or on a Dask cluster (``dask``, any scheduler address ``distributed.Client`` accepts). Each returns the points'
``(grid position, row)`` pairs in any order, with ``progress(done, total)`` called as points finish; the sweep sorts
them by position, so its DataFrame is the same whichever ran it.

Dask is optional (the ``dask`` extra): ``distributed`` is imported only when a scheduler is given. Its workers need
plansim installed; the points carry their model and node type, so model and hardware files need not be on them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from plansim.errors import PlansimError, quoted, shown
from plansim.sweep.grid import Point
from plansim.sweep.point import SweepSettings, run_point

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DASK_MISSING",
    "Progress",
    "Row",
    "check_scheduler",
    "run_dask",
    "run_joblib",
    "run_serial",
]

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


#: How long a sweep waits to reach its Dask scheduler before it gives up (seconds). A scheduler on the same network
#: accepts a connection in milliseconds; Dask's own default (``distributed.comm.timeouts.connect``, 30 s) would
#: keep a mistyped address waiting half a minute.
CONNECT_TIMEOUT_S = 5.0


def run_dask(
    points: Sequence[Point],
    settings: SweepSettings,
    scheduler: Any,
    progress: Progress | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
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


def check_scheduler(scheduler: object) -> str:
    """``scheduler`` as a Dask address (``tcp://HOST:PORT``, ``HOST:PORT``, ``tls://``, ``ws://``, ``wss://``,
    ``ucx://``, ``inproc://``), checked before any connection: a ``PlansimError`` naming the fix otherwise.

    >>> check_scheduler("10.0.0.5:8786")
    '10.0.0.5:8786'
    >>> check_scheduler("not an address")
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: --scheduler 'not an address': not a Dask scheduler address: give \
tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786
    """
    example = "give tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786"
    if not isinstance(scheduler, str):
        raise PlansimError(f"--scheduler: expected an address such as tcp://10.0.0.5:8786, got {quoted(scheduler)}")
    address = scheduler.strip()
    if not address:
        raise PlansimError(f"--scheduler: empty address: {example}")
    scheme, _, location = address.rpartition("://") if "://" in address else ("tcp", "", address)
    if scheme not in _SCHEMES:
        raise PlansimError(
            f"--scheduler {quoted(scheduler)}: unknown protocol {quoted(scheme)}: use one of {', '.join(_SCHEMES)}"
        )
    if scheme == "inproc":
        return address
    host, _, port = location.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or any(c.isspace() or c in "/@" for c in host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise PlansimError(f"--scheduler {quoted(scheduler)}: not a Dask scheduler address: {example}")
    return address


#: The protocols ``distributed`` connects over (``distributed.comm.registry.backends``).
_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx", "inproc")


def _client(distributed: Any, scheduler: Any, timeout_s: float) -> tuple[Any, bool]:
    """A client of ``scheduler`` and whether this call opened it (and so closes it). An address is checked first
    (``check_scheduler``); a client that fails to connect is closed here, at once, so that nothing waits for it at
    exit (``Client.__del__`` would wait up to twice the timeout and print its own traceback)."""
    if not isinstance(scheduler, str):
        return scheduler, False
    address = check_scheduler(scheduler)
    client = distributed.Client.__new__(distributed.Client)
    try:
        client.__init__(address, timeout=timeout_s, set_as_default=False)
    except (OSError, TimeoutError, ValueError, TypeError) as err:
        _abandon(client)
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        if isinstance(err, TypeError):  # distributed's words when TLS has no certificate configured
            why = "no TLS certificate in Dask's configuration, distributed.comm.tls"
        raise PlansimError(
            f"--scheduler {shown(scheduler)}: cannot reach a Dask scheduler there ({shown(why, 120)}): check the "
            "address, e.g. tcp://10.0.0.5:8786, and that `dask scheduler` runs"
        ) from None
    return client, True


def _abandon(client: Any) -> None:
    """Stop a client whose connection failed, without the close handshake its ``__del__`` would wait for."""
    with contextlib.suppress(Exception):
        client.status = "closed"
        client._loop_runner.stop()
