"""``plansim profile``: time the kernels a transformer training step is made of, forward and backward, on one
device, and write a measured profile (``schema.KernelProfile``).

What is swept, for a model's widths (hidden h, FFN width f, vocabulary V, heads, head width d) at several token
counts T (micro-batch x sequence) and tensor-parallel shards t:

- GEMMs of a layer's linear maps: QKV (h -> 3h/t), attention projection (h/t -> h), MLP up (h -> f/t) and down
  (f/t -> h), logits (h -> V/t); backward is the input-gradient and the weight-gradient GEMM together (4mnk FLOPs);
  where the torch build and the GPU run scaled FP8 matmuls (``fp8_gemm_available``: ``torch._scaled_mm`` and
  ``float8_e4m3fn`` on CUDA compute capability 8.9 or above), the same GEMMs as FP8 (e4m3 operands, per-tensor
  scales, bf16 output), recorded as dtype ``fp8``: the measured table then prices ``dtype: fp8``'s GEMMs;
- batched matmuls QK^T and attention over V, and fused scaled-dot-product attention (causal), at several sequence
  lengths;
- LayerNorm, RMSNorm, softmax, GELU, SiLU and the residual add over T x h elements, forward and backward;
- the fused AdamW update over a layer's parameters; device copies; host-to-device and device-to-host transfers
  (pinned memory; CUDA only);
- on CUDA, the overlap section (``measure_overlap``): a GEMM and a memory-bound add timed alone and while
  device-to-device copies run on a second stream (one GPU's stand-in for a collective beside compute).

Timing: CUDA events on a GPU (``perf_counter`` after a synchronize elsewhere), ``warmup`` untimed runs, then the
median of ``repeats`` timed ones. ``quick`` sweeps fewer sizes with fewer repeats. A CPU sweeps the token counts and
sequence lengths a CPU runs (up to 2,048 tokens; ``quick``: 128 and 512, in about a minute for GPT-3 1.3B's widths
where the GPU's sizes took 15 minutes and 6 GB), and the tests run it at tiny widths. The kernels are timed one
group at a time (a layer's GEMMs at one token count and shard, attention at one sequence length, ...), each group's
tensors made when it starts and freed when it ends, so memory holds one group's tensors, not the whole sweep's.
"""

from __future__ import annotations

import datetime as dt
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from plansim.errors import PlansimError
from plansim.limits import whole
from plansim.profiling.schema import Environment, KernelPoint, KernelProfile, Overlap, OverlapPoint
from plansim.workload import ModelSpec

__all__ = [
    "SweepSizes",
    "check_timing",
    "default_out",
    "environment",
    "fp8_gemm_available",
    "measure_overlap",
    "pick_device",
    "profile_kernels",
    "sweep_sizes",
]

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class SweepSizes:
    """The widths and counts a sweep covers."""

    hidden: int
    ffn: int
    vocab: int
    heads: int
    tokens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    tp: tuple[int, ...]
    adam_params: tuple[int, ...]


#: The longest sequence a CPU sweep times attention at (a CPU trains short sequences).
CPU_MAX_SEQ = 1024


