"""The op-graph vocabulary: node attributes, op constructors, block stamping and graph totals.

A workload graph (see ``build_graph``) is a ``networkx.DiGraph`` with one node per op of ONE micro-batch on ONE
tensor-parallel rank, inserted in execution order, edges for data dependencies. Every node carries
``NODE_ATTRIBUTES``; nodes of kind ``collective`` also carry ``COLLECTIVE_ATTRIBUTES``:

``kind``
    one of ``KINDS``.
``flops``, ``bwd_flops``
    forward and backward FLOPs on this rank (a GEMM is ``2mnk``; backward is twice forward for matmul-like
    kinds, twice for norms and softmax, once for the other kinds; collectives have none). A fused attention
    kernel (``attention``) counts its two matmuls over every score, as the unfused pair would, and 2.5 times that
    in backward, which recomputes QK^T (FlashAttention-2, Dao 2023, sec 3.1.2 and 4.1: five matmuls to the
    forward's two); what a causal mask leaves of them is the ``causal`` attribute's business.
``bytes``
    bytes read plus written by the forward op on this rank (activations and weights at ``act_bytes`` per element,
    dropout masks 1 byte). Collectives have ``bytes = 0``: their cost is ``comm_bytes``.
``saved_bytes``
    bytes kept for the backward pass (Korthikanti et al. 2022, sec 4.1 accounting; see ``transformer``).
``params``
    parameters held by the op on this rank (a replicated parameter counts on every rank).
``layer``
    block index ``0..layers-1``; ``-1`` for the input embedding (CNN: the stem); ``layers`` for the final norm,
    output head and loss.
``selective_recompute``
    True for the ops Korthikanti et al. 2022 (sec 5) recompute under selective recompute: QK^T, softmax,
    softmax dropout and attention over V, or the fused attention kernel that replaces them (Megatron-LM checkpoints
    its core attention, whichever kernel runs it).
``causal`` (optional, False when absent)
    True for the attention core's matmuls under a causal mask (the fused kernel, or QK^T and attention over V):
    only the scores on and below the diagonal count (``CAUSAL_SHARE``); ``model_flops`` counts that share, and a
    fused kernel also executes only that share (``plansim.costs.kernels.executed_share``).
``workspace_bytes`` (optional, 0 when absent)
    bytes a fused kernel allocates for the length of its backward only (FlashAttention-2's fp32 accumulators).
``sac_kept``, ``sac_rerun`` (optional, 0 and 1 when absent)
    under a per-op remat policy (torchtitan's ``op`` selective checkpointing, ``remat: op_sac``): the bytes of the
    op's output the policy keeps from forward to backward, and the share of its forward (a collective: 1 or 0) that
    the block's recompute runs again (``op_saved``). Absent, the op's output is not kept and its forward reruns.
``expert`` (optional, False when absent)
    True for an op whose params are routed-expert weights: sharded over ``ep`` (``Sharding.ep``), their gradients
    reduced over the expert-data-parallel group, not the data-parallel one (``plansim.workload.moe``).
``grouped`` (optional, 1 when absent)
    a grouped GEMM: the op runs that many equal GEMMs, one per local expert, each ``1/grouped`` of its FLOPs and
    bytes; the kernel model prices one at its own size, times ``grouped`` (``plansim.costs.kernels``).
``fp8`` (optional, False when absent)
    True for a transformer block's linear layer (QKV, attention output, the MLP's GEMMs) under ``dtype: fp8``: its
    forward and backward GEMMs run in FP8 with their casts (``plansim.costs.kernels``), its saved input in FP8.
``collective``, ``bwd_collective``, ``group``, ``comm_bytes``
    forward and backward collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all`` or
    ``none``), the process group: the mesh axis whose groups shard the tensor (``Sharding.tp_axis``, ``cp_axis``,
    ``ep_axis``, ``etp_axis``; a name of ``plansim.strategy.mesh.AXIS_ORDER``), and the size in bytes of the full,
    unsharded tensor communicated (an all-to-all: each rank's whole send buffer).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

__all__ = [
    "CAUSAL_SHARE",
    "COLLECTIVE_ATTRIBUTES",
    "IN",
    "KINDS",
    "MATMUL_KINDS",
    "NODE_ATTRIBUTES",
    "PREV",
    "Node",
    "Sharding",
    "causal_share",
    "collective",
    "gemm",
    "graph_totals",
    "layer_nodes",
    "model_flops",
    "op",
    "op_saved",
    "pointwise",
    "stamp",
]

KINDS = frozenset(
    {
        "matmul", "bmm", "conv", "attention", "elementwise", "norm", "softmax", "dropout", "embedding", "loss", "pool",
        "collective",
    }
)  # fmt: skip
#: Kinds that run on tensor cores and count as model FLOPs (Narayanan et al. 2021, sec 5.1); ``attention`` is a
#: fused causal attention kernel (FlashAttention-2: QK^T, softmax, dropout and attention over V in one kernel).
MATMUL_KINDS = frozenset({"matmul", "bmm", "conv", "attention"})
NODE_ATTRIBUTES = ("kind", "flops", "bwd_flops", "bytes", "saved_bytes", "params", "layer", "selective_recompute")
COLLECTIVE_ATTRIBUTES = ("collective", "bwd_collective", "group", "comm_bytes")
#: The share of the scores a causal mask keeps: those on and below the diagonal, about half (Megatron-LM's
#: ``num_floating_point_operations``: "causal mask (only half of the mask is non-zero)", NVIDIA/Megatron-LM
#: d98e8a64, megatron/training/training.py:1163-1169; FlashAttention-2, Dao 2023, sec 4.1: "with causal mask, divide
#: this number by 2").
CAUSAL_SHARE = 0.5
COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "none"})
_TOTAL_KEYS = ("flops", "bwd_flops", "bytes", "saved_bytes", "params")

# Backward FLOPs over forward FLOPs: GEMM-like ops compute input and weight gradients (2x); norms and softmax
# re-derive their statistics (about 2x); pointwise ops, lookups, pools and the loss about 1x.
_BWD_RATIO = {"matmul": 2, "bmm": 2, "conv": 2, "norm": 2, "softmax": 2}

Attrs = dict[str, Any]


def op(
    kind: str,
    *,
    flops: int = 0,
    nbytes: int = 0,
    saved: int = 0,
    params: int = 0,
    selective: bool = False,
    bwd_flops: int | None = None,
    workspace: int = 0,
) -> Attrs:
    """Attributes of one op (all of ``NODE_ATTRIBUTES`` but ``layer``, which ``stamp`` adds; ``workspace_bytes``
    only where ``workspace`` is given).

    >>> op("softmax", flops=10)["bwd_flops"]
    20
    """
    if kind not in KINDS:
        raise ValueError(f"unknown op kind {kind!r}")
    bwd = flops * _BWD_RATIO.get(kind, 1) if bwd_flops is None else bwd_flops
    attrs = {
        "kind": kind,
        "flops": flops,
        "bwd_flops": bwd,
        "bytes": nbytes,
        "saved_bytes": saved,
        "params": params,
        "selective_recompute": selective,
    }
    if workspace:
        attrs["workspace_bytes"] = workspace
    return attrs


def gemm(m: int, n: int, k: int, act_bytes: int, *, bias: int = 0, saved: int = 0, params: int | None = None) -> Attrs:
    """A matmul ``[m, k] @ [k, n]`` (+ a bias of ``bias`` elements): ``2mnk`` FLOPs, bias adds not counted.

    ``params`` defaults to ``k * n + bias``; pass 0 for a weight owned by another op (a tied output head).

    >>> a = gemm(4, 3, 2, 2, bias=3)
    >>> a["flops"], a["bwd_flops"], a["bytes"], a["params"]
    (48, 96, 58, 9)
    """
    weights = k * n + bias
    return op(
        "matmul",
        flops=2 * m * n * k,
        nbytes=act_bytes * (m * k + weights + m * n),
        saved=saved,
        params=weights if params is None else params,
    )


def pointwise(
    kind: str,
    elements: int,
    flops_per_element: int,
    act_bytes: int,
    *,
    reads: int = 1,
    extra_bytes: int = 0,
    saved: int = 0,
    params: int = 0,
    selective: bool = False,
) -> Attrs:
    """A memory-bound op over ``elements`` output elements that reads ``reads`` tensors of that size.

    ``extra_bytes`` adds traffic not of activation size (weights, a dropout mask, pool indices).

    >>> pointwise("elementwise", 100, 1, 2, reads=2)["bytes"]
    600
    """
    return op(
        kind,
        flops=flops_per_element * elements,
        nbytes=act_bytes * (reads + 1) * elements + extra_bytes,
        saved=saved,
        params=params,
        selective=selective,
    )


def op_saved(attrs: Attrs, kept: int, rerun: float = 0.0) -> Attrs:
    """``attrs`` of an op whose output a per-op remat policy keeps (``kept`` bytes of it) and of whose forward its
    recompute reruns the share ``rerun`` (an op fusing several: the share of those whose outputs it does not keep).

    >>> op_saved(gemm(4, 3, 2, 2), kept=24)["sac_rerun"]
    0.0
    """
    if not 0.0 <= rerun <= 1.0 or kept < 0:
        raise ValueError(f"op_saved: kept={kept} bytes and rerun={rerun} (a share in 0..1)")
    return {**attrs, "sac_kept": kept, "sac_rerun": rerun}


def collective(forward: str, backward: str, comm_bytes: int, group: str) -> Attrs:
    """A communication op among the ranks of a ``group`` (the mesh axis that shards the tensor,
    ``Sharding.tp_axis``); ``comm_bytes`` is the full, unsharded tensor size.

    >>> collective("all_reduce", "none", 64, "tp")["bwd_collective"]
    'none'
    """
    if forward not in COLLECTIVES or backward not in COLLECTIVES:
        raise ValueError(f"unknown collective {forward!r} / {backward!r}")
    attrs = op("collective")
    attrs.update(collective=forward, bwd_collective=backward, group=group, comm_bytes=comm_bytes)
    return attrs


@dataclass(frozen=True)
class Sharding:
    """What one rank runs: micro-batch size, tensor-parallel degree, sequence parallel, bytes per activation, and
    how attention runs (``flash``: one fused kernel; ``unfused``: QK^T, softmax, dropout, attention over V).

    ``tp_axis`` names the mesh axis (``plansim.strategy.mesh.AXIS_ORDER``) whose groups split the tensor-parallel
    dimension (heads, feed-forward columns, vocabulary) ``tp`` ways: the group its collectives run over. A new kind of
    sharding (context, expert) is a degree and an axis of its own here, its ops' collectives naming that axis."""

    micro_batch: int
    tp: int = 1
    sequence_parallel: bool = False
    act_bytes: int = 2
    attention: str = "flash"
    tp_axis: str = "tp"
    #: context parallelism: each sequence split ``cp`` ways over the ranks of ``cp_axis``, attention run by
    #: ``cp_algorithm`` (``ring``: keys and values passed around the group; ``all_to_all``: heads and sequence swapped)
    cp: int = 1
    cp_axis: str = "cp"
    cp_algorithm: str = "ring"
    #: the transformer blocks' linear layers run in FP8 (``dtype: fp8``): their GEMM ops carry ``fp8`` and keep their
    #: input for backward in FP8 (``plansim.workload.transformer.Dims.Ein``)
    fp8_linears: bool = False
    #: expert parallelism (mixture-of-experts models only): the routed experts split ``ep`` ways over the ranks of
    #: ``ep_axis`` (each holds ``experts / ep``), the tokens dispatched to them and combined back by all-to-alls on that
    #: group; ``etp``: tensor parallelism inside each expert, its FFN width split ``etp`` ways over ``etp_axis``
    #: (Megatron-LM's expert tensor parallelism, ``--expert-tensor-parallel-size``), both the mesh's expert axes
    #: (``plansim.strategy.mesh.EXPERT_AXES``: one stage's ranks regrouped); a model without experts reads neither
    ep: int = 1
    ep_axis: str = "ep"
    etp: int = 1
    etp_axis: str = "etp"

    @property
    def seq_shards(self) -> int:
        """How many ways sequence parallelism splits the residual stream (``tp`` when on, else 1)."""
        return self.tp if self.sequence_parallel else 1


