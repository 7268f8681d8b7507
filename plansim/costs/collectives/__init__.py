"""Collective algorithms as schedules of point-to-point transfers: the registry (``registry.py``) and its names."""

from plansim.costs.collectives.registry import *  # noqa: F403  (its public names, listed once in its __all__)
from plansim.costs.collectives.registry import __all__ as __all__
