"""The planner: its space against a brute-force enumeration judged by ``check_strategy``, its winner against the
discrete-event engine run on every candidate, its fit verdicts against the analytic memory model, and the CLI."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plansim.analytic.engine import simulate_analytic
from plansim.api import load_hardware, load_model
from plansim.cli.app import app
from plansim.costs.collectives import ALLREDUCE_ALGORITHMS
from plansim.des.engine import simulate_des
from plansim.describe import describe
from plansim.pipeline.schedules import SCHEDULES
from plansim.planner import Constraints, plan, training_cost
from plansim.planner.search import TIE, search
from plansim.planner.space import candidates
from plansim.strategy.checks import check_strategy
from plansim.strategy.schema import Strategy

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
            pipelines, (0, 1, 2, 3), (False, True), (False,), ALLREDUCE_ALGORITHMS
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
    # under Megatron-LM (NCCL) the search's all-reduce is NCCL's own pick, nccl: not NCCL_ALGO=Ring forced, not the
    # course's algorithms (no framework's library runs them)
    want = {s for s in want if s.dp_algorithm == "nccl"}
    assert set(got) == want


# --------------------------------------------------------------------------------------------------------------------
# the winner against the DES on every candidate
# --------------------------------------------------------------------------------------------------------------------

CASES = [
    ("gpt3-125m", 8, 16, Constraints(dp_algorithms=("ring", "nccl"), remat=("none",))),
    ("gpt3-1.3b", 16, 16, Constraints(dp_algorithms=("ring",), remat=("selective",), max_micro_batch=2)),
    ("llama2-7b", 32, 16, Constraints(dp_algorithms=("ring",), remat=("selective",), max_micro_batch=1)),
    (
        "gpt3-13b",
        64,
        32,
        Constraints(remat=("selective",), micro_batch=1, sequence_parallel=True, dp_algorithms=("ring",)),
    ),
]


@pytest.mark.parametrize("name,gpus,batch,constraints", CASES, ids=[c[0] for c in CASES])
def test_winner_is_the_des_best_of_every_candidate(name: str, gpus: int, batch: int, constraints: Constraints) -> None:
    """The analytic pre-ranking keeps the optimum: simulating EVERY candidate that fits with the discrete-event
    engine finds no step faster than the planner's winner (top 10 re-simulated), beyond the planner's tie: a plan
    within ``TIE`` of the fastest that needs less memory wins (``search.TIE``), so a slower winner must be one."""
    model, cluster = load_model(name), load_hardware("dgx-a100", gpus=gpus)
    r = plan(model, cluster, global_batch=batch, constraints=constraints, milp=False, splits=False)
    won = r.winner_result
    assert won is not None and won.engine == "des"
    every = [simulate_des(model, cluster, s) for s in candidates(model, cluster, batch, constraints)]
    best = min((x for x in every if x.fits and x.memory_margin >= constraints.headroom), key=lambda x: x.step_time_s)
    if won.step_time_s != pytest.approx(best.step_time_s, rel=1e-9):
        assert won.step_time_s <= best.step_time_s * (1 + TIE)
        assert won.peak_memory_bytes < best.peak_memory_bytes


# --------------------------------------------------------------------------------------------------------------------
# fit verdicts
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,gpus,batch", [("gpt3-1.3b", 8, 64), ("llama2-7b", 16, 32)])
def test_fit_verdicts_match_the_memory_model(name: str, gpus: int, batch: int) -> None:
    """Every candidate is counted once, as fitting or rejected; a fitting one's peak is within the device, less the
    headroom, and a rejected one's is not (beyond the device, or within it but inside the headroom); and the
    planner's (cached) pricing equals a fresh ``simulate_analytic`` call."""
    model, cluster = load_model(name), load_hardware("dgx-a100", gpus=gpus)
    c = Constraints(dp_algorithms=("ring",))
    out = search(model, cluster, batch, c, des=False, milp=False, top_k=3)
    capacity = cluster.gpu.memory_bytes
    assert out.fit_count + sum(out.rejected.values()) == out.candidates
    assert all(p.result.peak_memory_bytes <= capacity * (1 - c.headroom) * (1 + 1e-12) for p in out.fitting)
    pruned = [p for p in out.pruned if not p.tight]
    assert all(p.peak_memory_bytes <= capacity * (1 - c.headroom) * (1 + 1e-12) for p in pruned)
    fitting = {p.strategy for p in out.fitting} | {p.strategy for p in pruned}
    rejected = [s for s in candidates(model, cluster, batch, c) if s not in fitting]
    assert len(rejected) == sum(out.rejected.values())
    for s in rejected[:: max(1, len(rejected) // 25)]:
        fresh = simulate_analytic(model, cluster, s)
        assert fresh.peak_memory_bytes > capacity * (1 - c.headroom)
        assert fresh.fits == (fresh.peak_memory_bytes <= capacity)
    for p in out.fitting[:: max(1, len(out.fitting) // 25)]:
        assert simulate_analytic(model, cluster, p.strategy).to_dict() == p.result.to_dict()
    for q in out.pruned[:: max(1, len(out.pruned) // 25)]:  # a pruned one's memory is exact, its bound a bound
        fresh = simulate_analytic(model, cluster, q.strategy)
        assert fresh.peak_memory_bytes == q.peak_memory_bytes and fresh.memory_margin == q.memory_margin
        assert fresh.step_time_s >= q.bound_s * (1 - 1e-12)


def test_jobs_give_the_same_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    from plansim.planner import search as searching

    monkeypatch.setattr(searching, "PARALLEL_CANDIDATES", 1)  # in worker processes however small the work
    monkeypatch.setattr(searching, "PARALLEL_DES_WORK", 0)
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    c = Constraints(dp_algorithms=("ring",), remat=("none", "full"))
    one = search(model, cluster, 16, c, milp=False, top_k=3, jobs=1)
    two = search(model, cluster, 16, c, milp=False, top_k=3, jobs=2)

    def fit(out):  # type: ignore[no-untyped-def]  # priced in full or pruned: each process prunes by its own
        return sorted((p.index, p.strategy.model_dump_json()) for p in [*out.fitting, *out.pruned])

    assert fit(one) == fit(two)
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
    from plansim.pipeline.stages import stage_layers
    from plansim.step.layers import layer_costs, layer_programs
    from plansim.step.memory import stage_params, static_bytes
    from plansim.step.prepare import comm_pricer, prepare_step
    from plansim.strategy.mesh import mesh_of

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


# --------------------------------------------------------------------------------------------------------------------
# plans a framework runs: its library's collectives, ties toward less memory, twins counted, headroom, wording
# --------------------------------------------------------------------------------------------------------------------

#: NCCL's registry entries by what they say of themselves: NCCL's own pick, or NCCL_ALGO=Ring
NCCL_ENTRIES = {a for a, e in ALLREDUCE_ALGORITHMS.items() if e.nccl in ("auto", "ring")}
COURSE = sorted(set(ALLREDUCE_ALGORITHMS) - NCCL_ENTRIES)


def test_nccl_runs_the_nccl_entries_and_no_course_algorithm() -> None:
    """The registry's library property against NCCL's two modes; every framework's rule names NCCL."""
    from plansim.strategy.frameworks import framework_names, library_algorithms, load_framework

    assert {a for a, e in ALLREDUCE_ALGORITHMS.items() if e.library == "nccl"} == NCCL_ENTRIES == {"nccl", "ring"}
    assert all(ALLREDUCE_ALGORITHMS[a].library is None for a in COURSE) and len(COURSE) == 5
    for name in framework_names():
        assert load_framework(name).rules.collective_library.value == "nccl"
        assert set(library_algorithms(name)) == NCCL_ENTRIES


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "fsdp", "all"])
def test_a_frameworks_planner_never_proposes_an_algorithm_its_library_does_not_run(framework: str) -> None:
    """Every candidate, asked for or not, is one NCCL runs; by default NCCL's own pick only (the forced ring prices as
    it wherever NCCL picks the ring)."""
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    default = list(candidates(model, cluster, 16, Constraints(framework=framework, remat=("none",))))
    assert default and {s.dp_algorithm for s in default} == {"nccl"}
    both = Constraints(framework=framework, remat=("none",), dp_algorithms=("nccl", "ring"))
    assert {s.dp_algorithm for s in candidates(model, cluster, 16, both)} == NCCL_ENTRIES
    r = plan(model, cluster, global_batch=16, constraints=both, des=False, milp=False, top_k=5)
    proposed = [f.priced.strategy for f in r.outcome.finalists] + [p.strategy for p in r.outcome.fitting]
    assert proposed and all(s.dp_algorithm in NCCL_ENTRIES for s in proposed)


@pytest.mark.parametrize("algorithm", COURSE)
@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "fsdp", "all"])
def test_asking_the_planner_for_a_course_algorithm_is_refused_in_one_line(algorithm: str, framework: str) -> None:
    from plansim.errors import PlansimError

    with pytest.raises(PlansimError) as err:
        Constraints(framework=framework, dp_algorithms=("nccl", algorithm))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"--dp-algorithms {algorithm}: ")
    assert (
        "NCCL" in message
        and "does not run it" in message
        and f"plansim compare -s '...,dp_algorithm={algorithm}'" in message
    )


def test_cli_plan_dp_algorithms() -> None:
    bad = runner.invoke(app, [*SMALL, "--dp-algorithms", "butterfly", "--no-des"])
    assert bad.exit_code == 2
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Megatron-LM runs its collectives in NCCL" in lines[0], bad.stderr
    ok = runner.invoke(app, [*SMALL, "--dp-algorithms", "ring", "--no-des", "--format", "json", "--top", "2"])
    assert ok.exit_code == 0, ok.output
    assert all(f["analytic"]["strategy"]["dp_algorithm"] == "ring" for f in json.loads(ok.stdout)["finalists"])


def _priced(index: int, s: Strategy, r, **changes):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from plansim.planner.search import Priced

    return Priced(index, s, replace(r, **changes) if changes else r)


def test_equal_times_rank_the_lower_memory_first() -> None:
    """Two candidates whose step times differ by less than the tolerance: the one with the lower peak ranks first,
    though it is the slower and the later enumerated; just past the tolerance, time decides again."""
    from plansim.planner.search import OBJECTIVES, TIE, _ranked_priced

    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    s = Strategy.parse("dp=8,micro_batch=1,global_batch=16,zero=1")
    r = simulate_analytic(model, cluster, s)
    for objective in OBJECTIVES:
        key = OBJECTIVES[objective]
        fat = _priced(0, s, r, peak_memory_bytes=26.3e9)
        lean = _priced(1, s.model_copy(update={"zero": 2}), r, step_time_s=r.step_time_s * (1 + TIE / 2),
                       tokens_per_s=r.tokens_per_s / (1 + TIE / 2), peak_memory_bytes=21.4e9)  # fmt: skip
        assert [p.index for p in _ranked_priced([fat, lean], key)] == [1, 0], objective
        slow = _priced(1, lean.strategy, r, step_time_s=r.step_time_s * (1 + 2 * TIE),
                       tokens_per_s=r.tokens_per_s / (1 + 2 * TIE), peak_memory_bytes=21.4e9)  # fmt: skip
        assert [p.index for p in _ranked_priced([slow, fat], key)] == [0, 1], objective


def test_twins_are_collapsed_into_the_best_ranked_and_counted() -> None:
    """A candidate that differs from a better one only in settings and prices alike (within the tolerance, time and
    memory) is left out and counted for it; a different placement, or a different memory, is a finalist of its
    own."""
    from plansim.planner.search import TIE, _twins_of, _without_twins, differing_settings

    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    s = Strategy.parse("dp=8,micro_batch=1,global_batch=16,zero=1,remat=none")
    r = simulate_analytic(model, cluster, s)
    best = _priced(0, s, r)
    zero0 = _priced(1, s.model_copy(update={"zero": 0}), r, step_time_s=r.step_time_s * (1 + TIE / 3),
                    peak_memory_bytes=r.peak_memory_bytes * (1 + TIE / 3))  # fmt: skip
    ring = _priced(2, s.model_copy(update={"dp_algorithm": "ring"}), r)
    placed = _priced(3, s.model_copy(update={"micro_batch": 2}), r)  # same figures, another placement
    leaner = _priced(4, s.model_copy(update={"zero": 2}), r, peak_memory_bytes=r.peak_memory_bytes * (1 - 3 * TIE))
    pool = [best, zero0, ring, placed, leaner]
    chosen = _without_twins(pool, top_k=10)
    assert [p.index for p in chosen] == [0, 3, 4]
    twins = _twins_of(chosen, pool)
    assert [p.index for p in twins[s]] == [1, 2] and placed.strategy not in twins and leaner.strategy not in twins
    assert differing_settings(s, [p.strategy for p in twins[s]]) == "zero=1/0, dp_algorithm=nccl/ring"


def test_a_plans_finalists_are_distinct_and_their_twins_counted_by_brute_force() -> None:
    """Over every candidate that fits: each counted twin is one by the definition (same placement, alike) of its
    finalist and of no better one; every candidate that is a twin of a finalist is counted; no two finalists are
    twins; the table, the JSON and the explanation carry the counts."""
    from plansim.planner.output import plan_summary
    from plansim.planner.search import SETTINGS, alike

    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    c = Constraints(remat=("none",), dp_algorithms=("nccl", "ring"))
    r = plan(model, cluster, global_batch=16, constraints=c, des=False, milp=False, top_k=6)
    finalists = [f.priced for f in r.outcome.finalists]

    def placement(s: Strategy) -> dict:
        return s.model_dump(exclude=set(SETTINGS))

    def twin(a, b) -> bool:  # type: ignore[no-untyped-def]
        return placement(a.strategy) == placement(b.strategy) and alike(a.result, b.result)

    assert not any(twin(a, b) for a, b in itertools.combinations(finalists, 2))
    counted = 0
    for q in r.outcome.fitting:
        if q.strategy in {p.strategy for p in finalists}:
            continue
        owner = next((p for p in finalists if twin(q, p)), None)
        listed = [p for p in finalists if q.strategy in {t.strategy for t in r.outcome.equivalent_to(p.strategy)}]
        assert listed == ([] if owner is None else [owner])
        counted += owner is not None
    assert counted == sum(len(v) for v in r.outcome.equivalents.values()) > 0  # NCCL picks the ring here: twins
    frame = r.frame()
    assert frame["equivalent"].sum() == counted
    data = plan_summary(r)
    assert sum(f["equivalent"]["count"] for f in data["finalists"]) == counted
    winner_twins = r.outcome.equivalent_to(finalists[0].strategy)
    if winner_twins:
        assert f"It stands for {len(winner_twins)} equivalent candidate" in r.explanation


@pytest.mark.parametrize("name,headroom", [("gpt3-125m", 0.0), ("gpt3-125m", 0.9), ("gpt3-1.3b", 0.835)])
def test_headroom_rejects_exactly_the_candidates_under_it(name: str, headroom: float) -> None:
    """Brute force over the priced candidates: those that fit with less than the headroom free are rejected, with
    their own reason, and only those; the winner has the headroom; the explanation says how many were ruled out."""
    from plansim.planner.search import headroom_reason

    model, cluster = load_model(name), load_hardware("dgx-a100", gpus=8)
    c = Constraints(remat=("none",), headroom=headroom)
    r = plan(model, cluster, global_batch=16, constraints=c, des=False, milp=False, top_k=3)
    every = {s: simulate_analytic(model, cluster, s) for s in candidates(model, cluster, 16, c)}
    under = {
        s for s, x in every.items() if x.fits and (x.peak_memory_bytes > cluster.gpu.memory_bytes * (1 - headroom))
    }
    kept = {s for s, x in every.items() if x.fits} - under
    pruned = r.outcome.pruned
    assert {p.strategy for p in r.outcome.tight} | {p.strategy for p in pruned if p.tight} == under
    assert {p.strategy for p in r.outcome.fitting} | {p.strategy for p in pruned if not p.tight} == kept
    assert r.outcome.rejected.get(headroom_reason(headroom), 0) == len(under)
    assert r.winner_result is not None and r.winner_result.memory_margin >= headroom
    if under:
        assert f"--headroom {headroom:g} ruled out {len(under):,} candidates" in r.explanation
        best_under = min(every[s].step_time_s for s in under)
        assert ("and would have won" in r.explanation) == (best_under < r.winner_result.step_time_s * (1 - 1e-3))
    else:
        assert "--headroom" not in r.explanation


def test_headroom_bad_values_are_one_line_and_the_sweep_holds_it() -> None:
    from plansim.errors import PlansimError
    from plansim.sweep.grid import SweepGrid
    from plansim.sweep.point import SweepSettings, run_point

    for bad in (-0.1, 0.95, float("nan"), "5x", "95%", "-4GB", True):
        with pytest.raises(PlansimError, match=r"^--headroom ") as err:
            Constraints(headroom=bad)
        assert "\n" not in str(err.value)
    # a percentage, a fraction written as text and a size (a fraction of the GPU's memory once it is known)
    assert Constraints(headroom="5%").headroom == Constraints(headroom="0.05").headroom == 0.05
    assert Constraints(headroom="4GB").for_gpu(80e9).headroom == 4e9 / 80e9
    with pytest.raises(PlansimError, match=r"^--headroom 80GB: at most 90% of the GPU's 80.0 GB$"):
        Constraints(headroom="80GB").for_gpu(80e9)
    res = runner.invoke(app, [*SMALL, "--headroom", "5", "--no-des"])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "--headroom 5" in lines[0] and "0.05 for 5%" in lines[0]
    (point,) = SweepGrid(("gpt3-125m",), ("dgx-a100",), (8,), (16,)).points()
    _, row = run_point(point, SweepSettings(headroom=0.9))
    assert row["fits"] and row["peak_memory_bytes"] <= 0.1 * row["memory_capacity_bytes"]


def test_gains_are_said_as_percentages_when_small_and_ratios_when_large() -> None:
    """Over a range of speed ratios, the planner's and compare's phrases: the number said reads back to the ratio
    (to its rounding), a percentage of gain only below 50 % and a ratio from 1.5x on."""
    import re
    from types import SimpleNamespace as R

    from plansim.describe import RATIO_FROM, compare_sentence, objective_sentence, pace

    parts = {"compute": 1.0, "recompute": 0.0, "exposed_comm": 0.0, "bubble": 0.0, "optimizer": 0.0}
    for speed in (1.0001, 1.003, 1.2, 1.49, 1.5, 2.0, 3.256, 11.7, 0.999, 0.8, 0.67, 0.5, 0.1):
        mine, other = 1.0, speed  # seconds: the other's step takes `speed` times mine
        phrase = pace(mine, other)
        if (m := re.fullmatch(r"is ([\d.]+)% faster than", phrase)) is not None:
            assert speed < RATIO_FROM and float(m[1]) / 100 == pytest.approx(speed - 1, abs=5e-4)
        elif (m := re.fullmatch(r"is ([\d.]+)x as fast as|is (\d+)x as fast as", phrase)) is not None:
            assert speed >= RATIO_FROM and float(m[1] or m[2]) == pytest.approx(speed, rel=0.05)
        elif (m := re.fullmatch(r"is ([\d.]+)% slower than", phrase)) is not None:
            assert 1 / speed < RATIO_FROM and float(m[1]) / 100 == pytest.approx(1 - speed, abs=5e-4)
        elif (m := re.fullmatch(r"takes ([\d.]+)x as long as", phrase)) is not None:
            assert 1 / speed >= RATIO_FROM and float(m[1]) == pytest.approx(1 / speed, rel=0.05)
        else:
            assert phrase == "is as fast as" and abs(speed - 1) <= 5e-4, phrase
        w = R(step_time_s=mine, tokens_per_s=1000.0 * speed, gpus=8, time_breakdown_s=parts, peak_memory_bytes=1e9,
              strategy={"global_batch": 8})  # fmt: skip
        o = R(step_time_s=other, tokens_per_s=1000.0, gpus=8, time_breakdown_s={k: v * speed for k, v in parts.items()},
              peak_memory_bytes=1e9, strategy={"global_batch": 8})  # fmt: skip
        for sentence in (
            compare_sentence(w, o, "B"),
            *(objective_sentence(w, o, "B", x) for x in ("tokens_per_s", "cost")),
        ):
            for number, _ in re.findall(r"([\d.]+)% (faster|more)", sentence):
                assert float(number) < 50, sentence
            assert "225.6%" not in sentence
    big = R(step_time_s=32.56, time_breakdown_s=parts, peak_memory_bytes=1e9)
    assert compare_sentence(R(step_time_s=10.0, time_breakdown_s=parts, peak_memory_bytes=1e9), big, "B").startswith(
        "It is 3.3x as fast as B"
    )


def test_a_milp_finalist_is_budgeted_to_leave_the_headroom() -> None:
    """``remat: milp`` fills what a stage leaves; under the headroom its finalist runs on an explicit budget that
    leaves it free, and the strategy alone (as winner.yaml holds it) prices the same."""
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=1)
    c = Constraints(micro_batch=64, remat=("full",))
    r = plan(model, cluster, global_batch=64, constraints=c, des=False, top_k=3)
    (milp,) = [f for f in r.outcome.finalists if f.priced.strategy.remat == "milp"]
    s = milp.priced.strategy
    assert s.remat_budget is not None and milp.result.memory_margin >= c.headroom
    unbudgeted = simulate_analytic(model, cluster, s.model_copy(update={"remat_budget": None}))
    assert unbudgeted.memory_margin < c.headroom  # without the budget it would have been rejected
    assert simulate_analytic(model, cluster, s).to_dict() == milp.result.to_dict()


