"""Real training steps of the validator's torch models (``profiling.torch_models``), timed, with their peak memory.

The step is what plansim prices for one GPU: forward of one micro-batch, the loss (cross-entropy on fp32 logits,
whose log-softmax is kept for backward as the workload builder counts: Korthikanti et al. 2022 sec 4.3), backward,
and AdamW. Mixed precision is the scheme plansim's memory model assumes (Rajbhandari et al. 2020, "ZeRO", sec 3.1;
Micikevicius et al. 2018, "Mixed Precision Training", sec 3.1): weights, activations and gradients in bf16 (2 + 2
bytes per parameter), fp32 master weights, momentum and variance in the optimizer (12 bytes). The update runs the
fused AdamW on the master weights chunk by chunk, so that fp32 copies of at most ``chunk_elements`` gradients exist
at a time, and writes the new weights back in bf16. In fp32 training AdamW updates the model's weights directly.

Step time is the median over ``repeats`` timed steps after ``warmup`` untimed ones (CUDA: synchronized wall time;
CPU: wall time). Peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps on a GPU: the bytes of live
tensors, which excludes the CUDA context and NCCL buffers. On a CPU, where torch keeps no such counter, it is the
same quantity rebuilt from the profiler's allocation events (``profile_memory=True``) of one step, on top of the
tensors alive before it.

Needs the ``torch`` extra.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from plansim.errors import PlansimError
from plansim.profiling.torch_models import build_model
from plansim.validation.points import ValidationPoint

__all__ = ["Measurement", "MixedPrecisionAdamW", "adamw", "cross_entropy", "measure_point"]

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def adamw(params: list[nn.Parameter], *, fused: bool = False) -> torch.optim.AdamW:
    """AdamW with GPT-3's hyper-parameters (Brown et al. 2020, appendix B); they change neither time nor memory."""
    return torch.optim.AdamW(params, lr=6e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=fused)


@dataclass(frozen=True)
class Measurement:
    """One configuration's real steps: median step time, its spread, peak tensor bytes and the last loss."""

    step_time_s: float
    step_time_min_s: float
    step_time_max_s: float
    peak_memory_bytes: int
    loss: float
    repeats: int


