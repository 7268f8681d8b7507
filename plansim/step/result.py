"""The Result of one priced training step, assembled once for both engines: who ran what (model, hardware, GPUs,
strategy, engine), the step's FLOPs and the rates that follow from its time, the memory categories and communication
kinds in the output contract's order, and where kernel times came from. Each engine brings only its own figures.

Sources: model FLOPs exclude recompute, hardware FLOPs include it (Korthikanti et al. 2022, sec 6); per-GPU rates
and MFU as Narayanan et al. 2021, sec 5.1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plansim.hardware import Cluster
from plansim.result import Result, step_rates
from plansim.strategy import Strategy
from plansim.workload.traced import Workload

__all__ = ["BREAKDOWN_PARTS", "COMM_KINDS", "MEMORY_CATEGORIES", "overlap_figures", "step_flops", "step_result"]

#: ``Result.memory_breakdown_bytes`` keys, in order.
MEMORY_CATEGORIES = ("weights", "gradients", "optimizer", "activations", "workspace")

#: ``Result.time_breakdown_s`` keys, in order: the parts of the step (they sum to it); ``interference`` is what
#: collectives running beside compute added to it (``plansim.costs.interference``).
BREAKDOWN_PARTS = ("compute", "recompute", "exposed_comm", "bubble", "optimizer", "interference")

#: ``Result.comm_bytes_per_gpu`` keys, in order: gradient reduction, tensor-parallel collectives (the tp axis),
#: pipeline sends, ZeRO's parameter gathers.
COMM_KINDS = ("dp", "tp", "pp", "zero")


def step_flops(micro_batch_flops: float, recompute_flops: float, s: Strategy) -> tuple[float, float]:
    """(model, hardware) FLOPs of the whole step over every GPU, from one rank's per-micro-batch model FLOPs and
    its recompute FLOPs per micro-batch (summed over stages): every tp x dp rank runs every micro-batch."""
    copies = s.tp * (s.dp or 1) * s.num_microbatches
    model = micro_batch_flops * copies
    return model, model + recompute_flops * copies


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
    0); ``figures`` the engine's other Result fields."""
    model_fl, hardware_fl = flops
    return Result(
        model=model.name,
        hardware=cluster.name,
        gpus=cluster.num_gpus,
        strategy=s.model_dump(),
        engine=engine,
        **step_rates(
            step_s=step_s,
            tokens=s.batch * model.seq_len,
            model_flops=model_fl,
            hardware_flops=hardware_fl,
            gpus=cluster.num_gpus,
            peak_flops=cluster.gpu.peak_flops(s.compute_dtype),
        ),
        memory_breakdown_bytes={k: round(memory.get(k, 0)) for k in MEMORY_CATEGORIES},
        comm_bytes_per_gpu={k: comm.get(k, 0.0) for k in COMM_KINDS},
        cost_model=cost_model,
        **figures,
    )
