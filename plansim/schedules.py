"""Pipeline schedules in closed form: step time from per-stage times, and micro-batches in flight per stage.

Registry keyed by name, so the CLI's choices come from here. The discrete-event simulator (later) runs the same
schedules task by task; where stages are equal both must agree with these closed forms.

Sources: GPipe (Huang et al. 2019, sec 2.3): bubble (p-1)/(m+p-1). 1F1B / PipeDream-Flush (Narayanan et al. 2021,
sec 2.2.1): same bubble, at most p micro-batches in flight on the first stage. Interleaved 1F1B (Narayanan et al.
2021, sec 2.2.2): bubble divided by v; in-flight count from Megatron-LM's warm-up rule, which gives Korthikanti et
al. 2022 (sec 4.2.3) first-stage activation factor (1 + (p-1)/(p v)).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["SCHEDULES", "PipelineSchedule", "get_schedule"]


@dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline schedule's closed forms.

    ``step_time(stage_times, m, v)`` is the pipeline's wall time for ``m`` micro-batches when stage ``s`` spends
    ``stage_times[s]`` (forward + backward of one micro-batch over all its chunks). ``in_flight(stage, p, m, v)``
    is how many micro-batches' activations that stage holds at its peak, in units of the stage's full layer set.
    ``ends_in_flight(p, m, v)`` is (first chunk of stage 0, last chunk of the last stage): how many micro-batches
    the input embedding and the output layer hold.
    """

    name: str
    step_time: Callable[[Sequence[float], int, int], float]
    in_flight: Callable[[int, int, int, int], float]
    ends_in_flight: Callable[[int, int, int], tuple[float, float]]
    description: str

    def sends_per_microbatch(self, stage: int, p: int, v: int) -> tuple[int, int]:
        """(forward, backward) activation sends of one micro-batch from ``stage``.

        Every chunk boundary sends once forward and once backward; with v chunks per stage the last stage's last
        chunk has no forward send and the first stage's first chunk no backward send (the others wrap around).
        """
        if p <= 1:
            return 0, 0
        return v - (stage == p - 1), v - (stage == 0)


def _flush_step_time(stage_times: Sequence[float], m: int, v: int = 1) -> float:
    """(m-1) * slowest stage + sum of stages; equals (m+p-1) t for p equal stages (GPipe sec 2.3)."""
    return (m - 1) * max(stage_times) + sum(stage_times)


def _interleaved_step_time(stage_times: Sequence[float], m: int, v: int) -> float:
    """m * slowest + the fill/drain of the other stages shortened by v: (m + (p-1)/v) t for equal stages."""
    slowest = max(stage_times)
    return m * slowest + (sum(stage_times) - slowest) / v


def _gpipe_in_flight(stage: int, p: int, m: int, v: int = 1) -> float:
    """GPipe runs every forward before any backward: all m micro-batches are held."""
    return float(m)


def _one_f_one_b_in_flight(stage: int, p: int, m: int, v: int = 1) -> float:
    """1F1B: stage s warms up with p-s-1 forwards, then holds at most p-s micro-batches (capped by m)."""
    return float(min(p - stage, m))


def _interleaved_in_flight(stage: int, p: int, m: int, v: int) -> float:
    """Megatron-LM's warm-up: (p-s-1)*2 + (v-1)*p chunks before the first backward, plus the one in flight.

    Each chunk is 1/v of the stage's layers, so stage 0 holds p(1 + (p-1)/(p v)) micro-batches' worth, as in
    Korthikanti et al. 2022 sec 4.2.3.
    """
    chunks = min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
    return chunks / v


def _gpipe_ends(p: int, m: int, v: int = 1) -> tuple[float, float]:
    return float(m), float(m)


def _one_f_one_b_ends(p: int, m: int, v: int = 1) -> tuple[float, float]:
    return float(min(p, m)), 1.0


def _interleaved_ends(p: int, m: int, v: int) -> tuple[float, float]:
    """Stage 0's first chunk runs p forwards, and p-1 more before its first backward; the last chunk is 1F1B."""
    return float(min(2 * p - 1, m)), 1.0


SCHEDULES: dict[str, PipelineSchedule] = {
    s.name: s
    for s in (
        PipelineSchedule("gpipe", _flush_step_time, _gpipe_in_flight, _gpipe_ends, "all forwards, then all backwards"),
        PipelineSchedule(
            "1f1b",
            _flush_step_time,
            _one_f_one_b_in_flight,
            _one_f_one_b_ends,
            "one forward, one backward (PipeDream-Flush)",
        ),
        PipelineSchedule(
            "interleaved",
            _interleaved_step_time,
            _interleaved_in_flight,
            _interleaved_ends,
            "1F1B over v model chunks per stage (Megatron-LM)",
        ),
    )
}


def get_schedule(name: str) -> PipelineSchedule:
    """The schedule called ``name``.

    >>> s = get_schedule("1f1b")
    >>> s.step_time([1.0] * 4, 8, 1)        # (m + p - 1) t
    11.0
    >>> round(get_schedule("interleaved").step_time([1.0] * 4, 8, 3), 6)   # (m + (p-1)/v) t
    9.0
    """
    return SCHEDULES[name]
