"""Directed link capacities and routes of a cluster, as the discrete-event simulator sees them.

Capacities: every edge of the topology graph (``plansim.hardware.topology``) becomes two directed links of the same
capacity (full duplex), its line rate times a what-if's factor (``link_factors``; a ``failed`` link is removed) times
the efficiency of its kind: ``intra_node.efficiency`` (measured
all-reduce bus bandwidth over line rate) for edges inside a node (GPU to NVSwitch/PCIe hub, GPU to GPU in an NVLink
mesh), ``nics.efficiency`` for NIC edges (GPU to NIC) and fabric edges (NIC to leaf, switch to switch). So a ring
all-reduce among the GPUs of one NVSwitch node moves exactly ``allreduce_busbw_Bps`` per GPU (each ring step crosses
one GPU->switch and one switch->GPU link per GPU), and GPUs sharing a NIC that all send at once each get
``nic_share_Bps * nics.efficiency``: the same numbers ``Cluster.group_link`` and ``Cluster.p2p_link`` give the
analytic engine.

Routes (deterministic; the first rule that finds one wins):

1. Same node: the intra-node fabric (via the hub, or the NVLink mesh), fewest GPU transits, then fewest hops. A mesh
   pair without a direct link forwards through a neighbour GPU (NVLink forwarding), never out through the network.
2. Up*/down* routing (Schroeder et al., "Autonet: a high-speed, self-configuring local area network using
   point-to-point links", IEEE JSAC 9(8), 1991): climb from both GPUs towards the upper tiers (GPU -> NIC -> leaf ->
   spine -> core) and meet at the lowest common vertex. The switch fabric built by ``topology`` is a tree, so this is
   the one shortest path that transits no other GPU; it costs a few dictionary lookups, however large the cluster.
3. After failures: leave the source node through another GPU's NIC and/or enter the destination node through
   another GPU's NIC (PXN-like rerouting: NCCL's "PCI x NVLink" sends, NCCL 2.12 release notes), fewest GPU transits,
   then fewest hops.
4. Otherwise a Dijkstra search over the whole graph, fewest GPU transits then fewest hops.

A ring channel's hop between nodes (``Fabric.ring_route``) instead leaves through the NIC of the rail it enters the
next node on, relayed over NVLink to that NIC's GPU where needed (NCCL's same-NIC channels and PXN).

Ties are broken by the lexicographically smallest vertex sequence, vertex names compared in natural order
(``gpu2 < gpu10``).

Link selectors (for what-ifs, from the CLI): a vertex name such as ``node0/nic0`` or ``leaf0/rail3`` selects every
edge touching it, both directions; ``gpu3--node0/nvswitch`` selects that edge, both directions.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping

import networkx as nx

from plansim.des.network import LinkId
from plansim.errors import PlansimError
from plansim.hardware import Cluster

__all__ = ["Fabric", "links_command"]

_HUBS = ("nvswitch", "pcie")
_Edge = tuple[str, str]  # an undirected edge, endpoints in sorted order


def _edge(u: str, v: str) -> _Edge:
    return (u, v) if u <= v else (v, u)


def _positive(value: object) -> bool:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and number > 0


def _natural_key(name: str) -> tuple[str | int, ...]:
    """``node12/nic3`` -> ``('node', 12, '/nic', 3, '')``: digits compare as numbers."""
    return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", name)))


class Fabric:
    """Directed link capacities and routes of a cluster, as the simulator sees them.

    Parameters
    ----------
    cluster
        The cluster (its topology graph is built on first use and cached by the cluster).
    link_factors
        Selector -> factor (> 0) multiplying the capacity of the selected links (both directions). Factors of
        overlapping selectors multiply.
    failed
        Selectors of links that are down: removed from ``capacity_Bps`` and routed around.

    Attributes
    ----------
    capacity_Bps
        Capacity of every directed link that is up, bytes/s.
    detours
        ``(src_rank, dst_rank)`` pairs routed so far whose route had to avoid a failed link.

    Raises
    ------
    PlansimError
        For an unknown selector (the message lists valid ones) or a factor that is not a positive number.

    Examples
    --------
    >>> from plansim.hardware import load_hardware
    >>> fabric = Fabric(load_hardware("dgx-h100", gpus=16))
    >>> fabric.route(0, 1)
    (('gpu0', 'node0/nvswitch'), ('node0/nvswitch', 'gpu1'))
    >>> fabric.capacity_Bps[("gpu0", "node0/nvswitch")] / 1e9  # 450 GB/s NVLink x 370/450 measured
    370.0
    >>> [v for _, v in fabric.route(0, 9)]
    ['node0/nic0', 'leaf0/rail0', 'spine0', 'leaf0/rail1', 'node1/nic1', 'gpu9']
    >>> down = Fabric(load_hardware("dgx-h100", gpus=16), failed=["node0/nic0"])
    >>> [v for _, v in down.route(0, 8)]  # out through GPU 1's NIC, then rail 1 -> spine -> rail 0
    ['node0/nvswitch', 'gpu1', 'node0/nic1', 'leaf0/rail1', 'spine0', 'leaf0/rail0', 'node1/nic0', 'gpu8']
    >>> down.detours
    {(0, 8)}
    """

    def __init__(
        self, cluster: Cluster, *, link_factors: Mapping[str, float] | None = None, failed: Iterable[str] = ()
    ) -> None:
        self.cluster = cluster
        graph = cluster.topology
        self._graph = graph
        self.failed: tuple[str, ...] = tuple(failed)
        failed_edges: set[_Edge] = set()
        for selector in self.failed:
            failed_edges |= self._select(selector)
        factors: dict[_Edge, float] = {}
        for selector, factor in (link_factors or {}).items():
            if not _positive(factor):
                raise PlansimError(
                    f"--degrade-link {selector}={factor}: the factor must be a positive number (0.5 halves the "
                    f"bandwidth); to take the link down, use --fail-link {selector} instead"
                )
            for edge in self._select(selector):
                factors[edge] = factors.get(edge, 1.0) * factor
        self._failed_edges = failed_edges
        self.capacity_Bps: dict[LinkId, float] = self._capacities(factors)
        self.detours: set[tuple[int, int]] = set()
        self._router = _Router(cluster, failed_edges)
        self._healthy = _Router(cluster, set()) if failed_edges else None
        self._routes: dict[tuple[int, int], tuple[LinkId, ...]] = {}
        self._ring_routes: dict[tuple[int, int], tuple[LinkId, ...]] = {}

    def route(self, src_rank: int, dst_rank: int) -> tuple[LinkId, ...]:
        """Directed links from ``src_rank``'s GPU to ``dst_rank``'s, in order (empty for the same rank; cached).

        Raises
        ------
        PlansimError
            If a rank is outside the cluster, or failed links leave the two ranks no route.
        """
        key = (src_rank, dst_rank)
        cached = self._routes.get(key)
        if cached is not None:
            return cached
        self.cluster.node_of(src_rank)  # rank checks
        self.cluster.node_of(dst_rank)
        if src_rank == dst_rank:
            links: tuple[LinkId, ...] = ()
        else:
            src, dst = f"gpu{src_rank}", f"gpu{dst_rank}"
            path = self._router.path(src, dst)
            if path is None:
                raise PlansimError(
                    f"no route from rank {src_rank} to rank {dst_rank}: the failed links "
                    f"({', '.join(self.failed)}) cut them apart; fail fewer links"
                )
            links = tuple(itertools.pairwise(path))
            if self._healthy is not None:
                healthy = self._healthy.path(src, dst)
                if healthy is not None and any(
                    _edge(u, v) in self._failed_edges for u, v in itertools.pairwise(healthy)
                ):
                    self.detours.add(key)
        self._routes[key] = links
        return links

    def ring_route(self, src_rank: int, dst_rank: int) -> tuple[LinkId, ...]:
        """Route of a ring channel's hop from ``src_rank`` to ``dst_rank``, kept on the rail of ``dst_rank``'s NIC.

        NCCL's ring search (``src/graph/search.cc`` at 5067397c, ``ncclTopoSearchRecNet``/``ncclTopoSearchRecGpu``,
        ``ncclTopoSearchCheckNet``) builds each inter-node channel as ``NET n -> GPU a -> ... -> GPU x -> NET n``:
        it enters a node at the GPU next to NIC ``n`` and leaves through the same NIC (``NCCL_CROSS_NIC`` defaults
        to 2, which tries this same-NIC layout first and allows crossing NICs only where it finds none). The hop
        between nodes therefore joins the same NIC index on both, one rail. Where the channel's last GPU ``x`` is
        not attached to that NIC it reaches it over NVLink through the GPU that is (PXN, "PCI x NVLink": the
        path type ``PATH_PXN`` the search may use, ``src/graph/paths.cc``; NCCL 2.12 release notes).

        NCCL relays through a GPU only when that GPU reaches the sender over NVLink directly (``paths.cc``,
        ``ncclTopoComputePaths``: ``peerNode->paths[GPU][g].type <= PATH_NVL``, which a forward through a third GPU,
        ``PATH_NVB``, is not).

        So: a hop inside a node, or whose sender is attached to the NIC of ``dst_rank``'s index, is ``route``.
        Otherwise the hop goes from ``src_rank`` to a GPU of its node attached to that NIC (the one of
        ``dst_rank``'s local index first) that it reaches without transiting another GPU (through the NVSwitch, or
        over a direct link of an NVLink mesh), then up*/down* to ``dst_rank``. Where no such GPU exists (a mesh
        without that link: NCCL would have ordered the ring differently), failed links block that path, or a
        partly used node lacks the GPU, the hop takes ``route`` (cached).

        >>> from plansim.hardware import load_hardware
        >>> fabric = Fabric(load_hardware("dgx-a100", gpus=16))
        >>> [v for _, v in fabric.ring_route(7, 8)]  # GPU 7 reaches NIC 0 through GPU 0, then rail 0
        ['node0/nvswitch', 'gpu0', 'node0/nic0', 'leaf0/rail0', 'node1/nic0', 'gpu8']
        >>> [v for _, v in fabric.route(7, 8)]  # the plain route leaves through GPU 7's NIC and crosses rails
        ['node0/nic7', 'leaf0/rail7', 'spine0', 'leaf0/rail0', 'node1/nic0', 'gpu8']
        """
        key = (src_rank, dst_rank)
        cached = self._ring_routes.get(key)
        if cached is not None:
            return cached
        cluster = self.cluster
        per_node = cluster.gpus_per_node
        src_node, dst_node = cluster.node_of(src_rank), cluster.node_of(dst_rank)
        nic = self._nic_of(dst_rank)
        links: tuple[LinkId, ...] | None = None
        if src_node != dst_node and self._nic_of(src_rank) != nic:
            first = src_node * per_node
            local = dst_rank - dst_node * per_node
            relays = [first + local] + [r for r in range(first, first + per_node) if r != first + local]
            src, dst = f"gpu{src_rank}", f"gpu{dst_rank}"
            for relay in relays:
                if relay >= cluster.num_gpus or relay == src_rank or self._nic_of(relay) != nic:
                    continue
                head = self._router.intra_path(src, f"gpu{relay}")
                if head is None or self._router.transits(head):
                    continue
                tail = self._router.up_down(f"gpu{relay}", dst)
                if tail is not None:
                    links = tuple(itertools.pairwise(head + tail[1:]))
                    break
        if links is None:
            links = self.route(src_rank, dst_rank)
        self._ring_routes[key] = links
        return links

    def _nic_of(self, rank: int) -> int:
        """Index of the NIC ``rank``'s GPU is attached to (``plansim.hardware.topology``: consecutive GPUs share)."""
        node = self.cluster.node
        return (rank % node.gpus_per_node) * node.nics.count // node.gpus_per_node

    def latency_s(self, src_rank: int, dst_rank: int) -> float:
        """Latency of a send, the analytic engine's: ``cluster.p2p_link(src_rank, dst_rank).latency_s``."""
        return self.cluster.p2p_link(src_rank, dst_rank).latency_s

    def describe_links(self) -> str:
        """Valid link selectors, briefly: the GPUs, node 0's vertices, the fabric switches by tier, the edge form.

        >>> from plansim.hardware import load_hardware
        >>> print(Fabric(load_hardware("dgx-a100", gpus=16)).describe_links())
        link selectors: a vertex (every link touching it) or an edge 'u--v' (that link), both directions
          GPUs: gpu0..gpu15
          node 0 (other nodes alike): node0/nic0..node0/nic7, node0/nvswitch
          leaf: leaf0/rail0..leaf0/rail7
          spine: spine0
          core: core0
          edges of gpu0: gpu0--node0/nvswitch, gpu0--node0/nic0
        """
        lines = ["link selectors: a vertex (every link touching it) or an edge 'u--v' (that link), both directions"]
        for group, names in self._vertex_groups().items():
            shown = [_span(names)] if group != "node 0 (other nodes alike)" else _spans_by_kind(names, self._graph)
            lines.append(f"  {group}: {', '.join(shown)}")
        edges = sorted(self._graph["gpu0"], key=lambda v: (self._graph.nodes[v]["kind"] == "nic", _natural_key(v)))
        lines.append(f"  edges of gpu0: {', '.join(f'gpu0--{v}' for v in edges)}")
        return "\n".join(lines)

    def _vertex_groups(self) -> dict[str, list[str]]:
        """Vertex names by group (GPUs, node 0, each fabric tier), each in natural order."""
        groups: dict[str, list[str]] = {}
        for vertex, data in self._graph.nodes(data=True):
            if data["kind"] == "gpu":
                group = "GPUs"
            elif data["kind"] == "switch":
                group = str(data["tier"])
            elif data["node"] == 0:
                group = "node 0 (other nodes alike)"
            else:
                continue
            groups.setdefault(group, []).append(vertex)
        for names in groups.values():
            names.sort(key=_natural_key)
        return groups

    # Internals.

    def _select(self, selector: str) -> set[_Edge]:
        graph = self._graph
        if "--" in selector:
            u, v = (part.strip() for part in selector.split("--", 1))
            for vertex in (u, v):
                if vertex not in graph:
                    raise self._unknown(selector, vertex)
            if not graph.has_edge(u, v):
                neighbours = ", ".join(sorted(graph[u], key=_natural_key)[:8])
                raise PlansimError(f"link selector '{selector}': there is no link {u}--{v}; {u} links to {neighbours}")
            return {_edge(u, v)}
        if selector not in graph:
            raise self._unknown(selector, selector)
        return {_edge(selector, w) for w in graph[selector]}

    def _unknown(self, selector: str, vertex: str) -> PlansimError:
        examples = []
        for names in self._vertex_groups().values():
            kinds = {self._graph.nodes[name]["kind"]: name for name in reversed(names)}  # first name of each kind
            examples += sorted(kinds.values(), key=_natural_key)
        return PlansimError(
            f"unknown link selector '{selector}': {self.cluster.name} x {self.cluster.num_gpus} has no vertex "
            f"'{vertex}'; name a vertex such as {', '.join(examples)}, or an edge such as 'gpu0--node0/nic0' "
            f"({links_command(self.cluster)} lists them)"
        )

    def _capacities(self, factors: Mapping[_Edge, float]) -> dict[LinkId, float]:
        node = self.cluster.node
        intra, nic = node.intra_node.efficiency, node.nics.efficiency
        kinds = self._graph.nodes
        capacity: dict[LinkId, float] = {}
        for u, v, bandwidth in self._graph.edges(data="bandwidth_Bps"):
            edge = _edge(u, v)
            if edge in self._failed_edges:
                continue
            inside = {kinds[u]["kind"], kinds[v]["kind"]} <= {"gpu", *_HUBS}
            value = bandwidth * (intra if inside else nic) * factors.get(edge, 1.0)
            capacity[(u, v)] = capacity[(v, u)] = value
        return capacity


