"""The analytic engine: one training step in closed form."""

from plansim.analytic.cache import AnalyticCache
from plansim.analytic.engine import simulate_analytic

__all__ = ["AnalyticCache", "simulate_analytic"]
