"""Build the cluster graph from a node type's per-tier data.

Vertices (each with a ``kind`` attribute):

* ``gpu<rank>`` (``kind="gpu"``, global node-major rank, with ``node``),
* ``node<n>/nvswitch`` or ``node<n>/pcie`` (the intra-node switch; an ``nvlink_mesh`` has none: GPUs link directly),
* ``node<n>/nic<i>`` (``kind="nic"``),
* ``<tier><g>`` for fabric switches, with ``/rail<i>`` for rail-optimised leaves (``kind="switch"``, ``tier``).

Every edge carries ``bandwidth_Bps`` (per direction, line rate) and ``latency_s``. A switch's uplink carries the
sum of its downlinks divided by the extra oversubscription of the tier above (tiers store it cumulatively).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import networkx as nx

from plansim.hardware.schema import NodeSpec

__all__ = ["build_topology", "link_tier", "topology_size"]


def build_topology(node: NodeSpec, num_gpus: int) -> nx.Graph:
    """Graph of ``num_gpus`` GPUs of node type ``node`` with their switches, NICs and network tiers.

    Examples
    --------
    >>> from plansim.hardware import load_node
    >>> g = build_topology(load_node("dgx-a100"), 16)
    >>> sum(1 for _, kind in g.nodes(data="kind") if kind == "nic")
    16
    >>> all(d["bandwidth_Bps"] > 0 and d["latency_s"] > 0 for _, _, d in g.edges(data=True))
    True
    """
    graph = nx.Graph()
    per_node = node.gpus_per_node
    num_nodes = -(-num_gpus // per_node)
    for n in range(num_nodes):
        ranks = range(n * per_node, min((n + 1) * per_node, num_gpus))
        for rank in ranks:
            graph.add_node(f"gpu{rank}", kind="gpu", node=n)
        _add_intra(graph, node, n, ranks)
        _add_nics(graph, node, n, ranks)
    _add_fabric(graph, node)
    return graph


def topology_size(node: NodeSpec, num_gpus: int) -> int:
    """Vertices plus edges of ``build_topology(node, num_gpus)``, in closed form (nothing is built), so that a
    graph too large to hold can be refused before it is made: GPUs, each node's switch and NICs, the fabric's
    switches per tier (``FabricTier.group``: one per ``nodes_per_switch`` nodes, a rail-optimised leaf one per
    NIC of each), and their links (a GPU to its switch or its mesh peers and to its NIC, a NIC to its leaf, a
    switch to its parent).

    >>> from plansim.hardware import load_node
    >>> a100 = load_node("dgx-a100")
    >>> g = build_topology(a100, 16)
    >>> topology_size(a100, 16) == g.number_of_nodes() + g.number_of_edges()
    True
    """
    per_node = node.gpus_per_node
    full, rest = divmod(num_gpus, per_node)
    nodes = full + (1 if rest else 0)
    intra = node.intra_node
    if intra.topology == "nvlink_mesh":
        hubs, intra_edges = 0, full * len(intra.links or ()) + _mesh_links(node, rest)
    else:
        hubs, intra_edges = nodes, num_gpus
    count = node.nics.count
    partial_nics = len({(r * count) // per_node for r in range(rest)})  # the NICs of a last, partial node's GPUs
    nics = full * count + partial_nics
    switches, previous, edges_up = 0, 0, 0
    for i, tier in enumerate(node.fabric):
        groups = 1 if tier.nodes_per_switch is None else -(-nodes // tier.nodes_per_switch)
        here = groups
        if tier.kind == "rail_optimized":  # a leaf per rail of each group; a partial node's group alone, its NICs'
            alone = rest and tier.group(full) != tier.group(full - 1) if full else bool(rest)
            here = (groups - 1) * count + partial_nics if alone else groups * count
        switches += here
        edges_up += nics if i == 0 else previous  # each NIC to its leaf; each switch to its parent
        previous = here
    vertices = num_gpus + hubs + nics + switches
    return vertices + intra_edges + num_gpus + edges_up


def _mesh_links(node: NodeSpec, ranks: int) -> int:
    """NVLink mesh links among a partial node's first ``ranks`` GPUs."""
    return sum(1 for a, b, _ in node.intra_node.links or () if a < ranks and b < ranks)


