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
