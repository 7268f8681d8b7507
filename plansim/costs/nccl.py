"""NCCL's own cost model of a collective, and its choice of algorithm and protocol by message size and rank count.

A transcription of the model NCCL uses to pick how to run each collective (NVIDIA/nccl, ``src/graph/tuning.cc``:
``ncclTopoTuneModel`` fills a latency and a bandwidth per collective x algorithm x protocol, from the defaults in
``ncclTunerConstantsDefaults``; ``ncclTopoGetAlgoTime`` turns them into a time, and the enqueue path takes the
fastest enabled pair). Units are NCCL's: microseconds and GB/s (so ``bytes / (1000 * GB/s)`` is microseconds).

What it brings that an alpha-beta model with one link does not: the latency of a ring grows with the number of
ranks (``2 (n - 1)`` steps for an all-reduce, inter-node steps at the network's latency), a tree's with the log of
the node count; the small-message protocols (LL, LL128) trade bandwidth for latency, so bandwidth falls for small
messages; each algorithm and protocol has its own ceiling per channel; and NCCL switches between them where their
times cross.

What the caller supplies is what NCCL's topology search finds on a machine (``ncclTopoCompute``): the number of
channels and the bandwidth of one channel within a node and across nodes (``bwIntra``/``bwInter``), the link type
inside a node, and the extra network latency of the graph (``latencyInter``, usually 0). Supported: the ring, the
tree, NVLS (NVLink SHARP, one node) and PAT (one GPU per node) for all-reduce, all-gather and reduce-scatter; CollNet
(SHARP in the switches) is off, as it is by default. ``NCCL_ALGO``/``NCCL_PROTO`` overrides are ``algorithms`` and
``protocols`` arguments.

Calls as they run, beside NCCL's model: a ring (``ring_time_us``: ``src/enqueue.cc``'s channels and chunks, the
costs per synchronisation and per call and a thread block's LL128 rate, ``NcclTuning``), a tree all-reduce
(``tree_time_us``: chunks pipelined up and down the node's chain and the double binary tree) and an NVLS all-reduce
on one node (``nvls_time_us``, ``NvlsTuning``), the tunings fitted by ``scripts/fit_nccl.py`` to published
nccl-tests curves (``calibration/nccl-tests-a100.yaml``; ``--nvls``: ``calibration/nccl-tests-h100.yaml``).
``nccl_call`` is a call with ``NCCL_ALGO`` unset, the fastest as run of the pairs NCCL weighs (monotone in every
bandwidth); ``tuned_call`` NCCL's own pick, timed as run (what the fits model); ``ring_overhead_s`` and
``nccl_overhead_s`` what a call adds to its bytes at the group's bus bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "NVLS_MAX_ARITY",
    "PROTOCOLS",
    "NcclChoice",
    "NcclComm",
    "NcclTuning",
    "NvlsTuning",
    "algorithm_time_us",
    "bandwidth_GBps",
    "choose",
    "group_channels",
    "latency_us",
    "nccl_call",
    "nccl_overhead_s",
    "nvls_channels_used",
    "nvls_chunk_bytes",
    "nvls_sent_factor",
    "nvls_time_us",
    "ring_call",
    "ring_overhead_s",
    "ring_time_us",
    "step_rounds_bytes",
    "tree_time_us",
    "tuned_call",
]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
#: NCCL's algorithms this model prices, in NCCL's order (``NCCL_ALGO_*``), and its protocols (``NCCL_PROTO_*``).
ALGORITHMS = ("tree", "ring", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("LL", "LL128", "Simple")
_COMPUTE = ("volta", "ampere", "hopper", "blackwell")  # NCCL's compute-capability index (sm70, sm80, sm90, sm100)

# ---- ncclTunerConstantsDefaults (src/graph/tuning.cc), per protocol (LL, LL128, Simple) ----------------------------
#: Base latency of a collective, us.
BASE_LATENCY_US = {
    "tree": (6.8, 14.0, 8.4),
    "ring": (6.6, 14.0, 8.4),
    "nvls": (0.0, 0.0, 0.0),
    "nvls_tree": (0.0, 0.0, 0.0),
    "pat": (8.0, 8.0, 8.0),
}
#: Latency of one step by the hardware it crosses (NVLink, PCI, network), us.
HW_LATENCY_US = {
    "nvlink": {
        "tree": (0.6, 1.25, 4.0),
        "ring": (0.6, 1.9, 3.4),
        "nvls": (0.0, 0.0, 25.0),
        "nvls_tree": (0.0, 0.0, 25.0),
        "pat": (0.0, 0.0, 4.0),
    },
    "pci": {
        "tree": (1.0, 1.9, 4.0),
        "ring": (1.0, 2.5, 5.7),
        "nvls": (0.0, 0.0, 0.0),
        "nvls_tree": (0.0, 0.0, 0.0),
        "pat": (0.0, 0.0, 4.0),
    },
    "net": {
        "tree": (5.0, 8.5, 14.0),
        "ring": (2.7, 4.0, 14.0),
        "nvls": (0.0, 0.0, 18.0),
        "nvls_tree": (0.0, 0.0, 20.9),
        "pat": (0.0, 0.0, 14.0),
    },
}
#: The LL protocol's ceiling, GB/s: rows by GPU on one node, by CPU vendor across nodes (``llMaxBws``); columns
#: one node, two nodes, more.
LL_MAX_BW = {
    ("node", "volta"): (39.0, 39.0, 20.4),
    ("node", "ampere"): (87.7, 22.5, 19.0),
    ("node", "hopper"): (141.0, 45.0, 35.0),
    ("node", "blackwell"): (282.0, 90.0, 70.0),
    ("net", "intel"): (39.0, 39.0, 20.4),
    ("net", "amd"): (87.7, 22.5, 19.0),
}
#: Ceilings per channel, GB/s, by GPU; columns one node, two nodes, more.
PER_CHANNEL_RING_LL128_BW = {
    "volta": (20.0,) * 3,
    "ampere": (20.0,) * 3,
    "hopper": (36.7,) * 3,
    "blackwell": (40.0,) * 3,
}
PER_CHANNEL_TREE_LL128_BW = {
    "volta": (20.0, 20.0, 20.0),
    "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 29.0),
    "blackwell": (55.6, 31.67, 20.0),
}
PER_CHANNEL_TREE_BW = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (38.7, 41.4, 36.0),
    "blackwell": (70.0, 42.8, 24.0),
}
PER_CHANNEL_NVLS_TREE_BW = {
    "volta": (26.5, 18.5, 10.0),
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (0.0, 57.7, 45.5),
    "blackwell": (0.0, 96.0, 80.0),
}
#: Most NVLS heads (``NCCL_MAX_NVLS_ARITY``, src/include/device.h): the NVLS graph's channels, one per GPU of the node
#: (``ncclTopoCompute`` forces ``minChannels = maxChannels`` on one node, src/graph/search.cc).
NVLS_MAX_ARITY = 32
#: NVLink SHARP's efficiency by GPU (``nvlsEfficiency``).
NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
#: The tree all-reduce's bandwidth correction for medium sizes, per protocol, by log2(bytes / 64) from 0 (64 B) to
#: 23 (``treeCorrectionFactor``).
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
           1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9,
              0.9, 1.0, 1.0, 1.0),
    "Simple": (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7,
               0.8, 0.9, 0.9, 0.9),
}  # fmt: skip
#: Network post overhead per inter-node ring step, us (``getNetOverhead``: 1 on Intel and other CPUs, 2 on AMD),
#: three times that for Simple.
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}


def group_channels(node_channels: int, per_node: int, gpus_per_node: int, spans_nodes: bool) -> int:
    """The collective channels NCCL's topology search finds for a communicator with ``per_node`` ranks on each node
    (of ``gpus_per_node`` GPUs, whose whole node finds ``node_channels``): the node's, unless it spans nodes holding
    only part of each, then that share of them (at least 1). NCCL searches a communicator's rings over its own ranks'
    GPUs and the NICs they reach (src/graph/search.cc, ``ncclTopoCompute``, at 5067397c; one GPU's path to the network
    is its PCIe link, src/graph/topo.cc:657): ranks holding k of a node's GPUs own k / gpus_per_node of its NICs, so
    the group's bus bandwidth is theirs (as ``plansim.hardware.cluster.Cluster.group_link`` prices its bytes).

    >>> group_channels(24, 1, 8, True), group_channels(24, 8, 8, True), group_channels(24, 2, 8, False)
    (3, 24, 24)
    """
    if spans_nodes and 0 < per_node < gpus_per_node:
        return max(1, node_channels * per_node // gpus_per_node)
    return node_channels


@dataclass(frozen=True)
class NcclComm:
    """A communicator as NCCL's tuner sees it: ``ranks`` over ``nodes`` (as many per node), the GPU generation
    (volta, ampere, hopper, blackwell), the link inside a node (nvlink or pci), the CPU vendor (intel or amd: the LL
    ceiling across nodes and the network overhead), and what the topology search found: ``channels`` (ring and tree)
    with ``bw_intra``/``bw_inter`` GB/s each, ``nvls_channels`` (the CTAs an NVLS call runs on, ``comm->nvlsChannels``;
    0: no NVLink SHARP) and the NVLS graph's bandwidth per head ``nvls_bw_intra``/``nvls_bw_inter`` GB/s (the graph
    has one channel per GPU of the node; 0: none found), the graph's extra network latency in us, and whether the tree
    is a plain (unbalanced) tree (``tree_pattern_plain``: NCCL takes 15% off)."""

    ranks: int
    nodes: int
    gpu: str
    channels: int
    bw_intra: float
    bw_inter: float
    intra: str = "nvlink"
    cpu: str = "intel"
    nvls_channels: int = 0
    nvls_bw_intra: float = 0.0
    nvls_bw_inter: float = 0.0
    latency_inter_us: float = 0.0
    tree_pattern_plain: bool = False

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.nodes < 1 or self.ranks % self.nodes:
            raise ValueError(f"ranks={self.ranks} over nodes={self.nodes}: as many ranks on every node")
        if self.gpu not in _COMPUTE or self.intra not in ("nvlink", "pci") or self.cpu not in NET_OVERHEAD_US:
            raise ValueError(f"gpu {self.gpu!r} (one of {_COMPUTE}), intra {self.intra!r}, cpu {self.cpu!r}")

    @property
    def per_node(self) -> float:
        return self.ranks / self.nodes

    @property
    def _column(self) -> int:  # NCCL's index2: one node, two, more
        return min(self.nodes, 3) - 1


def _log2i(n: int) -> int:
    """NCCL's ``log2i``: floor(log2 n), -1 for 0."""
    return n.bit_length() - 1


