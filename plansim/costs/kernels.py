"""A kernel's time: from a measured profile where it covers the kernel, else a roofline with efficiency curves.

Roofline (Williams, Waterman & Patterson 2009): a kernel takes max(FLOPs / achieved FLOP/s, bytes / achieved
bytes/s) plus a launch overhead. Achieved rates are the spec-sheet peak times the GPU profile's efficiency curve (by
kernel size): GEMM-like kinds (``MATMUL_KINDS``) at the training dtype's tensor-core peak on the GEMM curve,
point-wise kinds at the flat fp32 ceiling, every kind's bytes on the memory curve.

Measured: where ``hardware_profiles/measured/<gpu>.yaml`` exists (``plansim profile --out`` with plansim's GPU name),
a kernel's achieved rate is interpolated over the measured points of its group (GEMMs and batched matmuls by FLOPs
at the training dtype; normalisations, softmax, element-wise kinds and other memory-bound kinds by bytes, any
dtype), piecewise-linear in log10(size), per pass (forward, backward) where the profile has that pass. A measured
time includes the launch, so none is added. Outside the measured sizes, and for groups the profile lacks, the
roofline answers. ``cost_provenance`` says which a GPU gets; every Result carries it. ``time_cv`` is a kernel's
run-to-run coefficient of variation: the spread of the profile's repeats where it recorded one, else the GPU
profile's cited default (``plansim.costs.stragglers`` charges what it makes collectives wait).

Fused attention (kind ``attention``, FlashAttention): the op counts its matmuls over every score, and under a causal
mask (the op's ``causal``) the kernel computes only the blocks on and below the diagonal, about half
(``workload.graph.CAUSAL_SHARE``; FlashAttention-2, Dao 2023, sec 4.1: "with causal mask, divide this number by 2");
``executed_share`` says what a kernel executes of an op's FLOPs, which both its time and the hardware FLOPs
(``executed_flops``, HFU's numerator) count, so that no kernel runs above the GPU's peak and HFU cannot pass 1. Its
time is the executed FLOPs at the fused kernel's rate: the measured profile's ``sdpa`` points where it has them
(``plansim profile`` times causal ``scaled_dot_product_attention`` and records the same halved FLOPs), else the GPU
profile's cited kernel benchmark for the kernel the framework calls (``attention_kernels``: FlashAttention-2 or -3,
cuDNN; ``step.prepare.kernel_model`` asks the framework's ``attention_kernel`` rule), else the GEMM roofline. The
backward is one kernel of ``bwd_flops`` (it recomputes QK^T). The unfused core (``bmm`` QK^T and attention over V)
computes every score and masks them afterwards: it executes all of its FLOPs.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plansim.files.data import data_dir
from plansim.workload.graph import MATMUL_KINDS, causal_share

if TYPE_CHECKING:
    from plansim.hardware import GPUSpec
    from plansim.hardware.schema import OverlapMeasurement
    from plansim.profiling.schema import KernelProfile

__all__ = [
    "FP8Casts",
    "FP8Shape",
    "KernelCostModel",
    "KernelTable",
    "cost_provenance",
    "executed_flops",
    "executed_share",
    "load_kernel_table",
]

# Op kinds in MATMUL_KINDS run on tensor cores at the training dtype; everything else is priced as CUDA-core fp32 work.

#: Workload op kind -> the measured group that prices it (conv: none, the roofline).
_GROUP_OF_KIND = {
    "matmul": "gemm", "bmm": "bmm", "norm": "norm", "softmax": "softmax", "elementwise": "elementwise",
    "dropout": "memory", "embedding": "memory", "loss": "memory", "pool": "memory", "attention": "attention",
    "cast": "memory",
}  # fmt: skip
#: Profile op -> its group (adam and host transfers are measured but price nothing here yet).
_GROUP_OF_OP = {
    "gemm": "gemm", "bmm": "bmm", "layernorm": "norm", "rmsnorm": "norm", "softmax": "softmax", "gelu": "elementwise",
    "silu": "elementwise", "add": "elementwise", "copy": "memory", "sdpa": "attention",
}  # fmt: skip
_COMPUTE_GROUPS = ("gemm", "bmm", "attention")


#: Bytes of scales per FP8 element a block-scaled cast writes beside its data, row-wise and column-wise copies
#: together: Float8BlockScaling's 1x128 tiles, one fp32 scale each (4/128 B a copy), MXFP8's 32-element blocks, one
#: E8M0 byte each (1/32 B a copy) (transformer_engine/common/recipe/__init__.py:337-420 at d0067d0d); per-tensor
#: recipes keep one scale a tensor.
_BLOCK_SCALE_BYTES = {"delayed": 0.0, "current": 0.0, "block": 2 * 4 / 128, "mxfp8": 2 * 1 / 32}


#: An FP8 linear layer's GEMM as its op's ``fp8`` attribute gives it (``plansim.workload.transformer.Dims.linear``):
#: ``[m, k] @ [k, n]``, whether a norm feeds it, and how many ranks its input is gathered from (sequence parallelism;
#: 1: not gathered).
FP8Shape = tuple[int, int, int, bool, int]


@dataclass(frozen=True)
class FP8Casts:
    """How the FP8 linear layers' tensors are cast (``dtype: fp8``), as Transformer Engine issues the kernels
    (module/linear.py, layernorm_linear.py at NVIDIA/TransformerEngine d0067d0d), each a memory-bound kernel priced by
    its bytes on the memory curve:

    * forward, the input (``[m, k]``, bf16) cast to FP8 row-wise and column-wise (the transposed copy Hopper's FP8
      GEMM needs for the weight gradient): one kernel reading 2 B and writing 1 + 1 B an element, plus the scales of
      a block recipe (``_BLOCK_SCALE_BYTES``); under ``current`` scaling the tensor's amax must be known first: an
      amax pass reading the bf16 input (2 B an element) before the cast. Where a norm feeds the layer
      (``after_norm``: LayerNormLinear hands the norm its quantizer, layernorm_linear.py:244-263) the norm kernel
      writes FP8 itself under delayed scaling (no cast), computes the amax beside its bf16 output under current
      scaling (the cast, no amax pass), and writes bf16 for a separate cast under block and MXFP8 scaling
      (csrc/extensions/normalization.cpp:95-130: FULLY_FUSED, FUSED_NORM_AMAX_FP8, UNFUSED);
    * the weight (``[k, n]``) cast alike, ``weight_casts`` times per micro-batch's forward (``1 / micro-batches``
      where the framework casts once per step and reuses it: TE's workspace updated only on the first micro-batch,
      linear.py:479-488; else 1);
    * backward, the output gradient (``[m, n]``) cast row-wise and column-wise (dgrad and wgrad operands,
      linear.py:900-925), with its amax pass under ``current``;
    * under sequence parallelism a layer whose input is all-gathered (``shards`` > 1: QKV and FC1) casts its local
      ``m / shards`` rows row-wise only (3 B an element) before the FP8 all-gather, since the per-tensor quantizers
      gather no column-wise data (linear.py:381-392, layernorm_linear.py:294-301); its backward re-gathers the FP8
      input and makes the column-wise copy of all ``m`` rows (1 B read, 1 B written an element; linear.py:602-610
      keeps only the row-wise data for a re-gathered input). Block recipes are taken alike (ASSUMPTION).

    Delayed scaling's amax all-reduce after each model chunk's pass is a collective, not a kernel
    (``plansim.step.p2p.amax_reduction``)."""

    recipe: str
    weight_casts: float = 1.0

    @property
    def amax_pass(self) -> bool:
        """Whether a cast first reads its tensor for the amax (current per-tensor scaling)."""
        return self.recipe == "current"

    def cast_bytes(self, elements: float) -> float:
        """Bytes one row- and column-wise cast of ``elements`` bf16 elements moves (its scales included)."""
        return elements * (2 + 2 + _BLOCK_SCALE_BYTES[self.recipe])

    def forward_casts(self, shape: FP8Shape) -> list[float]:
        """Bytes of each cast kernel a forward launches per micro-batch (the weight's pro rata), in order."""
        m, n, k, after_norm, shards = shape
        scale = _BLOCK_SCALE_BYTES[self.recipe]
        # a gathered input is cast row-wise on this rank's rows; else row- and column-wise on all of them
        rows, per = (m / shards, 2 + 1 + scale / 2) if shards > 1 else (m, 2 + 2 + scale)
        casts: list[float] = []
        if not after_norm:
            casts += [2.0 * rows * k] if self.amax_pass else []
            casts.append(per * rows * k)
        elif self.recipe != "delayed":  # the norm writes bf16 (with its amax under current scaling), then the cast
            casts.append(per * rows * k)
        weight = self.weight_casts * ((2.0 * k * n if self.amax_pass else 0.0) + self.cast_bytes(k * n))
        return [*casts, weight]

    def backward_casts(self, shape: FP8Shape) -> list[float]:
        """Bytes of each cast kernel a backward launches (the output gradient's, with its amax pass; a re-gathered
        input's column-wise copy), in order."""
        m, n, k, _, shards = shape
        transpose = [(2 + _BLOCK_SCALE_BYTES[self.recipe] / 2) * m * k] if shards > 1 else []
        return [*([2.0 * m * n] if self.amax_pass else []), self.cast_bytes(m * n), *transpose]


def executed_share(op: Mapping[str, Any]) -> float:
    """The share of an op's counted FLOPs its kernels execute: a fused attention kernel under a causal mask skips the
    blocks above the diagonal (``causal_share``); every other op, the unfused attention core included, computes all
    of them.

    >>> executed_share({"kind": "attention", "causal": True}), executed_share({"kind": "bmm", "causal": True})
    (0.5, 1.0)
    """
    return causal_share(op) if op["kind"] == "attention" else 1.0


def executed_flops(graph: Any) -> float:
    """FLOPs the matmul-like kernels of one micro-batch execute on this rank, forward and backward, a fused causal
    attention kernel's over the causal half (``executed_share``): with the recomputation's, the hardware FLOPs of
    HFU (Korthikanti et al. 2022, sec 6: hardware FLOPs count what the GPU runs, recomputation included; the
    backward of a fused attention kernel recomputes QK^T, FlashAttention-2 sec 3.1.2)."""
    return sum(
        (data["flops"] + data["bwd_flops"]) * executed_share(data)
        for _, data in graph.nodes(data=True)
        if data["kind"] in MATMUL_KINDS
    )


def _interp_log(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear interpolation of y over log10(x) (``points`` sorted by x; x within their range)."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            span = math.log10(x1) - math.log10(x0)  # 0 for sizes too close for log10 to tell apart
            t = (math.log10(x) - math.log10(x0)) / span if span > 0 else 0.0
            return y0 + t * (y1 - y0)
    return points[-1][1]


@dataclass(frozen=True)
class KernelTable:
    """Measured achieved rates: for ``(group, pass, dtype)`` the sorted (size, rate) points, where size is FLOPs
    (rate FLOP/s) for the compute groups and bytes (rate bytes/s, dtype ``any``) for the memory-bound ones.
    ``source`` says where they were measured; ``overlap`` the profile's overlap section as a measurement of compute
    slowed by a concurrent load (``plansim.costs.interference``), None when the profile has none."""

    points: Mapping[tuple[str, str, str], list[tuple[float, float]]] = field(default_factory=dict)
    source: str = ""
    #: per (group, pass, dtype), the median coefficient of variation of the points' timed repeats (profiles that
    #: recorded it); the kernel's run-to-run noise
    cvs: Mapping[tuple[str, str, str], float] = field(default_factory=dict)
    overlap: OverlapMeasurement | None = None

    def rate(self, group: str, direction: str, dtype: str, size: float) -> float | None:
        """The measured rate at ``size``, or None outside the measured sizes or without such points."""
        pts = self.points.get((group, direction, dtype))
        if not pts or not pts[0][0] <= size <= pts[-1][0]:
            return None
        return _interp_log(pts, size)

    def has(self, group: str, direction: str, dtype: str) -> bool:
        """Whether the table has points for this group, pass and dtype."""
        return (group, direction, dtype) in self.points

    @classmethod
    def from_profile(cls, profile: KernelProfile, source: str = "") -> KernelTable:
        """The table of a measured profile; points of one group at the same size are averaged."""
        rates: dict[tuple[str, str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        spreads: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        for p in profile.points:
            group = _GROUP_OF_OP.get(p.op)
            if group is None:
                continue
            compute = group in _COMPUTE_GROUPS
            size = p.flops if compute else p.bytes
            key = (group, p.direction, p.dtype if compute else "any")
            if size > 0:
                rates[key][size].append(size / p.time_s)
                if p.cv is not None:
                    spreads[key].append(p.cv)
        return cls(
            {key: sorted((x, sum(r) / len(r)) for x, r in by_size.items()) for key, by_size in rates.items()},
            source,
            {key: statistics.median(cvs) for key, cvs in spreads.items()},
            _overlap_measurement(profile, source),
        )


def _overlap_measurement(profile: KernelProfile, source: str) -> OverlapMeasurement | None:
    """The profile's overlap section as one measurement: its GEMMs' slowdown (GEMMs are most of a transformer
    step's compute), else that of all its kernels."""
    from plansim.hardware.schema import OverlapMeasurement

    section = profile.overlap
    if section is None:
        return None
    pts = [p for p in section.points if p.op == "gemm"] or section.points
    alone = sum(p.alone_s for p in pts)
    overlapped = max(alone, sum(p.overlapped_s for p in pts))
    return OverlapMeasurement(
        kernel=pts[0].op,
        alone_s=alone,
        overlapped_s=overlapped,
        channels=section.channels,
        load_hbm_Bps=section.load_hbm_Bps,
        source=f"{source}, {section.load}" if source else section.load,
    )


def _measured_dir() -> Path:
    return data_dir("hardware_profiles") / "measured"


@lru_cache(maxsize=32)
def _read_table(path: Path, stamp: float) -> KernelTable:
    from plansim.profiling.schema import load_kernel_profile

    profile = load_kernel_profile(path)
    env = profile.environment
    return KernelTable.from_profile(profile, f"{path.name} ({env.device_name}, torch {env.torch}, {env.date})")


def load_kernel_table(gpu_name: str, directory: Path | None = None) -> KernelTable | None:
    """The measured kernel table for ``gpu_name`` (``measured/<name>.yaml``, written by ``plansim profile``), or
    None when none was measured."""
    path = (directory or _measured_dir()) / f"{gpu_name.lower()}.yaml"
    return _read_table(path, path.stat().st_mtime) if path.is_file() else None


def cost_provenance(gpu: GPUSpec, table: KernelTable | None, attention_kernel: str | None = None) -> str:
    """Where kernel times on ``gpu`` come from with ``table`` (None: the roofline alone), for every Result; with the
    fused attention kernel the framework calls where the GPU profile has its rates."""
    if table is None:
        text = f"roofline: {gpu.name} spec sheet with efficiency curves"
    else:
        text = f"measured: {table.source}; roofline outside the measured sizes"
    if attention_kernel is not None and attention_kernel in gpu.attention_kernels:
        text += f"; fused attention: {attention_kernel}"
    return text


class KernelCostModel:
    """Prices ops of a workload graph on one GPU at one training dtype (FP8 linear layers at fp8: ``fp8``).

    Parameters
    ----------
    gpu : GPUSpec
        The device (peak FLOP/s per dtype, HBM bandwidth, efficiency curves, launch overhead).
    dtype : str
        The training dtype: tensor-core kinds (matmul, bmm, conv) run at its peak; other kinds at fp32 peak.
    table : KernelTable, optional
        Measured rates; where it covers a kernel (group, pass, dtype and size) they replace the roofline.
    attention_kernel : str, optional
        The fused attention kernel the framework calls on this GPU (``hardware.schema.AttentionKernel``), priced at
        the GPU profile's curves for it; None or a kernel the profile lacks: the GEMM roofline.
    host_s : float, optional
        The host's time to issue one kernel (the framework's ``kernel_launch`` rule; 0: never the bottleneck). A run
        of ``n`` kernels takes at least ``n * host_s`` (``launches`` counts an op's kernels).
    fp8 : FP8Casts, optional
        Under ``dtype: fp8``, how the FP8 linear layers cast: an op marked ``fp8`` (a block's linear layer,
        ``plansim.workload.transformer.Dims.linear``) runs its GEMMs at the fp8 peak on the ``matmul_fp8`` curve (or
        the measured table's fp8 points) and its casts as memory-bound kernels; None: every GEMM at ``dtype``.
    """

    def __init__(
        self,
        gpu: GPUSpec,
        dtype: str,
        table: KernelTable | None = None,
        *,
        attention_kernel: str | None = None,
        host_s: float = 0.0,
        fp8: FP8Casts | None = None,
    ) -> None:
        self.gpu = gpu
        self.dtype = dtype
        self.table = table
        self.attention_kernel = attention_kernel
        self.host_s = host_s
        self.fp8 = fp8
        self._memo: dict[tuple[str, str, float, float, str], float] = {}  # a stage's blocks repeat the same kernels

    @property
    def provenance(self) -> str:
        """Where this model's kernel times come from (``cost_provenance``)."""
        return cost_provenance(self.gpu, self.table, self.attention_kernel)

    def kernel_time(
        self, kind: str, flops: float, nbytes: float, direction: str = "fwd", dtype: str | None = None
    ) -> float:
        """Seconds for one kernel of ``flops`` FLOPs moving ``nbytes`` bytes (``direction``: which pass's
        measurements price it; ``dtype``: a GEMM's, the model's by default)."""
        gemm_dtype = dtype or self.dtype
        key = (kind, direction, flops, nbytes, gemm_dtype)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._kernel_time(kind, flops, nbytes, direction, gemm_dtype)
        return hit

    def _fp8_shape(self, op: Mapping[str, Any]) -> FP8Shape | None:
        """The GEMM shape of an op this model runs in FP8, else None."""
        shape = op.get("fp8") if self.fp8 is not None else None
        return tuple(shape) if shape else None

    def _casts_s(self, casts: list[float]) -> float:
        return sum(self.kernel_time("cast", 0.0, b) for b in casts)

    def cast_s(self, op: Mapping[str, Any], direction: str = "fwd") -> float:
        """Seconds of an FP8 linear layer's cast kernels in a pass (``FP8Casts``); 0 for every other op."""
        shape = self._fp8_shape(op)
        if shape is None:
            return 0.0
        assert self.fp8 is not None
        casts = self.fp8.forward_casts(shape) if direction == "fwd" else self.fp8.backward_casts(shape)
        return self._casts_s(casts)

    def weight_gradient(self, op: Mapping[str, Any]) -> float:
        """The weight-gradient kernel of a GEMM-like op's backward (half its ``bwd_flops``), in FP8 where the op
        runs in FP8; a grouped GEMM's, one per expert (``_grouped``)."""
        if op.get("grouped", 1) != 1:
            return self._grouped(op, self.weight_gradient)
        dtype = "fp8" if self._fp8_shape(op) is not None else None
        return self.kernel_time(op["kind"], op["bwd_flops"] / 2, op["bytes"], dtype=dtype)

    def time_cv(self, kind: str, direction: str = "fwd") -> float:
        """Run-to-run coefficient of variation of one kernel of ``kind`` (``direction``: the pass): the measured
        profile's (median over its group's points) where it recorded one, else the GPU profile's cited
        ``kernel_time_cv``."""
        group = _GROUP_OF_KIND.get(kind)
        if self.table is not None and group is not None:
            dtype = self.dtype if group in _COMPUTE_GROUPS else "any"
            cv = self.table.cvs.get((group, direction, dtype))
            if cv is not None:
                return cv
        return self.gpu.kernel_time_cv

    def _measured(
        self, kind: str, flops: float, nbytes: float, direction: str, gemm_dtype: str | None = None
    ) -> float | None:
        group = _GROUP_OF_KIND.get(kind)
        if self.table is None or group is None:
            return None
        size, dtype = (flops, gemm_dtype or self.dtype) if group in _COMPUTE_GROUPS else (nbytes, "any")
        rate = self.table.rate(group, direction, dtype, size) if size > 0 else None
        return size / rate if rate else None

    def _kernel_time(self, kind: str, flops: float, nbytes: float, direction: str, dtype: str) -> float:
        if flops <= 0 and nbytes <= 0:
            return 0.0
        measured = self._measured(kind, flops, nbytes, direction, dtype)
        if measured is not None:
            return measured
        fused = (
            self.gpu.attention_efficiency(self.attention_kernel, direction, flops)
            if kind == "attention" and flops > 0
            else None
        )
        if fused is not None:  # the cited kernel benchmark's rate (its times include the launch)
            return flops / (self.gpu.peak_flops(self.dtype) * fused)
        if kind in MATMUL_KINDS and dtype == "fp8":  # an FP8 GEMM: the fp8 peak on its own curve
            compute = flops / (self.gpu.peak_flops("fp8") * self.gpu.fp8_matmul_efficiency(flops)) if flops > 0 else 0
        elif kind in MATMUL_KINDS:  # tensor cores at the training dtype, ramping up with the GEMM's size
            compute = flops / (self.gpu.peak_flops(self.dtype) * self.gpu.matmul_efficiency(flops)) if flops > 0 else 0
        else:  # point-wise kernels on the fp32 vector units: the roofline's flat compute ceiling (Williams et al.
            # 2009); their ramp-up and tail are the memory curve's, as they are memory-bound
            compute = flops / self.gpu.peak_flops("fp32")
        memory = nbytes / (self.gpu.hbm_bandwidth_Bps * self.gpu.memory_efficiency(nbytes)) if nbytes > 0 else 0.0
        return max(compute, memory) + self.gpu.kernel_launch_s

    def _grouped(self, op: Mapping[str, Any], one: Callable[[Mapping[str, Any]], float]) -> float:
        """Seconds of an op that runs ``grouped`` equal GEMMs (a MoE layer's local experts; the graph's ``grouped``
        attribute): each priced at its own size by ``one`` (``1/grouped`` of the op's FLOPs and bytes), summed.
        Transformer Engine's grouped linear issues one cuBLAS GEMM per expert, round-robin over its compute streams
        (transformer_engine/common/gemm/cublaslt_gemm.cu:977-1011 at NVIDIA/TransformerEngine d0067d0d);
        ASSUMPTION: they run one after another, the streams' concurrency not credited (it would lift the small
        GEMMs' efficiency), so a grouped GEMM prices as its experts' GEMMs in sequence."""
        groups = op.get("grouped", 1)
        if groups == 1:
            return one(op)
        share = {**op, "grouped": 1}
        for key in ("flops", "bwd_flops", "bytes"):
            share[key] = op[key] / groups
        return groups * one(share)

    def launches(self, op: Mapping[str, Any], direction: str = "fwd") -> int:
        """Kernels the host launches for one op in a pass (``direction`` fwd or bwd): one in forward; in backward two
        for a GEMM-like op (``backward``'s input- and weight-gradient kernels) and one for the rest, a fused attention
        kernel included (each op of the graph being one kernel, as a fused implementation runs it). An FP8 linear
        layer adds its cast kernels (``FP8Casts``), the weight's only where it is cast at every forward (once a step
        it is one launch a layer, left out)."""
        gemm = direction == "bwd" and op["kind"] in MATMUL_KINDS and op["kind"] != "attention"
        kernels = 2 if gemm else 1
        shape = self._fp8_shape(op)
        if shape is not None:
            assert self.fp8 is not None
            if direction == "fwd":
                kernels += len(self.fp8.forward_casts(shape)) - (1 if self.fp8.weight_casts < 1 else 0)
            else:
                kernels += len(self.fp8.backward_casts(shape))
        return kernels * op.get("grouped", 1)

    def forward(self, op: Mapping[str, Any]) -> float:
        """Forward time of a graph op (its ``kind``, the ``flops`` it executes and ``bytes``); an FP8 linear layer's
        GEMM in FP8 and its casts (``FP8Casts``); a grouped GEMM's experts each at its own size (``_grouped``)."""
        if op.get("grouped", 1) != 1:
            return self._grouped(op, self.forward)
        if self._fp8_shape(op) is not None:
            return self.kernel_time(op["kind"], op["flops"], op["bytes"], dtype="fp8") + self.cast_s(op)
        return self.kernel_time(op["kind"], op["flops"] * executed_share(op), op["bytes"])

    def backward(self, op: Mapping[str, Any]) -> float:
        """Backward time: GEMM-like ops run two kernels (input and weight gradients) of half ``bwd_flops`` each,
        or, where the profile measured the pair (``gemm`` backward), the pair at ``bwd_flops``; other ops one kernel
        reading the output gradient and the saved input and writing the input gradient. A fused attention kernel's
        backward is one kernel of ``bwd_flops`` (its input gradients; it has no weights)."""
        if op.get("grouped", 1) != 1:
            return self._grouped(op, self.backward)
        kind = op["kind"]
        if kind == "attention":
            return self.kernel_time(kind, op["bwd_flops"] * executed_share(op), 2 * op["bytes"], "bwd")
        if self._fp8_shape(op) is not None:  # the output gradient's casts, then the FP8 pair
            pair = self._measured(kind, op["bwd_flops"], 2 * op["bytes"], "bwd", "fp8")
            gemms = (
                pair if pair is not None else 2 * self.kernel_time(kind, op["bwd_flops"] / 2, op["bytes"], dtype="fp8")
            )
            return gemms + self.cast_s(op, "bwd")
        if kind in MATMUL_KINDS:
            pair = self._measured(kind, op["bwd_flops"], 2 * op["bytes"], "bwd")
            return pair if pair is not None else 2 * self.kernel_time(kind, op["bwd_flops"] / 2, op["bytes"])
        return self.kernel_time(kind, op["bwd_flops"], 2 * op["bytes"], "bwd")
