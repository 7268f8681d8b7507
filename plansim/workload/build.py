"""``build_sharded``: the op graph of one micro-batch on one rank of a ``Sharding``, for any model family (its entry's
builder, ``plansim.workload.families``); ``build_graph`` the same from keyword arguments."""

from __future__ import annotations

import dataclasses
import operator

import networkx as nx

from plansim.errors import PlansimError, quoted
from plansim.workload.families import family_of
from plansim.workload.graph import Sharding
from plansim.workload.spec import ModelSpec

__all__ = ["ATTENTION", "build_graph", "build_sharded"]


def _positive_int(name: str, value: object) -> int:
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        number = 0
    if isinstance(value, bool) or number < 1:
        raise PlansimError(f"{name}={value!r} must be a positive integer")
    return number


#: How attention runs (``Strategy.attention``): one fused kernel (FlashAttention-2), or Megatron-LM's unfused core.
ATTENTION = ("flash", "unfused")


def build_graph(
    spec: ModelSpec,
    micro_batch: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    act_bytes: int = 2,
    attention: str = "flash",
) -> nx.DiGraph:
    """The op graph of one micro-batch on one tensor-parallel rank: ``build_sharded`` of the ``Sharding`` the
    arguments make, checked.

    Parameters
    ----------
    spec : ModelSpec
        The model.
    micro_batch : int
        Sequences (images, for CNNs) per micro-batch.
    tp : int, default 1
        Tensor-parallel degree (Megatron-LM column/row split). Must divide ``heads`` and ``ffn_hidden``; CNNs
        accept only 1.
    sequence_parallel : bool, default False
        Split norms, dropouts and residual adds over the sequence (Korthikanti et al. 2022); no effect at tp=1.
    act_bytes : int, default 2
        Bytes per activation and weight element (2 for fp16/bf16); dropout masks are 1 byte regardless.
    attention : {"flash", "unfused"}, default "flash"
        Transformers' attention as one fused kernel keeping no ``s x s`` tensor (FlashAttention-2), or as QK^T,
        softmax, dropout and attention over V, each keeping what Korthikanti et al. 2022 count. Other families
        ignore it.

    Returns
    -------
    networkx.DiGraph
        Nodes in execution order with the attributes in ``plansim.workload.graph.NODE_ATTRIBUTES``; edges are
        data dependencies. ``graph.graph`` holds ``spec``, the ``Sharding``'s fields (``micro_batch``, ``tp``,
        ``sequence_parallel``, ``act_bytes``, ``attention``, ``tp_axis``), ``layer_input_bytes`` (one block's input
        on this rank; for CNNs the largest) and ``copies`` (layer -> the earlier layer stamped from the same block
        template, ``graph.stamp``).

    Raises
    ------
    PlansimError
        When ``tp`` does not split the model evenly, an argument is not a positive integer, or ``attention`` is
        neither ``flash`` nor ``unfused``.

    Examples
    --------
    >>> from plansim.workload import load_model
    >>> g = build_graph(load_model("gpt3-175b"), micro_batch=1, tp=8, sequence_parallel=True)
    >>> g.nodes["L0.attn_in"]["collective"], g.nodes["L0.attn_out"]["collective"]
    ('all_gather', 'reduce_scatter')
    >>> g.graph["layer_input_bytes"] == 2048 * 12288 * 2 // 8
    True
    """
    if attention not in ATTENTION:
        raise PlansimError(f"attention={quoted(attention)} is unknown: choose one of {', '.join(ATTENTION)}")
    sharding = Sharding(
        micro_batch=_positive_int("micro_batch", micro_batch),
        tp=_positive_int("tp", tp),
        sequence_parallel=bool(sequence_parallel),
        act_bytes=_positive_int("act_bytes", act_bytes),
        attention=attention,
    )
    return build_sharded(spec, sharding)


def build_sharded(spec: ModelSpec, sharding: Sharding) -> nx.DiGraph:
    """The op graph of one micro-batch on one rank of ``sharding`` (its fields as ``build_graph`` checks its arguments:
    positive integers, a known ``attention``; a strategy's are, ``plansim.step.prepare.sharding_of``), built by the
    model family's builder; ``graph.graph`` as ``build_graph`` says.

    >>> from plansim.workload import load_model
    >>> g = build_sharded(load_model("gpt3-125m"), Sharding(micro_batch=1, tp=2))
    >>> g.graph["tp"], g.graph["tp_axis"], g.nodes["L0.attn_in"]["group"]
    (2, 'tp', 'tp')
    """
    graph = nx.DiGraph(spec=spec, **dataclasses.asdict(sharding))
    graph.graph["layer_input_bytes"] = family_of(spec).build(graph, spec, sharding)
    return graph
