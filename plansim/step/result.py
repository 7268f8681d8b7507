"""The Result of one priced training step, assembled once for both engines: who ran what (model, hardware, GPUs,
strategy, engine), the step's FLOPs and the rates that follow from its time, the memory categories and communication
kinds in the output contract's order, and where kernel times came from. Each engine brings only its own figures.
``bubble_fraction`` (the breakdown's bubble over the step time) is defined here, and the warning for a fit with
less than 5 % of the memory free at its peak (``THIN_MARGIN``, ``margin_warning``).

Sources: model FLOPs exclude recompute, hardware FLOPs include it (Korthikanti et al. 2022, sec 6); per-GPU rates
and MFU as Narayanan et al. 2021, sec 5.1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plansim.hardware import Cluster
from plansim.result import Result, step_rates
from plansim.step.memory import fp8_categories
from plansim.strategy.mesh import COMM_KINDS, ranks_of
from plansim.strategy.schema import Strategy
from plansim.units import GB
from plansim.workload.traced import Workload

__all__ = [
    "MEMORY_CATEGORIES",
    "THIN_MARGIN",
    "TIME_PARTS",
    "host_no_fit_reason",
    "margin_warning",
    "overlap_figures",
    "step_flops",
    "step_result",
]

#: ``Result.memory_breakdown_bytes`` keys, in order: the tensors (model states, activations), the profile's
#: workspace reserve, then what a real run holds beside the tensors torch counts: the CUDA context, NCCL's buffers,
#: and the caching allocator's rounding of the activations (``plansim.step.memory``).
MEMORY_CATEGORIES = (
    "weights", "gradients", "optimizer", "activations", "workspace", "cuda_context", "nccl", "userbuffers",
    "fragmentation",
)  # fmt: skip

#: ``Result.time_breakdown_s`` keys, in order (they sum to the step time): kernels of the passes, remat's rebuilds,
#: communication nothing hides, the pipeline schedule's idle time, the optimizer step, the waits for the slowest rank
#: (``costs.stragglers``), what collectives running beside compute added to it (``costs.interference``), and what
#: the GPU waited for the host to launch the passes' kernels (``step.layers``: a host-bound step).
TIME_PARTS = (
    "compute", "recompute", "exposed_comm", "bubble", "optimizer", "sync_wait", "interference", "host_wait"
)  # fmt: skip
#: With offloading to host memory (``Strategy.offload``) two more parts follow: the host link's transfers nothing hid
#: (``offload``) and the CPU's optimizer step (``cpu_optimizer``), ``plansim.step.offload.OFFLOAD_PARTS``; a strategy
#: that offloads nothing has neither key, as before offloading existed.

#: Below this fraction of the GPU's memory left free at the peak, a strategy that fits is flagged as a thin margin.
#: Why 5 %: what the memory model leaves out grows with the run and is of that order on an 80 GB GPU: kernels that
#: lazy module loading adds to the CUDA context as they are first used, the communicators a framework creates beyond
#: the step's (the world group), and the allocator's fragmentation from interleaved lifetimes beyond its block
#: rounding (not modelled, plansim.costs.allocator). 5 % of 80 GiB is 4.3 GB: about ten times the CUDA context.
THIN_MARGIN = 0.05


def step_flops(
    micro_batch_flops: float, executed_flops: float, recompute_flops: float, s: Strategy
) -> tuple[float, float]:
    """(model, hardware) FLOPs of the whole step over every GPU, from one rank's per-micro-batch model FLOPs
    (``workload.graph.model_flops``), the FLOPs its kernels execute per micro-batch (``costs.kernels.executed_flops``)
    and its recompute FLOPs per micro-batch (summed over stages): every tp x dp rank runs every micro-batch."""
    copies = ranks_of(s, besides=("pp",)) * s.num_microbatches
    return micro_batch_flops * copies, (executed_flops + recompute_flops) * copies


def overlap_figures(overlapped_s: float, interference_s: float, source: str) -> dict[str, float | str]:
    """``Result.overlap``: seconds compute ran beside communication on the reported stage, the seconds that cost
    (``time_breakdown_s["interference"]``), and where the interference model's measurement came from."""
    return {"overlapped_comm_s": overlapped_s, "interference_s": interference_s, "source": source}