def test_dtypes_searched_multiply_the_space_and_a_missing_one_is_refused() -> None:
    """``--dtype bf16,fp16`` searches each candidate in each dtype (counted as enumerated); a dtype the GPU has no
    tensor-core peak for is refused in one line before any pricing."""
    from plansim.errors import PlansimError
    from plansim.planner.space import count_candidates

    m, cl = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    one = list(candidates(m, cl, 16, Constraints(dtype="bf16")))
    two = list(candidates(m, cl, 16, Constraints(dtype="bf16, fp16")))
    assert len(two) == 2 * len(one) == count_candidates(m, cl, 16, Constraints(dtype=("bf16", "fp16")))
    assert {s.dtype for s in two} == {"bf16", "fp16"}
    assert {s.model_copy(update={"dtype": "bf16"}) for s in two} == set(one)
    v100 = load_hardware("dgx-1", gpus=8)
    with pytest.raises(PlansimError, match=r"^--dtype bf16: the V100-SXM2-32GB has no bf16 tensor cores") as err:
        plan("gpt3-125m", v100, global_batch=16, constraints=Constraints(dtype="fp16,bf16"), des=False)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "fsdp"])
def test_offload_is_searched_as_the_framework_runs_it(framework: str) -> None:
    """``--offload all`` adds, beside each candidate without offloading, the combinations the framework's ``offload``
    rule runs at that ZeRO stage (counted as enumerated), every one of them runnable (``check_strategy``); without
    ``--offload`` nothing is offloaded."""
    from plansim.planner.space import count_candidates
    from plansim.strategy.frameworks import load_framework

    m, cl = load_model("gpt3-125m"), load_hardware("dgx-h100", gpus=8)
    c = Constraints(offload="all", framework=framework)
    found = list(candidates(m, cl, 16, c))
    assert len(found) == count_candidates(m, cl, 16, c)
    plain = [s for s in found if not s.offload]
    assert set(plain) == set(candidates(m, cl, 16, Constraints(framework=framework)))
    offloaded = [s for s in found if s.offload]
    rule = load_framework(framework).rules.offload.value
    assert {frozenset(s.offload) for s in offloaded} == {frozenset(f.kinds) for f in rule.forms}
    for s in offloaded:
        assert s.zero in rule.zero_stages(s.offload)
        assert not check_strategy(s, m, cl), (s, check_strategy(s, m, cl))


