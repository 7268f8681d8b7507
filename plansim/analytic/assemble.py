"""The analytic engine's step from its priced pipeline: the time breakdown (compute, recompute, exposed
communication, bubble, optimizer, wait for the slowest GPU, interference; they sum to the step time), the worst
stage's memory, and the ``Result`` (``plansim.step.result``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

from plansim.analytic.cache import AnalyticCache
from plansim.analytic.data_parallel import DataParallelComm, dp_besides, embedding_sync
from plansim.analytic.pipeline import Pipeline
from plansim.analytic.stages import StageHeld, interference_of
from plansim.costs.kernels import KernelCostModel
from plansim.costs.remat_policies import REMAT_POLICIES
from plansim.costs.stragglers import straggler_wait_s
from plansim.hardware import Cluster
from plansim.result import Result
from plansim.step.memory import host_states, static_bytes
from plansim.step.offload import OffloadTimes, host_tier, offload_times
from plansim.step.optimizer import optimizer_step_s
from plansim.step.result import host_no_fit_reason, overlap_figures, step_flops, step_result
from plansim.strategy.mesh import comm_kind, mesh_of
from plansim.strategy.schema import Strategy
from plansim.units import GB
from plansim.workload.traced import Workload


def _optimizer_s(kernels: KernelCostModel, s: Strategy, params: int) -> float:
    """One fused Adam step over this rank's parameters (its 1/dp share under ZeRO >= 1): memory-bound."""
    return optimizer_step_s(kernels, s, params)


def _time_breakdown(
    model: Workload, cluster: Cluster, s: Strategy, kernels: KernelCostModel, pipe: Pipeline, shared: AnalyticCache
) -> tuple[dict[str, float], DataParallelComm, float]:
    """The step's time by part (they sum to the step time), the worst stage's DP/ZeRO traffic, and the bytes of the
    tied-embedding gradient sync. Compute, recompute and blocking communication are the bottleneck stage's."""
    m = s.num_microbatches
    bottleneck = pipe.bottleneck
    dp = shared.data_parallel(s)
    besides = (
        (None, None, None, None, None)
        if dp[0] is None
        else dp_besides(cluster, s, dp[0], interference_of(cluster, kernels))
    )
    comms = shared.dp_comms(s, dp, pipe.dp_groups, besides)
    # the worst stage's exposed tail; every stage's interference, since each stage's reduction slows its last
    # micro-batch's backward and those passes follow one another on the pipeline's drain (stage p-1 first); and
    # the step's start as late as the stage whose first forwards an overlapped ZeRO-1/2 gather delays most (waits
    # and compute lost beside it): the stages' warm-up forwards run side by side, so their delays do not add up
    lead = max(comms, key=lambda c: c.lead_s + c.lead_interference_s)
    # stage k's tail after its last backward is hidden by the drain behind it: stages k-1 .. 0 each run that
    # micro-batch's backward of their first chunk after it (1F1B's cooldown; Megatron-LM: "other pipeline stages do
    # grad reduction during pipeline bubble", schedules.py:2220-2224); a group's earliest stage has the least
    tails = [
        max(0.0, c.exposed_s - k * (st.bwd_s + st.recompute_s) / max(1, len(st.backward_chunks)))
        for c, st, k in zip(comms, pipe.dp_groups, pipe.dp_group_first, strict=True)
    ]
    worst = max(range(len(comms)), key=tails.__getitem__)
    dpc = replace(
        comms[worst],
        exposed_s=tails[worst],
        interference_s=sum(c.interference_s * n for c, n in zip(comms, pipe.dp_group_sizes, strict=True))
        + lead.lead_interference_s,
        overlapped_s=sum(c.overlapped_s * n for c, n in zip(comms, pipe.dp_group_sizes, strict=True))
        + lead.lead_overlapped_s,
        lead_s=lead.lead_s,
    )
    emb_s, emb_bytes = embedding_sync(cluster, s, model)
    optimizer = [_optimizer_s(kernels, s, st.params) for st in pipe.memory_groups]
    bubble = pipe.pipe_s - pipe.send_chain_s - m * bottleneck.time_s
    # the breakdown is the busiest stage's (as the DES reports it): what the drain hides of that stage's own
    # reduction tail is, on its GPU, a wait for communication rather than the pipeline's idle time
    k = pipe.bottleneck_index
    slack = k * (bottleneck.bwd_s + bottleneck.recompute_s) / max(1, len(bottleneck.backward_chunks))
    own = comms[pipe.dp_group_of[k]].exposed_s
    hidden = min(max(0.0, min(own, slack + dpc.exposed_s) - dpc.exposed_s), max(0.0, bubble))
    breakdown = {
        "compute": m * (bottleneck.compute_s - bottleneck.host_s),
        "recompute": m * bottleneck.recompute_s,
        "exposed_comm": m * bottleneck.comm_s + pipe.send_chain_s + dpc.exposed_s + dpc.lead_s + emb_s + hidden,
        "bubble": bubble - hidden,
        "optimizer": max(optimizer),
        "sync_wait": m * bottleneck.sync_s + _slowest_gpu_s(cluster, s, pipe, optimizer),
        "interference": m * bottleneck.interference_s + dpc.interference_s,
        "host_wait": m * bottleneck.host_s,
    }
    return breakdown, dpc, emb_bytes


