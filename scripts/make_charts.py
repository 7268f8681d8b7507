"""Regenerate the README's chart gallery (``docs/images/*.png``) from the current code.

Each chart comes from the same run as the README's command beside it, through the public API and the writers the
CLI itself uses (``write_plan``, ``write_comparison``, ``write_tradeoff``): the run writes its usual ``--out``
directory into a scratch folder and the gallery keeps the PNGs it needs under stable names. The all-reduce charts,
which no README command makes, are drawn by the same ``report.compare_charts`` functions. No chart code lives here.

Usage::

    python scripts/make_charts.py                 # full size, into docs/images (minutes: the remat curve dominates)
    python scripts/make_charts.py --small --out /tmp/gallery    # tiny models and clusters, seconds (the test)

``--small`` writes the same file names from small inputs, so a test can check that every chart is still produced.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHARTS", "JOBS", "Chart", "main", "make_charts"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Chart:
    """One gallery image: its file name, the PNG its job's output folder holds, and a one-line caption."""

    name: str
    source: str
    caption: str


# --- the runs: each returns the run's --out folder (a scratch folder) ------------------------------------------------

_PLAN = {"model": "gpt3-175b", "hardware": "dgx-a100", "gpus": 1024, "global_batch": 1536}
_PLAN_SMALL = {"model": "gpt3-125m", "hardware": "dgx-a100", "gpus": 8, "global_batch": 16}

#: The three strategies of the README's ``plansim compare`` command (and a small stand-in for each).
_COMPARE_STRATEGIES = (
    "dp=64,tp=8,pp=2,micro_batch=1,global_batch=1536,schedule=interleaved,virtual_stages=8,zero=1,"
    "sequence_parallel=true,remat=selective",
    "dp=16,tp=8,pp=8,micro_batch=1,global_batch=1536,schedule=1f1b,zero=1,sequence_parallel=true,remat=selective",
    "dp=256,tp=4,pp=1,micro_batch=3,global_batch=1536,zero=3,sequence_parallel=true,remat=selective",
)
_COMPARE_SMALL = (
    "dp=2,tp=2,pp=4,micro_batch=1,global_batch=16,schedule=interleaved,virtual_stages=3,zero=1",
    "dp=4,tp=2,pp=2,micro_batch=1,global_batch=16,schedule=1f1b,zero=1",
    "dp=8,tp=2,pp=1,micro_batch=2,global_batch=16,zero=3",
)

#: The data-parallel all-reduce algorithms (``costs.collectives.ALLREDUCE_ALGORITHMS``) in the gallery's order.
_ALGORITHMS = ("ring", "hierarchical", "butterfly", "tree", "ps", "naive")


def run_plan(out: Path, small: bool, progress: Callable[[str], None]) -> Path:
    """``plansim plan --model gpt3-175b --hardware dgx-a100 --gpus 1024 --global-batch 1536 --out OUT`` (the CLI's
    defaults: remat none/selective/full searched, the MILP for the finalists, the DES for the top 10)."""
    import plansim
    from plansim.planner.output import write_plan

    args = _PLAN_SMALL if small else _PLAN
    progress(f"plan {args['model']} on {args['gpus']} GPUs")
    result = plansim.plan(
        args["model"], args["hardware"], gpus=args["gpus"], global_batch=args["global_batch"],
        top_k=2 if small else 10, milp=not small, progress=lambda done, total: progress(f"plan: {done:,}/{total:,}"),
    )  # fmt: skip
    write_plan(result, out)
    return out


def run_robust_plan(out: Path, small: bool, progress: Callable[[str], None]) -> Path:
    """``plansim plan ... --robust --out OUT`` for the same model, cluster and batch: ranked by the worst case over
    the profiles' uncertainty ranges, with the winner's tornado chart."""
    import plansim
    from plansim.planner.output import write_plan

    args = _PLAN_SMALL if small else _PLAN
    progress(f"robust plan {args['model']} on {args['gpus']} GPUs")
    result = plansim.plan(
        args["model"], args["hardware"], gpus=args["gpus"], global_batch=args["global_batch"],
        top_k=2 if small else 10, milp=not small, robust=True,
        progress=lambda done, total: progress(f"robust plan: {done:,}/{total:,}"),
    )  # fmt: skip
    write_plan(result, out)
    return out


