"""How fast the discrete-event engine simulates one training step at scale.

Cases (issue 3): GPT-3 175B, tp=8 pp=8 dp=16 (1,024 A100s), 1F1B, global batch 1536: target under 10 s; and a
10,240-GPU case (Llama-3 405B on DGX H100s, tp=8 pp=16 dp=80, global batch 2560): target under 60 s. Prints wall
seconds (whole call: lowering, simulation, result), the simulation's own seconds, tasks, transfers, SimPy events,
events per task and events per second, and the step time next to the analytic engine's.

Then the planner's case: a finalist of the README plan (``plansim plan --model gpt3-175b --hardware dgx-a100 --gpus
1024 --global-batch 1536``), run as the planner re-simulates its finalists (``planner.search.des_figures``: no
timeline). And the first case in full mode (every one of the 1,024 ranks) at a global batch of 128 (8 micro-batches,
2.5M tasks: at 1536 it is 30M, above the default work bound), the bound raised for it, in a child process so that
its peak resident memory is its own (``resource.getrusage(RUSAGE_CHILDREN)``); ``--no-full`` leaves it out.

Run: python benchmarks/bench_des.py [--no-full]
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import sys
import time

import plansim

CASES = [
    (
        "gpt3-175b x 1024 A100 (1f1b, gbs 1536)",
        "gpt3-175b",
        "dgx-a100",
        "dp=16,tp=8,pp=8,micro_batch=1,global_batch=1536,schedule=1f1b,sequence_parallel=true,remat=selective,zero=1",
        10.0,
    ),
    (
        "llama3-405b x 10240 H100 (1f1b, gbs 2560)",
        "llama3-405b",
        "dgx-h100",
        "dp=80,tp=8,pp=16,micro_batch=1,global_batch=2560,schedule=1f1b,sequence_parallel=true,remat=selective,zero=1",
        60.0,
    ),
]

#: The README plan's first finalist (interleaved, 12 virtual stages), as the planner re-simulates it.
FINALIST = (
    "gpt3-175b",
    "dgx-a100",
    1024,
    "dp=32,tp=4,pp=8,micro_batch=1,global_batch=1536,schedule=interleaved,virtual_stages=12,sequence_parallel=true,"
    "remat=none,zero=1,framework=megatron",
)


def _stats(r: plansim.Result) -> str:
    st = r.engine_stats
    return (
        f"{st['tasks']:,} tasks, {st['transfers']:,} transfers, {st['events']:,} events "
        f"({st['events'] / st['tasks']:.2f} per task)"
    )


def _cases() -> None:
    for label, model, hardware, strategy, target in CASES:
        start = time.perf_counter()
        r = plansim.simulate(model, hardware, strategy, engine="des")
        wall = time.perf_counter() - start
        a = plansim.simulate(model, hardware, strategy)
        st = r.engine_stats
        print(f"{label}")
        print(f"  wall {wall:.2f} s (target < {target:.0f} s: {'ok' if wall < target else 'MISSED'})")
        print(f"  simulation {r.timings['wall_s']:.2f} s, {_stats(r)}")
        print(f"  {st['events'] / r.timings['wall_s']:,.0f} events/s")
        print(f"  step time des {r.step_time_s:.3f} s vs analytic {a.step_time_s:.3f} s")
        print(f"  MFU des {r.mfu:.3f} vs analytic {a.mfu:.3f}")


def _finalist() -> None:
    from plansim.api import as_strategy, load_hardware, load_model
    from plansim.planner.search import des_figures

    model, hardware, gpus, strategy = FINALIST
    spec, cluster = load_model(model), load_hardware(hardware, gpus=gpus)
    start = time.perf_counter()
    r = des_figures(spec, cluster, as_strategy(strategy))
    wall = time.perf_counter() - start
    print("planner finalist: gpt3-175b x 1024 A100 (interleaved v=12, dp32 tp4 pp8), des_figures")
    print(f"  wall {wall:.2f} s, {_stats(r)}")


#: The full-mode case: the first case at 8 micro-batches, and a work bound that admits it.
FULL_BATCH = 128
FULL_BOUND = "10000000"


def _full_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    os.environ["PLANSIM_MAX_DES_TASKS"] = FULL_BOUND
    _, model, hardware, strategy, _ = CASES[0]
    strategy = strategy.replace("global_batch=1536", f"global_batch={FULL_BATCH}")
    start = time.perf_counter()
    r = plansim.simulate(model, hardware, strategy, engine="des", mode="full")
    queue.put((time.perf_counter() - start, _stats(r), r.step_time_s))


def _full() -> None:
    """The first case in full mode, in a child process: its wall time and peak resident memory."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_full_child, args=(queue,))
    child.start()
    wall, stats, step = queue.get()
    child.join()
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kilobytes on Linux
    print(f"{CASES[0][0].replace('gbs 1536', f'gbs {FULL_BATCH}')}, full mode (every rank)")
    print(f"  wall {wall:.2f} s, peak resident memory {peak / 1e9:.2f} GB, {stats}, step {step:.3f} s")


def main() -> None:
    _cases()
    _finalist()
    if "--no-full" not in sys.argv[1:]:
        _full()


if __name__ == "__main__":
    main()
