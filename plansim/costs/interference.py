"""Compute slowed by communication running beside it on the same GPU (interference), written once for both engines.

While an NCCL collective runs on a GPU, a compute kernel beside it has fewer SMs and shares HBM bandwidth: NCCL runs
one thread block per channel and its blocks do not share an SM with compute kernels (NCCL maintainer, NVIDIA/nccl
issue #689), and every byte a collective moves is stored to and loaded from the GPU's memory ("competing for memory
bandwidth", issue #1428). The compute stream then runs at a ``rate`` below 1:

    slowdown f = S / (S - c)  x  (1 + k H / B),        rate = 1 / f

with ``S`` the GPU's SMs, ``c`` the channels of the collectives running (summed), ``H`` the HBM bytes per second
they move (summed), ``B`` the GPU's HBM bandwidth and ``k`` the memory sensitivity. ``k`` comes from one measured
slowdown ``f_m`` (a kernel timed alone and beside a load of ``c_m`` channels moving ``H_m`` bytes/s of HBM on a GPU
of ``S_m`` SMs and ``B_m`` bytes/s): the SM-share part at the measured channel count is taken out first and the
remainder is put down to memory contention,

    k = (f_m (S_m - c_m) / S_m - 1) B_m / H_m,

so the formula gives back ``f_m`` exactly at the measured conditions and nothing is counted twice. The measurement is
the GPU's measured profile's ``overlap`` section (``plansim profile`` on CUDA) when there is one, else the GPU
profile's published ``overlap`` (A100-SXM4-80GB: a GEMM 1.18 -> 2.08 ms beside an AllGather, NVIDIA/nccl issue
#1428), else that A100 measurement's ``k`` with this GPU's own SMs and HBM bandwidth.

A collective's load (``Load``; a group's, with its link and pace, ``Beside``, which both engines get from
``plansim.step.prepare.beside``): ``c`` is NCCL's channel count for the group (the node profile's ``nccl`` channels,
inside a node or across nodes; two per NIC without one: issue #689 gives 2 SMs for one NIC and 16 for 8); ``H`` is
its bus rate (the group's effective link, ``Cluster.group_link``; for an NCCL call the rate it actually moves its
bytes at, ``paced``: a call whose per-call costs or channel rates hold it below the link moves as many bytes over a
longer time) times the HBM bytes per bus byte of its data movement:
``HBM_PER_BUS_BYTE`` for a ring collective; a pipeline send touches the sender's memory once inside a node and three
times across nodes (``SEND_HBM_PER_BYTE``) on ``SEND_CHANNELS`` channels. A tensor-parallel collective that
Transformer Engine's userbuffers move instead of NCCL (``engine_load``) takes no SM from the compute beside it (the
copy engines, or SM kernels beside a GEMM already given fewer SMs), only HBM.

A compute span of ``W`` seconds (at full rate) beside a collective of ``T`` seconds started with it runs both for
``min(T, W / rate)`` seconds (the overlapped time) and ends ``(1 - rate) x`` that later (the interference cost):
``overlap_cost``. The discrete-event engine runs compute at the rate of whatever is active, recomputed as each
collective starts and ends; the analytic engine applies ``overlap_cost`` beside pipeline sends and beside a layer's
asynchronous tensor-parallel collectives (``plansim.step.layers``), and walks the data-parallel reductions and ZeRO
gathers beside the layers' passes at the same rate (``plansim.step.data_parallel``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from plansim.hardware import Cluster
from plansim.hardware.schema import GPUSpec, NodeSpec, OverlapMeasurement

__all__ = [
    "CHANNELS_PER_NIC",
    "COPY_ENGINE_HBM_PER_BYTE",
    "HBM_PER_BUS_BYTE",
    "IDLE",
    "SEND_CHANNELS",
    "SEND_HBM_PER_BYTE",
    "Interference",
    "Load",
    "collective_load",
    "engine_load",
    "interference_model",
    "memory_sensitivity",
    "node_channels",
    "overlap_cost",
    "paced",
    "send_load",
]

#: HBM bytes a ring collective moves on each GPU per bus byte: every chunk a rank receives is stored into its
#: receive FIFO by the previous rank, loaded by its own kernel, and reduced with its input or copied to its output
#: (one more access); the store for the next rank lands in that GPU's memory (NVIDIA/nccl at 5067397c,
#: src/device/all_reduce.h, all_gather.h, reduce_scatter.h: recvReduceSend, recvCopySend). The NCCL maintainer's
#: figure in NVIDIA/nccl issue #1428: "at least 2x ... If you add reading from or writing to user data, it can be 3x".
HBM_PER_BUS_BYTE = 3.0
#: HBM bytes a pipeline send moves on the sending GPU per byte sent: inside a node its kernel loads the user buffer
#: and stores into the peer's memory over NVLink (1); across nodes it stores into a staging buffer in its own memory
#: that the NIC then reads (3) (NCCL's proxy path with GPUDirect RDMA).
SEND_HBM_PER_BYTE = {False: 1.0, True: 3.0}
#: HBM bytes a copy-engine transfer moves on each GPU per byte it sends: its copy reads the chunk from this GPU's
#: memory and the chunk it receives is written into it (Transformer Engine's userbuffers ring exchange with use_ce:
#: ``cudaMemcpyAsync`` into the peer's buffer, NVIDIA/TransformerEngine v2.9 userbuffers.cu:2307-2342).
COPY_ENGINE_HBM_PER_BYTE = 2.0
#: Channels of a point-to-point send: NCCL gives a peer two by default, at least one per NIC (src/graph/paths.cc,
#: ncclTopoGetNchannels: ``nNetChannels = 2``; "NCCL_NCHANNELS_PER_NET_PEER is typically 2", NVIDIA/nccl #1424).
SEND_CHANNELS = 2
#: Channels per NIC when a node profile gives no ``nccl`` channel count: the NCCL maintainer's "a PCI system with a
#: single NIC ... should just launch 2 SMs ... DGX with 8 NICs ... 16 SMs" (NVIDIA/nccl issue #689).
CHANNELS_PER_NIC = 2


@dataclass(frozen=True)
class Load:
    """What a running collective takes from a GPU's compute: SMs (its channels) and HBM bytes per second."""

    channels: int
    hbm_Bps: float


