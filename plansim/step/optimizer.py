"""The optimizer step's time: one fused, memory-bound Adam pass over the parameters a rank updates, after the
gradients' clipping by their global norm where the framework clips (its ``grad_clip`` rule).

Fused Adam (as in Apex's FusedAdam and PyTorch's ``fused=True``) reads and writes the fp32 master weights, momentum
and variance (3 x 8 bytes per parameter), reads the gradient and, in mixed precision, writes the low-precision weights
(2 bytes). It does a handful of FLOPs per byte, so it is priced by memory traffic (Micikevicius et al. 2018 for the
mixed-precision state layout; Loshchilov & Hutter 2019 for AdamW). Clipping reads the gradients once for their norm
and reads and writes them once to scale them (NVIDIA/Megatron-LM core_v0.15.0 megatron/core/optimizer/clip_grads.py:
multi_tensor_l2norm, then multi_tensor_scale; torch.nn.utils.get_total_norm, then clip_grads_with_norm_). The norm's
all-reduce of one number is left out: a latency of microseconds.

Each pass is a multi-tensor kernel the host launches once per ``MULTI_TENSOR_ELEMENTS`` elements, and takes at
least those launches' host time (the framework's ``kernel_launch`` rule). With the optimizer offloaded to the host
(``Strategy.offload``) the GPU keeps only the clipping: the Adam step is the CPU's (``plansim.step.offload``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from plansim.step.data_parallel import sharded_params_are_master
from plansim.strategy.frameworks import load_framework

if TYPE_CHECKING:
    from plansim.costs.kernels import KernelCostModel
    from plansim.strategy.schema import Strategy

__all__ = ["ADAM_BYTES_FP32", "ADAM_BYTES_MIXED", "MULTI_TENSOR_ELEMENTS", "grad_bytes_per_param", "optimizer_step_s"]

ADAM_BYTES_MIXED = 3 * 8 + 2
ADAM_BYTES_FP32 = 3 * 8
#: The most elements one launch of a multi-tensor kernel covers: 320 blocks of 65,536 (2048 x 32) elements each
#: (NVIDIA/TransformerEngine transformer_engine/common/multi_tensor/multi_tensor_apply.cuh:18-19, Megatron-LM's
#: FusedAdam and clipping; deepspeedai/DeepSpeed csrc/adam/multi_tensor_apply.cuh:25-26; PyTorch's
#: aten/src/ATen/native/cuda/MultiTensorApply.cuh with its 4 KB kernel arguments).
MULTI_TENSOR_ELEMENTS = 320 * 65536


def grad_bytes_per_param(s: Strategy) -> int:
    """Bytes of one gradient element (``Strategy.grad_bytes``: fp32 with fp32 accumulation and reduction, Megatron-LM's
    main_grad, or in fp32 training; else 2)."""
    return s.grad_bytes


def _multi_tensor_pass_s(kernels: KernelCostModel, elements: float, bytes_per_element: float) -> float:
    """One memory-bound pass over ``elements`` elements moving ``bytes_per_element`` each, launched by the host in
    ``ceil(elements / MULTI_TENSOR_ELEMENTS)`` kernels: the longer of its GPU time and its launches' host time."""
    gpu = kernels.kernel_time("elementwise", 0.0, elements * bytes_per_element)
    return max(gpu, math.ceil(elements / MULTI_TENSOR_ELEMENTS) * kernels.host_s)


def optimizer_step_s(kernels: KernelCostModel, s: Strategy, params: float) -> float:
    """Seconds of one fused Adam step over ``params`` parameters held by a stage (its share under ZeRO >= 1: 1/dp,
    or 1/``dp_shard`` under hybrid sharding), after the gradients' clipping where the framework clips."""
    local = params / (s.shard_degree if s.zero >= 1 else 1)
    if local <= 0:
        return 0.0
    mixed = s.mixed_precision and not sharded_params_are_master(s)  # FSDP2 steps the fp32 shards: no bf16 copy
    grad = grad_bytes_per_param(s)
    seconds = 0.0
    if "optimizer" not in s.offload:  # offloaded, the CPU steps the shard (plansim.step.offload)
        seconds = _multi_tensor_pass_s(kernels, local, (ADAM_BYTES_MIXED if mixed else ADAM_BYTES_FP32) + grad)
    if load_framework(s.framework).rules.grad_clip.value:  # the norm reads the gradients, the scaling rewrites them
        seconds += _multi_tensor_pass_s(kernels, local, grad) + _multi_tensor_pass_s(kernels, local, 2 * grad)
    return seconds
