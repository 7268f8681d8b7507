"""Routes and capacities of the simulator's view of a cluster (plansim.des.routing)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Generator
from typing import Any

import networkx as nx
import pytest
import simpy

from plansim.des.network import FlowNetwork, LinkId
from plansim.des.routing import Fabric
from plansim.errors import PlansimError
from plansim.hardware import load_hardware


def vertices(route: tuple[LinkId, ...]) -> list[str]:
    return [route[0][0], *(v for _, v in route)]


def transits(route: tuple[LinkId, ...]) -> list[str]:
    return [v for v in vertices(route)[1:-1] if v.startswith("gpu")]


def test_same_rank_is_an_empty_route() -> None:
    assert Fabric(load_hardware("dgx-a100", gpus=8)).route(3, 3) == ()


def test_intra_node_route_goes_through_the_nvswitch() -> None:
    fabric = Fabric(load_hardware("dgx-a100", gpus=16))
    assert fabric.route(9, 14) == (("gpu9", "node1/nvswitch"), ("node1/nvswitch", "gpu14"))


def test_inter_node_route_uses_nics_and_the_rail_leaf() -> None:
    fabric = Fabric(load_hardware("dgx-a100", gpus=16))
    assert vertices(fabric.route(2, 10)) == ["gpu2", "node0/nic2", "leaf0/rail2", "node1/nic2", "gpu10"]
    # Another rail: up to the spine and down.
    assert vertices(fabric.route(2, 11)) == [
        "gpu2",
        "node0/nic2",
        "leaf0/rail2",
        "spine0",
        "leaf0/rail3",
        "node1/nic3",
        "gpu11",
    ]


def test_pcie_node_stays_on_its_pcie_switch_not_a_nic_hairpin() -> None:
    """GPUs 0 and 1 share the node's one NIC, so gpu0-nic-gpu1 is also two hops: the intra-node fabric wins."""
    fabric = Fabric(load_hardware("pcie-4x4090", gpus=8))
    assert vertices(fabric.route(0, 1)) == ["gpu0", "node0/pcie", "gpu1"]
    assert vertices(fabric.route(0, 5)) == ["gpu0", "node0/nic0", "leaf0", "node1/nic0", "gpu5"]


def test_nvlink_mesh_forwards_through_a_neighbour_gpu_without_a_direct_link() -> None:
    fabric = Fabric(load_hardware("dgx-1", gpus=16))
    assert vertices(fabric.route(0, 1)) == ["gpu0", "gpu1"]  # direct NVLink
    # 0 and 5 share no NVLink: via 1 (links 0-1 and 1-5) or 4 (0-4, 4-5); the lower name wins.
    assert vertices(fabric.route(0, 5)) == ["gpu0", "gpu1", "gpu5"]
    assert fabric.capacity_Bps[("gpu0", "gpu3")] == pytest.approx(2 * 25e9 * 120 / 150)  # two NVLinks x efficiency


@pytest.mark.parametrize(("name", "gpus"), [("dgx-a100", 1280), ("dgx-h100", 2048)])
def test_healthy_routes_never_transit_a_gpu_and_are_shortest(name: str, gpus: int) -> None:
    """Up to the core tier and back (dgx-a100: 140 nodes per spine; dgx-h100: 128), against networkx's shortest
    path length in the graph with the other GPUs removed."""
    cluster = load_hardware(name, gpus=gpus)
    fabric = Fabric(cluster)
    graph = cluster.topology
    switches = [v for v, kind in graph.nodes(data="kind") if kind != "gpu"]
    rng = random.Random(0)
    pairs = [(0, 1), (0, 8), (0, 9), (0, gpus - 1), *(tuple(rng.sample(range(gpus), 2)) for _ in range(40))]
    for src, dst in pairs:
        route = fabric.route(src, dst)
        assert transits(route) == []
        assert route[0][0] == f"gpu{src}" and route[-1][1] == f"gpu{dst}"
        assert all(a[1] == b[0] for a, b in itertools.pairwise(route))
        view = graph.subgraph([*switches, f"gpu{src}", f"gpu{dst}"])
        assert len(route) == nx.shortest_path_length(view, f"gpu{src}", f"gpu{dst}")
    assert "core0" in vertices(fabric.route(0, gpus - 1))


