"""Words for strategies and results, shared by the planner, ``compare`` and the reports: a strategy on one line
(``describe``, its framework named unless the default), and how one step's result compares with another's
(``compare_sentence``, ``objective_sentence``; ``pace``: a gain from ``RATIO_FROM`` (1.5x) on said as a ratio, a
smaller one as a percentage)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plansim.pipeline.schedules import SCHEDULES
from plansim.strategy.schema import Strategy
from plansim.units import GB

if TYPE_CHECKING:
    from plansim.result import Result

__all__ = ["RATIO_FROM", "compare_sentence", "describe", "objective_sentence", "pace", "times"]

#: From this ratio on a gain is said as a ratio ("3.3x as fast as", "2.0x the tokens/s of"), below it as a
#: percentage ("12.0% faster than"): a percentage past 50 % reads badly ("225.6% faster" is 3.3x as fast), and one
#: below it says more than "1.1x" does.
RATIO_FROM = 1.5

#: Within this fraction two figures are said to be the same ("as fast as"): below what one decimal of a percent shows.
_SAME = 5e-4

_PARTS = {
    "compute": "compute",
    "recompute": "recomputation",
    "exposed_comm": "exposed communication",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
    "sync_wait": "waiting for the slowest rank",
}


def describe(s: Strategy, *, framework: bool = False) -> str:
    """A compact one-line strategy; its framework named when not the default (megatron), or always with
    ``framework`` (``compare`` setting one strategy under several).

    >>> describe(Strategy(dp=8, tp=8, pp=4, micro_batch=1, schedule="interleaved", virtual_stages=3, zero=1))
    'dp8 tp8 pp4 mb1 interleaved(v=3) zero1 remat=none nccl'
    >>> describe(Strategy(dp=2, tp=4, sequence_parallel=True, tp_comm_overlap=True))  # Megatron's --tp-comm-overlap
    'dp2 tp4+sp+overlap pp1 mb1 zero0 remat=none nccl'
    >>> describe(Strategy(dp=8, micro_batch=2, attention="unfused"))
    'dp8 tp1 pp1 mb2 zero0 remat=none attention=unfused nccl'
    >>> describe(Strategy(dp=8, micro_batch=2, zero=1, framework="deepspeed"))  # the default, megatron, left unsaid
    'dp8 tp1 pp1 mb2 zero1 remat=none nccl under deepspeed'
    >>> describe(Strategy(dp=32, tp=2, zero=3, dp_shard=4, framework="fsdp"))  # sharded in groups of 4 (HSDP)
    'dp32 tp2 pp1 mb1 zero3/hsdp4 remat=none nccl under fsdp'
    >>> describe(Strategy(dp=2, tp=8, cp=16, pp=16, sequence_parallel=True, zero=1))  # context parallelism
    'dp2 tp8+sp cp16 pp16 mb1 1f1b zero1 remat=none nccl'
    >>> describe(Strategy(dp=8, zero=3, offload=("optimizer", "params"), framework="deepspeed"))  # ZeRO-Infinity
    'dp8 tp1 pp1 mb1 zero3 remat=none offload=optimizer/params nccl under deepspeed'
    >>> describe(Strategy(dp=8, offload=("activations",), offload_activation_layers=4))  # Megatron-LM, 4 blocks
    'dp8 tp1 pp1 mb1 zero0 remat=none offload=activations(4) nccl'
    >>> describe(Strategy(dp=8, tp=4, zero=1, dtype="fp8", fp8_recipe="current", fp8_param_gather=True))
    'dp8 tp4 pp1 mb1 zero1 remat=none fp8(current)+pg nccl'
    >>> describe(Strategy(dp=8, tp=2, pp=2, ep=4, etp=1, sequence_parallel=True))  # Megatron-LM's etp default: tp
    'dp8 tp2+sp ep4 etp1 pp2 mb1 1f1b zero0 remat=none nccl'
    >>> describe(Strategy(dp=8, tp=2, ep=4, etp=1, framework="fsdp"))  # torchtitan's default with ep: etp 1
    'dp8 tp2 ep4 pp1 mb1 zero0 remat=none nccl under fsdp'
    """
    schedule = f"{s.schedule}(v={s.virtual_stages})" if SCHEDULES[s.schedule].model_chunks else s.schedule
    tp = f"tp{s.tp}" + ("+sp" if s.sequence_parallel else "") + ("+overlap" if s.tp_comm_overlap else "")
    parts = [f"dp{s.dp}", tp, f"pp{s.pp}", f"mb{s.micro_batch}"]
    if s.cp > 1:  # context parallelism, its form named where it is not the ring
        parts.insert(2, f"cp{s.cp}" + ("" if s.cp_algorithm in (None, "ring") else f"({s.cp_algorithm})"))
    if s.layer_split is not None:
        parts.insert(3, "split " + "/".join(map(str, s.layer_split)))
    expert = [f"ep{s.ep}"] if s.ep > 1 else []  # expert parallelism, its etp named where it is not the default
    if s.etp is not None and s.etp != s.model_copy(update={"etp": None}).expert_tp:
        expert.append(f"etp{s.etp}")
    parts[2 + (s.cp > 1) : 2 + (s.cp > 1)] = expert
    if s.pp > 1:
        parts.append(schedule)
    parts += [f"zero{s.zero}" + (f"/hsdp{s.dp_shard}" if s.hybrid_shard else ""), f"remat={s.remat}"]
    if s.attention != "flash":  # the default is left unsaid
        parts.append(f"attention={s.attention}")
    if s.offload:  # what lives in host memory, and how many blocks' activations
        blocks = f"({s.offload_activation_layers})" if s.offload_activation_layers is not None else ""
        parts.append("offload=" + "/".join(s.offload) + blocks)
    if s.fp8:  # FP8 linear layers: the recipe (where resolved or given), "+pg" with the FP8 parameter gather
        parts.append("fp8" + (f"({s.fp8_recipe})" if s.fp8_recipe else "") + ("+pg" if s.fp8_param_gather else ""))
    if (s.dp or 1) > 1:
        parts.append(s.dp_algorithm)
    if framework or s.framework != "megatron":
        parts.append(f"under {s.framework}")
    return " ".join(parts)


def times(ratio: float) -> str:
    """A ratio as the sentences say it: one decimal below 10, whole above.

    >>> times(3.256), times(12.4)
    ('3.3x', '12x')
    """
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:,.0f}x"


def pace(mine_s: float, other_s: float) -> str:
    """How a step of ``mine_s`` seconds compares with one of ``other_s``, as a verb phrase that the other's name
    follows: speeds compared (``other_s / mine_s``), a large gain as a ratio (``RATIO_FROM``), a small one or a loss
    as a percentage, a large loss as how many times as long it takes.

    >>> pace(1.0, 3.256), pace(1.0, 1.2), pace(1.0, 1.0002)
    ('is 3.3x as fast as', 'is 20.0% faster than', 'is as fast as')
    >>> pace(1.25, 1.0), pace(3.0, 1.0)
    ('is 20.0% slower than', 'takes 3.0x as long as')
    """
    speed = other_s / mine_s  # the other's time over mine: my speed over the other's
    if speed >= RATIO_FROM:
        return f"is {times(speed)} as fast as"
    if speed > 1 + _SAME:
        return f"is {speed - 1:.1%} faster than"
    if speed >= 1 - _SAME:
        return "is as fast as"
    if speed > 1 / RATIO_FROM:
        return f"is {1 - speed:.1%} slower than"
    return f"takes {times(1 / speed)} as long as"


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
    >>> o = R(step_time_s=32.56, time_breakdown_s=parts(30.0, 2.0, 0.56), peak_memory_bytes=50e9)
    >>> compare_sentence(w, o, "B").split(":")[0]   # 225.6% faster, said as a ratio
    'It is 3.3x as fast as B'
    """
    if other.step_time_s <= 0 or winner.step_time_s <= 0:
        return ""
    gain = other.step_time_s / winner.step_time_s - 1
    return (
        f"It {pace(winner.step_time_s, other.step_time_s)} {name}{_because(winner, other, gain, 1.0)}"
        f"{_memory(winner, other)}."
    )


