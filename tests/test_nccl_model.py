"""plansim.costs.nccl against hand computations from NCCL's tables (NVIDIA/nccl src/graph/tuning.cc,
ncclTunerConstantsDefaults), and the properties the model is there for: latency growing with the ranks, bandwidth
falling for small messages, NCCL's protocol switch."""

from __future__ import annotations

from itertools import pairwise

import pytest

from plansim.costs.nccl import NcclComm, algorithm_time_us, bandwidth_GBps, choose, latency_us

# One node of 8 Ampere GPUs on NVLink, 12 channels of 20 GB/s (figures of the kind NCCL's search reports).
NODE = NcclComm(ranks=8, nodes=1, gpu="ampere", channels=12, bw_intra=20.0, bw_inter=20.0)
# 8 such nodes, 8 channels, 24 GB/s inside a node and 12 GB/s per channel across nodes.
CLUSTER = NcclComm(ranks=64, nodes=8, gpu="ampere", channels=8, bw_intra=24.0, bw_inter=12.0)


@pytest.mark.parametrize(
    "comm,algorithm,protocol,bandwidth,latency",
    [
        # ring Simple: bus 12 x 20 = 240, algorithm bandwidth x 8/14; latency 8.4 + 14 steps x 3.4 (NVLink)
        (NODE, "ring", "Simple", 240 * 8 / 14, 8.4 + 14 * 3.4),
        # ring LL: half the bus bandwidth capped at llMaxBw (Ampere, one node: 87.7); 6.6 + 14 x 0.6
        (NODE, "ring", "LL", 87.7 * 8 / 14, 6.6 + 14 * 0.6),
        # ring LL128: 0.92 of the bus, capped at 12 x 20 per channel; 14.0 + 14 x 1.9
        (NODE, "ring", "LL128", 240 * 0.92 * 8 / 14, 14.0 + 14 * 1.9),
        # tree Simple all-reduce: min(0.92 x 240, 12 x 24.0) halved; 8.4 + 2 (7 x 4.0)
        (NODE, "tree", "Simple", 240 * 0.92 / 2, 8.4 + 2 * 7 * 4.0),
        # across 8 nodes the ring runs at bwInter: 8 x 12 = 96, x 64/126; 112 intra steps at max(3.4, 3 x 1.0 net
        # overhead) and 14 inter-node steps at the network's 14.0
        (CLUSTER, "ring", "Simple", 96 * 64 / 126, 8.4 + 112 * 3.4 + 14 * 14.0),
        # tree: min(0.92 x 96, 8 x 17.8) halved; 8.4 + 2 (7 x 4.0 + log2(8) x 14.0)
        (CLUSTER, "tree", "Simple", 96 * 0.92 / 2, 8.4 + 2 * (7 * 4.0 + 3 * 14.0)),
        # tree LL across nodes: min(0.92 x 96, 142.4) / 3.8, capped at llMaxBw (Intel CPUs, >2 nodes: 20.4)
        (CLUSTER, "tree", "LL", min(96 * 0.92 / 3.8, 20.4) / 2, 6.8 + 2 * (7 * 0.6 + 3 * 5.0)),
    ],
)
def test_all_reduce_equals_the_hand_computation(comm, algorithm, protocol, bandwidth, latency) -> None:  # type: ignore[no-untyped-def]
    assert bandwidth_GBps(comm, "all_reduce", algorithm, protocol) == pytest.approx(bandwidth, rel=1e-6)
    assert latency_us(comm, "all_reduce", algorithm, protocol) == pytest.approx(latency, rel=1e-9)


def test_time_adds_the_size_over_bandwidth_and_ncclcs_corrections() -> None:
    size = 2**30
    ring = algorithm_time_us(NODE, "all_reduce", "ring", "Simple", size)
    assert ring == pytest.approx((8.4 + 14 * 3.4) + size / (1000 * 240 * 8 / 14), rel=1e-6)
    # multi-node Simple ring all-reduce: the latency plateau x1.4 once each channel's share per rank is >= 64 B
    big = algorithm_time_us(CLUSTER, "all_reduce", "ring", "Simple", size)
    assert big == pytest.approx(1.4 * (8.4 + 112 * 3.4 + 14 * 14.0) + size / (1000 * 96 * 64 / 126), rel=1e-6)
    small = algorithm_time_us(CLUSTER, "all_reduce", "ring", "Simple", 8 * 64 * 63)
    assert small == pytest.approx((8.4 + 112 * 3.4 + 14 * 14.0) + 8 * 64 * 63 / (1000 * 96 * 64 / 126), rel=1e-6)
    # tree: 1 MiB is log2(2**20 / 64) = 14 in the correction table, 0.5 for Simple
    tree = algorithm_time_us(NODE, "all_reduce", "tree", "Simple", 2**20)
    assert tree == pytest.approx(8.4 + 2 * 7 * 4.0 + 2**20 / (1000 * 240 * 0.92 / 2 * 0.5), rel=1e-6)