def _steps(collective: str, ranks: int) -> int:
    return 2 * (ranks - 1) if collective == "all_reduce" else ranks - 1


def _nvls_heads(c: NcclComm) -> int:
    """Channels of NCCL's NVLS graph: one head per GPU of the node (0 where no NVLS graph bandwidth is known)."""
    return min(NVLS_MAX_ARITY, int(c.per_node)) if c.nvls_bw_intra > 0 else 0


def _enabled(c: NcclComm, collective: str, algorithm: str, protocol: str) -> bool:
    """Whether NCCL considers the pair at all (``ncclTopoTuneModel``'s skips and disables, CollNet off)."""
    sharded = collective in ("all_gather", "reduce_scatter")
    if algorithm == "pat" and (not sharded or protocol != "Simple" or c.nodes != c.ranks):
        return False  # PAT: all-gather and reduce-scatter with one GPU per node (ncclPatEnable), Simple only
    if algorithm in ("nvls", "nvls_tree"):
        if protocol != "Simple" or c.nvls_channels < 1 or _nvls_heads(c) < 2 or NVLS_EFFICIENCY[c.gpu] == 0:
            return False  # the NVLS graph needs two channels (heads) or more; no NVLS graph without a bandwidth
        if algorithm == "nvls_tree" and (c.nodes == 1 or sharded):
            return False
        if algorithm == "nvls" and c.nodes > 1:
            return False  # across nodes NVLS needs CollNet
    if algorithm == "tree" and sharded:
        return False
    # LL128 needs NVLink inside the node (typeIntra <= PATH_NVB) and one GPU generation
    return not (protocol == "LL128" and c.intra != "nvlink")


