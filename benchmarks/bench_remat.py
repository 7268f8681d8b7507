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

Run: python benchmarks/bench_remat.py [--layers 8] [--time-limit 60]
"""

from __future__ import annotations

import argparse
import time

from plansim.api import load_hardware, load_model
from plansim.remat import BASELINES, RematGraph, linear_chain, solve_remat, stage_graph
from plansim.step.prepare import comm_pricer, prepare_step
from plansim.strategy import Strategy


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="GPT-3 1.3B blocks in the stage (op granularity)")
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    report("(a) chain, 8 layers + loss", linear_chain(8), 4.0, args.time_limit, None)
    for granularity, label in (("op", "(b)"), ("layer", "(c)")):
        g = gpt_stage(args.layers, granularity)
        keep_all = solve_remat(g, method="none").peak_bytes
        selective = solve_remat(g, method="selective").peak_bytes
        for budget in (selective, keep_all / 2):
            report(f"{label} GPT-3 1.3B, {args.layers} blocks, {granularity}", g, budget, args.time_limit, 0.01)


if __name__ == "__main__":
    main()
