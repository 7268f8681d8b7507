"""The discrete-event engine: runs a TaskGraph on simulated GPUs, links and memory with SimPy.

Each simulated GPU runs its streams (compute, p2p, dp, tp) in order, each task waiting for its dependencies. SimPy
keeps time; the streams are driven by callbacks, not a SimPy process each: a task that ends wakes the streams waiting
for it at once (no event), a compute task is one timer, a collective one network transfer per phase. While
collectives run beside compute the compute stream runs slower (``plansim.costs.interference``); what starts or ends
at one moment is settled together, and only a running compute task whose rate changed gets a new timer (the old one,
stamped with an older token, is ignored when it fires).
Collectives run as their cost-model schedules (``plansim.costs.collectives``) of point-to-point transfers over the
cluster's routes (``plansim.des.routing``) through a flow-level network with max-min fair sharing
(``plansim.des.network``). Consecutive schedule steps with the same pattern form one phase: one bundled transfer whose
member flows move in lockstep (a ring's steps are paced by its slowest hop, so this is how a ring behaves), with
the schedule's per-step latency once per step. A ring among ranks on several nodes runs as one channel per local rank,
each entering and leaving every node through the NIC of one rail (``Fabric.ring_route``: NCCL's same-NIC channels,
relayed over NVLink to that NIC's GPU where the channel's last GPU is another): NCCL's multi-ring layout, one channel
per NIC, which is what the analytic engine's group bandwidth assumes (``Cluster.group_link``).

Symmetry (``mode="symmetric"``): tensor-parallel ranks run in lockstep and data-parallel replicas are identical, so
one representative rank per pipeline stage is simulated; every transfer it starts also stands for the identical
transfers of the stage's other ranks, counted on each link they share (weights of the bundled transfer). ``mode="full"``
simulates every rank and rendezvous each collective among its members; tests hold the two equal.

A collective's phases are prepared once (routes, bundle weights) and chained by callbacks, not by a SimPy process per
collective. What-ifs (``WhatIf``): slower GPUs, degraded or failed links, and sampled kernel jitter in place of the
expected wait for a collective's slowest member. The step's time breakdown is the busiest stage's, every stage's
kept beside it (``_breakdown`` says how idle time splits into exposed communication and bubble).
``simulate_collective`` runs one collective alone on an idle network.
"""

from __future__ import annotations

import bisect
import math
import time
from array import array
from collections import defaultdict, deque
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from heapq import heappop, heappush
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL

from plansim.costs.collectives import algorithm_entry, bytes_sent_per_rank, schedule
from plansim.costs.interference import IDLE, Interference, Load, interference_model, send_load
from plansim.costs.kernels import load_kernel_table
from plansim.costs.nccl_groups import LayerCall, layer_call, ring_overhead_s, timed
from plansim.des.memory import MemoryTracker
from plansim.des.network import FlowNetwork, LinkId, Route
from plansim.des.routing import Fabric
from plansim.des.size import checked_lowering, sized_lowering
from plansim.des.taskgraph import NO_KERNEL, StageProgram, TaskGraph
from plansim.des.timeline import Span, Timeline
from plansim.errors import PlansimError
from plansim.gc_pause import gc_paused
from plansim.hardware import Cluster
from plansim.result import Result
from plansim.step.comm import Comm, GroupEnds, Shift, Standalone, WholeGroup
from plansim.step.offload import OFFLOAD_PARTS, host_tier
from plansim.step.prepare import beside, kernel_model
from plansim.step.result import TIME_PARTS, host_no_fit_reason, overlap_figures, step_result
from plansim.strategy.mesh import AXIS_ORDER, COMM_KINDS, DP_AXES, DeviceMesh
from plansim.strategy.schema import Strategy
from plansim.units import GB
from plansim.workload import ModelSpec

__all__ = ["MODES", "CollectiveRun", "WhatIf", "simulate_collective", "simulate_des"]

MODES = ("symmetric", "full")
#: Task categories that are model compute (not recompute, communication or the optimizer).
_COMPUTE = frozenset({"forward", "backward", "weight_grad"})
_TOP_LINKS = 20


@dataclass(frozen=True)
class WhatIf:
    """Perturbations a discrete-event simulation can answer.

    ``stragglers``: rank -> factor by which that GPU's kernels are slower (1.5 = 50 % slower). ``link_factors``:
    link selector (``plansim.des.routing``: a vertex such as ``node0/nic0`` or an edge ``u--v``) -> bandwidth
    factor. ``failed_links``: selectors removed from the topology; routes go around them. ``jitter``: standard
    deviation of the log of a random factor on every kernel time (log-normal with mean 1), drawn with ``seed``; it
    replaces the expected wait of each blocking collective for its slowest member (``Task.wait_s``), which the run
    charges otherwise, by the sampled one (the wait for the job's slowest GPU, a property of the chips, stays).
    ``moe_imbalance_spread``: a mixture of experts' routing imbalance sampled per micro-batch and pipeline stage
    (``_sampled_imbalance``), drawn with ``seed``, in place of the model's fixed ``moe_imbalance``, its mean.
    """

    stragglers: Mapping[int, float] = field(default_factory=dict)
    link_factors: Mapping[str, float] = field(default_factory=dict)
    failed_links: tuple[str, ...] = ()
    jitter: float = 0.0
    seed: int = 0
    moe_imbalance_spread: float = 0.0

    def check(self, cluster: Cluster) -> None:
        """Raise ``PlansimError`` for a straggler rank outside the cluster or a non-positive factor."""
        for rank, factor in self.stragglers.items():
            if not 0 <= rank < cluster.num_gpus:
                raise PlansimError(
                    f"straggler rank {rank} is outside the cluster: use a rank in 0..{cluster.num_gpus - 1}"
                )
            if not 0 < factor < math.inf:
                raise PlansimError(
                    f"straggler factor for rank {rank} must be > 0 and finite (1.5 = 50% slower), got {factor}"
                )
        if not 0 <= self.jitter < math.inf:
            raise PlansimError(f"jitter must be >= 0 and finite (a standard deviation, e.g. 0.05), got {self.jitter}")
        if self.seed < 0:
            raise PlansimError(f"seed must be >= 0, got {self.seed}")
        if not 0 <= self.moe_imbalance_spread < math.inf:
            raise PlansimError(
                f"moe_imbalance_spread must be >= 0 and finite (a standard deviation, e.g. 0.5), got "
                f"{self.moe_imbalance_spread}"
            )


@dataclass(frozen=True)
class _Phase:
    weights: dict[LinkId, float]
    bytes_factor: float
    latency_s: float
    injected: float
    route: Route


def _run_to_end(env: simpy.Environment) -> None:
    """``env.run()`` without ``until``: every event in time order, its callbacks called in order, a failed event not
    defused raised (SimPy's ``Environment.step``, with the loop's per-event method calls inlined)."""
    queue = env._queue
    while queue:
        env._now, _, _, event = heappop(queue)
        callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


