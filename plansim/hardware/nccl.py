"""A group of ranks as NCCL's tuner sees it, from the node profile's ``nccl`` section."""

from __future__ import annotations

from functools import lru_cache

from plansim.costs.nccl import COLLECTIVES, NcclComm, NcclTuning, nccl_overhead_s
from plansim.costs.nccl import ring_overhead_s as _costs_ring_overhead_s
from plansim.hardware.cluster import Cluster
from plansim.hardware.schema import NodeSpec

__all__ = ["nccl_comm", "ring_overhead_s", "timed"]


def timed(cluster: Cluster) -> bool:
    """Whether ``cluster``'s node profile times NCCL's calls (its ``nccl`` section has the call-timing fields)."""
    return cluster.node.nccl is not None and cluster.node.nccl.timed


def nccl_comm(cluster: Cluster, ranks: int, nodes: int, *, cpu: str | None = None) -> NcclComm:
    """The communicator of ``ranks`` over ``nodes`` nodes of ``cluster``'s type (as many ranks on each node;
    ``cpu`` overrides the profile's host CPU vendor).

    Raises
    ------
    ValueError
        The node profile has no ``nccl`` section.
    """
    return _comm(cluster.node, ranks, nodes, cpu)


def _comm(node: NodeSpec, ranks: int, nodes: int, cpu: str | None = None) -> NcclComm:
    section = node.nccl
    if section is None or not section.timed:
        raise ValueError(f"node type {node.name} has no nccl call-timing fields")
    assert section.arch is not None and section.channel_bw_intra_GBps and section.channel_bw_inter_GBps
    intra = "pci" if node.intra_node.topology == "pcie" else "nvlink"
    return NcclComm(
        ranks, nodes, section.arch, section.channels, section.channel_bw_intra_GBps, section.channel_bw_inter_GBps,
        intra=intra, cpu=cpu or section.cpu,
    )  # fmt: skip


def ring_overhead_s(
    cluster: Cluster,
    collective: str,
    ranks: int,
    nodes: int,
    n_bytes: float,
    busbw_Bps: float,
    nccl: str = "ring",
) -> float | None:
    """Seconds a collective of ``n_bytes`` among ``ranks`` on ``nodes`` nodes costs beyond its bytes at the group's
    bus bandwidth ``busbw_Bps``, as NCCL runs it: ``nccl`` "ring" (``NCCL_ALGO=Ring``,
    ``plansim.costs.nccl.ring_overhead_s``) or "auto" (``NCCL_ALGO`` unset, the call NCCL's tuner picks,
    ``plansim.costs.nccl.nccl_overhead_s``; a registry entry's ``nccl``). Both engines add it to the call's wire time
    in place of a per-step latency. None where the node profile does not time NCCL's calls (the alpha-beta latency
    then applies)."""
    if not timed(cluster):
        return None
    if collective not in COLLECTIVES or ranks <= 1 or n_bytes <= 0:
        return 0.0
    if nccl not in ("ring", "auto"):
        raise ValueError(f"nccl={nccl!r}: ring or auto")
    nodes = max(1, min(nodes, ranks))
    return _ring_overhead(cluster.node, collective, ranks, nodes, float(n_bytes), float(busbw_Bps), nccl)


@lru_cache(maxsize=65536)
def _ring_overhead(
    node: NodeSpec, collective: str, ranks: int, nodes: int, n_bytes: float, busbw: float, nccl: str = "ring"
) -> float:
    section = node.nccl
    assert section is not None and section.call_us is not None and section.sync_us is not None
    per_node = -(-ranks // nodes)  # a group split unevenly over nodes: NCCL's per-node figures at the fuller nodes
    comm = _comm(node, per_node * nodes, nodes)
    tuning = NcclTuning(section.call_us, section.sync_us)
    overhead = nccl_overhead_s if nccl == "auto" else _costs_ring_overhead_s
    return overhead(comm, collective, n_bytes, tuning, busbw / 1e9)
