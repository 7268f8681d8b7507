"""A group of ranks as NCCL's tuner sees it, from the node profile's ``nccl`` section (channels, per-channel
bandwidths, and the per-call costs ``scripts/fit_nccl.py`` fits), memoized per group and message size.

``ring_overhead_s``: what a call costs beyond its bytes at the group's bus bandwidth, as NCCL runs it with
``NCCL_ALGO=Ring`` or, for a registry entry whose ``nccl`` mode is "auto", as NCCL's tuner picks it
(``plansim.costs.nccl``). Both engines add it to such a call in place of the alpha-beta per-step latency (the
analytic engine through ``plansim.step.prepare.ring_call_s``, the discrete-event engine at the call's last phase).
``layer_call``: a layer's tensor-parallel collective as NCCL runs it by default (ring, tree, PAT, or NVLS on one node
that times NVLS calls): its algorithm, bytes per rank and overhead, read by ``plansim.step.prepare.comm_pricer`` and
the discrete-event engine. A node profile without the call-timing fields gets None: the alpha-beta latency applies.
``connected_algorithms``: the algorithms a group's calls run over the sizes they take, for the connections NCCL
makes at their first use (``plansim.costs.nccl_memory``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from plansim.costs.collectives import bytes_sent_per_rank
from plansim.costs.nccl import (
    COLLECTIVES,
    NcclComm,
    NcclTuning,
    NvlsTuning,
    group_channels,
    nccl_call,
    nccl_overhead_s,
    nvls_sent_factor,
)
from plansim.costs.nccl import ring_overhead_s as _costs_ring_overhead_s
from plansim.hardware.cluster import Cluster
from plansim.hardware.schema import NodeSpec

__all__ = ["CALL_SIZES", "LayerCall", "connected_algorithms", "layer_call", "nccl_comm", "ring_overhead_s", "timed"]


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
    channels = group_channels(section.channels, ranks // nodes, node.gpus_per_node, nodes > 1)
    return NcclComm(
        ranks, nodes, section.arch, channels, section.channel_bw_intra_GBps, section.channel_bw_inter_GBps,
        intra=intra, cpu=cpu or section.cpu, nvls_channels=section.nvls_channels if section.nvls_timed else 0,
        nvls_bw_intra=section.nvls_bw_intra_GBps or 0.0, nvls_bw_inter=section.nvls_bw_inter_GBps or 0.0,
    )  # fmt: skip


def _tunings(node: NodeSpec) -> tuple[NcclTuning, NvlsTuning | None]:
    section = node.nccl
    assert section is not None and section.call_us is not None and section.sync_us is not None
    nvls = None
    if section.nvls_timed:
        assert section.nvls_call_us is not None and section.nvls_sync_us is not None
        nvls = NvlsTuning(section.nvls_call_us, section.nvls_sync_us)
    return NcclTuning(section.call_us, section.sync_us, section.ll128_channel_GBps), nvls


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
    per_node = -(-ranks // nodes)  # a group split unevenly over nodes: NCCL's per-node figures at the fuller nodes
    comm = _comm(node, per_node * nodes, nodes)
    overhead = nccl_overhead_s if nccl == "auto" else _costs_ring_overhead_s
    return overhead(comm, collective, n_bytes, _tunings(node)[0], busbw / 1e9)


@dataclass(frozen=True)
class LayerCall:
    """How a layer's collective runs with NCCL's default algorithm (``NCCL_ALGO`` unset): ``algorithm`` (``ring``,
    ``tree``, ``pat`` or ``nvls``), ``sent_factor`` (bytes each rank puts on its link per message byte: the
    ring's ``2 (p - 1) / p`` for an all-reduce, NVLS's ``(p + 1) / p`` to the switch) and ``overhead_s``, what the
    call takes beyond those bytes at the group's bus bandwidth (None: the node does not time NCCL's calls; the
    alpha-beta latency applies)."""

    algorithm: str
    sent_factor: float
    overhead_s: float | None


def layer_call(
    cluster: Cluster, collective: str, ranks: int, nodes: int, n_bytes: float, busbw_Bps: float
) -> LayerCall:
    """A layer's blocking collective (tensor parallelism) as NCCL runs it by default (``plansim.costs.nccl.nccl_call``:
    the algorithm NCCL's own model picks; NVLS where the node times NVLS calls and the group is one node). A ring,
    tree or PAT call moves the ring's bytes (a tree moves about as much per rank, ``nccl_overhead_s``), an NVLS call
    ``(p + 1) / p`` of the message to the switch.
    Both engines ask it: the analytic engine prices ``sent_factor x n_bytes / busbw + overhead_s``, the DES moves
    those bytes as flows and adds ``overhead_s`` at the end."""
    ring = _ring_factor(collective, ranks)
    if ranks <= 1 or n_bytes <= 0 or collective not in COLLECTIVES:
        return LayerCall("ring", ring, 0.0 if timed(cluster) else None)
    nodes = max(1, min(nodes, ranks))
    return _layer_call(cluster.node, collective, ranks, nodes, float(n_bytes), float(busbw_Bps), timed(cluster))


def _ring_factor(collective: str, p: int) -> float:
    """Bytes each rank sends per message byte in a ring (``bytes_sent_per_rank``: an all-reduce's ``2 (p - 1) / p``)."""
    return bytes_sent_per_rank(collective, "ring", p, 1.0) if p > 1 else 0.0


@lru_cache(maxsize=65536)
def _layer_call(
    node: NodeSpec, collective: str, ranks: int, nodes: int, n_bytes: float, busbw: float, is_timed: bool
) -> LayerCall:
    ring = _ring_factor(collective, ranks)
    if not is_timed:
        return LayerCall("ring", ring, None)
    ring_t, nvls_t = _tunings(node)
    per_node = -(-ranks // nodes)
    call = nccl_call(_comm(node, per_node * nodes, nodes), collective, n_bytes, ring_t, nvls_t)
    factor = nvls_sent_factor(ranks) if call.algorithm == "nvls" else ring
    return LayerCall(call.algorithm, factor, max(0.0, call.time_us * 1e-6 - factor * n_bytes / busbw))


#: Message sizes a group's calls take, 4 B (a scalar: a loss, a norm, an overflow flag) to 4 GiB (a bucket, a layer's
#: output), in powers of two.
CALL_SIZES = tuple(float(2**k) for k in range(2, 33))


def connected_algorithms(cluster: Cluster, collectives: tuple[str, ...], ranks: int, nodes: int) -> tuple[str, ...]:
    """The algorithms a group of ``ranks`` over ``nodes`` nodes runs for ``collectives`` at some size of
    ``CALL_SIZES``, as the step model runs its calls (``plansim.costs.nccl.nccl_call``, as ``layer_call``): NCCL
    connects an algorithm's channels at its first call (src/enqueue.cc:495-505, src/group.cc:147-190 at 5067397c).
    Where the node does not time NCCL's calls: the ring, and the tree for an all-reduce across nodes."""
    if ranks <= 1:
        return ()
    nodes = max(1, min(nodes, ranks))
    return _connected(cluster.node, tuple(sorted(set(collectives))), ranks, nodes, timed(cluster))


@lru_cache(maxsize=4096)
def _connected(node: NodeSpec, collectives: tuple[str, ...], ranks: int, nodes: int, is_timed: bool) -> tuple[str, ...]:
    if not is_timed:
        return ("ring", "tree") if "all_reduce" in collectives and nodes > 1 else ("ring",)
    ring_t, nvls_t = _tunings(node)
    per_node = -(-ranks // nodes)
    comm = _comm(node, per_node * nodes, nodes)
    picks = {nccl_call(comm, c, size, ring_t, nvls_t).algorithm for c in collectives for size in CALL_SIZES}
    return tuple(sorted(picks))
