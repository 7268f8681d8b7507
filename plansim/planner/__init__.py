"""The planner: search every placement of a model on a cluster at a global batch, explain the choice.

``plan`` enumerates the space (``space``), prices it with the analytic engine and re-simulates the finalists with
the discrete-event engine (``search``), and words the outcome (``explain``). The CLI's ``plansim plan`` prints what
it returns.
"""

from plansim.planner.planning import (
    Constraints,
    PlanResult,
    TrainingCost,
    plan,
    training_cost,
)

__all__ = ["Constraints", "PlanResult", "TrainingCost", "plan", "training_cost"]
