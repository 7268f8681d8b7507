"""The order in which one pipeline stage runs its forward and backward passes, for every schedule.

A stage's order is a list of :class:`PipeOp`; the stage runs it front to back, each op as soon as its input is ready
(the discrete-event engine's job). Dependencies, with the global model chunk ``g = chunk * p + stage``:
F of chunk g needs F of chunk g-1 (same micro-batch); B of chunk g needs B of chunk g+1, or, on the last chunk, its
own F; W (split schedules only) needs the B of the same chunk and micro-batch, on the same stage.

Micro-batches and chunks count from 0 here; the papers' figures count micro-batches from 1.

Sources (each function cites its own): GPipe, Huang et al. 2019 sec 2.2 and Fig. 2(c); 1F1B (PipeDream-Flush),
Narayanan et al. 2021 sec 2.2.1 and Fig. 4 (top); interleaved 1F1B, Narayanan et al. 2021 sec 2.2.2, Fig. 4
(bottom), with Megatron-LM's warm-up count and chunk mapping; ZB-H1, Qi et al. 2024 ("Zero Bubble Pipeline
Parallelism", ICLR 2024) sec 2.1 and Fig. 3 (top).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Pass",
    "PipeOp",
    "Run",
    "gpipe_order",
    "gpipe_runs",
    "interleaved_order",
    "interleaved_passes",
    "one_f_one_b_order",
    "one_f_one_b_runs",
    "zb_h1_order",
    "zb_h1_runs",
]


@dataclass(frozen=True)
class PipeOp:
    """One pass of one micro-batch through one of a stage's model chunks.

    ``kind``: ``F`` forward; ``B`` backward (the whole backward, or only its input-gradient part when the schedule
    splits backward); ``W`` the weight-gradient part (split schedules only). ``chunk`` is the stage's local model
    chunk (0..v-1); the global model chunk is ``chunk * p + stage``.
    """

    kind: Literal["F", "B", "W"]
    microbatch: int
    chunk: int

    def __repr__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def _check(stage: int, p: int, m: int, v: int) -> None:
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"pipeline orders need p, m, v >= 1, got p={p}, m={m}, v={v}")
    if not 0 <= stage < p:
        raise ValueError(f"stage {stage} is not in 0..{p - 1}")


def _one_chunk(name: str, v: int) -> None:
    if v != 1:
        raise ValueError(f"{name} runs one model chunk per stage, got v={v}")


def gpipe_order(stage: int, p: int, m: int, v: int = 1) -> list[PipeOp]:
    """All forwards, then all backwards, the last micro-batch's first (Huang et al. 2019, Fig. 2(c)).

    The backward half of GPipe's figure mirrors the forward half: the last stage starts the backward of the
    micro-batch it finished last, so backwards run in reverse micro-batch order.

    >>> gpipe_order(0, 2, 3)
    [F0, F1, F2, B2, B1, B0]
    """
    _check(stage, p, m, v)
    _one_chunk("gpipe", v)
    return [PipeOp("F", i, 0) for i in range(m)] + [PipeOp("B", i, 0) for i in reversed(range(m))]


def one_f_one_b_order(stage: int, p: int, m: int, v: int = 1) -> list[PipeOp]:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021 sec 2.2.1, Fig. 4 top): ``p - stage - 1`` warm-up forwards
    (at most m), then one forward and one backward in turn, then the remaining backwards.

    >>> one_f_one_b_order(0, 2, 3)
    [F0, F1, B0, F2, B1, B2]
    """
    _check(stage, p, m, v)
    _one_chunk("1f1b", v)
    warm = min(p - stage - 1, m)
    order = [PipeOp("F", i, 0) for i in range(warm)]
    for i in range(m - warm):
        order += [PipeOp("F", warm + i, 0), PipeOp("B", i, 0)]
    return order + [PipeOp("B", i, 0) for i in range(m - warm, m)]


