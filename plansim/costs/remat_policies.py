"""Rematerialization policies (``Strategy.remat``): the one list of their names (``REMAT_POLICIES``), and what each
keeps and reruns.

Each entry says, once for both engines, what a transformer block keeps from its forward to its backward, what its
backward rebuilds first, and how a stage's stored and working activation bytes follow (``activations``). The
analytic engine sums these per stage; the lowering emits them task by task. What is particular to a policy is a field
of its entry (``reruns``, ``segments``: sqrt(N)'s replayed segments, ``scheduled``: a solver decides per stage), never
a test of its name. ``weight_grad_kept`` is what a split-backward schedule (ZB-H1) keeps from a B pass to its W pass.

Sources: full recompute keeps each block's input and reruns its forward, collectives included (Chen et al. 2016;
Korthikanti et al. 2022, Table 2 last row); selective recompute keeps all but the attention core and reruns only
that, which has no collective (Korthikanti et al. 2022, sec 5); sqrt(N) checkpoints every ceil(sqrt n)-th block
input and replays a segment before its last block's backward (Chen et al. 2016, sec 4.1); ``milp`` is scheduled per
stage by the Checkmate MILP (``plansim.remat.plan``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from plansim.costs.memory import (
    LayerActivations,
    StageActivations,
    full,
    none,
    selective,
    sqrt_segments,
    stage_activation_bytes_of,
)

__all__ = ["REMAT_POLICIES", "Recompute", "RematPolicy", "stage_activation_bytes", "weight_grad_kept"]


class Recompute(NamedTuple):
    """What a policy rebuilds per micro-batch: compute seconds, tensor-parallel collective seconds, matmul FLOPs."""

    compute_s: float
    tp_comm_s: float
    matmul_flops: float


@dataclass(frozen=True)
class RematPolicy:
    """One remat policy.

    ``reruns``: what a block's backward rebuilds first (``nothing``, the ``attention_core``, or the whole
    ``block_forward`` with its tensor-parallel collectives; ``per_schedule``: what the stage's schedule says, read
    from it, not from here). ``segments``: the rerun replays a segment of ceil(sqrt n) blocks before the backward of
    its last block, and only segment inputs are kept (sqrt(N)). ``scheduled``: a solver decides per stage what is
    kept (``milp``), so ``activations`` is None and ``stored`` does not apply.
    """

    name: str
    description: str
    reruns: Literal["nothing", "attention_core", "block_forward", "per_schedule"]
    activations: Callable[[Sequence[LayerActivations]], StageActivations] | None
    segments: bool = False
    scheduled: bool = False

    def stored(self, saved: float, selective_saved: float, layer_input: float, segment_start: bool) -> float:
        """Bytes a block keeps per micro-batch from its forward to its backward (not for ``scheduled`` policies)."""
        if self.scheduled:
            raise ValueError(f"remat={self.name} keeps what its stage's schedule says (plansim.remat.plan)")
        if self.reruns == "nothing":
            return saved
        if self.reruns == "attention_core":
            return saved - selective_saved
        if self.segments:
            return layer_input if segment_start else 0.0
        return layer_input

    def recompute(self, block: Recompute, attention_core: Recompute) -> Recompute:
        """What the backward rebuilds of a block (or a sum of blocks), from its forward (``block``) and its
        attention core (``attention_core``)."""
        if self.reruns == "block_forward":
            return block
        if self.reruns == "attention_core":
            return Recompute(attention_core.compute_s, 0.0, attention_core.matmul_flops)
        return Recompute(0.0, 0.0, 0.0)


REMAT_POLICIES: dict[str, RematPolicy] = {
    p.name: p
    for p in (
        RematPolicy("none", "keep every activation", "nothing", none),
        RematPolicy("full", "keep each block's input, rerun its forward", "block_forward", full),
        RematPolicy("selective", "rerun the attention core only", "attention_core", selective),
        RematPolicy("sqrt", "keep every ceil(sqrt n)-th block input", "block_forward", sqrt_segments, segments=True),
        RematPolicy("milp", "the Checkmate MILP's schedule per stage", "per_schedule", None, scheduled=True),
    )
}


def weight_grad_kept(saved: float, stored: float, wgrad_saved: float) -> float:
    """Bytes a layer keeps per micro-batch from its input-gradient pass (B) to its deferred weight-gradient pass (W)
    when the schedule splits backward (ZB-H1): its weight GEMMs' inputs (``wgrad_saved``), out of what it holds
    during B, what it stored from the forward and what its recompute rebuilt (``saved`` in all, or ``stored`` where
    that is more: a traced block may save less than the input it keeps). The rest goes after B. W computes each
    weight's gradient from the GEMM's input and its output's gradient (Qi et al. 2024, sec 2); the lowering keeps the
    input, as ``stored`` (``k/``) and rebuilt (``rk/``) parts, and frees it after W (``plansim.des.lower``).

    >>> weight_grad_kept(saved=34.0, stored=34.0, wgrad_saved=20.0)   # no remat: the weight GEMMs' inputs
    20.0
    >>> weight_grad_kept(saved=34.0, stored=2.0, wgrad_saved=20.0)    # full remat: B rebuilt them, W keeps them
    20.0
    """
    return min(max(saved, stored), wgrad_saved)


def stage_activation_bytes(
    remat: str, layers: Sequence[LayerActivations], in_flight: float, unrecomputed: float = 0.0
) -> float:
    """Peak activation bytes on a stage: ``in_flight`` micro-batches stored plus one working set.

    ``layers`` are the stage's recomputable layers (transformer blocks); ``unrecomputed`` is what the stage's other
    ops (embedding, output layer, loss) hold at the peak, all micro-batches in flight included: no policy recomputes
    them, and the schedule keeps a different number of them alive than of the blocks.

    >>> a = LayerActivations(full=34.0, selective=24.0, layer_input=2.0)
    >>> stage_activation_bytes("full", [a] * 4, in_flight=2)   # 2 micro-batches x 4 inputs + one layer rebuilt
    50.0
    """
    activations = REMAT_POLICIES[remat].activations
    if activations is None:
        raise ValueError(f"remat={remat} is scheduled per stage (plansim.remat.plan), not a closed form")
    return stage_activation_bytes_of(activations(layers), in_flight, unrecomputed)
