"""The planner: ``plan()`` and what it returns (``planning.py``), the search space, pricing and explanation."""

from plansim.planner.planning import *  # noqa: F403  (its public names, listed once in its __all__)
from plansim.planner.planning import __all__ as __all__
