"""The planner: its space against a brute-force enumeration judged by ``check_strategy``, its winner against the
discrete-event engine run on every candidate, its fit verdicts against the analytic memory model, and the CLI."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plansim.analytic import simulate_analytic
from plansim.api import load_hardware, load_model
from plansim.cli import app
from plansim.costs.collectives import ALLREDUCE_ALGORITHMS
from plansim.planner import Constraints, plan, training_cost
from plansim.planner.search import search
from plansim.planner.space import candidates
from plansim.schedules import SCHEDULES
from plansim.sim.engine import simulate_des
from plansim.strategy import Strategy
from plansim.strategy_checks import check_strategy

runner = CliRunner()

# --------------------------------------------------------------------------------------------------------------------
# the space
# --------------------------------------------------------------------------------------------------------------------


def _canonical(s: Strategy) -> Strategy:
    """Strategies that price alike (space.py's docstring) mapped to one representative."""
    update: dict = {}
    if s.pp == 1:
        update |= {"schedule": "1f1b", "virtual_stages": 1}
    if s.dp == 1:
        update |= {"zero": 0, "dp_algorithm": next(iter(ALLREDUCE_ALGORITHMS))}  # the first: nccl
    elif s.zero >= 1:
        # the reduce-scatter runs as the entry's sharded_with: ring, butterfly or nccl (NCCL's pick)
        sharded = ALLREDUCE_ALGORITHMS[s.dp_algorithm].sharded_with
        update |= {"dp_algorithm": sharded}
    return s.model_copy(update=update)


@pytest.mark.parametrize("name,gpus,batch", [("gpt3-125m", 8, 16), ("llama2-7b", 16, 8), ("mlp-small", 4, 8)])
def test_space_is_every_runnable_strategy_once(name: str, gpus: int, batch: int) -> None:
    """Brute force over every field value (remat none: the other policies multiply the space alike), kept when
    ``check_strategy`` accepts it, one per class of strategies that price alike: the same set as ``candidates``,
    which holds no two alike."""
    model, cluster = load_model(name), load_hardware("dgx-a100", gpus=gpus)
    got = list(candidates(model, cluster, batch, Constraints(remat=("none",))))
    assert len(got) == len(set(got))
    assert len({_canonical(s) for s in got}) == len(got)
    want = set()
    divs = [d for d in range(1, gpus + 1) if gpus % d == 0]
    for tp, pp, mb in itertools.product(divs, divs, range(1, batch + 1)):
        if gpus % (tp * pp):
            continue
        pipelines = [(x, 1) for x in SCHEDULES] + [("interleaved", v) for v in range(2, model.layers + 1)]
        for (schedule, v), zero, sp, overlap, alg in itertools.product(
            pipelines, (0, 1, 2, 3), (False, True), (False,), Constraints().dp_algorithms
        ):  # tp_comm_overlap is tried on the finalists, not searched (test_frameworks)
            if sp and tp == 1:
                continue
            s = Strategy(
                dp=gpus // (tp * pp), tp=tp, pp=pp, micro_batch=mb, global_batch=batch, schedule=schedule,
                virtual_stages=v, zero=zero, sequence_parallel=sp, tp_comm_overlap=overlap, remat="none",
                dp_algorithm=alg,
            )  # fmt: skip
            if not check_strategy(s, model, cluster):
                want.add(_canonical(s))
    # a ZeRO class whose sharded collectives are an all-reduce the search leaves out (ring) is left out too
    searched = Constraints().dp_algorithms
    want = {s for s in want if s.zero == 0 or s.dp == 1 or s.dp_algorithm in searched}
    assert set(got) == want


# --------------------------------------------------------------------------------------------------------------------
# the winner against the DES on every candidate
# --------------------------------------------------------------------------------------------------------------------

CASES = [
    ("gpt3-125m", 8, 16, Constraints(dp_algorithms=("ring", "tree"), remat=("none",))),
    ("gpt3-1.3b", 16, 16, Constraints(dp_algorithms=("ring",), remat=("selective",), max_micro_batch=2)),
    ("llama2-7b", 32, 32, Constraints(dp_algorithms=("ring",), remat=("selective",), max_micro_batch=1)),
    (
        "gpt3-13b",
        64,
        64,
        Constraints(remat=("selective",), micro_batch=1, sequence_parallel=True, dp_algorithms=("ring",)),
    ),
]


@pytest.mark.parametrize("name,gpus,batch,constraints", CASES, ids=[c[0] for c in CASES])
def test_winner_is_the_des_best_of_every_candidate(name: str, gpus: int, batch: int, constraints: Constraints) -> None:
    """The analytic pre-ranking keeps the optimum: simulating EVERY candidate that fits with the discrete-event
    engine finds no step faster than the planner's winner (top 10 re-simulated)."""
    model, cluster = load_model(name), load_hardware("dgx-a100", gpus=gpus)
    r = plan(model, cluster, global_batch=batch, constraints=constraints, milp=False, splits=False)
    assert r.winner_result is not None and r.winner_result.engine == "des"
    every = [simulate_des(model, cluster, s) for s in candidates(model, cluster, batch, constraints)]
    best = min(x.step_time_s for x in every if x.fits)
    assert r.winner_result.step_time_s == pytest.approx(best, rel=1e-9)


# --------------------------------------------------------------------------------------------------------------------
# fit verdicts
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,gpus,batch", [("gpt3-1.3b", 8, 64), ("llama2-7b", 16, 32)])
def test_fit_verdicts_match_the_memory_model(name: str, gpus: int, batch: int) -> None:
    """Every candidate is counted once, as fitting or rejected; a fitting one's peak is within the device and a
    rejected one's is not; and the planner's (cached) pricing equals a fresh ``simulate_analytic`` call."""
    model, cluster = load_model(name), load_hardware("dgx-a100", gpus=gpus)
    c = Constraints(dp_algorithms=("ring",))
    out = search(model, cluster, batch, c, des=False, milp=False, top_k=3)
    capacity = cluster.gpu.memory_bytes
    assert len(out.fitting) + sum(out.rejected.values()) == out.candidates
    assert all(p.result.peak_memory_bytes <= capacity for p in out.fitting)
    fitting = {p.strategy for p in out.fitting}
    rejected = [s for s in candidates(model, cluster, batch, c) if s not in fitting]
    assert len(rejected) == sum(out.rejected.values())
    for s in rejected[:: max(1, len(rejected) // 25)]:
        fresh = simulate_analytic(model, cluster, s)
        assert not fresh.fits and fresh.peak_memory_bytes > capacity
    for p in out.fitting[:: max(1, len(out.fitting) // 25)]:
        assert simulate_analytic(model, cluster, p.strategy).to_dict() == p.result.to_dict()


def test_jobs_give_the_same_outcome() -> None:
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    c = Constraints(dp_algorithms=("ring",), remat=("none", "full"))
    one = search(model, cluster, 16, c, milp=False, top_k=3)
    two = search(model, cluster, 16, c, milp=False, top_k=3, jobs=2)
    assert [(p.index, p.strategy) for p in one.fitting] == [(p.index, p.strategy) for p in two.fitting]
    assert one.rejected == two.rejected
    assert [f.priced.strategy for f in one.finalists] == [f.priced.strategy for f in two.finalists]

    def figures(out):  # type: ignore[no-untyped-def]  # figures only (run times are in timings)
        return [(f.des.step_time_s, f.des.peak_memory_bytes, f.des.comm_bytes_per_gpu) for f in out.finalists if f.des]

    assert figures(one) == figures(two) and len(figures(one)) == 3


def test_training_cost_by_hand() -> None:
    r = plan("gpt3-125m", "dgx-a100", gpus=8, global_batch=16, des=False, tokens=1e9, price_per_gpu_hour=2.0,
             constraints=Constraints(dp_algorithms=("ring",), remat=("none",)))  # fmt: skip
    assert r.training is not None and r.winner_result is not None
    steps = math.ceil(1e9 / (2048 * 16))
    assert r.training.steps == steps
    assert r.training.gpu_hours == pytest.approx(steps * r.winner_result.step_time_s * 8 / 3600)
    assert r.training.cost == pytest.approx(2.0 * r.training.gpu_hours)
    with pytest.raises(Exception, match="--tokens"):
        training_cost(r.winner_result, 0, 2048, 16, None)


# --------------------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------------------

M125 = ["--model", "gpt3-125m", "--gpus", "8"]
SMALL = ["plan", "--model", "gpt3-125m", "--gpus", "8", "--global-batch", "16", "--remat", "none,full"]


def test_cli_plan_writes_the_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = runner.invoke(app, [*SMALL, "--out", str(out), "--format", "json", "--top", "3"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    names = {Path(p).name for p in data["files"]}
    assert names == {"results.csv", "candidates.csv", "results.json", "winner.yaml", "time_breakdown.svg",
                     "time_breakdown.png", "memory.svg", "memory.png"}  # fmt: skip
    assert data["winner"]["dp"] * data["winner"]["tp"] * data["winner"]["pp"] == 8
    assert "Best of" in data["explanation"] and len(data["finalists"]) == 3
    simulate = ["simulate", *M125, "--hardware", "dgx-a100", "--strategy", str(out / "winner.yaml")]
    again = runner.invoke(app, [*simulate, "--engine", "des", "--format", "json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["step_time_s"] == pytest.approx(data["winner_result"]["step_time_s"])


def test_cli_plan_text_names_winner_and_rejections() -> None:
    res = runner.invoke(app, [*SMALL, "--top", "2", "--tokens", "1e9", "--price-per-gpu-hour", "2"])
    assert res.exit_code == 0, res.output
    for words in ("Best of", "Runner-up", "Megatron-style", "GPU-hours", "search:"):
        assert words in res.stdout


@pytest.mark.parametrize(
    "argv,words",
    [
        (["plan", "--model", "gpt3-125m", "--gpus", "0", "--global-batch", "16"], ["--gpus"]),
        (["plan", *M125, "--global-batch", "0"], ["--global-batch"]),
        (["plan", *M125, "--global-batch", "7", "--micro-batch", "2"], ["--global-batch 7", "multiple of 2", "e.g. 8"]),
        (["plan", *M125, "--global-batch", "16", "--remat", "most"], ["--remat"]),
        (["plan", *M125, "--global-batch", "16", "--zero", "5"], ["--zero"]),
        (
            ["plan", "--model", "gpt3-125m", "--gpus", "8", "--global-batch", "16", "--objective", "fun"],
            ["--objective"],
        ),
        (
            ["plan", "--model", "gpt3-175b", "--gpus", "8", "--global-batch", "16"],
            ["No strategy fits", "Smallest change", "GPUs"],
        ),
    ],
    ids=["zero gpus", "zero batch", "indivisible batch", "bad remat", "bad zero", "bad objective", "nothing fits"],
)
def test_cli_plan_bad_input_is_one_line(argv: list[str], words: list[str]) -> None:
    res = runner.invoke(app, argv)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for w in words:
        assert w in lines[0]
    assert "Traceback" not in res.output


def test_model_states_prune_is_exact() -> None:
    """``model_states_exceed`` rejects without pricing only what the priced step also rejects, and those are the
    strategies with a stage whose weights, gradients, optimizer states and workspace alone exceed the device."""
    from plansim.analytic import AnalyticCache

    model, cluster = load_model("gpt3-13b"), load_hardware("dgx-a100", gpus=8)
    cache = AnalyticCache(model, cluster)
    pruned = kept = 0
    for s in candidates(model, cluster, 16, Constraints(dp_algorithms=("ring",), remat=("full",))):
        r = simulate_analytic(model, cluster, s)
        states = max(
            sum(v for k, v in _stage_memory(model, cluster, s, i).items() if k != "activations") for i in range(s.pp)
        )
        exceed = cache.model_states_exceed(s)
        assert exceed == (states > cluster.gpu.memory_bytes)
        assert not (exceed and r.fits)
        pruned, kept = pruned + exceed, kept + (not exceed)
    assert pruned and kept


def _stage_memory(model, cluster, s, idx):  # type: ignore[no-untyped-def]
    """Stage ``idx``'s static memory (weights, gradients, optimizer states, workspace) by the memory model's own
    functions, from a freshly built graph (no cache)."""
    from plansim.mesh import mesh_of
    from plansim.stages import stage_layers
    from plansim.step.layers import layer_costs, layer_programs
    from plansim.step.memory import stage_params, static_bytes
    from plansim.step.prepare import comm_pricer, prepare_step

    prep = prepare_step(model, cluster, s)
    programs = layer_programs(prep.graph, prep.kernels, mesh_of(prep.strategy))
    costs = layer_costs(programs, comm_pricer(cluster, prep.strategy))
    layers = stage_layers(model.layers, s.pp, s.virtual_stages)[idx]
    layer_params = [costs[i].params for i in layers if i in costs]
    return static_bytes(cluster, prep.strategy, stage_params(layers, costs, prep.strategy, model, idx), layer_params)


@pytest.mark.parametrize(
    "fields,words",
    [
        ({"remat": ("milp",)}, "finalists only"),
        ({"remat": ("most",)}, "remat policies"),
        ({"dp_algorithms": ("smoke",)}, "dp algorithms"),
        ({"tp": 0}, "--tp 0"),
        ({"zero": 4}, "--zero 4"),
        ({"schedule": "1f2b"}, "--schedule 1f2b"),
    ],
)
def test_constraints_name_the_bad_field(fields: dict, words: str) -> None:
    from plansim.errors import PlansimError

    with pytest.raises(PlansimError, match=words):
        Constraints(**fields)


def test_finalists_leave_out_twins_that_price_alike() -> None:
    """A candidate differing from a better one only in its all-reduce algorithm or recomputation, priced the same to
    the last bit (nccl where NCCL picks the ring; remat: milp recomputing nothing), is not a finalist: the runner-up
    would be the winner again. One that prices differently stays."""
    from dataclasses import replace

    from plansim.planner.search import Priced, _without_twins

    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    s = Strategy.parse("dp=8,micro_batch=1,global_batch=16,remat=none,dp_algorithm=nccl")
    r = simulate_analytic(model, cluster, s)
    twin_ring = Priced(1, s.model_copy(update={"dp_algorithm": "ring"}), r)
    twin_milp = Priced(2, s.model_copy(update={"remat": "milp"}), r)
    other = Priced(3, s.model_copy(update={"dp_algorithm": "tree"}), replace(r, step_time_s=r.step_time_s * 1.01))
    got = _without_twins([Priced(0, s, r), twin_ring, twin_milp, other], top_k=10)
    assert [p.index for p in got] == [0, 3]
    assert [p.index for p in _without_twins([Priced(0, s, r), twin_ring, other], top_k=2)] == [0, 3]