class _Timer(simpy.Event):
    """A timeout that calls ``call(event)`` when it fires (one object, its one callback already attached)."""

    def __init__(self, env: simpy.Environment, delay: float, call: Callable[[simpy.Event], None]) -> None:
        self.env = env
        self.callbacks = [call]
        self._value = None
        self._ok = True
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), self))  # env.schedule, inlined


class _Stream:
    """One stream of a simulated GPU: its tasks (indices into the stage's program) in order, and how many ran."""

    __slots__ = ("dev", "indices", "pos")

    def __init__(self, dev: _Device, indices: list[int]) -> None:
        self.dev = dev
        self.indices = indices
        self.pos = 0


class _Device:
    __slots__ = (
        "active",
        "armed",
        "began",
        "channels",
        "compute",
        "dirty",
        "done",
        "end",
        "extra",
        "factor",
        "groups",
        "hbm_Bps",
        "label",
        "mem",
        "offset",
        "overlapped",
        "peers",
        "program",
        "rank",
        "rate",
        "since",
        "stage",
        "start",
        "task",
        "token",
        "waiters",
        "work",
    )

    def __init__(self, rank: int, stage: int, offset: int, program: StageProgram, capacity: float) -> None:
        self.rank = rank
        self.stage = stage
        self.offset = offset
        self.program = program
        self.label = f"gpu{rank} (stage {stage})"
        self.mem = MemoryTracker(self.label, capacity)
        n = len(program.tasks)
        # when each task started and ended (NaN: not yet), 8 bytes a value
        self.start = array("d", [math.nan]) * n
        self.end = array("d", [math.nan]) * n
        self.done = bytearray(n)  # 1 once the task ended
        self.waiters: dict[int, list[_Stream]] = {}  # task -> the streams waiting for it to end
        # (comm, beside compute) -> (members, simulated members, phases, load on the GPU beside compute, what NCCL
        # adds): what each of the rank's collectives needs (``_Engine._communicate``)
        self.groups: dict[tuple[int, bool], tuple[tuple[int, ...], int, list[_Phase], Load, float]] = {}
        self.peers: list[_Device] = []  # per stage, the simulated rank of it this one depends on (its offset's)
        self.factor = 1.0
        # interference (plansim.costs.interference): the collectives running beside compute, what they take, and
        # the compute stream's rate
        self.active = 0
        self.channels = 0
        self.hbm_Bps = 0.0
        self.rate = 1.0
        # the running compute task (-1: none), its stream, when it began, the work it has left (seconds at full
        # rate) as of ``since``, the rate its timer was armed at (0: none yet) and that timer's token; ``dirty``:
        # its rate may have changed in this instant's callbacks (the engine's ``_settle`` rearms it once)
        self.task = -1
        self.compute: _Stream | None = None
        self.work = 0.0
        self.began = self.since = 0.0
        self.armed = 0.0
        self.token = 0
        self.dirty = False
        self.extra: dict[int, float] = {}  # compute-stream task -> seconds it lost to interference
        self.overlapped = 0.0  # seconds compute ran beside a collective


