"""Device memory NCCL keeps for the communicators a rank belongs to: each communicator's per-channel device
structures, and the buffers of the connections its calls have made (ring, tree, PAT, NVLS, point-to-point). Fixed
for the rest of the run once made, invisible to ``torch.cuda.max_memory_allocated`` (NCCL allocates through cuMem,
not through PyTorch's caching allocator), and part of what a real run holds.

Source: NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027 (NCCL 2.30.7; ``git show <commit>:<path>``),
with NCCL's defaults: cuMem on where the driver supports it (``src/misc/cudawrap.cc:47-50``, ``NCCL_CUMEM_ENABLE``
-2: auto), and so runtime connection (``src/init.cc:61``, ``NCCL_RUNTIME_CONNECT`` 1; ``init.cc:1552``: on when
cuMem is).

What a communicator allocates, and when:

- at init, per channel (``src/channel.cc:44-48,60``, ``initChannel``): three device arrays (the shared peer table,
  this communicator's peer pointers, the ring's rank list), each its own cuMem allocation, so each rounded up to the
  allocation granularity (``src/include/alloc.h:317-318`` in ``ncclCuMemAlloc``; ``alloc.h:510-512``: every
  ``ncclCudaCallocAsync`` goes there under cuMem). Channels set up: the collective channels (``init.cc:1554-1555``)
  and up to ``p2pnChannels`` = the collective channels rounded up to a power of two (``src/graph/paths.cc:984-990``,
  ``1007``); with NVLS one more array per NVLS channel (``channel.cc:98``). Per communicator, the device
  communicator and its rank table (``init.cc:587-590``). Resources are not shared between communicators split from
  one another (``init.cc:2415``, ``splitShare`` 0). The work FIFO is host memory (``init.cc:631-643``: device memory
  only through gdrcopy, off by default, ``init.cc:130``);
- connections only when a call first needs them (``init.cc:1553-1560``: with runtime connection, init sets up the
  channels and nothing else; ``src/enqueue.cc:495-505`` marks an algorithm the first time a task uses it;
  ``src/group.cc:147-190`` connects that algorithm alone): a communicator holds the ring's connections only if its
  calls ran a ring, the tree's only if they ran a tree, PAT's and NVLS's likewise. Point-to-point connections are
  made per peer and direction at the first send or receive to that peer (``enqueue.cc:2651-2683``), on
  ``p2pnChannelsPerPeer`` channels;
- protocols are not lazy: a connection holds all three protocols' buffers whatever the calls use
  (``src/transport/p2p.cc:488-490``, ``src/transport/net.cc:916-920`` and ``1100-1103``), and their sizes do not
  depend on which protocols are enabled (``init.cc:822-828``, ``computeBuffSizes``): LL128's buffer is there where
  LL128 is disabled;
- a connection already made on a channel to a peer is not made again (``src/transport.cc:51,58``), whichever
  algorithm asks.

Buffer sizes (``init.cc:810-813``): LL ``8 x 512 x 8 x 16`` B, LL128 ``120 x 640 x 8 x 8`` B, Simple 4 MiB
(``src/include/device.h:26,97-98,114-115``). Each connection end is one allocation, rounded up:

- NVLink / PCIe (``p2p.cc:407-410``, ``486-491``): the receiver holds LL, LL128 and Simple, the sender its control
  block, both rounded to ``CUDA_IPC_MIN`` = 2 MiB (``src/include/comm.h:46``): 10 MiB and 2 MiB; in P2P-read mode
  (Ampere and later over NVLink, ``p2p.cc:333-341``) Simple moves to the sender: 6 MiB and 6 MiB. A pair of ends
  (this rank's send to a peer and receive from one) is 12 MiB either way (NVIDIA/nccl issue #1685's allocation log
  on 8 H100: connections of 10,485,760 and 2,097,152 bytes);
- network, GPUDirect RDMA: the sender holds LL128 and Simple in device memory (LL in host memory), rounded to
  ``CUDA_IPC_MIN`` (``net.cc:916-918``, ``945``): 10 MiB; the receiver all three (``net.cc:1101``), rounded to the
  granularity (``net.cc:1124-1127``): 10 MiB;
- point-to-point over the network uses no per-connection buffers but two pools per communicator, one for sends and
  one for receives, each ``p2pnChannels x NCCL_SHARED_STEPS (16) x P2P_NET_CHUNKSIZE (128 KiB)``
  (``net.cc:646,663-666``, ``925-927``, ``1108-1109``; ``init.cc:818,830-834``), whatever the number of peers;
- NVLS (``src/transport/nvls.cc:423-436``, ``ncclNvlsBufferSetup``): one buffer of ``nvlsChannels x 2 x
  NCCL_NVLS_CHUNKSIZE (128 KiB) x NCCL_STEPS x nHeads``, one head per local rank;
- per channel, a ring connects this rank's predecessor and successor (``src/transport/generic.cc:24-28``); a tree
  its parent and up to ``NCCL_MAX_TREE_ARITY`` = 3 children both ways (``generic.cc:53-60``; ``device.h:192``); PAT,
  for each power of two below the rank count, the ranks that far ahead and behind, both ways (``generic.cc:72-83``).

The allocation granularity, 2 MiB, is the driver's (``cuMemGetAllocationGranularity``, queried at ``alloc.h:317``):
not in NCCL's source; it is what NCCL's own ``CUDA_IPC_MIN`` assumes and what issue #1685's log shows.

Simplifications (stated here):

- a collective communicator has the node profile's collective channels when it holds a whole node's GPUs or stays
  in one node; one holding ``k`` of a node's ``g`` GPUs across nodes has ``coll x k / g`` (at least 1): NCCL's search
  runs over the group's own GPUs and the NICs they reach, as ``plansim.costs.nccl_groups`` prices the same group;
- which algorithms a communicator's calls run is the caller's (``Communicator.algorithms``; ``plansim.step.memory``
  asks the step model's NCCL pick over the range of sizes a group's calls take);
- across nodes, every rank of a ring is a node's boundary on an equal share of the channels (NCCL's rings enter
  and leave a node through different GPUs' NICs), so a rank's ends cross the network on ``1 / local`` of them;
- trees: NCCL's two complementary trees (``src/graph/connect.cc``, ``connectTrees``) make a rank an inner node in
  one and a leaf in the other; across nodes with one rank per node that is (3 + 1) / 2 = 2 network edges per
  channel on average (1 with two ranks), with more, the node's chain head: (3 + 1) / 2 network edges and one
  NVLink edge to the chain; inside one node, the chain's two neighbours; tree and PAT edges are not matched
  against the ring's connections (an upper end where they coincide);
- the world communicator and other groups a framework creates but the step does not use are not counted; a
  pipeline neighbour is a communicator of its own (``plansim.step.memory.communicators``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plansim.costs.nccl import group_channels

__all__ = [
    "CHANNEL_DEVICE_BYTES",
    "COMM_DEVICE_BYTES",
    "CUMEM_GRANULARITY",
    "LL128_BUFFSIZE",
    "LL_BUFFSIZE",
    "NET_P2P_POOL_PER_CHANNEL",
    "NET_PAIR_BYTES",
    "NVLS_BUFFSIZE",
    "P2P_PAIR_BYTES",
    "SIMPLE_BUFFSIZE",
    "Communicator",
    "NcclChannels",
    "communicator_bytes",
    "communicator_channels",
]

MiB = 1 << 20
NCCL_STEPS = 8  # src/include/device.h:26
#: LL: NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS (512) x NCCL_STEPS x sizeof(ncclLLFifoLine) (16 B).
LL_BUFFSIZE = 8 * 512 * NCCL_STEPS * 16  # 524,288 B = 512 KiB (src/init.cc:810-811 DEFAULT_LL_BUFFSIZE)
#: LL128: NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS (640) x NCCL_STEPS x sizeof(uint64_t).
LL128_BUFFSIZE = 120 * 640 * NCCL_STEPS * 8  # 4,915,200 B (src/init.cc:812 DEFAULT_LL128_BUFFSIZE)
#: Simple: NCCL_BUFFSIZE's default, 4 MiB (src/init.cc:813 DEFAULT_BUFFSIZE).
SIMPLE_BUFFSIZE = 1 << 22
#: A connection end's control block (ncclSendMem / ncclRecvMem, padded to MEM_ALIGN 4096: src/include/comm.h:45-75).
CONTROL_BYTES = 4096
#: cuMem's allocation granularity: the driver's, 2 MiB (queried at src/include/alloc.h:317, every allocation rounded
#: up at alloc.h:318); NCCL's CUDA_IPC_MIN (src/include/comm.h:46), to which it rounds connection buffers, is the same.
CUMEM_GRANULARITY = 2 * MiB


def _rounded(n: int) -> int:
    """``n`` bytes as one cuMem allocation holds them: rounded up to the granularity."""
    return -(-n // CUMEM_GRANULARITY) * CUMEM_GRANULARITY


#: NVLink / PCIe, P2P-write mode: the receiving end holds every protocol (src/transport/p2p.cc:486-491), the sending
#: end its control block (p2p.cc:407-410), both rounded to CUDA_IPC_MIN: 10 MiB + 2 MiB. P2P-read mode (p2p.cc:409,
#: 489: Simple on the sender) gives 6 MiB + 6 MiB: one send end and one receive end are 12 MiB either way.
P2P_RECV_END = _rounded(CONTROL_BYTES + LL_BUFFSIZE + LL128_BUFFSIZE + SIMPLE_BUFFSIZE)  # 10 MiB
P2P_SEND_END = _rounded(CONTROL_BYTES)  # 2 MiB
P2P_PAIR_BYTES = P2P_SEND_END + P2P_RECV_END  # 12 MiB
#: Network under GPUDirect RDMA: the sender's LL128 and Simple in device memory, LL in host memory (src/transport/
#: net.cc:916-918), rounded to CUDA_IPC_MIN (net.cc:945); the receiver's three protocols in device memory
#: (net.cc:1101), rounded to the granularity (net.cc:1124-1127; control blocks in host memory, net.cc:1114-1115).
NET_SEND_END = _rounded(LL128_BUFFSIZE + SIMPLE_BUFFSIZE)  # 10 MiB
NET_RECV_END = _rounded(LL_BUFFSIZE + LL128_BUFFSIZE + SIMPLE_BUFFSIZE)  # 10 MiB
NET_PAIR_BYTES = NET_SEND_END + NET_RECV_END  # 20 MiB
#: Per channel, at init: the shared peer table, the communicator's peer pointers and the ring's rank list, three
#: cuMem allocations of a few KiB each (src/channel.cc:44-48, 60), each rounded up to the granularity.
CHANNEL_DEVICE_BYTES = 3 * CUMEM_GRANULARITY
#: Per NVLS channel, at init where NVLS is supported: its NVLS peers (src/channel.cc:98).
NVLS_CHANNEL_DEVICE_BYTES = CUMEM_GRANULARITY
#: Per communicator: the device communicator with its channels, and its rank-to-local-rank table (src/init.cc:587-590).
COMM_DEVICE_BYTES = 2 * CUMEM_GRANULARITY
#: Point-to-point over the network: per p2p channel, NCCL_SHARED_STEPS (16) x P2P_NET_CHUNKSIZE (128 KiB) in each of
#: the communicator's two pools, sends and receives (src/transport/net.cc:646, 666; src/init.cc:818, 830-834).
NET_P2P_POOL_PER_CHANNEL = 16 * (128 << 10)  # 2 MiB
#: NVLS: NCCL_NVLS_CHUNKSIZE (128 KiB) x NCCL_STEPS per channel, twice (reduce and broadcast), per head
#: (src/transport/nvls.cc:426-430).
NVLS_BUFFSIZE = (128 << 10) * NCCL_STEPS
#: Channels NCCL uses at most (MAXCHANNELS, src/include/device.h).
MAX_CHANNELS = 64


@dataclass(frozen=True)
class NcclChannels:
    """What NCCL's topology search finds on a node type (its ``nccl`` section): collective channels, point-to-point
    channels per peer inside the node, NVLS channels (0: no NVLink SHARP), channels per network peer, and the node's
    GPUs (0: unknown, a group across nodes then keeps ``coll``)."""

    coll: int
    p2p_per_peer: int
    nvls: int
    net_p2p_per_peer: int
    gpus_per_node: int = 0


@dataclass(frozen=True)
class Communicator:
    """One NCCL communicator as a rank sees it: ``ranks`` members, ``local`` of them on this rank's node, the
    algorithms its calls run (``ring``, ``tree``, ``pat``, ``nvls``, ``nvls_tree``: NCCL connects each at its first
    use) and, for a point-to-point pair, ``p2p`` (``ranks`` = 2)."""

    name: str
    ranks: int
    local: int
    algorithms: tuple[str, ...] = ("ring",)
    p2p: bool = False

    @property
    def spans_nodes(self) -> bool:
        return self.local < self.ranks


def communicator_channels(comm: Communicator, channels: NcclChannels) -> int:
    """The collective channels of ``comm``: the node's, or across nodes with ``k`` of a node's ``g`` GPUs,
    ``coll x k / g`` (at least 1; the module's first simplification)."""
    return group_channels(channels.coll, comm.local, channels.gpus_per_node, comm.spans_nodes)


def _pow2_up(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(n)))