def test_offload_on_one_gpu_searches_the_zero_stages_it_needs_and_says_what_it_bought() -> None:
    """One GPU: ZeRO shards nothing, but DeepSpeed offloads only under ZeRO (1-3), so those stages are searched with
    offloading alone; Llama 3 8B's states need ~130 GB, so only an offloading plan fits, and the explanation says
    so. A node without host data refuses ``--offload`` in one line."""
    from plansim.errors import PlansimError

    h100 = load_hardware("dgx-h100", gpus=1)
    r = plan("llama3-8b", h100, global_batch=8, seq_len=4096, des=False, milp=False,
             constraints=Constraints(offload="optimizer,params", framework="deepspeed"))  # fmt: skip
    assert r.winner is not None and "optimizer" in r.winner.offload and r.winner.zero >= 1
    assert all(p.strategy.offload for p in r.outcome.fitting)
    assert "Offloading to host memory (" in r.explanation and "is what makes the plan fit" in r.explanation
    with pytest.raises(PlansimError, match=r"^--offload optimizer on dgx-1: its node profile describes no host") as e:
        plan("gpt3-125m", load_hardware("dgx-1", gpus=8), global_batch=16, des=False,
             constraints=Constraints(offload="optimizer"))  # fmt: skip
    assert "\n" not in str(e.value)