def run_compare(out: Path, small: bool, progress: Callable[[str], None]) -> Path:
    """``plansim compare`` of the README: three strategies on DGX A100 and DGX H100 (1024 GPUs, DES) with
    throughput curves over 256-4096 GPUs (analytic engine, global batch held)."""
    import plansim
    from plansim.comparison.output import write_comparison

    model, gpus = ("gpt3-1.3b", 16) if small else ("gpt3-175b", 1024)
    counts = [8, 16, 32] if small else [256, 512, 1024, 2048, 4096]
    comparison = plansim.compare(
        model, list(_COMPARE_SMALL if small else _COMPARE_STRATEGIES), ["dgx-a100", "dgx-h100"], gpus=gpus,
        engine="des", scaling_gpus=counts, progress=progress,
    )  # fmt: skip
    write_comparison(comparison, out)
    return out


def run_algorithms(out: Path, small: bool, progress: Callable[[str], None]) -> Path:
    """The data-parallel all-reduce algorithms compared by the DES on GPT-3 1.3B, pure data parallelism on DGX
    A100s, 4 sequences per GPU: throughput from 8 GPUs (one node) to 512, micro-batches per replica held
    (``scaling.png``), and where the bytes go at dp=64 (``communication.png``; ps and naive, tens to hundreds of
    times more, are left out there so that the four practical algorithms stay readable). Only these two charts are
    drawn, by the functions ``plansim compare --out`` draws them with."""
    import plansim
    from plansim.report.compare_charts import communication_chart, scaling_chart

    model = "gpt3-125m" if small else "gpt3-1.3b"
    counts = [8, 16] if small else [8, 16, 32, 64, 128, 256, 512]
    dp = 16 if small else 64
    out.mkdir(parents=True, exist_ok=True)
    curves = plansim.compare(
        model, [f"dp=8,micro_batch=4,global_batch=32,dp_algorithm={a}" for a in _ALGORITHMS], ["dgx-a100"],
        engine="des", scaling_gpus=counts, scaling_engine="des", scaling_batch="per-replica", progress=progress,
    )  # fmt: skip
    scaling_chart(curves.scaling_frame(), out / "scaling.png", f"{model}, micro-batches per replica held")
    strategies = [f"dp={dp},micro_batch=4,global_batch={4 * dp},dp_algorithm={a}" for a in _ALGORITHMS[:4]]
    traffic = plansim.compare(model, strategies, ["dgx-a100"], engine="des", progress=progress)
    communication_chart(traffic.frame(), out / "communication.png", f"{model}, dp={dp}")
    return out


def run_remat(out: Path, small: bool, progress: Callable[[str], None]) -> Path:
    """``plansim remat --model gpt3-1.3b --hardware dgx-a100 --stage-layers 24 --granularity layer --micro-batch 8
    --budget 15GB --time-limit 60 --gap 0.01 --out OUT``: the MILP at the budget, then the trade-off curve over
    ``default_budgets`` (as the CLI's ``--out`` does)."""
    from plansim.remat.api import default_budgets, plan_remat, remat_graph, tradeoff_curve
    from plansim.report.remat_output import write_tradeoff

    if small:
        graph = remat_graph("gpt3-125m", "dgx-a100", stage_layers=2, granularity="layer")
        budgets = default_budgets(graph, 3)
        budget, limit_s = budgets[1], 5.0
    else:
        graph = remat_graph("gpt3-1.3b", "dgx-a100", stage_layers=24, granularity="layer", micro_batch=8)
        budgets = default_budgets(graph)
        budget, limit_s = 15e9, 60.0
    progress(f"remat MILP at {budget / 1e9:.3g} GB")
    plan = plan_remat(graph, budget, solver="highs", time_limit_s=limit_s, gap=0.01)
    others = [b for b in budgets if abs(b - budget) > 1e-9 * max(b, 1.0)]

    def step(b: float) -> None:
        progress(f"remat curve: budget {b / 1e9:.3g} GB")

    results = tradeoff_curve(graph, others, progress=step, solver="highs", time_limit_s=limit_s, gap=0.01)
    title = f"{graph.name}: recompute overhead vs peak memory"
    write_tradeoff(out, graph, [*results, *plan.results], plan.milp, budget_bytes=plan.budget_bytes, title=title)
    return out


Job = Callable[[Path, bool, Callable[[str], None]], Path]

