"""Pydantic schemas of the hardware profiles: one GPU file (``gpus/*.yaml``) and one node-type file (``nodes/*.yaml``).

Every model forbids unknown keys, so a misspelt key fails with the file and field named (see ``loader``). Units are
in the key names and SI inside: bytes, seconds, bytes/s, FLOP/s. The numbers themselves live in the YAML files, each
with its source beside it; nothing here holds a hardware constant.
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from plansim.errors import PlansimError
from plansim.hardware.link import Link
from plansim.limits import field
from plansim.units import DTYPE_BYTES

__all__ = [
    "AMD_ARCHITECTURES",
    "Architecture",
    "AttentionCurves",
    "AttentionKernel",
    "Dtype",
    "EfficiencyCurves",
    "FabricTier",
    "GPUSpec",
    "GPUUncertainty",
    "HostSection",
    "IntraNode",
    "Nics",
    "NodeSpec",
    "NodeUncertainty",
    "OverlapMeasurement",
]

#: The dtypes a GPU profile may list under ``peak_flops``.
Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]

#: For a dtype a GPU lacks, the dtypes to suggest instead, best first.
_ALTERNATIVES: dict[str, tuple[str, ...]] = {
    "bf16": ("fp16", "fp32"),
    "fp16": ("bf16", "fp32"),
    "fp8": ("bf16", "fp16"),
    "tf32": ("fp32",),
    "fp32": ("tf32",),
}

PositiveFloat = Annotated[float, field("hardware_number")]
Fraction = Annotated[float, Field(gt=0, le=1)]
CurvePoint = tuple[PositiveFloat, Fraction]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EfficiencyCurves(_Strict):
    """Achievable fraction of peak as a function of kernel size, as (size, fraction) points.

    ``matmul`` is indexed by the FLOPs of one GEMM, ``memory`` by the bytes one memory-bound kernel moves. Between
    points the fraction is interpolated linearly in log10(size); outside them it is clamped to the end points.
    """

    matmul: tuple[CurvePoint, ...] = Field(min_length=1)
    memory: tuple[CurvePoint, ...] = Field(min_length=1)
    #: one FP8 GEMM's fraction of the fp8 peak by its FLOPs (GPUs with an fp8 peak; ``dtype: fp8`` needs it)
    matmul_fp8: tuple[CurvePoint, ...] | None = Field(default=None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _moved_attention(cls, data: object) -> object:
        """A profile written before fused attention was priced per kernel: say where its curves go now."""
        if isinstance(data, dict) and ({"attention_fwd", "attention_bwd"} & data.keys()):
            raise ValueError(
                "attention_fwd and attention_bwd moved: put them under attention_kernels.<kernel>.fwd and .bwd "
                "(kernel flash2, flash3 or cudnn, with its source; docs/hardware-profiles.md)"
            )
        return data

    @field_validator("matmul", "memory", "matmul_fp8")
    @classmethod
    def _sizes_increase(cls, points: tuple[CurvePoint, ...] | None) -> tuple[CurvePoint, ...] | None:
        return None if points is None else _increasing(points)


#: GPU architectures, as their vendors name them: NVIDIA's, and AMD's CDNA 3 (Instinct MI300X).
Architecture = Literal["volta", "turing", "ampere", "ada", "hopper", "blackwell", "cdna3"]

#: The architectures of AMD GPUs, whose collectives run on RCCL, not NCCL (``GPUSpec.vendor``).
AMD_ARCHITECTURES = frozenset({"cdna3"})

#: Fused attention kernels a framework may call (``plansim.strategy.frameworks``: its ``attention_kernel`` rule):
#: FlashAttention-2 and -3 (the flash-attn package; FlashAttention-2 is also PyTorch SDPA's bundled flash backend)
#: and cuDNN's fused attention (Transformer Engine's FusedAttention, PyTorch SDPA's cudnn backend).
AttentionKernel = Literal["flash2", "flash3", "cudnn"]


class AttentionCurves(_Strict):
    """One fused attention kernel's achieved fraction of the training dtype's peak, forward and backward, by the
    FLOPs one call executes (a causal kernel's half), from a cited kernel benchmark (``source``)."""

    fwd: tuple[CurvePoint, ...] = Field(min_length=1)
    bwd: tuple[CurvePoint, ...] = Field(min_length=1)
    source: str = Field(min_length=3)

    @field_validator("fwd", "bwd")
    @classmethod
    def _sizes_increase(cls, points: tuple[CurvePoint, ...]) -> tuple[CurvePoint, ...]:
        return _increasing(points)


def _increasing(points: tuple[CurvePoint, ...]) -> tuple[CurvePoint, ...]:
    sizes = [size for size, _ in points]
    if any(b <= a for a, b in itertools.pairwise(sizes)):
        raise ValueError(f"sizes must strictly increase, got {sizes}: sort the points and drop duplicates")
    return points


def _interpolate(points: tuple[CurvePoint, ...], size: float) -> float:
    """Interpolate ``points`` at ``size`` in log10(size), clamped at the ends."""
    sizes = np.log10([s for s, _ in points])
    fractions = [f for _, f in points]
    x = math.log10(size) if size > 0 else -math.inf
    return float(np.interp(x, sizes, fractions))


class OverlapMeasurement(_Strict):
    """One compute kernel timed alone and while a communication load ran beside it on the same GPU.

    ``alone_s`` and ``overlapped_s``: the kernel's time without and with the load; ``channels``: the SMs the load
    held for itself (NCCL runs one thread block per channel on an SM of its own; a copy stream holds none);
    ``load_hbm_Bps``: the HBM bytes per second the load moved while they overlapped; ``source``: where the figures
    come from. ``plansim.costs.interference`` splits the slowdown into the SM share and a memory-contention part.
    """

    kernel: str = Field(min_length=1)
    alone_s: PositiveFloat
    overlapped_s: PositiveFloat
    channels: int = Field(ge=0, le=1_024)
    load_hbm_Bps: PositiveFloat
    source: str = Field(min_length=1)
    #: The SMs and HBM bandwidth of the GPU the kernel was timed on, where that is not the profile's own GPU (a
    #: measurement borrowed from another GPU model: ``plansim.uncertainty`` varies the reference's this way).
    measured_sm_count: int | None = Field(default=None, ge=1, le=100_000)
    measured_hbm_Bps: PositiveFloat | None = None

    @model_validator(mode="after")
    def _slower(self) -> OverlapMeasurement:
        if self.overlapped_s < self.alone_s:
            raise ValueError(
                f"overlapped_s ({self.overlapped_s}) is below alone_s ({self.alone_s}): a kernel sharing the GPU is "
                "not faster than alone; swap them"
            )
        return self


def _check_range(value: tuple[float, float] | None) -> tuple[float, float] | None:
    if value is not None and value[0] > value[1]:
        raise ValueError(f"range {list(value)}: give [low, high] with low <= high")
    return value


#: A range of an uncertain input, [low, high], both ends included.
Range = tuple[float, float]


class GPUUncertainty(_Strict):
    """How far a GPU profile's uncertain inputs may be off, each as [low, high] around the profile's value, from the
    spread of the micro-benchmark sources cited beside it (``plansim.uncertainty``: break-even values and ``plan
    --robust``). ``gemm_efficiency``: a large GEMM's fraction of the dtype's peak (the top of ``efficiency.matmul``);
    ``interference``: how many times longer the overlap measurement's kernel takes beside its collective
    (``overlapped_s / alone_s``); ``gpu_to_gpu_cv``: the chip-to-chip coefficient of variation."""

    gemm_efficiency: Range | None = None
    interference: Range | None = None
    gpu_to_gpu_cv: Range | None = None

    @field_validator("gemm_efficiency", "interference", "gpu_to_gpu_cv")
    @classmethod
    def _ordered(cls, value: Range | None) -> Range | None:
        return _check_range(value)


class HostSection(_Strict):
    """The node's host: the second memory tier a strategy may offload to (``Strategy.offload``,
    ``plansim.step.offload``). ``link``: how each GPU reaches its CPU (PCIe Gen4/Gen5 x16, or NVLink-C2C);
    ``link_bandwidth_Bps`` the line rate per direction of one uplink to the CPU (a GPU's own x16 link is as
    fast) and ``link_efficiency`` the fraction a pinned ``cudaMemcpyAsync`` achieves; ``link_latency_s`` one copy's
    fixed cost; ``gpus_per_uplink`` how many GPUs share one uplink (a PCIe switch's x16 port, a Grace's C2C; 1: each
    GPU has its own), whose bandwidth they share when they copy at once, as every rank of a step does;
    ``memory_bytes`` the node's host memory; ``cpu_adam_params_per_s`` the parameters per second the node's CPUs
    step with Adam (DeepSpeed's CPU-Adam), shared by its GPUs. Every number carries its source in the profile."""

    link: Literal["pcie_gen4", "pcie_gen5", "nvlink_c2c"]
    link_bandwidth_Bps: PositiveFloat
    link_efficiency: Fraction
    link_latency_s: PositiveFloat
    gpus_per_uplink: int = field("gpus_per_uplink", default=1)
    memory_bytes: int = field("host_memory_bytes")
    cpu_adam_params_per_s: PositiveFloat

    @property
    def achieved_Bps(self) -> float:
        """What one uplink moves per direction: its line rate times the achieved fraction."""
        return self.link_bandwidth_Bps * self.link_efficiency


class NodeUncertainty(_Strict):
    """A node profile's uncertain inputs, as ``GPUUncertainty``: ``inter_node_efficiency``, the fraction of the NICs'
    line rate collectives across nodes reach (``nics.efficiency``)."""

    inter_node_efficiency: Range | None = None

    @field_validator("inter_node_efficiency")
    @classmethod
    def _ordered(cls, value: Range | None) -> Range | None:
        return _check_range(value)


def _check_within(name: str, value: float, bounds: Range | None) -> None:
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise ValueError(
            f"uncertainty.{name} {list(bounds)} does not hold the profile's own value {value:g}: widen the range"
        )


class GPUSpec(_Strict):
    """One GPU model: memory, bandwidth, dense peak FLOP/s per dtype and default efficiency curves.

    Examples
    --------
    >>> from plansim.hardware import load_gpu
    >>> gpu = load_gpu("a100-sxm4-80gb")
    >>> gpu.peak_flops("bf16") / 1e12
    312.0
    >>> gpu.supports("fp8")
    False
    """

    name: str = Field(min_length=1)
    memory_bytes: int = field("memory_bytes")
    hbm_bandwidth_Bps: PositiveFloat
    peak_flops_by_dtype: dict[Dtype, PositiveFloat] = Field(alias="peak_flops", min_length=1)
    efficiency: EfficiencyCurves
    #: The GPU's architecture, which decides a framework's fused attention kernel and the GPU's vendor (None: not
    #: stated, an NVIDIA GPU).
    architecture: Architecture | None = None
    #: Fused attention kernels' rates by kernel (``AttentionKernel``); a kernel not listed is priced as a GEMM.
    attention_kernels: dict[AttentionKernel, AttentionCurves] = Field(default_factory=dict)
    kernel_launch_s: float = field("kernel_launch_s")
    workspace_reserve_bytes: int = field("workspace_reserve_bytes")
    #: Run-to-run coefficient of variation of one kernel's time on one GPU, independent per kernel (a measured
    #: profile's repeats replace it); 0 when unknown. Synchronising collectives wait for the slowest member's
    #: noise (``plansim.costs.stragglers``).
    kernel_time_cv: float = field("cv", default=0.0)
    #: Coefficient of variation of one kernel's time between GPUs of this model (persistent per GPU:
    #: manufacturing and power management); the step waits for the slowest GPU. 0 when unknown.
    gpu_to_gpu_cv: float = field("cv", default=0.0)
    #: Device memory of the CUDA context (driver, loaded kernels) per process, which no allocator counter sees.
    cuda_context_bytes: int = field("cuda_context_bytes", default=0)
    #: Streaming multiprocessors (None: unknown, and communication is then taken to hold no SM of compute's).
    sm_count: int | None = Field(default=None, ge=1, le=100_000)
    #: A published measurement of compute slowed by a concurrent collective on this GPU (None: none published).
    overlap: OverlapMeasurement | None = None
    #: The ranges of the uncertain inputs (None: the profile gives none, and they are held at its values).
    uncertainty: GPUUncertainty | None = None

    @model_validator(mode="after")
    def _reserve_fits(self) -> GPUSpec:
        if self.overlap is not None and self.sm_count is not None and self.overlap.channels >= self.sm_count:
            raise ValueError(
                f"overlap.channels ({self.overlap.channels}) must be below sm_count ({self.sm_count}): the load "
                "cannot hold every SM"
            )
        if self.uncertainty is not None:
            u = self.uncertainty
            _check_within("gemm_efficiency", max(f for _, f in self.efficiency.matmul), u.gemm_efficiency)
            _check_within("gpu_to_gpu_cv", self.gpu_to_gpu_cv, u.gpu_to_gpu_cv)
            if self.overlap is not None:
                _check_within("interference", self.overlap.overlapped_s / self.overlap.alone_s, u.interference)
            for name, bounds in (("gemm_efficiency", u.gemm_efficiency), ("gpu_to_gpu_cv", u.gpu_to_gpu_cv)):
                if bounds is not None and not (bounds[0] >= 0 and bounds[1] <= 1):
                    raise ValueError(f"uncertainty.{name} {list(bounds)}: a fraction, within [0, 1]")
            if u.interference is not None and u.interference[0] < 1:
                raise ValueError(
                    f"uncertainty.interference {list(u.interference)}: a slowdown, at least 1 (no slower than alone)"
                )
        fixed = self.workspace_reserve_bytes + self.cuda_context_bytes
        if fixed >= self.memory_bytes:
            raise ValueError(
                f"workspace_reserve_bytes + cuda_context_bytes ({fixed}) must be below memory_bytes "
                f"({self.memory_bytes})"
            )
        return self

    def __hash__(self) -> int:
        return hash((self.name, self.memory_bytes, self.hbm_bandwidth_Bps))

    @property
    def vendor(self) -> Literal["nvidia", "amd"]:
        """Who makes the GPU, by its ``architecture``: ``amd`` (collectives on RCCL, whose tuning and buffers
        plansim's NCCL models do not describe) or ``nvidia`` (NCCL).

        >>> from plansim.hardware import load_gpu
        >>> load_gpu("mi300x-192gb").vendor, load_gpu("h100-sxm5-80gb").vendor
        ('amd', 'nvidia')
        """
        return "amd" if self.architecture in AMD_ARCHITECTURES else "nvidia"

    def supports(self, dtype: str) -> bool:
        """Whether the GPU has a peak rate for ``dtype`` (tensor cores for the low-precision types).

        >>> from plansim.hardware import load_gpu
        >>> load_gpu("v100-sxm2-32gb").supports("bf16")
        False
        """
        return dtype in self.peak_flops_by_dtype

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``.

        Raises
        ------
        PlansimError
            If the dtype is unknown or the GPU lacks it; the message names the dtypes it has.

        >>> from plansim.hardware import load_gpu
        >>> load_gpu("v100-sxm2-32gb").peak_flops("bf16")
        Traceback (most recent call last):
        ...
        plansim.errors.PlansimError: V100-SXM2-32GB has no bf16 tensor cores: use dtype=fp16 (it has fp32, fp16)
        """
        if dtype not in DTYPE_BYTES:
            raise PlansimError(f"unknown dtype '{dtype}': use one of {', '.join(DTYPE_BYTES)}")
        if dtype not in self.peak_flops_by_dtype:
            have = list(self.peak_flops_by_dtype)
            alternative = next((d for d in _ALTERNATIVES[dtype] if d in have), have[0])
            units = "support" if dtype == "fp32" else "tensor cores"
            raise PlansimError(
                f"{self.name} has no {dtype} {units}: use dtype={alternative} (it has {', '.join(have)})"
            )
        return self.peak_flops_by_dtype[dtype]

    def matmul_efficiency(self, flops: float) -> float:
        """Achievable fraction of peak for one GEMM of ``flops`` FLOPs (the ``efficiency.matmul`` curve).

        >>> from plansim.hardware import load_gpu
        >>> load_gpu("a100-sxm4-80gb").matmul_efficiency(1e13)
        0.78
        """
        return _interpolate(self.efficiency.matmul, flops)

    def fp8_matmul_efficiency(self, flops: float) -> float:
        """Achievable fraction of the fp8 peak for one FP8 GEMM of ``flops`` FLOPs (``efficiency.matmul_fp8``).

        >>> from plansim.hardware import load_gpu
        >>> load_gpu("h100-sxm5-80gb").fp8_matmul_efficiency(8.796e12)
        0.696

        Raises
        ------
        PlansimError
            If the profile has no ``matmul_fp8`` curve.
        """
        if self.efficiency.matmul_fp8 is None:
            raise PlansimError(f"{self.name} has no efficiency.matmul_fp8 curve: add one (docs/hardware-profiles.md)")
        return _interpolate(self.efficiency.matmul_fp8, flops)

    def attention_efficiency(self, kernel: str | None, direction: str, flops: float) -> float | None:
        """Achieved fraction of peak of fused attention kernel ``kernel``'s ``direction`` (``fwd`` or ``bwd``) pass
        executing ``flops`` FLOPs (its ``attention_kernels`` curves), or None where the profile has none for it.

        >>> from plansim.hardware import load_gpu
        >>> round(load_gpu("h100-sxm5-80gb").attention_efficiency("flash3", "fwd", 1e13), 3)
        0.623
        >>> load_gpu("v100-sxm2-32gb").attention_efficiency("flash2", "fwd", 1e13) is None
        True
        """
        curves = self.attention_kernels.get(kernel) if kernel is not None else None  # type: ignore[call-overload]
        if curves is None:
            return None
        return _interpolate(curves.fwd if direction == "fwd" else curves.bwd, flops)

    def memory_efficiency(self, nbytes: float) -> float:
        """Achievable fraction of memory bandwidth for a memory-bound kernel moving ``nbytes`` bytes.

        >>> from plansim.hardware import load_gpu
        >>> load_gpu("a100-sxm4-80gb").memory_efficiency(1e10)
        0.88
        """
        return _interpolate(self.efficiency.memory, nbytes)


class IntraNode(_Strict):
    """The GPU-to-GPU fabric inside one node.

    ``bandwidth_per_gpu_Bps`` is the per-direction line rate of one GPU into the fabric; ``allreduce_busbw_Bps`` is
    the measured NCCL all-reduce bus bandwidth over all GPUs of the node, so their ratio is the link efficiency.
    An ``nvlink_mesh`` (no switch) also lists its point-to-point ``links`` as [gpu_a, gpu_b, link_count] with the
    per-link ``link_bandwidth_Bps``.
    """

    topology: Literal["nvswitch", "nvlink_mesh", "pcie"]
    bandwidth_per_gpu_Bps: PositiveFloat
    allreduce_busbw_Bps: PositiveFloat
    latency_s: PositiveFloat
    link_bandwidth_Bps: PositiveFloat | None = None
    links: tuple[tuple[int, int, int], ...] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> IntraNode:
        if self.allreduce_busbw_Bps > self.bandwidth_per_gpu_Bps:
            raise ValueError(
                "allreduce_busbw_Bps exceeds bandwidth_per_gpu_Bps: a measured bus bandwidth is at most the line rate"
            )
        is_mesh = self.topology == "nvlink_mesh"
        if is_mesh and (self.links is None or self.link_bandwidth_Bps is None):
            raise ValueError("topology nvlink_mesh needs 'links' and 'link_bandwidth_Bps'")
        if not is_mesh and (self.links is not None or self.link_bandwidth_Bps is not None):
            raise ValueError(f"'links' and 'link_bandwidth_Bps' apply only to nvlink_mesh, not {self.topology}")
        return self

    @property
    def efficiency(self) -> float:
        """Measured bus bandwidth over line rate: a GPU's line rate into the fabric, which in an ``nvlink_mesh`` is
        what its links carry (the most any GPU has), whatever ``bandwidth_per_gpu_Bps`` says."""
        return self.allreduce_busbw_Bps / self.line_rate_Bps

    @property
    def line_rate_Bps(self) -> float:
        """A GPU's line rate into the fabric: ``bandwidth_per_gpu_Bps``, or in an ``nvlink_mesh`` the most link
        bandwidth one GPU has (its links' counts x ``link_bandwidth_Bps``), at least the measured bus bandwidth."""
        if self.links is None or self.link_bandwidth_Bps is None:
            return self.bandwidth_per_gpu_Bps
        per_gpu: dict[int, int] = {}
        for a, b, count in self.links:
            per_gpu[a] = per_gpu.get(a, 0) + count
            per_gpu[b] = per_gpu.get(b, 0) + count
        return max(self.allreduce_busbw_Bps, max(per_gpu.values(), default=0) * self.link_bandwidth_Bps)


class Nics(_Strict):
    """The node's compute-fabric NICs: how many, the per-direction line rate of each, and the achieved fraction."""

    count: int = field("nics")
    bandwidth_Bps: PositiveFloat
    latency_s: PositiveFloat
    efficiency: Fraction


class FabricTier(_Strict):
    """One level of the inter-node network, innermost (leaf) first.

    ``nodes_per_switch`` is how many consecutive nodes one switch of this tier reaches (``None``: every node; only
    the outermost tier may say so). ``bandwidth_Bps`` is the per-port line rate and ``latency_s`` one switch
    traversal. ``oversubscription`` is the bandwidth taper seen by traffic that must climb to this tier, relative to
    the NICs' injection bandwidth and cumulative over the tiers below (1.0 = non-blocking). ``rail_optimized`` (leaf
    only) means one leaf per NIC index, so traffic between same-index GPUs of different nodes stays on that leaf.
    """

    name: str = Field(min_length=1)
    kind: Literal["rail_optimized", "fat_tree"]
    nodes_per_switch: int | None = field("nodes_per_switch")
    bandwidth_Bps: PositiveFloat
    latency_s: PositiveFloat
    oversubscription: float = field("oversubscription", default=1.0)

    def group(self, node: int) -> int:
        """Index of the switch domain of this tier that holds ``node``."""
        return 0 if self.nodes_per_switch is None else node // self.nodes_per_switch


class NcclSection(_Strict):
    """What NCCL finds on this node type and what its published nccl-tests curve says NCCL's own model leaves out.

    ``channels`` (the collective channels, "N coll channels" in NCCL's ``NCCL_DEBUG=INFO`` init log),
    ``p2p_channels_per_peer`` and ``nvls_channels`` from the same log: with them, the memory NCCL's buffers take per
    communicator (``plansim.costs.nccl_memory``). ``channels`` and ``channels_across_nodes`` (a collective that spans
    nodes; without it two per NIC) are also the SMs a collective takes from compute (``plansim.costs.interference``).
    The call-timing fields (``plansim.costs.nccl``; docs/network-model.md), all or none: ``arch``, NCCL's GPU
    generation index (its per-channel ceilings and latencies); the per-channel bandwidths inside a node and across
    nodes, GB/s, as NCCL's topology search sets them; ``cpu``, the host CPU vendor (NCCL's LL ceiling across nodes
    and network overhead); ``call_us`` and ``sync_us`` (LL, LL128, Simple), the fitted per-call and
    per-synchronisation costs (``scripts/fit_nccl.py``); optionally ``ll128_channel_GBps``, the fitted LL128 data rate
    of one channel's thread block, where the curve has LL128 sizes (``NcclTuning``). Without them collectives keep
    the alpha-beta latency (``timed`` is False). The NVLS timing fields, all or none, with the call-timing fields
    and ``nvls_channels``: the NVLS graph's bandwidth per head inside and across nodes (GB/s, NCCL's topology
    search), ``nvls_call_us`` and ``nvls_sync_us``, the fitted per-call and per-loop costs of an NVLS all-reduce
    (``nvls_timed``)."""

    channels: int = field("nccl_channels")
    p2p_channels_per_peer: int = field("nccl_channels")
    nvls_channels: int = field("nvls_channels", default=0)
    channels_across_nodes: int | None = Field(default=None, ge=1, le=1_024)
    arch: Literal["volta", "ampere", "hopper", "blackwell"] | None = None
    channel_bw_intra_GBps: PositiveFloat | None = None
    channel_bw_inter_GBps: PositiveFloat | None = None
    cpu: Literal["intel", "amd"] = "intel"
    call_us: float | None = Field(default=None, ge=0, le=1e4)
    sync_us: tuple[float, float, float] | None = None
    ll128_channel_GBps: PositiveFloat | None = Field(default=None, le=1e3)
    nvls_bw_intra_GBps: PositiveFloat | None = None
    nvls_bw_inter_GBps: PositiveFloat | None = None
    nvls_call_us: float | None = Field(default=None, ge=0, le=1e4)
    nvls_sync_us: float | None = Field(default=None, ge=0, le=1e4)

    @property
    def timed(self) -> bool:
        """Whether NCCL's calls are timed on this node (the call-timing fields are given)."""
        return self.arch is not None

    @property
    def nvls_timed(self) -> bool:
        """Whether NVLS all-reduces are timed on this node (the NVLS timing fields are given)."""
        return self.nvls_call_us is not None

    @model_validator(mode="after")
    def _timing_all_or_none(self) -> NcclSection:
        timing = {
            "arch": self.arch, "channel_bw_intra_GBps": self.channel_bw_intra_GBps,
            "channel_bw_inter_GBps": self.channel_bw_inter_GBps, "call_us": self.call_us, "sync_us": self.sync_us,
        }  # fmt: skip
        missing = [k for k, v in timing.items() if v is None]
        if missing and len(missing) < len(timing):
            raise ValueError(f"the call-timing fields come all or none: add {', '.join(missing)}")
        if self.sync_us is not None and any(not 0 <= v <= 1e4 for v in self.sync_us):
            raise ValueError("sync_us: three costs (LL, LL128, Simple) between 0 and 10,000 us")
        nvls = {
            "nvls_bw_intra_GBps": self.nvls_bw_intra_GBps, "nvls_bw_inter_GBps": self.nvls_bw_inter_GBps,
            "nvls_call_us": self.nvls_call_us, "nvls_sync_us": self.nvls_sync_us,
        }  # fmt: skip
        absent = [k for k, v in nvls.items() if v is None]
        if absent and len(absent) < len(nvls):
            raise ValueError(f"the NVLS timing fields come all or none: add {', '.join(absent)}")
        if self.ll128_channel_GBps is not None and missing:
            raise ValueError("ll128_channel_GBps needs the call-timing fields")
        if not absent and (self.nvls_channels < 1 or missing):
            raise ValueError("the NVLS timing fields need nvls_channels > 0 and the call-timing fields")
        return self


class NodeSpec(_Strict):
    """One node type: its GPU (by file stem), GPUs per node, intra-node fabric, NICs and network tiers.

    Examples
    --------
    >>> from plansim.hardware import load_hardware
    >>> node = load_hardware("dgx-a100").node
    >>> node.intra_link.bandwidth_Bps / 1e9
    230.0
    >>> node.nic_share_Bps / 1e9
    25.0
    """

    name: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    gpus_per_node: int = field("gpus_per_node")
    intra_node: IntraNode
    nics: Nics
    fabric: tuple[FabricTier, ...] = Field(min_length=1)
    #: What NCCL finds and costs on this node type; without it collectives keep the alpha-beta latency and NCCL's
    #: buffers are not counted in memory.
    nccl: NcclSection | None = None
    #: The ranges of the uncertain inputs (None: none given, held at the profile's values).
    uncertainty: NodeUncertainty | None = None
    #: The host memory tier and the link to it (None: not described; offloading is refused on this node).
    host: HostSection | None = None

    @model_validator(mode="after")
    def _consistent(self) -> NodeSpec:
        if self.host is not None and self.gpus_per_node % self.host.gpus_per_uplink:
            raise ValueError(
                f"host.gpus_per_uplink ({self.host.gpus_per_uplink}) must divide gpus_per_node ({self.gpus_per_node})"
            )
        if self.uncertainty is not None:
            bounds = self.uncertainty.inter_node_efficiency
            _check_within("inter_node_efficiency", self.nics.efficiency, bounds)
            if bounds is not None and not (bounds[0] > 0 and bounds[1] <= 1):
                raise ValueError(f"uncertainty.inter_node_efficiency {list(bounds)}: a fraction, within (0, 1]")
        if self.gpus_per_node % self.nics.count:
            raise ValueError(f"nics.count ({self.nics.count}) must divide gpus_per_node ({self.gpus_per_node})")
        _check_fabric(self.fabric)
        if self.intra_node.links is not None:
            _check_mesh(self.intra_node, self.gpus_per_node)
        return self

    def __hash__(self) -> int:
        return hash((self.name, self.gpu, self.gpus_per_node))

    @property
    def intra_link(self) -> Link:
        """Effective intra-node link: the measured all-reduce bus bandwidth and the per-step latency."""
        return Link(self.intra_node.allreduce_busbw_Bps, self.intra_node.latency_s)

    @property
    def nic_share_Bps(self) -> float:
        """Line-rate bandwidth into the fabric per GPU: ``count * port / gpus_per_node``, each NIC's port the slower
        of the NIC and the first fabric tier's switch port it plugs into (``topology``: the NIC -> leaf edge), so a
        NIC faster than its switch port moves no more than the port does, as the discrete-event network routes it.
        A GPU sends through one NIC (``topology`` attaches each GPU to one): NICs beyond one per GPU are counted
        once per GPU."""
        port = min(self.nics.bandwidth_Bps, self.fabric[0].bandwidth_Bps)
        return min(self.nics.count, self.gpus_per_node) * port / self.gpus_per_node

    @property
    def max_nodes(self) -> float:
        """How many nodes the outermost fabric tier reaches (``inf`` when it reaches every node)."""
        top = self.fabric[-1].nodes_per_switch
        return math.inf if top is None else top


def _check_fabric(tiers: tuple[FabricTier, ...]) -> None:
    names = [tier.name for tier in tiers]
    if len(set(names)) < len(names) or {"gpu", "node"} & set(names):
        raise ValueError(f"fabric tier names must be unique and not 'gpu' or 'node', got {names}")
    for i, tier in enumerate(tiers):
        if tier.kind == "rail_optimized" and i > 0:
            raise ValueError(f"fabric tier '{tier.name}': only the first (leaf) tier can be rail_optimized")
        if tier.nodes_per_switch is None and i < len(tiers) - 1:
            raise ValueError(f"fabric tier '{tier.name}': only the outermost tier may have nodes_per_switch: null")
    for inner, outer in itertools.pairwise(tiers):
        assert inner.nodes_per_switch is not None  # checked above
        if outer.nodes_per_switch is not None and (
            outer.nodes_per_switch <= inner.nodes_per_switch or outer.nodes_per_switch % inner.nodes_per_switch
        ):
            raise ValueError(
                f"fabric tier '{outer.name}': nodes_per_switch ({outer.nodes_per_switch}) must be a larger multiple "
                f"of tier '{inner.name}' ({inner.nodes_per_switch})"
            )
        if outer.oversubscription < inner.oversubscription:
            raise ValueError(
                f"fabric tier '{outer.name}': oversubscription is cumulative, so it cannot fall below tier "
                f"'{inner.name}' ({inner.oversubscription})"
            )


def _check_mesh(intra: IntraNode, gpus_per_node: int) -> None:
    assert intra.links is not None and intra.link_bandwidth_Bps is not None
    per_gpu = [0] * gpus_per_node
    for a, b, count in intra.links:
        if not (0 <= a < gpus_per_node and 0 <= b < gpus_per_node) or a == b or count < 1:
            raise ValueError(f"intra_node.links entry {[a, b, count]}: need two distinct GPUs below {gpus_per_node}")
        per_gpu[a] += count
        per_gpu[b] += count
    for gpu, count in enumerate(per_gpu):
        total = count * intra.link_bandwidth_Bps
        if not math.isclose(total, intra.bandwidth_per_gpu_Bps, rel_tol=1e-6):
            raise ValueError(
                f"intra_node.links give GPU {gpu} {count} links = {total / 1e9:g} GB/s but bandwidth_per_gpu_Bps is "
                f"{intra.bandwidth_per_gpu_Bps / 1e9:g} GB/s"
            )
