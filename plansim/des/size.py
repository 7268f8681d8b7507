"""How much work a discrete-event run will be, known before it starts, and the refusal above the bound.

A stage's program grows linearly with the micro-batches (each runs the same passes; the gradient buckets, ZeRO's
gathers, the optimizer and the warm-up are a constant), so the lowering is built at ``k`` and ``2k`` micro-batches
(``k = pp``, which every schedule accepts) and the count extrapolated to the strategy's ``m``; small runs are built
once and handed on. Full mode runs every program once per rank of its stage; symmetric mode once per stage. Each
collective's schedule is walked transfer by transfer when its phases are built, once per group the run simulates.
The bound is ``plansim.limits.WORK["des_tasks"]`` (``PLANSIM_MAX_DES_TASKS``).
"""

from __future__ import annotations

import math

from plansim.costs.collectives import algorithm_entry, schedule
from plansim.costs.remat_policies import REMAT_POLICIES
from plansim.des.lower import lower
from plansim.des.taskgraph import TaskGraph
from plansim.errors import PlansimError
from plansim.hardware import Cluster
from plansim.limits import refuse_work, work_bound
from plansim.step.comm import WholeGroup
from plansim.strategy.schema import Strategy
from plansim.workload.traced import Workload

__all__ = ["checked_lowering", "des_ceiling", "des_estimate", "des_work", "sized_lowering"]


def sized_lowering(model: Workload, cluster: Cluster, s: Strategy, mode: str) -> TaskGraph:
    """``lower(model, cluster, s)``, refused with a ``PlansimError`` before it is built when the run it feeds
    would exceed the work bound (``s`` resolved: dp and dtype set).

    The work is ``a + b m`` with ``a >= 0`` (what every micro-batch runs, and a constant: the buckets, the
    optimizer, the warm-up), so ``m / k`` times the work at ``k`` micro-batches is at least the work at ``m``:
    where that is within the bound the run is built at once and its own work checked; else the work is
    extrapolated from ``k`` and ``2k`` micro-batches before anything larger is built."""
    m = s.num_microbatches
    k = s.pp
    if m <= 2 * k:
        return checked_lowering(model, cluster, s, mode)
    try:
        small = des_work(lower(model, cluster, _with_microbatches(s, k)), cluster, mode)
        if small * m / k <= work_bound("des_tasks"):
            return checked_lowering(model, cluster, s, mode)
        double = des_work(lower(model, cluster, _with_microbatches(s, 2 * k)), cluster, mode)
    except PlansimError:  # a check that only the smaller batch fails: count the strategy itself
        return checked_lowering(model, cluster, s, mode)
    per_microbatch = (double - small) / k
    _refuse(model, cluster, s, mode, round(small + per_microbatch * (m - k)))
    return lower(model, cluster, s)


def checked_lowering(model: Workload, cluster: Cluster, s: Strategy, mode: str) -> TaskGraph:
    """``lower(model, cluster, s)``, refused once built when its run is above the work bound."""
    graph = lower(model, cluster, s)
    _refuse(model, cluster, s, mode, des_work(graph, cluster, mode))
    return graph


def des_estimate(model: Workload, cluster: Cluster, s: Strategy, mode: str = "symmetric") -> int:
    """The work (``des_work``) of the discrete-event run of ``s`` (resolved), estimated as ``sized_lowering`` does
    without building the run's own lowering where the extrapolation stands for it: to bound several runs together
    (a plan's finalists) before the first starts."""
    m, k = s.num_microbatches, s.pp
    whole = _with_microbatches(s, m)  # a scheduled remat counted as full: no MILP is solved for an estimate
    if m <= 2 * k:
        return des_work(lower(model, cluster, whole), cluster, mode)
    try:
        small, double = (des_work(lower(model, cluster, _with_microbatches(s, n)), cluster, mode) for n in (k, 2 * k))
    except PlansimError:
        return des_work(lower(model, cluster, whole), cluster, mode)
    return round(small + (double - small) / k * (m - k))


