"""Pausing Python's cyclic garbage collector around bulk work.

A planner pass or a large simulation allocates millions of long-lived objects (results, tasks, events, spans). The
collections their allocation triggers re-scan every tracked object each time, which cost a fifth to a third of the
run time on the planner's benchmark (benchmarks/bench_plan.py). Reference counting still frees what is dropped
while paused; only reference cycles wait for the collector, which runs again once the pause ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector within the block (nested pauses are fine: the outermost restores it).

    >>> import gc
    >>> with gc_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
