"""Validation of plansim's predictions against real training steps (``plansim validate``).

``points`` holds the configurations, ``train`` runs them in PyTorch (the ``torch`` extra), ``predict`` asks plansim
for the same ones, ``compare`` computes the errors and MAPE, ``run`` ties them together and ``report`` writes the
CSV, chart and summary. Everything but ``train`` works without torch, so measurements taken on a GPU machine can be
compared anywhere.
"""

from plansim.validation.compare import REQUIRED_COLUMNS, Summary, summarize, validation_frame
from plansim.validation.points import ValidationPoint, default_points, point
from plansim.validation.run import measure, repredict

__all__ = [
    "REQUIRED_COLUMNS",
    "Summary",
    "ValidationPoint",
    "default_points",
    "measure",
    "point",
    "repredict",
    "summarize",
    "validation_frame",
]
