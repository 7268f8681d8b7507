"""Pipeline schedules in closed form: step time from per-stage times, and micro-batches in flight per stage.

Registry keyed by name, so the CLI's choices come from here. The discrete-event simulator (later) runs the same
schedules task by task; where stages are equal both must agree with these closed forms.

Sources: GPipe (Huang et al. 2019, sec 2.3): bubble (p-1)/(m+p-1). 1F1B / PipeDream-Flush (Narayanan et al. 2021,
sec 2.2.1): same bubble, at most p micro-batches in flight on the first stage. Interleaved 1F1B (Narayanan et al.
2021, sec 2.2.2): bubble divided by v; in-flight count from Megatron-LM's warm-up rule, which gives Korthikanti et
al. 2022 (sec 4.2.3) first-stage activation factor (1 + (p-1)/(p v)). ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", ICLR 2024, sec 2.1): 1F1B with backward split into input and weight gradients; bubble
(p-1)(T_F + T_B - T_W) for equal stages (see ``_zb_h1_step_time`` for the derivation and its conditions).

Each schedule also names the order in which one stage runs its passes (``plansim.pipeline_orders``), which the
discrete-event engine follows; ``tests/test_schedules.py`` runs those orders and checks them against these closed
forms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from plansim.pipeline_orders import PipeOp, gpipe_order, interleaved_order, one_f_one_b_order, zb_h1_order

__all__ = ["SCHEDULES", "PipelineSchedule", "StepTime", "get_schedule"]


class StepTime(Protocol):
    """``(stage_times, m, v, weight_times=None) -> seconds``: see :class:`PipelineSchedule`."""

    def __call__(
        self, stage_times: Sequence[float], m: int, v: int, weight_times: Sequence[float] | None = None
    ) -> float: ...


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
    runs (``plansim.pipeline_orders``); ``split_backward`` says whether its B passes compute only input gradients,
    with separate W passes for the weight gradients. ``model_chunks`` says whether it runs ``v >= 2`` model chunks
    per stage (virtual stages) under Megatron-LM's rules: ``pp > 1``, layers divisible by ``pp * v``, micro-batches a
    multiple of ``pp`` (``plansim.strategy_checks``); the others run one chunk per stage.

    ``blocking_p2p`` says how Megatron-LM issues the schedule's pipeline sends: blocking (``batch_isend_irecv``, a
    wait on every request, then ``torch.cuda.synchronize()``: ``batch_p2p_comm`` and ``batch_p2p_sync``, both on by
    default in ``megatron/core/model_parallel_config.py``), or as separate ``isend``/``irecv`` whose handles are
    waited for only where the data is needed (``overlap_p2p_comm``, which ``megatron/training/arguments.py`` keeps
    only for the interleaved schedule, where it is the default, and which turns ``batch_p2p_comm`` off:
    ``argument_utils.py``). Both at NVIDIA/Megatron-LM d98e8a64. ``plansim.step.p2p`` prices what follows.
    """

    name: str
    step_time: StepTime
    in_flight: Callable[[int, int, int, int], float]
    ends_in_flight: Callable[[int, int, int], tuple[float, float]]
    description: str
    order: Callable[[int, int, int, int], list[PipeOp]]
    split_backward: bool = False
    model_chunks: bool = False
    blocking_p2p: bool = True

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
    backward on stage s (capped by m).

    Not counted: the s micro-batches whose W stage s holds back keep what W needs, each GEMM's input and the
    gradient of its output, most of what the forward saved (Qi et al. 2024, Table 1). Every stage thus keeps p
    micro-batches between F and W, but only stage 0, which holds back none, keeps p whole, so the worst stage's memory
    is 1F1B's (Qi et al. 2024 sec 2.1); later stages hold more than this count says.
    """
    return _one_f_one_b_in_flight(stage, p, m, v)


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
        ),
        PipelineSchedule(
            "1f1b",
            _flush_step_time,
            _one_f_one_b_in_flight,
            _one_f_one_b_ends,
            "one forward, one backward (PipeDream-Flush)",
            one_f_one_b_order,
        ),
        PipelineSchedule(
            "interleaved",
            _interleaved_step_time,
            _interleaved_in_flight,
            _interleaved_ends,
            "1F1B over v model chunks per stage (Megatron-LM)",
            interleaved_order,
            model_chunks=True,
            blocking_p2p=False,
        ),
        PipelineSchedule(
            "zb-h1",
            _zb_h1_step_time,
            _zb_h1_in_flight,
            _one_f_one_b_ends,
            "1F1B with weight gradients deferred into the drain (Zero Bubble ZB-H1)",
            zb_h1_order,
            split_backward=True,
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