def test_failed_nic_reroutes_through_a_neighbour_gpu() -> None:
    cluster = load_hardware("dgx-h100", gpus=16)
    healthy = Fabric(cluster)
    fabric = Fabric(cluster, failed=["node0/nic0"])
    assert vertices(healthy.route(0, 8)) == ["gpu0", "node0/nic0", "leaf0/rail0", "node1/nic0", "gpu8"]
    # PXN-like: over NVLink to GPU 1 (the first of seven equal choices), out of its NIC, back to rail 0 via the spine.
    assert vertices(fabric.route(0, 8)) == [
        "gpu0",
        "node0/nvswitch",
        "gpu1",
        "node0/nic1",
        "leaf0/rail1",
        "spine0",
        "leaf0/rail0",
        "node1/nic0",
        "gpu8",
    ]
    assert vertices(fabric.route(8, 0))[-4:] == ["node0/nic1", "gpu1", "node0/nvswitch", "gpu0"]
    assert fabric.route(1, 9) == healthy.route(1, 9)  # untouched
    fabric.route(0, 1)
    assert fabric.detours == {(0, 8), (8, 0)}
    assert ("gpu0", "node0/nic0") not in fabric.capacity_Bps
    assert ("node0/nic0", "leaf0/rail0") not in fabric.capacity_Bps


def test_failed_nvswitch_sends_intra_node_traffic_through_the_network() -> None:
    fabric = Fabric(load_hardware("dgx-a100", gpus=16), failed=["node0/nvswitch"])
    assert vertices(fabric.route(0, 1)) == [
        "gpu0",
        "node0/nic0",
        "leaf0/rail0",
        "spine0",
        "leaf0/rail1",
        "node0/nic1",
        "gpu1",
    ]
    assert fabric.detours == {(0, 1)}


def test_failed_spine_uplink_reroutes_via_another_rail() -> None:
    fabric = Fabric(load_hardware("dgx-h100", gpus=64 * 8), failed=["leaf0/rail0--spine0"])
    route = fabric.route(0, 32 * 8)  # node 0 to node 32: different scalable units, rail 0
    assert vertices(route) == [
        "gpu0",
        "node0/nvswitch",
        "gpu1",
        "node0/nic1",
        "leaf0/rail1",
        "spine0",
        "leaf1/rail0",
        "node32/nic0",
        "gpu256",
    ]
    assert fabric.detours == {(0, 256)}


def test_no_route_left_is_a_clear_error() -> None:
    fabric = Fabric(load_hardware("dgx-a100", gpus=16), failed=["node0/nic0", "node0/nvswitch"])
    with pytest.raises(PlansimError, match=r"no route from rank 0 to rank 9: .*node0/nic0, node0/nvswitch"):
        fabric.route(0, 9)
    with pytest.raises(PlansimError, match="rank 16 is outside"):
        fabric.route(0, 16)


def test_routes_are_deterministic() -> None:
    cluster = load_hardware("dgx-h100", gpus=256)
    rng = random.Random(1)
    pairs = [tuple(rng.sample(range(256), 2)) for _ in range(50)]
    failed = ["node0/nic0", "leaf0/rail3", "node5/nvswitch"]
    first, second = Fabric(cluster, failed=failed), Fabric(cluster, failed=list(reversed(failed)))
    assert [first.route(*p) for p in pairs] == [second.route(*p) for p in reversed(pairs)][::-1]
    assert first.detours == second.detours


# Capacities: one truth with the analytic engine's links.


def ring_all_reduce_s(fabric: Fabric, ranks: list[int], n_bytes: float) -> float:
    """Time of a ring all-reduce of ``n_bytes`` among ``ranks``: 2 (n - 1) steps of n_bytes / n per rank."""
    env = simpy.Environment()
    net = FlowNetwork(env, fabric.capacity_Bps)
    n = len(ranks)

    def ring() -> Generator[Any]:
        for _ in range(2 * (n - 1)):
            sends = [
                net.transfer(dict.fromkeys(fabric.route(a, b), 1.0), n_bytes / n)
                for a, b in zip(ranks, ranks[1:] + ranks[:1], strict=True)
            ]
            yield env.all_of(sends)

    env.process(ring())
    env.run()
    return env.now


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100", "hgx-h200", "pcie-4x4090"])
def test_ring_all_reduce_in_a_node_gets_the_measured_bus_bandwidth(name: str) -> None:
    cluster = load_hardware(name)
    n = cluster.gpus_per_node
    seconds = ring_all_reduce_s(Fabric(cluster), list(range(n)), 1e9)
    busbw = 2 * (n - 1) / n * 1e9 / seconds
    assert busbw == pytest.approx(cluster.node.intra_node.allreduce_busbw_Bps, rel=1e-12)
    assert busbw == pytest.approx(cluster.group_link(n, 1).bandwidth_Bps, rel=1e-12)