def step_result(
    model: Workload,
    cluster: Cluster,
    s: Strategy,
    *,
    engine: str,
    step_s: float,
    flops: tuple[float, float],
    memory: Mapping[str, float],
    comm: Mapping[str, float],
    cost_model: str,
    **figures: Any,
) -> Result:
    """The Result of ``s``'s step: ``flops`` (model, hardware) from ``step_flops``; ``memory`` by category (the
    worst device's) and ``comm`` bytes one GPU sends by kind, both read in the contract's order (a missing key is
    0); ``figures`` the engine's other Result fields, ``time_breakdown_s`` among them.

    ``bubble_fraction`` is defined here, once for both engines: the breakdown's ``bubble`` (the pipeline schedule's
    idle time of compute on the critical stage; waits for data-parallel communication are exposed communication)
    over the step time."""
    model_fl, hardware_fl = flops
    bubble = figures.get("time_breakdown_s", {}).get("bubble", 0.0)
    capacity = cluster.gpu.memory_bytes
    margin = (capacity - figures["peak_memory_bytes"]) / capacity
    warning = margin_warning(margin, capacity) if figures.get("fits", True) else ""
    return Result(
        model=model.name,
        hardware=cluster.name,
        gpus=cluster.num_gpus,
        strategy=s.model_dump(exclude=None if s.fp8 else {"fp8_recipe", "fp8_param_gather"}),
        engine=engine,
        **step_rates(
            step_s=step_s,
            tokens=s.batch * model.seq_len,
            model_flops=model_fl,
            hardware_flops=hardware_fl,
            gpus=cluster.num_gpus,
            peak_flops=cluster.gpu.peak_flops(s.compute_dtype),
        ),
        memory_breakdown_bytes={k: round(memory.get(k, 0)) for k in (*MEMORY_CATEGORIES, *fp8_categories(s))},
        comm_bytes_per_gpu={k: comm.get(k, 0.0) for k in COMM_KINDS},
        cost_model=cost_model,
        bubble_fraction=bubble / step_s if step_s > 0 else 0.0,
        memory_margin=margin,
        warnings=[warning] if warning else [],
        seq_len=model.seq_len,
        **figures,
    )


def host_no_fit_reason(cluster: Cluster, host: Mapping[str, Any]) -> str:
    """Why a strategy whose GPUs hold it does not fit: its host tier (``Result.host_memory``) exceeds the node's
    host memory; one line."""
    per_gpu = host["per_gpu_bytes"]
    parts = ", ".join(f"{k} {v / GB:.1f}" for k, v in per_gpu.items() if v)
    return (
        f"the host tier needs {host['per_node_bytes'] / GB:.1f} GB per node ({host['per_gpu_total_bytes'] / GB:.1f} "
        f"GB per GPU: {parts}) but {cluster.node.name} has {host['capacity_bytes'] / GB:.1f} GB of host memory"
    )


def margin_warning(margin: float, capacity: float) -> str:
    """The warning for a strategy that fits with ``margin`` (a fraction of ``capacity`` bytes) left at its peak
    below ``THIN_MARGIN``; empty otherwise.

    >>> margin_warning(0.066, 85.9e9)
    ''
    >>> margin_warning(0.02, 85.9e9)
    'thin memory margin: 1.7 GB (2.0% of 85.9 GB) free at the peak, below 5%; a real run may not fit'
    """
    if margin >= THIN_MARGIN:
        return ""
    return (
        f"thin memory margin: {margin * capacity / GB:.1f} GB ({margin:.1%} of {capacity / GB:.1f} GB) free at the "
        f"peak, below {THIN_MARGIN:.0%}; a real run may not fit"
    )
