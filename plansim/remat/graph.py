"""The graph a rematerialization schedule is made for: a DAG of nodes in one topological order, each with a compute
cost and the bytes its result occupies while kept.

This is the input of Checkmate (Jain et al., MLSys 2020, sec 3): ``G = (V, E)`` with ``v_1 .. v_n`` topologically
ordered, cost ``C_i`` and memory ``M_i`` per node. For training, the graph holds the forward pass and the backward
pass derived from it (``training_graph``), with backward nodes after every forward node; ``linear_chain`` is the
chain of like layers that tests and examples use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import networkx as nx

from plansim.errors import PlansimError

__all__ = ["RematGraph", "RematNode", "linear_chain", "training_graph"]


@dataclass(frozen=True)
class RematNode:
    """One node: its name, cost (seconds or any unit), the bytes its result occupies, and its producers (indices).

    ``backward`` marks nodes of the backward pass; ``layer`` groups nodes into layers (baselines checkpoint layer
    inputs); ``selective`` marks forward nodes that selective recompute drops (Korthikanti et al. 2022, sec 5).
    ``comm_cost`` is the part of ``cost`` spent in communication (tensor-parallel collectives) and ``flops`` the
    matmul FLOPs of one computation, so that a schedule's recompute splits into compute, communication and FLOPs.
    """

    name: str
    cost: float
    memory: float
    deps: tuple[int, ...] = ()
    backward: bool = False
    layer: int = 0
    selective: bool = False
    comm_cost: float = 0.0
    flops: float = 0.0


@dataclass(frozen=True)
class RematGraph:
    """A DAG whose node list is a topological order (every dependency has a smaller index).

    >>> g = RematGraph([RematNode("a", 1, 2), RematNode("b", 1, 2, (0,))])
    >>> g.users[0], g.forward_count
    ((1,), 2)
    """

    nodes: Sequence[RematNode]
    name: str = "graph"
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        for i, node in enumerate(self.nodes):
            if any(not 0 <= d < i for d in node.deps):
                raise PlansimError(f"remat graph {self.name}: node {node.name!r} depends on a later node or itself")
            if node.cost < 0 or node.memory < 0:
                raise PlansimError(f"remat graph {self.name}: node {node.name!r} has a negative cost or memory")
        seen_backward = False
        for node in self.nodes:
            if seen_backward and not node.backward:
                raise PlansimError(f"remat graph {self.name}: forward node {node.name!r} after a backward node")
            seen_backward = seen_backward or node.backward

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def users(self) -> tuple[tuple[int, ...], ...]:
        """``users[i]``: the nodes that read node ``i``, ascending."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for j, node in enumerate(self.nodes):
            for d in set(node.deps):
                out[d].append(j)
        return tuple(tuple(sorted(u)) for u in out)

    @cached_property
    def forward_count(self) -> int:
        """How many nodes come before the first backward node (all of them for a plain DAG)."""
        return next((i for i, n in enumerate(self.nodes) if n.backward), len(self.nodes))

    @property
    def total_cost(self) -> float:
        """Every node computed once: the cost of a schedule that recomputes nothing."""
        return sum(n.cost for n in self.nodes)

    @property
    def memory_floor(self) -> float:
        """A lower bound on any schedule's peak bytes: some node's operands and result are live together."""
        return max((n.memory + sum(self.nodes[d].memory for d in set(n.deps)) for n in self.nodes), default=0.0)

    @property
    def edges(self) -> int:
        """Number of dependency edges."""
        return sum(len(set(n.deps)) for n in self.nodes)

    @classmethod
    def from_networkx(
        cls, dag: nx.DiGraph, *, cost: str = "cost", memory: str = "memory", name: str = "graph"
    ) -> RematGraph:
        """A DAG with ``cost`` and ``memory`` node attributes (optional ``backward``, ``layer``, ``selective``), in
        networkx's lexicographic topological order (ties broken by node name, so the order is reproducible).

        >>> d = nx.DiGraph([("x", "y")]); nx.set_node_attributes(d, 1.0, "cost"); nx.set_node_attributes(d, 4, "memory")
        >>> [n.name for n in RematGraph.from_networkx(d).nodes]
        ['x', 'y']
        """
        if not nx.is_directed_acyclic_graph(dag):
            raise PlansimError(f"remat graph {name}: the graph has a cycle")
        fwd = [n for n in dag if not dag.nodes[n].get("backward", False)]
        order = list(nx.lexicographical_topological_sort(dag, key=lambda n: (n not in set(fwd), str(n))))
        index = {n: i for i, n in enumerate(order)}
        nodes = []
        for n in order:
            data = dag.nodes[n]
            missing = [a for a in (cost, memory) if a not in data]
            if missing:
                raise PlansimError(f"remat graph {name}: node {n!r} lacks {' and '.join(missing)}")
            nodes.append(
                RematNode(
                    str(n),
                    float(data[cost]),
                    float(data[memory]),
                    tuple(sorted(index[p] for p in dag.predecessors(n))),
                    bool(data.get("backward", False)),
                    int(data.get("layer", index[n])),
                    bool(data.get("selective", False)),
                )
            )
        return cls(nodes, name=name)


