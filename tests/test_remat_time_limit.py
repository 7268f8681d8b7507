"""Solver time limits are wall-clock limits on the whole remat call (issue 17): one ``Deadline`` from the entry,
seen by every phase (baselines, coarse MILP, local search, MILP build, LP relaxation, MILP solve), and an honest
label when it runs out. The phases are driven by a fake clock (deterministic); one check runs on the real clock
with generous slack."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
from test_remat_start import _gpt_stage  # one GPT stage graph, cached, shared with the start tests
from typer.testing import CliRunner

from plansim.api import load_hardware, load_model
from plansim.cli.app import app
from plansim.errors import PlansimError
from plansim.remat import RematGraph, checkmate, linear_chain, replay, run_baseline, solve_remat, stage_graph, start
from plansim.remat import baselines as baselines_mod
from plansim.remat.baselines import FIXED
from plansim.remat.deadline import Deadline, TimeUp
from plansim.remat.start import improve_checkpoints, milp_start
from plansim.step.prepare import comm_pricer, prepare_step
from plansim.strategy.schema import Strategy


class FakeClock:
    """A clock the test moves: ``now`` seconds; ``tick`` added at every reading."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now = 0.0
        self.tick = tick
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        self.now += self.tick
        return self.now


def _tight(graph: RematGraph) -> float:
    """A budget the MILP must work for: between the tightest fixed baseline's peak and keeping everything."""
    peaks = sorted(run_baseline(graph, m).peak_bytes for m in FIXED)
    return peaks[0] + 0.5 * (peaks[-1] - peaks[0])


