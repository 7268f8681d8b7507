"""The device mesh against brute force on small meshes: coordinates, groups, neighbours, copies, node-local groups."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plansim.hardware import load_hardware
from plansim.strategy.mesh import DeviceMesh, mesh_of
from plansim.strategy.schema import Strategy

sizes = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))


def _mesh(tp: int, dp: int, pp: int) -> DeviceMesh:
    return DeviceMesh((("tp", tp), ("dp", dp), ("pp", pp)))


def _all_coords(tp: int, dp: int, pp: int) -> list[dict[str, int]]:
    """Every coordinate, enumerated with tp fastest (the brute-force rank order)."""
    return [{"tp": t, "dp": d, "pp": p} for p, d, t in itertools.product(range(pp), range(dp), range(tp))]


@settings(max_examples=60, deadline=None)
@given(sizes)
def test_ranks_enumerate_coordinates_fastest_axis_first(shape: tuple[int, int, int]) -> None:
    mesh = _mesh(*shape)
    coords = _all_coords(*shape)
    assert mesh.num_ranks == len(coords)
    for rank, c in enumerate(coords):
        assert mesh.coords(rank) == c
        assert mesh.rank(**c) == rank


@settings(max_examples=60, deadline=None)
@given(sizes, st.sampled_from(["tp", "dp", "pp"]))
def test_group_is_every_rank_that_differs_only_on_the_axis(shape: tuple[int, int, int], axis: str) -> None:
    mesh = _mesh(*shape)
    coords = _all_coords(*shape)
    for rank, c in enumerate(coords):
        same = [r for r, o in enumerate(coords) if all(o[a] == c[a] for a in c if a != axis)]
        assert list(mesh.group(axis, rank)) == sorted(same, key=lambda r: coords[r][axis])


@settings(max_examples=60, deadline=None)
@given(sizes, st.integers(-5, 5))
def test_shift_moves_along_pp_and_wraps(shape: tuple[int, int, int], steps: int) -> None:
    mesh = _mesh(*shape)
    for rank, c in enumerate(_all_coords(*shape)):
        assert mesh.coords(mesh.shift("pp", rank, steps)) == {**c, "pp": (c["pp"] + steps) % shape[2]}


def test_megatron_layout_groups() -> None:
    """Megatron-LM's rank order (tp fastest, then dp, then pp): tp groups are adjacent ranks, dp groups ranks tp apart
    inside a stage, stages tp*dp apart."""
    mesh = mesh_of(Strategy(dp=2, tp=4, pp=3))
    assert mesh.group("tp", 13) == (12, 13, 14, 15)
    assert mesh.group("dp", 13) == (9, 13)
    assert mesh.group("pp", 13) == (5, 13, 21)
    assert mesh.stride("pp") == 8


@pytest.mark.parametrize(("axis", "expected"), [("tp", (0, 4)), ("dp", (0, 1, 2, 3)), ("pp", (0, 1, 2, 3, 4, 5, 6, 7))])
def test_copies_are_one_rank_per_group_within_a_stage(axis: str, expected: tuple[int, ...]) -> None:
    assert _mesh(4, 2, 3).copies(axis, "pp") == expected


@pytest.mark.parametrize(("tp", "dp", "local"), [(1, 16, 8), (2, 16, 4), (8, 4, 1), (2, 6, 3), (4, 3, 1), (1, 4, 4)])
def test_local_size_is_the_largest_divisor_that_fits_a_node(tp: int, dp: int, local: int) -> None:
    """Brute force: the largest divisor of dp whose members (tp apart) fit on one 8-GPU node."""
    mesh = _mesh(tp, dp, 1)
    assert (
        mesh.local_size("dp", 8) == local == max(d for d in range(1, dp + 1) if (dp % d == 0 and d * tp <= 8) or d == 1)
    )


def test_links_are_the_clusters_group_links() -> None:
    cluster = load_hardware("dgx-a100", gpus=64)
    mesh = _mesh(2, 32, 1)
    assert mesh.link("dp", cluster) == cluster.group_link(32, 2)
    local, intra, inter = mesh.split_links("dp", cluster)
    assert (local, intra, inter) == (4, cluster.group_link(4, 2), cluster.group_link(8, 8))
    assert _mesh(2, 4, 1).split_links("dp", cluster)[2] is None  # one node: no inter-node level


def test_bad_axes_are_refused() -> None:
    with pytest.raises(ValueError, match="distinct names"):
        DeviceMesh((("tp", 2), ("tp", 2)))


# Expert parallelism's axes: one pipeline stage's tp x cp x dp ranks regrouped as etp x ep x edp (fastest first), the
# way Megatron-LM's expert RankGenerator (order tp-ep-dp-pp, NVIDIA/Megatron-LM d98e8a64,
# megatron/core/parallel_state.py:870-907) numbers them. The expected groups below are worked by hand from its rank
# formula rank = etp_i + etp * (ep_i + ep * (edp_i + edp * pp_i)).


def _expert_mesh(tp: int, cp: int, dp: int, pp: int, etp: int, ep: int) -> DeviceMesh:
    return mesh_of(Strategy(tp=tp, cp=cp, dp=dp, pp=pp, etp=etp, ep=ep))


def test_expert_groups_tp2_dp4_pp2_etp1_ep4_by_hand() -> None:
    """16 ranks, etp 1, ep 4, edp = 16 / (1 * 4 * 2) = 2: ep groups are runs of 4 adjacent ranks (they take the
    attention's tp ranks), edp pairs 4 apart, pipeline groups as the dense ones (8 apart)."""
    m = _expert_mesh(2, 1, 4, 2, 1, 4)
    assert [m.group("ep", r) for r in (0, 4, 8, 12)] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)]
    assert [m.group("edp", r) for r in (0, 1, 2, 3, 8, 11)] == [(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (11, 15)]
    assert m.group("etp", 5) == (5,)
    assert m.group("pp", 5) == (5, 13)
    assert (m.size("ep"), m.stride("ep"), m.size("edp"), m.stride("edp")) == (4, 1, 2, 4)


def test_expert_groups_tp2_dp4_pp2_etp2_ep2_by_hand() -> None:
    """etp 2 (the attention's tp), ep 2, edp 2: etp groups are the tp pairs, ep pairs 2 apart, edp pairs 4 apart."""
    m = _expert_mesh(2, 1, 4, 2, 2, 2)
    assert [m.group("etp", r) for r in (0, 2, 9)] == [(0, 1), (2, 3), (8, 9)]
    assert m.group("etp", 9) == m.group("tp", 9)
    assert [m.group("ep", r) for r in (0, 1, 4, 13)] == [(0, 2), (1, 3), (4, 6), (13, 15)]
    assert [m.group("edp", r) for r in (0, 3, 10)] == [(0, 4), (3, 7), (10, 14)]


def test_expert_groups_with_context_parallelism_fold_over_the_cp_ranks() -> None:
    """tp2 cp2 dp2 (8 ranks, one stage), etp 1, ep 4: the expert generator has cp 1, so ep takes the tp and cp ranks
    (0..3: tp 0-1 x cp 0-1 of dp rank 0) and edp = 8 / 4 = 2 pairs them across dp."""
    m = _expert_mesh(2, 2, 2, 1, 1, 4)
    assert m.group("ep", 6) == (4, 5, 6, 7)
    assert m.group("cp", 6) == (4, 6) and m.group("dp", 6) == (2, 6)
    assert m.group("edp", 6) == (2, 6)
    assert m.copies("ep", "pp") == (0, 4)


def test_a_dense_strategy_has_expert_axes_of_its_own_degrees() -> None:
    """ep 1, etp the attention's tp: the expert layers' groups are the dense ones (edp: the gradients' dp x cp)."""
    m = mesh_of(Strategy(tp=2, cp=2, dp=2, pp=2))
    for r in range(m.num_ranks):
        assert m.group("etp", r) == m.group("tp", r)
        assert m.group("ep", r) == (r,)
        assert m.group("edp", r) == m.group("dp_cp", r)


@settings(max_examples=80, deadline=None)
@given(st.tuples(*(st.sampled_from([1, 2, 3, 4]) for _ in range(4))), st.data())
def test_expert_groups_against_brute_force(shape: tuple[int, int, int, int], data: st.DataObject) -> None:
    """Every rank's expert coordinates by brute-force enumeration (etp fastest, then ep, edp, pp): each group is the
    ranks that differ from it on that axis only, every rank is in exactly one group per axis, etp x ep x edp is the
    stage's tp x cp x dp, and the pipeline axis is unchanged."""
    tp, cp, dp, pp = shape
    stage = tp * cp * dp
    divisors = [d for d in range(1, stage + 1) if stage % d == 0]
    etp = data.draw(st.sampled_from(divisors))
    ep = data.draw(st.sampled_from([d for d in divisors if (stage // etp) % d == 0]))
    edp = stage // (etp * ep)
    m = mesh_of(Strategy(tp=tp, cp=cp, dp=dp, pp=pp, etp=etp, ep=ep))
    assert (m.size("etp"), m.size("ep"), m.size("edp")) == (etp, ep, edp)
    coords = [
        {"etp": t, "ep": e, "edp": d, "pp": p}
        for p, d, e, t in itertools.product(range(pp), range(edp), range(ep), range(etp))
    ]
    assert len(coords) == m.num_ranks
    for axis in ("etp", "ep", "edp", "pp"):
        groups = {m.group(axis, r) for r in range(m.num_ranks)}
        assert sorted(r for g in groups for r in g) == list(range(m.num_ranks))  # a partition
        for rank, c in enumerate(coords):
            same = [r for r, o in enumerate(coords) if all(o[a] == c[a] for a in c if a != axis)]
            assert list(m.group(axis, rank)) == sorted(same, key=lambda r: coords[r][axis])
            assert m.coords(rank)["pp"] == c["pp"]


def test_expert_links_and_node_local_groups_are_asked_like_any_axis() -> None:
    """An ep group of 8 ranks 2 apart (etp 2) on 8-GPU nodes: the cluster's link of that size and stride; its
    node-local part is 4 ranks, the rest across 4 nodes."""
    cluster = load_hardware("dgx-a100", gpus=64)
    m = mesh_of(Strategy(tp=2, dp=32, etp=2, ep=8))
    assert m.link("ep", cluster) == cluster.group_link(8, 2)
    assert m.split_links("ep", cluster) == (4, cluster.group_link(4, 2), cluster.group_link(2, 8))
    assert m.local_size("edp", 8) == 1  # edp ranks are 16 apart


def test_expert_axes_under_hybrid_sharding_regroup_one_replica() -> None:
    """torchtitan's sparse mesh (pp, dp_replicate, efsdp, ep, etp; parallel_dims.py:136-158 at v0.2.2): tp2
    dp_shard 2 dp_replicate 2, ep 4 etp 1: efsdp = 2 * 2 / 4 = 1, the ep groups are each replica's 4 ranks, and the
    expert gradients' groups are edp (singletons) beside dp_replicate."""
    m = mesh_of(Strategy(tp=2, dp=4, dp_shard=2, zero=3, framework="fsdp", ep=4, etp=1))
    assert m.group("ep", 5) == (4, 5, 6, 7) and m.group("edp", 5) == (5,)
    assert m.group("dp_replicate", 5) == (1, 5)


def test_bad_expert_axes_are_refused() -> None:
    axes = (("tp", 2), ("dp", 4), ("pp", 2))
    with pytest.raises(ValueError, match="regrouped"):
        DeviceMesh(axes, regrouped=(("etp", 1), ("ep", 3), ("edp", 1)))  # 3 regroups no run of fastest axes
    with pytest.raises(ValueError, match="regrouped"):
        DeviceMesh(axes, regrouped=(("tp", 2), ("ep", 4)))  # a name the mesh has
    assert "ep" not in mesh_of(Strategy(tp=2, dp=3, ep=4)).names  # left to the checks, which refuse it
    assert mesh_of(Strategy(tp=2, dp=3, ep=4)).regrouped == ()