IDLE = Load(0, 0.0)


def paced(load: Load, wire_s: float, seconds: float) -> Load:
    """``load``, computed at its group's link rate, for a call that takes ``seconds`` where its bytes alone take
    ``wire_s`` at that rate: its HBM traffic is its bytes' (so many HBM bytes per byte it moves), spread over the
    time the call runs, so a call held back by NCCL's per-call costs or its channels' rates loads HBM at its own
    pace, not the link's; its SMs are held all along.

    >>> paced(Load(24, 600e9), 1e-3, 4e-3)  # a call four times its bytes' time at the link rate
    Load(channels=24, hbm_Bps=150000000000.0)
    """
    if seconds <= wire_s or wire_s <= 0:
        return load
    return Load(load.channels, load.hbm_Bps * wire_s / seconds)


def memory_sensitivity(m: OverlapMeasurement, sm_count: int | None, hbm_Bps: float) -> float:
    """``k`` of the module's formula from one measurement on a GPU of ``sm_count`` SMs and ``hbm_Bps``: the measured
    slowdown with its SM-share part (at the measured channels) taken out, per unit of HBM share the load took."""
    slowdown = m.overlapped_s / m.alone_s
    sm_share = sm_count / (sm_count - m.channels) if sm_count else 1.0
    return max(0.0, slowdown / sm_share - 1.0) * hbm_Bps / m.load_hbm_Bps


@dataclass(frozen=True)
class Interference:
    """The interference model of one GPU: its SMs and HBM bandwidth, the memory sensitivity and where it came from."""

    sm_count: int | None
    hbm_Bps: float
    sensitivity: float
    source: str

    def slowdown(self, channels: int, hbm_Bps: float) -> float:
        """How many times longer compute takes beside collectives holding ``channels`` SMs and moving ``hbm_Bps``."""
        sm = 1.0
        if self.sm_count and channels > 0:
            sm = self.sm_count / max(1, self.sm_count - channels)  # at least one SM is left to compute
        return sm * (1.0 + self.sensitivity * hbm_Bps / self.hbm_Bps)

    def rate(self, load: Load) -> float:
        """The compute stream's rate (1: full speed) beside ``load``."""
        if load.channels <= 0 and load.hbm_Bps <= 0:
            return 1.0
        return 1.0 / self.slowdown(load.channels, load.hbm_Bps)


@dataclass(frozen=True)
class Beside:
    """What one group's collectives take from the compute beside them: the GPU's ``model``, the group's ``load`` at
    its link's rate ``link_Bps``, and whether its calls are NCCL's timed calls (``nccl_paced``), whose HBM load
    follows their own pace (``paced``); the course's algorithms move at the link's rate."""

    model: Interference
    load: Load
    link_Bps: float
    nccl_paced: bool

    def load_at(self, seconds: float, sent_bytes: float) -> Load:
        """The load of one call of ``seconds`` that sends ``sent_bytes`` per rank."""
        if self.nccl_paced and sent_bytes > 0 and self.link_Bps > 0:
            return paced(self.load, sent_bytes / self.link_Bps, seconds)
        return self.load

    def rate(self, seconds: float, sent_bytes: float) -> float:
        """The compute stream's rate beside one call of ``seconds`` that sends ``sent_bytes`` per rank."""
        return self.model.rate(self.load_at(seconds, sent_bytes))


