"""What a stage's data-parallel group issues in one training step, defined once for both engines.

``data_parallel_plan`` says, for a strategy's ZeRO stage, which collective reduces the gradients and how often, when
weights are all-gathered, with which algorithm and at which message size per parameter. The lowering issues those
collectives task by task (gradient buckets, per-layer ZeRO-3 gathers with their prefetch); the analytic engine prices
the same collectives in closed form (``plansim.analytic._dp_comm``).

Sources: PyTorch DDP buckets gradients and all-reduces each bucket once backward has produced it (Li et al. 2020,
VLDB, sec 3.2.3); ZeRO (Rajbhandari et al. 2020, sec 5 and 7): stage 1 reduce-scatters the gradients once per step
and all-gathers the updated weights after the optimizer step; stage 2 also shards gradients, so it reduce-scatters
every micro-batch's; stage 3 also shards the weights, gathering each layer's before its forward and again before its
backward and reduce-scattering each layer's gradients as backward produces them (PyTorch FSDP does the same per
wrapped unit, Zhao et al. 2023, sec 3).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.costs.collectives import algorithm_entry
from plansim.costs.optimizer import grad_bytes_per_param
from plansim.hardware import Cluster
from plansim.mesh import mesh_of
from plansim.step.prepare import shard_algorithm, tied_copy_params
from plansim.strategy import Strategy
from plansim.units import dtype_bytes
from plansim.workload.traced import Workload

__all__ = ["DataParallelPlan", "GroupCollective", "data_parallel_plan", "tied_gradient_bytes"]


@dataclass(frozen=True)
class GroupCollective:
    """One kind of collective over the ``dp`` group: its name and algorithm (keys of ``COLLECTIVES``), and the
    node-local group size for algorithms whose entry ``reads_local`` (else None)."""

    collective: str
    algorithm: str
    local: int | None = None


@dataclass(frozen=True)
class DataParallelPlan:
    """The data-parallel and ZeRO traffic of one step (``dp`` > 1).

    ``reduce``: the gradient reduction (an all-reduce, or under ZeRO >= 1 a reduce-scatter), issued once per step of
    the accumulated gradients, or every micro-batch where gradients are sharded (``reduce_every_microbatch``);
    ``gather``: the weights' all-gather (ZeRO >= 1), after the optimizer step (``gather_after_step``: ZeRO-1/2) or,
    with ``per_layer`` (ZeRO-3), before each layer's forward and backward, gradients then reduced per layer rather
    than in buckets. ``grad_bytes``/``weight_bytes``: bytes per parameter of a gradient and of a gathered weight.
    ``bucket_bytes`` and ``overlap``: gradient buckets launched as backward fills them (else one reduction after
    backward)."""

    dp: int
    reduce: GroupCollective
    gather: GroupCollective
    reduce_every_microbatch: bool
    per_layer: bool
    gather_after_step: bool
    grad_bytes: int
    weight_bytes: int
    bucket_bytes: float
    overlap: bool


def _on_dp(cluster: Cluster, s: Strategy, collective: str, algorithm: str) -> GroupCollective:
    local = None
    if algorithm_entry(collective, algorithm).reads_local:
        local = mesh_of(s).local_size("dp", cluster.gpus_per_node)
    return GroupCollective(collective, algorithm, local)


def data_parallel_plan(cluster: Cluster, s: Strategy) -> DataParallelPlan | None:
    """The data-parallel traffic of ``s`` (resolved) on ``cluster``; None without data parallelism."""
    dp = s.dp or 1
    if dp <= 1:
        return None
    sharded = shard_algorithm(s)
    if s.zero == 0:
        reduce = _on_dp(cluster, s, "all_reduce", s.dp_algorithm)
    else:
        reduce = _on_dp(cluster, s, "reduce_scatter", sharded)
    return DataParallelPlan(
        dp=dp,
        reduce=reduce,
        gather=_on_dp(cluster, s, "all_gather", sharded),
        reduce_every_microbatch=s.zero >= 2,
        per_layer=s.zero >= 3,
        gather_after_step=s.zero in (1, 2),
        grad_bytes=grad_bytes_per_param(s),
        weight_bytes=dtype_bytes(s.compute_dtype),
        bucket_bytes=s.grad_bucket_bytes,
        overlap=s.overlap_grad_reduce,
    )


def tied_gradient_bytes(model: Workload, s: Strategy) -> float:
    """Bytes of the tied embeddings' gradient that the first and last pipeline stage all-reduce between their two
    copies after backward, before the optimizer step (Megatron-LM, ``_allreduce_word_embedding_grads``); 0 without
    a second copy."""
    return tied_copy_params(model, s) * grad_bytes_per_param(s)
