"""Per-layer costs of a workload graph on one rank: compute and tensor-parallel communication times, FLOPs,
parameters and saved activations. Both engines read a layer's costs from here (one truth per cost)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx

from plansim.costs.kernels import KernelCostModel
from plansim.costs.memory import LayerActivations
from plansim.workload.graph import MATMUL_KINDS

__all__ = ["CommPricer", "LayerCost", "layer_activations", "layer_costs", "weight_gradient_s"]

#: (collective name, message bytes) -> (seconds, bytes this rank sends)
CommPricer = Callable[[str, float], tuple[float, float]]


@dataclass(frozen=True)
class LayerCost:
    """One layer, one micro-batch, one rank.

    Times in seconds: ``fwd_s``/``bwd_s`` compute; ``bwd_weight_s`` the part of ``bwd_s`` that computes weight
    gradients (the weight-gradient kernel of each GEMM-like op with parameters), which schedules that split the
    backward (ZB-H1) run as a separate pass; ``tp_fwd_s``/``tp_bwd_s`` tensor-parallel collectives (blocking in
    Megatron-LM, so on the critical path); ``selective_fwd_s`` the forward time of the ops that selective recompute
    rebuilds. ``tp_fwd_bytes``/``tp_bwd_bytes`` bytes this rank sends in those collectives. FLOPs count GEMM-like
    kinds only, the convention of model FLOPs (Narayanan et al. 2021, sec 5.1).
    """

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    bwd_weight_s: float = 0.0
    selective_fwd_s: float = 0.0
    tp_fwd_s: float = 0.0
    tp_bwd_s: float = 0.0
    tp_fwd_bytes: float = 0.0
    tp_bwd_bytes: float = 0.0
    fwd_matmul_flops: float = 0.0
    selective_matmul_flops: float = 0.0
    params: float = 0.0
    saved_bytes: float = 0.0
    selective_saved_bytes: float = 0.0


def weight_gradient_s(op: Mapping[str, Any], kernels: KernelCostModel) -> float:
    """The weight-gradient part of an op's backward time: ``KernelCostModel.backward`` prices a GEMM-like op's
    backward as two kernels of ``bwd_flops / 2``, input gradient and weight gradient; ops with parameters run the
    latter. Everything else in ``kernels.backward(op)`` is input gradient.

    Left in the input-gradient part: a tied output head's weight gradient (its weight is counted once, at the
    embedding, so ``params`` is 0 there).
    """
    if op["kind"] in MATMUL_KINDS and op["params"] > 0:
        return kernels.kernel_time(op["kind"], op["bwd_flops"] / 2, op["bytes"])
    return 0.0


def _add_op(acc: dict[str, float], op: Mapping[str, Any], kernels: KernelCostModel, tp_comm: CommPricer) -> None:
    if op["kind"] == "collective":
        for phase, name in (("fwd", op["collective"]), ("bwd", op["bwd_collective"])):
            if name != "none":
                seconds, sent = tp_comm(name, op["comm_bytes"])
                acc[f"tp_{phase}_s"] += seconds
                acc[f"tp_{phase}_bytes"] += sent
        return
    fwd = kernels.forward(op)
    acc["fwd_s"] += fwd
    acc["bwd_s"] += kernels.backward(op)
    acc["bwd_weight_s"] += weight_gradient_s(op, kernels)
    acc["params"] += op["params"]
    acc["saved_bytes"] += op["saved_bytes"]
    matmul_flops = op["flops"] if op["kind"] in MATMUL_KINDS else 0.0
    acc["fwd_matmul_flops"] += matmul_flops
    if op["selective_recompute"]:
        acc["selective_fwd_s"] += fwd
        acc["selective_matmul_flops"] += matmul_flops
        acc["selective_saved_bytes"] += op["saved_bytes"]


def layer_costs(graph: nx.DiGraph, kernels: KernelCostModel, tp_comm: CommPricer) -> dict[int, LayerCost]:
    """Costs per layer index (-1 embedding, 0..L-1 blocks, L output layer) of ``graph``.

    ``tp_comm(collective, message_bytes)`` prices one tensor-parallel collective; ops of kind ``collective`` name
    their forward and backward collectives (``none`` for no communication in that direction).
    """
    sums: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for _, op in graph.nodes(data=True):
        _add_op(sums[op["layer"]], op, kernels, tp_comm)
    return {layer: LayerCost(**acc) for layer, acc in sums.items()}


def layer_activations(cost: LayerCost, layer_input_bytes: float) -> LayerActivations:
    """The saved-activation view of a layer's costs, for the memory model."""
    return LayerActivations(
        full=cost.saved_bytes, selective=cost.saved_bytes - cost.selective_saved_bytes, layer_input=layer_input_bytes
    )
