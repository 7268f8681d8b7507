"""Uneven splits with interleaving: ``layer_split`` as blocks per model chunk (pp * v entries in model order, chunk c
on stage c % pp) or per stage (spread over its chunks); the even split given either way changes nothing in either
engine; an uneven one is priced alike by both (the analytic engine runs the order pass by pass where the chunks
differ); bad splits are named; the planner balances an interleaved finalist's chunks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedules import brute_force

from plansim.analytic.engine import simulate_analytic
from plansim.api import load_hardware, load_model
from plansim.des.engine import simulate_des
from plansim.errors import PlansimError
from plansim.pipeline.schedules import get_schedule
from plansim.pipeline.stages import chunk_blocks, chunk_layers, stage_layers
from plansim.planner import Constraints, plan
from plansim.planner.split import balanced_chunks, bottleneck, chunk_least
from plansim.strategy.checks import check_strategy
from plansim.strategy.schema import Strategy

BASE = dict(dp=2, pp=4, micro_batch=1, global_batch=32, schedule="interleaved", zero=1)


def _same(a: dict, b: dict) -> bool:
    """Two results' dictionaries equal but for the strategy each echoes."""
    return a | {"strategy": None} == b | {"strategy": None}


@pytest.mark.parametrize(
    "v,split",
    [
        (2, (3,) * 8),  # per chunk
        (2, (6, 6, 6, 6)),  # per stage, spread over its chunks
        (3, (2,) * 12),
    ],
)
def test_the_even_split_given_changes_nothing_in_either_engine(v: int, split: tuple[int, ...]) -> None:
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=8)
    s = Strategy(**BASE, virtual_stages=v, remat="selective")
    given = s.model_copy(update={"layer_split": split})
    assert check_strategy(given, model, cluster) == []
    assert _same(simulate_analytic(model, cluster, given).to_dict(), simulate_analytic(model, cluster, s).to_dict())
    assert _same(simulate_des(model, cluster, given).to_dict(), simulate_des(model, cluster, s).to_dict())


@pytest.mark.parametrize(
    "name,gpus,strategy,split",
    [
        ("gpt3-1.3b", 4, dict(dp=1, pp=4, virtual_stages=2, global_batch=16), (2, 3, 3, 3, 3, 3, 3, 4)),
        ("gpt3-1.3b", 4, dict(dp=1, pp=4, virtual_stages=2, global_batch=16), (3, 3, 3, 3, 3, 3, 4, 2)),
        ("gpt3-1.3b", 8, dict(dp=2, pp=4, virtual_stages=2, global_batch=32, zero=1), (3, 3, 4, 2, 3, 3, 4, 2)),
        ("gpt3-1.3b", 8, dict(dp=2, pp=4, virtual_stages=3, global_batch=32, remat="full"), (1,) + (2,) * 10 + (3,)),
        ("gpt3-1.3b", 4, dict(dp=1, pp=4, virtual_stages=2, global_batch=16), (0, 3, 3, 3, 3, 4, 4, 4)),
        ("gpt3-2.7b", 8, dict(dp=1, pp=8, virtual_stages=2, global_batch=16), (2,) * 13 + (3, 2, 1)),
    ],
)
def test_engines_agree_on_uneven_chunks(name: str, gpus: int, strategy: dict, split: tuple[int, ...]) -> None:
    """The same layers on each chunk in both engines: the same compute and memory; the analytic engine runs the
    interleaved order pass by pass with each chunk's time (``PipelineSchedule.run_time``), so the step agrees with
    the DES within 2 % (0.6 % or less on these, where the closed form, each stage's mean chunk, was off by up to
    3.7 %)."""
    model, cluster = load_model(name), load_hardware("dgx-a100", gpus=gpus)
    s = Strategy(micro_batch=1, schedule="interleaved", layer_split=split, **strategy)
    assert check_strategy(s, model, cluster) == []
    a, d = simulate_analytic(model, cluster, s), simulate_des(model, cluster, s)
    assert abs(d.step_time_s - a.step_time_s) <= 0.02 * a.step_time_s
    assert d.time_breakdown_s["compute"] == pytest.approx(a.time_breakdown_s["compute"], rel=1e-9)
    assert d.stage_peak_memory_bytes == pytest.approx(a.stage_peak_memory_bytes, rel=1e-9)