@pytest.mark.parametrize("name", ["dgx-1", "dgx-a100", "dgx-h100", "pcie-4x4090"])
def test_every_gpu_sending_to_the_next_node_gets_its_nic_share(name: str) -> None:
    """All GPUs of node 0 send to their counterparts on node 1 at once: those sharing a NIC split it."""
    cluster = load_hardware(name, gpus=2 * load_hardware(name).gpus_per_node)
    fabric = Fabric(cluster)
    per_node = cluster.gpus_per_node
    env = simpy.Environment()
    net = FlowNetwork(env, fabric.capacity_Bps)
    for rank in range(per_node):
        net.transfer(dict.fromkeys(fabric.route(rank, rank + per_node), 1.0), 1e9)
    expected = cluster.node.nic_share_Bps * cluster.node.nics.efficiency
    assert [rate for _, rate in net.active_rates()] == pytest.approx([expected] * per_node, rel=1e-12)
    assert expected == pytest.approx(cluster.p2p_link(0, per_node).bandwidth_Bps)


def test_oversubscribed_spine_matches_the_analytic_p2p_link() -> None:
    """pcie-4x4090: 16 nodes per leaf, spine 2:1. All GPUs of nodes 0-15 send to nodes 16-31."""
    cluster = load_hardware("pcie-4x4090", gpus=128)
    fabric = Fabric(cluster)
    env = simpy.Environment()
    net = FlowNetwork(env, fabric.capacity_Bps)
    for rank in range(64):
        net.transfer(dict.fromkeys(fabric.route(rank, rank + 64), 1.0), 1e9)
    rates = [rate for _, rate in net.active_rates()]
    assert rates == pytest.approx([cluster.p2p_link(0, 64).bandwidth_Bps] * 64, rel=1e-12)


def test_latency_is_the_analytic_engines() -> None:
    cluster = load_hardware("dgx-h100", gpus=2048)
    fabric = Fabric(cluster)
    for src, dst in [(0, 0), (0, 1), (0, 8), (0, 2047)]:
        assert fabric.latency_s(src, dst) == cluster.p2p_link(src, dst).latency_s


# What-if selectors.


def test_link_factors_scale_both_directions_and_multiply() -> None:
    cluster = load_hardware("dgx-a100", gpus=16)
    base = Fabric(cluster).capacity_Bps
    fabric = Fabric(cluster, link_factors={"node0/nic0": 0.5, "gpu0--node0/nic0": 0.5, "gpu3--node0/nvswitch": 2})
    assert fabric.capacity_Bps[("node0/nic0", "leaf0/rail0")] == base[("node0/nic0", "leaf0/rail0")] / 2
    assert fabric.capacity_Bps[("leaf0/rail0", "node0/nic0")] == base[("leaf0/rail0", "node0/nic0")] / 2
    assert fabric.capacity_Bps[("gpu0", "node0/nic0")] == base[("gpu0", "node0/nic0")] / 4
    assert fabric.capacity_Bps[("node0/nvswitch", "gpu3")] == base[("node0/nvswitch", "gpu3")] * 2
    assert fabric.capacity_Bps[("gpu1", "node0/nic1")] == base[("gpu1", "node0/nic1")]
    assert base[("gpu0", "node0/nic0")] == 25e9 * 0.96  # NIC edge x NIC efficiency
    assert base[("leaf0/rail0", "spine0")] == pytest.approx(2 * 25e9 * 0.96)  # 2 NICs below, non-blocking


def test_bad_selectors_and_factors_are_clear_errors() -> None:
    cluster = load_hardware("dgx-h100", gpus=16)
    with pytest.raises(PlansimError, match=r"unknown link selector 'node0/nic9'.*node0/nic0"):
        Fabric(cluster, failed=["node0/nic9"])
    with pytest.raises(PlansimError, match=r"unknown link selector 'gpu0--nvswitch'"):
        Fabric(cluster, link_factors={"gpu0--nvswitch": 0.5})
    with pytest.raises(PlansimError, match=r"no link gpu0--leaf0/rail0; gpu0 links to node0/nic0, node0/nvswitch"):
        Fabric(cluster, failed=["gpu0--leaf0/rail0"])
    with pytest.raises(PlansimError, match="use --fail-link node0/nic0 instead"):
        Fabric(cluster, link_factors={"node0/nic0": 0})
    with pytest.raises(PlansimError, match="positive number"):
        Fabric(cluster, link_factors={"node0/nic0": float("nan")})


def test_describe_links_names_the_selectors() -> None:
    text = Fabric(load_hardware("dgx-h100", gpus=512)).describe_links()
    assert "gpu0..gpu511" in text
    assert "node0/nic0..node0/nic7, node0/nvswitch" in text
    assert "leaf0/rail0..leaf1/rail7" in text
    assert len(text.splitlines()) <= 8


def test_routes_on_ten_thousand_gpus() -> None:
    """Smoke test of the 10,240-GPU fabric (benchmarks/bench_network.py times it)."""
    cluster = load_hardware("dgx-h100", gpus=10240)
    fabric = Fabric(cluster, failed=["node0/nic0"])
    rng = random.Random(2)
    for _ in range(100):
        src, dst = rng.sample(range(10240), 2)
        assert transits(fabric.route(src, dst)) == []
    assert len(transits(fabric.route(0, 10239))) == 1


