"""Pipeline schedules in closed form: step time from per-stage times, and micro-batches in flight per stage.

The registry (``SCHEDULES``: gpipe, 1f1b, interleaved, zb-h1) is the one list of names: the CLI's choices and
``Strategy``'s check come from it, and what is particular to a schedule is its entry's (``split_backward``: separate
weight-gradient passes; ``model_chunks``: virtual stages under Megatron-LM's rules; ``held``: where a stage's memory
can peak). The discrete-event engine runs the same schedules task by task; where stages are equal both agree with
these closed forms. Where an uneven ``layer_split`` makes an interleaved stage's model chunks unequal, the closed
form (each stage's mean chunk) is not exact (off by up to a few per cent at m = 2p-4p, above or below), and the
analytic engine runs the order pass by pass instead (``PipelineSchedule.run_time``).

Sources: GPipe (Huang et al. 2019, sec 2.3): bubble (p-1)/(m+p-1). 1F1B / PipeDream-Flush (Narayanan et al. 2021,
sec 2.2.1): same bubble, at most p micro-batches in flight on the first stage. Interleaved 1F1B (Narayanan et al.
2021, sec 2.2.2): bubble divided by v; in-flight count from Megatron-LM's warm-up rule, which gives Korthikanti et
al. 2022 (sec 4.2.3) first-stage activation factor (1 + (p-1)/(p v)). ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", ICLR 2024, sec 2.1): 1F1B with backward split into input and weight gradients; bubble
(p-1)(T_F + T_B - T_W) for equal stages (see ``_zb_h1_step_time`` for the derivation and its conditions).

Each schedule also names the order in which one stage runs its passes (``plansim.pipeline.orders``), which the
discrete-event engine follows; ``tests/test_schedules.py`` runs those orders and checks them against these closed
forms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from plansim.pipeline.orders import (
    Pass,
    PipeOp,
    Run,
    gpipe_order,
    gpipe_runs,
    interleaved_order,
    interleaved_passes,
    one_f_one_b_order,
    one_f_one_b_runs,
    zb_h1_order,
    zb_h1_runs,
)

__all__ = ["SCHEDULES", "HeldPoint", "PipelineSchedule", "StepTime", "get_schedule"]


class StepTime(Protocol):
    """``(stage_times, m, v, weight_times=None) -> seconds``: see :class:`PipelineSchedule`."""

    def __call__(
        self, stage_times: Sequence[float], m: int, v: int, weight_times: Sequence[float] | None = None
    ) -> float: ...


@dataclass(frozen=True)
class HeldPoint:
    """What a stage holds at one point of its order where its activations can peak.

    ``stored``: micro-batches whose forward has run and whose backward (B) has not, each holding all it stored;
    ``weight``: micro-batches whose B has run and whose W (split schedules) has not, each holding only what W needs.
    ``after_backward``: the point is the end of a B pass, whose micro-batch is counted in ``weight`` (its last layer's
    working set still live); otherwise it is the start of a B pass (or the end of a forward), as 1F1B's peak.
    """

    stored: float
    weight: float
    after_backward: bool = False


@dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline schedule's closed forms and its per-stage order of passes.

    ``step_time(stage_times, m, v, weight_times=None)`` is the pipeline's wall time for ``m`` micro-batches when
    stage ``s`` spends ``stage_times[s]`` (forward + backward of one micro-batch over all its chunks);
    ``weight_times[s]`` is the weight-gradient part of that backward, which only schedules that split the backward
    (``split_backward``) use. ``in_flight(stage, p, m, v)`` is how many micro-batches' activations that stage holds
    at its peak (forwards run whose backward has not), in units of the stage's full layer set.
    ``ends_in_flight(p, m, v)`` is (first chunk of stage 0, last chunk of the last stage): how many micro-batches
    the input embedding and the output layer hold. ``order(stage, p, m, v)`` is the sequence of passes that stage
    runs (``plansim.pipeline.orders``); ``split_backward`` says whether its B passes compute only input gradients,
    with separate W passes for the weight gradients; ``held(stage, p, m, v)`` then gives the points of the stage's
    order where its activations can peak (:class:`HeldPoint`), micro-batches between B and W included (for the
    others it is the one point of ``in_flight``). ``model_chunks`` says whether it runs ``v >= 2`` model chunks
    per stage (virtual stages) under Megatron-LM's rules: ``pp > 1``, layers divisible by ``pp * v``, micro-batches a
    multiple of ``pp`` (``plansim.strategy.checks``; the layers need not divide where ``layer_split`` gives each
    chunk's blocks); the others run one chunk per stage.
    """

    name: str
    step_time: StepTime
    in_flight: Callable[[int, int, int, int], float]
    ends_in_flight: Callable[[int, int, int], tuple[float, float]]
    description: str
    order: Callable[[int, int, int, int], list[PipeOp]]
    split_backward: bool = False
    model_chunks: bool = False
    split_held: Callable[[int, int, int, int], tuple[HeldPoint, ...]] | None = None
    #: the order as runs in closed form ``(stage, p, m) -> [(block of passes, repeats)]`` (``plansim.pipeline.runs``)
    runs: Callable[[int, int, int], list[Run]] | None = None
    #: the order's (chunk, kind) passes without building its operations, where no closed form of runs is given
    passes: Callable[[int, int, int, int], list[Pass]] | None = None

    def held(self, stage: int, p: int, m: int, v: int) -> tuple[HeldPoint, ...]:
        """The points of ``stage``'s order where its activations can peak: the stage's peak is the largest of them
        for any bytes per stored and per weight-held micro-batch (``tests/test_schedules.py`` runs the orders)."""
        if self.split_held is not None:
            return self.split_held(stage, p, m, v)
        return (HeldPoint(self.in_flight(stage, p, m, v), 0.0),)

    def run_time(self, passes: Sequence[Sequence[Sequence[float]]], m: int) -> float:
        """The wall time of ``m`` micro-batches when each stage runs its ``order`` pass by pass, every pass as soon as
        its input is ready: the longest path through the passes. ``passes[s][c]`` is (F, B) or (F, B, W) seconds of
        stage ``s``'s local model chunk ``c`` (global chunk ``c * p + s``); W only for split schedules.

        Exact for any times, where ``step_time`` is exact for equal stages (and chunks): the analytic engine runs it
        where an uneven ``layer_split`` makes a stage's model chunks unequal. Dependencies as
        ``plansim.pipeline.orders`` states them: F of chunk g needs F of g-1, B of g needs B of g+1 (the last chunk
        its own F), W its own B.

        >>> one = get_schedule("1f1b")
        >>> one.run_time([[(1.0, 2.0)]] * 4, 8) == one.step_time([3.0] * 4, 8, 1)  # equal stages: the closed form
        True
        >>> get_schedule("interleaved").run_time([[(1.0, 2.0), (1.0, 2.0)], [(2.0, 4.0), (0.5, 1.0)]], 2)
        18.5
        """
        p, v = len(passes), len(passes[0])
        orders = [self.order(stage, p, m, v) for stage in range(p)]
        last = p * v - 1
        done: dict[tuple[str, int, int], float] = {}
        clock, pos = [0.0] * p, [0] * p
        left = sum(len(o) for o in orders)
        while left:
            ran = left
            for stage in range(p):
                order, t = orders[stage], clock[stage]
                k = pos[stage]
                while k < len(order):
                    op = order[k]
                    g = op.chunk * p + stage
                    if op.kind == "F":
                        dep = ("F", g - 1, op.microbatch) if g else None
                    elif op.kind == "B":
                        dep = ("B", g + 1, op.microbatch) if g < last else ("F", g, op.microbatch)
                    else:
                        dep = ("B", g, op.microbatch)
                    ready = done.get(dep, -1.0) if dep is not None else 0.0
                    if ready < 0.0:
                        break
                    t = max(t, ready) + passes[stage][op.chunk]["FBW".index(op.kind)]
                    done[(op.kind, g, op.microbatch)] = t
                    k += 1
                left -= k - pos[stage]
                clock[stage], pos[stage] = t, k
            if left == ran:
                raise ValueError(f"{self.name}: the orders deadlock")  # never for the registry's schedules
        return max(clock)

    def sends_per_microbatch(self, stage: int, p: int, v: int) -> tuple[int, int]:
        """(forward, backward) activation sends of one micro-batch from ``stage``.

        Every chunk boundary sends once forward and once backward; with v chunks per stage the last stage's last
        chunk has no forward send and the first stage's first chunk no backward send (the others wrap around).
        """
        if p <= 1:
            return 0, 0
        return v - (stage == p - 1), v - (stage == 0)

    def receives_per_microbatch(self, stage: int, p: int, v: int) -> tuple[int, int]:
        """(forward, backward) activation receives of one micro-batch on ``stage``: every send's other end (the
        first stage's first chunk receives no forward input, the last stage's last chunk no output gradient)."""
        if p <= 1:
            return 0, 0
        return v - (stage == 0), v - (stage == p - 1)


