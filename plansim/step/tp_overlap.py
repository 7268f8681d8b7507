"""Which tensor-parallel collectives a framework runs beside the GEMMs next to them, and what that holds in memory.

The one reader of the framework rules ``tp_grad_input_overlap`` and ``tp_comm_overlap`` for pricing a step: both
engines' layer walk takes its ``TPOverlap`` (``tp_overlap``), the memory model its userbuffers
(``userbuffers_bytes``), and the analytic engine's layer cache keys on what it reads (``overlap_key``). Whether a
strategy may ask for the overlap at all is a check (``plansim.strategy.checks``).

Sources: the input gradient's reduction beside the weight-gradient GEMM is Megatron-LM's
``LinearWithGradAccumulationAndAsyncCommunication`` and Transformer Engine's "Overlap dgrad-RS/AR with wgrad";
Megatron-LM's ``--tp-comm-overlap`` pipelines a transformer block's GEMMs with their all-gather or reduce-scatter on
Transformer Engine's userbuffers (NVIDIA/TransformerEngine v2.9, ``module/base.py``: ``initialize_ub``, buffers in
bf16 by default, base.py:122-130; ring exchange and split reduce-scatter, base.py:302-348).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.costs.interference import interference_model
from plansim.hardware import Cluster
from plansim.strategy.frameworks import TPCommOverlap, load_framework
from plansim.strategy.schema import Strategy
from plansim.units import dtype_bytes

__all__ = [
    "TPOverlap",
    "comm_pipelining",
    "grad_input_beside_wgrad",
    "overlap_key",
    "tp_overlap",
    "userbuffers_bytes",
    "uses_userbuffers",
]


@dataclass(frozen=True)
class TPOverlap:
    """Which of a layer's tensor-parallel collectives run beside its GEMMs instead of between them (the strategy's
    framework rules and ``tp_comm_overlap``: ``tp_overlap``). Off by default: every collective blocks, but the
    sequence-parallel re-gather (``plansim.step.layers._regathered``).

    ``grad_input_beside_wgrad``: the collectives (``reduce_scatter`` with sequence parallelism, ``all_reduce``
    without) a column-parallel linear's backward launches asynchronously for its input gradient after the
    input-gradient GEMM, running the weight-gradient GEMM beside them (Transformer Engine's "Overlap dgrad-RS/AR with
    wgrad"; Megatron-LM's ``LinearWithGradAccumulationAndAsyncCommunication``). ``ring_exchange``: an all-gather
    feeding a GEMM (the column-parallel forward, the row-parallel backward's output-gradient gather) runs as tp
    point-to-point steps, the GEMM split into tp chunks each computed as its chunk arrives, this rank's own first.
    ``reduce_scatter_splits``:
    a row-parallel forward GEMM split into that many chunks, each chunk's reduce-scatter running beside the next
    chunk's GEMM (0: one blocking reduce-scatter after the whole GEMM)."""

    grad_input_beside_wgrad: frozenset[str] = frozenset()
    ring_exchange: bool = False
    reduce_scatter_splits: int = 0
    #: Transformer Engine's userbuffers move the blocks' overlapped collectives (``ring_exchange`` on the copy
    #: engines, the rest in SM kernels), and a GEMM beside one of its SM kernels runs ``gemm_slowdown`` times longer
    #: on the SMs they leave it (``set_sm_margin``)
    userbuffers: bool = False
    gemm_slowdown: float = 1.0
    #: the compute streams the split GEMMs' chunks take in turn (``TPCommOverlap.gemm_streams``): with more than one,
    #: a chunk's ramp-up and tail run beside its neighbours' work and the chunks together take the whole GEMM's time
    chunk_streams: int = 1


def grad_input_beside_wgrad(s: Strategy) -> frozenset[str]:
    """The input gradient's reductions ``s``'s framework runs beside the weight-gradient GEMM (its rule
    ``tp_grad_input_overlap``)."""
    return frozenset(load_framework(s.framework).rules.tp_grad_input_overlap.value)


def comm_pipelining(s: Strategy) -> TPCommOverlap | None:
    """How ``s``'s framework pipelines the blocks' GEMMs with their collectives (its rule ``tp_comm_overlap``) where
    ``s`` asks for it (``tp_comm_overlap``); None otherwise."""
    return load_framework(s.framework).rules.tp_comm_overlap.value if s.tp_comm_overlap else None


def tp_overlap(s: Strategy, cluster: Cluster) -> TPOverlap:
    """Which tensor-parallel collectives run beside the GEMMs next to them under ``s``'s framework on ``cluster``'s
    GPU: the input gradient's reductions (``grad_input_beside_wgrad``), and with ``tp_comm_overlap`` the
    framework's pipelining (``comm_pipelining``), a GEMM beside its SM kernels on the SMs they leave."""
    pipelined = comm_pipelining(s)
    if pipelined is None:
        return TPOverlap(grad_input_beside_wgrad=grad_input_beside_wgrad(s))
    return TPOverlap(
        grad_input_beside_wgrad=grad_input_beside_wgrad(s),
        ring_exchange=pipelined.ring_exchange,
        reduce_scatter_splits=pipelined.reduce_scatter_splits,
        userbuffers=True,
        # the SM-share part of the interference model: its kernels' SMs taken for the GEMM's whole run, no HBM load
        gemm_slowdown=interference_model(cluster.gpu).slowdown(pipelined.kernel_sms, 0.0),
        chunk_streams=pipelined.gemm_streams,
    )


def overlap_key(s: Strategy) -> tuple[object, ...]:
    """What ``tp_overlap`` reads of a strategy, for a cache key (``plansim.analytic.cache.LayerKey``): strategies equal
    here price their layers alike on one cluster. Without tensor parallelism there is no collective to overlap, so
    every framework's rules price alike (empty)."""
    if s.tp == 1:
        return ()
    return grad_input_beside_wgrad(s), comm_pipelining(s)


def uses_userbuffers(s: Strategy) -> bool:
    """Whether ``s`` registers Transformer Engine's userbuffers (``userbuffers_bytes`` reads the layer input's
    size only then)."""
    return comm_pipelining(s) is not None


def userbuffers_bytes(s: Strategy, layer_input_bytes: float) -> float:
    """Transformer Engine's userbuffers one rank registers outside PyTorch's allocator under ``s`` (0 without
    ``comm_pipelining``): the rule's ``buffers`` tensors, each one micro-batch's whole activation (sequence
    parallelism shards the layers' input, ``layer_input_bytes`` one rank's), in the buffers' dtype, bf16 by default
    (``initialize_ub``'s dtype, base.py:122-130 at v2.9)."""
    pipelined = comm_pipelining(s)
    if pipelined is None:
        return 0.0
    elements = layer_input_bytes / dtype_bytes(s.compute_dtype) * (s.tp if s.sequence_parallel else 1)
    return pipelined.buffers * elements * dtype_bytes("bf16")
