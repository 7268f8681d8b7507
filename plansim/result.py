"""The one result type every engine returns; it converts to the JSON output contract (``Result.to_dict``) and to a
pandas row (``Result.to_row``). ``step_rates`` gives the fields that follow from a step time (throughput, FLOP rates,
MFU and HFU), for both engines."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict

__all__ = ["FLOPS_CONVENTION", "Result", "StepRates", "step_rates"]

#: What MFU and HFU divide by the step time, the GPUs and the GPU's dense peak at the training dtype (every Result
#: carries it as ``flops_convention``). Model FLOPs are Megatron-LM's ``num_floating_point_operations`` (NVIDIA/
#: Megatron-LM d98e8a64, megatron/training/training.py:1146-1169); hardware FLOPs what the GPU executes, recomputation
#: included (Korthikanti et al. 2022, sec 6), so that HFU cannot pass 1.
FLOPS_CONVENTION = {
    "mfu": "model FLOPs as Megatron-LM counts them: 3x the forward matmuls, causal attention over half the scores, "
    "no recomputation",
    "hfu": "hardware FLOPs the kernels execute: forward and backward matmuls, a fused causal attention kernel over "
    "half the scores (its backward recomputing QK^T), and every recomputation",
}


@dataclass(frozen=True)
class Result:
    """One training step's prediction for (model, hardware, gpus, strategy) by one engine.

    Figures are SI: seconds, bytes, FLOPs. ``memory_breakdown_bytes`` and ``peak_memory_bytes`` are the worst
    device's (the pipeline stage with the highest peak); ``comm_bytes_per_gpu`` counts bytes one GPU sends per step,
    by kind (dp: gradient reduction, tp: tensor-parallel collectives, pp: pipeline send/recv, zero: ZeRO parameter
    gathers). ``time_breakdown_s`` sums to ``step_time_s``; its ``interference`` is what communication running beside
    compute added to the step, and ``overlap`` says how long they ran together (``overlapped_comm_s``), that cost
    again (``interference_s``) and where the interference model's measurement came from (``source``).
    """

    model: str
    hardware: str
    gpus: int
    strategy: dict[str, Any]
    engine: str
    step_time_s: float
    tokens_per_s: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    fits: bool
    peak_memory_bytes: int
    memory_breakdown_bytes: dict[str, int]
    comm_bytes_per_gpu: dict[str, float]
    time_breakdown_s: dict[str, float]
    reason: str = ""
    num_microbatches: int = 1
    #: ``time_breakdown_s["bubble"] / step_time_s``: the pipeline schedule's idle time of compute on the critical
    #: stage (not waits for data-parallel communication, which are exposed communication), over the whole step; the
    #: same definition in both engines (``plansim.step.result.step_result``).
    bubble_fraction: float = 0.0
    stage_peak_memory_bytes: list[int] = field(default_factory=list)
    stage_time_breakdown_s: list[dict[str, float]] = field(default_factory=list)
    busiest_links: list[dict[str, Any]] = field(default_factory=list)
    engine_stats: dict[str, Any] = field(default_factory=dict)
    overlap: dict[str, Any] = field(default_factory=dict)
    #: Where the kernel times came from: a measured profile (file, device, torch, date) or the roofline.
    cost_model: str = ""
    #: The fraction of the GPU's memory left free at the worst device's peak (negative: over by that much).
    memory_margin: float = 0.0
    #: What the caller should know about this result (a thin memory margin: ``plansim.step.result.THIN_MARGIN``).
    warnings: list[str] = field(default_factory=list)
    #: The host memory tier where the strategy offloads (``Strategy.offload``; empty otherwise): one GPU's host bytes
    #: by category (``per_gpu_bytes``: weights, gradients, optimizer, activations) and in all
    #: (``per_gpu_total_bytes``), the node's (``per_node_bytes``), its host memory (``capacity_bytes``) and whether
    #: they fit (``fits``; ``Result.fits`` is false where they do not) - ``plansim.step.offload.host_tier``.
    host_memory: dict[str, Any] = field(default_factory=dict)
    #: The tokens per sequence the step was priced at (the model's, or the run's ``seq_len``: ``plansim.api``).
    seq_len: int = 0
    #: What ``mfu`` and ``hfu`` count (``FLOPS_CONVENTION``).
    flops_convention: dict[str, str] = field(default_factory=lambda: dict(FLOPS_CONVENTION))
    #: The discrete-event engine's spans, memory timelines and per-link traffic (``plansim.des.timeline.Timeline``); not
    #: part of the JSON output (write it with ``timeline.write_trace``).
    timeline: Any = field(default=None, compare=False, repr=False)
    #: How long the engine ran, in seconds (the discrete-event engine: ``wall_s``). Not part of the JSON output, so
    #: that the same input gives the same bytes; for benchmarks and Python users.
    timings: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The output contract of ``plansim simulate --format json`` (see DESIGN.md), plus extra fields; nothing
        that varies from run to run (``timeline`` and ``timings`` stay on the object)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in _NOT_IN_OUTPUT}

    def to_row(self) -> dict[str, Any]:
        """A flat dict (nested breakdowns as ``time_breakdown_s.compute`` ...) for one pandas DataFrame row."""
        row: dict[str, Any] = {}
        for key, value in self.to_dict().items():
            if isinstance(value, dict):
                row.update({f"{key}.{k}": v for k, v in value.items()})
            elif not isinstance(value, list):
                row[key] = value
        return row


_NOT_IN_OUTPUT = frozenset({"timeline", "timings"})


def _plain(value: Any) -> Any:
    """A JSON-ready deep copy (dicts and lists copied so callers cannot mutate the frozen result)."""
    return copy.deepcopy(value)


class StepRates(TypedDict):
    """The Result fields ``step_rates`` fills."""

    step_time_s: float
    tokens_per_s: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float


def step_rates(
    *, step_s: float, tokens: float, model_flops: float, hardware_flops: float, gpus: int, peak_flops: float
) -> StepRates:
    """The Result fields that follow from the step time: throughput, FLOP rates per GPU, MFU and HFU (model FLOPs
    exclude recompute, hardware FLOPs include it: Korthikanti et al. 2022, sec 6)."""
    return StepRates(
        step_time_s=step_s,
        tokens_per_s=tokens / step_s,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hardware_flops,
        model_tflops_per_gpu=model_flops / step_s / gpus / 1e12,
        hardware_tflops_per_gpu=hardware_flops / step_s / gpus / 1e12,
        mfu=model_flops / step_s / gpus / peak_flops,
        hfu=hardware_flops / step_s / gpus / peak_flops,
    )