#: In ``Node.inputs``: the block's input (the previous block's output node).
IN = "<in>"
#: In ``Node.inputs``: the node listed just before this one (the default when ``inputs`` is empty).
PREV = "<prev>"


@dataclass(frozen=True)
class Node:
    """One op of a block template: its name within the block, attributes, and producers (names, ``IN``, ``PREV``)."""

    name: str
    attrs: Attrs
    inputs: tuple[str, ...] = ()


def stamp(graph: nx.DiGraph, block: Sequence[Node], layer: int, prefix: str, source: str | None) -> str:
    """Add a block template's ops to ``graph`` as ``prefix + name`` at ``layer``; return the last op's id.

    ``source`` is the node feeding the block (``None`` for the first block of a graph).

    >>> g = nx.DiGraph()
    >>> block = [Node("a", op("elementwise")), Node("b", op("elementwise"), (PREV, IN))]
    >>> stamp(g, block, 0, "L0.", None), stamp(g, block, 1, "L1.", "L0.b")
    ('L0.b', 'L1.b')
    >>> sorted(g.edges)
    [('L0.a', 'L0.b'), ('L0.b', 'L1.a'), ('L0.b', 'L1.b'), ('L1.a', 'L1.b')]
    """
    _note_copy(graph, block, layer)
    prev = source
    nodes, edges = [], []  # added in bulk, in the order the ops and their inputs come (a graph of a model is large)
    for node in block:
        nid = prefix + node.name
        nodes.append((nid, {**node.attrs, "layer": layer}))
        for src in node.inputs or (PREV,):
            producer = prev if src == PREV else source if src == IN else prefix + src
            if producer is not None:
                edges.append((producer, nid))
        prev = nid
    if prev is None:
        raise ValueError("empty block")
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)
    return prev


