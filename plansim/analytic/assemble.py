"""The analytic engine's step from its priced pipeline: the time breakdown (compute, recompute, exposed
communication, bubble, optimizer, wait for the slowest GPU, interference; they sum to the step time), the worst
stage's memory, and the ``Result`` (``plansim.step.result``).
"""

from __future__ import annotations

from dataclasses import replace

from plansim.analytic.cache import AnalyticCache
from plansim.analytic.data_parallel import DataParallelComm, dp_besides, embedding_sync
from plansim.analytic.pipeline import Pipeline
from plansim.analytic.stages import interference_of
from plansim.costs.kernels import KernelCostModel
from plansim.costs.stragglers import straggler_wait_s
from plansim.hardware import Cluster
from plansim.result import Result
from plansim.step.memory import static_bytes
from plansim.step.optimizer import optimizer_step_s
from plansim.step.result import overlap_figures, step_flops, step_result
from plansim.strategy.mesh import mesh_of
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
    besides = (None, None, None) if dp[0] is None else dp_besides(cluster, s, dp[0], interference_of(cluster, kernels))
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
        "compute": m * bottleneck.compute_s,
        "recompute": m * bottleneck.recompute_s,
        "exposed_comm": m * bottleneck.comm_s + pipe.send_chain_s + dpc.exposed_s + dpc.lead_s + emb_s + hidden,
        "bubble": bubble - hidden,
        "optimizer": max(optimizer),
        "sync_wait": m * bottleneck.sync_s + _slowest_gpu_s(cluster, s, pipe, optimizer),
        "interference": m * bottleneck.interference_s + dpc.interference_s,
    }
    return breakdown, dpc, emb_bytes


def _slowest_gpu_s(cluster: Cluster, s: Strategy, pipe: Pipeline, optimizer: list[float]) -> float:
    """What the step waits for its slowest GPU (``plansim.costs.stragglers.straggler_wait_s``): GPUs differ
    persistently, the step ends with a synchronisation of all of them, and the slowest is slow in every kernel of its
    stage (its micro-batches' compute and recompute, and its optimizer step)."""
    m = s.num_microbatches
    busy = max(
        m * (st.compute_s + st.recompute_s) + optimizer[g]
        for st, g in zip(pipe.stages, pipe.memory_group_of, strict=True)
    )
    return straggler_wait_s(cluster.gpu.gpu_to_gpu_cv, mesh_of(s).num_ranks, busy)


def assemble_result(
    model: Workload,
    cluster: Cluster,
    s: Strategy,
    micro_batch_flops: float,
    kernels: KernelCostModel,
    pipe: Pipeline,
    shared: AnalyticCache,
    *,
    kernel_recompute: float = 0.0,
) -> Result:
    m = s.num_microbatches
    stages = pipe.stages
    breakdown, dpc, emb_bytes = _time_breakdown(model, cluster, s, kernels, pipe, shared)
    step = sum(breakdown.values())
    static = [static_bytes(cluster, s, st.params, st.layer_params) for st in pipe.memory_groups]
    totals = [sum(x.values()) for x in static]
    fixed = shared.fixed(s)
    peaks = [
        totals[g] + a + f + sum(fixed[i].values())
        for i, (g, a, f) in enumerate(zip(pipe.memory_group_of, pipe.activations, pipe.fragmentation, strict=True))
    ]
    worst = max(range(len(stages)), key=peaks.__getitem__)
    worst_static = dict(static[pipe.memory_group_of[worst]])
    memory = {
        **worst_static, "activations": pipe.activations[worst], "workspace": worst_static.pop("workspace"),
        **fixed[worst], "fragmentation": pipe.fragmentation[worst],
    }  # fmt: skip
    fits = peaks[worst] <= cluster.gpu.memory_bytes
    return step_result(
        model,
        cluster,
        s,
        engine="analytic",
        step_s=step,
        flops=step_flops(micro_batch_flops, pipe.recompute_matmul_flops + kernel_recompute, s),
        memory=memory,
        comm={"dp": dpc.dp_bytes + emb_bytes, "pp": m * pipe.p2p_bytes, "zero": dpc.zero_bytes}
        | {axis: m * n_bytes for axis, n_bytes in pipe.axis_bytes.items()},
        cost_model=kernels.provenance,
        fits=fits,
        peak_memory_bytes=int(peaks[worst]),
        time_breakdown_s=breakdown,
        reason="" if fits else _no_fit_reason(worst, memory, peaks[worst], cluster),
        num_microbatches=m,
        stage_peak_memory_bytes=[int(p) for p in peaks],
        overlap=overlap_figures(
            m * pipe.bottleneck.overlapped_s + dpc.overlapped_s,
            breakdown["interference"],
            interference_of(cluster, kernels).source,
        ),
    )


def _no_fit_reason(stage: int, mem: dict[str, float], peak: float, cluster: Cluster) -> str:
    parts = ", ".join(f"{k} {v / GB:.1f}" for k, v in mem.items())
    return (
        f"stage {stage} needs {peak / GB:.1f} GB ({parts}) but {cluster.gpu.name} has "
        f"{cluster.gpu.memory_bytes / GB:.1f} GB"
    )
