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
        # tree LL128 across nodes: min(0.92 x 96, 142.4) x 120/128, below 8 x 20 per channel, halved;
        # 14.0 + 2 (7 x 1.25 + log2(8) x 8.5)
        (CLUSTER, "tree", "LL128", 96 * 0.92 * 120 / 128 / 2, 14.0 + 2 * (7 * 1.25 + 3 * 8.5)),
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
    # NVLS's bandwidth is its graph's (graphs[NVLS]: one channel per GPU of the node, 40/60 GB/s per channel), not
    # the ring's channels nor the 16 CTAs an NVLS call runs on (this test used those until NVLS was timed)
    hopper = NcclComm(
        ranks=8, nodes=1, gpu="hopper", channels=16, bw_intra=40.0, bw_inter=100.0, nvls_channels=16,
        nvls_bw_intra=40.0, nvls_bw_inter=60.0,
    )  # fmt: skip
    # NVLS all-reduce: min(40 x 0.85 x 7/8 x 2 (two operations pipelined), 60) = 59.5 per head x 8 heads = 476 GB/s
    # of bus bandwidth, x 8/14 to algorithm bandwidth
    assert bandwidth_GBps(hopper, "all_reduce", "nvls", "Simple") == pytest.approx(8 * 59.5 * 8 / 14, rel=1e-6)
    # all-gather: 40 x 0.85 x 7/8 x 7/8 per head, no conversion (NCCL converts only ring and non-sharded)
    assert bandwidth_GBps(hopper, "all_gather", "nvls", "Simple") == pytest.approx(8 * 40 * 0.85 * 7 / 8 * 7 / 8)
    assert latency_us(hopper, "all_reduce", "nvls", "Simple") == 25.0
    assert bandwidth_GBps(NODE, "all_reduce", "nvls", "Simple") == 0  # Ampere has no NVLink SHARP
    no_graph = NcclComm(ranks=8, nodes=1, gpu="hopper", channels=16, bw_intra=40.0, bw_inter=100.0, nvls_channels=16)
    assert bandwidth_GBps(no_graph, "all_reduce", "nvls", "Simple") == 0  # no NVLS graph bandwidth: not enabled
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


# ---- the ring as it runs (enqueue.cc's channels and chunks, the node's fitted costs) against nccl-tests ----------
def _curve(gpu: str = "a100") -> dict:
    """A published nccl-tests curve in ``calibration/`` (``nccl-tests-<gpu>.yaml``)."""
    import yaml

    from plansim.files.data import data_dir

    path = data_dir("hardware_profiles").parent / f"calibration/nccl-tests-{gpu}.yaml"
    if not path.exists():
        pytest.skip("calibration/ is not installed")
    return yaml.safe_load(path.read_text())


def _fit_module():  # type: ignore[no-untyped-def]
    """scripts/fit_nccl.py, loaded as a module (skips where scripts/ is not installed)."""
    import importlib.util

    from plansim.files.data import data_dir

    path = data_dir("hardware_profiles").parent / "scripts/fit_nccl.py"
    if not path.exists():
        pytest.skip("scripts/ is not installed")
    spec = importlib.util.spec_from_file_location("fit_nccl", path)
    assert spec is not None and spec.loader is not None
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    return fit