def objective_sentence(
    winner: Result, other: Result, name: str, objective: str, batches: tuple[int, int] | None = None
) -> str:
    """``compare_sentence`` on an objective of ``planner.search.OBJECTIVES``: how much more tokens/s
    (``tokens_per_s``), the fewer GPU-seconds per token (``cost``) or how much faster a step (``step_time``) the winner
    gives than ``other``. Where the two steps hold different batches (or, for ``cost``, run on different GPU counts),
    the parts of the step are compared for the same tokens (and GPUs): ``other``'s scaled to the winner's.
    ``batches``: the two global batches (default: the results' strategies').

    >>> import textwrap
    >>> from types import SimpleNamespace as R
    >>> parts = lambda c, x, b: dict(compute=c, recompute=0.0, exposed_comm=x, bubble=b, optimizer=0.0)
    >>> w = R(step_time_s=4.0, tokens_per_s=1000.0, gpus=8, time_breakdown_s=parts(3.0, 0.5, 0.5),
    ...       peak_memory_bytes=60e9, strategy={"global_batch": 4})
    >>> o = R(step_time_s=1.0, tokens_per_s=500.0, gpus=8, time_breakdown_s=parts(0.5, 0.5, 0.0),
    ...       peak_memory_bytes=50e9, strategy={"global_batch": 1})
    >>> print(textwrap.fill(objective_sentence(w, o, "B", "tokens_per_s"), 100))
    It gives 2.0x the tokens/s of B (global batch 4 vs 1): for the same 4,000 tokens, less exposed
    communication (3,500.0 ms) and less compute (1,000.0 ms), despite more pipeline bubble (500.0 ms);
    peak memory 60.0 vs 50.0 GB.
    >>> o = R(**{**vars(o), "gpus": 32})   # 4x the GPU-seconds per token of the above
    >>> objective_sentence(w, o, "B", "cost").split(":")[0]
    'It needs 87.5% fewer GPU-hours per token than B (8 vs 32 GPUs, global batch 4 vs 1)'
    """
    if objective == "step_time":
        return compare_sentence(winner, other, name)
    if other.tokens_per_s <= 0 or winner.tokens_per_s <= 0:
        return ""
    tokens = winner.tokens_per_s * winner.step_time_s
    scale = tokens / (other.tokens_per_s * other.step_time_s)
    mine, theirs = batches or (winner.strategy.get("global_batch"), other.strategy.get("global_batch"))
    setting = f" (global batch {mine:,} vs {theirs:,})" if mine != theirs else ""
    if objective == "cost":  # GPU-seconds per token
        scale *= other.gpus / winner.gpus
        own_cost = winner.step_time_s * winner.gpus / tokens
        other_cost = other.step_time_s * other.gpus / (other.tokens_per_s * other.step_time_s)
        gain = other_cost / own_cost - 1
        if other.gpus != winner.gpus:
            setting = f" ({winner.gpus:,} vs {other.gpus:,} GPUs" + (f", {setting[2:]}" if setting else ")")
        more = own_cost / other_cost  # a saving is at most 100 %: said as a percentage; a large excess as a ratio
        if gain > _SAME:
            phrase = f"It needs {1 - more:.1%} fewer GPU-hours per token than"
        elif gain >= -_SAME:
            phrase = "It needs as many GPU-hours per token as"
        elif more < RATIO_FROM:
            phrase = f"It needs {more - 1:.1%} more GPU-hours per token than"
        else:
            phrase = f"It needs {times(more)} the GPU-hours per token of"
        same = f"for the same {tokens:,.0f} tokens on {winner.gpus:,} GPUs, "
    else:
        ratio = winner.tokens_per_s / other.tokens_per_s
        gain = ratio - 1
        if ratio >= RATIO_FROM:
            phrase = f"It gives {times(ratio)} the tokens/s of"
        elif gain > _SAME:
            phrase = f"It gives {gain:.1%} more tokens/s than"
        elif gain >= -_SAME:
            phrase = "It gives as many tokens/s as"
        else:  # fewer is at most 100 %: a percentage
            phrase = f"It gives {-gain:.1%} fewer tokens/s than"
        same = f"for the same {tokens:,.0f} tokens, "
    because = _because(winner, other, gain, scale, floor_s=5e-5)  # none that would print as 0.0 ms
    if because and abs(scale - 1) > 1e-9:
        because = ": " + same + because[2:]
    return f"{phrase} {name}{setting}{because}{_memory(winner, other)}."


def _because(winner: Result, other: Result, gain: float, scale: float, floor_s: float = 1e-6) -> str:
    """``: less X (ms) and less Y (ms), despite more Z (ms)``: the parts of the step (``other``'s times ``scale``)
    the winner spends less on (at most two) and the one it spends most more on, each differing by more than
    ``floor_s``; empty unless the winner gains."""
    diffs = [(other.time_breakdown_s.get(k, 0.0) * scale - winner.time_breakdown_s.get(k, 0.0), k) for k in _PARTS]
    less = sorted((d for d in diffs if d[0] > floor_s), key=lambda d: -d[0])[:2]
    more = sorted((d for d in diffs if d[0] < -floor_s), key=lambda d: d[0])[:1]
    if not less or gain <= _SAME:
        return ""
    because = ": " + " and ".join(f"less {_PARTS[k]} ({d * 1e3:,.1f} ms)" for d, k in less)
    return because + "".join(f", despite more {_PARTS[k]} ({-d * 1e3:,.1f} ms)" for d, k in more)


def _memory(winner: Result, other: Result) -> str:
    return f"; peak memory {winner.peak_memory_bytes / GB:.1f} vs {other.peak_memory_bytes / GB:.1f} GB"
