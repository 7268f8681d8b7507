"""Rematerialization: which activations to keep and which to recompute, per pipeline stage.

The Checkmate MILP (``checkmate``) and the practitioners' baselines (``baselines``) schedule a ``RematGraph``
(``graph``; built from a stage's transformer blocks by ``stage``) within a memory budget and return one result type
(``result``) holding an executable schedule that ``schedule.replay`` checks. ``solve_remat`` picks a method by name;
a time limit is one wall-clock ``Deadline`` for the whole solve.
"""

from plansim.remat.baselines import BASELINES, run_baseline
from plansim.remat.deadline import Deadline
from plansim.remat.graph import RematGraph, RematNode, linear_chain, training_graph
from plansim.remat.result import RematResult, SolverReport
from plansim.remat.schedule import InvalidSchedule, Op, Replay, Schedule, replay, schedule_from_plan
from plansim.remat.solve import METHODS, solve_remat, tradeoff
from plansim.remat.stage import GRANULARITIES, stage_graph

__all__ = [
    "BASELINES",
    "GRANULARITIES",
    "METHODS",
    "Deadline",
    "InvalidSchedule",
    "Op",
    "RematGraph",
    "RematNode",
    "RematResult",
    "Replay",
    "Schedule",
    "SolverReport",
    "linear_chain",
    "replay",
    "run_baseline",
    "schedule_from_plan",
    "solve_remat",
    "stage_graph",
    "tradeoff",
    "training_graph",
]
