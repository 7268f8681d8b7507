"""plansim: a parallelism-strategy simulator and cost-model planner for distributed deep-learning training.

The public API; names load on first use so that ``import plansim`` (and ``plansim --help``) stays quick.

>>> import plansim
>>> plansim.load_model("gpt3-175b").layers
96
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "simulate": "plansim.api",
    "ENGINES": "plansim.api",
    "load_model": "plansim.workload",
    "list_models": "plansim.workload",
    "ModelSpec": "plansim.workload",
    "from_hf_config": "plansim.workload",
    "trace_module": "plansim.workload",
    "load_hardware": "plansim.hardware",
    "list_hardware": "plansim.hardware",
    "Cluster": "plansim.hardware",
    "Strategy": "plansim.strategy.schema",
    "load_strategy": "plansim.strategy.schema",
    "Result": "plansim.result",
    "PlansimError": "plansim.errors",
    "plan": "plansim.planner",
    "Constraints": "plansim.planner",
    "PlanResult": "plansim.planner",
    "solve_remat": "plansim.remat",
    "compare": "plansim.comparison.compare",
    "Comparison": "plansim.comparison.compare",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'plansim' has no attribute '{name}'")


def __dir__() -> list[str]:
    return __all__
