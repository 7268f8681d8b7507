"""The remat graph of a pipeline stage's transformer blocks, built from the workload op graph (one micro-batch, one
tensor-parallel rank), at op or layer granularity.

A node stands for an op together with the tensors its backward reads, as plansim's op graphs account them
(``saved_bytes``, Korthikanti et al. 2022, sec 4.1): its memory is those bytes, its cost the op's forward time
(kernels from ``KernelCostModel``, tensor-parallel collectives priced like the analytic engine), and recomputing it
needs its producers in memory. An op that saves nothing (QK^T, a tensor-parallel collective, a residual add) is
merged into its first consumer, so rebuilding the softmax output also reruns QK^T, and the residual stream kept
between a block's halves is the next norm's saved input. Each
forward node gets a gradient node costing the op's backward (weight and input gradients, backward collectives); it
reads the node and its users' gradients. Gradients occupy no bytes here: as in the analytic memory model, the
transient gradient buffers are part of the profile's workspace reserve. So keeping every node reproduces the
analytic engine's activations for ``none`` exactly, and ``selective`` its recompute time for GPT blocks (Llama's
attention-over-V saves nothing, so it merges into the out-projection, whose input is kept: selective reruns QK^T
and softmax only). ``full`` reruns a block but its first norm, whose node stands for the block input it saves
(and the zero-byte residual add merged into it): 1-2 % less than Megatron's whole-block rerun, which the analytic
engine's ``full`` prices, without tensor parallelism; at tp=8 6 % (GPT) and 19 % (Llama, whose MLP all-reduce merges
into the next block's first norm) (measured on GPT-3 1.3B and Llama-2 7B blocks, micro-batches 1-8).

Layer granularity (``granularity="layer"``) contracts the op-granularity graph to four nodes per block
(``coarsen.layer_parts``): its first op (which saves the block's input), the ops before the attention core, the
core (selective recompute's ops), and the rest. The MILP is
then small enough for a planner's inner loop and can still express none, full and selective.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Literal

import networkx as nx

from plansim.costs.kernels import KernelCostModel, executed_share
from plansim.errors import PlansimError
from plansim.remat.coarsen import contract, layer_parts
from plansim.remat.graph import RematGraph, RematNode, training_graph
from plansim.step.layers import CommPricer, forward_bytes
from plansim.workload.graph import MATMUL_KINDS

__all__ = ["GRANULARITIES", "stage_graph"]

GRANULARITIES = ("op", "layer")


def _op_times(op: dict, kernels: KernelCostModel, comm: CommPricer) -> tuple[float, float, float]:
    """(forward s, backward s, forward communication s) of one op."""
    if op["kind"] == "collective":
        axis, n_bytes = op["group"], op["comm_bytes"]
        fwd = comm(axis, op["collective"], forward_bytes(op))[0] if op["collective"] != "none" else 0.0
        bwd = comm(axis, op["bwd_collective"], n_bytes)[0] if op["bwd_collective"] != "none" else 0.0
        return fwd, bwd, fwd
    return kernels.forward(op), kernels.backward(op), 0.0


def _merged_groups(graph: nx.DiGraph, ops: Sequence[str]) -> dict[str, str]:
    """Op -> the op it is merged into: itself, or, for an op that saves nothing, its first consumer's. That consumer
    saves the op's output when anything does (a residual add's output is the next norm's saved input), so the merged
    node's bytes are the tensor that is kept, and later consumers read it there."""
    position = {v: i for i, v in enumerate(ops)}
    group: dict[str, str] = {}
    for v in reversed(ops):
        users = sorted((u for u in graph.successors(v) if u in position), key=position.__getitem__)
        group[v] = group[users[0]] if graph.nodes[v]["saved_bytes"] == 0 and users else v
    return group


def stage_graph(
    graph: nx.DiGraph,
    layers: Sequence[int],
    kernels: KernelCostModel,
    comm: CommPricer,
    *,
    granularity: Literal["op", "layer"] = "op",
    name: str = "stage",
) -> RematGraph:
    """The training graph (forward, then backward) of ``layers`` of a workload op graph.

    >>> from plansim.api import load_hardware, load_model
    >>> from plansim.step.prepare import prepare_step, comm_pricer
    >>> from plansim.strategy.schema import Strategy
    >>> model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=8)
    >>> prep = prepare_step(model, cluster, Strategy(dp=8, micro_batch=1, global_batch=8))
    >>> g = stage_graph(prep.graph, range(2), prep.kernels, comm_pricer(cluster, prep.strategy))
    >>> len(g), g.forward_count   # 10 forward ops a block (one fused attention op; collectives, adds merged), + 1
    (42, 21)
    """
    if granularity not in GRANULARITIES:
        raise PlansimError(f"granularity {granularity!r}: choose one of {', '.join(GRANULARITIES)}")
    wanted = set(layers)
    ops = [v for v, layer in graph.nodes(data="layer") if layer in wanted]
    if not ops:
        raise PlansimError(f"remat stage graph: no ops in layers {sorted(wanted)}")
    merged = _merged_groups(graph, ops)
    fine = _contract(graph, ops, merged.__getitem__, kernels, comm, name)
    if granularity == "layer":
        return contract(fine, layer_parts(fine), name=name)[0]
    return fine


def _contract(
    graph: nx.DiGraph,
    ops: Sequence[str],
    group: Callable[[str], Hashable],
    kernels: KernelCostModel,
    comm: CommPricer,
    name: str,
) -> RematGraph:
    members: dict[Hashable, list[str]] = {}
    for v in ops:
        members.setdefault(group(v), []).append(v)
    # a group sits where its last op is: every op outside it that feeds it comes earlier
    position = {v: i for i, v in enumerate(ops)}
    order = sorted(members, key=lambda g: position[members[g][-1]])
    index = {g: i for i, g in enumerate(order)}
    inside = set(ops)
    fwd: list[RematNode] = []
    bwd_costs: list[float] = []
    for g in order:
        times = [_op_times(graph.nodes[v], kernels, comm) for v in members[g]]
        deps = {index[group(p)] for v in members[g] for p in graph.predecessors(v) if p in inside} - {index[g]}
        if any(d >= index[g] for d in deps):
            raise PlansimError(f"remat stage graph {name}: grouping {g!r} creates a cycle")
        last = graph.nodes[members[g][-1]]  # the op that saves what the group keeps
        fwd.append(
            RematNode(
                members[g][-1] if len(members[g]) == 1 else "+".join(members[g]),
                sum(f for f, _, _ in times),
                float(sum(graph.nodes[v]["saved_bytes"] for v in members[g])),
                tuple(sorted(deps)),
                layer=last["layer"],
                selective=last["selective_recompute"] or all(graph.nodes[v]["selective_recompute"] for v in members[g]),
                comm_cost=sum(c for _, _, c in times),
                flops=float(
                    sum(
                        graph.nodes[v]["flops"] * executed_share(graph.nodes[v])
                        for v in members[g]
                        if graph.nodes[v]["kind"] in MATMUL_KINDS
                    )
                ),  # what recomputing the group executes (hardware FLOPs)
            )
        )
        bwd_costs.append(sum(b for _, b, _ in times))
    return training_graph(
        fwd,
        backward_costs=bwd_costs,
        grad_memory=[0.0] * len(fwd),
        reads_inputs=False,
        loss_is_sink=False,
        name=name,
    )
