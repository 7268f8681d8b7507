"""Rematerialization policies (``Strategy.remat``): the one list of their names (``REMAT_POLICIES``), and what each
keeps and reruns.

Each entry says, once for both engines, what a transformer block keeps from its forward to its backward, what its
backward rebuilds first, and how a stage's stored and working activation bytes follow (``activations``). The
analytic engine sums these per stage; the lowering emits them task by task. What is particular to a policy is a field
of its entry (``reruns``, ``segments``: sqrt(N)'s replayed segments, ``scheduled``: a solver decides per stage), never
a test of its name. ``weight_grad_kept`` is what a split-backward schedule (ZB-H1) keeps from a B pass to its W pass.
Two of torchtitan's selective modes are entries of their own: ``op_sac`` reruns the ``unsaved_ops`` of a block, those
whose outputs its per-op policy does not keep (each op of the workload graph says what that policy keeps of its
output, ``sac_kept``, and how much of its forward it reruns, ``sac_rerun``: ``plansim.workload.transformer``);
``layer_sac`` checkpoints ``every`` second block of a rank whole and keeps the others' activations.

Sources: full recompute keeps each block's input and reruns its forward, collectives included (Chen et al. 2016;
Korthikanti et al. 2022, Table 2 last row); selective recompute keeps all but the attention core and reruns only
that, which has no collective (Korthikanti et al. 2022, sec 5); sqrt(N) checkpoints every ceil(sqrt n)-th block
input and replays a segment before its last block's backward (Chen et al. 2016, sec 4.1); ``milp`` is scheduled per
stage by the Checkmate MILP (``plansim.remat.plan``). torchtitan v0.2.2 (pytorch/torchtitan 73a0e697,
torchtitan/distributed/activation_checkpoint.py): ``op_sac`` is ``selective_ac_option = "op"`` (``_apply_op_sac``,
lines 52-137: a block under a checkpoint wrapper whose policy keeps the outputs of the ops in the model's save list,
every other ``aten.mm`` excepted, lines 108-122; Llama's list, torchtitan/models/llama3/infra/parallelize.py:36-51,
holds ``mm``, the fused attention kernels, ``reduce_scatter_tensor`` and ``max``) and reruns the rest of the block's
forward (``early_stop`` off by default, torchtitan/config/job_config.py:675); ``layer_sac`` is
``selective_ac_option = "2"``, its default (job_config.py:655): ``_apply_layer_sac`` (lines 27-49) wraps whole the
blocks whose running count on the rank is a multiple of 2 and leaves the others as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from plansim.costs.memory import (
    LAYER_SAC_EVERY,
    LayerActivations,
    StageActivations,
    every_nth,
    full,
    none,
    op_selective,
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


_NOTHING = Recompute(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class RematPolicy:
    """One remat policy.

    ``reruns``: what a block's backward rebuilds first (``nothing``, the ``attention_core``, the whole
    ``block_forward`` with its tensor-parallel collectives, or the ``unsaved_ops``: the forward of the ops whose
    outputs a per-op policy does not keep, with the collectives among them; ``per_schedule``: what the stage's
    schedule says, read from it, not from here). ``segments``: the rerun replays a segment of ceil(sqrt n) blocks
    before the backward of its last block, and only segment inputs are kept (sqrt(N)). ``every``: only every
    ``every``-th block of a pipeline rank (counted over its model chunks in order, from 1) is checkpointed; the others
    keep all they save (0: every block). ``scheduled``: a solver decides per stage what is kept (``milp``), so
    ``activations`` is None and ``stored`` does not apply.
    """

    name: str
    description: str
    reruns: Literal["nothing", "attention_core", "block_forward", "unsaved_ops", "per_schedule"]
    activations: Callable[[Sequence[LayerActivations]], StageActivations] | None
    segments: bool = False
    scheduled: bool = False
    every: int = 0

    def checkpoints(self, position: int) -> bool:
        """Whether the block at ``position`` (0-based, among a pipeline rank's blocks in the order it runs their
        forward) is checkpointed: every block, or with ``every`` the ``every``-th, ``2 * every``-th, ... of them.

        >>> [REMAT_POLICIES["layer_sac"].checkpoints(i) for i in range(4)], REMAT_POLICIES["full"].checkpoints(0)
        ([False, True, False, True], True)
        """
        return not self.every or (position + 1) % self.every == 0

    def stored(
        self, saved: float, selective_saved: float, layer_input: float, segment_start: bool, op_kept: float = 0.0
    ) -> float:
        """Bytes a checkpointed block keeps per micro-batch from its forward to its backward (not for ``scheduled``
        policies); ``op_kept``: the outputs a per-op policy keeps (``sac_kept`` of its ops)."""
        if self.scheduled:
            raise ValueError(f"remat={self.name} keeps what its stage's schedule says (plansim.remat.plan)")
        if self.reruns == "nothing":
            return saved
        if self.reruns == "attention_core":
            return saved - selective_saved
        if self.reruns == "unsaved_ops":
            return layer_input + op_kept
        if self.segments:
            return layer_input if segment_start else 0.0
        return layer_input

    def recompute(self, block: Recompute, attention_core: Recompute, unsaved: Recompute = _NOTHING) -> Recompute:
        """What the backward rebuilds of a checkpointed block (or a sum of them), from its forward (``block``), its
        attention core (``attention_core``) and the forward of its ops a per-op policy reruns (``unsaved``)."""
        if self.reruns == "block_forward":
            return block
        if self.reruns == "attention_core":  # its collectives: context parallelism's ring, rerun with the core
            return attention_core
        if self.reruns == "unsaved_ops":
            return unsaved
        return Recompute(0.0, 0.0, 0.0)


REMAT_POLICIES: dict[str, RematPolicy] = {
    p.name: p
    for p in (
        RematPolicy("none", "keep every activation", "nothing", none),
        RematPolicy("full", "keep each block's input, rerun its forward", "block_forward", full),
        RematPolicy("selective", "rerun the attention core only", "attention_core", selective),
        RematPolicy("sqrt", "keep every ceil(sqrt n)-th block input", "block_forward", sqrt_segments, segments=True),
        RematPolicy("milp", "the Checkmate MILP's schedule per stage", "per_schedule", None, scheduled=True),
        # torchtitan's selective_ac_option = "op" (torchtitan/distributed/activation_checkpoint.py:52-137, v0.2.2)
        RematPolicy("op_sac", "keep the outputs torchtitan's per-op policy saves", "unsaved_ops", op_selective),
        # torchtitan's selective_ac_option = "2" (activation_checkpoint.py:27-49; job_config.py:655, its default)
        RematPolicy("layer_sac", "checkpoint every 2nd block whole", "block_forward", every_nth, every=LAYER_SAC_EVERY),
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
