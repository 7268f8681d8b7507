"""Coarsening a remat graph: contract groups of nodes into one, and the coarse schedule as a start for the fine MILP.

A transformer block at op granularity is a dozen nodes; its MILP grows with the square of the node count (Checkmate,
sec 4.6: ``O(n^2)`` variables per graph once frontier-advancing), so a stage of several blocks is a large program.
Contracting each block into four parts (``layer_parts``: its first node, the nodes before the attention core, the
core that selective recompute drops, the rest) keeps the decisions practitioners make (keep the block input, drop
the core, drop the whole block) in a program a tenth the size. It solves in about a second, and its choice of what
to hold from forward to backward, mapped back to the fine nodes as checkpoints (``coarse_checkpoints``), is a
schedule of the fine graph that the fine MILP starts from: one more incumbent, checked by replay like any other,
which leaves the solver only the bound to raise. This is the multilevel idea of graph-partitioning solvers (solve
coarse, refine fine) applied as a MIP start; nothing about the fine optimum is assumed.

A contracted node costs its members' costs together and holds all their bytes (a member read only inside the group
is counted as held: the coarse graph can only overstate memory), reads what its members read outside the group,
and sits where its last member sits; a group of gradient nodes is named after its forward group.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from plansim.errors import PlansimError
from plansim.remat.graph import RematGraph, RematNode

__all__ = ["coarse_checkpoints", "contract", "layer_parts"]


def layer_parts(graph: RematGraph) -> list[Hashable]:
    """A label per node: ``(layer, part)`` for forward nodes, part 0 the layer's first node, 1 the nodes before its
    first ``selective`` node, 2 the ``selective`` nodes, 3 the rest; a gradient node (``grad:<name>``, as
    ``training_graph`` names them) joins its forward node's group; any other backward node stays alone.

    >>> from plansim.remat.graph import linear_chain
    >>> layer_parts(linear_chain(2))[:3]   # every chain node is its own layer: nothing to contract
    [(0, 0), (1, 0), (2, 0)]
    """
    labels: list[Hashable] = []
    seen: dict[int, int] = {}
    by_name: dict[str, Hashable] = {}
    for i, node in enumerate(graph.nodes):
        if node.backward:
            forward = node.name.removeprefix("grad:") if node.name.startswith("grad:") else None
            labels.append(("grad", by_name[forward]) if forward in by_name else ("node", i))
            continue
        if node.layer not in seen:
            part = 0
        elif node.selective:
            part = 2
        else:
            part = 3 if seen[node.layer] >= 2 else 1
        seen[node.layer] = max(seen.get(node.layer, 0), part)
        labels.append((node.layer, part))
        by_name[node.name] = labels[-1]
    return labels


def contract(graph: RematGraph, labels: Sequence[Hashable], *, name: str | None = None) -> tuple[RematGraph, list[int]]:
    """The graph with every group of equal ``labels`` contracted into one node, and each node's group index.

    Groups are ordered by their last member; PlansimError if a group then reads a later one (the labels cut a
    cycle) or mixes forward and backward nodes.

    >>> from plansim.remat.graph import linear_chain
    >>> coarse, group = contract(linear_chain(3), [0, 0, 1, 1, 2, 2, 3])
    >>> [n.name for n in coarse.nodes], group
    (['f0+f1', 'f2+loss', 'grad:f1+f2', 'grad:f0'], [0, 0, 1, 1, 2, 2, 3])
    """
    if len(labels) != len(graph):
        raise PlansimError(f"contract {graph.name}: {len(labels)} labels for {len(graph)} nodes")
    members: dict[Hashable, list[int]] = {}
    for i, label in enumerate(labels):
        members.setdefault(label, []).append(i)
    order = sorted(members, key=lambda g: members[g][-1])
    index = {g: k for k, g in enumerate(order)}
    group = [index[label] for label in labels]
    nodes = []
    for k, g in enumerate(order):
        parts = [graph.nodes[i] for i in members[g]]
        if len({p.backward for p in parts}) > 1:
            raise PlansimError(f"contract {graph.name}: group {g!r} mixes forward and backward nodes")
        deps = {group[d] for p in parts for d in p.deps} - {k}
        if any(d > k for d in deps):
            raise PlansimError(f"contract {graph.name}: group {g!r} reads a later group (the grouping has a cycle)")
        last = parts[-1]
        nodes.append(
            RematNode(
                _group_name(parts),
                sum(p.cost for p in parts),
                sum(p.memory for p in parts),
                tuple(sorted(deps)),
                last.backward,
                last.layer,
                last.selective or all(p.selective for p in parts),
                sum(p.comm_cost for p in parts),
                sum(p.flops for p in parts),
            )
        )
    return RematGraph(nodes, name=name or f"{graph.name}/coarse", meta=graph.meta), group


def _group_name(parts: Sequence[RematNode]) -> str:
    """Members' names joined; a group of gradient nodes is named after its forward group (``grad:a+b``)."""
    if len(parts) > 1 and all(p.name.startswith("grad:") for p in parts):
        return "grad:" + "+".join(p.name.removeprefix("grad:") for p in reversed(parts))
    return "+".join(p.name for p in parts)


def coarse_checkpoints(graph: RematGraph, group: Sequence[int], coarse_held: set[int]) -> set[int]:
    """The fine forward nodes whose group is in ``coarse_held`` (what a coarse plan holds when its backward pass
    starts): the checkpoints of the fine schedule that keeps what the coarse one keeps.

    >>> from plansim.remat.graph import linear_chain
    >>> sorted(coarse_checkpoints(linear_chain(3), [0, 0, 1, 1, 2, 2, 3], {0}))
    [0, 1]
    """
    return {i for i in range(graph.forward_count) if group[i] in coarse_held}
