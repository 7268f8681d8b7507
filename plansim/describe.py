"""Words for strategies and results, shared by the planner, ``compare`` and the reports: a strategy on one line,
and how one step's result compares with another's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plansim.schedules import SCHEDULES
from plansim.strategy import Strategy
from plansim.units import GB

if TYPE_CHECKING:
    from plansim.result import Result

__all__ = ["compare_sentence", "describe"]

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
    schedule = f"{s.schedule}(v={s.virtual_stages})" if SCHEDULES[s.schedule].model_chunks else s.schedule
    parts = [f"dp{s.dp}", f"tp{s.tp}" + ("+sp" if s.sequence_parallel else ""), f"pp{s.pp}", f"mb{s.micro_batch}"]
    if s.layer_split is not None:
        parts.insert(3, "split " + "/".join(map(str, s.layer_split)))
    if s.pp > 1:
        parts.append(schedule)
    parts += [f"zero{s.zero}", f"remat={s.remat}"]
    if (s.dp or 1) > 1:
        parts.append(s.dp_algorithm)
    return " ".join(parts)


def compare_sentence(winner: Result, other: Result, name: str) -> str:
    """One sentence: how much faster the winner is than ``other``, the (at most two) parts of the step it spends
    less on, the largest one it spends more on, and both peaks.

    >>> import textwrap
    >>> from types import SimpleNamespace as R
    >>> parts = lambda c, x, b: dict(compute=c, recompute=0.0, exposed_comm=x, bubble=b, optimizer=0.0)
    >>> w = R(step_time_s=10.0, time_breakdown_s=parts(8.0, 1.0, 1.0), peak_memory_bytes=60e9)
    >>> o = R(step_time_s=12.0, time_breakdown_s=parts(8.5, 3.0, 0.5), peak_memory_bytes=50e9)
    >>> print(textwrap.fill(compare_sentence(w, o, "B"), 100))
    It is 20.0% faster than B: less exposed communication (2,000.0 ms) and less compute (500.0 ms),
    despite more pipeline bubble (500.0 ms); peak memory 60.0 vs 50.0 GB.
    """
    if other.step_time_s <= 0:
        return ""
    gain = other.step_time_s / winner.step_time_s - 1
    diffs = [(other.time_breakdown_s[k] - winner.time_breakdown_s[k], k) for k in _PARTS]
    less = sorted((d for d in diffs if d[0] > 1e-6), key=lambda d: -d[0])[:2]
    more = sorted((d for d in diffs if d[0] < -1e-6), key=lambda d: d[0])[:1]
    pace = f"{gain:.1%} faster than" if gain > 5e-4 else "as fast as" if gain > -5e-4 else f"{-gain:.1%} slower than"
    memory = f"; peak memory {winner.peak_memory_bytes / GB:.1f} vs {other.peak_memory_bytes / GB:.1f} GB"
    because = ""
    if less and gain > 5e-4:
        because = ": " + " and ".join(f"less {_PARTS[k]} ({d * 1e3:,.1f} ms)" for d, k in less)
        because += "".join(f", despite more {_PARTS[k]} ({-d * 1e3:,.1f} ms)" for d, k in more)
    return f"It is {pace} {name}{because}{memory}."