class _LeanCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over fp32 logits that keeps only the fp32 softmax for backward and turns it into the
    gradient in place, as Megatron-LM's vocab-parallel cross-entropy does (Shoeybi et al. 2019, sec 3; the 4sbV bytes
    of Korthikanti et al. 2022, sec 4.3). Autograd's log_softmax + nll_loss would hold two more fp32 copies of the
    logits during backward, which plansim does not price."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        wide = torch.promote_types(logits.dtype, torch.float32)
        probs = logits.to(wide, copy=True).view(-1, logits.shape[-1])  # the one fp32 copy, softmax built in place
        rows = targets.reshape(-1)
        picked = probs.gather(1, rows[:, None]).squeeze(1)
        top = probs.amax(dim=-1)
        probs.sub_(top[:, None]).exp_()
        total = probs.sum(dim=-1)
        probs.div_(total[:, None])
        loss = (total.log() + top - picked).mean()
        ctx.save_for_backward(probs, rows)
        ctx.dtype, ctx.shape = logits.dtype, logits.shape
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        probs, rows = ctx.saved_tensors
        probs[torch.arange(rows.numel(), device=rows.device), rows] -= 1.0
        probs.mul_(grad / rows.numel())
        return probs.to(ctx.dtype).view(ctx.shape), None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of ``logits`` (batch, seq, vocab) against ``targets`` (batch, seq); see
    ``_LeanCrossEntropy``.

    >>> logits = torch.randn(2, 3, 5, requires_grad=True)
    >>> targets = torch.randint(0, 5, (2, 3))
    >>> reference = torch.nn.functional.cross_entropy(logits.view(-1, 5), targets.view(-1))
    >>> torch.allclose(cross_entropy(logits, targets), reference)
    True
    """
    loss = _LeanCrossEntropy.apply(logits, targets)
    assert isinstance(loss, torch.Tensor)
    return loss


class MixedPrecisionAdamW:
    """AdamW over fp32 master copies of bf16/fp16 weights (or over the weights themselves in fp32).

    Each master weight is split along its first dimension into pieces of at most ``chunk_elements`` (1 Mi by
    default: 4 MiB of fp32), each an optimizer parameter of its own, so that converting gradients to fp32 never
    holds more than one piece's copy: the update adds at most that to the model states' 16 bytes per parameter.
    """

    def __init__(self, params: Iterable[nn.Parameter], *, chunk_elements: int = 1 << 20, fused: bool = False) -> None:
        self.params = list(params)
        self.mixed = any(p.dtype != torch.float32 for p in self.params)
        #: (parameter index, first row, last row + 1) of each piece, and its fp32 master (or the weight itself)
        self.pieces: list[tuple[int, int, int]] = []
        held: list[nn.Parameter] = []
        for i, p in enumerate(self.params):
            if not self.mixed:
                self.pieces.append((i, 0, p.shape[0] if p.dim() else 1))
                held.append(p)
                continue
            rows = p.shape[0] if p.dim() else 1
            step = max(1, chunk_elements // max(1, p.numel() // rows))
            for first in range(0, rows, step):
                last = min(rows, first + step)
                piece = p.detach()[first:last] if p.dim() else p.detach()
                self.pieces.append((i, first, last))
                held.append(nn.Parameter(piece.float(), requires_grad=False))
        self.master = held if self.mixed else []
        self.optimizers = [adamw([m], fused=fused) for m in held]

    @torch.no_grad()
    def step(self) -> None:
        """Update every weight from its gradient, then zero the gradients in place: like Megatron-LM's gradient
        buffers, they stay allocated from step to step, as plansim's memory model holds them (static memory)."""
        if not self.mixed:
            for optimizer in self.optimizers:
                optimizer.step()
            for p in self.params:
                if p.grad is not None:
                    p.grad.zero_()
            return
        for (i, first, last), master, optimizer in zip(self.pieces, self.master, self.optimizers, strict=True):
            p = self.params[i]
            if p.grad is None:
                continue
            grad = p.grad[first:last] if p.dim() else p.grad
            master.grad = grad.float()
            optimizer.step()
            master.grad = None
            (p[first:last] if p.dim() else p).copy_(master)
            grad.zero_()

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor the optimizer holds (master weights, momentum, variance, step counters)."""
        held: list[torch.Tensor] = list(self.master)
        for optimizer in self.optimizers:
            for state in optimizer.state.values():
                held += [t for t in state.values() if isinstance(t, torch.Tensor)]
        return held


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@contextlib.contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """File descriptor 2 sent to the null device for the block: torch's CPU profiler writes a line to it at each
    start and stop (``USDT: ... profiler_start``), through no Python stream (so no logging setting reaches it)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_step_peak(step: Callable[[], Any], alive_before: int) -> int:
    """Peak live bytes of one CPU step from the profiler's allocation events, on top of ``alive_before``."""
    from torch.profiler import ProfilerActivity, profile

    with _native_stderr_muted(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    raw = prof.profiler.kineto_results.events() if prof.profiler and prof.profiler.kineto_results else []
    deltas = sorted((e.start_ns(), e.nbytes()) for e in raw if e.name() == "[memory]")
    live = peak = 0
    for _, delta in deltas:
        live += delta
        peak = max(peak, live)
    return alive_before + peak


def measure_point(
    point: ValidationPoint,
    *,
    device: str = "cuda",
    dtype: str = "bf16",
    warmup: int = 3,
    repeats: int = 10,
    seed: int = 0,
) -> Measurement:
    """Build ``point``'s model on ``device``, run ``warmup`` + ``repeats`` training steps and measure them."""
    if dtype not in _DTYPES:
        raise PlansimError(f"dtype {dtype!r}: pick one of {', '.join(_DTYPES)}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PlansimError("--device cuda: this torch sees no CUDA device; pass --device cpu")
    torch.manual_seed(seed)
    spec = point.model
    model = build_model(spec, point.remat, device=dev, dtype=_DTYPES[dtype])
    model.train()
    params = list(dict.fromkeys(p for p in model.parameters() if p.requires_grad))
    optimizer = MixedPrecisionAdamW(params, fused=dev.type == "cuda")
    tokens = torch.randint(0, spec.vocab, (point.micro_batch, spec.seq_len + 1), device=dev)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    losses: list[float] = []

    def step() -> None:
        loss = cross_entropy(model(inputs), targets)  # no reference kept to the logits: freed once converted
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))

    for _ in range(warmup):
        step()
    _sync(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(repeats):
        _sync(dev)
        began = time.perf_counter()
        step()
        _sync(dev)
        times.append(time.perf_counter() - began)
    if dev.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(dev))
    else:
        alive = [*params, *(p.grad for p in params if p.grad is not None), *optimizer.state_tensors(), tokens]
        alive += list(model.buffers())
        peak = _cpu_step_peak(step, _storage_bytes(alive))
    return Measurement(
        step_time_s=statistics.median(times),
        step_time_min_s=min(times),
        step_time_max_s=max(times),
        peak_memory_bytes=peak,
        loss=losses[-1],
        repeats=repeats,
    )