def des_ceiling(model: Workload, cluster: Cluster, s: Strategy, mode: str = "symmetric") -> int:
    """At least ``des_estimate`` and cheaper: ``m / k`` times the work at ``k`` micro-batches (the work is ``a + b m``
    with ``a >= 0``), from one lowering at ``k = pp``; the run's own work where ``m <= 2k``, as ``des_estimate``.
    Where the ceilings of several runs are within a bound, so are their works."""
    m, k = s.num_microbatches, s.pp
    if m <= 2 * k:
        return des_estimate(model, cluster, s, mode)
    try:
        small = des_work(lower(model, cluster, _with_microbatches(s, k)), cluster, mode)
    except PlansimError:
        return des_estimate(model, cluster, s, mode)
    return math.ceil(small * m / k)


#: What one collective transfer costs against one simulated task, from whole-run wall times of this project's runs
#: on 2 cores: a task ~8 us (gpt3-175b on 1024 A100, 1f1b pp16, symmetric: 358,788 tasks, 2.8 s); a transfer the
#: phase builder walks ~1 us (gpt3-1.3b, a 1,000-way ring, whose steps differ and are walked one by one: 16.0M
#: walked, 16.7 s); a transfer only built while a schedule's steps are made ~50 ns (gpt3-125m, pure data parallelism
#: in full mode at 256 to 2,048 GPUs: the run grows with the square of the ring, 59M built transfers at 2,048 GPUs in
#: 3.1 s; symmetric mode builds them at ~20 ns: a 4,096-way ring's 33.5M in 0.7 s).
WALKED_PER_TASK = 8
BUILT_PER_TASK = 160


def des_work(graph: TaskGraph, cluster: Cluster, mode: str) -> int:
    """Tasks the engine runs plus its collectives' transfers in task-equivalents (``WALKED_PER_TASK``,
    ``BUILT_PER_TASK``), for ``graph``."""
    mesh = graph.mesh
    width = mesh.stride("pp")  # ranks per stage
    runs = width if mode == "full" else 1
    tasks = runs * sum(len(program.tasks) for program in graph.stages)
    # the lowering shares one Comm object among a layer's micro-batches: by identity first, hashed once each
    kinds = {id(task.comm): task.comm for program in graph.stages for task in program.tasks if task.comm}.values()
    transfers = 0.0
    for comm in {(c.collective, c.algorithm, c.axis, c.local) for c in kinds if isinstance(c.peers, WholeGroup)}:
        collective, algorithm, group, local = comm
        p = mesh.size(group)
        if p < 2:
            continue
        sched = schedule(collective, algorithm, p, local)
        # NCCL-like channels: one ring per member on a node, when the group spans nodes (des.engine._channels)
        per_node = max(1, min(p, cluster.gpus_per_node // mesh.stride(group)))
        rings = algorithm_entry(collective, algorithm).rings_per_local_rank and per_node < p
        channels = per_node if rings else 1
        # full mode simulates every group of the axis; symmetric mode one per stage, standing for its copies
        groups = graph.pp * (width // p if mode == "full" else 1)
        transfers += groups * (channels * sched.distinct_transfers / WALKED_PER_TASK + sched.transfers / BUILT_PER_TASK)
    return tasks + round(transfers)


def _with_microbatches(s: Strategy, m: int) -> Strategy:
    """``s`` at ``m`` micro-batches. A scheduled remat policy (``milp``) is counted as full recomputation, whose
    tasks have the same shape, so the estimate solves no MILP at a batch the run does not use."""
    dp = s.dp or 1
    update: dict[str, object] = {"global_batch": m * s.micro_batch * dp}
    if REMAT_POLICIES[s.remat].scheduled:
        update["remat"] = "full"
    return s.model_copy(update=update)


def _refuse(model: Workload, cluster: Cluster, s: Strategy, mode: str, work: int) -> None:
    subject = f"discrete-event run ({mode} mode) of {getattr(model, 'name', 'the model')} on {cluster.num_gpus} GPUs"
    if mode == "full":
        narrow = "use --mode symmetric (the same answer unless stragglers, jitter or link what-ifs set ranks apart)"
    else:
        narrow = "use the analytic engine (--engine analytic; plan: --no-des)"
    refuse_work("des_tasks", work, subject, narrow)
