"""How fast the flow-level network runs: transfers simulated per wall-clock second.

(a) independent transfers: 64 senders, each alone on its own two-link route, sending back to back;
(b) contention: groups of 8 senders whose routes share one link (each also has a private link of its own capacity),
    with staggered sizes so rates change at every start and end;
(b') contention, started together: the same groups of 8 start each step together (a collective step) and wait for
    one another;
(c) routing: distinct routes per second on a 10,240-GPU DGX H100 cluster.

Run: python benchmarks/bench_network.py   (the target is >= 50k transfers/s for (a) and (b) on a 2-core machine)
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator

import simpy

from plansim.des.network import FlowNetwork, LinkId


def _run(senders: list[tuple[dict[LinkId, float], list[float]]], capacity: dict[LinkId, float]) -> tuple[float, int]:
    env = simpy.Environment()
    net = FlowNetwork(env, capacity)

    def sender(weights: dict[LinkId, float], sizes: list[float]) -> Generator[simpy.Event]:
        for size in sizes:
            yield net.transfer(weights, size, latency_s=1e-6, kind="bench")

    for weights, sizes in senders:
        env.process(sender(weights, sizes))
    start = time.perf_counter()
    env.run()
    return time.perf_counter() - start, net.transfers_started


def independent(total: int = 100_000, senders: int = 64) -> float:
    """Transfers/s with no contention: every component holds one transfer."""
    rng = random.Random(0)
    capacity: dict[LinkId, float] = {}
    plan = []
    for s in range(senders):
        a, b = (f"gpu{s}", f"nic{s}"), (f"nic{s}", f"leaf{s}")
        capacity[a], capacity[b] = 50e9, 25e9
        plan.append(({a: 1.0, b: 1.0}, [rng.uniform(1e6, 1e8) for _ in range(total // senders)]))
    seconds, count = _run(plan, capacity)
    return count / seconds


def contended(total: int = 100_000, group: int = 8, groups: int = 8) -> float:
    """Transfers/s with groups of ``group`` senders sharing one link: components of ``group`` transfers."""
    rng = random.Random(1)
    capacity: dict[LinkId, float] = {}
    plan = []
    per_sender = total // (group * groups)
    for g in range(groups):
        shared = (f"leaf{g}", f"spine{g}")
        capacity[shared] = 100e9
        for s in range(group):
            own = (f"gpu{g}.{s}", f"leaf{g}")
            capacity[own] = rng.choice([10e9, 25e9, 50e9])
            plan.append(
                ({own: 1.0, shared: rng.choice([1.0, 2.0])}, [rng.uniform(1e6, 1e8) for _ in range(per_sender)])
            )
    seconds, count = _run(plan, capacity)
    return count / seconds


def lockstep(total: int = 100_000, group: int = 8, groups: int = 8) -> float:
    """Transfers/s when ``group`` senders start together on one shared link, step after step (a collective step)."""
    rng = random.Random(3)
    capacity: dict[LinkId, float] = {}
    env = simpy.Environment()
    steps = total // (group * groups)

    def step_loop(links: list[dict[LinkId, float]]) -> Generator[simpy.Event]:
        for _ in range(steps):
            size = rng.uniform(1e6, 1e8)
            yield env.all_of(
                [net.transfer(weights, size * (1 + i % 3), latency_s=1e-6) for i, weights in enumerate(links)]
            )

    plans: list[list[dict[LinkId, float]]] = []
    for g in range(groups):
        shared = (f"leaf{g}", f"spine{g}")
        capacity[shared] = 100e9
        plans.append([])
        for s in range(group):
            own = (f"gpu{g}.{s}", f"leaf{g}")
            capacity[own] = rng.choice([10e9, 25e9, 50e9])
            plans[-1].append({own: 1.0, shared: 1.0})
    net = FlowNetwork(env, capacity)
    for links in plans:
        env.process(step_loop(links))
    start = time.perf_counter()
    env.run()
    return net.transfers_started / (time.perf_counter() - start)


def routing(pairs: int = 500) -> tuple[float, float, float]:
    """Fabric construction seconds, then routes/s for random pairs and for every rank to its ring neighbour on a
    DGX H100 x 10,240 GPU cluster (each route computed once: the cache is not what is timed)."""
    from plansim.des.routing import Fabric
    from plansim.hardware import load_hardware

    cluster = load_hardware("dgx-h100", gpus=10240)
    start = time.perf_counter()
    fabric = Fabric(cluster)
    build = time.perf_counter() - start
    rng = random.Random(2)
    sample = [tuple(rng.sample(range(cluster.num_gpus), 2)) for _ in range(pairs)]
    start = time.perf_counter()
    for src, dst in sample:
        fabric.route(src, dst)
    random_rate = pairs / (time.perf_counter() - start)
    n = cluster.num_gpus
    start = time.perf_counter()
    for rank in range(n):
        fabric.route(rank, (rank + 8) % n)
    return build, random_rate, n / (time.perf_counter() - start)


def main() -> None:
    print(f"(a) independent transfers: {independent():,.0f} transfers/s")
    print(f"(b) 8 transfers contending, staggered: {contended():,.0f} transfers/s")
    print(f"(b') 8 transfers contending, started together: {lockstep():,.0f} transfers/s")
    build, random_pairs, ring = routing()
    print(
        f"(c) DGX H100 x 10240: Fabric built in {build:.2f} s (topology included); {random_pairs:,.0f} routes/s "
        f"between random ranks, {ring:,.0f} routes/s from every rank to rank + 8"
    )


if __name__ == "__main__":
    main()
