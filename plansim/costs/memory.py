"""The analytic memory model: model states under ZeRO, activations under rematerialization, per pipeline stage.

Model states (Rajbhandari et al. 2020, "ZeRO", sec 3.1 and 5): with mixed-precision Adam a parameter costs 2 bytes
(fp16/bf16 weights) + 2 (gradients) + K=12 (fp32 master weights, momentum, variance). Stage 1 partitions the
optimizer states over the N data-parallel ranks (4 + K/N bytes per parameter), stage 2 also the gradients
(2 + (2+K)/N), stage 3 also the weights ((4+K)/N). In fp32 training weights and gradients take 4 bytes each and
Adam's K is 8 (momentum, variance). Megatron-LM keeps fp32 gradient-accumulation buffers (``main_grad``): gradients
then take 4 bytes.

Activations (Korthikanti et al. 2022, sec 4): each op of the workload graph carries the bytes it saves for backward;
a layer's activations are their sum, which reproduces that paper's Table 2. Rematerialization policies decide what
is stored per micro-batch and what is rebuilt, one layer (or segment) at a time, during backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LAYER_SAC_EVERY",
    "LayerActivations",
    "ModelStates",
    "StageActivations",
    "every_nth",
    "full",
    "model_state_bytes",
    "none",
    "op_selective",
    "selective",
    "sqrt_segments",
    "stage_activation_bytes_of",
]

ADAM_MIXED_K = 12  # fp32 master weights + momentum + variance, bytes per parameter (ZeRO sec 3.1)
ADAM_FP32_K = 8  # momentum + variance in fp32
#: torchtitan's default selective_ac_option, "2": every second block checkpointed (pytorch/torchtitan v0.2.2,
#: torchtitan/config/job_config.py:655; torchtitan/distributed/activation_checkpoint.py:39-40)
LAYER_SAC_EVERY = 2


@dataclass(frozen=True)
class ModelStates:
    """Bytes of model states on one device."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        """Weights + gradients + optimizer states."""
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(
    params: float,
    dp: int,
    zero: int,
    *,
    mixed_precision: bool = True,
    fp32_grad_accum: bool = False,
    weights_sharded: bool | None = None,
    master_in_weights: bool = False,
) -> ModelStates:
    """Model-state bytes per device for ``params`` parameters held by a device, under ZeRO across ``dp`` ranks; the
    weights sharded under ZeRO-3, or wherever ``weights_sharded`` says (FSDP's SHARD_GRAD_OP at ZeRO-2). With
    ``master_in_weights`` (FSDP2) the weights are the fp32 master copy and the optimizer holds only its moments.

    >>> s = model_state_bytes(7.5e9, 64, 1)      # ZeRO paper sec 5, Figure 1: 31.4 GB
    >>> round(s.total / 1e9, 1)
    31.4
    >>> fsdp2 = model_state_bytes(8e9, 8, 3, fp32_grad_accum=True, master_in_weights=True)
    >>> [round(x / 1e9) for x in (fsdp2.weights, fsdp2.gradients, fsdp2.optimizer)]  # 4 + 4 + 8 bytes a parameter
    [4, 4, 8]
    """
    master = master_in_weights and mixed_precision
    weight_b = 2 if mixed_precision and not master else 4
    grad_b = 4 if (fp32_grad_accum or not mixed_precision) else 2
    k = ADAM_MIXED_K if mixed_precision and not master else ADAM_FP32_K
    sharded = zero >= 3 if weights_sharded is None else weights_sharded
    weights = params * weight_b / (dp if sharded else 1)
    gradients = params * grad_b / (dp if zero >= 2 else 1)
    optimizer = params * k / (dp if zero >= 1 else 1)
    return ModelStates(weights, gradients, optimizer)


@dataclass(frozen=True)
class LayerActivations:
    """Saved-activation bytes of one layer for one micro-batch on one rank.

    ``full`` is everything its ops save; ``selective`` what remains when the attention core is recomputed;
    ``layer_input`` the layer's input, the only tensor kept under full recompute; ``op_kept`` the outputs a per-op
    policy (torchtitan's ``op`` selective checkpointing) keeps beside that input.
    """

    full: float
    selective: float
    layer_input: float
    op_kept: float = 0.0


@dataclass(frozen=True)
class StageActivations:
    """Bytes stored per micro-batch in flight, plus the working set rebuilt for one layer/segment in backward."""

    stored_per_microbatch: float
    working: float


def none(layers: Sequence[LayerActivations]) -> StageActivations:
    return StageActivations(sum(a.full for a in layers), 0.0)


def selective(layers: Sequence[LayerActivations]) -> StageActivations:
    """Korthikanti 2022 sec 5: keep all but the attention core, rebuild it for one layer at a time."""
    return StageActivations(sum(a.selective for a in layers), max((a.full - a.selective for a in layers), default=0))


def full(layers: Sequence[LayerActivations]) -> StageActivations:
    """Keep each layer's input; rebuild one layer's activations at a time (Korthikanti 2022 Table 2, last row)."""
    return StageActivations(sum(a.layer_input for a in layers), max((a.full for a in layers), default=0))


def op_selective(layers: Sequence[LayerActivations]) -> StageActivations:
    """torchtitan's per-op selective checkpointing: keep each layer's input and the outputs its policy saves, rebuild
    the rest of one layer's activations at a time."""
    return StageActivations(
        sum(a.layer_input + a.op_kept for a in layers), max((a.full - a.op_kept for a in layers), default=0)
    )


def every_nth(layers: Sequence[LayerActivations], every: int = LAYER_SAC_EVERY) -> StageActivations:
    """torchtitan's per-layer selective checkpointing: the ``every``-th, ``2 * every``-th, ... layer keeps its input
    (rebuilt whole, one at a time, as under full recompute), the others keep all they save."""
    hit = [(i + 1) % every == 0 for i in range(len(layers))]
    return StageActivations(
        sum(a.layer_input if h else a.full for a, h in zip(layers, hit, strict=True)),
        max((a.full for a, h in zip(layers, hit, strict=True) if h), default=0),
    )


def sqrt_segments(layers: Sequence[LayerActivations]) -> StageActivations:
    """Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost", sec 4.1): checkpoint every k = ceil(sqrt n)
    layers; keep the n/k segment inputs and rebuild one segment of k layers at a time."""
    n = len(layers)
    if n == 0:
        return StageActivations(0.0, 0.0)
    k = math.ceil(math.sqrt(n))
    segments = [layers[i : i + k] for i in range(0, n, k)]
    stored = sum(seg[0].layer_input for seg in segments)
    return StageActivations(stored, max(sum(a.full for a in seg) for seg in segments))


def stage_activation_bytes_of(
    stage: StageActivations, in_flight: float, unrecomputed: float = 0.0, transient: float = 0.0
) -> float:
    """``stage_activation_bytes`` from a policy's stored and working bytes (its ``activations`` of the layers);
    ``transient`` bytes live only during a forward pass (the loss's logits), never beside the working set, which
    backward rebuilds."""
    return in_flight * stage.stored_per_microbatch + unrecomputed + max(stage.working, transient)
