"""A pipeline of priced stages: the schedule's closed-form step time (``plansim.pipeline.schedules``; where an uneven
``layer_split`` makes a stage's model chunks unequal, its order run pass by pass with each chunk's time), its bottleneck
stage, and the stages grouped where their data-parallel traffic or their static memory can differ, so that the
analytic engine prices each group once; and the memoized layouts of layers over stages and model chunks
(``plansim.pipeline.stages``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from plansim.analytic.stages import StageCost
from plansim.pipeline.schedules import get_schedule
from plansim.pipeline.stages import chunk_layers, stage_layers
from plansim.strategy.schema import Strategy


@lru_cache(maxsize=4096)
def model_chunks(num_layers: int, pp: int, v: int, split: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], ...]:
    """``chunk_layers`` as tuples, memoized: the model chunks, chunk ``c`` of stage ``s`` being ``c * pp + s``."""
    return tuple(tuple(chunk) for chunk in chunk_layers(num_layers, pp, v, split))


@lru_cache(maxsize=4096)
def stage_layout(num_layers: int, pp: int, v: int, split: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], ...]:
    """``stage_layers`` as tuples, memoized (a planner asks for the same few layouts thousands of times)."""
    return tuple(tuple(layers) for layers in stage_layers(num_layers, pp, v, split))


@dataclass(frozen=True)
class Pipeline:
    """A pipeline's stages and what every ZeRO/all-reduce variant of it reads: the schedule's step time (with the
    fill and drain of the sends beside compute, ``send_chain_s``), the bottleneck stage, and the stages grouped
    where the data-parallel traffic (params, layers, backward and forward time) or the static memory (params, largest
    layer) can differ, so that each group is priced once."""

    stages: list[StageCost]
    pipe_s: float
    bottleneck: StageCost
    dp_groups: list[StageCost]
    dp_group_sizes: list[int]
    dp_group_first: list[int]
    dp_group_of: list[int]
    bottleneck_index: int
    memory_groups: list[StageCost]
    memory_group_of: list[int]
    activations: list[int]
    fragmentation: list[int]
    axis_bytes: dict[str, float]
    p2p_bytes: float
    recompute_matmul_flops: float
    send_chain_s: float = 0.0

    @classmethod
    def of(cls, stages: list[StageCost], s: Strategy, uneven_chunks: bool = False) -> Pipeline:
        """``stages`` laid out by ``s``'s schedule: its closed form (``PipelineSchedule.step_time``), exact for equal
        stages; or, with ``uneven_chunks`` (an uneven split of interleaved chunks, ``stages.uneven_chunks``), its
        order run pass by pass with each chunk's forward and backward (``PipelineSchedule.run_time``, ``chunk_passes``),
        where the closed form, which counts each stage's mean chunk, is no longer exact."""
        times = [st.time_s for st in stages]
        weights = [st.bwd_weight_s for st in stages]
        # sends beside compute (plansim.step.p2p.OverlappedSends): one micro-batch's transfers along the chain of
        # chunks, once per step
        chain = sum(st.send_chain_s for st in stages)
        sched = get_schedule(s.schedule)
        if uneven_chunks:
            pipe_s = sched.run_time([chunk_passes(st) for st in stages], s.num_microbatches)
        else:
            pipe_s = sched.step_time(times, s.num_microbatches, s.virtual_stages, weight_times=weights)
        pipe_s += chain
        busiest = max(range(len(stages)), key=times.__getitem__)
        bottleneck = stages[busiest]
        dp_groups: dict[tuple[float, ...], StageCost] = {}
        dp_sizes: dict[tuple[float, ...], int] = {}
        dp_first: dict[tuple[float, ...], int] = {}
        dp_of: list[int] = []
        memory_groups: dict[tuple[float, tuple[float, ...]], int] = {}
        representatives: list[StageCost] = []
        group_of = []
        for idx, st in enumerate(stages):
            dp_key = (st.params, st.tail_params, st.num_layers, st.bwd_s + st.recompute_s, st.fwd_s, st.first_stage)
            dp_groups.setdefault(dp_key, st)
            dp_sizes[dp_key] = dp_sizes.get(dp_key, 0) + 1
            dp_first.setdefault(dp_key, idx)
            dp_of.append(list(dp_groups).index(dp_key))
            g = memory_groups.setdefault((st.params, st.layer_params), len(representatives))
            if g == len(representatives):
                representatives.append(st)
            group_of.append(g)
        return cls(
            stages, pipe_s, bottleneck, list(dp_groups.values()), list(dp_sizes.values()), list(dp_first.values()),
            dp_of, busiest, representatives, group_of,
            [round(st.activations) for st in stages], [round(st.fragmentation) for st in stages],
            _most_per_axis(st.axis_bytes for st in stages),
            max(st.p2p_bytes for st in stages), sum(st.recompute_matmul_flops for st in stages), chain,
        )  # fmt: skip


def chunk_passes(st: StageCost) -> list[tuple[float, float]]:
    """(forward, backward) seconds per micro-batch of each of a stage's model chunks, in forward order: its layers'
    passes (``forward_layers``, ``backward_layers`` split by ``backward_chunks``), scaled to sum to the stage's
    ``time_s`` (what the stage spends beside its layers, its sends and the compute lost beside them, spread in
    proportion)."""
    count = max(1, len(st.backward_chunks))
    backward, start = [], 0
    for n in st.backward_chunks:
        backward.append(sum(x.work_s + x.blocking_s for x in st.backward_layers[start : start + n]))
        start += n
    forward, start = [], 0
    for n in reversed(st.backward_chunks):
        forward.append(sum(x.work_s + x.blocking_s for x in st.forward_layers[start : start + n]))
        start += n
    total = sum(forward) + sum(backward)
    if total <= 0.0 or len(forward) != count:
        return [(st.time_s / count / 3, 2 * st.time_s / count / 3)] * count
    scale = st.time_s / total
    return [(f * scale, b * scale) for f, b in zip(forward, backward[::-1], strict=True)]


def _most_per_axis(per_stage: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per mesh axis, the most bytes any stage sends."""
    out: dict[str, float] = {}
    for axis_bytes in per_stage:
        for axis, n_bytes in axis_bytes.items():
            out[axis] = max(out.get(axis, 0.0), n_bytes)
    return out