def _busbw(cluster_name: str, ranks: int, n_bytes: float) -> float:
    """Bus bandwidth of a ring all-reduce as both engines price it: the bytes at the group's measured bus bandwidth
    plus what NCCL adds (``ring_call_s``)."""
    from plansim.hardware import load_hardware
    from plansim.step.prepare import ring_call_s

    cluster = load_hardware(cluster_name, gpus=ranks)
    nodes = max(1, ranks // cluster.gpus_per_node)
    link = cluster.group_link(ranks, 1)
    seconds = ring_call_s(cluster, "all_reduce", ranks, nodes, n_bytes, link)
    return n_bytes * 2 * (ranks - 1) / ranks / seconds / 1e9


# CALIBRATION.md's points for one node of 8 A100 (Azure ND A100 v4, nccl-tests all_reduce busbw, GB/s)
@pytest.mark.parametrize(
    "n_bytes,measured",
    [
        (1 << 20, 36.22),  # LL: -2.0%
        (16 << 20, 109.22),  # LL128: +7.2% with the thread block's fitted LL128 rate (+30.2% at NCCL's figure)
        (128 << 20, 174.18),  # Simple: +13.2%, the curve's bump (64 MB +0.5%, 256 MB +1.3%)
        (1 << 30, 228.10),
        (8 << 30, 231.58),
    ],
)  # fmt: skip
def test_one_node_busbw_within_15_percent_of_nccl_tests(n_bytes: float, measured: float) -> None:
    assert abs(_busbw("dgx-a100", 8, n_bytes) / measured - 1) < 0.15


def test_whole_published_curve_within_15_percent() -> None:
    """Every size 1 KB to 8 GB, LL, LL128 and Simple (the LL128 sizes were the known gap, up to +30%, until a
    channel's LL128 rate was fitted: ``NcclTuning.ll128_channel_GBps``)."""
    curve = _curve()
    errors = {s: _busbw("dgx-a100", 8, s) / bw - 1 for s, bw in curve["busbw_GBps"].items()}
    assert len(errors) == 24 and max(abs(e) for e in errors.values()) < 0.15, errors


def _ring_protocol(n_bytes: float) -> str:
    from plansim.costs.nccl_groups import nccl_comm
    from plansim.hardware import load_hardware

    return choose(
        nccl_comm(load_hardware("dgx-a100", gpus=8), 8, 1), "all_reduce", n_bytes, algorithms=("ring",)
    ).protocol


def test_the_curve_runs_every_protocol_so_the_fit_sees_each() -> None:
    curve = _curve()
    protocols = [_ring_protocol(s) for s in curve["busbw_GBps"]]
    assert protocols.count("LL") == 12 and protocols.count("LL128") == 3 and protocols.count("Simple") == 9


def test_the_fit_predicts_the_calibration_points_it_does_not_see() -> None:
    """A held-out check of the fit itself: fitted without CALIBRATION.md's five points, the model predicts them.
    The LL128 point (16 MB) is then extrapolated from the two other LL128 sizes: +16.3% (the in-sample fit: +7.2%),
    so this bound is 20%, the others' 15%."""
    fit = _fit_module()
    curve = _curve()
    held = (1 << 20, 16 << 20, 128 << 20, 1 << 30, 8 << 30)
    train = {**curve, "busbw_GBps": {s: b for s, b in curve["busbw_GBps"].items() if s not in held}}
    errors = fit.errors(curve, fit.fit(train))
    for size in held:
        protocol, model, measured = errors[size]
        assert abs(model / measured - 1) < (0.20 if protocol == "LL128" else 0.15), (size, model, measured)


@pytest.mark.parametrize("nodes", [2, 4])
def test_across_dgx_a100_nodes_large_messages_reach_the_measured_192_GBps(nodes: int) -> None:
    """192 GB/s all-reduce busbw across DGX A100s with 8 HDR NICs (NVIDIA/nccl issue #812, CALIBRATION.md)."""
    assert abs(_busbw("dgx-a100", 8 * nodes, 8 << 30) / 192.0 - 1) < 0.15


def test_across_dgx_h100_nodes_large_messages_reach_46_to_48_GBps_per_nic() -> None:
    """ "For NDR @ 400Gbps you should see 46-48GB/s per NIC" for two nodes (NVIDIA/nccl-tests issue #290): 8 NICs."""
    assert abs(_busbw("dgx-h100", 16, 8 << 30) / (8 * 47.0) - 1) < 0.15


def test_ring_overhead_grows_with_ranks_and_bandwidth_falls_for_small_messages() -> None:
    from plansim.costs.nccl_groups import ring_overhead_s
    from plansim.hardware import load_hardware

    cluster = load_hardware("dgx-a100", gpus=8192)
    over = [ring_overhead_s(cluster, "all_reduce", n, n, 16e6, 192e9) for n in (2, 8, 64, 512)]
    assert all(a < b for a, b in pairwise(over)), over
    busbw = [_busbw("dgx-a100", 8, s) for s in (1 << 16, 1 << 20, 1 << 24, 1 << 28)]
    assert all(a < b for a, b in pairwise(busbw)), busbw


def test_profile_constants_are_the_fit_of_the_published_curve() -> None:
    """The dgx-a100 profile's call_us, sync_us and ll128_channel_GBps come from scripts/fit_nccl.py on
    calibration/nccl-tests-a100.yaml (no constant is set by hand)."""
    from plansim.hardware import load_hardware

    fit = _fit_module()
    got = fit.fit(_curve())
    section = load_hardware("dgx-a100").node.nccl
    assert section is not None
    assert section.call_us == pytest.approx(got.call_us, abs=0.01)
    assert section.sync_us == pytest.approx(got.sync_us, abs=0.01)
    assert section.ll128_channel_GBps == pytest.approx(got.ll128_channel_GBps, abs=0.01)
    # H100 (and H200, which reuses it): call_us and LL's sync from the H100 curve's ring sizes (all LL), LL128 and
    # Simple the A100 fit's; no LL128 size, so no LL128 rate of its own (NCCL's figure)
    got = fit.fit(_curve("h100"), got)
    assert got.ll128_channel_GBps is None
    for node in ("dgx-h100", "hgx-h200"):
        section = load_hardware(node).node.nccl
        assert section is not None
        assert section.call_us == pytest.approx(got.call_us, abs=0.01)
        assert section.sync_us == pytest.approx(got.sync_us, abs=0.01)
        assert section.ll128_channel_GBps is None


# ---- NVLS as it runs (enqueue.cc, all_reduce.h's one-node NVLS path, nvls.cc at 5067397c) -------------------------
H100 = NcclComm(
    ranks=8, nodes=1, gpu="hopper", channels=24, bw_intra=15.45, bw_inter=16.67, nvls_channels=16,
    nvls_bw_intra=40.0, nvls_bw_inter=60.0,
)  # fmt: skip


@pytest.mark.parametrize(
    "n_bytes,channels,chunk,loops",
    [
        # 64 KiB: 2 x 64 KiB of traffic over 32 KiB per channel -> 4 channels; 16 KiB each < 2 x 8 heads x 32 KiB:
        # chunk 16 KiB; 16 KiB / (8 x 16 KiB) -> 1 loop
        (1 << 16, 4, 16384, 1),
        # 16 MiB: 16 channels of 1 MiB; 1 MiB < 8 x 8 x 64 KiB -> 32 KiB, not < 2 x 8 x 32 KiB; 1 MiB / 256 KiB = 4
        (16 << 20, 16, 32768, 4),
        # 1 GiB: 64 MiB per channel, not < 64 x 8 x 128 KiB: 128 KiB chunks, 64 MiB / 1 MiB = 64 loops
        (1 << 30, 16, 131072, 64),
        # 256 MiB: 16 MiB per channel < 64 MiB -> 64 KiB, not < 8 x 8 x 64 KiB = 4 MiB; 16 MiB / 512 KiB = 32 loops
        (256 << 20, 16, 65536, 32),
    ],
)
def test_nvls_channels_chunks_and_time_equal_the_hand_computation(n_bytes, channels, chunk, loops) -> None:  # type: ignore[no-untyped-def]
    from plansim.costs.nccl import NvlsTuning, nvls_channels_used, nvls_chunk_bytes, nvls_time_us

    assert nvls_channels_used(H100, n_bytes) == channels
    assert nvls_chunk_bytes(H100, n_bytes / channels) == chunk
    t = NvlsTuning(call_us=10.0, sync_us=2.0)
    algbw = 8 * 59.5 * 8 / 14 * channels / 16  # GB/s: NCCL's NVLS bandwidth, the share of the channels in use
    assert nvls_time_us(H100, n_bytes, t) == pytest.approx(10.0 + 2.0 * loops + n_bytes / (1000 * algbw), rel=1e-9)


def test_ncclc_default_takes_the_ring_for_small_and_nvls_for_large_all_reduces() -> None:
    # ring LL: 6.6 + 14 x 0.6 = 15 us at min(141, 24 x 15.45 / 2) x 8/14 = 80.57 GB/s; NVLS 25 us at 272 GB/s:
    # they cross at 10 us / (1/80.57 - 1/272) GB/s = 1.145 MB
    pick = [choose(H100, "all_reduce", s, algorithms=("ring", "nvls")).algorithm for s in (1 << 20, 3 << 19)]
    assert pick == ["ring", "nvls"]
    from plansim.costs.nccl import NcclTuning, NvlsTuning, nccl_call

    ring, nvls = NcclTuning(30.0, (0.0, 3.0, 6.0)), NvlsTuning(40.0, 2.5)
    assert nccl_call(H100, "all_reduce", 1 << 30, ring, nvls).algorithm == "nvls"
    assert nccl_call(H100, "all_reduce", 1 << 30, ring, None).algorithm == "ring"  # no NVLS timing: the ring
    assert nccl_call(H100, "all_gather", 1 << 30, ring, nvls).algorithm == "ring"  # NVLS all-gather not timed
    spread = NcclComm(ranks=16, nodes=2, gpu="hopper", channels=24, bw_intra=15.45, bw_inter=16.67,
                      nvls_channels=16, nvls_bw_intra=40.0, nvls_bw_inter=60.0)  # fmt: skip
    assert nccl_call(spread, "all_reduce", 1 << 30, ring, nvls).algorithm == "ring"  # NVLS is one node's


def _default_busbw(cluster_name: str, ranks: int, n_bytes: float) -> float:
    """Bus bandwidth of an all-reduce of a layer (NCCL's default algorithm) as both engines price it."""
    from plansim.hardware import load_hardware
    from plansim.step.prepare import comm_pricer
    from plansim.strategy.schema import Strategy

    cluster = load_hardware(cluster_name, gpus=ranks)
    price = comm_pricer(cluster, Strategy(tp=ranks, dp=1, pp=1))
    seconds, _ = price("tp", "all_reduce", n_bytes)
    return n_bytes * 2 * (ranks - 1) / ranks / seconds / 1e9


# CALIBRATION.md's points for one node of 8 H100 (Azure ND H100 v5, nccl-tests all_reduce busbw, NCCL's default)
@pytest.mark.parametrize(
    "n_bytes,measured",
    [
        (1 << 20, 43.70),  # the ring's LL, H100's own fit: -11.4% (was -19% with the A100 fit, xfail)
        (16 << 20, 234.45),
        (128 << 20, 400.61),
        (1 << 30, 466.35),
        (8 << 30, 478.87),
    ],
)  # fmt: skip
def test_h100_node_busbw_within_15_percent_of_nccl_tests(n_bytes: float, measured: float) -> None:
    assert abs(_default_busbw("dgx-h100", 8, n_bytes) / measured - 1) < 0.15


def test_h100_nvls_part_of_the_curve_within_15_percent() -> None:
    """Every size where NCCL's model picks NVLS (2 MB to 8 GB) within 15% of the published curve."""
    curve = _curve("h100")
    errors = {s: _default_busbw("dgx-h100", 8, s) / bw - 1 for s, bw in curve["busbw_GBps"].items() if s >= 2 << 20}
    assert max(abs(e) for e in errors.values()) < 0.15, errors


def test_a100_layer_all_reduce_stays_the_ring() -> None:
    """No NVLink SHARP on A100: a layer's all-reduce is the ring call of ``ring_call_s``."""
    assert _default_busbw("dgx-a100", 8, 1 << 30) == pytest.approx(_busbw("dgx-a100", 8, 1 << 30), rel=1e-12)


def test_nvls_profile_constants_are_the_fit_of_the_published_h100_curve() -> None:
    from plansim.hardware import load_hardware

    fit = _fit_module()
    got = fit.fit_nvls(_curve("h100"))
    section = load_hardware("dgx-h100").node.nccl
    assert section is not None
    assert section.nvls_call_us == pytest.approx(got.call_us, abs=0.01)
    assert section.nvls_sync_us == pytest.approx(got.sync_us, abs=0.01)


def test_engines_agree_on_a_tp8_step_with_nvls() -> None:
    """A tp=8 step on one DGX H100: both engines price its all-reduces as NVLS calls (the DES moves (p+1)/p of each
    message per GPU up to the switch and down, then adds the call's overhead) and agree; the tp bytes per GPU are
    NVLS's 9/8 of the messages, not the ring's 14/8."""
    from plansim import simulate

    s = {"dp": 1, "tp": 8, "pp": 1, "micro_batch": 1, "global_batch": 2, "sequence_parallel": False}
    a = simulate("gpt3-350m", "dgx-h100", s, gpus=8)
    d = simulate("gpt3-350m", "dgx-h100", s, gpus=8, engine="des")
    assert d.step_time_s == pytest.approx(a.step_time_s, rel=1e-9)
    assert d.comm_bytes_per_gpu["tp"] == pytest.approx(a.comm_bytes_per_gpu["tp"], rel=1e-12)
    ring = simulate("gpt3-350m", "dgx-a100", s, gpus=8)  # the same messages as rings
    nvls_only = ring.comm_bytes_per_gpu["tp"] * (9 / 8) / (14 / 8)
    # the large activations' all-reduces go by NVLS; the few below NCCL's 1.1 MB crossover stay rings
    assert nvls_only < a.comm_bytes_per_gpu["tp"] < nvls_only * 1.001


def test_nvls_timing_fields_come_all_or_none() -> None:
    from pydantic import ValidationError

    from plansim.hardware import load_hardware
    from plansim.hardware.schema import NcclSection

    section = load_hardware("dgx-h100").node.nccl
    assert section is not None and section.nvls_timed
    fields = section.model_dump()
    with pytest.raises(ValidationError, match="all or none: add nvls_sync_us"):
        NcclSection(**{**fields, "nvls_sync_us": None})
    with pytest.raises(ValidationError, match="nvls_channels > 0"):
        NcclSection(**{**fields, "nvls_channels": 0})
    assert not NcclSection(**{**fields, **dict.fromkeys(("nvls_bw_intra_GBps", "nvls_bw_inter_GBps",
                                                         "nvls_call_us", "nvls_sync_us"))}).nvls_timed  # fmt: skip


# ---- the tree as it runs, and the call NCCL's tuner picks (nccl_call) -------------------------------------------
def test_tree_time_equals_the_hand_computation() -> None:
    """``tree_time_us`` by hand (NVIDIA/nccl at 5067397c: src/enqueue.cc's channels and chunks, src/graph/trees.cc's
    depth, src/device/all_reduce.h's pipelined up and down passes)."""
    from plansim.costs.nccl import NcclTuning, tree_time_us

    t = NcclTuning(30.0, (0.0, 3.0, 6.0))
    # Simple, 64 MiB over 8 nodes of 8: 8 channels (64 MiB >> 8 x 512 threads x 64 B), 8 MiB each in 16 chunks of
    # 512 KiB; depth log2(8) = 3, D = 7 + 3, 2 x 10 + 16 - 1 = 35 stages, each a sync and a chunk (Simple forwards
    # whole chunks) at 96 x 0.92 / 2 / 8 = 5.52 GB/s; 2 x 3 inter-node hops at 14.0 - 4.0 us; base 8.4
    want = 30.0 + 8.4 + 35 * 6.0 + 35 * 524288 / 5520 + 6 * 10.0
    assert tree_time_us(CLUSTER, "Simple", 64 << 20, t) == pytest.approx(want, rel=1e-9)
    # LL128, 1 MiB over 4 nodes of 8: 8 channels of 131,072 B; the chunk halves from 576,000 while fewer than
    # (1 + 2 + 0.8) x 64 / 8 chunks (to 72,000), then x 16 / 8 (to 18,000): 8 chunks of 16,384 B; depth 2,
    # 2 x 9 + 8 - 1 = 25 stages, each the larger of the sync and the chunk (lines forwarded as they land; it was
    # their sum, with the data counted once, before the ring's LL128 steps overlapped) at 96 x 0.92 x 120/128 / 2 / 8
    # = 5.175 GB/s; 2 x 2 inter-node hops at 8.5 - 1.25 us; base 14.0. A chunk's 16,384 B are 9 warp slices of
    # 1920 B (prims_ll128.h), dealt to the 14 warps reducing up in one round of 14 slices and to the 6 broadcasting
    # down in two rounds of 6: the stage costs the slower, 14 x 1920 = 26,880 B (it was the chunk's own 16,384 B
    # before a step was priced in whole rounds of its warps): max(3.0, 5.194)
    comm = NcclComm(ranks=32, nodes=4, gpu="ampere", channels=8, bw_intra=24.0, bw_inter=12.0)
    want = 30.0 + 14.0 + 25 * max(3.0, 14 * 1920 / 5175) + 4 * 7.25
    assert tree_time_us(comm, "LL128", 1 << 20, t) == pytest.approx(want, rel=1e-9)


def test_the_binary_tree_is_ceil_log2_deep() -> None:
    from plansim.costs.nccl import _btree_depth

    assert [_btree_depth(n) for n in (1, 2, 3, 4, 5, 8, 14, 16, 17, 512, 4096)] == [0, 1, 2, 2, 3, 3, 4, 4, 5, 9, 12]


def _dgx_a100(nodes: int):  # type: ignore[no-untyped-def]
    from plansim.costs.nccl import NcclTuning
    from plansim.costs.nccl_groups import nccl_comm
    from plansim.hardware import load_hardware

    cluster = load_hardware("dgx-a100", gpus=8 * nodes)
    section = cluster.node.nccl
    assert section is not None and section.call_us is not None and section.sync_us is not None
    return nccl_comm(cluster, 8 * nodes, nodes), NcclTuning(
        section.call_us, section.sync_us, section.ll128_channel_GBps
    )


def test_nccl_picks_the_tree_for_small_messages_over_many_nodes_and_the_ring_for_large_on_few() -> None:
    from plansim.costs.nccl import nccl_call, ring_call

    comm, t = _dgx_a100(64)
    small = nccl_call(comm, "all_reduce", 1 << 20, t)
    assert small.algorithm == "tree"
    assert small.time_us < ring_call(comm, "all_reduce", 1 << 20, t).time_us / 2
    comm, t = _dgx_a100(2)
    large = nccl_call(comm, "all_reduce", 1 << 30, t)
    assert large.algorithm == "ring"
    assert large == ring_call(comm, "all_reduce", 1 << 30, t)
    # all-gather with 8 GPUs per node: no PAT, the ring
    assert nccl_call(comm, "all_gather", 1 << 20, t).algorithm == "ring"


def test_nccl_call_is_the_ring_call_wherever_the_tuner_picks_the_ring() -> None:
    from plansim.costs.nccl import nccl_call, ring_call

    picked_ring = 0
    for nodes in (1, 2, 4, 8, 16):
        comm, t = _dgx_a100(nodes)
        for size in (2**k for k in range(10, 34, 3)):
            got = nccl_call(comm, "all_reduce", size, t)
            if got.algorithm == "ring":
                picked_ring += 1
                assert got.time_us == ring_call(comm, "all_reduce", size, t).time_us
    assert picked_ring >= 5


@pytest.mark.parametrize(
    "n_bytes",
    [
        256 << 10,
        1 << 20,
        64 << 20,  # 2 nodes run the LL128 ring: faster than 1 node's Simple at NCCL's LL128 figure (657 vs 701 us),
        # slower at the thread block's fitted LL128 rate, which the one-node curve sets
        1 << 30,
    ],
)  # fmt: skip
def test_nccl_call_time_does_not_fall_as_ranks_grow(n_bytes: int) -> None:
    """From 8 to 4,096 ranks (1 to 512 DGX A100 nodes) the call as NCCL runs it (its fastest pair) never gets faster
    with more ranks (the ring alone does: 1 MiB is 2.74 ms at 32 nodes with LL128, 2.01 ms at 64 with LL), but
    where NCCL's own chunking changes with the node count: at 1 GiB the LL128 tree's chunk halves at 256 nodes
    (``calcCollChunking``: fewer than (1 + log2 nodes + 0.8) x 8 chunks per channel), which shortens the
    pipeline's fill, 16.26 ms at 128 nodes (Simple tree) -> 15.37 ms."""
    from plansim.costs.nccl import _tree_channels_used, _tree_chunk_bytes, nccl_call

    times, chunks = [], []
    for nodes in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        comm, t = _dgx_a100(nodes)
        call = nccl_call(comm, "all_reduce", n_bytes, t)
        times.append(call.time_us)
        per_channel = n_bytes / _tree_channels_used(comm, call.protocol, n_bytes)
        chunks.append((call.algorithm, call.protocol, _tree_chunk_bytes(comm, call.protocol, per_channel)))
    for (a, b), (was, now) in zip(pairwise(times), pairwise(chunks), strict=True):
        rechunked = now[0] == "tree" and (now[:2] != was[:2] or now[2] != was[2])
        assert a <= b or (rechunked and b >= 0.9 * a), (times, chunks)


@pytest.mark.parametrize("per_node", [1, 2, 4, 8])
def test_a_group_spanning_nodes_gets_the_channels_its_ranks_nics_carry(per_node: int) -> None:
    """NCCL searches a communicator's rings over its own ranks' GPUs and the NICs they reach (src/graph/search.cc at
    5067397c): a data-parallel group with ``per_node`` of a DGX A100's 8 GPUs on each node reaches the network
    through ``per_node`` of its 8 HDR NICs. So the communicator's channels carry what the group's link carries
    (``Cluster.group_link``: those NICs at their efficiency), not the whole node's 24 channels: otherwise NCCL's
    predicted call is shorter than its bytes on the wire and its latency terms are dropped."""
    from plansim.costs.nccl_groups import nccl_comm
    from plansim.hardware import load_hardware

    nodes = 16
    cluster = load_hardware("dgx-a100", gpus=8 * nodes)
    comm = nccl_comm(cluster, per_node * nodes, nodes)
    carried = comm.channels * min(comm.bw_intra, comm.bw_inter) * 1e9
    link = cluster.group_link(per_node * nodes, 8 // per_node).bandwidth_Bps
    assert comm.channels == 24 * per_node // 8
    assert link <= carried <= link / cluster.node.nics.efficiency * 1.001  # the NICs' raw rate over their efficiency
    # one node's group keeps the node's channels
    assert nccl_comm(cluster, per_node, 1).channels == 24
