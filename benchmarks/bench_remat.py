"""How fast the Checkmate MILP solves (HiGHS through PuLP, started from the best schedule ``remat.start`` finds).

Cases (the issue's targets):
(a) a linear chain of 8 unit-cost layers and a loss (17 nodes) at budget 4, the tightest that fits: optimal in < 5 s;
(b) one pipeline stage of GPT-3 1.3B (8 blocks by default, micro-batch 1, one A100) at op granularity, 100+ nodes:
    within 1 % gap in < 60 s; printed at two budgets (the selective baseline's peak, and half the keep-everything
    peak);
(c) the same stage at layer granularity (what ``remat: milp`` uses by default), for comparison.

For each case: nodes, edges, variables, constraints, status, objective and bound, gap (relative to the objective, the
step's total compute), the recompute cost against the best baseline that fits, the start the solver was given, build
and solve time (solve includes finding the start and the LP relaxation; wall is the whole call).

Time limits (issue 17: a limit is wall-clock for the whole call), the wall time against the limit:
(d) the README's ``plansim remat`` example (GPT-3 1.3B, 24 blocks, layer granularity, micro-batch 8, 60 GB) at
    ``--time-limit`` 2 and 8: the MILP's call, and the command's solving (the MILP and the baselines' table);
(e) ``remat=milp`` in a strategy whose one stage holds 40 blocks (GPT-3 13B, tp=8, 8 GB of activations) with
    ``remat_time_limit_s=3``: the stage's solve, and the whole analytic simulation.

The planner (issue "MILP where it can pay": ``plan --remat milp`` under 20 s):
(f) the README's plan, GPT-3 175B on 1,024 A100s at batch 1,536, as ``plansim plan --remat milp`` searches it (full
    recomputation, ``remat: milp`` for up to three finalists), without the DES (``--no-des``): the milp phase, the
    stage MILPs solved in it and the wall time, and the winner's step.

Run: python benchmarks/bench_remat.py [--layers 8] [--time-limit 60] [--limits-only] [--plan-only]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

from plansim.api import load_hardware, load_model
from plansim.remat import BASELINES, RematGraph, linear_chain, solve_remat, stage_graph
from plansim.step.prepare import comm_pricer, prepare_step
from plansim.strategy.schema import Strategy


def gpt_stage(layers: int, granularity: str) -> RematGraph:
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=8)
    prep = prepare_step(model, cluster, Strategy(dp=8, micro_batch=1, global_batch=8))
    kernels, tp = prep.kernels, comm_pricer(cluster, prep.strategy)
    return stage_graph(prep.graph, range(layers), kernels, tp, granularity=granularity)  # type: ignore[arg-type]


def report(label: str, graph: RematGraph, budget: float, time_limit: float, gap: float | None) -> None:
    baselines = [solve_remat(graph, budget, m) for m in BASELINES]
    best = min((b for b in baselines if b.feasible), key=lambda b: b.cost, default=None)
    start = time.perf_counter()
    r = solve_remat(graph, budget, time_limit_s=time_limit, gap=gap)
    wall = time.perf_counter() - start
    s = r.solver
    assert s is not None
    unit = 1e3 if graph.total_cost < 10 else 1.0
    name = "ms" if unit == 1e3 else "units"
    base = f"{best.method} {best.recompute_cost * unit:.4g}" if best else "none fits"
    print(
        f"{label}: {len(graph)} nodes, {graph.edges} edges, {s.variables} variables, {s.constraints} constraints; "
        f"budget {budget:.4g} B; status {s.status} ({s.solver}), objective {r.cost * unit:.5g} {name}, "
        f"bound {(s.bound or 0) * unit:.5g}, gap {100 * (s.gap or 0):.2f} %; recompute {r.recompute_cost * unit:.4g} "
        f"{name} (best baseline: {base}; started from {s.start or 'nothing'}); build {s.build_time_s:.2f} s, "
        f"solve {s.solve_time_s:.2f} s, wall {wall:.2f} s"
    )


def limits() -> None:
    """(d) and (e): wall time against the time limit."""
    from plansim.api import simulate
    from plansim.remat.api import plan_remat, remat_graph

    g = remat_graph("gpt3-1.3b", "dgx-a100", stage_layers=24, granularity="layer", micro_batch=8)
    for limit in (2.0, 8.0):
        start = time.perf_counter()
        r = solve_remat(g, 60e9, time_limit_s=limit, gap=0.01)
        wall = time.perf_counter() - start
        start = time.perf_counter()
        plan_remat(g, 60e9, time_limit_s=limit, gap=0.01)
        command = time.perf_counter() - start
        s = r.solver
        assert s is not None
        print(
            f"(d) README remat example, --time-limit {limit:g}: MILP call {wall:.2f} s (limit {limit:g} s), "
            f"as the remat command solves it (MILP and baselines' table, a second run) {command:.2f} s; "
            f"status {s.status}, from {s.start or 'nothing'}, "
            f"recompute {r.recompute_cost * 1e3:.3f} ms, LP bound "
            f"{'-' if s.bound is None else f'{(s.bound - g.total_cost) * 1e3:.3f} ms'}, build {s.build_time_s:.2f} s"
            f"{'; ' + r.reason if r.reason else ''}"
        )
    with stage_solves() as stages:
        strategy = "tp=8,micro_batch=1,global_batch=8,remat=milp,remat_budget=8GB,remat_time_limit_s=3"
        start = time.perf_counter()
        result = simulate("gpt3-13b", "dgx-a100", strategy, gpus=8, engine="analytic")
        wall = time.perf_counter() - start
    print(
        f"(e) remat=milp, one 40-block stage (GPT-3 13B, tp=8, 8 GB), remat_time_limit_s=3: stage solve "
        f"{', '.join(f'{t:.2f}' for t in stages)} s (limit 3 s), whole simulation {wall:.2f} s; "
        f"step {result.step_time_s:.4f} s"
    )


@contextmanager
def stage_solves() -> Iterator[list[float]]:
    """The seconds of each stage MILP ``remat.plan`` solves within the block (``solve_remat`` timed, then restored)."""
    from plansim.remat import plan as remat_plan

    seconds: list[float] = []
    solve = remat_plan.solve_remat

    def timed(*args: object, **kwargs: object) -> object:
        began = time.perf_counter()
        out = solve(*args, **kwargs)  # type: ignore[arg-type]
        seconds.append(time.perf_counter() - began)
        return out

    remat_plan.solve_remat = timed  # type: ignore[assignment]
    try:
        yield seconds
    finally:
        remat_plan.solve_remat = solve  # type: ignore[assignment]


def planner() -> None:
    """(f): the planner's milp phase on the README's plan."""
    from plansim.planner import Constraints, plan

    with stage_solves() as solves:
        start = time.perf_counter()
        r = plan("gpt3-175b", "dgx-a100", gpus=1024, global_batch=1536, constraints=Constraints(remat=("full",)),
                 des=False)  # fmt: skip
        wall = time.perf_counter() - start
    phases = r.outcome.phase_s
    step = r.winner_result.step_time_s if r.winner_result else float("nan")
    print(
        f"(f) plan --remat milp --no-des, GPT-3 175B on 1,024 A100s, batch 1,536: milp {phases['milp']:.2f} s "
        f"({len(solves)} stage MILPs, {sum(solves):.2f} s), analytic {phases['analytic']:.2f} s, wall {wall:.2f} s; "
        f"winner {step:.6f} s per step"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="GPT-3 1.3B blocks in the stage (op granularity)")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--limits-only", action="store_true", help="only (d) and (e): wall time against the limit")
    parser.add_argument("--plan-only", action="store_true", help="only (f): the planner's plan --remat milp")
    args = parser.parse_args()
    if args.limits_only:
        limits()
        return
    if args.plan_only:
        planner()
        return
    report("(a) chain, 8 layers + loss", linear_chain(8), 4.0, args.time_limit, None)
    for granularity, label in (("op", "(b)"), ("layer", "(c)")):
        g = gpt_stage(args.layers, granularity)
        keep_all = solve_remat(g, method="none").peak_bytes
        selective = solve_remat(g, method="selective").peak_bytes
        for budget in (selective, keep_all / 2):
            report(f"{label} GPT-3 1.3B, {args.layers} blocks, {granularity}", g, budget, args.time_limit, 0.01)
    limits()
    planner()


if __name__ == "__main__":
    main()
