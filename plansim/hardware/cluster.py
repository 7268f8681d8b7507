"""A sized cluster of one node type, and the effective links that collectives and point-to-point sends see:
``group_link(size, stride)`` for a group of ranks, ``p2p_link(src, dst)`` for a send, each from the node profile's
bandwidths and efficiencies and the oversubscription of the highest fabric tier the group crosses, memoized.

Ranks are node-major: ranks ``0 .. gpus_per_node-1`` are node 0, the next ``gpus_per_node`` node 1, and so on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import networkx as nx

from plansim.errors import PlansimError
from plansim.hardware.link import Link
from plansim.hardware.schema import GPUSpec, NodeSpec
from plansim.hardware.topology import build_topology, topology_size
from plansim.limits import refuse_work

__all__ = ["Cluster"]

_SELF = Link(bandwidth_Bps=math.inf, latency_s=0.0)


@dataclass(frozen=True, repr=False)
class Cluster:
    """``num_gpus`` GPUs of one node type (built by ``load_hardware``).

    Examples
    --------
    >>> from plansim.hardware import load_hardware
    >>> cluster = load_hardware("dgx-a100", gpus=16)
    >>> cluster.num_nodes, cluster.node_of(9)
    (2, 1)
    >>> cluster.group_link(8, 1).bandwidth_Bps / 1e9  # tensor parallel inside a node: measured NVLink busbw
    230.0
    >>> cluster.group_link(2, 8).bandwidth_Bps / 1e9  # data parallel across nodes: one HDR NIC per rank x 0.96
    24.0
    """

    node: NodeSpec
    gpu: GPUSpec
    num_gpus: int

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, num_gpus={self.num_gpus})"

    def __hash__(self) -> int:
        return hash((self.node, self.gpu, self.num_gpus))

    @property
    def name(self) -> str:
        """The node type's name, e.g. ``dgx-a100``."""
        return self.node.name

    @property
    def gpus_per_node(self) -> int:
        """GPUs in one node."""
        return self.node.gpus_per_node

    @property
    def num_nodes(self) -> int:
        """Nodes used (a partly used node counts as one)."""
        return -(-self.num_gpus // self.gpus_per_node)

    @cached_property
    def topology(self) -> nx.Graph:
        """The cluster as a graph of GPUs, intra-node switches, NICs and network switches (see ``topology``);
        refused before it is built when it would hold more vertices and links than ``PLANSIM_MAX_TOPOLOGY``
        (``plansim.limits.WORK``: a few hundred bytes each)."""
        refuse_work(
            "topology", topology_size(self.node, self.num_gpus), f"the topology graph of {self.num_gpus:,} GPUs",
            "use fewer GPUs or the analytic engine (--engine analytic; plan: --no-des); link names follow the same "
            "pattern at any count (plansim hardware --links -g 64)",
        )  # fmt: skip
        return build_topology(self.node, self.num_gpus)

    def node_of(self, rank: int) -> int:
        """The node that holds ``rank``.

        >>> from plansim.hardware import load_hardware
        >>> load_hardware("dgx-a100", gpus=16).node_of(7)
        0
        """
        self._check_rank(rank)
        return rank // self.gpus_per_node

    @cached_property
    def _links(self) -> dict[tuple[str, int, int], Link]:
        """``group_link`` and ``p2p_link`` memo (a planner asks for the same links thousands of times)."""
        return {}

    def group_link(self, size: int, stride: int) -> Link:
        """Effective per-rank link of a collective among ranks ``r, r+stride, ..., r+(size-1)*stride``.

        The bandwidth is a bus bandwidth in the nccl-tests sense (link efficiency applied), so a ring all-reduce of
        ``S`` bytes takes about ``2 (size-1)/size * S / bandwidth_Bps`` plus latency terms.

        * One member: ``Link(inf, 0)``.
        * The group fits in one node (``stride*(size-1) < gpus_per_node``): the node's measured all-reduce bus
          bandwidth (``bandwidth_per_gpu`` x efficiency) and the per-step intra-node latency.
        * Otherwise the group spans nodes with ``k = min(size, max(1, gpus_per_node // stride))`` members per node.
          NCCL drives one ring per NIC and every ring crosses each node boundary once, so the group's bus bandwidth
          is the inter-node bandwidth its ``k`` members own: ``k`` per-GPU NIC shares (``count * bandwidth /
          gpus_per_node``) times the NIC efficiency, capped by the intra-node bus bandwidth that feeds the rings.
          That is divided by the oversubscription of the highest fabric tier the group crosses (tiers store it
          cumulatively). The latency is that of the slowest hop on the ring, an inter-node one: intra-node step +
          NIC + switch traversals (up to the highest tier and back down).

        Groups are assumed laid out in contiguous blocks of ``size*stride`` ranks (as Megatron-style rank grids
        are); the highest tier is the worst over all such blocks, since the groups run in lockstep.

        Raises
        ------
        PlansimError
            If ``size`` or ``stride`` is below 1, or the group spans more ranks than the cluster has.
        """
        key = ("group", size, stride)
        memo = self._links
        if key not in memo:
            memo[key] = self._group_link(size, stride)
        return memo[key]

    def _group_link(self, size: int, stride: int) -> Link:
        """``group_link`` unmemoized."""
        self._check_group(size, stride)
        if size == 1:
            return _SELF
        if stride * (size - 1) < self.gpus_per_node:
            return self.node.intra_link
        per_node = min(size, max(1, self.gpus_per_node // stride))
        nics = self.node.nics
        bandwidth = min(self.node.intra_node.allreduce_busbw_Bps, per_node * self.node.nic_share_Bps * nics.efficiency)
        tier = self._highest_tier(size * stride)
        return Link(bandwidth / self.node.fabric[tier].oversubscription, self._inter_node_latency(tier))

    def p2p_link(self, src_rank: int, dst_rank: int) -> Link:
        """Effective link of a point-to-point send from ``src_rank`` to ``dst_rank`` (pipeline stages).

        Same rank: ``Link(inf, 0)``. Same node: the intra-node effective link. Different nodes: the sender's
        per-GPU NIC share times the NIC efficiency, divided by the oversubscription of the highest tier between the
        two nodes, with the inter-node latency up to that tier.

        >>> from plansim.hardware import load_hardware
        >>> link = load_hardware("dgx-1", gpus=16).p2p_link(0, 8)
        >>> link.bandwidth_Bps / 1e9  # one EDR NIC shared by two V100s, at 80 %
        5.0
        """
        key = ("p2p", src_rank, dst_rank)
        memo = self._links
        if key not in memo:
            memo[key] = self._p2p_link(src_rank, dst_rank)
        return memo[key]

    def _p2p_link(self, src_rank: int, dst_rank: int) -> Link:
        """``p2p_link`` unmemoized."""
        src, dst = self.node_of(src_rank), self.node_of(dst_rank)
        if src_rank == dst_rank:
            return _SELF
        if src == dst:
            return self.node.intra_link
        tier = self._tier_spanning(min(src, dst), max(src, dst))
        bandwidth = self.node.nic_share_Bps * self.node.nics.efficiency / self.node.fabric[tier].oversubscription
        return Link(bandwidth, self._inter_node_latency(tier))

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.num_gpus:
            raise PlansimError(
                f"rank {rank} is outside the cluster: {self.name} x {self.num_gpus} has ranks 0..{self.num_gpus - 1}"
            )

    def _check_group(self, size: int, stride: int) -> None:
        if size < 1 or stride < 1:
            raise PlansimError(f"group size ({size}) and stride ({stride}) must be at least 1")
        if stride * (size - 1) >= self.num_gpus:
            raise PlansimError(
                f"a group of {size} ranks at stride {stride} spans {stride * (size - 1) + 1} ranks but the cluster has "
                f"{self.num_gpus} GPUs: use a smaller group or more GPUs"
            )

    def _tier_spanning(self, first_node: int, last_node: int) -> int:
        """Index of the innermost fabric tier whose one switch domain holds both nodes."""
        for i, tier in enumerate(self.node.fabric):
            if tier.group(first_node) == tier.group(last_node):
                return i
        raise AssertionError("load_hardware checks that the outermost tier reaches every node")

    @cached_property
    def _tiers_by_block(self) -> dict[int, int]:
        """``_highest_tier`` memo (a planner asks for the same few block sizes thousands of times)."""
        return {}

    def _highest_tier(self, block: int) -> int:
        """Highest tier crossed by any contiguous block of ``block`` ranks."""
        memo = self._tiers_by_block
        if block not in memo:
            memo[block] = self._scan_highest_tier(block)
        return memo[block]

    def _scan_highest_tier(self, block: int) -> int:
        per_node = self.gpus_per_node
        blocks = range(max(1, self.num_gpus // block))
        return max(
            self._tier_spanning(b * block // per_node, (min((b + 1) * block, self.num_gpus) - 1) // per_node)
            for b in blocks
        )

    def _inter_node_latency(self, tier: int) -> float:
        """Latency of one inter-node hop that climbs to fabric tier ``tier``: intra-node step, NIC, switches."""
        fabric = self.node.fabric
        switches = fabric[tier].latency_s + 2 * sum(t.latency_s for t in fabric[:tier])
        return self.node.intra_node.latency_s + self.node.nics.latency_s + switches
