"""``plansim sweep``: ``sweep()`` over a grid of points (``run.py``), their executors and output."""

from plansim.sweep.run import *  # noqa: F403  (its public names, listed once in its __all__)
from plansim.sweep.run import __all__ as __all__