def test_fp8_is_searched_where_the_framework_runs_it_and_the_explanation_weighs_it() -> None:
    """``--dtype bf16,fp8`` on H100s: every candidate in bf16, and in fp8 where the framework trains in FP8 (not
    DeepSpeed) and not beside ``tp_comm_overlap`` (counted as enumerated, each runnable); the winner in FP8 is weighed
    against the best bf16 candidate, which is priced in full."""
    from plansim.planner.space import count_candidates

    m, cl = load_model("gpt3-1.3b"), load_hardware("dgx-h100", gpus=8)
    c = Constraints(dtype="bf16,fp8", framework="all", tp_comm_overlap=None)
    found = list(candidates(m, cl, 16, c))
    assert len(found) == count_candidates(m, cl, 16, c)
    fp8 = [s for s in found if s.dtype == "fp8"]
    assert fp8 and {s.framework for s in fp8} == {"megatron", "fsdp"}
    assert not any(s.tp_comm_overlap for s in fp8)
    assert {s.model_copy(update={"dtype": "bf16"}) for s in fp8} < {s for s in found if s.dtype == "bf16"}
    for s in fp8[:: max(1, len(fp8) // 25)]:
        assert not check_strategy(s, m, cl), (s, check_strategy(s, m, cl))
    r = plan(m, cl, global_batch=16, des=False, milp=False, constraints=Constraints(dtype="bf16,fp8"))
    assert r.winner is not None and r.winner.dtype == "fp8"
    best_bf16 = min((p for p in r.outcome.fitting if p.strategy.dtype == "bf16"), key=lambda p: p.result.step_time_s)
    assert f"FP8 against the best candidate without it, {describe(best_bf16.strategy)}" in r.explanation


def test_cli_headroom_reads_a_percentage_or_a_size(tmp_path: Path) -> None:
    """``plan --headroom 10%`` and ``--headroom 8GB`` (of an 80 GB A100: 10%) plan alike; a sweep takes a percentage
    but not a size (its points may run on different GPUs), refused in one line."""
    said = {}
    for text in ("10%", "0.1", f"{0.1 * 85899345920 / 1e9}GB"):
        res = runner.invoke(app, [*SMALL, "--headroom", text, "--no-des", "--format", "json"])
        assert res.exit_code == 0, res.output
        said[text] = json.loads(res.stdout)["headroom"]
    assert set(said.values()) == {0.1}, said
    res = runner.invoke(app, ["sweep", "--model", "gpt3-125m", "--gpus", "8", "--global-batch", "16", "--headroom",
                              "4GB", "--out", str(tmp_path / "s")])  # fmt: skip
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code != 0 and len(lines) == 1 and "a sweep takes a fraction or a percentage" in lines[0]