@lru_cache(maxsize=65536)  # pure, and asked again for every call of the same shape
def bandwidth_GBps(c: NcclComm, collective: str, algorithm: str, protocol: str) -> float:
    """NCCL's algorithm bandwidth (``comm->bandwidths``), GB/s; 0 where the pair is not used."""
    if c.ranks <= 1 or not _enabled(c, collective, algorithm, protocol):
        return 0.0
    col, gpu = c._column, c.gpu
    nvls = algorithm in ("nvls", "nvls_tree")
    channels = _nvls_heads(c) if nvls else c.channels  # graphs[a]->nChannels: the NVLS graph's heads
    bw = c.bw_intra if c.nodes <= 2 else c.bw_inter
    if nvls:
        intra = c.nvls_bw_intra * NVLS_EFFICIENCY[gpu] * (channels - 1) / channels
        intra *= 2.0 if collective == "all_reduce" else (c.per_node - 1) / c.per_node
        inter = c.nvls_bw_inter * (2 if c.nodes <= 2 and algorithm == "nvls_tree" else 1)
        bw = min(intra, inter, PER_CHANNEL_NVLS_TREE_BW[gpu][col] if algorithm == "nvls_tree" else math.inf)
    bus = channels * bw
    ll_max = LL_MAX_BW[("node", gpu) if c.nodes == 1 else ("net", c.cpu)][col]
    if algorithm == "ring" and protocol == "LL":
        bus = min(ll_max, bus * 0.5)
    if algorithm == "ring" and protocol == "LL128":
        bus = min(bus * 0.92, channels * PER_CHANNEL_RING_LL128_BW[gpu][col])
    if algorithm == "tree" and collective == "all_reduce":
        bus = min(bus * 0.92, channels * PER_CHANNEL_TREE_BW[gpu][col])
    if algorithm == "tree" and protocol == "LL":
        bus = min(bus / 3.8, ll_max)
    if algorithm == "tree" and protocol == "LL128":
        bus = min(bus * (7.0 / 9.0 if c.nodes == 1 else 120.0 / 128.0), channels * PER_CHANNEL_TREE_LL128_BW[gpu][col])
    if algorithm == "tree" and c.tree_pattern_plain:
        bus *= 0.85
    if algorithm == "pat":
        bus *= 0.75
    sharded = collective in ("all_gather", "reduce_scatter")
    if algorithm == "ring" or not sharded:  # bus bandwidth -> algorithm bandwidth
        bus *= c.ranks / _steps(collective, c.ranks) if algorithm in ("ring", "nvls", "nvls_tree") else 0.5
    return bus