def _pat_peers(ranks: int) -> int:
    """Distinct peers PAT connects each way: the ranks ``2^i`` ahead and behind for ``2^i < ranks``
    (src/transport/generic.cc:72-83)."""
    return len({d % ranks for i in range(max(1, ranks - 1).bit_length()) if 2**i < ranks for d in (2**i, -(2**i))})


def _tree_edges(comm: Communicator) -> tuple[float, float]:
    """Network and NVLink edges per channel of this rank's trees (the module's simplification on trees)."""
    if not comm.spans_nodes:
        return 0.0, 2.0  # the node's chain: its predecessor and successor
    if comm.local == 1:
        return (1.0 if comm.ranks == 2 else 2.0), 0.0  # inner node (parent, 2 children) of one tree, leaf of the other
    return 2.0, 1.0  # the chain head: (parent + 2 children, parent) over the network, one chain edge


def communicator_bytes(comm: Communicator, channels: NcclChannels) -> int:
    """Device bytes one rank holds for ``comm`` (0 for a communicator of one rank): its channels' structures and the
    connections of the algorithms its calls run.

    >>> ch = NcclChannels(coll=24, p2p_per_peer=32, nvls=0, net_p2p_per_peer=2, gpus_per_node=8)
    >>> init = 32 * CHANNEL_DEVICE_BYTES + COMM_DEVICE_BYTES  # 24 channels, 32 set up for p2p
    >>> communicator_bytes(Communicator("tp", 8, 8), ch) == init + 24 * P2P_PAIR_BYTES  # a ring in a node
    True
    >>> communicator_bytes(Communicator("pp", 2, 1, p2p=True), ch) == 4 * CHANNEL_DEVICE_BYTES + COMM_DEVICE_BYTES + (
    ...     2 * 4 * NET_P2P_POOL_PER_CHANNEL)  # a network peer: 3 channels, 4 for p2p, two pools
    True
    """
    if comm.ranks <= 1:
        return 0
    nch = communicator_channels(comm, channels)
    p2p_channels = _pow2_up(min(nch, MAX_CHANNELS))
    nvls = channels.nvls if comm.local > 1 else 0  # NVLS needs two GPUs of one NVSwitch domain
    total = p2p_channels * CHANNEL_DEVICE_BYTES + nvls * NVLS_CHANNEL_DEVICE_BYTES + COMM_DEVICE_BYTES
    if comm.p2p:
        if comm.spans_nodes:  # the two shared pools, whatever the peers
            return total + 2 * p2p_channels * NET_P2P_POOL_PER_CHANNEL
        return total + channels.p2p_per_peer * P2P_PAIR_BYTES  # a send and a receive end per channel
    cross = 1.0 / comm.local if comm.spans_nodes else 0.0  # ends on the network, share of the channels
    pair = cross * NET_PAIR_BYTES + (1.0 - cross) * P2P_PAIR_BYTES
    algorithms = set(comm.algorithms)
    conns = 0.0
    if "ring" in algorithms:
        conns += nch * pair
    if "tree" in algorithms:
        net, nvl = _tree_edges(comm)
        conns += nch * (net * NET_PAIR_BYTES + nvl * P2P_PAIR_BYTES)
    if "pat" in algorithms:  # one rank per node (ncclPatEnable): every edge crosses the network
        conns += nch * _pat_peers(comm.ranks) * NET_PAIR_BYTES
    if algorithms & {"nvls", "nvls_tree"} and nvls:  # NVLS_TREE sets up NVLS's buffer too (src/enqueue.cc:496-499)
        conns += nvls * 2 * NVLS_BUFFSIZE * comm.local
    if "nvls_tree" in algorithms and nvls:  # its heads' tree across nodes, on the NVLS channels
        conns += nvls * 2.0 * NET_PAIR_BYTES
    return total + round(conns)
