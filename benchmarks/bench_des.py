"""How fast the discrete-event engine simulates one training step at scale.

Cases (issue 3): GPT-3 175B, tp=8 pp=8 dp=16 (1,024 A100s), 1F1B, global batch 1536: target under 10 s; and a
10,240-GPU case (Llama-3 405B on DGX H100s, tp=8 pp=16 dp=80, global batch 2560): target under 60 s. Prints wall
seconds (whole call: lowering, simulation, result), the simulation's own seconds, tasks, transfers, SimPy events and
events per second, and the step time next to the analytic engine's.

Run: python benchmarks/bench_des.py
"""

from __future__ import annotations

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


def main() -> None:
    for label, model, hardware, strategy, target in CASES:
        start = time.perf_counter()
        r = plansim.simulate(model, hardware, strategy, engine="des")
        wall = time.perf_counter() - start
        a = plansim.simulate(model, hardware, strategy)
        st = r.engine_stats
        print(f"{label}")
        print(f"  wall {wall:.2f} s (target < {target:.0f} s: {'ok' if wall < target else 'MISSED'})")
        print(f"  simulation {r.timings['wall_s']:.2f} s, {st['tasks']:,} tasks, {st['transfers']:,} transfers")
        print(f"  {st['events']:,} events, {st['events'] / r.timings['wall_s']:,.0f} events/s")
        print(f"  step time des {r.step_time_s:.3f} s vs analytic {a.step_time_s:.3f} s")
        print(f"  MFU des {r.mfu:.3f} vs analytic {a.mfu:.3f}")


if __name__ == "__main__":
    main()