def _flush_step_time(
    stage_times: Sequence[float], m: int, v: int = 1, weight_times: Sequence[float] | None = None
) -> float:
    """(m-1) * slowest stage + sum of stages; equals (m+p-1) t for p equal stages (GPipe sec 2.3)."""
    return (m - 1) * max(stage_times) + sum(stage_times)


def _interleaved_step_time(
    stage_times: Sequence[float], m: int, v: int, weight_times: Sequence[float] | None = None
) -> float:
    """m * slowest + the fill/drain of the other stages shortened by v: (m + (p-1)/v) t for equal stages."""
    slowest = max(stage_times)
    return m * slowest + (sum(stage_times) - slowest) / v


def _zb_h1_step_time(
    stage_times: Sequence[float], m: int, v: int = 1, weight_times: Sequence[float] | None = None
) -> float:
    """ZB-H1: m * slowest + the other stages' fill/drain without their W, less the W passes that fill the drain.

    With ``t_s = F_s + B_s + W_s`` (``W_s = weight_times[s]``, 0 when None, which is 1F1B) and b the slowest stage:
    ``m t_b + sum_{s != b} (t_s - W_s) - (min(m, p) - 1) W_b``.

    For p equal stages this is ``m t + (p-1)(T_F + T_B) - (min(m, p) - 1) T_W``, i.e. a bubble of
    ``(p-1)(T_F + T_B - T_W)`` once m >= p, the figure of Qi et al. 2024 (sec 2.1: a third of 1F1B's
    ``(p-1)(T_F + T_B + T_W)`` when the three are equal). Derivation: the last stage starts after ``(p-1) T_F`` and
    then never waits; after its last B it has ``min(m, p)`` W passes left (the ``p - 1`` held back, plus its own),
    while that B travels back to stage 0 (``(p-1) T_B``) which then runs its last W. The schedule's own tests run the
    order and find this exact whenever ``T_W <= min(T_F, T_B)``, which the cost model always meets (a GEMM's weight
    gradient costs what its forward and its input gradient cost). Beyond that other paths take over (stage 0 waits
    ``(p-1) T_B`` for its first B; the last stage ``(p-1) T_F`` for its first F), which the split of t_s into F and B
    would be needed to price; the bubble is then floored at half the fill/drain, a lower bound.
    With unequal stages the form is, as 1F1B's ``(m-1) max + sum``, an estimate, with the drain's W passes counted
    at the slowest stage's W (within a few per cent of the order run pass by pass for equal blocks and a heavier
    first or last stage); the discrete-event engine times the order itself.
    """
    p = len(stage_times)
    weights = weight_times if weight_times is not None else [0.0] * p
    b = max(range(p), key=lambda s: stage_times[s])
    fill = sum(stage_times[s] - weights[s] for s in range(p) if s != b)
    return m * stage_times[b] + max(fill - (min(m, p) - 1) * weights[b], fill / 2)