def latency_us(c: NcclComm, collective: str, algorithm: str, protocol: str) -> float:
    """NCCL's latency of the pair (``comm->latencies``), us, before ``algorithm_time_us``'s per-call corrections."""
    p = PROTOCOLS.index(protocol)
    hw = HW_LATENCY_US
    intra_lat = hw[c.intra][algorithm][p]
    inter_lat = hw["net"]["tree" if c.per_node == 1 else algorithm][p] + c.latency_inter_us
    if protocol == "Simple":
        inter_lat += c.latency_inter_us  # the flush
    lat = BASE_LATENCY_US[algorithm][p]
    if algorithm == "ring":
        steps = _steps(collective, c.ranks)
        overhead = NET_OVERHEAD_US[c.cpu] * (3 if protocol == "Simple" else 1) if c.nodes > 1 else 0.0
        intra_lat = max(intra_lat, overhead)
        inter_steps = 0 if c.nodes == 1 else (2 if collective == "all_reduce" else 1) * (c.nodes - 1)
        return lat + (steps - inter_steps) * intra_lat + inter_steps * inter_lat
    if algorithm == "tree":
        return lat + 2 * ((c.ranks // c.nodes - 1) * intra_lat + _log2i(c.nodes) * inter_lat)
    if algorithm == "nvls":
        return intra_lat + (inter_lat if c.nodes > 1 else 0.0)
    if algorithm == "nvls_tree":
        return lat + intra_lat + 2 * _log2i(c.nodes) * inter_lat
    return lat + _log2i(c.nodes) * (inter_lat / 3.5) + c.ranks * 2.8  # pat


def algorithm_time_us(c: NcclComm, collective: str, algorithm: str, protocol: str, n_bytes: float) -> float | None:
    """NCCL's predicted time of one call (``ncclTopoGetAlgoTime``, one operation), us; None where the pair is not
    used. The tree all-reduce's bandwidth takes its medium-size correction; a multi-node Simple ring all-reduce whose
    per-channel, per-rank share is 64 bytes or more takes its latency plateau (x1.4 from Ampere on, else x1.9)."""
    bw = bandwidth_GBps(c, collective, algorithm, protocol)
    if bw <= 0:
        return None
    lat = latency_us(c, collective, algorithm, protocol)
    log_size = _log2i(int(n_bytes) >> 6)
    if algorithm == "tree" and collective == "all_reduce" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[protocol][log_size]
    if (
        algorithm == "ring"
        and protocol == "Simple"
        and c.nodes > 1
        and collective == "all_reduce"
        and n_bytes / (c.channels * c.ranks) >= 64
    ):
        lat *= 1.4 if _COMPUTE.index(c.gpu) >= 1 else 1.9
    return lat + n_bytes / (1000 * bw)


@dataclass(frozen=True)
class NcclChoice:
    """The algorithm and protocol NCCL would run, its predicted time (us) and the resulting bus bandwidth (GB/s:
    the nccl-tests convention, bytes x busbw factor / time)."""

    algorithm: str
    protocol: str
    time_us: float
    busbw_GBps: float


def choose(
    c: NcclComm,
    collective: str,
    n_bytes: float,
    *,
    algorithms: tuple[str, ...] = ALGORITHMS,
    protocols: tuple[str, ...] = PROTOCOLS,
) -> NcclChoice:
    """The fastest enabled (algorithm, protocol) for one call of ``n_bytes`` (NCCL's default choice; ``algorithms``
    and ``protocols`` restrict it as ``NCCL_ALGO``/``NCCL_PROTO`` do). Ties go to the earlier pair in NCCL's order."""
    return _choose(c, collective, float(n_bytes), tuple(algorithms), tuple(protocols))


@lru_cache(maxsize=65536)
def _choose(
    c: NcclComm, collective: str, n_bytes: float, algorithms: tuple[str, ...], protocols: tuple[str, ...]
) -> NcclChoice:
    """``choose`` unmemoized."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective {collective!r}: one of {COLLECTIVES}")
    best: tuple[float, str, str] | None = None
    for algorithm in ALGORITHMS:
        for protocol in PROTOCOLS:
            if algorithm not in algorithms or protocol not in protocols:
                continue
            t = algorithm_time_us(c, collective, algorithm, protocol, n_bytes)
            if t is not None and (best is None or t < best[0]):
                best = (t, algorithm, protocol)
    if best is None:
        raise ValueError(f"no algorithm and protocol enabled for {collective} on {c}")
    t, algorithm, protocol = best
    factor = 2 * (c.ranks - 1) / c.ranks if collective == "all_reduce" else (c.ranks - 1) / c.ranks
    return NcclChoice(algorithm, protocol, t, n_bytes * factor / (1000 * t) if t > 0 else math.inf)


# ---- How a call runs: channels, chunks and synchronisations (src/enqueue.cc, src/include/*.h at 5067397c) ---------
#: Threads per channel by protocol (``NCCL_LL_MAX_NTHREADS``, ``NCCL_LL128_MAX_NTHREADS``, ``NCCL_SIMPLE_MAX_NTHREADS``,
#: src/include/device.h) and bytes per thread below which a call drops a channel (``NCCL_*_THREAD_THRESHOLD``,
#: src/include/comm.h; the ring's LL threshold is multiplied by the rank count, src/graph/tuning.cc).
THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
#: Data bytes of one ring step on one channel (``calcCollChunking``): the protocol's buffer over ``NCCL_STEPS`` (8)
#: times the chunk steps; LL carries 8 data bytes per 16-byte line, LL128 15 of every 16 words. LL: 8 lines x 512
#: threads x 8 steps x 16 B = 512 KiB buffer, step 64 KiB, chunk 32 KiB of data. LL128: 120 words x 640 threads x 8
#: steps x 8 B = 4,915,200 B buffer, step 614,400 B, chunk 576,000 B of data. Simple: 4 MiB (``NCCL_BUFFSIZE``
#: default), step 512 KiB, a ring's chunk ``ALLREDUCE_CHUNKSTEPS`` = 4 steps = 2 MiB (src/include/collectives.h).
CHUNK_BYTES = {"LL": 32768, "LL128": 576000, "Simple": 2097152}
#: Synchronisations per ring step: Simple moves a chunk in ``CHUNKSTEPS / SLICESTEPS`` = 2 slices, each with its
#: own flag handshake (``NCCL_MAX_SLICE_PER_CHUNK``); LL and LL128 carry their flags in the data (one per step).
SLICES = {"LL": 1, "LL128": 1, "Simple": 2}
#: Protocols whose receiver polls a flag stored in every line of the data (src/device/prims_ll.h ``readLL``: a flag
#: beside every 4 data bytes of a 16-byte line; src/device/prims_ll128.h: one flag word per 128-byte line, polled
#: with ``needReload``): it consumes each line as it lands, so a step's synchronisation overlaps its data. Simple
#: waits for the sender's step counter before it reads a slice (src/device/prims_simple.h), so they add.
LINE_FLAGGED = ("LL", "LL128")
#: How a step's data is dealt to a channel's threads (NVIDIA/nccl 5067397c): LL128's ``GenericOp``
#: (src/device/prims_ll128.h lines 292-321) deals warp slices round-robin, warp ``w`` taking slices ``w``, ``w +
#: nwarps``, ...; a slice is ``WireWordPerSlice`` = 32 lanes x ``NCCL_LL128_SHMEM_ELEMS_PER_THREAD`` (8) words of
#: 8 B, one word in ``NCCL_LL128_LINEELEMS`` (16) a flag, so 240 x 8 = 1920 data bytes. LL's ``GenericOp``
#: (src/device/prims_ll.h lines 253-304) deals 16-byte lines of 8 data bytes one per thread, round-robin. So a step
#: runs in rounds of one grain per worker, and a step smaller than a round leaves workers idle. Simple is not
#: rounded: its steps are slices of 256 KiB or more at the sizes where NCCL runs it. (grain bytes, worker threads)
ROUND_GRAIN = {"LL": (8, 1), "LL128": (1920, 32)}
#: The ring's bandwidth per protocol relative to the channel's (``ncclTopoTuneModel``: LL half, LL128 0.92).
_RING_EFFICIENCY = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
#: Traffic below which a channel is not worth its CTA: ``scheduleCollTasksToPlan`` (src/enqueue.cc at 5067397c) gives
#: each channel at least 32 KiB of traffic (``MinTrafficPerChannel``), in cells of 32 KiB of traffic; an all-reduce
#: counts 2 bytes of traffic per byte, an all-gather or reduce-scatter the rank count (``ncclFuncTrafficPerByte``),
#: and LL four times that (its 16-byte lines carry 8 data bytes, ``ncclPrepareTasks``).
MIN_TRAFFIC_PER_CHANNEL = 32768


@dataclass(frozen=True)
class NcclTuning:
    """What a node's nccl-tests curve says NCCL's model leaves out, fitted once per node type from published
    measurements (``scripts/fit_nccl.py``; the node profile cites the curve): ``call_us``, the fixed cost of one call
    (kernel launch, the first step's wait for every rank, the last flag's return: what a 1 KB all-reduce costs
    beyond NCCL's latency), and ``sync_us`` per protocol (LL, LL128, Simple), the cost of one synchronisation of a
    ring step between two GPUs of the node, which replaces NCCL's per-hop NVLink latency: for Simple a slice's flag
    handshake, paid before the slice's data; for LL and LL128 the latency of a line from its store on one GPU to its
    flag's poll on the next, which the step's data overlaps (a step costs the larger of the two). A synchronisation
    across the network adds NCCL's own difference between its network and NVLink hop latencies.
    ``ll128_channel_GBps``, where the curve has LL128 sizes, is the data rate one channel's thread block sustains with
    LL128 (GB/s): each of its warps loads a slice, polls the peer's flags, reduces and stores 128-byte lines to the
    peer (src/device/prims_ll128.h), and that loop, not the link, sets the rate; NCCL's tuner assumes 0.92 of the
    link (``ncclTopoTuneModel``), which is what a channel keeps where this is None or higher."""

    call_us: float
    sync_us: tuple[float, float, float]
    ll128_channel_GBps: float | None = None

    def channel_cap_GBps(self, protocol: str) -> float:
        """The most one channel moves with ``protocol``, GB/s, beyond NCCL's own figures (inf: none)."""
        return self.ll128_channel_GBps if protocol == "LL128" and self.ll128_channel_GBps else math.inf


def _channels_used(c: NcclComm, protocol: str, n_bytes: float) -> int:
    """Channels NCCL's tuner allows a ring call (``topoGetAlgoInfo``, src/enqueue.cc): it drops channels while every
    thread would get less than its threshold of bytes. ``_ring_channel_share`` then splits the work."""
    threshold = THREAD_THRESHOLD[protocol] * (c.ranks if protocol == "LL" else 1)
    nc = c.channels
    while nc >= 2 and n_bytes < nc * THREADS[protocol] * threshold:
        nc -= 1
    return nc


@lru_cache(maxsize=65536)  # pure, and asked again for every call of the same shape
def _ring_threads(c: NcclComm, protocol: str, n_bytes: float) -> int:
    """Threads of a ring call's channel (``topoGetAlgoInfo``, src/enqueue.cc lines 2092-2115 at 5067397c): the
    protocol's maximum, halved (while a multiple of 128) while the call's bytes are under channels x threads x the
    thread threshold; Simple adds a synchronisation warp that moves no data, so it is left out here."""
    nc = _channels_used(c, protocol, n_bytes)
    threshold = THREAD_THRESHOLD[protocol] * (c.ranks if protocol == "LL" else 1)
    nt = THREADS[protocol]
    while n_bytes < nc * nt * threshold and nt % 128 == 0:
        nt //= 2
    return max(nt, 96)  # at least 3 warps


def step_rounds_bytes(protocol: str, step_bytes: float, threads: int) -> float:
    """The bytes a step of ``step_bytes`` costs at its channel's rate, rounded up to whole rounds of its threads
    (``ROUND_GRAIN``): each worker (an LL thread, an LL128 warp) moves one grain a round, and a round lasts as long
    whether all workers have a grain or only some. An assumption beside the dealing, which is NCCL's: a channel's
    rate is its workers' together, shared evenly (each has the same memory-level parallelism), so a worker moves
    its grain at the channel's rate over the workers; a step that gives ``k`` of ``W`` workers a grain runs at ``k /
    W`` of the channel's rate. Simple is returned unrounded.

    >>> step_rounds_bytes("LL128", 22_000, 640)  # 12 slices of 1920 B over 20 warps: one round of 20
    38400
    >>> step_rounds_bytes("LL128", 76_800, 640)  # 40 slices: two full rounds
    76800
    >>> step_rounds_bytes("LL", 32768, 512)  # 4096 lines over 512 threads: 8 full rounds
    32768
    """
    if protocol not in ROUND_GRAIN or step_bytes <= 0:
        return step_bytes
    grain, per_worker = ROUND_GRAIN[protocol]
    workers = max(1, threads // per_worker)
    return math.ceil(math.ceil(step_bytes / grain) / workers) * workers * grain


@lru_cache(maxsize=65536)  # pure, and asked again for every call of the same shape
def _ring_channel_share(c: NcclComm, collective: str, protocol: str, n_bytes: float) -> tuple[int, float]:
    """The channels a ring call runs on and the largest channel's share of ``n_bytes``, as
    ``scheduleCollTasksToPlan`` (src/enqueue.cc at 5067397c) splits one call: the traffic (``n`` bytes of NCCL's
    count times its traffic per byte, at least 32 KiB) over the tuner's channels (``_channels_used``) gives a
    channel's budget, rounded to 16 bytes; the work goes out in whole cells of 32 KiB of traffic, a first channel
    taking its budget's worth, the middle ones as many, the last the rest; where that needs more channels than the
    communicator has, the cells past the first channel are spread evenly over the others."""
    count = n_bytes if collective == "all_reduce" else n_bytes / c.ranks  # NCCL's count, in bytes
    per_byte = (2 if collective == "all_reduce" else c.ranks) * (4 if protocol == "LL" else 1)
    n_max = c.channels  # nMaxChannels[kind]: the communicator's channels
    nc = min(_channels_used(c, protocol, n_bytes), n_max)
    budget = math.ceil(int(max(MIN_TRAFFIC_PER_CHANNEL, count * per_byte) // nc) / 16) * 16
    cell = math.ceil(math.ceil(MIN_TRAFFIC_PER_CHANNEL / per_byte) / 16) * 16
    cells = max(1, math.ceil(count / cell))
    per_cell = cell * per_byte
    cpc = min(cells, -(-budget // per_cell))
    lo = cells if n_max == 1 else min(cells, -(-budget // per_cell))
    mid, hi = (cells - lo) // cpc, (cells - lo) % cpc
    if n_max < (lo > 0) + mid + (hi > 0):  # more channels than the communicator has
        mid = n_max - 2
        cpc = (cells - lo) // (mid + 1)
        hi = cpc + (cells - lo) % (mid + 1)
    if hi == 0 and mid != 0:
        hi, mid = cpc, mid - 1
    channels = 1 + mid + (hi > 0)
    largest = max(lo, hi, cpc if mid else 0) * cell
    return channels, min(count, largest) * n_bytes / count


def _ring_step_sync_us(c: NcclComm, collective: str, protocol: str, t: NcclTuning) -> tuple[int, float, int, float]:
    """The ring's steps of one loop on its critical path: ``(intra steps, their sync, inter-node steps, theirs)``, us
    (each Simple step synchronises each of its slices)."""
    p = PROTOCOLS.index(protocol)
    steps = _steps(collective, c.ranks)
    inter_steps = 0 if c.nodes == 1 else (2 if collective == "all_reduce" else 1) * (c.nodes - 1)
    net_extra = max(0.0, HW_LATENCY_US["net"]["ring"][p] - HW_LATENCY_US[c.intra]["ring"][p])
    sync = SLICES[protocol] * t.sync_us[p]
    return steps - inter_steps, sync, inter_steps, sync + SLICES[protocol] * net_extra


def ring_time_us(c: NcclComm, collective: str, protocol: str, n_bytes: float, t: NcclTuning) -> float:
    """The time of one ring call as it runs, us: the call's fixed cost and NCCL's base latency, then the loops of
    the largest channel's share (``_ring_channel_share``) over ``ranks`` chunks, every step of a loop moving one
    chunk to the next GPU (src/device/all_reduce.h ``runRing``; the last loop's chunk shrinks to what is left). With
    Simple a step is its slices' synchronisations, then its data at the channel's bandwidth; with LL and LL128 the
    receiver takes each line as it lands (``LINE_FLAGGED``), so a step costs the larger of its synchronisation and
    its data. A step's data is paid in whole rounds of the channel's workers (``step_rounds_bytes``: LL128 warps'
    1920-byte slices, LL threads' 8-byte lines). So a small call costs its synchronisations, a large one its data. A
    channel's bandwidth is NCCL's figure for the protocol over its channels (a protocol's ceiling, such as LL's, is
    shared by the channels in use), at most the channel's own bandwidth at the protocol's efficiency when small
    calls use fewer channels, and at most what its thread block sustains (``NcclTuning.channel_cap_GBps``)."""
    if c.ranks <= 1 or n_bytes <= 0:
        return 0.0
    bus = bandwidth_GBps(c, collective, "ring", protocol) * _steps(collective, c.ranks) / c.ranks  # GB/s, all
    nc, per_ch = _ring_channel_share(c, collective, protocol, n_bytes)
    own = (c.bw_intra if c.nodes <= 2 else c.bw_inter) * _RING_EFFICIENCY[protocol]
    per_channel = min(bus / nc, own, t.channel_cap_GBps(protocol)) * 1000.0  # bytes per us
    loop = c.ranks * CHUNK_BYTES[protocol]
    full = int(per_ch // loop)
    intra, s_intra, inter, s_inter = _ring_step_sync_us(c, collective, protocol, t)
    threads = _ring_threads(c, protocol, n_bytes)

    def one_loop(chunk: float) -> float:  # one loop of ``ranks`` steps of ``chunk`` bytes
        data = step_rounds_bytes(protocol, chunk, threads) / per_channel
        if protocol in LINE_FLAGGED:
            return intra * max(s_intra, data) + inter * max(s_inter, data)
        return intra * (s_intra + data) + inter * (s_inter + data)

    total = full * one_loop(CHUNK_BYTES[protocol]) if full else 0.0  # the full loops are alike
    if per_ch > full * loop:
        total += one_loop((per_ch - full * loop) / c.ranks)
    base = BASE_LATENCY_US["ring"][PROTOCOLS.index(protocol)]
    return t.call_us + base + total


def ring_call(c: NcclComm, collective: str, n_bytes: float, t: NcclTuning) -> NcclChoice:
    """One ring call (``NCCL_ALGO=Ring``) on its fastest protocol as it runs (``nccl_call`` over the ring alone);
    the bus bandwidth in the nccl-tests sense."""
    return nccl_call(c, collective, n_bytes, t, algorithms=("ring",))


def ring_overhead_s(c: NcclComm, collective: str, n_bytes: float, t: NcclTuning, busbw_GBps: float) -> float:
    """Seconds a ring call takes beyond its bytes at ``busbw_GBps`` (the group's measured large-message bus
    bandwidth, on which the engines move the bytes): the call's fixed cost, the synchronisations that grow with the
    ranks and nodes, and the bandwidth lost by small messages' protocols and fewer channels. Added to the wire time
    at that bandwidth it gives ``ring_call``'s time (never less than the wire time)."""
    if c.ranks <= 1 or n_bytes <= 0:
        return 0.0
    wire_us = n_bytes * _steps(collective, c.ranks) / c.ranks / (1000 * busbw_GBps)
    return max(0.0, ring_call(c, collective, n_bytes, t).time_us - wire_us) * 1e-6


# ---- An NVLS all-reduce as it runs (src/enqueue.cc, src/device/all_reduce.h, src/transport/nvls.cc at 5067397c) ----
#: The NVLS chunk (``NCCL_NVLS_CHUNKSIZE`` default 128 KiB, src/transport/nvls.cc) and ``calcCollChunking``'s cuts for
#: smaller calls: below 64, 8 and 2 times (channels x heads) chunks it falls to 64, 32 and 16 KiB.
NVLS_CHUNK_BYTES = 131072
_NVLS_CHUNK_CUTS = ((64, 65536), (8, 32768), (2, 16384))


@dataclass(frozen=True)
class NvlsTuning:
    """What a node's nccl-tests NVLS curve says NCCL's model leaves out of an NVLS call, fitted once per node type
    (``scripts/fit_nccl.py``): ``call_us``, the fixed cost of a call (launch, the switch's multicast barrier, the
    last flag), and ``sync_us``, the cost of one loop of a channel (its heads' chunks scattered, reduced through the
    switch and gathered, each stage's flags)."""

    call_us: float
    sync_us: float


def nvls_channels_used(c: NcclComm, n_bytes: float) -> int:
    """Channels an NVLS all-reduce of ``n_bytes`` runs on: ``comm->nvlsChannels`` (``topoGetAlgoInfo``), fewer when
    each would carry less than 32 KiB of traffic (``scheduleCollTasksToPlan``)."""
    return max(1, min(c.nvls_channels, math.ceil(2 * n_bytes / MIN_TRAFFIC_PER_CHANNEL)))


def nvls_chunk_bytes(c: NcclComm, channel_bytes: float) -> int:
    """The chunk of an NVLS all-reduce on one node for a channel's share ``channel_bytes`` (``calcCollChunking``,
    called per channel with one channel): 128 KiB, cut for small shares against the heads' concurrent operations."""
    chunk = NVLS_CHUNK_BYTES
    ops = _nvls_heads(c)
    for times, cut in _NVLS_CHUNK_CUTS:
        if channel_bytes < times * ops * chunk and chunk > cut:
            chunk = cut
    return chunk


def nvls_time_us(c: NcclComm, n_bytes: float, t: NvlsTuning) -> float:
    """The time of one NVLS all-reduce on one node as it runs, us. Each channel takes its share of the bytes in
    loops of one chunk per head (``RunWorkColl<AllReduce, NVLS, Simple>``, one-node path): every GPU scatters the
    loop's chunks into the NVLS buffers, each head reduces its chunk through the switch (``multimem.ld_reduce``) and
    stores the sum to every GPU at once (``multimem.st``), every GPU gathers the sums. The bytes move at NCCL's NVLS
    bandwidth (``bandwidth_GBps``: heads x NVLS graph bandwidth x ``nvlsEfficiency`` x (heads - 1) / heads x 2),
    less the share of channels a small call leaves idle; each loop of a channel costs ``sync_us``, each call
    ``call_us``."""
    if c.ranks <= 1 or n_bytes <= 0:
        return 0.0
    bw = bandwidth_GBps(c, "all_reduce", "nvls", "Simple")
    if bw <= 0:
        raise ValueError(f"no NVLS all-reduce on {c}")
    nc = nvls_channels_used(c, n_bytes)
    chunk = nvls_chunk_bytes(c, n_bytes / nc)
    loops = max(1, math.ceil(n_bytes / nc / (_nvls_heads(c) * chunk)))
    return t.call_us + loops * t.sync_us + n_bytes / (1000 * bw * nc / c.nvls_channels)


def nvls_sent_factor(ranks: int) -> float:
    """Bytes each GPU sends to the switch (and receives from it) per byte of an NVLS all-reduce among ``ranks``: the
    reductions read every chunk of its buffer once (``n``), its head chunk's sum is stored once (``n / ranks``)."""
    return (ranks + 1) / ranks


# ---- A tree all-reduce as it runs, and a call as NCCL picks it (NVIDIA/nccl at 5067397c) ---------------------------
#: Data bytes of one tree chunk on one channel (``calcCollChunking``, src/enqueue.cc): the tree runs one step per
#: chunk (``chunkSteps = sliceSteps = 1`` for every algorithm but the Simple ring), so LL 32 KiB and LL128 576,000 B
#: as the ring, Simple one 512 KiB step (4 MiB ``NCCL_BUFFSIZE`` over ``NCCL_STEPS`` = 8).
TREE_CHUNK_BYTES = {"LL": 32768, "LL128": 576000, "Simple": 524288}
#: Threads per channel of a tree call (``comm->maxThreads[NCCL_ALGO_TREE]``, src/graph/tuning.cc
#: ``ncclTopoTuneModel``: ``NCCL_SIMPLE_MAX_NTHREADS`` 512, ``NCCL_LL_MAX_NTHREADS`` 512,
#: ``NCCL_LL128_MAX_NTHREADS`` 640), used by the channel count; the tree's thread thresholds are the protocols'
#: (not multiplied by the ranks, unlike the ring's LL).
TREE_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
#: Threads a tree call then runs with (``topoGetAlgoInfo`` sets ``NCCL_MAX_NTHREADS``, 640, src/enqueue.cc line 2110)
#: and how LL and LL128 split them (src/device/all_reduce.h ``runTreeSplit`` lines 155-164 at 5067397c): 70% of the
#: warps reduce up (448 threads), the rest broadcast down (192); the root runs one group of all of them.
TREE_SPLIT_THREADS = (448, 192)
#: The algorithms NCCL's tuner weighs for each collective with ``NCCL_ALGO`` unset (src/graph/tuning.cc
#: ``ncclTopoTuneModel`` and src/enqueue.cc ``updateCollCostTable``: all-reduce over ring and tree, all-gather and
#: reduce-scatter over ring and PAT (``NCCL_PAT_ENABLE`` defaults to 2: on with one GPU per node, ``ncclPatEnable``);
#: CollNet off by default; NVLS is added for an all-reduce on one node where the node times it (``nccl_call``).
NCCL_DEFAULT_ALGORITHMS = {
    "all_reduce": ("tree", "ring"),
    "all_gather": ("ring", "pat"),
    "reduce_scatter": ("ring", "pat"),
}


@lru_cache(maxsize=256)
def _btree_depth(nodes: int) -> int:
    """Hops from the deepest node to the root of NCCL's binary tree over ``nodes`` nodes (``ncclGetBtree``,
    src/graph/trees.cc: a node's parent flips its lowest set bit and sets the next; the double binary tree's second
    tree is the first mirrored or shifted, of the same depth). ceil(log2 nodes) for every node count."""
    deepest = 0
    for rank in range(1, nodes):
        depth, r = 0, rank
        while r:
            bit = r & -r
            up = (r ^ bit) | (bit << 1)
            r = up if up < nodes else r ^ bit
            depth += 1
        deepest = max(deepest, depth)
    return deepest


def _tree_channels_used(c: NcclComm, protocol: str, n_bytes: float) -> int:
    """Channels a tree call runs on (``topoGetAlgoInfo``, src/enqueue.cc: drop one while every thread would get
    less than its protocol's threshold)."""
    nc = c.channels
    while nc >= 2 and n_bytes < nc * TREE_THREADS[protocol] * THREAD_THRESHOLD[protocol]:
        nc -= 1
    return nc


def _tree_chunk_bytes(c: NcclComm, protocol: str, per_channel: float) -> int:
    """A tree chunk's data bytes for a channel's share ``per_channel`` (``calcCollChunking``, src/enqueue.cc, which
    ``scheduleCollTasksToPlan`` calls per channel): LL128 halves its chunk while the channel would get fewer than
    ``(1 + log2(nodes) + 0.1 ppn) x 64 / ppn`` chunks (down to 128 KiB) or x 16 / ppn (down to 32 KiB); the other
    protocols keep theirs. The alignment to the protocol's grain is left out."""
    chunk = TREE_CHUNK_BYTES[protocol]
    if protocol == "LL128":
        ppn = c.per_node
        steps = 1 + _log2i(c.nodes) + 0.1 * ppn
        while per_channel // chunk < steps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while per_channel // chunk < steps * 16 / ppn and chunk > 32768:
            chunk //= 2
    return chunk


def tree_time_us(c: NcclComm, protocol: str, n_bytes: float, t: NcclTuning) -> float:
    """The time of one tree all-reduce call as it runs, us (NVIDIA/nccl at 5067397c).

    Each channel takes its share of the data (``topoGetAlgoInfo``'s channel count) in chunks
    (``_tree_chunk_bytes``) and pipelines them through the tree (src/device/all_reduce.h ``runTreeSplit``: the
    reduction up and the broadcast down run at once on split threads, the root reducing and sending each chunk back
    down in one operation). The path from the deepest rank to the root is ``D = (ppn - 1) + depth`` hops: the chain
    of a node's ranks (src/graph/connect.cc, ``tree.up``/``tree.down[0]`` along ``treeIntra``) and the binary tree
    over the nodes (``_btree_depth``). So ``K`` chunks take ``2 D + K - 1`` pipeline stages. With Simple a hop
    forwards a chunk once its step's flag says it has all arrived (src/device/prims_simple.h waits on the peer's
    step counter); LL and LL128 carry a flag in every line (src/device/prims_ll.h, prims_ll128.h), so a hop
    forwards lines as they land.

    A stage is one hop of one chunk, priced as a ring step is (``ring_time_us``; an assumption: the tree's hops use
    the same primitives as the ring's steps, one step per chunk): with Simple the node profile's fitted ``sync_us``
    then the chunk's data, with LL and LL128 the larger of the two. The data moves at the channel's share of NCCL's
    tree bandwidth for the protocol (at most one channel's own: ``bandwidth_GBps`` of a one-channel communicator),
    which is what NCCL's model gives a large message, and at most what the block sustains (``channel_cap_GBps``).
    The ``2 depth`` inter-node hops of the first chunk's path each add NCCL's difference between the tree's network
    and NVLink hop latencies, and the call adds its fixed ``call_us`` and NCCL's base latency, as ``ring_time_us``
    does. NCCL's medium-size correction
    (``treeCorrectionFactor``) is its model's stand-in for this pipeline and is not applied."""
    if c.ranks <= 1 or n_bytes <= 0:
        return 0.0
    p = PROTOCOLS.index(protocol)
    nc = _tree_channels_used(c, protocol, n_bytes)
    total = bandwidth_GBps(c, "all_reduce", "tree", protocol)  # algorithm bandwidth, GB/s, all channels
    own = bandwidth_GBps(replace(c, channels=1), "all_reduce", "tree", protocol)
    per_channel = min(total / nc, own, t.channel_cap_GBps(protocol)) * 1000.0  # bytes per us
    per_ch = n_bytes / nc
    chunks = max(1, math.ceil(per_ch / _tree_chunk_bytes(c, protocol, per_ch)))
    chunk = per_ch / chunks
    depth = _btree_depth(c.nodes)
    stages = 2 * (c.ranks // c.nodes - 1 + depth) + chunks - 1
    net_extra = max(0.0, HW_LATENCY_US["net"]["tree"][p] - HW_LATENCY_US[c.intra]["tree"][p]) if c.nodes > 1 else 0.0
    base = BASE_LATENCY_US["tree"][p]
    data = max(step_rounds_bytes(protocol, chunk, g) for g in TREE_SPLIT_THREADS) / per_channel
    stage = max(t.sync_us[p], data) if protocol in LINE_FLAGGED else t.sync_us[p] + data
    return t.call_us + base + stages * stage + 2 * depth * net_extra


def _as_run_us(
    c: NcclComm, collective: str, algorithm: str, protocol: str, n_bytes: float, t: NcclTuning, nvls: NvlsTuning | None
) -> float | None:
    """The time of one call of an (algorithm, protocol) pair NCCL enables, as it runs (us); None where the pair is
    not enabled, or has no as-run model here (NVLS without the node's NVLS timing, an NVLS all-gather or
    reduce-scatter). PAT has none either: NCCL's own prediction plus the call's fixed ``call_us`` (an assumption)."""
    if bandwidth_GBps(c, collective, algorithm, protocol) <= 0:
        return None
    if algorithm == "ring":
        return ring_time_us(c, collective, protocol, n_bytes, t)
    if algorithm == "tree":
        return tree_time_us(c, protocol, n_bytes, t)
    if algorithm == "nvls":
        return nvls_time_us(c, n_bytes, nvls) if nvls is not None and collective == "all_reduce" else None
    if algorithm == "pat":
        predicted = algorithm_time_us(c, collective, algorithm, protocol, n_bytes)
        return None if predicted is None else predicted + t.call_us
    return None


def _timed(c: NcclComm, collective: str, algorithm: str, protocol: str, us: float, n_bytes: float) -> NcclChoice:
    factor = _steps(collective, c.ranks) / c.ranks
    return NcclChoice(algorithm, protocol, us, n_bytes * factor / (1000 * us) if us > 0 else math.inf)


def nccl_call(
    c: NcclComm,
    collective: str,
    n_bytes: float,
    t: NcclTuning,
    nvls: NvlsTuning | None = None,
    *,
    algorithms: tuple[str, ...] | None = None,
) -> NcclChoice:
    """One call as NCCL runs it with ``NCCL_ALGO`` and ``NCCL_PROTO`` unset: the fastest, as they run
    (``ring_time_us``, ``tree_time_us``, ``nvls_time_us``; PAT at NCCL's prediction plus ``call_us``), of the pairs
    NCCL weighs for the collective (``NCCL_DEFAULT_ALGORITHMS``; NVLS too for an all-reduce on one node where
    ``nvls`` times NVLS calls; ``algorithms`` restricts them as ``NCCL_ALGO`` does). Ties go to NCCL's order.

    Not NCCL's own pick (``choose``, which ``tuned_call`` times): NCCL's tuner weighs the pairs by its model,
    whose per-architecture constants NVIDIA sets so that its picks track the measured fastest on the systems it
    ships for, and the as-run times are this model's estimate of what each pair measures; where the two disagree the
    tuner's pick can run much slower than another pair as timed here (up to 3.6x on two DGX A100 nodes at 128 KiB),
    and it flips as a bandwidth grows (a TP all-gather of 8 MiB on 8 A100s at 30 GB/s per channel: LL128 102 us ->
    Simple 127 us), so that more bandwidth would make a step slower. The fastest pair is monotone: every pair's
    as-run time falls as any bandwidth grows. On the published A100 curve the two agree but at 32 MiB (NCCL ran
    Simple, 442 us measured; LL128 here 400 us, Simple 457 us)."""
    names = _weighed(c, collective, nvls, algorithms)
    best: tuple[float, str, str] | None = None
    for algorithm in ALGORITHMS:
        if algorithm not in names:
            continue
        for protocol in PROTOCOLS:
            us = _as_run_us(c, collective, algorithm, protocol, n_bytes, t, nvls)
            if us is not None and (best is None or us < best[0]):
                best = (us, algorithm, protocol)
    if best is None:
        raise ValueError(f"no algorithm and protocol enabled for {collective} among {names} on {c}")
    return _timed(c, collective, best[1], best[2], best[0], n_bytes)


def tuned_call(
    c: NcclComm,
    collective: str,
    n_bytes: float,
    t: NcclTuning,
    nvls: NvlsTuning | None = None,
    *,
    algorithms: tuple[str, ...] | None = None,
) -> NcclChoice:
    """One call on the pair NCCL's own model picks (``choose``) among those ``nccl_call`` weighs, timed as it runs:
    what a measured curve ran, so ``scripts/fit_nccl.py`` fits each measured size with it."""
    names = _weighed(c, collective, nvls, algorithms)
    pick = choose(c, collective, n_bytes, algorithms=names)
    us = _as_run_us(c, collective, pick.algorithm, pick.protocol, n_bytes, t, nvls)
    if us is None:
        raise ValueError(f"NCCL's pick {pick.algorithm}/{pick.protocol} has no as-run time on {c}")
    return _timed(c, collective, pick.algorithm, pick.protocol, us, n_bytes)


def _weighed(
    c: NcclComm, collective: str, nvls: NvlsTuning | None, algorithms: tuple[str, ...] | None
) -> tuple[str, ...]:
    """The algorithms NCCL weighs for a call: ``NCCL_DEFAULT_ALGORITHMS``, NVLS too for an all-reduce on one node
    where ``nvls`` times NVLS calls; ``algorithms`` (``NCCL_ALGO``) instead where given."""
    if algorithms is not None:
        return algorithms
    names: tuple[str, ...] = NCCL_DEFAULT_ALGORITHMS[collective]
    if nvls is not None and collective == "all_reduce" and c.nodes == 1:
        names = (*names, "nvls")
    return names


def nccl_overhead_s(c: NcclComm, collective: str, n_bytes: float, t: NcclTuning, busbw_GBps: float) -> float:
    """Seconds ``nccl_call`` takes beyond the call's bytes at ``busbw_GBps`` moved as a ring moves them (the
    engines' wire time: to first order a tree moves as much per rank through each node boundary, about ``2 n``, as
    a ring does), never below 0: ``ring_overhead_s`` for the call NCCL picks."""
    if c.ranks <= 1 or n_bytes <= 0:
        return 0.0
    wire_us = n_bytes * _steps(collective, c.ranks) / c.ranks / (1000 * busbw_GBps)
    return max(0.0, nccl_call(c, collective, n_bytes, t).time_us - wire_us) * 1e-6
