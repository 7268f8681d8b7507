"""Words for the planner's choice: why the winner beats the runner-up and the usual Megatron-style configuration,
and, when nothing fits, the smallest change that would.

The Megatron-style configuration is the hand recipe of Narayanan et al. 2021 (sec 5.4 "takeaways"): tensor
parallelism up to the GPUs of a node, pipeline parallelism just deep enough to fit, micro-batch 1, 1F1B or its
interleaved form, sequence parallelism with selective recompute (Korthikanti et al. 2022), data parallelism over
the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from plansim.describe import compare_sentence, describe
from plansim.planner.search import Priced
from plansim.result import Result
from plansim.strategy.schema import Strategy

__all__ = ["compare_sentence", "describe", "is_megatron_style", "megatron_style"]


def is_megatron_style(s: Strategy, max_tp: int) -> bool:
    """Whether ``s`` follows the Megatron-style recipe (see the module docstring) with tensor parallelism ``max_tp``."""
    return (
        s.tp == max_tp
        and s.micro_batch == 1
        and s.schedule in ("1f1b", "interleaved")
        and s.remat == "selective"
        and (s.sequence_parallel or s.tp == 1)
        and s.zero in (0, 1)
        and s.dp_algorithm == "nccl"
        and s.framework == "megatron"
    )


def megatron_style(fitting: Sequence[Priced], max_tp: int, key: Callable[[Result], float]) -> Priced | None:
    """The best Megatron-style candidate with the fewest pipeline stages that fit (None if none fits)."""
    ours = [p for p in fitting if is_megatron_style(p.strategy, max_tp)]
    if not ours:
        return None
    least = min(p.strategy.pp for p in ours)
    return min((p for p in ours if p.strategy.pp == least), key=lambda p: (key(p.result), p.index))
