"""Predicted against measured: one row per configuration, each error signed, and the summary (mean absolute
percentage error, MAPE = mean |predicted - measured| / measured; Hyndman & Koehler 2006, sec 3.3, "percentage
errors"), read against the issue's targets (step time 10 %, peak memory 5 %).

>>> frame = validation_frame([
...     {"config": "a", "predicted_step_time_s": 1.1, "measured_step_time_s": 1.0,
...      "predicted_peak_memory_bytes": 95, "measured_peak_memory_bytes": 100},
...     {"config": "b", "predicted_step_time_s": 0.9, "measured_step_time_s": 1.0,
...      "predicted_peak_memory_bytes": 100, "measured_peak_memory_bytes": 100}])
>>> [round(x, 3) for x in frame["step_time_error"]], round(summarize(frame).step_time_mape, 3)
([0.1, -0.1], 0.1)
>>> summarize(frame).peak_memory_max_abs_error
0.05
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

__all__ = ["REQUIRED_COLUMNS", "TARGETS", "Summary", "relative_error", "summarize", "validation_frame"]

REQUIRED_COLUMNS = (
    "predicted_step_time_s",
    "measured_step_time_s",
    "predicted_peak_memory_bytes",
    "measured_peak_memory_bytes",
)
#: The issue's bounds: step-time MAPE and the largest peak-memory error (aims: 5 % and 3 %).
TARGETS = {"step_time_mape": 0.10, "peak_memory_max_abs_error": 0.05}


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured: positive when plansim predicts too much.

    >>> relative_error(90.0, 100.0)
    -0.1
    """
    return (predicted - measured) / measured if measured else float("nan")


def validation_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The rows with ``step_time_error`` and ``peak_memory_error`` (signed, relative to the measurement) added."""
    frame = pd.DataFrame(list(rows))
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"validation rows lack {', '.join(missing)}")
    frame["step_time_error"] = [
        relative_error(p, m) for p, m in zip(frame.predicted_step_time_s, frame.measured_step_time_s, strict=True)
    ]
    frame["peak_memory_error"] = [
        relative_error(p, m)
        for p, m in zip(frame.predicted_peak_memory_bytes, frame.measured_peak_memory_bytes, strict=True)
    ]
    return frame


@dataclass(frozen=True)
class Summary:
    """MAPE and the worst error of each figure, over ``configs`` rows, and whether the targets hold."""

    configs: int
    step_time_mape: float
    step_time_max_abs_error: float
    peak_memory_mape: float
    peak_memory_max_abs_error: float

    @property
    def meets_targets(self) -> bool:
        """Step-time MAPE within 10 % and every peak-memory error within 5 %."""
        slack = 1e-12  # a bound met exactly stays met through the rounding of (p - m) / m
        return (
            self.step_time_mape <= TARGETS["step_time_mape"] + slack
            and self.peak_memory_max_abs_error <= TARGETS["peak_memory_max_abs_error"] + slack
        )

    def to_dict(self) -> dict[str, Any]:
        """The figures, the targets and the verdict."""
        return {**asdict(self), "targets": dict(TARGETS), "meets_targets": self.meets_targets}


def summarize(frame: pd.DataFrame) -> Summary:
    """MAPE and worst absolute error of step time and of peak memory over the frame's rows."""
    step, memory = frame["step_time_error"].abs(), frame["peak_memory_error"].abs()
    return Summary(
        configs=len(frame),
        step_time_mape=float(step.mean()),
        step_time_max_abs_error=float(step.max()),
        peak_memory_mape=float(memory.mean()),
        peak_memory_max_abs_error=float(memory.max()),
    )