def _no_solver(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("no solver call was expected past the deadline")


# --- the deadline itself ---------------------------------------------------------------------------------------------


def test_deadline_counts_down_on_its_clock() -> None:
    clock = FakeClock()
    d = Deadline(10.0, clock=clock)
    assert d.limited and d.seconds == 10.0
    assert d.remaining() == 10.0 and not d.expired()
    clock.now = 4.0
    assert d.remaining() == 6.0
    half = d.share(0.5)  # half of the 6 s left: ends at 7 s, the parent at 10 s
    assert half.seconds == 10.0 and half.remaining() == 3.0
    assert d.solver_limit(1.5) == 4.5
    clock.now = 7.0
    assert half.expired() and not d.expired()
    with pytest.raises(TimeUp):
        half.check()
    clock.now = 12.0
    assert d.expired() and d.remaining() == 0.0 and d.solver_limit(0.25) == -0.25
    unlimited = Deadline(None, clock=clock)
    assert not unlimited.limited and unlimited.remaining() == math.inf and not unlimited.expired()
    assert unlimited.share(0.1) is unlimited and unlimited.solver_limit(5.0) is None
    assert not Deadline(math.inf).limited


@pytest.mark.parametrize("bad", [-1.0, math.nan, "2", True])
def test_deadline_refuses_a_limit_that_is_not_seconds(bad: Any) -> None:
    with pytest.raises(PlansimError, match=r"^time_limit_s=.*: a time limit must be a number of seconds >= 0$"):
        Deadline(bad)
    with pytest.raises(PlansimError, match=r"time.limit"):
        solve_remat(linear_chain(4), 4.0, time_limit_s=bad)


def test_zero_seconds_is_expired_at_once() -> None:
    assert Deadline(0.0).expired()


# --- each phase sees the deadline ----------------------------------------------------------------------------------


def _count(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, clock: FakeClock | None = None) -> list[int]:
    """Count calls of ``module.name`` (advancing ``clock`` by 1 s per call)."""
    calls = [0]
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if clock is not None:
            clock.now += 1.0
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_local_search_past_its_deadline_evaluates_only_its_start(monkeypatch: pytest.MonkeyPatch) -> None:
    g = linear_chain(12)
    budget = _tight(g)
    unbounded = _count(monkeypatch, start, "run_checkpoints")
    improve_checkpoints(g, set(), budget)
    assert unbounded[0] > 3  # the search does try flips when it may
    monkeypatch.undo()
    clock = FakeClock()
    calls = _count(monkeypatch, start, "run_checkpoints", clock)
    r = improve_checkpoints(g, set(), budget, deadline=Deadline(0.0, clock=clock))
    assert calls[0] == 1 and r.schedule is not None


def test_local_search_stops_once_its_deadline_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    g = linear_chain(16)
    clock = FakeClock()
    calls = _count(monkeypatch, start, "run_checkpoints", clock)  # each evaluation takes 1 s
    improve_checkpoints(g, set(), _tight(g), deadline=Deadline(3.0, clock=clock))
    assert calls[0] <= 3 + 2  # the start, then flips until 3 s (a move tries in and out: 2 more at most)


def test_greedy_tries_one_threshold_past_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    g = linear_chain(12)
    full = _count(monkeypatch, baselines_mod, "checkpoint_plan")
    run_baseline(g, "greedy", 6.0)
    assert full[0] > 5
    monkeypatch.undo()
    budget = _tight(g)
    calls = _count(monkeypatch, baselines_mod, "checkpoint_plan")
    r = run_baseline(g, "greedy", budget, deadline=Deadline(0.0))
    assert calls[0] == 1 and r.schedule is not None


def test_build_stops_at_its_deadline() -> None:
    g = linear_chain(10)
    with pytest.raises(TimeUp):
        checkmate.build_milp(g, 6.0, deadline=Deadline(0.0))
    clock = FakeClock(tick=1.0)  # every reading 1 s later: the build is stopped after a few stages
    with pytest.raises(TimeUp):
        checkmate.build_milp(g, 6.0, deadline=Deadline(5.0, clock=clock))
    assert clock.readings <= 8
    built = checkmate.build_milp(g, 6.0, deadline=Deadline(None))
    assert built.variables > 0


def test_coarse_milp_gets_a_quarter_and_none_once_the_phase_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _gpt_stage(2, "op")
    budget = _tight(g)
    clock = FakeClock()
    seen: list[float] = []

    def coarse(graph: RematGraph, b: float | None, in_flight: float, deadline: Deadline) -> Any:
        seen.append(deadline.remaining())
        return solve_remat(graph, b, in_flight=in_flight, deadline=deadline)

    best = milp_start(g, budget, 1, Deadline(8.0, clock=clock), coarse)
    assert seen == [2.0]  # a quarter of the 8 s the frozen clock leaves
    assert best is not None and best.feasible
    seen.clear()
    _count(monkeypatch, baselines_mod, "run_checkpoints", clock)  # every baseline takes 1 s: the phase (4 s) ends
    best = milp_start(g, budget, 1, Deadline(8.0, clock=clock), coarse)
    assert seen == []
    assert best is not None and best.feasible and "local" not in best.method  # no local search either


def test_solve_past_the_deadline_after_the_build_skips_every_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _gpt_stage(2, "layer")
    budget = _tight(g)
    clock = FakeClock()
    real_build = checkmate.build_milp

    def slow_build(*args: Any, **kwargs: Any) -> Any:
        built = real_build(*args, **kwargs)
        clock.now += 100.0  # the build used up the time
        return built

    monkeypatch.setattr(checkmate, "build_milp", slow_build)
    monkeypatch.setattr(checkmate, "run_solver", _no_solver)
    r = solve_remat(g, budget, deadline=Deadline(30.0, clock=clock))
    assert r.feasible and r.solver is not None
    assert r.solver.status == "feasible" and r.solver.start and r.solver.variables > 0
    assert "time limit of 30 s came before the MILP solve" in r.reason and "not proven optimal" in r.reason
    assert r.peak_bytes <= budget * (1 + 1e-9)
    assert replay(g, r.schedule).peak_bytes == r.replay.peak_bytes  # type: ignore[arg-type, union-attr]


def test_solve_past_the_deadline_after_the_relaxation_skips_the_milp(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _gpt_stage(2, "layer")
    budget = _tight(g)
    clock = FakeClock()
    calls: list[tuple[bool, float | None]] = []
    real = checkmate.run_solver

    def solver(prob: Any, name: str = "highs", **kwargs: Any) -> Any:
        calls.append((kwargs.get("relax", False), kwargs.get("time_limit_s")))
        out = real(prob, name, **kwargs)
        clock.now += 100.0
        return out

    monkeypatch.setattr(checkmate, "run_solver", solver)
    r = solve_remat(g, budget, gap=0.0, deadline=Deadline(60.0, clock=clock))
    assert [relax for relax, _ in calls] == [True]  # the relaxation ran, the MILP did not
    limit = calls[0][1]
    assert limit is not None and 0 < limit <= 60.0 - checkmate.FINAL_MARGIN_S
    assert r.feasible and r.solver is not None and r.solver.bound is not None
    if r.solver.status != "optimal":  # unless the LP bound proves the start (no MILP needed), it is labelled
        assert r.solver.status == "feasible" and "time limit of 60 s" in r.reason


def test_solvers_get_what_is_left_less_their_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    g = _gpt_stage(2, "layer")
    budget = _tight(g)
    clock = FakeClock()  # frozen: the whole limit is left at every call
    limits: list[float | None] = []
    real = checkmate.run_solver

    def solver(prob: Any, name: str = "highs", **kwargs: Any) -> Any:
        limits.append(kwargs.get("time_limit_s"))
        return real(prob, name, **kwargs)

    monkeypatch.setattr(checkmate, "run_solver", solver)
    solve_remat(g, budget, gap=0.0, warm_start=False, deadline=Deadline(50.0, clock=clock))
    assert len(limits) == 1 and limits[0] is not None
    assert 0 < limits[0] <= 50.0 - checkmate.FINAL_MARGIN_S


@pytest.mark.parametrize("which", ["chain", "gpt-layer", "gpt-op"])
def test_a_solve_given_zero_seconds_returns_the_best_fitting_baseline(
    which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = {"chain": linear_chain(8), "gpt-layer": _gpt_stage(2, "layer"), "gpt-op": _gpt_stage(2, "op")}[which]
    budget = _tight(graph)
    monkeypatch.setattr(checkmate, "run_solver", _no_solver)
    r = solve_remat(graph, budget, time_limit_s=0.0)
    fits = [b for b in (run_baseline(graph, m, budget) for m in FIXED) if b.feasible]
    assert r.feasible and r.method == "milp" and r.solver is not None
    assert r.solver.status == "feasible" and r.solver.start in FIXED and r.solver.time_limit_s == 0.0
    assert r.cost == min(b.cost for b in fits)
    assert "time limit of 0 s" in r.reason and f"the {r.solver.start} schedule, not proven optimal" in r.reason
    for warm in (True, False):  # without the start search: the same fallback, labelled as a baseline
        late = solve_remat(graph, budget, time_limit_s=0.0, warm_start=warm)
        assert late.feasible and late.solver is not None and late.solver.status == "feasible"
        assert late.cost == r.cost and "not proven optimal" in late.reason


def test_a_solve_given_zero_seconds_with_nothing_fitting_says_so() -> None:
    g = linear_chain(12)
    floor = g.memory_floor
    assert all(run_baseline(g, m).peak_bytes > floor for m in FIXED)
    r = solve_remat(g, floor, time_limit_s=0.0)
    assert not r.feasible and r.schedule is None and r.solver is not None
    assert r.solver.status == "no solution"
    assert "time limit of 0 s" in r.reason and "before any schedule" in r.reason


def test_a_limit_well_above_the_solve_changes_nothing() -> None:
    g = _gpt_stage(2, "layer")
    budget = _tight(g)
    unbounded = solve_remat(g, budget, gap=0.0)
    limited = solve_remat(g, budget, gap=0.0, time_limit_s=600.0)
    assert unbounded.solver is not None and limited.solver is not None
    assert unbounded.solver.status == limited.solver.status == "optimal"
    assert limited.cost == pytest.approx(unbounded.cost, rel=1e-12) and limited.reason == ""


# --- remat: milp in a strategy, and the CLI --------------------------------------------------------------------------


def test_remat_milp_stage_honours_remat_time_limit_s_and_stays_memoized(monkeypatch: pytest.MonkeyPatch) -> None:
    from plansim.remat import plan
    from plansim.remat.plan import milp_stage_plans

    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=1)
    s = Strategy(micro_batch=1, global_batch=1, remat="milp", remat_budget=None, remat_time_limit_s=0.001)
    prep = prepare_step(model, cluster, s)
    g = stage_graph(
        prep.graph, range(model.layers), prep.kernels, comm_pricer(cluster, prep.strategy), granularity="layer"
    )
    budget = _tight(g)
    s = s.model_copy(update={"remat_budget": budget})
    prep = prepare_step(model, cluster, s)
    seen: list[float | None] = []
    real = plan.solve_remat

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["deadline"].seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(plan, "solve_remat", spy)
    monkeypatch.setattr(checkmate, "run_solver", _no_solver)  # 1 ms: no time for a solver
    began = time.perf_counter()
    plans = milp_stage_plans(prep, cluster, model)
    assert time.perf_counter() - began < 5.0
    assert seen == [0.001]
    r = plans[0].result
    assert r.feasible and r.solver is not None and r.solver.status == "feasible"
    assert "time limit of 0.001 s" in r.reason
    again = milp_stage_plans(prep, cluster, model)
    assert seen == [0.001] and again[0] is plans[0]  # memoized: no second solve


def test_cli_remat_time_limit_labels_the_schedule_it_returns() -> None:
    # 80 MB: between the full baseline's peak (57 MB) and keeping everything (107 MB) for these two flash-attention
    # blocks
    result = CliRunner().invoke(
        app,
        [
            *("remat", "--model", "gpt3-125m", "--stage-layers", "2", "--budget", "80MB"),
            *("--time-limit", "0.001", "--format", "json"),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout[result.stdout.index("{") :])
    milp = data["milp"]
    assert milp["status"] == "feasible" and milp["proven_optimal"] is False and milp["fits"]
    assert milp["start"] in FIXED and "time limit of 0.001 s" in milp["reason"]


# --- the real clock ----------------------------------------------------------------------------------------------


def test_a_large_op_stage_given_two_seconds_ends_within_them() -> None:
    """24 blocks of GPT-3 1.3B at op granularity (578 nodes; the MILP alone takes minutes to build and solve
    unbounded) within 2 s: the call ends within the limit plus a few seconds of slack for a loaded machine."""
    g = _gpt_stage(24, "op")
    budget = 0.8 * run_baseline(g, "selective").peak_bytes
    began = time.perf_counter()
    r = solve_remat(g, budget, time_limit_s=2.0, gap=0.01)
    wall = time.perf_counter() - began
    assert wall < 2.0 + 3.0, f"{wall:.2f} s for a 2 s limit"
    assert r.feasible and r.solver is not None and r.solver.status == "feasible"
    assert r.peak_bytes <= budget * (1 + 1e-9) and "not proven optimal" in r.reason