def test_the_stage_with_more_blocks_is_busiest_and_holds_more() -> None:
    """Stage 2 runs chunks 2 and 6, 4 blocks each, and stage 3 chunks 3 and 7, 2 each: stage 2 is the busiest in
    both engines and holds more than under the even split (its weights and activations), stage 3 less."""
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=8)
    s = Strategy(**BASE, virtual_stages=2)
    uneven = s.model_copy(update={"layer_split": (3, 3, 4, 2, 3, 3, 4, 2)})
    a, d = simulate_analytic(model, cluster, uneven), simulate_des(model, cluster, uneven)
    compute = [st["compute"] for st in d.stage_time_breakdown_s]
    assert max(range(4), key=compute.__getitem__) == 2
    assert a.time_breakdown_s["compute"] == pytest.approx(compute[2], rel=1e-9)  # the analytic engine's busiest
    even = simulate_analytic(model, cluster, s).stage_peak_memory_bytes
    assert a.stage_peak_memory_bytes[2] > even[2] and a.stage_peak_memory_bytes[3] < even[3]
    assert a.stage_peak_memory_bytes[:2] == even[:2]  # stages 0 and 1 keep their blocks


def test_chunks_follow_the_split_in_model_order() -> None:
    # Megatron-LM's layout order: entry i is vpp rank i // pp of pp rank i % pp
    assert chunk_blocks(10, 2, 2, [1, 3, 4, 2]) == [1, 3, 4, 2]
    assert chunk_layers(10, 2, 2, [1, 3, 4, 2]) == [[-1, 0], [1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert stage_layers(10, 2, 2, [1, 3, 4, 2]) == [[-1, 0, 4, 5, 6, 7], [1, 2, 3, 8, 9, 10]]
    assert chunk_blocks(12, 2, 2, [4, 8]) == [2, 4, 2, 4]  # per stage: each spread over its two chunks
    assert chunk_layers(6, 2, 2, [0, 3, 3, 0]) == [[-1], [0, 1, 2], [3, 4, 5], [6]]  # the ends hold no block


@pytest.mark.parametrize(
    "split,words",
    [
        ((3, 3, 3), "needs pp*virtual_stages=8 entries"),
        ((3,) * 7 + (4,), "summing to layers=24"),
        ((3, 0, 3, 3, 3, 3, 3, 6), "at least 1 block (0 for the first and the last"),
        ((5, 7, 7, 5), "give multiples of 2"),
        ((0, 8, 8, 8), "at least 2 blocks (1 a chunk)"),
    ],
)
def test_a_bad_interleaved_split_is_named(split: tuple[int, ...], words: str) -> None:
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=4)
    s = Strategy(pp=4, schedule="interleaved", virtual_stages=2, global_batch=8, layer_split=split)
    (problem,) = check_strategy(s, model, cluster)
    assert problem.startswith(f"layer_split={list(split)}: ") and words in problem and "\n" not in problem
    with pytest.raises(PlansimError, match="layer_split"):
        simulate_analytic(model, cluster, s)


def test_a_split_lifts_megatron_lm_divisibility() -> None:
    """Megatron-LM's even interleaved split needs the layers divisible by pp * v; a layout (an explicit split) does
    not: 26 blocks over 8 chunks run."""
    model, cluster = load_model("gpt3-1.3b").model_copy(update={"layers": 26}), load_hardware("dgx-a100", gpus=4)
    s = Strategy(pp=4, schedule="interleaved", virtual_stages=2, global_batch=8)
    (problem,) = check_strategy(s, model, cluster)
    assert "divisible by pp*virtual_stages=8" in problem and "give a layer_split" in problem
    split = s.model_copy(update={"layer_split": (3, 3, 4, 3, 3, 4, 4, 2)})
    assert check_strategy(split, model, cluster) == []
    a, d = simulate_analytic(model, cluster, split), simulate_des(model, cluster, split)
    assert abs(d.step_time_s - a.step_time_s) <= 0.02 * a.step_time_s


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 5), v=st.integers(1, 3), rounds=st.integers(1, 3), data=st.data())
def test_run_time_is_the_longest_path_and_the_closed_form_for_equal_chunks(p: int, v: int, rounds: int, data) -> None:  # type: ignore[no-untyped-def]
    """``run_time`` runs the orders pass by pass (``tests/test_schedules.py``'s list scheduler with times per chunk):
    the closed form where chunks are equal, never below the busiest stage's work."""
    name = "interleaved" if v > 1 and p > 1 else "1f1b"
    v = v if name == "interleaved" else 1
    m = p * rounds
    sched = get_schedule(name)
    assert sched.run_time([[(1.0, 2.0)] * v] * p, m) == pytest.approx(brute_force(name, [v] * p, [2 * v] * p, m, v)[0])
    assert sched.run_time([[(1.0, 2.0)] * v] * p, m) == pytest.approx(sched.step_time([3.0 * v] * p, m, v))
    times = data.draw(st.lists(st.lists(st.floats(0.1, 3.0), min_size=2 * v, max_size=2 * v), min_size=p, max_size=p))
    passes = [[(t[2 * c], t[2 * c + 1]) for c in range(v)] for t in times]
    assert sched.run_time(passes, m) >= m * max(sum(t) for t in times) * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(
    blocks=st.integers(4, 30),
    pp=st.integers(2, 4),
    v=st.integers(2, 3),
    first=st.floats(0.0, 3.0),
    last=st.floats(0.0, 3.0),
)
def test_balanced_chunks_are_the_brute_force_optimum(blocks: int, pp: int, v: int, first: float, last: float) -> None:
    """For blocks of equal cost (a transformer's) the slowest stage is as fast as any split makes it: brute force
    over the stages' block counts (any counts of at least their chunks' least are some split's)."""
    least = chunk_least(pp, v)
    if blocks < sum(least):
        return
    cost = [1.0] * blocks
    split = balanced_chunks(cost, first, last, pp, v)
    assert len(split) == pp * v and sum(split) == blocks
    assert all(n >= k for n, k in zip(split, least, strict=True))
    lows = [sum(least[s::pp]) for s in range(pp)]
    extra = [first if s == 0 else 0.0 for s in range(pp)]
    extra[-1] += last
    best = min(
        max(n + e for n, e in zip((*counts, blocks - sum(counts)), extra, strict=True))
        for counts in itertools.product(*(range(low, blocks + 1) for low in lows[:-1]))
        if blocks - sum(counts) >= lows[-1]
    )
    assert bottleneck(split, cost, first, last, pp) == pytest.approx(best, rel=1e-9)


def test_the_planner_balances_an_interleaved_finalist() -> None:
    """gpt3-1.3b's output layer costs about 1.7 blocks: with interleaving the even split leaves the last stage the
    slowest, and the planner's finalists include balanced per-chunk splits, priced, re-simulated and winning; the
    winner runs under the framework (Megatron-LM's --pipeline-model-parallel-layout)."""
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=16)
    c = Constraints(pp=4, schedule="interleaved", dp_algorithms=("ring",), remat=("none",), micro_batch=1, zero=1)
    r = plan(model, cluster, global_batch=64, constraints=c, milp=False)
    w = r.winner
    assert w is not None and w.virtual_stages > 1 and w.layer_split is not None
    assert len(w.layer_split) == w.pp * w.virtual_stages and check_strategy(w, model, cluster) == []
    even = w.model_copy(update={"layer_split": None})
    assert r.winner_result.step_time_s < simulate_des(model, cluster, even).step_time_s
    finalists = [f.priced.strategy for f in r.outcome.finalists]
    assert any(f.layer_split is None for f in finalists)  # the even ones stay among them