def _note_copy(graph: nx.DiGraph, block: Sequence[Node], layer: int) -> None:
    """Record in ``graph.graph["copies"]`` (layer -> earlier layer) that ``layer`` holds the same ops, in the same
    order, as the first layer stamped from this very ``block`` list, so that per-layer work is walked once per
    template (``plansim.step.layers``). One stamp per layer keeps that true."""
    meta = graph.graph
    firsts: dict[int, tuple[Sequence[Node], int]] = meta.setdefault("_templates", {})  # id(block) -> (block, layer)
    stamped: set[int] = meta.setdefault("_stamped_layers", set())
    if layer in stamped:
        raise ValueError(f"layer {layer} stamped twice")
    stamped.add(layer)
    first = firsts.setdefault(id(block), (block, layer))  # the block is kept, so its id is not reused
    if first[1] != layer:
        meta.setdefault("copies", {})[layer] = first[1]


def layer_nodes(graph: nx.DiGraph, layer: int) -> list[str]:
    """Ids of the ops at ``layer``, in execution order.

    Parameters
    ----------
    graph : networkx.DiGraph
        A workload graph from ``build_graph``.
    layer : int
        ``-1`` (embedding), ``0..layers-1`` (blocks) or ``layers`` (final norm, output head, loss).

    Examples
    --------
    >>> from plansim.workload import build_graph, load_model
    >>> layer_nodes(build_graph(load_model("gpt3-125m"), 1), -1)
    ['in.embed', 'in.pos', 'in.drop']
    """
    return [n for n, at in graph.nodes(data="layer") if at == layer]


