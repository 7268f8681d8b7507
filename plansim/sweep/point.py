"""One sweep point: a planner run (``plansim.planner.plan``) and the row it becomes; the rows as one DataFrame.

A row holds the point's inputs (its ``seq_len``: the length priced, the model's own unless the grid gives one), the
winner's strategy and figures (step time, tokens/s, MFU, peak memory against
capacity, which engine produced the figures), how many candidates were priced and how many fit, and, when nothing
fits or the point cannot run, the reason. Rows carry no timing, so a sweep's DataFrame depends on its grid and
settings alone, not on the executor.

Per-point settings default to the analytic engine (``des=False, milp=False``), with the finalists' time-balanced
layer splits (``splits=True``: priced for the ten finalists only), so that a grid of hundreds of points runs in
minutes on two cores and the same rows come back on any executor. Measured on this project's 2-core machine with
``sweep(grid, settings)``: a point's full search prices 2,600-21,600 candidates (GPT-3 125M and 350M on 8-128 GPUs)
in 0.2-1.8 s, and the 200 points of benchmarks/bench_sweep.py take 157 s serially. Re-simulating each point's top 10
with the discrete-event engine (``des=True``, ``--des``: finalists ranked as ``plansim plan`` ranks them) multiplied
the time per point by 1.6 (GPT-3 125M/350M on 8 and 64 A100s, batch 64 and 512: 0.81 -> 1.33 s) to 2.2 (GPT-3 6.7B
and Llama 2 7B on 8 and 32 A100s, batch 256: 1.11 -> 2.45 s). ``milp=True`` solves the finalists' ``remat: milp``
under a time limit per stage, so its answer can depend on the machine's speed and load: rows are reproducible across
executors only without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plansim.arguments import choice, flag
from plansim.describe import describe
from plansim.errors import PlansimError
from plansim.hardware import resize
from plansim.limits import number, whole
from plansim.planner import Constraints, plan
from plansim.planner.search import OBJECTIVES
from plansim.step.result import THIN_MARGIN
from plansim.sweep.grid import Point
from plansim.workload.families import FAMILIES

__all__ = ["COLUMNS", "SweepSettings", "rows_frame", "run_point"]


@dataclass(frozen=True)
class SweepSettings:
    """The planner's settings at every point (see the module docstring for the defaults' reason)."""

    des: bool = False
    milp: bool = False
    splits: bool = True
    top_k: int = 10
    objective: str = "step_time"
    #: the fraction of GPU memory each point's plan must leave free at its peak (``Constraints.headroom``)
    headroom: float = THIN_MARGIN

    def __post_init__(self) -> None:
        for name in ("des", "milp", "splits"):
            flag(getattr(self, name), f"--{name}")
        whole(self.top_k, "top_k", "--top")
        choice(self.objective, OBJECTIVES, "--objective")
        object.__setattr__(self, "headroom", number(self.headroom, "headroom", "--headroom"))
        if self.objective == "cost":  # a point's plan fixes its GPUs and batch: GPU-hours per token order as step time
            raise PlansimError(
                "--objective cost: a sweep has no price per GPU-hour, and within a point cost ranks as step_time: "
                "use --objective step_time, or plansim plan --objective cost --price-per-gpu-hour PRICE"
            )

    def as_dict(self) -> dict[str, Any]:
        """The settings as plain data."""
        return {"des": self.des, "milp": self.milp, "splits": self.splits, "top_k": self.top_k,
                "objective": self.objective, "headroom": self.headroom}  # fmt: skip


#: Column -> pandas dtype of the sweep's DataFrame, in order. Nullable dtypes (``Int64``, ``boolean``) keep whole
#: numbers whole where some rows have no winner.
COLUMNS: dict[str, str] = {
    "model": "object",
    "hardware": "object",
    "gpus": "int64",
    "global_batch": "int64",
    "seq_len": "Int64",
    "fits": "bool",
    "strategy": "object",
    "dp": "Int64",
    "tp": "Int64",
    "pp": "Int64",
    "cp": "Int64",
    "micro_batch": "Int64",
    "num_microbatches": "Int64",
    "schedule": "object",
    "virtual_stages": "Int64",
    "layer_split": "object",
    "zero": "Int64",
    "sequence_parallel": "boolean",
    "remat": "object",
    "dp_algorithm": "object",
    "engine": "object",
    "step_time_s": "float64",
    "tokens_per_s": "float64",
    "mfu": "float64",
    "hfu": "float64",
    "model_tflops_per_gpu": "float64",
    "peak_memory_bytes": "float64",
    "memory_capacity_bytes": "float64",
    "candidates": "int64",
    "fitting": "int64",
    "reason": "object",
}

_STRATEGY = ("dp", "tp", "pp", "cp", "micro_batch", "schedule", "virtual_stages", "zero", "sequence_parallel", "remat",
             "dp_algorithm")  # fmt: skip


def run_point(point: Point, settings: SweepSettings) -> tuple[int, dict[str, Any]]:
    """Plan ``point`` with ``settings``; returns its grid position and its row (every key of ``COLUMNS``).

    >>> from plansim.sweep.grid import SweepGrid
    >>> fits, cannot = SweepGrid(("gpt3-125m",), ("dgx-a100",), (8, 12), (64,)).points()
    >>> index, row = run_point(fits, SweepSettings())
    >>> index, row["fits"], row["engine"], row["dp"] * row["tp"] * row["pp"], row["reason"]
    (0, True, 'analytic', 8, '')
    >>> run_point(cannot, SweepSettings())[1]["reason"]
    'dgx-a100 has 8 GPUs per node: gpus=12 is not a whole number of nodes (use a multiple of 8, or at most 8)'
    """
    row: dict[str, Any] = {
        "model": point.model.name,
        "hardware": point.node.name,
        "gpus": point.gpus,
        "global_batch": point.global_batch,
        "seq_len": _priced_length(point),
        "memory_capacity_bytes": point.node.gpu.memory_bytes,
    }
    try:
        cluster = resize(point.node, point.gpus)
        result = plan(
            point.model, cluster, global_batch=point.global_batch, objective=settings.objective,
            top_k=settings.top_k, des=settings.des, milp=settings.milp, splits=settings.splits,
            constraints=Constraints(headroom=settings.headroom), jobs=1,  # the sweep runs its points side by side
            seq_len=point.seq_len,
        )  # fmt: skip
    except PlansimError as err:
        return point.index, _complete({**row, "fits": False, "candidates": 0, "fitting": 0, "reason": str(err)})
    row.update(candidates=result.outcome.candidates, fitting=result.outcome.fit_count)
    winner, figures = result.winner, result.winner_result
    if winner is None or figures is None:
        return point.index, _complete({**row, "fits": False, "reason": result.explanation})
    row.update({k: getattr(winner, k) for k in _STRATEGY})
    row.update(
        fits=True,
        strategy=describe(winner),
        num_microbatches=winner.num_microbatches,
        layer_split=None if winner.layer_split is None else "/".join(map(str, winner.layer_split)),
        engine=figures.engine,
        step_time_s=figures.step_time_s,
        tokens_per_s=figures.tokens_per_s,
        mfu=figures.mfu,
        hfu=figures.hfu,
        model_tflops_per_gpu=figures.model_tflops_per_gpu,
        peak_memory_bytes=figures.peak_memory_bytes,
        reason="",
    )
    return point.index, _complete(row)


def _priced_length(point: Point) -> int | None:
    """The row's ``seq_len``: the point's length, else its model's own; None for a model without sequences (cnn)."""
    if point.seq_len is not None:
        return point.seq_len
    return point.model.seq_len if FAMILIES[point.model.family].uses("seq_len") else None


def _complete(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with every column, in ``COLUMNS`` order (None where the point has no value)."""
    return {k: row.get(k) for k in COLUMNS}


def rows_frame(rows: Sequence[tuple[int, dict[str, Any]]]) -> Any:
    """The rows as one DataFrame in grid order (sorted by position, whatever order they arrived in), with the
    dtypes of ``COLUMNS``."""
    import pandas as pd

    ordered = [row for _, row in sorted(rows, key=lambda item: item[0])]
    frame = pd.DataFrame(ordered, columns=list(COLUMNS))
    return frame.astype(COLUMNS)
