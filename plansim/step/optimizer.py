"""The optimizer step's time: one fused, memory-bound Adam kernel over the parameters a rank updates.

Fused Adam (as in Apex's FusedAdam and PyTorch's ``fused=True``) reads and writes the fp32 master weights, momentum
and variance (3 x 8 bytes per parameter), reads the gradient and, in mixed precision, writes the low-precision weights
(2 bytes). It does a handful of FLOPs per byte, so it is priced by memory traffic (Micikevicius et al. 2018 for the
mixed-precision state layout; Loshchilov & Hutter 2019 for AdamW).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plansim.step.data_parallel import sharded_params_are_master

if TYPE_CHECKING:
    from plansim.costs.kernels import KernelCostModel
    from plansim.strategy.schema import Strategy

__all__ = ["ADAM_BYTES_FP32", "ADAM_BYTES_MIXED", "grad_bytes_per_param", "optimizer_step_s"]

ADAM_BYTES_MIXED = 3 * 8 + 2
ADAM_BYTES_FP32 = 3 * 8


def grad_bytes_per_param(s: Strategy) -> int:
    """Bytes of one gradient element (``Strategy.grad_bytes``: fp32 with fp32 accumulation and reduction, Megatron-LM's
    main_grad, or in fp32 training; else 2)."""
    return s.grad_bytes


def optimizer_step_s(kernels: KernelCostModel, s: Strategy, params: float) -> float:
    """Seconds of one fused Adam step over ``params`` parameters held by a stage (its share under ZeRO >= 1: 1/dp,
    or 1/``dp_shard`` under hybrid sharding)."""
    local = params / (s.shard_degree if s.zero >= 1 else 1)
    mixed = s.mixed_precision and not sharded_params_are_master(s)  # FSDP2 steps the fp32 shards: no bf16 copy
    per_param = (ADAM_BYTES_MIXED if mixed else ADAM_BYTES_FP32) + grad_bytes_per_param(s)
    return kernels.kernel_time("elementwise", 0.0, local * per_param)
