"""The measured kernel profile ``plansim profile`` writes (``hardware_profiles/measured/<gpu>.yaml``): where and how
it was measured, and one point per timed kernel. Plain pydantic and YAML: reading a profile needs no torch.

A point's ``flops`` count multiply-adds twice (GEMM ``2mnk``); memory-bound kinds count 0 FLOPs and are judged by
``bytes`` (read + written once each). ``time_s`` is the median of ``repeats`` timed runs after warm-up, ``cv`` their
coefficient of variation (sample standard deviation over mean; absent in profiles written before it was recorded, and
for a single repeat), which the kernel model reads as the kernel's run-to-run noise (``plansim.costs.stragglers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field

from plansim.errors import shown_path
from plansim.files.yamlfile import read_mapping, validated

__all__ = [
    "FORMAT",
    "OPS",
    "Environment",
    "KernelPoint",
    "KernelProfile",
    "Overlap",
    "OverlapPoint",
    "load_kernel_profile",
]

FORMAT: Final = "plansim-kernel-profile/1"

#: Kernel kinds a profile measures. ``gemm`` (a linear layer's matmul), ``bmm`` (batched matmul: attention's
#: QK^T and AV), ``sdpa`` (fused scaled-dot-product attention), element-wise and normalisation kinds, the optimizer
#: update, device copies and host-device transfers.
Op = Literal[
    "gemm", "bmm", "sdpa", "layernorm", "rmsnorm", "softmax", "gelu", "silu", "add", "adam", "copy", "h2d", "d2h"
]
OPS: tuple[str, ...] = get_args(Op)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Environment(_Strict):
    """Where the points were measured."""

    device: str = Field(description="torch device type: cuda or cpu")
    device_name: str = Field(description="torch.cuda.get_device_name, or the CPU's model")
    torch: str
    cuda: str | None = None
    driver: str | None = None
    clocks: dict[str, float] = Field(default_factory=dict, description="MHz, as the driver reported them")
    memory_bytes: int | None = None
    python: str
    platform: str
    date: str = Field(description="ISO 8601, UTC")
    command: str = Field(description="the command line that wrote the profile")


class KernelPoint(_Strict):
    """One timed kernel (or, for ``bwd``, the kernels of one op's backward)."""

    op: Op
    direction: Literal["fwd", "bwd"] = Field(alias="pass")
    #: fp8: a scaled FP8 GEMM (``torch._scaled_mm``, e4m3 operands, bf16 output), what ``dtype: fp8`` prices
    dtype: Literal["fp32", "fp16", "bf16", "fp8"]
    shape: tuple[int, ...] = Field(description="the op's sizes: gemm (m, n, k), bmm (batch, m, n, k), ...")
    flops: float = Field(ge=0)
    bytes: float = Field(ge=0)
    time_s: float = Field(gt=0)
    repeats: int = Field(ge=1)
    cv: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="std / mean of the repeats")

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s."""
        return self.flops / self.time_s

    @property
    def bytes_per_s(self) -> float:
        """Achieved bytes/s."""
        return self.bytes / self.time_s


class OverlapPoint(_Strict):
    """One compute kernel timed alone and while the section's load ran beside it (medians of ``repeats`` runs)."""

    op: Op
    dtype: Literal["fp32", "fp16", "bf16"]
    shape: tuple[int, ...]
    alone_s: float = Field(gt=0)
    overlapped_s: float = Field(gt=0)
    repeats: int = Field(ge=1)


class Overlap(_Strict):
    """Compute kernels timed alone and beside a communication-like load on the same GPU (CUDA only).

    ``load``: ``copy_stream`` (one GPU: device-to-device copies on a second stream, which move HBM bytes but hold no
    SMs for themselves, so ``channels`` is 0 and the slowdown measures the memory-contention part alone; a load that
    holds SMs, such as an NCCL collective between GPUs, would give its channel count).
    ``load_hbm_Bps``: the HBM bytes per second the load moved while the kernels ran beside it.
    """

    load: Literal["copy_stream"]
    channels: int = Field(ge=0, le=1_024)
    load_hbm_Bps: float = Field(gt=0)
    points: list[OverlapPoint] = Field(min_length=1)

    def slowdown(self, op: str) -> float | None:
        """Total overlapped over total alone time of the ``op`` points (None without such points)."""
        pts = [p for p in self.points if p.op == op]
        if not pts:
            return None
        return sum(p.overlapped_s for p in pts) / sum(p.alone_s for p in pts)


class KernelProfile(_Strict):
    """A measured profile: the environment, the points and, when measured, the overlap section."""

    format: Literal["plansim-kernel-profile/1"] = FORMAT
    environment: Environment
    points: list[KernelPoint]
    overlap: Overlap | None = None

    def to_yaml(self) -> str:
        """YAML for ``hardware_profiles/measured/``; each point carries its achieved rates for a reader."""
        data = self.model_dump(mode="json", by_alias=True)
        for point, raw in zip(self.points, data["points"], strict=True):
            raw["tflops_per_s"] = round(point.flops_per_s / 1e12, 6)
            raw["gb_per_s"] = round(point.bytes_per_s / 1e9, 6)
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)


def load_kernel_profile(path: str | Path) -> KernelProfile:
    """Read and check a profile; a bad file is one ``PlansimError`` naming the field."""
    data = read_mapping(Path(path), "kernel profile", "write one with plansim profile")
    if isinstance(data, dict):
        for point in data.get("points") or []:
            if isinstance(point, dict):  # the achieved rates are derived, not input
                point.pop("tflops_per_s", None)
                point.pop("gb_per_s", None)
    return validated(KernelProfile, data, shown_path(Path(path)))