class _Engine:
    def __init__(self, graph: TaskGraph, cluster: Cluster, mode: str, what_if: WhatIf) -> None:
        self.graph = graph
        self.cluster = cluster
        self.mode = mode
        self.what_if = what_if
        self.env = simpy.Environment()
        self.fabric = Fabric(cluster, link_factors=dict(what_if.link_factors), failed=what_if.failed_links)
        self.net = FlowNetwork(self.env, self.fabric.capacity_Bps)
        self.mesh = graph.mesh
        self.width = self.mesh.stride("pp")  # ranks per pipeline stage
        self.rng = np.random.default_rng(what_if.seed)
        # the expected waits of blocking collectives for their slowest member; sampled jitter replaces them
        self.sync_waits = not what_if.jitter
        # (task name, members) -> the members' (stream, task) that reached a collective so far (full mode)
        self.rendezvous: dict[tuple[str, tuple[int, ...]], list[tuple[_Stream, int]]] = {}
        self.phase_cache: dict[tuple[Any, ...], list[_Phase]] = {}
        self.extra_cache: dict[tuple[Any, ...], float] = {}
        self.layer_calls: dict[tuple[Any, ...], LayerCall] = {}
        # per program, its collectives in task order; per (stage, what each sends) the bytes by kind (_comm_bytes)
        self._comm_tasks: dict[int, list[Comm]] = {}
        self.comm_sums: dict[tuple[Any, ...], dict[str, float]] = {}
        table = load_kernel_table(cluster.gpu.name)
        self.interference: Interference = interference_model(cluster.gpu, table.overlap if table else None)
        self.devices: dict[int, _Device] = {}
        offsets = range(self.width) if mode == "full" else range(1)
        for prog in graph.stages:
            for off in offsets:
                rank = prog.stage * self.width + off
                self.devices[rank] = _Device(rank, prog.stage, off, prog, cluster.gpu.memory_bytes)
        self._apply_stragglers()
        for dev in self.devices.values():
            dev.peers = [self.devices[st * self.width + dev.offset] for st in range(len(graph.stages))]
        # what a collective's phases depend on beyond the collective and its members (``phases``): the cluster, the
        # links' what-ifs (the routes), the mode and the mesh (the simulated ranks and the copies they stand for)
        self.context = (cluster, tuple(sorted(what_if.link_factors.items())), tuple(what_if.failed_links), mode,
                        self.mesh)  # fmt: skip
        self._ready: deque[_Stream] = deque()  # streams whose next task may start now
        self._draining = False
        self._dirty: list[_Device] = []  # devices whose compute rate changed or whose compute task started

    def _apply_stragglers(self) -> None:
        for rank, factor in self.what_if.stragglers.items():
            # symmetric mode: the stage's representative runs at its slowest rank's pace (lockstep collectives)
            dev = self.devices.get(rank) or self.devices[(rank // self.width) * self.width]
            dev.factor = max(dev.factor, factor)

    # -- running ---------------------------------------------------------------------------------------------------
    def run(self) -> None:
        t = 0.0
        for dev in self.devices.values():
            for name, n_bytes in dev.program.static_memory.items():
                dev.mem.alloc(f"static/{name}", n_bytes, t, name)
            streams: dict[str, list[int]] = defaultdict(list)
            for i, task in enumerate(dev.program.tasks):
                streams[task.stream].append(i)
            self._ready.extend(_Stream(dev, indices) for indices in streams.values())
        self._drain()
        _run_to_end(self.env)
        for dev in self.devices.values():
            unfinished = [dev.program.tasks[i].name for i, e in enumerate(dev.end) if math.isnan(e)]
            if unfinished:
                raise AssertionError(f"{dev.label}: tasks never ran (deadlock in the lowering): {unfinished[:5]}")

    def _drain(self) -> None:
        """Run the ready streams until each waits (for a dependency, a timer or a collective), then settle the
        compute rates this changed (``_settle``). Every callback the engine gives SimPy ends here."""
        if self._draining:
            return
        self._draining = True
        ready, advance = self._ready, self._advance
        while ready:
            advance(ready.popleft())
        self._draining = False
        if self._dirty:
            self._settle()

    def _advance(self, stream: _Stream) -> None:
        """Start ``stream``'s tasks in order until one waits: for a task it depends on (the stream is woken when
        that ends), for its time (a timer) or for a collective; a task with nothing to wait for ends at once. A
        compute task's timer is armed once this instant's rate is known (``_settle``)."""
        dev, env = stream.dev, self.env
        tasks, indices, peers = dev.program.tasks, stream.indices, dev.peers
        n = len(indices)
        while stream.pos < n:
            i = indices[stream.pos]
            task = tasks[i]
            for st, j in task.deps:
                owner = peers[st]
                if not owner.done[j]:
                    owner.waiters.setdefault(j, []).append(stream)
                    return
            now = env._now
            for name, n_bytes, cat in task.alloc:
                dev.mem.alloc(name, n_bytes, now, cat)
            if task.comm is not None:
                if task.wait_s > 0 and self.sync_waits:  # the expected wait for the group's slowest member
                    _Timer(env, task.wait_s, partial(self._waited, stream, i))
                else:
                    self._communicate(stream, i)
                return
            duration = task.duration_s
            if duration > 0:
                if task.category in NO_KERNEL:  # a wait for the slowest GPU or for the host: no kernel of this one
                    _Timer(env, duration, partial(self._timed, stream, i, now))
                    return
                # a slower GPU slows the kernels, not the host's launches: a host-bound run stays host-bound
                d = (duration - task.host_s) * dev.factor
                if self.what_if.jitter:
                    d *= self._jitter_factor(self.what_if.jitter)
                if task.host_s > 0:
                    d = max(d, duration)
                dev.task, dev.compute, dev.work, dev.armed = i, stream, d, 0.0
                dev.began = dev.since = now
                if not dev.dirty:
                    dev.dirty = True
                    self._dirty.append(dev)
                return
            self._finish(stream, i, now)

    def _finish(self, stream: _Stream, i: int, start: float) -> None:
        """Task ``i`` of ``stream`` ends now: free its memory, record it, make the streams waiting for it ready."""
        dev, now = stream.dev, self.env._now
        for name in dev.program.tasks[i].free:
            dev.mem.free(name, now)
        dev.start[i] = start
        dev.end[i] = now
        dev.done[i] = 1
        waiting = dev.waiters.pop(i, None)
        if waiting:
            self._ready.extend(waiting)
        stream.pos += 1

    def _done(self, stream: _Stream, i: int, start: float) -> None:
        """A timer's task ends: its stream goes on at once, then the streams that waited for it."""
        self._finish(stream, i, start)
        self._ready.appendleft(stream)
        self._drain()

    def _timed(self, stream: _Stream, i: int, start: float, _event: simpy.Event) -> None:
        """A task's timer fired (the wait for the job's slowest GPU): it ends."""
        self._done(stream, i, start)

    def _waited(self, stream: _Stream, i: int, _event: simpy.Event) -> None:
        """A blocking collective's expected wait for its slowest member is over: the collective starts."""
        self._communicate(stream, i)
        self._drain()

    # -- compute at the stream's rate ------------------------------------------------------------------------------
    def _touch(self, dev: _Device) -> None:
        """Mark ``dev``'s running compute task for ``_settle``."""
        if not dev.dirty:
            dev.dirty = True
            self._dirty.append(dev)

    def _settle(self) -> None:
        """Arm the timer of each compute task started in this instant's callbacks, and rearm those whose rate the
        collectives starting and ending beside them changed, once, at the net rate: the work done at the old rate
        is taken off (``_progress``), the rest runs at the new one. A task whose rate did not change keeps its
        timer."""
        env, computed = self.env, self._computed
        for dev in self._dirty:
            dev.dirty = False
            if dev.task < 0 or dev.rate == dev.armed:
                continue
            if dev.armed:
                self._progress(dev)
            dev.armed = rate = dev.rate
            dev.token += 1
            _Timer(env, dev.work / rate, partial(computed, dev, dev.token))
        self._dirty.clear()

    def _progress(self, dev: _Device) -> None:
        """Take the work done since ``dev.since`` at the armed rate off the running task's; what the rate lost to
        the collectives beside it is that task's ``extra`` (the breakdown's interference)."""
        now, rate = self.env._now, dev.armed
        spent = now - dev.since
        dev.work = max(0.0, dev.work - spent * rate)
        if rate < 1.0:
            dev.overlapped += spent
            dev.extra[dev.task] = dev.extra.get(dev.task, 0.0) + spent * (1.0 - rate)
        dev.since = now

    def _computed(self, dev: _Device, token: int, _event: simpy.Event) -> None:
        """The compute task's timer fired; a timer of an older token (the rate changed since) is ignored. The task
        ends, its stream goes on, then the streams that waited for it."""
        if token != dev.token:
            return
        i, stream = dev.task, dev.compute
        assert stream is not None
        if dev.armed < 1.0:
            self._progress(dev)
        dev.task, dev.compute, dev.armed = -1, None, 0.0
        self._finish(stream, i, dev.began)
        self._draining = True
        self._advance(stream)
        self._draining = False
        self._drain()

    def _jitter_factor(self, sigma: float) -> float:
        """A log-normal factor with mean 1 per rank; in symmetric mode the representative stands for ``tp`` ranks in
        lockstep, whose next collective waits for the slowest of their draws."""
        draws = 1 if self.mode == "full" else self.mesh.size("tp")
        z = float(self.rng.standard_normal(draws).max())
        return math.exp(sigma * z - sigma * sigma / 2)

    # -- communication ---------------------------------------------------------------------------------------------
    def members(self, dev: _Device, comm: Comm) -> tuple[int, ...]:
        """Global ranks of the group ``comm`` runs in, for the rank ``dev`` stands for, asked of the mesh by the kind
        of its peers (``plansim.step.comm.Peers``): the rank's group along the comm's axis; a send's peer ``steps``
        along it (a pipeline send's, stages away); the first and last rank of the group (the tied embedding's first
        and last stage)."""
        match comm.peers:
            case Shift(steps=steps):
                return dev.rank, self.mesh.shift(comm.axis, dev.rank, steps)
            case GroupEnds():
                ends = self.mesh.group(comm.axis, dev.rank)
                return ends[0], ends[-1]
            case WholeGroup():
                return self.mesh.group(comm.axis, dev.rank)
            case Standalone():
                raise ValueError("a standalone collective's ranks are its caller's (simulate_collective)")

    def comm_tasks(self, program: StageProgram) -> list[Comm]:
        """The collectives of ``program``'s tasks, in task order (made once per program)."""
        got = self._comm_tasks.get(program.stage)
        if got is None:
            got = self._comm_tasks[program.stage] = [t.comm for t in program.tasks if t.comm is not None]
        return got

    def images(self, group: str) -> tuple[int, ...]:
        """Rank offsets of the copies of an axis' transfers that the representative stands for (symmetric mode)."""
        if self.mode == "full":
            return (0,)
        return self.mesh.copies(group, "pp")

    def _communicate(self, stream: _Stream, index: int) -> None:
        """Start (or join) the collective of task ``index`` of ``stream``; it runs once every simulated member has
        arrived, and its members' tasks end with it. One on a stream beside compute (dp, p2p, tp) slows the
        members' compute while it runs (``_change``)."""
        dev = stream.dev
        task = dev.program.tasks[index]
        comm = task.comm
        assert comm is not None
        # the same collective blocks on the compute stream in one place and runs beside compute in another (a
        # sequence-parallel all-gather in forward and its re-gather in backward): only the latter loads the GPU
        beside = task.stream != "compute"
        group_key = (id(comm), beside)  # the program's Comm objects live as long as the run
        known = dev.groups.get(group_key)
        if known is None:
            members = self.members(dev, comm)
            participants = 1 if isinstance(comm.peers, Shift) else sum(1 for r in members if r in self.devices)
            load = self._load_of(dev, comm, members) if beside else IDLE
            extra = self._nccl_extra(comm, members)
            known = dev.groups[group_key] = (members, participants, self.phases(comm, members), load, extra)
        members, participants, phases, load, extra = known
        if participants <= 1:  # a send, or the only simulated member (symmetric mode): nobody to wait for
            waiters = [(stream, index)]
        else:
            key = (task.name, members)
            waiters = self.rendezvous.setdefault(key, [])
            waiters.append((stream, index))
            if len(waiters) < participants:
                return
            del self.rendezvous[key]
        loaded = () if load is IDLE else tuple(s.dev for s, _ in waiters)
        start = self.env._now
        self._collective(comm, phases, extra, partial(self._communicated, waiters, loaded, load, start))
        for member in loaded:
            self._change(member, load, +1)

    def _communicated(
        self,
        waiters: list[tuple[_Stream, int]],
        loaded: tuple[_Device, ...],
        load: Load,
        start: float,
        _event: simpy.Event | None = None,
    ) -> None:
        """A collective ended: its load leaves the members' compute, its members' tasks end (they started when
        the last member arrived), their streams go on."""
        for member in loaded:
            self._change(member, load, -1)
        for stream, index in waiters:
            self._finish(stream, index, start)
        # the members' streams go on first, then those that waited for them
        self._ready.extendleft(stream for stream, _ in reversed(waiters))
        self._drain()

    def _nccl_extra(self, comm: Comm, members: tuple[int, ...]) -> float:
        """What NCCL adds to a call's bytes (``costs.nccl_groups``, as the analytic engine adds it), charged at the
        end of its last phase: a layer's call as NCCL's default runs it (``layer_call``: ring, tree or NVLS), a ring
        call's or an ``nccl`` call's (the ring's flows, the time of the call NCCL's tuner picks, ``ring_overhead_s``);
        0 for other algorithms, sends and nodes without NCCL figures (whose phases carry the per-step latency
        instead)."""
        call = self._layer_call(comm, members)
        if call is not None:
            return call.overhead_s or 0.0
        mode = algorithm_entry(comm.collective, comm.algorithm).nccl
        if mode is None or isinstance(comm.peers, Shift) or not timed(self.cluster) or len(members) < 2:
            return 0.0
        key = (comm.collective, comm.algorithm, len(members), members[0], members[-1], comm.n_bytes)
        got = self.extra_cache.get(key)
        if got is None:
            nodes = len({self.cluster.node_of(r) for r in members})
            if isinstance(comm.peers, GroupEnds):  # the analytic engine's links (p2p_link for the pair, mesh.link)
                link = self.cluster.p2p_link(members[0], members[-1])
            else:
                link = self.cluster.group_link(len(members), members[1] - members[0])
            busbw = link.bandwidth_Bps
            got = ring_overhead_s(self.cluster, comm.collective, len(members), nodes, comm.n_bytes, busbw, mode)
            got = got or 0.0
            self.extra_cache[key] = got
        return got

    def _layer_call(self, comm: Comm, members: tuple[int, ...]) -> LayerCall | None:
        """How a layer's collective (a mesh axis other than dp) runs with NCCL's default algorithm, as the analytic
        engine's ``comm_pricer`` asks (``plansim.costs.nccl_groups.layer_call``: ring, tree or NVLS); None for
        data-parallel collectives, sends, the embedding sync (a pair) and ``simulate_collective``'s (its algorithm is
        given)."""
        if not isinstance(comm.peers, WholeGroup) or comm.axis in DP_AXES:
            return None
        if comm.algorithm != "ring" or len(members) < 2:
            return None
        key = ("layer", comm.collective, len(members), members[0], members[-1], comm.n_bytes)
        got = self.layer_calls.get(key)
        if got is None:
            nodes = len({self.cluster.node_of(r) for r in members})
            link = self.cluster.group_link(len(members), members[1] - members[0])
            got = layer_call(self.cluster, comm.collective, len(members), nodes, comm.n_bytes, link.bandwidth_Bps)
            self.layer_calls[key] = got
        return got

    def _load_of(self, dev: _Device, comm: Comm, members: tuple[int, ...]) -> Load:
        """What a collective beside compute takes from each member's compute (``plansim.costs.interference``): a
        send's or a pair's from the link between the two; a group's from its size and stride on the mesh, at the
        call's own pace where NCCL runs it (``plansim.step.prepare.beside``: its bytes at the group's link rate plus
        what NCCL adds, ``_nccl_extra``, as the analytic engine prices it)."""
        if isinstance(comm.peers, Shift | GroupEnds):
            return send_load(self.cluster, members[0], members[-1], comm.collective)
        group = beside(self.cluster, self.mesh, self.interference, comm.axis, comm.collective, comm.algorithm,
                       comm.engine)  # fmt: skip
        if not group.nccl_paced:
            return group.load
        call = self._layer_call(comm, members)
        if call is not None:
            sent = call.sent_factor * comm.n_bytes
        else:
            sent = bytes_sent_per_rank(comm.collective, comm.algorithm, len(members), comm.n_bytes)
        return group.load_at(sent / group.link_Bps + self._nccl_extra(comm, members), sent)

    def _change(self, dev: _Device, load: Load, sign: int) -> None:
        """Add (``sign`` +1) or remove (-1) a collective's ``load`` beside ``dev``'s compute and set its rate; a
        running compute task is rearmed at the end of the instant's callbacks if its rate changed (``_settle``)."""
        dev.active += sign
        if dev.active:
            dev.channels += sign * load.channels
            dev.hbm_Bps += sign * load.hbm_Bps
        else:  # back to idle exactly (no float residue)
            dev.channels, dev.hbm_Bps = 0, 0.0
        rate = self.interference.rate(Load(dev.channels, dev.hbm_Bps))
        if rate != dev.rate:
            dev.rate = rate
            if dev.task >= 0:
                self._touch(dev)

    def _collective(
        self,
        comm: Comm,
        phases: list[_Phase],
        extra_s: float,
        done: Callable[[simpy.Event], None],
        k: int = 0,
        _event: simpy.Event | None = None,
    ) -> None:
        """Run the collective's phases from ``k`` on, one after another (each starts when the previous one's
        transfer ends, by a callback: no SimPy process per collective), and call ``done`` with the last one's event
        when it ends; ``extra_s`` is added to the last phase's latency."""
        last = len(phases) - 1
        if last < 0:  # nothing to move
            _Timer(self.env, 0.0, done)
            return
        ph = phases[k]
        latency = ph.latency_s + (extra_s if k == last else 0.0)
        event = self.net.send(ph.route, ph.bytes_factor * comm.n_bytes, latency, comm.kind)
        if k == last:
            event.callbacks.append(done)
        else:
            event.callbacks.append(partial(self._collective, comm, phases, extra_s, done, k + 1))

    def phases(self, comm: Comm, members: tuple[int, ...]) -> list[_Phase]:
        """The collective as phases of bundled transfers (cached per group and algorithm). A layer's all-reduce that
        NCCL runs as NVLS is one phase: each member sends ``(p + 1) / p`` of the message up to the switch and
        receives as much (``plansim.costs.nccl.nvls_sent_factor``), as a flow to its ring neighbour through it."""
        call = self._layer_call(comm, members)
        nvls = call is not None and call.algorithm == "nvls"
        key = (comm.collective, "nvls" if nvls else comm.algorithm, comm.local, members, comm.axis, type(comm.peers))
        cached = self.phase_cache.get(key)
        if cached is None:
            shared = _SHARED_PHASES.get((self.context, key))
            if shared is not None:  # built by an earlier run of this process: only the routes are this network's
                cached = [
                    _Phase(w, factor, latency, injected, self.net.route(w)) for w, factor, latency, injected in shared
                ]
            elif nvls:
                assert call is not None
                cached = [self._nvls_phase(comm, members, call.sent_factor)]
            else:
                cached = self._build_phases(comm, members)
            if shared is None:
                if len(_SHARED_PHASES) >= _SHARED_PHASES_MAX:
                    _SHARED_PHASES.clear()
                _SHARED_PHASES[self.context, key] = [
                    (ph.weights, ph.bytes_factor, ph.latency_s, ph.injected) for ph in cached
                ]
            self.phase_cache[key] = cached
        return cached

    def _nvls_phase(self, comm: Comm, members: tuple[int, ...], factor: float) -> _Phase:
        p = len(members)
        offsets = self.images(comm.axis)
        weights: dict[LinkId, float] = defaultdict(float)
        own: set[LinkId] = set()
        injected = 0.0
        for i, src in enumerate(members):
            dst = members[(i + 1) % p]
            if src in self.devices:
                own.update(self.fabric.route(src, dst))
            for off in offsets:
                route = self.fabric.route(src + off, dst + off)
                if route:
                    injected += 1.0
                for link in route:
                    weights[link] += 1.0
        kept = self._own_links(dict(weights), own)
        return _Phase(kept, factor, 0.0, injected, self.net.route(kept))

    def _channels(self, comm: Comm, members: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Member orders of the rings a collective runs concurrently: one per member on a node, rotated so ring
        ``c`` enters every node at its ``c``-th member and leaves from the one before (NCCL's channels, one per NIC;
        ``Fabric.ring_route`` keeps the hop between nodes on the rail of the entry GPU's NIC); a single order for
        other algorithms."""
        if not algorithm_entry(comm.collective, comm.algorithm).rings_per_local_rank:
            return [members]
        nodes: dict[int, list[int]] = defaultdict(list)
        for r in members:
            nodes[self.cluster.node_of(r)].append(r)
        blocks = list(nodes.values())
        k = len(blocks[0])
        if len(blocks) == 1 or k == 1 or any(len(b) != k for b in blocks):
            return [members]
        return [tuple(r for b in blocks for r in b[c:] + b[:c]) for c in range(k)]

    def _own_links(self, weights: dict[LinkId, float], own: set[LinkId]) -> dict[LinkId, float]:
        """Symmetric mode: keep only the links the simulated ranks' own flows cross (with every copy's load on
        them). The other members' and copies' links are, by symmetry, loaded the same way, so they add nothing but
        cost; unless they are the tighter ones (an uneven ring), then all links are kept."""
        if self.mode == "full" or len(own) == len(weights):
            return weights
        kept = {link: w for link, w in weights.items() if link in own}
        capacity = self.fabric.capacity_Bps
        full = _bottleneck(weights, capacity)
        if not kept or not math.isclose(_bottleneck(kept, capacity), full, rel_tol=1e-9):
            return weights
        return kept

    def _build_phases(self, comm: Comm, members: tuple[int, ...]) -> list[_Phase]:
        p = len(members)
        sched = schedule(comm.collective, comm.algorithm, p, comm.local)
        nccl = (
            algorithm_entry(comm.collective, comm.algorithm).nccl is not None
            and not isinstance(comm.peers, Shift)
            and timed(self.cluster)
        )
        channels = self._channels(comm, members)
        gpus = sched.gpus.tolist()
        # NCCL's channels keep each inter-node hop on one rail (Fabric.ring_route); other schedules take the plain route
        route = self.fabric.ring_route if len(channels) > 1 else self.fabric.route
        offsets = self.images(comm.axis)
        phases: list[_Phase] = []
        steps = list(sched.steps)
        i = 0
        while i < len(steps):
            step = steps[i]
            sizes = step.hi - step.lo
            j = i + 1
            while (
                j < len(steps)
                and np.array_equal(steps[j].src, step.src)
                and np.array_equal(steps[j].dst, step.dst)
                and np.array_equal(steps[j].hi - steps[j].lo, sizes)
            ):
                j += 1
            count = j - i
            biggest = float(sizes.max()) if len(sizes) else 0.0
            weights: dict[LinkId, float] = defaultdict(float)
            own: set[LinkId] = set()  # links of the flows simulated ranks send themselves
            latency = 0.0
            injected = 0.0
            for order in channels:
                for src_i, dst_i, size in zip(step.src, step.dst, sizes, strict=True):
                    src, dst = order[gpus[src_i]], order[gpus[dst_i]]  # a helper on its GPU (Schedule.gpus)
                    if src == dst or size <= 0:
                        continue
                    w = float(size) / biggest
                    if not nccl:
                        latency = max(latency, self.fabric.latency_s(src, dst))
                    if src in self.devices:
                        own.update(route(src, dst))
                    for off in offsets:
                        links = route(src + off, dst + off)
                        if links:
                            injected += w
                        for link in links:
                            weights[link] += w
            kept = self._own_links(dict(weights), own)
            phases.append(
                _Phase(kept, count * biggest / len(channels), count * latency, injected, self.net.route(kept))
            )
            i = j
        return phases


#: Collectives' phases without their routes (link weights, bytes factor, latency, injected flows), shared by the runs
#: of one process on one context (``_Engine.context``): a plan's finalists simulate the same groups on the same
#: cluster, and building a group's phases walks every transfer of its schedule. Read-only once stored; cleared when
#: ``_SHARED_PHASES_MAX`` entries are held (a large ring's weights name thousands of links).
_SHARED_PHASES: dict[tuple[Any, ...], list[tuple[dict[LinkId, float], float, float, float]]] = {}
_SHARED_PHASES_MAX = 1024


def _bottleneck(weights: Mapping[LinkId, float], capacity: Mapping[LinkId, float]) -> float:
    return min((capacity[link] / w for link, w in weights.items()), default=math.inf)


def _link_name(link: LinkId) -> str:
    return f"{link[0]}->{link[1]}"


def _breakdown(engine: _Engine, dev: _Device, step: float) -> dict[str, float]:
    """The device's step time by part; they sum to ``step``.

    Idle time on the compute stream is first a collective's expected wait for its slowest member (``Task.wait_s``),
    then split by what it waited for (the dependency that was satisfied last): while the stream that task runs on
    was moving data (a pipeline send and the sends queued before it, the dp stream's gradient buckets and gathers, a
    tensor-parallel collective beside a kernel), it is exposed communication; the rest is pipeline bubble: waiting
    for another stage's compute, or for a peer to reach a collective (the tied-embedding all-reduce's wait for stage
    0 to drain). So the bubble is the pipeline schedule's idle time and nothing of the data-parallel traffic, as in
    the analytic engine. What collectives beside compute added to its tasks is ``interference``."""
    tasks = dev.program.tasks
    out = dict.fromkeys(TIME_PARTS, 0.0)
    if any(t.category in OFFLOAD_PARTS for t in tasks):  # offloading's parts, only where the strategy offloads
        out |= dict.fromkeys(OFFLOAD_PARTS, 0.0)
    busy: dict[tuple[int, str], tuple[list[float], list[float]]] = {}
    # the parts a compute task adds to, summed in locals (the same additions in the same order as into ``out``)
    compute = recompute = host_wait = exposed = interference = 0.0
    starts, ends, extra, factor, sync_waits = dev.start, dev.end, dev.extra, dev.factor, engine.sync_waits
    prev_end = 0.0
    for i, task in enumerate(tasks):
        if task.stream != "compute":
            continue
        start, end = starts[i], ends[i]
        gap = start - prev_end
        if gap > 0 and task.wait_s > 0 and sync_waits:
            slowest = min(gap, task.wait_s)
            out["sync_wait"] += slowest
            gap -= slowest
        if gap > 0:
            comm_part = 0.0
            deps = [(engine.devices[st * engine.width + dev.offset], j) for st, j in task.deps]
            if deps:
                owner, j = max(deps, key=lambda d: d[0].end[d[1]])
                waited = owner.program.tasks[j]
                if waited.stream != "compute":
                    comm_part = min(gap, _busy_within(busy, owner, waited.stream, prev_end, start))
            exposed += comm_part
            out["bubble"] += gap - comm_part
        elapsed = end - start
        lost = extra.get(i)
        if lost:
            interference += lost
            elapsed -= lost
        category = task.category
        if category in _COMPUTE:
            # the GPU's wait for the host's launches: what the task took beyond its kernels (on this GPU's pace)
            host = min(task.host_s, max(0.0, elapsed - (task.duration_s - task.host_s) * factor))
            host_wait += host
            compute += elapsed - host
        elif category == "recompute":
            recompute += elapsed
        elif category == "optimizer":
            out["optimizer"] += elapsed
        elif category == "sync_wait":
            out["sync_wait"] += elapsed
        elif category in OFFLOAD_PARTS:
            out[category] += elapsed
        else:
            exposed += elapsed
        prev_end = end
    out["compute"] += compute
    out["recompute"] += recompute
    out["host_wait"] += host_wait
    out["exposed_comm"] += exposed
    out["interference"] += interference
    tail = step - prev_end
    last_comm = max((dev.end[i] for i, t in enumerate(tasks) if t.stream != "compute"), default=0.0)
    tail_comm = max(0.0, min(tail, last_comm - prev_end))
    out["exposed_comm"] += tail_comm
    out["bubble"] += tail - tail_comm
    # float residue of the subtractions above (1e-18 s) is no part of the step
    return {k: v if abs(v) > 1e-12 * step else 0.0 for k, v in out.items()}


def _busy_within(
    cache: dict[tuple[int, str], tuple[list[float], list[float]]], dev: _Device, stream: str, lo: float, hi: float
) -> float:
    """Seconds within ``[lo, hi]`` during which ``dev``'s ``stream`` ran communication (its tasks run one at a time,
    so their start and end times are both sorted; a collective's start is when its members had all arrived)."""
    key = (dev.rank, stream)
    spans = cache.get(key)
    if spans is None:
        pairs = [(dev.start[i], dev.end[i]) for i, t in enumerate(dev.program.tasks) if t.stream == stream and t.comm]
        spans = cache[key] = ([a for a, _ in pairs], [b for _, b in pairs])
    starts, ends = spans
    total = 0.0
    k = bisect.bisect_right(ends, lo)
    while k < len(starts) and starts[k] < hi:
        total += max(0.0, min(ends[k], hi) - max(starts[k], lo))
        k += 1
    return total


@lru_cache(maxsize=4096)
def _sent(collective: str, algorithm: str, p: int, n_bytes: float, local: int | None) -> float:
    return bytes_sent_per_rank(collective, algorithm, p, n_bytes, local=local)


def _comm_bytes(engine: _Engine, dev: _Device) -> dict[str, float]:
    """Bytes this GPU sends per step, by kind (the same per-rank volumes the analytic engine reports): each of its
    program's collectives priced once for this rank, then summed in task order."""
    comms = engine.comm_tasks(dev.program)
    unique = {id(c): c for c in comms}  # the lowering shares one Comm object among a layer's micro-batches
    sent = {k: _sent_by(engine, dev, c) for k, c in unique.items()}
    key = (dev.program.stage, tuple(sent.values()))  # ranks whose groups send alike share the sum
    out = engine.comm_sums.get(key)
    if out is None:
        out = engine.comm_sums[key] = dict.fromkeys(COMM_KINDS, 0.0)
        for c in comms:
            out[c.kind] += sent[id(c)]
    return out


def _sent_by(engine: _Engine, dev: _Device, c: Comm) -> float:
    """Bytes one call of ``c`` sends from the rank ``dev`` stands for."""
    if isinstance(c.peers, Shift):  # a send: its bytes, once
        return c.n_bytes
    members = engine.members(dev, c)
    p = len(members)
    call = engine._layer_call(c, members)
    if call is not None and call.algorithm == "nvls":
        return call.sent_factor * c.n_bytes
    if p > 1:
        return _sent(c.collective, c.algorithm, p, c.n_bytes, c.local)
    return 0.0


def simulate_des(
    model: ModelSpec,
    cluster: Cluster,
    strategy: Strategy,
    *,
    mode: str = "symmetric",
    what_if: WhatIf | None = None,
    presized: bool = False,
) -> Result:
    """Simulate one training step event by event; the Result's ``timeline`` holds spans, memory and link traffic.
    ``presized``: the caller has bounded the run's work already (the planner's finalists, by ``des.size.des_ceiling``),
    so it is lowered at once, not first at fewer micro-batches (``des.size.sized_lowering``); its own work is still
    checked once built."""
    if mode not in MODES:
        raise PlansimError(f"mode '{mode}' is unknown: choose one of {', '.join(MODES)}")
    what_if = what_if or WhatIf()
    what_if.check(cluster)
    with gc_paused():
        wall = time.perf_counter()
        s = strategy.resolved(cluster)
        # refused here when above the work bound
        graph = checked_lowering(model, cluster, s, mode) if presized else sized_lowering(model, cluster, s, mode)
        if what_if.moe_imbalance_spread:
            graph = _sampled_imbalance(model, cluster, s, mode, graph, what_if)
        engine = _Engine(graph, cluster, mode, what_if)
        engine.run()
        wall = time.perf_counter() - wall
        return _result(model, cluster, s, graph, engine, wall)


#: The random stream of the sampled imbalance, apart from the jitter's (``WhatIf.seed`` seeds both).
_IMBALANCE_STREAM = 36


def _sampled_imbalance(
    model: ModelSpec, cluster: Cluster, s: Strategy, mode: str, at_mean: TaskGraph, what_if: WhatIf
) -> TaskGraph:
    """``at_mean`` (the step lowered at the model's ``moe_imbalance`` ``m``) with each micro-batch's imbalance on
    each pipeline stage drawn: ``x = 1 + (m - 1) L``, ``L`` log-normal with mean 1 and ``moe_imbalance_spread`` the
    standard deviation of its log. A micro-batch's forward and backward share its draw (the same tokens take the
    same routes both ways); stages draw apart (their layers route apart). Every task the imbalance changes (the
    busiest rank's expert GEMMs, its all-to-all bytes, the activations they keep) is set between its balanced value
    (the step lowered at 1) and its value at ``m``: ``v(x) = v(1) + (x - 1) / (m - 1) (v(m) - v(1))``, so each
    task's expected value is its value at ``m`` and, where the step adds its tasks up, the expected step is the
    fixed pricing's at ``m`` (``tests/test_moe_imbalance.py``); a pipeline's waits make the slowest micro-batches
    cost more than the mean.

    Why log-normal on the excess: the imbalance stays at least 1 (the busiest rank receives at least the mean) and
    its variation is multiplicative and skewed to the right. ASSUMPTION, not a fit: no published per-micro-batch
    distribution of the busiest rank's load was found; the spread is the user's. An ideal random router's imbalance
    (the max over ep ranks of a multinomial of ``T k`` rows) is within a few percent of 1 at training's token
    counts, so it cannot stand for a learned router's skew, which is what costs.
    """
    from plansim.workload import with_moe_imbalance

    mean = model.moe_imbalance
    if mean == 1.0:
        raise PlansimError(
            f"moe_imbalance_spread {what_if.moe_imbalance_spread:g} varies the routing imbalance around its mean, but "
            f"'{model.name}' is balanced (moe_imbalance 1.0, or a model without routed experts): give "
            "--moe-imbalance above 1, or leave --moe-imbalance-spread out"
        )
    base = sized_lowering(with_moe_imbalance(model, 1.0), cluster, s, mode)
    rng = np.random.default_rng([what_if.seed, _IMBALANCE_STREAM])
    sigma = what_if.moe_imbalance_spread
    weights: dict[tuple[int, int], float] = {}  # (stage, micro-batch) -> (x - 1) / (m - 1)

    def weight(stage: int, microbatch: int) -> float:
        w = weights.get((stage, microbatch))
        if w is None:
            w = weights[(stage, microbatch)] = math.exp(sigma * float(rng.standard_normal()) - sigma * sigma / 2)
        return w

    def between(low: float, high: float, w: float) -> float:
        return low + w * (high - low)

    stages = []
    for low_prog, high_prog in zip(base.stages, at_mean.stages, strict=True):
        if len(low_prog.tasks) != len(high_prog.tasks):
            raise AssertionError("the lowerings at two imbalances differ in their tasks")
        prog = StageProgram(high_prog.stage, [], high_prog.static_memory, high_prog.params, high_prog.host_memory)
        for lo, hi in zip(low_prog.tasks, high_prog.tasks, strict=True):
            if lo == hi:
                prog.tasks.append(hi)
                continue
            w = weight(prog.stage, hi.microbatch)
            comm = hi.comm
            if comm is not None and lo.comm is not None and comm.n_bytes != lo.comm.n_bytes:
                comm = replace(comm, n_bytes=between(lo.comm.n_bytes, comm.n_bytes, w))
            held = {name: n_bytes for name, n_bytes, _ in lo.alloc}  # a block rounded to nothing is not allocated
            alloc = tuple((name, between(held.get(name, 0.0), b, w), cat) for name, b, cat in hi.alloc)
            prog.tasks.append(
                replace(
                    hi,
                    duration_s=between(lo.duration_s, hi.duration_s, w),
                    host_s=between(lo.host_s, hi.host_s, w),
                    comm=comm,
                    alloc=alloc,
                )
            )
        stages.append(prog)
    return TaskGraph(stages, at_mean.mesh, at_mean.num_microbatches, at_mean.model_flops, at_mean.hardware_flops)


def _result(
    model: ModelSpec, cluster: Cluster, s: Strategy, graph: TaskGraph, engine: _Engine, wall_s: float
) -> Result:
    devices = list(engine.devices.values())
    step = max(max(d.end, default=0.0) for d in devices)
    per_stage: dict[int, list[_Device]] = defaultdict(list)
    for d in devices:
        per_stage[d.stage].append(d)
    # per stage, the rank that worked longest (a straggler in full mode), else its first rank
    stage_breakdowns = [
        _breakdown(engine, max(per_stage[st], key=lambda d: d.factor), step) for st in sorted(per_stage)
    ]
    busiest = max(
        range(len(stage_breakdowns)), key=lambda i: sum(stage_breakdowns[i][k] for k in ("compute", "recompute"))
    )
    breakdown = stage_breakdowns[busiest]
    busiest_dev = max(per_stage[sorted(per_stage)[busiest]], key=lambda d: d.factor)
    worst = max(devices, key=lambda d: d.mem.peak_bytes)
    stage_peaks = [int(max(d.mem.peak_bytes for d in per_stage[st])) for st in sorted(per_stage)]
    ooms = sorted((d.mem.oom for d in devices if d.mem.oom is not None), key=lambda o: o.time_s)
    fits = not ooms and worst.mem.peak_bytes <= cluster.gpu.memory_bytes
    reason = (
        "" if fits else (ooms[0].message() if ooms else f"{worst.label} peaks at {worst.mem.peak_bytes / GB:.1f} GB")
    )
    hosts = [p.host_memory for p in graph.stages if p.host_memory]
    host = host_tier(cluster, max(hosts, key=lambda h: sum(h.values()))) if hosts else {}
    if fits and host and not host["fits"]:
        fits, reason = False, host_no_fit_reason(cluster, host)
    comm = [_comm_bytes(engine, d) for d in devices]
    horizon = step or 1.0
    link_bytes = {_link_name(k): v for k, v in engine.net.link_bytes.items() if v > 0}
    util = {
        _link_name(k): v / (engine.fabric.capacity_Bps[k] * horizon)
        for k, v in engine.net.link_bytes.items()
        if v > 0 and math.isfinite(engine.fabric.capacity_Bps[k])
    }
    top = sorted(util, key=util.__getitem__, reverse=True)[:_TOP_LINKS]
    timeline = Timeline(
        spans=_Spans(devices),
        memory=_Memory(devices),
        link_bytes=link_bytes,
        link_utilization=util,
        step_time_s=step,
    )
    events = getattr(engine.env, "_eid", None)
    return step_result(
        model,
        cluster,
        s,
        engine="des",
        step_s=step,
        flops=(graph.model_flops, graph.hardware_flops),
        memory=worst.mem.peak_by_category,
        comm={k: max(c[k] for c in comm) for k in COMM_KINDS},
        cost_model=kernel_model(cluster, s).provenance,
        fits=fits,
        peak_memory_bytes=int(worst.mem.peak_bytes),
        time_breakdown_s=breakdown,
        reason=reason,
        num_microbatches=graph.num_microbatches,
        stage_peak_memory_bytes=stage_peaks,
        stage_time_breakdown_s=stage_breakdowns,
        busiest_links=[{"link": k, "bytes": link_bytes[k], "utilization": util[k]} for k in top],
        overlap=overlap_figures(busiest_dev.overlapped, breakdown["interference"], engine.interference.source),
        engine_stats={
            "mode": engine.mode,
            "simulated_gpus": len(devices),
            "tasks": sum(len(d.program.tasks) for d in devices),
            "transfers": engine.net.transfers_started,
            "events": int(next(events)) if events is not None else -1,
            "rerouted_pairs": len(engine.fabric.detours),
        },
        timeline=timeline,
        timings={"wall_s": wall_s},
        host_memory=host,
    )


class _Memory:
    """The timeline's memory over time per device, made when first read (``Timeline.memory``) from the devices'
    memory trackers."""

    def __init__(self, devices: Iterable[_Device]) -> None:
        self.trackers = [(d.label, d.mem) for d in devices]

    def __call__(self) -> dict[str, list[tuple[float, float]]]:
        return {label: mem.timeline for label, mem in self.trackers}


class _Spans:
    """The timeline's spans, made when first read (``Timeline.spans``): every compute-stream task's and every
    collective's, from the devices' programs and task times (kept, not the engine)."""

    def __init__(self, devices: Iterable[_Device]) -> None:
        self.devices = [(d.label, d.program.tasks, d.start, d.end) for d in devices]

    def __call__(self) -> list[Span]:
        out = []
        for label, tasks, start, end in self.devices:
            for i, task in enumerate(tasks):
                if task.stream == "compute" or task.comm is not None:
                    out.append(Span(label, task.stream, task.name, start[i], end[i], task.category))
        return out


@dataclass(frozen=True)
class CollectiveRun:
    """One collective simulated alone: its time, the bytes its members inject, and the bytes each link carried."""

    seconds: float
    injected_bytes: float
    link_bytes: dict[str, float]


def simulate_collective(
    cluster: Cluster,
    collective: str,
    algorithm: str,
    ranks: Iterable[int],
    n_bytes: float,
    *,
    local: int | None = None,
    what_if: WhatIf | None = None,
) -> CollectiveRun:
    """Simulate one collective among global ``ranks`` of ``cluster`` on an otherwise idle network.

    >>> from plansim.hardware import load_hardware
    >>> run = simulate_collective(load_hardware("dgx-a100", gpus=8), "all_reduce", "ring", range(8), 1e9)
    >>> round(run.seconds * 1e3, 2)   # 2 (p-1)/p n / busbw + what NCCL adds (ring_overhead_s)
    7.88
    """
    members = tuple(ranks)
    what_if = what_if or WhatIf()
    graph = TaskGraph(
        stages=[],
        mesh=DeviceMesh(tuple((axis, 1) for axis in AXIS_ORDER)),  # one rank: the ranks are given
        num_microbatches=1,
        model_flops=0.0,
        hardware_flops=0.0,
    )
    engine = _Engine(graph, cluster, "full", what_if)
    comm = Comm(collective, algorithm, "dp", n_bytes, "dp", peers=Standalone(), local=local)
    phases = engine._build_phases(comm, members)
    extra = engine._nccl_extra(comm, members)
    done = engine.env.event()

    def run() -> Generator[Any, Any, None]:
        for k, ph in enumerate(phases):
            latency = ph.latency_s + (extra if k == len(phases) - 1 else 0.0)
            yield engine.net.transfer(ph.weights, ph.bytes_factor * n_bytes, latency, comm.kind)
        done.succeed()

    engine.env.process(run())
    engine.env.run()
    injected = sum(ph.injected * ph.bytes_factor * n_bytes for ph in phases)
    link_bytes = {_link_name(k): v for k, v in engine.net.link_bytes.items() if v > 0}
    return CollectiveRun(engine.env.now, injected, link_bytes)
