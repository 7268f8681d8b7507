"""Device memory NCCL keeps for the communicators a rank belongs to: the per-channel, per-peer buffers of its ring,
tree, NVLS and point-to-point connections. Fixed for the whole run, invisible to ``torch.cuda.max_memory_allocated``
(NCCL allocates with cudaMalloc / cuMem, not through PyTorch's caching allocator), and part of what a real run can
use.

Source: NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027 (``git show <commit>:<path>``):

- buffer sizes per protocol, ``src/init.cc`` (``DEFAULT_LL_BUFFSIZE``, ``DEFAULT_LL128_BUFFSIZE``,
  ``DEFAULT_BUFFSIZE``, ``computeBuffSizes``) from the constants of ``src/include/device.h`` (``NCCL_STEPS`` = 8,
  ``NCCL_LL_LINES_PER_THREAD`` = 8, ``NCCL_LL_MAX_NTHREADS`` = 512, 16-byte ``ncclLLFifoLine``,
  ``NCCL_LL128_ELEMS_PER_THREAD`` = 120, ``NCCL_LL128_MAX_NTHREADS`` = 640);
- a point-to-point (NVLink / PCIe) connection holds one buffer per protocol, the receiver all of them, except that
  in P2P-read mode the Simple buffer sits on the sender (``src/transport/p2p.cc``, ``p2pSendSetup`` and
  ``p2pRecvSetup``): a rank in a ring (receiving from its predecessor, sending to its successor) therefore holds one
  connection's set per channel whatever the mode;
- a network connection holds its LL128 and Simple buffers in device memory when GPUDirect RDMA is used, the LL
  buffer in host memory (``src/transport/net.cc``, ``sendProxyConnect``: ``p != NCCL_PROTO_LL && useGdr``);
  point-to-point operations over the network use shared buffers of ``P2P_NET_CHUNKSIZE`` (128 KiB) x ``NCCL_STEPS``
  per channel (``src/init.cc``);
- trees: ``NCCL_MAX_TREE_ARITY`` = 3 children and one parent per channel (``src/include/device.h``); NCCL builds
  two complementary trees (``src/graph/connect.cc``, ``connectTrees``), so a rank that is an inner node with three
  children in one tree is a leaf-side chain member (parent and one child) in the other: 3 edges per channel on
  average for the worst rank, each edge a connection in each direction;
- NVLS (NVLink SHARP, Hopper and later on NVSwitch): ``src/transport/nvls.cc`` (``nvlsBufferSetup``:
  ``buffSize = nvlsChunkSize x NCCL_STEPS``, ``nvlsPerRankSize = nChannels x 2 x buffSize``,
  ``nvlsTotalSize = nvlsPerRankSize x nHeads``; ``NCCL_NVLS_CHUNKSIZE`` = 128 KiB; ``NVLS_NCHANNELS_SM90`` = 16;
  one head per local rank);
- channels per network peer for point-to-point: ``src/graph/paths.cc`` (``ncclTopoGetNchannels``: at least one per
  NIC and ``ceil(NIC GB/s / NCCL_P2P_PER_CHANNEL_NET_BW = 14)``, 2 when no NIC is local).

Simplifications (stated here): a collective communicator gets the node profile's collective
channel count whether it stays in a node or not (NCCL's search usually finds fewer across nodes, so this is the
upper end); the ring's buffers at a node boundary are counted as one point-to-point set; the world communicator and
other groups a framework creates but the step does not use are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CONNECTION_SET_BYTES",
    "LL128_BUFFSIZE",
    "LL_BUFFSIZE",
    "NET_P2P_BUFFSIZE",
    "NVLS_BUFFSIZE",
    "SIMPLE_BUFFSIZE",
    "Communicator",
    "NcclChannels",
    "communicator_bytes",
]

NCCL_STEPS = 8  # src/include/device.h
#: LL: NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS x sizeof(ncclLLFifoLine) (16 B).
LL_BUFFSIZE = 8 * 512 * NCCL_STEPS * 16  # 524,288 B = 512 KiB (src/init.cc DEFAULT_LL_BUFFSIZE)
#: LL128: NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS x sizeof(uint64_t).
LL128_BUFFSIZE = 120 * 640 * NCCL_STEPS * 8  # 4,915,200 B = 4.6875 MiB (src/init.cc DEFAULT_LL128_BUFFSIZE)
#: Simple: NCCL_BUFFSIZE's default, 4 MiB (src/init.cc DEFAULT_BUFFSIZE).
SIMPLE_BUFFSIZE = 1 << 22
#: One point-to-point connection's buffers, every protocol (src/transport/p2p.cc).
CONNECTION_SET_BYTES = LL_BUFFSIZE + LL128_BUFFSIZE + SIMPLE_BUFFSIZE  # 9,633,792 B
#: A network connection's device-resident buffers under GPUDirect RDMA: LL128 and Simple (src/transport/net.cc).
NET_DEVICE_BYTES = LL128_BUFFSIZE + SIMPLE_BUFFSIZE
#: Point-to-point over the network: P2P_NET_CHUNKSIZE (128 KiB) x NCCL_STEPS per channel (src/init.cc).
NET_P2P_BUFFSIZE = (128 << 10) * NCCL_STEPS
#: NVLS: NCCL_NVLS_CHUNKSIZE (128 KiB) x NCCL_STEPS per channel, twice (reduce and broadcast), per head.
NVLS_BUFFSIZE = (128 << 10) * NCCL_STEPS
#: Tree edges of the worst rank per channel, averaged over NCCL's two complementary trees: (1 up + 3 down) as an
#: inner node of one, (1 up + 1 down) as a chain member of the other (src/include/device.h NCCL_MAX_TREE_ARITY = 3;
#: src/graph/connect.cc connectTrees).
TREE_EDGES_PER_CHANNEL = (4 + 2) / 2


@dataclass(frozen=True)
class NcclChannels:
    """What NCCL's topology search finds on a node type (its ``nccl`` section): collective channels, point-to-point
    channels per peer inside the node, NVLS channels (0: no NVLink SHARP), and channels per network peer."""

    coll: int
    p2p_per_peer: int
    nvls: int
    net_p2p_per_peer: int


@dataclass(frozen=True)
class Communicator:
    """One NCCL communicator as a rank sees it: ``ranks`` members, ``local`` of them on this rank's node, whether
    it runs all-reduces (the tree is built for those) and, for a point-to-point pair, ``p2p`` (``ranks`` = 2)."""

    name: str
    ranks: int
    local: int
    all_reduce: bool = False
    p2p: bool = False

    @property
    def spans_nodes(self) -> bool:
        return self.local < self.ranks


def communicator_bytes(comm: Communicator, channels: NcclChannels) -> int:
    """Device bytes one rank's buffers take in ``comm`` (0 for a communicator of one rank).

    >>> ch = NcclChannels(coll=24, p2p_per_peer=32, nvls=0, net_p2p_per_peer=2)
    >>> communicator_bytes(Communicator("tp", 8, 8), ch) == 24 * CONNECTION_SET_BYTES   # a ring in a node
    True
    >>> communicator_bytes(Communicator("pp", 2, 1, p2p=True), ch) == 2 * 2 * NET_P2P_BUFFSIZE  # a network peer
    True
    """
    if comm.ranks <= 1:
        return 0
    if comm.p2p:
        if comm.spans_nodes:  # shared network buffers, this rank's send and receive ends
            return channels.net_p2p_per_peer * 2 * NET_P2P_BUFFSIZE
        return channels.p2p_per_peer * CONNECTION_SET_BYTES
    total = channels.coll * CONNECTION_SET_BYTES  # the ring
    if comm.all_reduce and comm.spans_nodes:  # the tree, built for all-reduces across nodes
        total += round(channels.coll * TREE_EDGES_PER_CHANNEL * CONNECTION_SET_BYTES)
    if channels.nvls and comm.local > 1 and not comm.spans_nodes:  # NVLS inside one NVSwitch domain
        total += channels.nvls * 2 * NVLS_BUFFSIZE * comm.local
    return total
