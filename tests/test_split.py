"""Uneven layer splits: the strategy field, the stage layouts both engines read, the balanced split against brute
force over every composition, the engines agreeing on an uneven pipeline, and the planner trying the split."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from schedule_runs import framework_for

from plansim.analytic.engine import simulate_analytic
from plansim.api import load_hardware, load_model
from plansim.des.engine import simulate_des
from plansim.pipeline.stages import chunk_layers, stage_layers
from plansim.planner import Constraints, plan
from plansim.planner.output import winner_yaml
from plansim.planner.split import balanced_split, bottleneck
from plansim.strategy.checks import check_strategy
from plansim.strategy.schema import Strategy


def _compositions(n: int, parts: int) -> Iterator[list[int]]:
    """Every way to write n as an ordered sum of ``parts`` positive integers, lazily."""
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0, *cuts, n)
        yield [b - a for a, b in itertools.pairwise(bounds)]


@settings(max_examples=150, deadline=None)
@given(
    blocks=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=9),
    first=st.floats(0.0, 20.0),
    last=st.floats(0.0, 20.0),
    data=st.data(),
)
def test_balanced_split_is_the_brute_force_optimum(blocks: list[float], first: float, last: float, data) -> None:  # type: ignore[no-untyped-def]
    parts = data.draw(st.integers(1, len(blocks)))
    split = balanced_split(blocks, first, last, parts)
    assert len(split) == parts and min(split) >= 1 and sum(split) == len(blocks)
    best = min(bottleneck(c, blocks, first, last) for c in _compositions(len(blocks), parts))
    assert bottleneck(split, blocks, first, last) == pytest.approx(best, rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(layers=st.integers(1, 40), data=st.data())
def test_a_split_lays_every_layer_once_in_order(layers: int, data) -> None:  # type: ignore[no-untyped-def]
    pp = data.draw(st.integers(1, layers))
    split = data.draw(st.sampled_from(list(itertools.islice(_compositions(layers, pp), 50))))
    stages = stage_layers(layers, pp, split=split)
    assert [len([i for i in s if 0 <= i < layers]) for s in stages] == split
    assert [i for s in stages for i in s] == list(range(-1, layers + 1))
    even = [sum(1 for i in c if 0 <= i < layers) for c in chunk_layers(layers, pp)]
    assert stage_layers(layers, pp, split=even) == stage_layers(layers, pp)
    assert even[0] == max(even) and max(even) - min(even) <= 1


@pytest.mark.parametrize(
    "split,words",
    [((4, 4), "needs pp=4 entries"), ((6, 6, 6, 5), "summing to layers=24"), ((12, 12, 0, 0), "at least 1")],
)
def test_a_bad_split_is_named(split: tuple[int, ...], words: str) -> None:
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=4)
    problems = check_strategy(Strategy(pp=4, layer_split=split), model, cluster)
    assert any(words in p and "layer_split" in p for p in problems), problems
    # with interleaving pp entries are blocks per stage, each spread over its chunks (tests/test_uneven_interleaved.py)
    interleaved = Strategy(pp=2, schedule="interleaved", virtual_stages=2, global_batch=4, layer_split=(12, 12))
    assert check_strategy(interleaved, model, load_hardware("dgx-a100", gpus=2)) == []


def test_the_even_split_given_explicitly_changes_nothing() -> None:
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=16)
    s = Strategy(dp=4, pp=4, micro_batch=2, global_batch=64, zero=1, remat="selective")
    a = simulate_analytic(model, cluster, s).to_dict()
    b = simulate_analytic(model, cluster, s.model_copy(update={"layer_split": (6, 6, 6, 6)}))
    assert b.to_dict() | {"strategy": a["strategy"]} == a


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_engines_agree_on_an_uneven_pipeline(schedule: str) -> None:
    """Where the engines agree on even pipelines (test_des: GPipe/1F1B, one replica), they agree on an uneven
    one within 1 %: the same layers on each stage, the same compute and memory. (The closed form (m-1) max + sum
    is exact for equal stages; with these uneven ones 1F1B's DES is 1.1 % faster at m = 8 and 0.4 % at m = 32.)"""
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=4)
    s = Strategy(
        dp=1, pp=4, micro_batch=1, global_batch=32, schedule=schedule, layer_split=(5, 7, 7, 5),
        framework=framework_for(schedule),
    )  # fmt: skip
    a, d = simulate_analytic(model, cluster, s), simulate_des(model, cluster, s)
    even = simulate_analytic(model, cluster, s.model_copy(update={"layer_split": None}))
    assert abs(d.step_time_s - a.step_time_s) <= 0.01 * a.step_time_s
    assert d.time_breakdown_s["compute"] == pytest.approx(a.time_breakdown_s["compute"], rel=1e-9)
    assert d.stage_peak_memory_bytes == pytest.approx(a.stage_peak_memory_bytes, rel=1e-6)
    assert a.step_time_s < even.step_time_s  # the output layer (~1.2 blocks for 1.3B's vocabulary) is balanced


def test_the_planner_tries_the_balanced_split() -> None:
    """gpt3-1.3b's output layer costs about 1.2 blocks: with pp=4 and 1F1B the even split leaves the last stage
    slowest, and the planner's finalists include the balanced split, priced and re-simulated, winning."""
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=16)
    c = Constraints(pp=4, schedule="1f1b", dp_algorithms=("ring",), remat=("none",), micro_batch=1, zero=1)
    r = plan(model, cluster, global_batch=64, constraints=c, milp=False)
    assert r.winner is not None and r.winner.layer_split is not None
    even = r.winner.model_copy(update={"layer_split": None})
    assert r.winner_result.step_time_s < simulate_des(model, cluster, even).step_time_s
    loaded = Strategy.model_validate(yaml.safe_load(winner_yaml(r)))  # winner.yaml keeps the split
    assert loaded == r.winner and Strategy.parse("pp=4,layer_split=5/7/7/5").layer_split == (5, 7, 7, 5)
    off = plan(model, cluster, global_batch=64, constraints=c, milp=False, splits=False)
    assert off.winner is not None and off.winner.layer_split is None


def test_the_milp_limit_reads_the_actual_split() -> None:
    from plansim.planner.search import MILP_MAX_BLOCKS, _most_blocks

    model = load_model("gpt3-1.3b")
    assert _most_blocks(model, Strategy(pp=2)) == 12 <= MILP_MAX_BLOCKS
    assert _most_blocks(model, Strategy(pp=2, layer_split=(13, 11))) == 13 > MILP_MAX_BLOCKS
    assert Strategy.parse("pp=1,layer_split=24").layer_split == (24,)
