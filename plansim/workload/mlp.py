"""A residual MLP: ``layers`` blocks ``x + fc2(gelu(fc1(x)))`` of width ``hidden`` and inner width ``ffn_hidden``,
then a classifier over ``vocab`` classes and a cross-entropy loss.

``seq_len`` rows (tokens or samples) per sequence, ``micro_batch`` sequences. Under tensor parallelism each block
is a Megatron column/row pair (fc1 column-parallel, fc2 row-parallel, Shoeybi et al. 2019, sec 3) and the
classifier is vocab-parallel; sequence parallelism splits the residual stream's rows.

Saved activations per block on a rank (``E`` bytes per element, ``d = t`` under sequence parallelism else 1):
fc1 input ``E*rows*h/d``, GELU input ``E*rows*f/t``, fc2 input ``E*rows*f/t``.
"""

from __future__ import annotations

import networkx as nx

from plansim.workload.graph import IN, PREV, Node, Sharding, gemm, pointwise, stamp
from plansim.workload.shape import ModelShape
from plansim.workload.transformer import (
    GELU_FLOPS,
    Dims,
    dims,
    head_nodes,
    residual_add,
    tp_enter,
    tp_exit,
)

__all__ = ["add_mlp", "mlp_block", "mlp_parameters"]


def mlp_block(d: Dims) -> list[Node]:
    """One residual block: fc1 (column-parallel), GELU, fc2 (row-parallel), add; biases on both GEMMs."""
    E, inner = d.E, d.rows * d.f_l
    return [
        *tp_enter(d, "mlp_in"),
        Node("fc1", gemm(d.rows, d.f_l, d.h, E, bias=d.f_l, saved=E * d.x)),
        Node("gelu", pointwise("elementwise", inner, GELU_FLOPS, E, saved=E * inner)),
        Node("fc2", gemm(d.rows, d.h, d.f_l, E, bias=d.h, saved=E * inner)),
        *tp_exit(d, "mlp_out"),
        Node("res", residual_add(d), (PREV, IN)),
    ]


def add_mlp(graph: nx.DiGraph, spec: ModelShape, sh: Sharding) -> int:
    """Add an MLP model's ops to ``graph``; return the bytes of one block's input on this rank."""
    d = dims(spec, sh, shard_tokens=True)
    block = mlp_block(d)
    last: str | None = None
    for layer in range(spec.layers):
        last = stamp(graph, block, layer, f"L{layer}.", last)
    stamp(graph, head_nodes(d, None, tied=False, bias=True), spec.layers, "out.", last)
    return d.E * d.x


def mlp_parameters(spec: ModelShape) -> int:
    """Total trainable parameters: ``l(2hf + f + h) + hV + V`` (both GEMMs with biases, the classifier with its)."""
    h, f = spec.hidden, spec.ffn_hidden
    return spec.layers * (2 * h * f + f + h) + h * spec.vocab + spec.vocab
