"""A kernel's time: from a measured table when the GPU's profile has one, else a roofline with efficiency curves.

Roofline (Williams, Waterman & Patterson 2009): a kernel takes max(FLOPs / achieved FLOP/s, bytes / achieved
bytes/s) plus a launch overhead. Achieved rates are the spec-sheet peak times the profile's efficiency curve (by
kernel size), or, where ``hardware_profiles/measured/<gpu>.csv`` exists (written by ``plansim profile``), the rate
measured at that size, interpolated in log(size) and clamped at the table's ends.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plansim.data import data_dir
from plansim.workload.graph import MATMUL_KINDS

if TYPE_CHECKING:
    from plansim.hardware import GPUSpec

__all__ = ["KernelCostModel", "KernelTable", "load_kernel_table"]

# Op kinds in MATMUL_KINDS run on tensor cores at the training dtype; everything else is priced as CUDA-core fp32 work.


def _interp_log(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear interpolation of y over log10(x), clamped at the ends."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            t = (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))
            return y0 + t * (y1 - y0)
    return points[-1][1]


@dataclass(frozen=True)
class KernelTable:
    """Measured achieved rates: for ``(size_class, dtype)`` a sorted list of (size, rate) points.

    ``size_class`` is ``"matmul"`` (size = FLOPs, rate = FLOP/s) or ``"memory"`` (size = bytes, rate = bytes/s).
    """

    points: Mapping[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)

    def rate(self, size_class: str, dtype: str, size: float) -> float | None:
        """The measured rate at ``size``, or None when the table has no row for this class and dtype."""
        pts = self.points.get((size_class, dtype))
        return _interp_log(pts, size) if pts else None


@lru_cache(maxsize=32)
def _read_table(path: Path) -> KernelTable:
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            size_class = "matmul" if row["kind"] in MATMUL_KINDS else "memory"
            size = float(row["flops"] if size_class == "matmul" else row["bytes"])
            if size > 0 and float(row["time_s"]) > 0:
                rows.setdefault((size_class, row["dtype"]), []).append((size, size / float(row["time_s"])))
    return KernelTable({k: sorted(v) for k, v in rows.items()})


def load_kernel_table(gpu_name: str, directory: Path | None = None) -> KernelTable | None:
    """The measured kernel table for ``gpu_name`` (``measured/<name>.csv``), or None when none was measured.

    The CSV has the columns ``kind,dtype,flops,bytes,time_s`` (one row per timed kernel).
    """
    directory = directory or data_dir("hardware_profiles") / "measured"
    path = directory / f"{gpu_name.lower()}.csv"
    return _read_table(path) if path.is_file() else None


class KernelCostModel:
    """Prices ops of a workload graph on one GPU at one training dtype.

    Parameters
    ----------
    gpu : GPUSpec
        The device (peak FLOP/s per dtype, HBM bandwidth, efficiency curves, launch overhead).
    dtype : str
        The training dtype: tensor-core kinds (matmul, bmm, conv) run at its peak; other kinds at fp32 peak.
    table : KernelTable, optional
        Measured rates; when it has a row for the op's class and dtype it replaces the roofline.
    """

    def __init__(self, gpu: GPUSpec, dtype: str, table: KernelTable | None = None) -> None:
        self.gpu = gpu
        self.dtype = dtype
        self.table = table
        self._memo: dict[tuple[bool, float, float], float] = {}  # a stage's blocks repeat the same kernels

    def kernel_time(self, kind: str, flops: float, nbytes: float) -> float:
        """Seconds for one kernel of ``flops`` FLOPs moving ``nbytes`` bytes."""
        key = (kind in MATMUL_KINDS, flops, nbytes)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._kernel_time(kind, flops, nbytes)
        return hit

    def _kernel_time(self, kind: str, flops: float, nbytes: float) -> float:
        if flops <= 0 and nbytes <= 0:
            return 0.0
        dtype = self.dtype if kind in MATMUL_KINDS else "fp32"
        compute = 0.0
        if flops > 0:
            measured = self.table.rate("matmul", dtype, flops) if self.table and kind in MATMUL_KINDS else None
            rate = measured or self.gpu.peak_flops(dtype) * self.gpu.matmul_efficiency(flops)
            compute = flops / rate
        memory = 0.0
        if nbytes > 0:
            measured = self.table.rate("memory", dtype, nbytes) if self.table and kind not in MATMUL_KINDS else None
            rate = measured or self.gpu.hbm_bandwidth_Bps * self.gpu.memory_efficiency(nbytes)
            memory = nbytes / rate
        return max(compute, memory) + self.gpu.kernel_launch_s

    def forward(self, op: Mapping[str, Any]) -> float:
        """Forward time of a graph op (its ``kind``, ``flops`` and ``bytes`` attributes)."""
        return self.kernel_time(op["kind"], op["flops"], op["bytes"])

    def backward(self, op: Mapping[str, Any]) -> float:
        """Backward time: GEMM-like ops run two kernels (input and weight gradients) of half ``bwd_flops`` each;
        other ops one kernel reading the output gradient and the saved input and writing the input gradient."""
        if op["kind"] in MATMUL_KINDS:
            return 2 * self.kernel_time(op["kind"], op["bwd_flops"] / 2, op["bytes"])
        return self.kernel_time(op["kind"], op["bwd_flops"], 2 * op["bytes"])