def links_command(cluster: Cluster) -> str:
    """The command that lists ``cluster``'s link selectors (``Fabric.describe_links``).

    >>> from plansim.hardware import load_hardware
    >>> links_command(load_hardware("dgx-h100", gpus=16))
    'plansim hardware --links -H dgx-h100 -g 16'
    """
    return f"plansim hardware --links -H {cluster.name} -g {cluster.num_gpus}"


def _span(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


def _spans_by_kind(names: list[str], graph: nx.Graph) -> list[str]:
    by_kind: dict[str, list[str]] = {}
    for name in names:
        by_kind.setdefault(graph.nodes[name]["kind"], []).append(name)
    return [_span(group) for group in by_kind.values()]


class _Router:
    """Paths between GPU vertices of a topology graph without ``failed`` edges (the rules of the module doc)."""

    def __init__(self, cluster: Cluster, failed: set[_Edge]) -> None:
        self._graph = cluster.topology
        self._failed = failed
        self._per_node = cluster.gpus_per_node
        self._tiers = {tier.name: i for i, tier in enumerate(cluster.node.fabric)}  # innermost first
        self._keys: dict[str, tuple[str | int, ...]] = {}
        self._neighbours: dict[str, list[str]] = {}
        self._up: dict[str, list[str]] = {}
        self._closures: dict[str, dict[str, str | None]] = {}
        self._intra: dict[tuple[str, str], list[str] | None] = {}

    def path(self, src: str, dst: str) -> list[str] | None:
        """Vertices from ``src`` to ``dst`` (two GPU vertices), or ``None`` when they are cut apart."""
        nodes = self._graph.nodes
        same_node = nodes[src]["node"] == nodes[dst]["node"]
        if same_node:
            path = self.intra_path(src, dst)
            if path is not None:
                return path
        path = self.up_down(src, dst)
        if path is not None:
            return path
        path = self._via_neighbours(src, dst)
        if path is not None:
            return path
        return self._dijkstra(src, dst, lambda _v: True)

    # The graph without failed edges, in a fixed order.

    def _key(self, vertex: str) -> tuple[str | int, ...]:
        key = self._keys.get(vertex)
        if key is None:
            key = self._keys[vertex] = _natural_key(vertex)
        return key

    def neighbours(self, vertex: str) -> list[str]:
        found = self._neighbours.get(vertex)
        if found is None:
            failed = self._failed
            found = [w for w in self._graph[vertex] if not failed or _edge(vertex, w) not in failed]
            found.sort(key=self._key)
            self._neighbours[vertex] = found
        return found

    def _level(self, vertex: str) -> int:
        """0 for GPUs, 1 for NICs and intra-node hubs, 2 + tier index for fabric switches."""
        data = self._graph.nodes[vertex]
        kind = data["kind"]
        if kind == "gpu":
            return 0
        if kind == "switch":
            return 2 + self._tiers[data["tier"]]
        return 1

    def _up_neighbours(self, vertex: str) -> list[str]:
        found = self._up.get(vertex)
        if found is None:
            level = self._level(vertex)
            found = self._up[vertex] = [w for w in self.neighbours(vertex) if self._level(w) > level]
        return found

    # Rule 2: up*/down*.

    def _closure(self, gpu: str) -> dict[str, str | None]:
        """Vertices reachable from ``gpu`` by upward moves, each with its parent on a shortest such climb.

        Breadth first, so insertion order is by distance; parents are the first found in natural order.
        """
        closure = self._closures.get(gpu)
        if closure is None:
            closure = {gpu: None}
            frontier = [gpu]
            while frontier:
                following = []
                for vertex in frontier:
                    for up in self._up_neighbours(vertex):
                        if up not in closure:
                            closure[up] = vertex
                            following.append(up)
                frontier = following
            self._closures[gpu] = closure
        return closure

    def up_down(self, src: str, dst: str) -> list[str] | None:
        up, down = self._closure(src), self._closure(dst)
        best: list[str] | None = None
        for meet in up:
            if meet not in down:
                continue
            path = _climb(up, meet)[::-1] + _climb(down, meet)[1:]
            if (
                best is None
                or len(path) < len(best)
                or (len(path) == len(best) and self._keys_of(path) < self._keys_of(best))
            ):
                best = path
        return best

    def _keys_of(self, path: list[str]) -> list[tuple[str | int, ...]]:
        return [self._key(v) for v in path]

    # Rule 1 and the pieces of rule 3: inside one node.

    def intra_path(self, src: str, dst: str) -> list[str] | None:
        """Path inside the node of ``src`` and ``dst`` (GPUs and hub only; cached)."""
        if src == dst:
            return [src]
        key = (src, dst)
        if key not in self._intra:
            nodes = self._graph.nodes
            node = nodes[src]["node"]
            self._intra[key] = self._dijkstra(
                src, dst, lambda v: nodes[v].get("node") == node and nodes[v]["kind"] != "nic"
            )
        return self._intra[key]

    # Rule 3: through a neighbour GPU's NIC at either end.

    def _via_neighbours(self, src: str, dst: str) -> list[str] | None:
        best: tuple[tuple[int, int, list[tuple[str | int, ...]]], list[str]] | None = None
        for exit_gpu in self._node_gpus(src):
            head = self.intra_path(src, exit_gpu)
            if head is None:
                continue
            for entry_gpu in self._node_gpus(dst):
                middle = self.up_down(exit_gpu, entry_gpu)
                tail = self.intra_path(entry_gpu, dst)
                if middle is None or tail is None:
                    continue
                path = head + middle[1:] + tail[1:]
                if len(set(path)) < len(path):
                    continue  # not a simple path
                cost = (self.transits(path), len(path), self._keys_of(path))
                if best is None or cost < best[0]:
                    best = (cost, path)
        return None if best is None else best[1]

    def _node_gpus(self, gpu: str) -> list[str]:
        """GPUs of ``gpu``'s node, ``gpu`` first, then the others in rank order (a partly used node has fewer)."""
        rank = int(gpu.removeprefix("gpu"))
        first = rank - rank % self._per_node
        others = (f"gpu{r}" for r in range(first, first + self._per_node) if r != rank)
        return [gpu, *(v for v in others if v in self._graph)]

    def transits(self, path: list[str]) -> int:
        nodes = self._graph.nodes
        return sum(1 for v in path[1:-1] if nodes[v]["kind"] == "gpu")

    # Rule 4, and the search inside a node.

    def _dijkstra(self, src: str, dst: str, allowed: Callable[[str], bool]) -> list[str] | None:
        """Fewest GPU transits, then fewest hops, then the smallest vertex sequence, through ``allowed`` vertices.

        Labels are (transits, hops, keys of the path): extending a path keeps its order against others of equal
        (transits, hops), so the first label popped at ``dst`` is the answer.
        """
        nodes = self._graph.nodes
        start: tuple[int, int, tuple[tuple[str | int, ...], ...], tuple[str, ...]] = (0, 0, (self._key(src),), (src,))
        heap = [start]
        settled: set[str] = set()
        while heap:
            transits, hops, keys, path = heapq.heappop(heap)
            vertex = path[-1]
            if vertex == dst:
                return list(path)
            if vertex in settled:
                continue
            settled.add(vertex)
            if vertex != src and nodes[vertex]["kind"] == "gpu":
                transits += 1
            for w in self.neighbours(vertex):
                if w not in settled and (w == dst or allowed(w)):
                    heapq.heappush(heap, (transits, hops + 1, (*keys, self._key(w)), (*path, w)))
        return None


def _climb(closure: dict[str, str | None], vertex: str) -> list[str]:
    """From ``vertex`` back down to the closure's GPU, following parents."""
    chain = [vertex]
    parent = closure[vertex]
    while parent is not None:
        chain.append(parent)
        parent = closure[parent]
    return chain