def _gpipe_in_flight(stage: int, p: int, m: int, v: int = 1) -> float:
    """GPipe runs every forward before any backward: all m micro-batches are held."""
    return float(m)


def _one_f_one_b_in_flight(stage: int, p: int, m: int, v: int = 1) -> float:
    """1F1B: stage s warms up with p-s-1 forwards, then holds at most p-s micro-batches (capped by m)."""
    return float(min(p - stage, m))


def _zb_h1_in_flight(stage: int, p: int, m: int, v: int = 1) -> float:
    """ZB-H1 runs F and B as 1F1B does: at most p-s micro-batches between their forward and their (input-gradient)
    backward on stage s (capped by m). What the held-back W passes keep comes on top: ``_zb_h1_held``."""
    return _one_f_one_b_in_flight(stage, p, m, v)


def _zb_h1_held(stage: int, p: int, m: int, v: int = 1) -> tuple[HeldPoint, ...]:
    """Where stage s of ZB-H1 (``zb_h1_order``) can peak: micro-batches between F and B, and between B and W.

    With ``w = min(p-s-1, m)`` warm-up forwards, the k-th B (k = 0..m-1) starts with ``min(w+1, m-k)`` micro-batches
    between F and B and ``min(k, s)`` between B and W (its W runs right after it once k >= s, so s stay held back),
    and ends with ``min(w, m-1-k)`` and ``min(k+1, s+1)``. Both counts are piecewise linear in k with their breaks
    at k = s and k = m-w-1, so any bytes per micro-batch peak at k in {0, s, m-w-1, m-1} (the forwards' and the W
    passes' ends hold no more than a neighbouring B's start or end). For m >= p the start of the last steady B has
    ``p-s`` stored and ``s`` weight-held: the ``p`` micro-batches between F and W that Qi et al. 2024 (sec 2.1)
    count on every stage, of which only stage 0's are all whole, so stage 0 holds what 1F1B does and later stages
    more (each held-back W keeps its weight GEMMs' inputs: ``plansim.costs.remat_policies.weight_grad_kept``).

    >>> [(h.stored, h.weight) for h in _zb_h1_held(2, 4, 8) if not h.after_backward]
    [(2.0, 0.0), (2.0, 2.0), (1.0, 2.0)]
    """
    w = min(p - stage - 1, m)
    points: list[HeldPoint] = []
    for k in sorted({0, min(stage, m - 1), max(m - w - 1, 0), m - 1}):
        points.append(HeldPoint(float(min(w + 1, m - k)), float(min(k, stage))))
        points.append(HeldPoint(float(min(w, m - 1 - k)), float(min(k + 1, stage + 1)), after_backward=True))
    return tuple(dict.fromkeys(points))


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
    """Stage 0's first chunk runs p forwards in warm-up, p-1 more, and the steady state's first forward before the
    first backward (of the last chunk): 2p micro-batches held; the last chunk is 1F1B."""
    return float(min(2 * p, m)), 1.0