def causal_share(op: Mapping[str, Any]) -> float:
    """The share of an op's FLOPs its causal mask keeps (``CAUSAL_SHARE`` for the attention core under one, else 1).

    >>> causal_share({"kind": "attention", "causal": True}), causal_share({"kind": "matmul"})
    (0.5, 1.0)
    """
    return CAUSAL_SHARE if op.get("causal", False) else 1.0


def mean_share(op: Mapping[str, Any]) -> float:
    """The share of an op's FLOPs a rank of the mean load runs: an expert GEMM of the busiest expert-parallel rank
    under routing imbalance carries ``mean_share`` = mean rows / its rows (``plansim.workload.moe.Routing``), so the
    model FLOPs MFU divides by stay the balanced model's; 1 for every other op.

    >>> mean_share({"kind": "matmul", "mean_share": 0.5}), mean_share({"kind": "matmul"})
    (0.5, 1.0)
    """
    return op.get("mean_share", 1.0)


def model_flops(graph: nx.DiGraph) -> float:
    """Model FLOPs of one micro-batch on this rank: 3x the forward FLOPs of the matmul-like ops, the attention
    core's over the scores a causal mask keeps (``causal_share``), an expert GEMM's at the mean load (``mean_share``).

    This is Megatron-LM's ``num_floating_point_operations`` (NVIDIA/Megatron-LM d98e8a64,
    megatron/training/training.py:1146-1169: forward plus a backward of twice the forward, GEMMs only, no
    recomputation, the core attention halved by the causal mask), which MFU divides by; Narayanan et al. 2021
    (sec 5.1) counted every score.

    Examples
    --------
    >>> from plansim.workload import build_graph, load_model
    >>> spec = load_model("gpt3-125m")
    >>> b, s, l, h, V = 1, spec.seq_len, spec.layers, spec.hidden, spec.vocab
    >>> model_flops(build_graph(spec, b)) == 72 * b * s * l * h * h + 6 * b * s * s * l * h + 6 * b * s * h * V
    True
    """
    return 3 * sum(
        data["flops"] * causal_share(data) * mean_share(data)
        for _, data in graph.nodes(data=True)
        if data["kind"] in MATMUL_KINDS
    )


def graph_totals(graph: nx.DiGraph, layers: Iterable[int] | None = None) -> dict[str, int]:
    """Sums of ``flops``, ``bwd_flops``, ``bytes``, ``saved_bytes`` and ``params`` over ops.

    Parameters
    ----------
    graph : networkx.DiGraph
        A workload graph from ``build_graph``.
    layers : iterable of int, optional
        Only sum ops whose ``layer`` is in this set (default: every op).

    Examples
    --------
    >>> from plansim.workload import build_graph, load_model
    >>> spec = load_model("llama2-7b")
    >>> graph_totals(build_graph(spec, 1))["params"] == spec.num_parameters()
    True
    """
    wanted = None if layers is None else set(layers)
    totals = dict.fromkeys(_TOTAL_KEYS, 0)
    for _, data in graph.nodes(data=True):
        if wanted is None or data["layer"] in wanted:
            for key in _TOTAL_KEYS:
                totals[key] += data[key]
    return totals