#: Each run and the gallery images taken from its output folder, in the README's order.
JOBS: tuple[tuple[str, Job, tuple[Chart, ...]], ...] = (
    (
        "plan",
        run_plan,
        (
            Chart(
                "plan_time_gpt3-175b_a100.png",
                "time_breakdown.png",
                "`plansim plan`: step time by part of the 10 finalists and the Megatron-style configuration, "
                "GPT-3 175B on 1024 A100s, global batch 1536",
            ),
            Chart("plan_memory_gpt3-175b_a100.png", "memory.png", "`plansim plan`: their peak memory against capacity"),
        ),
    ),
    (
        "robust plan",
        run_robust_plan,
        (
            Chart(
                "plan_robust_gpt3-175b_a100.png",
                "robust.png",
                "`plansim plan --robust`: the winner's step time as each uncertain input moves over its range, "
                "against the runner-up and the best with ZeRO-3",
            ),
        ),
    ),
    (
        "compare",
        run_compare,
        (
            Chart(
                "compare_time_gpt3-175b.png",
                "time_breakdown.png",
                "`plansim compare`: step time by part of three GPT-3 175B strategies on 1024 A100s and 1024 H100s "
                "(DES)",
            ),
            Chart(
                "compare_memory_gpt3-175b.png",
                "memory.png",
                "`plansim compare`: memory by category against each device's capacity",
            ),
            Chart(
                "compare_timeline_gpt3-175b.png",
                "timeline.png",
                "`plansim compare`: the DES timeline, compute and communication streams of each pipeline stage",
            ),
            Chart(
                "compare_communication_gpt3-175b.png",
                "communication.png",
                "`plansim compare`: bytes each GPU sends by kind; bytes through the busiest port of each link tier",
            ),
            Chart(
                "compare_scaling_gpt3-175b.png",
                "scaling.png",
                "`plansim compare --scaling`: throughput against GPU count at a fixed global batch",
            ),
        ),
    ),
    (
        "all-reduce",
        run_algorithms,
        (
            Chart(
                "allreduce_scaling_gpt3-1.3b_a100.png",
                "scaling.png",
                "the six data-parallel all-reduce algorithms (`dp_algorithm`), GPT-3 1.3B data-parallel on "
                "8-512 A100s, micro-batches per replica held (DES)",
            ),
            Chart(
                "allreduce_traffic_gpt3-1.3b_a100.png",
                "communication.png",
                "ring, hierarchical, butterfly and tree all-reduce at dp=64 (eight DGX A100 nodes): bytes per GPU "
                "and through the busiest NVLink, NIC, leaf and spine port (DES)",
            ),
        ),
    ),
    (
        "remat",
        run_remat,
        (
            Chart(
                "remat_tradeoff_gpt3-1.3b_a100.png",
                "tradeoff.png",
                "`plansim remat`: the Checkmate MILP against the baselines, recompute overhead against peak memory, "
                "GPT-3 1.3B (24 blocks, micro-batch 8) on an A100",
            ),
        ),
    ),
)

#: Every gallery image, in order.
CHARTS: tuple[Chart, ...] = tuple(chart for _, _, charts in JOBS for chart in charts)


def make_charts(out: str | Path, *, small: bool = False, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Run every job into a scratch folder and copy its gallery PNGs into ``out`` (created); returns the paths
    written, in :data:`CHARTS` order. ``progress(label)`` is called as the work goes on."""
    from plansim.files.outputs import atomic_write_bytes

    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda label: None)
    written = []
    with tempfile.TemporaryDirectory(prefix="plansim-charts-") as scratch:
        for name, job, charts in JOBS:
            folder = job(Path(scratch) / name.replace(" ", "_"), small, say)
            for chart in charts:
                source = folder / chart.source
                if not source.is_file():
                    raise RuntimeError(f"{name}: the run wrote no {chart.source} (for {chart.name})")
                written.append(atomic_write_bytes(directory / chart.name, source.read_bytes()))  # whole or old
    return written


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, make the charts under a progress display and print each file written."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"), help="folder for the PNGs (docs/images)")
    parser.add_argument("--small", action="store_true", help="tiny models and clusters: seconds, for the test")
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    start = time.perf_counter()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting", total=None)
        paths = make_charts(args.out, small=args.small, progress=lambda label: bar.update(task, description=label))
    for path in paths:
        print(f"wrote {path}")
    print(f"{len(paths)} charts in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
