"""The analytic engine: one training step in closed form."""

from plansim.analytic.assemble import StepFrame, assemble_result
from plansim.analytic.cache import AnalyticCache
from plansim.analytic.engine import simulate_analytic, step_frame

__all__ = ["AnalyticCache", "StepFrame", "assemble_result", "simulate_analytic", "step_frame"]