def _slowest_gpu_s(cluster: Cluster, s: Strategy, pipe: Pipeline, optimizer: list[float]) -> float:
    """What the step waits for its slowest GPU (``plansim.costs.stragglers.straggler_wait_s``): GPUs differ
    persistently, the step ends with a synchronisation of all of them, and the slowest is slow in every kernel of its
    stage (its micro-batches' compute and recompute, and its optimizer step), not in what it waits for the host."""
    m = s.num_microbatches
    busy = max(
        m * (st.compute_s - st.host_s + st.recompute_s - st.recompute_host_s) + optimizer[g]
        for st, g in zip(pipe.stages, pipe.memory_group_of, strict=True)
    )
    return straggler_wait_s(cluster.gpu.gpu_to_gpu_cv, mesh_of(s).num_ranks, busy)


@dataclass(frozen=True)
class StepFrame:
    """A strategy's step up to, not including, its data-parallel traffic: every stage's memory, which does not depend
    on its time, and the priced pipeline, built when first read (``pipe``). The planner reads what fits from it
    before pricing any time (memory first), then a lower bound on the step time (``bound_s``) to skip what cannot
    win; ``assemble_result`` completes it into the ``Result``."""

    model: Workload
    cluster: Cluster
    s: Strategy
    micro_batch_flops: float
    kernels: KernelCostModel
    held: tuple[StageHeld, ...]
    build: Callable[[], Pipeline]
    shared: AnalyticCache
    executed_flops: float
    static: list[dict[str, int]]
    group_of: list[int]
    fixed: list[dict[str, float]]
    peaks: list[float]
    #: with offloading: each stage's host bytes by category (``step.memory.host_states``), else empty
    host: list[dict[str, float]]

    @classmethod
    def of(
        cls,
        model: Workload,
        cluster: Cluster,
        s: Strategy,
        micro_batch_flops: float,
        kernels: KernelCostModel,
        held: tuple[StageHeld, ...],
        build: Callable[[], Pipeline],
        shared: AnalyticCache,
        executed_flops: float = 0.0,
    ) -> StepFrame:
        """Each stage's peak: its model states and workspace (priced once per group of stages that hold alike, as
        ``Pipeline.memory_groups``), its activations and the allocator's rounding of them, its fixed buffers (CUDA
        context, NCCL; ``plansim.step.memory``)."""
        groups: dict[tuple[int, tuple[float, ...], tuple[float, int], float], int] = {}
        static: list[dict[str, int]] = []
        group_of = []
        for st in held:
            g = groups.setdefault((st.params, st.sums.layer_params, st.sums.fp8, st.sums.expert_params), len(static))
            if g == len(static):
                static.append(
                    static_bytes(cluster, s, st.params, st.sums.layer_params, st.sums.fp8, st.sums.expert_params)
                )
            group_of.append(g)
        totals = [sum(x.values()) for x in static]
        fixed = shared.fixed(s)
        peaks = [
            totals[g] + round(st.peak[0]) + round(st.peak[1] - st.peak[0]) + sum(fixed[i].values())
            for i, (g, st) in enumerate(zip(group_of, held, strict=True))
        ]
        host = (
            [host_states(s, st.params, st.host_activations, st.sums.expert_params) for st in held] if s.offload else []
        )
        return cls(model, cluster, s, micro_batch_flops, kernels, held, build, shared, executed_flops, static,
                   group_of, fixed, peaks, host)  # fmt: skip

    @cached_property
    def pipe(self) -> Pipeline:
        """The priced pipeline (``engine._pipeline``), built on first read."""
        return self.build()

    @property
    def worst(self) -> int:
        """The stage with the highest peak (the first of equals)."""
        return max(range(len(self.held)), key=self.peaks.__getitem__)

    @property
    def peak_memory_bytes(self) -> int:
        """The worst stage's peak, as the Result reports it."""
        return int(self.peaks[self.worst])

    @property
    def fits(self) -> bool:
        """Whether the worst stage's peak fits in the device's memory and, with offloading, its host tier in the
        node's host memory (``Result.fits``)."""
        gpu = self.peaks[self.worst] <= self.cluster.gpu.memory_bytes
        return gpu and (not self.host or bool(self.host_memory()["fits"]))

    def host_memory(self) -> dict[str, object]:
        """``Result.host_memory``: the host tier of the stage that keeps the most there (empty without offloading)."""
        if not self.host:
            return {}
        return host_tier(self.cluster, max(self.host, key=lambda h: sum(h.values())))

    def offload(self) -> OffloadTimes:
        """What offloading adds to the step: the stage whose waits for the host are longest (none without it)."""
        if not self.s.offload:
            return OffloadTimes()
        times = [offload_times(self.cluster, self.s, st.params, st.offload) for st in self.held]
        return max(times, key=lambda t: t.transfer_s + t.cpu_adam_s)

    @property
    def memory_margin(self) -> float:
        """The fraction of the device's memory free at the peak (``Result.memory_margin``, computed alike)."""
        capacity = self.cluster.gpu.memory_bytes
        return (capacity - self.peak_memory_bytes) / capacity

    def memory(self) -> dict[str, float]:
        """The worst stage's memory by category (``Result.memory_breakdown_bytes`` before rounding)."""
        worst = self.worst
        peak = self.held[worst].peak
        worst_static = dict(self.static[self.group_of[worst]])
        worst_static["gradients"] += round(peak[2])  # the gradient buffers live at the peak (``activation_peak``)
        return {
            **worst_static, "activations": round(peak[0]) - round(peak[2]), "workspace": worst_static.pop("workspace"),
            **self.fixed[worst], "fragmentation": round(peak[1] - peak[0]),
        }  # fmt: skip

    def least_s(self) -> float:
        """A lower bound on ``bound_s`` read from the stages' sums, before any pipeline is priced: every micro-batch's
        work on the busiest stage (its compute, the recompute its policy reruns, its blocking collectives with their
        waits and interference, each at most what ``stage_cost`` counts), which the schedule's time is at least, every
        stage running every micro-batch (``tests/test_pruning.py`` holds the schedules to it)."""
        scheduled = REMAT_POLICIES[self.s.remat].scheduled
        most = 0.0
        for h in self.held:
            sums = h.sums
            busy = sums.fwd_s + sums.bwd_s + sums.comm_s + sums.sync_s + sums.interference_s
            if not scheduled:
                again = sums.recompute(self.s.remat)
                busy += again[0] + again[1]
            most = max(most, busy)
        return self.s.num_microbatches * most

    def bound_s(self) -> float:
        """A lower bound on the step time, exact in what it counts: the pipeline's time by its schedule (every
        micro-batch's compute, recompute, blocking communication, waits and interference on the bottleneck stage, the
        bubble, the sends' chain), the optimizer step and the wait for the slowest GPU. ``_time_breakdown``'s parts
        sum to this plus what the data-parallel plan adds (its exposed tail and lead, the tied embeddings' sync, the
        interference beside the reduction), each at least zero."""
        optimizer = [_optimizer_s(self.kernels, self.s, st.params) for st in self.pipe.memory_groups]
        bound = self.pipe.pipe_s + max(optimizer) + _slowest_gpu_s(self.cluster, self.s, self.pipe, optimizer)
        if self.s.offload:
            waits = self.offload()
            bound += waits.transfer_s + waits.cpu_adam_s
        return bound