# Ring channels on rail-optimised fabrics (Fabric.ring_route; NCCL's same-NIC channels, NCCL src/graph/search.cc).

_RAIL_NODES = ("dgx-a100", "dgx-h100", "hgx-h200")  # the shipped NVSwitch nodes on rail-optimised leaves


def test_ring_hop_leaves_through_the_nic_of_the_next_nodes_entry_gpu() -> None:
    fabric = Fabric(load_hardware("dgx-h100", gpus=16))
    # GPU 7 is not next to NIC 0: over NVLink to GPU 0 (PXN), then rail 0 to node 1's NIC 0
    assert vertices(fabric.ring_route(7, 8)) == [
        "gpu7",
        "node0/nvswitch",
        "gpu0",
        "node0/nic0",
        "leaf0/rail0",
        "node1/nic0",
        "gpu8",
    ]
    assert fabric.ring_route(0, 8) == fabric.route(0, 8)  # already on the rail
    assert fabric.ring_route(3, 5) == fabric.route(3, 5)  # inside a node


def test_ring_hop_relays_only_through_a_gpu_with_a_direct_nvlink() -> None:
    """dgx-1: NIC k serves GPUs 2k and 2k+1. GPU 1 -> NIC 1 relays through GPU 2 (link 1-2); GPU 7 has no link to
    GPU 0 or 1 (NIC 0), and NCCL relays only over a direct NVLink (paths.cc, PATH_NVL), so that hop keeps its
    plain route and crosses rails."""
    fabric = Fabric(load_hardware("dgx-1", gpus=16))
    assert vertices(fabric.ring_route(1, 10)) == [
        "gpu1",
        "gpu2",
        "node0/nic1",
        "leaf0/rail1",
        "node1/nic1",
        "gpu10",
    ]
    assert fabric.ring_route(7, 8) == fabric.route(7, 8)
    assert "spine0" in vertices(fabric.ring_route(7, 8))


def _ring_run(name: str, gpus: int, collective: str = "all_reduce", what_if: Any = None) -> Any:
    from plansim.des.engine import simulate_collective

    return simulate_collective(load_hardware(name, gpus=gpus), collective, "ring", range(gpus), 1e9, what_if=what_if)


@pytest.mark.parametrize("name", _RAIL_NODES)
@pytest.mark.parametrize("gpus", [16, 64])
@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter"])
def test_ring_channels_inside_a_scalable_unit_never_reach_the_spine(name: str, gpus: int, collective: str) -> None:
    run = _ring_run(name, gpus, collective)
    assert run.link_bytes
    assert not [link for link in run.link_bytes if "spine" in link]


def test_ring_channels_across_scalable_units_stay_on_their_rail() -> None:
    """dgx-a100 x 256: 32 nodes, 20 per leaf group, so each channel's ring climbs to the spine on two hops only
    (node 19 -> 20 and 31 -> 0), each carrying the channel's share of ``2 (p-1)/p`` x 1 GB; and per rail what
    climbs equals what comes down on that rail: no byte changes rails."""
    run = _ring_run("dgx-a100", 256)
    up: dict[str, float] = {}
    down: dict[str, float] = {}
    for link, n_bytes in run.link_bytes.items():
        src, dst = link.split("->")
        if dst == "spine0":
            rail = src.split("/")[1]
            up[rail] = up.get(rail, 0.0) + n_bytes
        elif src == "spine0":
            rail = dst.split("/")[1]
            down[rail] = down.get(rail, 0.0) + n_bytes
    assert sorted(up) == [f"rail{r}" for r in range(8)]
    assert up.keys() == down.keys()
    assert sum(up.values()) == pytest.approx(2 * 2 * 255 / 256 * 1e9, rel=1e-9)
    for rail, n_bytes in up.items():
        assert n_bytes == pytest.approx(down[rail], rel=1e-9)


@pytest.mark.parametrize("gpus", [16, 32])  # two and four DGX A100 nodes
def test_ring_all_reduce_ignores_a_degraded_spine(gpus: int) -> None:
    """docs/network-model.md: with every channel's hop between nodes on one rail, a spine at 1 % of its bandwidth
    carries nothing of the ring (before this layout: 976.7 ms instead of 9.9 ms on two nodes)."""
    from plansim.des.engine import WhatIf

    healthy = _ring_run("dgx-a100", gpus).seconds
    degraded = _ring_run("dgx-a100", gpus, what_if=WhatIf(link_factors={"spine0": 0.01})).seconds
    assert degraded == pytest.approx(healthy, rel=0.02)
