"""Words for the planner's choice: why the winner beats the runner-up and the usual Megatron-style configuration,
and, when nothing fits, the smallest change that would.

The Megatron-style configuration is the hand recipe of Narayanan et al. 2021 (sec 5.4 "takeaways"): tensor
parallelism up to the GPUs of a node, pipeline parallelism just deep enough to fit, micro-batch 1, 1F1B or its
interleaved form, sequence parallelism with selective recompute (Korthikanti et al. 2022), data parallelism over
the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from plansim.planner.search import Priced
from plansim.result import Result
from plansim.strategy import Strategy
from plansim.units import GB

__all__ = ["compare_sentence", "describe", "is_megatron_style", "megatron_style"]

_PARTS = {
    "compute": "compute",
    "recompute": "recomputation",
    "exposed_comm": "exposed communication",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
}


def describe(s: Strategy) -> str:
    """A compact one-line strategy.

    >>> describe(Strategy(dp=8, tp=8, pp=4, micro_batch=1, schedule="interleaved", virtual_stages=3, zero=1))
    'dp8 tp8 pp4 mb1 interleaved(v=3) zero1 remat=none ring'
    """
    schedule = f"interleaved(v={s.virtual_stages})" if s.schedule == "interleaved" else s.schedule
    parts = [f"dp{s.dp}", f"tp{s.tp}" + ("+sp" if s.sequence_parallel else ""), f"pp{s.pp}", f"mb{s.micro_batch}"]
    if s.layer_split is not None:
        parts.insert(3, "split " + "/".join(map(str, s.layer_split)))
    if s.pp > 1:
        parts.append(schedule)
    parts += [f"zero{s.zero}", f"remat={s.remat}"]
    if (s.dp or 1) > 1:
        parts.append(s.dp_algorithm)
    return " ".join(parts)


def is_megatron_style(s: Strategy, max_tp: int) -> bool:
    """Whether ``s`` follows the Megatron-style recipe (see the module docstring) with tensor parallelism ``max_tp``."""
    return (
        s.tp == max_tp
        and s.micro_batch == 1
        and s.schedule in ("1f1b", "interleaved")
        and s.remat == "selective"
        and (s.sequence_parallel or s.tp == 1)
        and s.zero in (0, 1)
        and s.dp_algorithm == "ring"
    )


def megatron_style(fitting: Sequence[Priced], max_tp: int, key: Callable[[Result], float]) -> Priced | None:
    """The best Megatron-style candidate with the fewest pipeline stages that fit (None if none fits)."""
    ours = [p for p in fitting if is_megatron_style(p.strategy, max_tp)]
    if not ours:
        return None
    least = min(p.strategy.pp for p in ours)
    return min((p for p in ours if p.strategy.pp == least), key=lambda p: (key(p.result), p.index))


def compare_sentence(winner: Result, other: Result, name: str) -> str:
    """One sentence: how much faster the winner is than ``other`` and which parts of the step make the difference."""
    if other.step_time_s <= 0:
        return ""
    gain = other.step_time_s / winner.step_time_s - 1
    diffs = sorted(
        ((other.time_breakdown_s[k] - winner.time_breakdown_s[k], k) for k in _PARTS),
        key=lambda d: -abs(d[0]),
    )
    reasons = [
        f"{'less' if d > 0 else 'more'} {_PARTS[k]} ({abs(d) * 1e3:,.1f} ms)" for d, k in diffs[:2] if abs(d) > 1e-6
    ]
    pace = f"{gain:.1%} faster than" if gain > 5e-4 else "as fast as" if gain > -5e-4 else f"{-gain:.1%} slower than"
    memory = f"; peak memory {winner.peak_memory_bytes / GB:.1f} vs {other.peak_memory_bytes / GB:.1f} GB"
    because = f": {' and '.join(reasons)}" if reasons and gain > 5e-4 else ""
    return f"It is {pace} {name}{because}{memory}."