def assemble_result(frame: StepFrame) -> Result:
    """The ``Result`` of a priced frame: its data-parallel traffic priced (``_time_breakdown``) and its memory."""
    model, cluster, s, kernels, pipe = frame.model, frame.cluster, frame.s, frame.kernels, frame.pipe
    m = s.num_microbatches
    breakdown, dpc, emb_bytes = _time_breakdown(model, cluster, s, kernels, pipe, frame.shared)
    if s.offload:  # after the step's own parts: the host link's exposed transfers and the CPU's Adam
        breakdown |= frame.offload().parts()
    step = sum(breakdown.values())
    peaks = frame.peaks
    worst = frame.worst
    memory = frame.memory()
    fits = frame.fits
    host = frame.host_memory()
    return step_result(
        model,
        cluster,
        s,
        engine="analytic",
        step_s=step,
        flops=step_flops(frame.micro_batch_flops, frame.executed_flops, pipe.recompute_matmul_flops, s),
        memory=memory,
        comm={"dp": dpc.dp_bytes + emb_bytes, "pp": m * pipe.p2p_bytes, "zero": dpc.zero_bytes}
        | _by_kind(pipe.axis_bytes, m),
        cost_model=kernels.provenance,
        fits=fits,
        peak_memory_bytes=int(peaks[worst]),
        time_breakdown_s=breakdown,
        reason="" if fits else _no_fit_reason(worst, memory, peaks[worst], cluster, host),
        num_microbatches=m,
        stage_peak_memory_bytes=[int(p) for p in peaks],
        overlap=overlap_figures(
            m * pipe.bottleneck.overlapped_s + dpc.overlapped_s,
            breakdown["interference"],
            interference_of(cluster, kernels).source,
        ),
        host_memory=host,
    )


def _no_fit_reason(
    stage: int, mem: dict[str, float], peak: float, cluster: Cluster, host: dict[str, object] | None = None
) -> str:
    if peak <= cluster.gpu.memory_bytes and host:  # the GPU holds it; the host tier does not fit
        return host_no_fit_reason(cluster, host)
    parts = ", ".join(f"{k} {v / GB:.1f}" for k, v in mem.items())
    return (
        f"stage {stage} needs {peak / GB:.1f} GB ({parts}) but {cluster.gpu.name} has "
        f"{cluster.gpu.memory_bytes / GB:.1f} GB"
    )


def _by_kind(axis_bytes: dict[str, float], m: int) -> dict[str, float]:
    """The layers' collectives' bytes per step by ``COMM_KINDS`` key (``strategy.mesh.comm_kind``: the expert axes'
    tensor parallelism is ``tp``'s): ``m`` micro-batches of each axis's bytes."""
    out: dict[str, float] = {}
    for axis, n_bytes in axis_bytes.items():
        kind = comm_kind(axis)
        out[kind] = out[kind] + m * n_bytes if kind in out else m * n_bytes
    return out