SCHEDULES: dict[str, PipelineSchedule] = {
    s.name: s
    for s in (
        PipelineSchedule(
            "gpipe",
            _flush_step_time,
            _gpipe_in_flight,
            _gpipe_ends,
            "all forwards, then all backwards",
            gpipe_order,
            runs=gpipe_runs,
        ),
        PipelineSchedule(
            "1f1b",
            _flush_step_time,
            _one_f_one_b_in_flight,
            _one_f_one_b_ends,
            "one forward, one backward (PipeDream-Flush)",
            one_f_one_b_order,
            runs=one_f_one_b_runs,
        ),
        PipelineSchedule(
            "interleaved",
            _interleaved_step_time,
            _interleaved_in_flight,
            _interleaved_ends,
            "1F1B over v model chunks per stage (Megatron-LM)",
            interleaved_order,
            model_chunks=True,
            passes=interleaved_passes,
        ),
        PipelineSchedule(
            "zb-h1",
            _zb_h1_step_time,
            _zb_h1_in_flight,
            _one_f_one_b_ends,
            "1F1B with weight gradients deferred into the drain (Zero Bubble ZB-H1)",
            zb_h1_order,
            split_backward=True,
            split_held=_zb_h1_held,
            runs=zb_h1_runs,
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
    >>> get_schedule("zb-h1").step_time([3.0] * 4, 8, 1, weight_times=[1.0] * 4)  # m t + (p-1)(T_F + T_B - T_W)
    27.0
    """
    return SCHEDULES[name]