def test_all_gather_and_reduce_scatter_run_rings_of_n_minus_one_steps() -> None:
    for collective in ("all_gather", "reduce_scatter"):
        assert bandwidth_GBps(NODE, collective, "ring", "Simple") == pytest.approx(240 * 8 / 7)
        assert latency_us(NODE, collective, "ring", "Simple") == pytest.approx(8.4 + 7 * 3.4)
        assert bandwidth_GBps(NODE, collective, "tree", "Simple") == 0  # NCCL has no tree for them


def test_ring_latency_grows_with_the_ranks_and_the_tree_with_the_log_of_the_nodes() -> None:
    def comm(nodes: int) -> NcclComm:
        return NcclComm(ranks=8 * nodes, nodes=nodes, gpu="hopper", channels=16, bw_intra=40.0, bw_inter=12.5)

    ring = [latency_us(comm(n), "all_reduce", "ring", "Simple") for n in (2, 4, 8, 16, 64, 256)]
    tree = [latency_us(comm(n), "all_reduce", "tree", "Simple") for n in (2, 4, 8, 16, 64, 256)]
    assert all(a < b for a, b in pairwise(ring))
    assert all(a < b for a, b in pairwise(tree))
    assert ring[-1] / ring[0] > 100  # 128x the ranks: the ring's steps grow with them
    for n, t in zip((2, 4, 8, 16, 64, 256), tree, strict=True):  # the tree: 2 x 14 us per doubling of the nodes
        assert t - tree[0] == pytest.approx(2 * 14.0 * (n.bit_length() - 2))


def test_small_messages_take_the_low_latency_protocols_and_lose_bandwidth() -> None:
    small, large = choose(NODE, "all_reduce", 4096), choose(NODE, "all_reduce", 2**30)
    assert small.protocol == "LL" and large.protocol in ("LL128", "Simple")
    sizes = [2**k for k in range(10, 33, 2)]
    busbw = [choose(NODE, "all_reduce", s).busbw_GBps for s in sizes]
    assert all(a < b for a, b in pairwise(busbw))  # bandwidth falls for small messages
    assert busbw[0] < 0.05 * busbw[-1]


def test_the_choice_is_the_fastest_enabled_pair_and_restrictions_hold() -> None:
    for size in (2**12, 2**20, 2**28):
        best = choose(CLUSTER, "all_reduce", size)
        times = [
            algorithm_time_us(CLUSTER, "all_reduce", a, p, size)
            for a in ("tree", "ring", "nvls", "nvls_tree", "pat")
            for p in ("LL", "LL128", "Simple")
        ]
        assert best.time_us == min(t for t in times if t is not None)
    ring_only = choose(CLUSTER, "all_reduce", 2**28, algorithms=("ring",), protocols=("Simple",))
    assert (ring_only.algorithm, ring_only.protocol) == ("ring", "Simple")


def test_nvls_on_a_hopper_node_and_pat_with_one_gpu_per_node() -> None:
    hopper = NcclComm(ranks=8, nodes=1, gpu="hopper", channels=16, bw_intra=40.0, bw_inter=100.0, nvls_channels=16)
    # NVLS all-reduce: 40 x 0.85 x 15/16, doubled (two operations pipelined), below bwInter; x 16 channels, x 8/14
    assert bandwidth_GBps(hopper, "all_reduce", "nvls", "Simple") == pytest.approx(
        16 * (40 * 0.85 * 15 / 16 * 2) * 8 / 14, rel=1e-6
    )
    assert latency_us(hopper, "all_reduce", "nvls", "Simple") == 25.0
    assert bandwidth_GBps(NODE, "all_reduce", "nvls", "Simple") == 0  # Ampere has no NVLink SHARP
    spread = NcclComm(ranks=16, nodes=16, gpu="hopper", channels=4, bw_intra=12.0, bw_inter=12.0)
    # PAT: 0.75 of the bus, no conversion; 8.0 + log2(16) x 14.0 / 3.5 + 16 x 2.8 (ppn 1: the tree's net latency)
    assert bandwidth_GBps(spread, "all_gather", "pat", "Simple") == pytest.approx(4 * 12.0 * 0.75)
    assert latency_us(spread, "all_gather", "pat", "Simple") == pytest.approx(8.0 + 4 * 14.0 / 3.5 + 16 * 2.8)
    assert bandwidth_GBps(CLUSTER, "all_gather", "pat", "Simple") == 0  # 8 GPUs per node: no PAT


def test_bad_communicators_are_refused() -> None:
    with pytest.raises(ValueError, match="as many ranks on every node"):
        NcclComm(ranks=10, nodes=4, gpu="ampere", channels=8, bw_intra=20.0, bw_inter=12.0)
    with pytest.raises(ValueError, match="gpu"):
        NcclComm(ranks=8, nodes=1, gpu="pascal", channels=8, bw_intra=20.0, bw_inter=12.0)