def _add_intra(graph: nx.Graph, node: NodeSpec, n: int, ranks: range) -> None:
    intra = node.intra_node
    first = n * node.gpus_per_node
    if intra.topology == "nvlink_mesh":
        assert intra.links is not None and intra.link_bandwidth_Bps is not None  # schema guarantees
        for a, b, count in intra.links:
            if first + a in ranks and first + b in ranks:
                bandwidth = count * intra.link_bandwidth_Bps
                graph.add_edge(f"gpu{first + a}", f"gpu{first + b}", bandwidth_Bps=bandwidth, latency_s=intra.latency_s)
        return
    hub = f"node{n}/{intra.topology}"
    graph.add_node(hub, kind=intra.topology, node=n)
    for rank in ranks:
        graph.add_edge(f"gpu{rank}", hub, bandwidth_Bps=intra.bandwidth_per_gpu_Bps, latency_s=intra.latency_s)


def _add_nics(graph: nx.Graph, node: NodeSpec, n: int, ranks: range) -> None:
    """Each NIC serves ``gpus_per_node / count`` consecutive GPUs (the ones behind its PCIe switch)."""
    nics = node.nics
    for rank in ranks:
        nic = f"node{n}/nic{(rank % node.gpus_per_node) * nics.count // node.gpus_per_node}"
        graph.add_node(nic, kind="nic", node=n)
        graph.add_edge(f"gpu{rank}", nic, bandwidth_Bps=nics.bandwidth_Bps, latency_s=nics.latency_s)


def _add_fabric(graph: nx.Graph, node: NodeSpec) -> None:
    """Connect NICs to leaves, then each tier's switches to the tier above, innermost first."""
    leaf = node.fabric[0]
    downlinks: dict[str, float] = defaultdict(float)
    first_node: dict[str, int] = {}
    nics = [(v, data["node"]) for v, data in graph.nodes(data=True) if data["kind"] == "nic"]
    for nic, n in nics:
        switch = f"{leaf.name}{leaf.group(n)}"
        if leaf.kind == "rail_optimized":
            switch += "/rail" + nic.rsplit("nic", 1)[1]
        graph.add_node(switch, kind="switch", tier=leaf.name)
        graph.add_edge(nic, switch, bandwidth_Bps=leaf.bandwidth_Bps, latency_s=leaf.latency_s)
        downlinks[switch] += leaf.bandwidth_Bps
        first_node[switch] = min(first_node.get(switch, n), n)
    children = sorted(first_node, key=first_node.__getitem__)
    for inner, outer in itertools.pairwise(node.fabric):
        taper = outer.oversubscription / inner.oversubscription
        for child in children:
            parent = f"{outer.name}{outer.group(first_node[child])}"
            graph.add_node(parent, kind="switch", tier=outer.name)
            uplink = downlinks[child] / taper
            graph.add_edge(child, parent, bandwidth_Bps=uplink, latency_s=outer.latency_s)
            downlinks[parent] += uplink
            first_node[parent] = min(first_node.get(parent, first_node[child]), first_node[child])
        children = sorted({f"{outer.name}{outer.group(first_node[c])}" for c in children}, key=first_node.__getitem__)


def link_tier(node: NodeSpec, link: str) -> str:
    """The tier a topology link (``"u->v"``, as the discrete-event engine names links) belongs to: ``nvlink``
    (GPU to NVSwitch, or GPU to GPU in an NVLink mesh), ``pcie`` (GPU to a PCIe switch), ``nic`` (GPU to its NIC),
    else the outermost fabric tier it touches (``leaf``, ``spine``, ... as the profile names them).

    >>> from plansim.hardware import load_node
    >>> a100 = load_node("dgx-a100")
    >>> [link_tier(a100, x) for x in ("gpu0->node0/nvswitch", "gpu0->node0/nic0", "node0/nic0->leaf0/rail0")]
    ['nvlink', 'nic', 'leaf']
    """
    tiers = [t.name for t in node.fabric]

    def level(vertex: str) -> tuple[int, str]:
        if vertex.startswith("gpu") or vertex.endswith(("/nvswitch", "/nvlink_mesh")):
            return 0, "pcie" if node.intra_node.topology == "pcie" else "nvlink"
        if vertex.endswith("/pcie"):
            return 0, "pcie"
        if "/nic" in vertex:
            return 1, "nic"
        switch = vertex.split("/", 1)[0]  # <tier><group>, and a tier's name may itself end in digits
        for i in sorted(range(len(tiers)), key=lambda i: -len(tiers[i])):
            if switch.startswith(tiers[i]) and switch[len(tiers[i]) :].isdigit():
                return 2 + i, tiers[i]
        raise ValueError(f"link {link!r}: {vertex!r} is not a vertex of a plansim topology")

    ends = link.split("->")
    if len(ends) != 2:
        raise ValueError(f"link {link!r}: expected 'u->v'")
    return max(level(v) for v in ends)[1]