@lru_cache(maxsize=64)
def interference_model(gpu: GPUSpec, measured: OverlapMeasurement | None = None) -> Interference:
    """The model for ``gpu``: from ``measured`` (a measured profile's overlap section, taken on this GPU) when given,
    else the GPU profile's published ``overlap``, else the published A100-SXM4-80GB measurement's sensitivity."""
    if measured is not None:
        k = memory_sensitivity(measured, gpu.sm_count, gpu.hbm_bandwidth_Bps)
        return Interference(gpu.sm_count, gpu.hbm_bandwidth_Bps, k, f"measured: {measured.source}")
    if gpu.overlap is not None:  # its own, or one borrowed with the SMs and bandwidth it was measured at
        m = gpu.overlap
        sm_count = m.measured_sm_count if m.measured_sm_count is not None else gpu.sm_count
        k = memory_sensitivity(m, sm_count, m.measured_hbm_Bps or gpu.hbm_bandwidth_Bps)
        return Interference(gpu.sm_count, gpu.hbm_bandwidth_Bps, k, f"published: {gpu.overlap.source}")
    from plansim.hardware import load_gpu

    ref = load_gpu(_REFERENCE_GPU)
    assert ref.overlap is not None, f"{_REFERENCE_GPU}.yaml carries the published overlap measurement"
    k = memory_sensitivity(ref.overlap, ref.sm_count, ref.hbm_bandwidth_Bps)
    return Interference(gpu.sm_count, gpu.hbm_bandwidth_Bps, k, f"published on {ref.name}: {ref.overlap.source}")


_REFERENCE_GPU = "a100-sxm4-80gb"


def overlap_cost(work_s: float, comm_s: float, rate: float) -> tuple[float, float]:
    """(overlapped seconds, interference seconds) of ``work_s`` of compute (at full rate) and ``comm_s`` of
    communication started together, compute running at ``rate`` while the communication lasts: both run for
    ``min(comm_s, work_s / rate)``, and compute ends ``(1 - rate)`` times that later than alone.

    >>> overlap_cost(10.0, 4.0, 0.5)  # compute longer: 4 s overlapped, 2 s of work lost
    (4.0, 2.0)
    >>> overlap_cost(1.0, 4.0, 0.5)  # communication longer: compute stretched to 2 s
    (2.0, 1.0)
    """
    if work_s <= 0 or comm_s <= 0:
        return 0.0, 0.0
    overlapped = min(comm_s, work_s / rate)
    return overlapped, (1.0 - rate) * overlapped


def node_channels(node: NodeSpec, within_node: bool) -> int:
    """NCCL's channels for a collective inside one node (the node profile's ``nccl.channels``) or across nodes
    (``nccl.channels_across_nodes``, else its collective channels: the profile's NCCL section, which times the
    calls, says how many SMs they hold, so more NICs than it was written for hold no more of them while its calls
    run no faster); ``CHANNELS_PER_NIC`` per NIC without an NCCL section."""
    section = node.nccl
    if section is not None:
        if within_node or section.channels_across_nodes is None:
            return section.channels
        return section.channels_across_nodes
    return CHANNELS_PER_NIC * node.nics.count


@lru_cache(maxsize=4096)
def collective_load(cluster: Cluster, size: int, stride: int) -> Load:
    """The load of a ring collective among ``size`` ranks ``stride`` apart: NCCL's channels, and
    ``HBM_PER_BUS_BYTE`` times the group's bus bandwidth (``Cluster.group_link``)."""
    if size <= 1:
        return IDLE
    within = stride * (size - 1) < cluster.gpus_per_node
    link = cluster.group_link(size, stride)
    return Load(node_channels(cluster.node, within), HBM_PER_BUS_BYTE * link.bandwidth_Bps)


@lru_cache(maxsize=4096)
def send_load(cluster: Cluster, src: int, dst: int, collective: str = "send_recv") -> Load:
    """The load on ``src`` of a point-to-point send to ``dst`` (or, for another ``collective``, of that collective
    between the two ranks: the tied embeddings' all-reduce)."""
    if src == dst:
        return IDLE
    link = cluster.p2p_link(src, dst)
    crosses = cluster.node_of(src) != cluster.node_of(dst)
    if collective == "send_recv":
        return Load(SEND_CHANNELS, SEND_HBM_PER_BYTE[crosses] * link.bandwidth_Bps)
    return Load(node_channels(cluster.node, not crosses), HBM_PER_BUS_BYTE * link.bandwidth_Bps)


@lru_cache(maxsize=4096)
def engine_load(cluster: Cluster, size: int, stride: int, engine: str) -> Load:
    """The load of a collective among ``size`` ranks ``stride`` apart moved by ``engine`` (``Comm.engine``): NCCL's
    kernels (``collective_load``); Transformer Engine's copy engines, which take no SM (``COPY_ENGINE_HBM_PER_BYTE``
    of HBM per byte at the group's bus rate); its SM kernels beside a GEMM that already left them their SMs
    (``set_sm_margin``: the GEMM's time carries that), HBM as a ring collective's."""
    if engine == "nccl" or size <= 1:
        return collective_load(cluster, size, stride)
    rate = cluster.group_link(size, stride).bandwidth_Bps
    per_byte = COPY_ENGINE_HBM_PER_BYTE if engine == "copy_engine" else HBM_PER_BUS_BYTE
    return Load(0, per_byte * rate)