def training_graph(
    forward: Sequence[RematNode],
    *,
    backward_costs: Sequence[float] | None = None,
    grad_memory: Sequence[float] | None = None,
    reads_inputs: bool = True,
    loss_is_sink: bool = True,
    name: str = "training",
) -> RematGraph:
    """The forward nodes followed by the backward pass derived from them (Checkmate, sec 3: autodiff adds a gradient
    node per forward node, in reverse order).

    The gradient node of ``v`` reads the gradients of ``v``'s users, ``v`` itself and, with ``reads_inputs``, ``v``'s
    inputs (a GEMM's weight gradient needs its input). With ``loss_is_sink`` the single sink is the loss: it gets no
    gradient node, its users' gradients start from it. ``backward_costs`` default to twice the forward costs;
    ``grad_memory`` to the forward memory (a gradient is the size of the tensor it is the gradient of).

    >>> g = linear_chain(2)
    >>> [(n.name, n.deps) for n in g.nodes]
    [('f0', ()), ('f1', (0,)), ('loss', (1,)), ('grad:f1', (0, 1, 2)), ('grad:f0', (0, 3))]
    """
    fwd = list(forward)
    n = len(fwd)
    users: list[list[int]] = [[] for _ in fwd]
    for j, node in enumerate(fwd):
        for d in node.deps:
            users[d].append(j)
    sinks = [i for i in range(n) if not users[i]]
    if loss_is_sink and len(sinks) != 1:
        raise PlansimError(f"remat graph {name}: loss_is_sink needs exactly one sink, found {len(sinks)}")
    grads = [i for i in reversed(range(n)) if not (loss_is_sink and i == sinks[0])]
    index = {v: n + k for k, v in enumerate(grads)}
    nodes = list(fwd)
    for v in grads:
        deps = {v}
        deps.update(index.get(u, u) for u in users[v])  # the loss has no gradient node: read the loss itself
        if reads_inputs:
            deps.update(fwd[v].deps)
        cost = 2 * fwd[v].cost if backward_costs is None else backward_costs[v]
        mem = fwd[v].memory if grad_memory is None else grad_memory[v]
        nodes.append(RematNode(f"grad:{fwd[v].name}", cost, mem, tuple(sorted(deps)), True, fwd[v].layer))
    return RematGraph(nodes, name=name)


def linear_chain(layers: int, *, cost: float = 1.0, memory: float = 1.0) -> RematGraph:
    """The training graph of ``layers`` uniform layers and a loss: ``2 * layers + 1`` nodes, unit costs and memory
    by default, gradient nodes costing as much as forward ones (Checkmate's linear benchmark graphs).

    >>> len(linear_chain(8))
    17
    """
    fwd = [RematNode(f"f{i}", cost, memory, (i - 1,) if i else (), layer=i) for i in range(layers)]
    fwd.append(RematNode("loss", cost, memory, (layers - 1,) if layers else (), layer=layers))
    return training_graph(fwd, backward_costs=[cost] * len(fwd), name=f"chain-{layers}")