def sweep_sizes(spec: ModelSpec, quick: bool = False, device: str = "cuda") -> SweepSizes:
    """The sizes swept for ``spec``: on a GPU token counts from 512 to 16,384 (quick: 2,048 and 8,192), sequence
    lengths up to the model's, tp 1-8 (quick: 1 and 8), AdamW over one layer's and 1/8 of a layer's parameters; on a
    CPU (``device`` ``cpu``) token counts from 128 to 2,048 (quick: 128 and 512), sequences up to ``CPU_MAX_SEQ``
    (quick: 512) and AdamW over 1/8 of a layer (quick) or also a whole one."""
    layer = spec.num_parameters() // max(1, spec.layers)
    seq = spec.seq_len
    if device.startswith("cpu"):
        longest = min(seq, 512 if quick else CPU_MAX_SEQ)
        return SweepSizes(
            hidden=spec.hidden,
            ffn=spec.ffn_hidden,
            vocab=spec.vocab,
            heads=spec.heads,
            tokens=(128, 512) if quick else (128, 256, 512, 1024, 2048),
            seq_lens=(longest,) if quick else tuple(sorted({max(64, longest // 4), max(64, longest // 2), longest})),
            tp=(1, 8) if quick else (1, 2, 4, 8),
            adam_params=(max(1, layer // 8),) if quick else (max(1, layer // 8), layer),
        )
    return SweepSizes(
        hidden=spec.hidden,
        ffn=spec.ffn_hidden,
        vocab=spec.vocab,
        heads=spec.heads,
        tokens=(2048, 8192) if quick else (512, 1024, 2048, 4096, 8192, 16384),
        seq_lens=(seq,) if quick else tuple(sorted({max(128, seq // 4), max(128, seq // 2), seq})),
        tp=(1, 8) if quick else (1, 2, 4, 8),
        adam_params=(layer,) if quick else (layer // 8, layer),
    )


def environment(device: torch.device, command: str) -> Environment:
    """What the profile was measured on: device, torch, CUDA, driver, clocks, memory, host, date, command."""
    cuda = device.type == "cuda"
    clocks: dict[str, float] = {}
    driver = None
    if cuda:
        try:  # the driver's view (pynvml ships with recent torch builds; absent, the clocks stay empty)
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            driver = str(pynvml.nvmlSystemGetDriverVersion())
            clocks = {
                "sm_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                "memory_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
                "sm_max_mhz": float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            }
        except Exception:  # the profile stays valid without the driver's figures
            pass
    return Environment(
        device=device.type,
        device_name=torch.cuda.get_device_name(device) if cuda else _cpu_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda if cuda else None,
        driver=driver,
        clocks=clocks,
        memory_bytes=torch.cuda.get_device_properties(device).total_memory if cuda else None,
        python=sys.version.split()[0],
        platform=platform.platform(),
        date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        command=command,
    )


def _cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _timer(
    device: torch.device, warmup: int, repeats: int
) -> Callable[[Callable[[], Any]], tuple[float, float | None]]:
    """A function that times ``fn()``: median seconds of ``repeats`` runs after ``warmup``, and their coefficient of
    variation (``spread``; None for one repeat)."""
    cuda = device.type == "cuda"

    def measure(fn: Callable[[], Any]) -> tuple[float, float | None]:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize(device)
                times.append(start.elapsed_time(end) / 1e3)
            else:
                began = time.perf_counter()
                fn()
                times.append(time.perf_counter() - began)
        return max(statistics.median(times), 1e-9), spread(times)

    return measure


def spread(times: list[float]) -> float | None:
    """Coefficient of variation of timed runs (sample standard deviation over mean); None for fewer than two.

    >>> round(spread([1.0, 1.1, 0.9]), 6)
    0.1
    """
    if len(times) < 2:
        return None
    mean = statistics.fmean(times)
    return statistics.stdev(times) / mean if mean > 0 else None


def profile_kernels(
    sizes: SweepSizes,
    *,
    device: str | torch.device = "cpu",
    dtype: str = "bf16",
    warmup: int = 5,
    repeats: int = 20,
    quick: bool = False,
    command: str = "",
    progress: Callable[[int, int], None] | None = None,
    group: Callable[[str], None] | None = None,
) -> KernelProfile:
    """Time every kernel of the sweep (see the module docstring) and return the profile; ``quick`` keeps at most
    5 timed repeats. ``group(label)`` is called as each group of kernels starts, ``progress(done, total)`` as each
    ends."""
    if dtype not in _DTYPES:
        raise PlansimError(f"--dtype {dtype}: choose one of {', '.join(_DTYPES)}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PlansimError("--device cuda: torch sees no CUDA device here: use --device cpu")
    repeats = min(repeats, 5) if quick else repeats
    measure = _timer(dev, warmup, repeats)
    groups = _groups(sizes, dev, _DTYPES[dtype], dtype)
    cuda = dev.type == "cuda"
    total = len(groups) + cuda
    points = []
    if progress:
        progress(0, total)
    for k, (label, jobs) in enumerate(groups):
        if group:
            group(label)
        for fn, point in jobs():  # the group's tensors live while its kernels are timed
            median, cv = measure(fn)
            points.append(KernelPoint(**point, time_s=median, repeats=repeats, cv=cv))
        if progress:
            progress(k + 1, total)
    overlap = None
    if cuda:
        if group:
            group("overlap: a GEMM and an add beside a copy stream")
        overlap = measure_overlap(sizes, dev, dtype, warmup=warmup, repeats=repeats)
        if progress:
            progress(total, total)
    return KernelProfile(environment=environment(dev, command), points=points, overlap=overlap)


def measure_overlap(
    sizes: SweepSizes, device: torch.device, dtype: str, *, warmup: int = 5, repeats: int = 20
) -> Overlap | None:
    """The overlap section on one CUDA GPU; None elsewhere (a CPU has no streams to overlap).

    What it measures: a layer's MLP-up GEMM at the sweep's largest token count and a residual add over the same
    tokens, each timed alone and then while a second stream copies a 256 MiB buffer again and again
    (``Tensor.copy_``), which loads the GPU's memory as a collective's receive-and-forward does. A copy kernel holds
    no SMs for itself (the block scheduler shares them), unlike NCCL's channels, so the section says ``channels: 0``
    and its slowdown is the memory-contention part alone; ``load_hbm_Bps`` is the copies' bytes read and written
    over the time they ran, which spans the kernels' repeats. An NCCL collective between GPUs measures the SM share
    too; a single lent GPU cannot run one.
    """
    if device.type != "cuda":
        return None
    dt_ = _DTYPES[dtype]
    m, n, k = max(sizes.tokens), sizes.ffn, sizes.hidden
    x, w = torch.randn(m, k, dtype=dt_, device=device), torch.randn(k, n, dtype=dt_, device=device)
    a, b = torch.randn(m, k, dtype=dt_, device=device), torch.randn(m, k, dtype=dt_, device=device)
    kernels = (("gemm", (m, n, k), lambda: x @ w), ("add", (m, k), lambda: a + b))
    src = torch.empty(128 * 2**20, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    side = torch.cuda.Stream(device)
    measure = _timer(device, warmup, repeats)
    copy_s, _ = measure(lambda: dst.copy_(src))
    points = []
    moved = spent = 0.0
    for op, shape, fn in kernels:
        alone, _ = measure(fn)
        copies = max(1, math.ceil(1.5 * (warmup + repeats) * alone / copy_s))
        torch.cuda.synchronize(device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(side):
            begin.record(side)
            for _ in range(copies):
                dst.copy_(src)
            end.record(side)
        overlapped = max(alone, _beside(fn, warmup, repeats))  # its median while the copies run beside it
        torch.cuda.synchronize(device)
        moved += 2.0 * src.numel() * src.element_size() * copies
        spent += begin.elapsed_time(end) / 1e3
        points.append(
            OverlapPoint(op=op, dtype=dtype, shape=shape, alone_s=alone, overlapped_s=overlapped, repeats=repeats)
        )
    return Overlap(load="copy_stream", channels=0, load_hbm_Bps=moved / spent, points=points)


_Jobs = Callable[[], Iterator[tuple[Callable[[], Any], dict]]]


def _groups(s: SweepSizes, dev: torch.device, dt_: torch.dtype, dtype: str) -> list[tuple[str, _Jobs]]:
    """The sweep's kernels by group: (label, a function giving (callable, point fields without time) for each kernel
    of the group, its tensors made on the way)."""
    e = torch.tensor([], dtype=dt_).element_size()
    groups: list[tuple[str, _Jobs]] = []
    for t in s.tp:
        for m in s.tokens:
            groups.append(
                (f"a layer's GEMMs, {m:,} tokens, tp {t}", partial(_layer_gemms, s, m, t, dev, dt_, dtype, e))
            )
    head = s.hidden // s.heads
    for seq in s.seq_lens:
        batch_heads = max(1, max(s.tokens) // seq) * s.heads // max(s.tp)
        label = f"attention, sequence {seq:,}"
        groups.append((label, partial(_attention, batch_heads, seq, head, dev, dt_, dtype, e)))
    for m in s.tokens:
        groups.append((f"norms, softmax, activations, {m:,} tokens", partial(_pointwise, s, m, dev, dt_, dtype, e)))
    for n in s.adam_params:
        groups.append((f"AdamW, {n:,} parameters", partial(lambda n: iter([_adam(n, dev)]), n)))
    groups.append(("copies and host transfers", partial(_copies, s, dev, dt_, dtype, e)))
    return groups


def _layer_gemms(
    s: SweepSizes, m: int, t: int, dev: torch.device, dt_: torch.dtype, dtype: str, e: int
) -> Iterator[tuple]:
    """The five linear maps of a layer (QKV, attention projection, MLP up and down, logits) at ``m`` tokens and
    tensor-parallel shard ``t``; as scaled FP8 GEMMs too where the device runs them (``fp8_gemm_available``)."""
    fp8 = fp8_gemm_available(dev)
    for n, k in ((3 * s.hidden // t, s.hidden), (s.hidden, s.hidden // t), (s.ffn // t, s.hidden),
                 (s.hidden, s.ffn // t), (s.vocab // t, s.hidden)):  # fmt: skip
        if n < 1 or k < 1:
            continue
        yield from _gemm(m, n, k, dev, dt_, dtype, e)
        if fp8 and m % 16 == 0 and n % 16 == 0 and k % 16 == 0:  # cuBLASLt's FP8 layouts: multiples of 16
            yield from _fp8_gemm(m, n, k, dev)


def fp8_gemm_available(dev: torch.device) -> bool:
    """Whether ``dev`` runs scaled FP8 matmuls in this torch build: ``torch._scaled_mm`` and ``float8_e4m3fn``
    exist and the device is a CUDA GPU of compute capability 8.9 or above (Ada, Hopper, Blackwell: the FP8 tensor
    cores, as Transformer Engine checks, transformer_engine/pytorch/quantization.py:148-158 at d0067d0d). False on
    a CPU."""
    if dev.type != "cuda" or not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False
    return tuple(torch.cuda.get_device_capability(dev)) >= (8, 9)


def _fp8_gemm(m: int, n: int, k: int, dev: torch.device) -> Iterator[tuple]:
    """A linear map as Transformer Engine runs it in FP8: forward ``[m, k] @ [k, n]`` and backward the input
    gradient ``[m, n] @ [n, k]`` and weight gradient ``[k, m] @ [m, n]``, each a ``torch._scaled_mm`` of e4m3
    operands with per-tensor fp32 scales and a bf16 output (cuBLASLt wants the second operand column-major: a
    row-major tensor's transpose). Bytes: 1 an operand element, 2 an output one (backward: dY and W read, dX
    written; X and dY read, dW written)."""
    f8, scale = torch.float8_e4m3fn, torch.ones((), dtype=torch.float32, device=dev)

    def mm(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:  # a [m, k] row-major, b_t [n, k] row-major
        return torch._scaled_mm(a, b_t.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)

    x, w_t = torch.randn(m, k, device=dev).to(f8), torch.randn(n, k, device=dev).to(f8)  # X, W^T
    g, w = torch.randn(m, n, device=dev).to(f8), torch.randn(k, n, device=dev).to(f8)  # dY, W (column-wise copy)
    x_t, g_t = x.t().contiguous(), g.t().contiguous()
    yield (lambda: mm(x, w_t)), _point("gemm", "fwd", "fp8", (m, n, k), 2.0 * m * n * k, m * k + k * n + 2.0 * m * n)
    yield (
        (lambda: (mm(g, w), mm(x_t, g_t))),  # dX = dY W^T (w's rows: k), dW = X^T dY
        _point("gemm", "bwd", "fp8", (m, n, k), 4.0 * m * n * k, 2.0 * m * n + 3.0 * (m * k + k * n)),
    )


def _pointwise(s: SweepSizes, m: int, dev: torch.device, dt_: torch.dtype, dtype: str, e: int) -> Iterator[tuple]:
    yield from _elementwise(m, s.hidden, dev, dt_, dtype, e)
    yield from _elementwise_wide(m, s.ffn, dev, dt_, dtype, e)


def _copies(s: SweepSizes, dev: torch.device, dt_: torch.dtype, dtype: str, e: int) -> Iterator[tuple]:
    """Device copies and (CUDA) host transfers of a layer's activations at each token count."""
    for m in s.tokens:
        n = m * s.hidden
        src, dst = torch.empty(n, dtype=dt_, device=dev), torch.empty(n, dtype=dt_, device=dev)
        yield partial(dst.copy_, src), _point("copy", "fwd", dtype, (n,), 0.0, 2.0 * n * e)
        if dev.type == "cuda":
            host = torch.empty(n, dtype=dt_, pin_memory=True)
            yield partial(dst.copy_, host, non_blocking=True), _point("h2d", "fwd", dtype, (n,), 0.0, n * e)
            yield partial(host.copy_, dst, non_blocking=True), _point("d2h", "fwd", dtype, (n,), 0.0, n * e)


def _point(op: str, direction: str, dtype: str, shape: tuple[int, ...], flops: float, n_bytes: float) -> dict:
    return {"op": op, "pass": direction, "dtype": dtype, "shape": shape, "flops": flops, "bytes": n_bytes}


def _gemm(m: int, n: int, k: int, dev: torch.device, dt_: torch.dtype, dtype: str, e: int) -> Iterator[tuple]:
    """A linear map's forward ([m, k] @ [k, n]) and backward (input gradient [m, n] @ [n, k] and weight gradient
    [k, m] @ [m, n])."""
    x, w = torch.randn(m, k, dtype=dt_, device=dev), torch.randn(k, n, dtype=dt_, device=dev)
    g = torch.randn(m, n, dtype=dt_, device=dev)
    yield (lambda: x @ w), _point("gemm", "fwd", dtype, (m, n, k), 2.0 * m * n * k, (m * k + k * n + m * n) * e)
    yield (
        (lambda: (g @ w.T, x.T @ g)),
        _point("gemm", "bwd", dtype, (m, n, k), 4.0 * m * n * k, 2.0 * (m * k + k * n + m * n) * e),
    )


def _attention(bh: int, seq: int, d: int, dev: torch.device, dt_: torch.dtype, dtype: str, e: int) -> Iterator[tuple]:
    """QK^T and attention over V as batched matmuls, and fused causal attention, forward and backward."""
    q, k, v = (torch.randn(bh, seq, d, dtype=dt_, device=dev) for _ in range(3))
    scores = torch.randn(bh, seq, seq, dtype=dt_, device=dev)
    flops = 2.0 * bh * seq * seq * d
    yield (lambda: q @ k.transpose(1, 2)), _point("bmm", "fwd", dtype, (bh, seq, seq, d), flops,
                                                   (2 * bh * seq * d + bh * seq * seq) * e)  # fmt: skip
    yield (lambda: scores @ v), _point("bmm", "fwd", dtype, (bh, seq, d, seq), flops,
                                        (bh * seq * seq + 2 * bh * seq * d) * e)  # fmt: skip
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    with torch.enable_grad():
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    grad = torch.randn_like(out)
    causal = 2.0 * bh * seq * seq * d  # the two matmuls over the causal half: 4 b s^2 d / 2
    io = 4.0 * bh * seq * d * e
    yield (
        (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        _point("sdpa", "fwd", dtype, (bh, seq, d), causal, io),
    )
    yield (
        (lambda: torch.autograd.grad(out, (qg, kg, vg), grad, retain_graph=True)),
        _point("sdpa", "bwd", dtype, (bh, seq, d), 2.5 * causal, 2.0 * io),
    )  # backward: five matmuls to the forward's two (FlashAttention-2, Dao 2023, sec 3.1.2)


def _unary(op: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, dtype: str, e: int) -> Iterator:
    rows, cols = x.shape
    n = rows * cols
    xg = x.clone().requires_grad_(True)
    with torch.enable_grad():
        out = fn(xg)
    grad = torch.randn_like(out)
    yield (lambda: fn(x)), _point(op, "fwd", dtype, (rows, cols), 0.0, 2.0 * n * e)
    yield (
        (lambda: torch.autograd.grad(out, xg, grad, retain_graph=True)),
        _point(op, "bwd", dtype, (rows, cols), 0.0, 3.0 * n * e),
    )


def _elementwise(m: int, h: int, dev: torch.device, dt_: torch.dtype, dtype: str, e: int) -> Iterator[tuple]:
    """Normalisations, softmax and the residual add over [m, h]."""
    x, y = torch.randn(m, h, dtype=dt_, device=dev), torch.randn(m, h, dtype=dt_, device=dev)
    weight = torch.ones(h, dtype=dt_, device=dev)
    yield from _unary("layernorm", lambda t: F.layer_norm(t, (h,), weight, weight), x, dtype, e)
    yield from _unary("rmsnorm", lambda t: F.rms_norm(t, (h,), weight), x, dtype, e)
    yield from _unary("softmax", lambda t: t.softmax(-1), x, dtype, e)
    yield (lambda: x + y), _point("add", "fwd", dtype, (m, h), 0.0, 3.0 * m * h * e)


def _elementwise_wide(m: int, f: int, dev: torch.device, dt_: torch.dtype, dtype: str, e: int) -> Iterator[tuple]:
    """The MLP's activations over [m, f]."""
    x = torch.randn(m, f, dtype=dt_, device=dev)
    yield from _unary("gelu", F.gelu, x, dtype, e)
    yield from _unary("silu", F.silu, x, dtype, e)


def _adam(n: int, dev: torch.device) -> tuple[Callable[[], Any], dict]:
    """One AdamW step over ``n`` fp32 master parameters with fp32 gradients (fused on CUDA): reads parameter,
    gradient and both moments, writes parameter and moments: 28 bytes per parameter."""
    p = torch.zeros(n, dtype=torch.float32, device=dev, requires_grad=True)
    p.grad = torch.randn(n, dtype=torch.float32, device=dev)
    opt = torch.optim.AdamW([p], lr=1e-4, fused=dev.type == "cuda", foreach=False if dev.type == "cuda" else None)
    return opt.step, _point("adam", "fwd", "fp32", (n,), 0.0, 28.0 * n)


def _beside(fn: Callable[[], Any], warmup: int, repeats: int) -> float:
    """Median seconds of ``fn`` on the current stream, waiting on its own events only (a device-wide synchronize
    would wait for the other stream's work too)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return max(statistics.median(times), 1e-9)


def pick_device(device: str | None) -> str:
    """``device`` checked (``cuda``, ``cuda:N`` or ``cpu``); by default ``cuda`` where torch sees one, else ``cpu``."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cuda", "cpu") and not device.startswith("cuda:"):
        raise PlansimError(f"--device {device}: choose cuda or cpu")
    return device


def check_timing(warmup: int, repeats: int) -> None:
    """Untimed runs may be none; at least one timed run is needed for a median."""
    if warmup < 0 or repeats < 1:
        raise PlansimError(f"--warmup {warmup} --repeats {repeats}: need warmup >= 0 and repeats >= 1")
    whole(warmup, "warmup", "--warmup")
    whole(repeats, "repeats", "--repeats")


def default_out(profile: KernelProfile) -> str:
    """``hardware_profiles/measured/<gpu>.yaml``, where the cost model reads it: ``<gpu>`` is the shipped GPU profile
    the device name stands for (``NVIDIA H100 80GB HBM3`` -> ``h100-sxm5-80gb``, ``hardware.devices``); a device
    with no such profile gets its name lower-cased with runs of other characters as single dashes."""
    import re

    from plansim.hardware.devices import device_profile

    name = profile.environment.device_name
    known = device_profile(name) if profile.environment.device == "cuda" else None
    slug = known[0] if known else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"
    return f"hardware_profiles/measured/{slug}.yaml"