def _interleaved_chunk(k: int, p: int, v: int, forward: bool) -> PipeOp:
    """Megatron-LM's mapping of the k-th forward (or backward) of a stage: groups of p micro-batches per chunk,
    chunks in order for forwards and in reverse for backwards."""
    group = (k // p) % v
    chunk = group if forward else v - 1 - group
    return PipeOp("F" if forward else "B", (k // (p * v)) * p + k % p, chunk)


def interleaved_order(stage: int, p: int, m: int, v: int) -> list[PipeOp]:
    """Interleaved 1F1B over v model chunks per stage (Narayanan et al. 2021 sec 2.2.2, Fig. 4 bottom), as in
    Megatron-LM's ``forward_backward_pipelining_with_interleaving``.

    The stage runs ``m * v`` chunk forwards and as many chunk backwards. Warm-up: ``(p - stage - 1) * 2 + (v - 1) * p``
    forwards (at most m v); then one forward and one backward in turn; then the remaining backwards. The k-th forward
    runs chunk ``(k // p) % v`` of micro-batch ``(k // (p v)) p + k % p``; the k-th backward the same micro-batch on
    chunk ``v - 1 - (k // p) % v``. Needs m to be a multiple of p.

    >>> interleaved_order(1, 2, 2, 2)
    [F0, F1, F0.1, B0.1, F1.1, B1.1, B0, B1]
    """
    _check(stage, p, m, v)
    if m % p:
        raise ValueError(f"interleaved 1F1B needs m={m} to be a multiple of p={p}")
    total = m * v
    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    order = [_interleaved_chunk(k, p, v, True) for k in range(warm)]
    for k in range(total - warm):
        order += [_interleaved_chunk(warm + k, p, v, True), _interleaved_chunk(k, p, v, False)]
    return order + [_interleaved_chunk(k, p, v, False) for k in range(total - warm, total)]


def zb_h1_order(stage: int, p: int, m: int, v: int = 1) -> list[PipeOp]:
    """ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", sec 2.1 and Fig. 3 top): 1F1B with the backward
    split into B (input gradient) and W (weight gradient), and the W passes started later on later stages.

    The F and B passes follow 1F1B exactly (``p - stage - 1`` warm-up forwards, then F and B in turn, then the
    remaining B). The W passes of the first ``stage`` backwards are held back; every later B is followed by the oldest
    held-back W, and the W passes still held after the last B close the order, where they fill what would be
    1F1B's cool-down bubble. Every stage thus keeps ``p`` micro-batches between their F and their W, as the paper
    states, while at most ``p - stage`` are between F and B, as in 1F1B.

    The same rule is ``ScheduleInterleavedZeroBubble`` (the paper's ZB1P) in PyTorch's
    ``torch.distributed.pipelining.schedules`` with one local stage (``num_1f1b_microbatches = rank``), and, when
    m >= p - 1, Megatron-DeepSpeed's ``ZeroBubbleH1Pipeline`` with ``--enable-zbh1-exact-semantics`` (its default
    variant runs some backwards unsplit).

    >>> zb_h1_order(1, 2, 3)
    [F0, B0, F1, B1, W0, F2, B2, W1, W2]
    """
    _check(stage, p, m, v)
    _one_chunk("zb-h1", v)
    warm = min(p - stage - 1, m)
    held: deque[int] = deque()
    order = [PipeOp("F", i, 0) for i in range(warm)]

    def backward(i: int) -> None:
        order.append(PipeOp("B", i, 0))
        held.append(i)
        if i >= stage:  # the first `stage` backwards keep their W for later
            order.append(PipeOp("W", held.popleft(), 0))

    for i in range(m - warm):
        order.append(PipeOp("F", warm + i, 0))
        backward(i)
    for i in range(m - warm, m):
        backward(i)
    return order + [PipeOp("W", i, 0) for i in held]


#: A pass as (chunk, kind); a run is a block of passes and how many times it repeats in a row (closed forms of
#: the orders above, for walks that cost what a schedule's phases do, not its passes).
Pass = tuple[int, str]
Run = tuple[tuple[Pass, ...], int]
_F, _B, _W = (0, "F"), (0, "B"), (0, "W")


def gpipe_runs(s: int, p: int, m: int) -> list[Run]:
    """``gpipe_order`` as runs: m forwards, then m backwards."""
    return [((_F,), m), ((_B,), m)]


def one_f_one_b_runs(s: int, p: int, m: int) -> list[Run]:
    """``one_f_one_b_order`` as runs: the warm-up forwards, the forward-backward pairs, the cool-down backwards."""
    warm = min(p - s - 1, m)
    return [((_F,), warm), ((_F, _B), m - warm), ((_B,), warm)]


def zb_h1_runs(s: int, p: int, m: int) -> list[Run]:
    """1F1B's F and B; the i-th B is followed by a W from micro-batch ``stage`` on; the ``min(m, stage)`` W passes
    held back close the order."""
    warm = min(p - s - 1, m)
    steady_held = min(s, m - warm)  # steady-state backwards (i < m - warm) that hold their W
    cool_held = max(0, min(m, s) - (m - warm))  # cool-down backwards (m - warm <= i < m) that do
    return [
        ((_F,), warm),
        ((_F, _B), steady_held),
        ((_F, _B, _W), m - warm - steady_held),
        ((_B,), cool_held),
        ((_B, _W), warm - cool_held),
        ((_W,), min(m, s)),
    ]


def interleaved_passes(s: int, p: int, m: int, v: int) -> list[Pass]:
    """``interleaved_order``'s passes as (chunk, kind), without building its operations."""
    total = m * v
    warm = min((p - s - 1) * 2 + (v - 1) * p, total)

    def fwd(k: int) -> Pass:
        return ((k // p) % v, "F")

    def bwd(k: int) -> Pass:
        return (v - 1 - (k // p) % v, "B")

    ops = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        ops += [fwd(warm + k), bwd(k)]
    return ops + [bwd(k) for k in range(total - warm, total)]
