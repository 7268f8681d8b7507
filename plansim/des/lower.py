"""Lowering: (model, cluster, strategy) -> TaskGraph, the per-stage programs the discrete-event engine runs.

Per pipeline stage, following the schedule's order of forward (F), backward (B) and weight-gradient (W) passes
(``pipeline.schedules``): each layer's pass is split at its tensor-parallel collectives into compute and collective
tasks (all priced by ``plansim.costs``, the analytic engine's cost model); recompute tasks precede a layer's backward
under remat; pipeline sends follow a chunk's pass on the p2p stream and the next stage's pass waits for them;
gradient reductions are bucketed in the order backward produces the gradients and run on the dp stream (overlapping
backward) or, with ``overlap_grad_reduce: false``, as one collective after backward; ZeRO-3 gathers each layer's
weights before its forward and backward, the layers its framework prefetches ahead with it; the optimizer step
follows, then ZeRO-1/2's all-gather of the updated weights.

Memory: model states, the workspace reserve, the CUDA context and NCCL's buffers are static; each activation has the
caching allocator's rounding beside it (sizes from ``plansim.step.memory.layer_memory``, which the analytic engine
walks too); each layer's saved activations are allocated at its forward and freed after its backward (or its weight-
gradient pass when backward is split), what remat drops is a transient of the forward and is rebuilt by the
recompute task (``remat: milp``: per block, what its stage's MILP schedule keeps from forward to backward and
recomputes in the stages of the block's gradient nodes; recomputed tensor-parallel collectives run at their priced
time inside that task); a fused attention kernel's backward workspace lives for its layer's backward; ZeRO-3's
gathered weights live from their gather to the end of the pass that uses them; where the framework copies a unit's
gradients into a flat reduce input (FSDP2: ``step.data_parallel.grad_copy_in_bytes``), the unsharded gradients live
from the start of the pass that makes them to a zero-time copy task after it, which allocates the reduce input, held
until the end of the next such pass of the chunk (the chunk's last: to its own copy's end).

Sources: Megatron-LM's schedules and its gradient buffer (Narayanan et al. 2021; Korthikanti et al. 2022 for
sequence parallelism and selective recompute); PyTorch DDP's gradient buckets (Li et al. 2020, VLDB, sec 3.2.3);
ZeRO (Rajbhandari et al. 2020, sec 5 and 7) and PyTorch FSDP's backward prefetch (Zhao et al. 2023, sec 3.3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from plansim.costs.allocator import reserved_bytes
from plansim.costs.kernels import KernelCostModel
from plansim.costs.remat_policies import REMAT_POLICIES, Recompute
from plansim.costs.stragglers import straggler_wait_s
from plansim.des.taskgraph import NO_KERNEL, StageProgram, Task, TaskGraph
from plansim.hardware import Cluster
from plansim.pipeline.schedules import get_schedule
from plansim.pipeline.stages import chunk_layers
from plansim.remat.plan import LayerRemat, milp_stage_plans
from plansim.step.comm import Comm, GroupEnds, Shift
from plansim.step.data_parallel import (
    CHAINED,
    START,
    DataParallelPlan,
    GroupCollective,
    WeightGather,
    data_parallel_plan,
    grad_copy_in_bytes,
    tied_gradient_bytes,
    weight_gathers,
)
from plansim.step.layers import LayerProgram, Segment, layer_programs
from plansim.step.memory import (
    LayerBytes,
    LayerMemory,
    Sized,
    chunk_memory,
    fixed_bytes,
    host_states,
    model_states,
    offload_activations,
    offloaded_activations,
    stage_expert_params,
    stage_fp8,
    stage_params,
    with_grad_buffers,
)
from plansim.step.offload import offload_layer, offload_times
from plansim.step.optimizer import optimizer_step_s
from plansim.step.p2p import PipelineSends, amax_reduction_s, pipeline_sends, regather
from plansim.step.prepare import comm_pricer, p2p_message_bytes, prepare_step, tied_copy_params
from plansim.step.result import step_flops
from plansim.step.tp_overlap import tp_overlap
from plansim.strategy.mesh import DeviceMesh, mesh_of
from plansim.strategy.schema import Strategy
from plansim.workload.traced import Workload

__all__ = ["lower"]


def _act(name: str, size: Sized, category: str = "activations") -> list[tuple[str, float, str]]:
    """An activation allocation (or one of ``category``) and, beside it, what the caching allocator reserves beyond
    its bytes (category ``fragmentation``, named ``<name>#rounding``: the memory tracker frees it with ``name``)."""
    out = [(name, size.n, category)]
    if size.reserved > size.n:
        out.append((f"{name}#rounding", size.reserved - size.n, "fragmentation"))
    return out


@dataclass
class _Ctx:
    s: Strategy
    model: Workload
    cluster: Cluster
    programs: dict[int, LayerProgram]
    chunks: list[list[int]]
    layer_input: float
    p2p_bytes: float
    dp_plan: DataParallelPlan | None
    mesh: DeviceMesh
    # pipeline sends as the framework issues them (plansim/step/p2p.py): the all-gather after each receive under the
    # scatter/gather optimization, and whether a send blocks the stage's compute and its call's idle time after
    regather: Comm | None = None
    p2p: PipelineSends = field(default_factory=lambda: PipelineSends(blocking=False))
    # remat: milp, each block's share of its stage's schedule (plansim/remat/plan.py)
    milp: dict[int, LayerRemat] = field(default_factory=dict)
    # what each layer allocates (plansim.step.memory.chunk_memory), by model chunk: layer -> its LayerMemory
    memory: dict[int, dict[int, LayerMemory]] = field(default_factory=dict)
    # each layer's gradient buffers for its reduction (LayerBytes.grads, reduce_input), by model chunk
    grad_buffers: dict[int, dict[int, LayerBytes]] = field(default_factory=dict)
    # cross-stage dependencies by key, resolved once every stage is built
    sends: dict[tuple[str, int, int], tuple[int, int]] = field(default_factory=dict)
    waits: list[tuple[int, int, tuple[str, int, int]]] = field(default_factory=list)
    # with offloading: per stage, the saved bytes of one micro-batch its offloaded blocks keep in host memory
    host_activations: dict[int, float] = field(default_factory=dict)
    # FP8 delayed scaling's amax all-reduce after each chunk's pass: (chunk, forward) -> seconds (plansim/step/p2p.py)
    amax: dict[tuple[int, bool], float] = field(default_factory=dict)

    def is_block(self, layer: int) -> bool:
        return 0 <= layer < self.model.layers


class _StageLowering:
    """Builds one stage's program from the schedule's order."""

    def __init__(self, ctx: _Ctx, stage: int, kernels: KernelCostModel) -> None:
        self.ctx = ctx
        self.s = ctx.s
        self.stage = stage
        self.kernels = kernels
        self.prog = StageProgram(stage)
        self.plan = ctx.dp_plan
        self.zero3 = self.plan is not None and self.plan.per_layer
        # FSDP's SHARD_GRAD_OP keeps a layer's forward gather until its backward, which gathers nothing
        self.regather = self.plan is None or self.plan.regather_backward
        self.split = get_schedule(self.s.schedule).split_backward
        self.last_compute = -1
        #: asynchronous collectives in flight: (task, compute tasks to let by before one waits for it)
        self.joins: list[tuple[int, int]] = []
        self.last_dp = -1
        self.after_dp = -1  # a micro-batch's last gradient bucket, which the next compute task waits for
        self.bucket: list[float] = [0.0, 0.0]  # held per set of buckets (DataParallelPlan.groups: dense, experts)
        self.bucket_dep = [-1, -1]
        self.reduce_held: str | None = None  # the reduce input of the pass's last copy, freed by the next one
        self.gathers: dict[tuple[int, int, str], int] = {}
        self.ahead: dict[tuple[int, int], list[int]] = {}  # (first, last layer of a pass) -> layers ahead per position
        # Megatron-LM keeps a copy of tied word embeddings (ceil(V/tp) rows per rank) on the last stage; its
        # gradient is reduced with the output layer's and synchronized with stage 0's copy after backward.
        self.tied_params = tied_copy_params(ctx.model, self.s) if stage == self.s.pp - 1 else 0
        # The wait for the job's slowest GPU, first on the compute stream (its length is set once every stage is
        # built, ``_slowest_gpu``): what runs after it, the first ZeRO-3 gathers included, starts that much later.
        self.slowest = self._compute(Task("slowest_gpu", "compute", "sync_wait"))
        # The stage's model chunks (forward order), and per chunk the layer after whose backward its gradients are
        # complete (a bucket never spans two chunks: step.data_parallel.bucket_launches)
        self.chunk_layers = [[x for x in c if x in ctx.programs] for c in ctx.chunks[stage :: self.s.pp]]
        self.chunk_of = {x: c for c, layers in enumerate(self.chunk_layers) for x in layers}
        self.chunk_done: tuple[dict[int, int], dict[int, int]] = ({}, {})  # per set of buckets
        for expert in self.plan.groups() if self.plan is not None else ():
            for c, layers in enumerate(self.chunk_layers):
                with_params = [x for x in layers if self._grad_params(x, expert) > 0]
                if with_params and len(self.chunk_layers) > 1:
                    self.chunk_done[expert][with_params[0]] = c
        # An overlapped ZeRO-1/2 gather (Megatron-LM's --overlap-param-gather): the weights' buckets, gathered under
        # the step's first forward, each waited for by its first layer (step.data_parallel.weight_gathers)
        self.weights: list[WeightGather] = []
        self.weights_first: dict[int, int] = {}  # the layer that waits for a bucket -> the bucket's index
        self.weights_tasks: list[int] = []
        if self.plan is not None and self.plan.gather_after_step and self.plan.gather_overlapped:
            chunk_params = [[float(self._layer_params(x)) for x in layers] for layers in self.chunk_layers]
            held = sum(sum(p) for p in chunk_params)
            extra = stage_params([x for c in self.chunk_layers for x in c], ctx.programs, self.s, ctx.model, stage)
            if chunk_params and chunk_params[-1] and extra - held > 0:
                chunk_params[-1][-1] += extra - held  # what the layers do not hold, with the stage's last layer
            self.weights = weight_gathers(self.plan, stage == 0, chunk_params)
            self.weights_tasks = [-1] * len(self.weights)
            for k, w in enumerate(self.weights):
                self.weights_first[self.chunk_layers[w.chunk][w.first]] = k
                if w.issue == START:  # issued in the step's first zero_grad, before any forward
                    self._weights_gather(k, ((stage, self.slowest),))

    # -- helpers -----------------------------------------------------------------------------------------------
    def _compute(self, task: Task) -> int:
        if self.joins:  # an asynchronous collective: the second compute task after it waits for it
            for collective, skip in self.joins:
                if not skip:
                    task.deps = (*task.deps, (self.stage, collective))
            self.joins = [(collective, skip - 1) for collective, skip in self.joins if skip]
        if self.after_dp >= 0:
            task.deps = (*task.deps, (self.stage, self.after_dp))
            self.after_dp = -1
        tasks = self.prog.tasks  # StageProgram.add, inlined: a step lowers hundreds of thousands of tasks
        tasks.append(task)
        self.last_compute = idx = len(tasks) - 1
        return idx

    def _dp(self, task: Task) -> int:
        idx = self.prog.add(task)
        self.last_dp = idx
        return idx

    def _layer_params(self, layer: int) -> float:
        """A layer's parameters on this stage (the output layer's with the tied embeddings' copy)."""
        lp = self.ctx.programs[layer]
        return lp.params + (self.tied_params if layer == self.ctx.model.layers else 0)

    def _grad_params(self, layer: int, expert: bool) -> float:
        """A layer's parameters on this stage whose gradients fill the ``expert`` set of buckets
        (``DataParallelPlan.grad_share``)."""
        assert self.plan is not None
        return self.plan.grad_share(self._layer_params(layer), self.ctx.programs[layer].expert_params, expert)

    def _weights_gather(self, k: int, deps: tuple[tuple[int, int], ...]) -> None:
        """Issue the overlapped gather of weight bucket ``k`` on the dp stream."""
        assert self.plan is not None
        comm = _dp_comm(self.plan.gather, self.weights[k].n_bytes, "zero")
        task = Task(f"weights_gather.{k}", "dp", "param_gather", comm=comm, deps=deps)
        self.weights_tasks[k] = self._dp(task)

    def _weights_before(self, layer: int) -> tuple[tuple[int, int], ...]:
        """Before the first micro-batch's forward of ``layer``: the gathers its chunk's first forward issues, and,
        where a bucket starts at it, the wait for that bucket (issuing it first if its turn had not come) and the
        next bucket's gather issued when it is chained to this one (a prefetch of one)."""
        after = ((self.stage, self.last_compute),) if self.last_compute >= 0 else ()
        chunk = self.chunk_of.get(layer)
        if chunk is not None and self.chunk_layers[chunk][0] == layer:
            for j, w in enumerate(self.weights):
                if w.issue == chunk and self.weights_tasks[j] < 0:
                    self._weights_gather(j, after)
        k = self.weights_first.get(layer)
        if k is None:
            return ()
        if self.weights_tasks[k] < 0:
            self._weights_gather(k, after)
        deps = ((self.stage, self.weights_tasks[k]),)
        if k + 1 < len(self.weights) and self.weights[k + 1].issue == CHAINED and self.weights_tasks[k + 1] < 0:
            self._weights_gather(k + 1, (*deps, *after))
        return deps

    def _run(
        self,
        segments: Sequence[Segment],
        name: str,
        category: str,
        mb: int,
        *,
        first_deps: tuple[tuple[int, int], ...] = (),
        alloc: tuple[tuple[str, float, str], ...] = (),
        free: tuple[str, ...] = (),
        wait_key: tuple[str, int, int] | None = None,
    ) -> tuple[int, int]:
        """Emit ``segments`` as compute-stream tasks; returns (first, last) task index (-1, -1 when empty).
        ``alloc`` goes on the first task, ``free`` on the last; ``wait_key`` is a pipeline receive."""
        first = last = -1
        n = len(segments)
        if n == 0 and (alloc or free or first_deps or wait_key):
            segments = [Segment()]
            n = 1
        compute = self._compute
        for i, seg in enumerate(segments):
            head = first < 0  # the pass's first compute task takes its dependencies, allocations and receive
            comm = seg.comm
            if comm is not None and seg.hidden_s > 0:
                # launched asynchronously once the compute before it is done, on a stream of its own (Megatron's
                # async_op collectives); the compute task after the one beside it waits for it (``_compute``)
                before = ((self.stage, self.last_compute),) if self.last_compute >= 0 else ()
                side = Task(f"{name}.{i}", "tp", "tp_comm", comm=comm, deps=before, microbatch=mb)
                if head:
                    side.deps = (*first_deps, *before)
                self.joins.append((self.prog.add(side), 1))
                continue
            # positional, in Task's field order: name, stream, category, duration_s, comm, deps, alloc, free,
            # microbatch, wait_s, host_s
            idx = compute(
                Task(
                    f"{name}.{i}" if n > 1 else name,
                    "compute",
                    category if comm is None else "tp_comm",
                    seg.seconds,
                    comm,
                    first_deps if head else (),
                    alloc if head else (),
                    free if i == n - 1 else (),
                    mb,
                    seg.wait_s,
                    seg.host_wait_s,
                )
            )
            if head:
                first = idx
                if wait_key is not None:
                    self.ctx.waits.append((self.stage, idx, wait_key))
            last = idx
        return first, last

    def _rebuilds(self, g: int, layer: int) -> bool:
        """Whether remat rebuilds anything of this block of chunk ``g`` (allocating ``r/`` and ``rk/`` for its
        backward): what its ``LayerMemory`` says (``step.memory.chunk_memory``: the policy, whether it checkpoints
        this block, a ``milp`` schedule's recompute)."""
        return self.ctx.is_block(layer) and self.ctx.memory[g][layer].rebuilds

    # -- passes ------------------------------------------------------------------------------------------------
    def _regather(self, key: tuple[str, int, int]) -> tuple[str, int, int] | None:
        """The receive ``key`` and, under the scatter/gather optimization, the all-gather that rebuilds it (the
        receive's wait goes on the gather, which the pass then follows); returns the wait left for the pass."""
        if self.ctx.regather is None:
            return key
        direction, mb, g = key
        self._run([Segment(comm=self.ctx.regather)], f"gather{direction}{mb}.c{g}", "tp_comm", mb, wait_key=key)
        return None

    def forward(self, mb: int, g: int) -> None:
        ctx = self.ctx
        layers = ctx.chunks[g]
        received = self._regather(("F", mb, g - 1)) if g > 0 else None
        memory = ctx.memory[g]
        for pos, layer in enumerate(layers):
            lp = ctx.programs.get(layer)
            if lp is None:
                continue
            mem = memory[layer]
            # with backward split (ZB-H1), the weight GEMMs' inputs (k/) outlive B until the deferred W pass
            alloc = [*_act(f"a/{mb}/{layer}", mem.stored), *_act(f"k/{mb}/{layer}", mem.kept)]
            free: tuple[str, ...] = ()
            if mem.transient.n > 0:
                alloc += _act(f"w/{mb}/{layer}", mem.transient)
                free = (f"w/{mb}/{layer}",)
            deps = self._weights_before(layer) if mb == 0 and self.weights else ()
            if self.zero3:
                gather = self._gather(mb, layers, pos, "f")
                if gather >= 0:
                    deps = ((self.stage, gather),)
                    if self.regather:
                        free += (f"g/{mb}/{layer}/f",)
            wait = received if pos == 0 else None
            self._run(
                lp.fwd, f"F{mb}.L{layer}", "forward", mb, first_deps=deps, alloc=tuple(alloc), free=free, wait_key=wait
            )
        self._amax(mb, g, forward=True)
        if g < len(ctx.chunks) - 1:
            self._send("F", mb, g, +1)

    def _amax(self, mb: int, g: int, *, forward: bool) -> None:
        """FP8 delayed scaling's amax all-reduce at the end of chunk ``g``'s pass, the compute stream held for it
        (``plansim.step.p2p.amax_reduction_s``)."""
        seconds = self.ctx.amax.get((g, forward), 0.0)
        if seconds > 0:
            self._run([Segment(seconds)], f"amax{'F' if forward else 'B'}{mb}.c{g}", "tp_comm", mb)

    def backward(self, mb: int, g: int, *, input_only: bool) -> None:
        ctx = self.ctx
        layers = ctx.chunks[g]
        blocks = [x for x in layers if ctx.is_block(x)]
        k_seg = math.ceil(math.sqrt(len(blocks) or 1))
        rev = list(reversed(layers))
        received = self._regather(("B", mb, g + 1)) if g < len(ctx.chunks) - 1 else None
        for pos, layer in enumerate(rev):
            lp = ctx.programs.get(layer)
            if lp is None:
                continue
            wait = received if pos == 0 else None
            deps: tuple[tuple[int, int], ...] = ()
            frees: list[str] = []
            if self.zero3 and self.regather:
                gather = self._gather(mb, rev, pos, "b")
                if gather >= 0:
                    deps = ((self.stage, gather),)
                    frees.append(f"g/{mb}/{layer}/b")
            elif self.zero3 and self.gathers.get((mb, layer, "f"), -1) >= 0:
                frees.append(f"g/{mb}/{layer}/f")  # resharded after its backward
            if self._rebuilds(g, layer):
                wait, deps = self._recompute(mb, g, layer, blocks, k_seg, wait, deps, frees)
            frees.append(f"a/{mb}/{layer}")
            if self._rebuilds(g, layer):
                frees.append(f"r/{mb}/{layer}")
            if not self.split:
                frees.append(f"k/{mb}/{layer}")
                if self._rebuilds(g, layer):
                    frees.append(f"rk/{mb}/{layer}")
            segs = lp.bwd_input if input_only else lp.bwd
            alloc: tuple[tuple[str, float, str], ...] = ()
            workspace = ctx.memory[g][layer].workspace
            if workspace.n > 0:  # a fused attention kernel's accumulators, for this backward only
                alloc = tuple(_act(f"ws/{mb}/{layer}", workspace))
                frees.append(f"ws/{mb}/{layer}")
            buffers = ctx.grad_buffers[g].get(layer)
            if not self.split and buffers is not None:
                alloc += self._grads_made(mb, layer, buffers, frees)
            _, last = self._run(
                segs, f"B{mb}.L{layer}", "backward", mb, first_deps=deps, alloc=alloc, free=tuple(frees), wait_key=wait
            )
            if not self.split:
                if buffers is not None:
                    self._copy_in(mb, layer, buffers, last, "backward", layer == self._last_copied(g))
                self._grads_ready(mb, layer, lp, last)
        self._amax(mb, g, forward=False)
        if g > 0:
            self._send("B", mb, g, -1)

    def weight_grad(self, mb: int, g: int) -> None:
        ctx = self.ctx
        for layer in reversed(ctx.chunks[g]):
            lp = ctx.programs.get(layer)
            if lp is None:
                continue
            frees = [f"k/{mb}/{layer}"]
            if self._rebuilds(g, layer):
                frees.append(f"rk/{mb}/{layer}")
            buffers = ctx.grad_buffers[g].get(layer)
            alloc = self._grads_made(mb, layer, buffers, frees) if buffers is not None else ()
            idx = self._compute(
                Task(
                    f"W{mb}.L{layer}",
                    "compute",
                    "weight_grad",
                    lp.wgrad_s,
                    alloc=alloc,
                    free=tuple(frees),
                    microbatch=mb,
                )
            )
            if buffers is not None:
                self._copy_in(mb, layer, buffers, idx, "weight_grad", layer == self._last_copied(g))
            self._grads_ready(mb, layer, lp, idx)

    def _recompute(
        self,
        mb: int,
        g: int,
        layer: int,
        blocks: list[int],
        k_seg: int,
        wait: tuple[str, int, int] | None,
        deps: tuple[tuple[int, int], ...],
        frees: list[str],
    ) -> tuple[tuple[str, int, int] | None, tuple[tuple[int, int], ...]]:
        """Emit the recompute a layer's backward needs; returns the (wait, deps) left for the backward itself."""
        ctx, s = self.ctx, self.s
        lp = ctx.programs[layer]
        policy = REMAT_POLICIES[s.remat]
        if policy.scheduled:  # what the schedule recomputes in the stages of this block's gradient nodes
            plan = ctx.milp[layer]
            mem = ctx.memory[g][layer]
            plan_alloc = (*_act(f"r/{mb}/{layer}", mem.rebuilt), *_act(f"rk/{mb}/{layer}", mem.rebuilt_kept))
            self._run(
                [Segment(plan.recompute_s)],
                f"R{mb}.L{layer}",
                "recompute",
                mb,
                first_deps=deps,
                alloc=plan_alloc,
                wait_key=wait,
            )
            return None, ()
        if policy.reruns == "attention_core":  # the core's kernels, with the ring exchange beside all but its last step
            hidden = sum(seg.hidden_s for seg in lp.selective_comm)
            segs = (
                [*lp.selective_comm, Segment(hidden), Segment(lp.selective_s - hidden)]
                if hidden
                else [Segment(lp.selective_s)]
            )
            todo = [layer]
        elif policy.reruns == "unsaved_ops":  # the ops whose outputs a per-op policy did not keep, collectives too
            segs = lp.sac
            todo = [layer]
        elif not policy.segments:  # the block's forward, its collectives included
            segs = lp.fwd
            todo = [layer]
        else:  # replay the whole segment before the backward of its last layer
            i = blocks.index(layer)
            start = i - i % k_seg
            seg_layers = blocks[start : start + k_seg]
            if layer != seg_layers[-1]:
                return wait, deps
            todo = seg_layers
            segs = [x for lay in seg_layers for x in ctx.programs[lay].fwd]
        alloc: list[tuple[str, float, str]] = []
        for lay in todo:  # split backward: what W needs beyond the stored part (rk/) stays for the W pass
            mem = ctx.memory[g][lay]
            alloc += [*_act(f"r/{mb}/{lay}", mem.rebuilt), *_act(f"rk/{mb}/{lay}", mem.rebuilt_kept)]
        self._run(segs, f"R{mb}.L{layer}", "recompute", mb, first_deps=deps, alloc=tuple(alloc), wait_key=wait)
        return None, ()

    def _send(self, direction: str, mb: int, g: int, peer: int) -> None:
        comm = Comm("send_recv", "direct", "pp", self.ctx.p2p_bytes, "pp", peers=Shift(peer))
        # what is sent may be an asynchronous collective's result (a column-parallel linear's input gradient)
        pending = tuple((self.stage, collective) for collective, _ in self.joins)
        idx = self.prog.add(
            Task(
                f"send{direction}{mb}.c{g}",
                "p2p",
                "send",
                comm=comm,
                deps=((self.stage, self.last_compute), *pending),
                microbatch=mb,
            )
        )
        self.ctx.sends[(direction, mb, g)] = (self.stage, idx)
        if self.ctx.p2p.blocking:  # the call returns once its transfer is done, then the device idles for a launch
            self._compute(Task(f"call{direction}{mb}.c{g}", "compute", "p2p_call", self.ctx.p2p.call_s,
                               deps=((self.stage, idx),), microbatch=mb))  # fmt: skip

    # -- data parallelism --------------------------------------------------------------------------------------
    def _gather(self, mb: int, order: list[int], pos: int, phase: str) -> int:
        """ZeRO-3: the all-gather of the weights of layer ``order[pos]`` for this pass, and the prefetch of the layers
        after it that the framework keeps ahead (``DataParallelPlan.prefetch``: they may start once the pass before the
        current one ended, so the current layer's and theirs are live; under SHARD_GRAD_OP, which gathers in forward
        only, each layer's stays until its backward). Returns the current layer's gather task, or -1 for a layer
        without weights."""
        assert self.plan is not None, "only ZeRO-3 gathers per layer"
        key = (order[0], order[-1])  # a chunk's layers, in the pass's direction
        windows = self.ahead.get(key)
        if windows is None:
            params = [lp.params if (lp := self.ctx.programs.get(x)) is not None else 0.0 for x in order]
            windows = self.ahead[key] = self.plan.prefetch.windows(params)
        for i in range(pos, pos + 1 + windows[pos]):
            if i >= len(order) or (mb, order[i], phase) in self.gathers:
                continue
            lp = self.ctx.programs.get(order[i])
            if lp is None or lp.params <= 0:
                self.gathers[(mb, order[i], phase)] = -1
                continue
            comm = _dp_comm(self.plan.gather, lp.params * self.plan.weight_bytes, "zero")
            deps = ((self.stage, self.last_compute),) if self.last_compute >= 0 else ()
            self.gathers[(mb, order[i], phase)] = self._dp(
                Task(
                    f"gather{phase}{mb}.L{order[i]}",
                    "dp",
                    "param_gather",
                    comm=comm,
                    deps=deps,
                    alloc=((f"g/{mb}/{order[i]}/{phase}", comm.n_bytes, "weights"),),
                    microbatch=mb,
                )
            )
        return self.gathers[(mb, order[pos], phase)]

    def _last_copied(self, g: int) -> int:
        """The last layer of model chunk ``g``'s weight-gradient pass (backward order) that copies its gradients
        into a reduce input."""
        return next((x for x in self.ctx.chunks[g] if x in self.ctx.grad_buffers[g]), -1)

    def _grads_made(self, mb: int, layer: int, b: LayerBytes, frees: list[str]) -> tuple[tuple[str, float, str], ...]:
        """The pass that makes a layer's weight gradients (``b``: its gradient buffers): it allocates its unsharded
        gradients and, at its end, frees the reduce input the copy before it left (``frees`` takes the name), which
        FSDP2's post-backward drops after waiting for that reduce-scatter, before its own copy."""
        if self.reduce_held is not None:
            frees.append(self.reduce_held)
            self.reduce_held = None
        return ((f"ug/{mb}/{layer}", b.grads, "gradients"),)

    def _copy_in(self, mb: int, layer: int, b: LayerBytes, after: int, category: str, last: bool) -> None:
        """A layer's gradients copied into its flat reduce input once the pass ``after`` made them (FSDP2's
        foreach_reduce on the compute stream): it allocates the reduce input and frees the unsharded gradients; the
        reduce input stays for the next layer's pass to free, or, the pass's last (``last``), is freed here. Its
        time is not modelled (0 s): a memory event between two tasks of the compute stream, which waits for none."""
        name = f"rs_in/{mb}/{layer}"
        size = Sized(b.reduce_input, float(reserved_bytes(b.reduce_input)))
        frees = (f"ug/{mb}/{layer}", *((name,) if last else ()))
        self.prog.add(Task(f"copyin{mb}.L{layer}", "compute", category, 0.0, deps=((self.stage, after),),
                           alloc=tuple(_act(name, size, "gradients")), free=frees, microbatch=mb))  # fmt: skip
        self.reduce_held = None if last else name

    def _grads_ready(self, mb: int, layer: int, lp: LayerProgram, task: int) -> None:
        """A layer's gradient for micro-batch ``mb`` is complete: bucket it for reduction."""
        s = self.s
        params = lp.params + (self.tied_params if layer == self.ctx.model.layers else 0)
        plan = self.plan
        if plan is None or params <= 0:
            return
        if plan.per_layer:
            self._reduce(f"rs{mb}.L{layer}", params * plan.grad_bytes, task, mb)
            return
        if not plan.reduce_every_microbatch and mb != s.num_microbatches - 1:
            return
        chunk = self.chunk_of.get(layer, 0)
        size = plan.chunk_bucket_bytes(self.stage == 0, chunk)
        for expert in plan.groups():  # each set of buckets fills with its share of the layer's gradients
            n_bytes = plan.grad_share(params, lp.expert_params, expert) * plan.grad_bytes
            if n_bytes <= 0:
                continue
            self.bucket[expert] += n_bytes
            self.bucket_dep[expert] = task
            done = plan.overlap and self.chunk_done[expert].get(layer) == chunk
            if plan.bucket_full(self.bucket[expert], size) or done:
                self._flush_bucket(mb, expert)

    def _flush_bucket(self, mb: int, expert: bool | None = None) -> None:
        """Launch what a set of buckets holds (``expert``; by default every set, in ``DataParallelPlan.groups``'
        order)."""
        if self.plan is None:
            return
        for group in self.plan.groups() if expert is None else (expert,):
            if self.bucket[group] <= 0:
                continue
            self._reduce(f"reduce{mb}.{self.last_dp + 1}", self.bucket[group], self.bucket_dep[group], mb, group)
            self.bucket[group] = 0.0

    def _reduce(self, name: str, n_bytes: float, ready: int, mb: int, expert: bool = False) -> None:
        """A gradient reduction of ``n_bytes`` once compute task ``ready`` has produced them (``expert``: the routed
        experts' bucket, over their own group, ``DataParallelPlan.experts``: nothing where it is one rank); under
        hybrid sharding the all-reduce of its output among the shard's replicas follows it on the dp stream (PyTorch
        FSDP's HSDP reduction)."""
        plan = self.plan
        assert plan is not None, "a reduction runs only with data parallelism"
        reduce: GroupCollective | None = plan.reduce
        ranks = plan.shard_ranks
        if expert:
            assert plan.experts is not None
            reduce, ranks = plan.experts.reduce, plan.experts.ranks
        deps = ((self.stage, ready),)
        if reduce is not None:
            comm = _dp_comm(reduce, n_bytes, "dp")
            self._dp(Task(name, "dp", "grad_reduce", comm=comm, deps=deps, microbatch=mb))
            deps = ((self.stage, self.last_dp),)
        if plan.replicate is not None:
            comm = _dp_comm(plan.replicate, n_bytes / ranks, "dp")
            self._dp(Task(f"{name}.ar", "dp", "grad_reduce", comm=comm, deps=deps, microbatch=mb))

    def end_of_microbatch_backward(self, mb: int) -> None:
        """After a micro-batch's whole backward (ZeRO-2 runs with pp = 1): flush its last bucket, and the next
        micro-batch's compute waits for its buckets, as backward's end waits for its gradient reductions (PyTorch
        FSDP's ``_post_backward_final_callback``: the compute stream waits for the reduce-scatter stream;
        DeepSpeed ZeRO-2's ``independent_gradient_partition_epilogue`` likewise after every backward)."""
        if self.plan is not None and self.plan.reduce_every_microbatch and not self.plan.per_layer:
            self._flush_bucket(mb)
            self.after_dp = self.last_dp

    def _offload(self, model: Workload, params: float, after: int) -> int:
        """Offloading's waits (``step.offload.offload_times`` of the stage's layers in model order), issued after the
        optimizer step ``after`` as two compute-stream tasks: the host link's exposed transfers, then the CPU's Adam.
        Returns the last."""
        ctx, s = self.ctx, self.s
        layers = sorted(x for c in self.chunk_layers for x in c)
        times = offload_times(ctx.cluster, s, params, [offload_layer(ctx.programs[x], ctx.is_block(x)) for x in layers])
        last = after
        for name, seconds in times.parts().items():
            last = self._compute(Task(name, "compute", name, seconds, deps=((self.stage, last),)))
        return last

    def finish(self, model: Workload) -> None:
        """Last bucket, tied-embedding sync, optimizer step, ZeRO-1/2 weight all-gather; static memory."""
        s, ctx = self.s, self.ctx
        self._flush_bucket(s.num_microbatches - 1)
        layers = [x for c in ctx.chunks[self.stage :: s.pp] for x in c]
        params = stage_params(layers, ctx.programs, s, model, self.stage)
        tied = tied_gradient_bytes(model, s)
        if tied and self.stage in (0, s.pp - 1):
            comm = Comm("all_reduce", "ring", "pp", tied, "dp", peers=GroupEnds())
            self._dp(Task("embedding_sync", "dp", "embedding_sync", comm=comm, deps=((self.stage, self.last_compute),)))
        deps = [(self.stage, self.last_compute)]
        if self.last_dp >= 0:
            deps.append((self.stage, self.last_dp))
        opt = self._compute(
            Task("optimizer", "compute", "optimizer", optimizer_step_s(self.kernels, s, params), deps=tuple(deps))
        )
        if s.offload:  # the host link's exposed transfers and the CPU's Adam, after the GPU's part of the step
            opt = self._offload(model, params, opt)
        experts = stage_expert_params(layers, ctx.programs)
        plan = self.plan
        if plan is not None and plan.gather_after_step and not plan.gather_overlapped:
            dense = params - experts if plan.experts is not None else params
            comm = _dp_comm(plan.gather, dense * plan.weight_bytes, "zero")
            self._dp(Task("weights_all_gather", "dp", "param_gather", comm=comm, deps=((self.stage, opt),)))
            if plan.experts is not None and plan.experts.gather is not None and experts > 0:
                comm = _dp_comm(plan.experts.gather, experts * plan.weight_bytes, "zero")
                self._dp(Task("expert_weights_all_gather", "dp", "param_gather", comm=comm,
                              deps=((self.stage, opt),)))  # fmt: skip
        self.prog.params = params
        if s.offload:
            self.prog.host_memory = host_states(
                s, params, ctx.host_activations.get(self.stage, 0.0), stage_expert_params(layers, ctx.programs)
            )
        fp8 = stage_fp8(layers, ctx.programs)
        self.prog.static_memory = model_states(ctx.cluster, s, params, fp8, experts) | fixed_bytes(
            ctx.cluster, s, self.stage, tied_copy_params(model, s) > 0, ctx.layer_input
        )


def lower(model: Workload, cluster: Cluster, strategy: Strategy) -> TaskGraph:
    """The TaskGraph of one training step; raises ``PlansimError`` when the strategy cannot run. ``strategy`` as
    written or resolved (``Strategy.resolved``: ``simulate_des`` hands it a resolved one)."""
    from plansim.costs.kernels import executed_flops
    from plansim.workload import model_flops

    prep = prepare_step(model, cluster, strategy)
    s, graph, kernels = prep.strategy, prep.graph, prep.kernels
    mesh = mesh_of(s)
    programs = layer_programs(graph, kernels, mesh, tp_overlap(s, cluster))
    for block in range(model.layers):  # a traced block may run no kernel (nn.Flatten, nn.Identity)
        programs.setdefault(block, LayerProgram(block))
    layer_input = graph.graph["layer_input_bytes"]
    ctx = _Ctx(
        s=s,
        model=model,
        cluster=cluster,
        programs=programs,
        chunks=chunk_layers(model.layers, s.pp, s.virtual_stages, s.layer_split),
        layer_input=layer_input,
        p2p_bytes=p2p_message_bytes(graph, s),
        dp_plan=data_parallel_plan(cluster, s),
        mesh=mesh,
        regather=regather(graph, s),
        p2p=pipeline_sends(cluster.gpu, s),
    )
    if s.fp8:
        price = comm_pricer(cluster, s)
        for g, chunk in enumerate(ctx.chunks):
            linears = sum(programs[i].fp8_linears for i in chunk if i in programs)
            for forward in (True, False):
                ctx.amax[g, forward] = amax_reduction_s(s, linears, forward, price)
    milp_flops = 0.0
    if REMAT_POLICIES[s.remat].scheduled:
        for plan in milp_stage_plans(prep, cluster, model).values():
            ctx.milp.update(plan.layers)
            milp_flops += plan.recompute_flops
    sched = get_schedule(s.schedule)
    milp = {i: (r.stored_bytes, r.rebuilt_bytes, r.recompute_s > 0) for i, r in ctx.milp.items()}
    per_param = grad_copy_in_bytes(s)
    tied = tied_copy_params(model, s)
    held = {i: lp.params + (tied if i == model.layers else 0) for i, lp in programs.items()}
    for g, chunk in enumerate(ctx.chunks):
        own = with_grad_buffers(tuple((i, LayerBytes.of(programs[i])) for i in chunk if i in programs), held, per_param)
        ctx.grad_buffers[g] = {i: b for i, b in own if b.reduce_input > 0}
        # the rank's blocks in its earlier chunks (a policy checkpointing every n-th block counts over them)
        offset = sum(1 for h in range(g % s.pp, g, s.pp) for i in ctx.chunks[h] if ctx.is_block(i) and i in programs)
        if s.offload:  # the offloaded blocks' activations: in host memory between forward and backward
            stage = g % s.pp
            ctx.host_activations[stage] = ctx.host_activations.get(stage, 0.0) + offloaded_activations(
                s, own, model.layers
            )
            own = offload_activations(s, own, model.layers)
        rows = chunk_memory(s.remat, own, model.layers, layer_input, sched.split_backward, milp if ctx.milp else None,
                            offset)  # fmt: skip
        ctx.memory[g] = {i: mem for i, mem, _ in rows}
    m, p, v = s.num_microbatches, s.pp, s.virtual_stages
    stages = []
    for stage in range(p):
        low = _StageLowering(ctx, stage, kernels)
        for op in sched.order(stage, p, m, v):
            g = op.chunk * p + stage
            if op.kind == "F":
                low.forward(op.microbatch, g)
            elif op.kind == "B":
                low.backward(op.microbatch, g, input_only=sched.split_backward)
            else:
                low.weight_grad(op.microbatch, g)
            if op.kind == ("W" if sched.split_backward else "B"):
                low.end_of_microbatch_backward(op.microbatch)
        low.finish(model)
        stages.append(low.prog)
    for stage, idx, key in ctx.waits:
        task = stages[stage].tasks[idx]
        task.deps = (*task.deps, ctx.sends[key])
    _slowest_gpu(cluster, mesh, stages)
    recompute_flops = milp_flops + sum(
        _recompute_flops(s.remat, programs[x])
        for g, chunk in enumerate(ctx.chunks)
        for x in chunk
        if ctx.is_block(x) and x in programs and ctx.memory[g][x].rebuilds
    )
    model_fl, hardware_fl = step_flops(model_flops(graph), executed_flops(graph), recompute_flops, s)
    return TaskGraph(stages=stages, mesh=mesh, num_microbatches=m, model_flops=model_fl, hardware_flops=hardware_fl)


def _slowest_gpu(cluster: Cluster, mesh: DeviceMesh, stages: list[StageProgram]) -> None:
    """Set every stage's first task to the step's wait for its slowest GPU (``straggler_wait_s``): GPUs differ
    persistently, the step ends with a synchronisation of all of them, and the slowest is slow in each of its
    kernels, so the wait is its coefficient of variation times the expected maximum over all GPUs times the busiest
    stage's kernel time (what the analytic engine charges): its tasks' time but what they wait for the host (a
    launch, a blocking pipeline call's idle time), which a slower GPU does not lengthen."""
    busy = max(
        sum(
            t.duration_s - t.host_s
            for t in prog.tasks
            if t.stream == "compute" and t.comm is None and t.category not in NO_KERNEL
        )
        for prog in stages
    )
    wait = straggler_wait_s(cluster.gpu.gpu_to_gpu_cv, mesh.num_ranks, busy)
    for prog in stages:
        prog.tasks[0].duration_s = wait


def _dp_comm(c: GroupCollective, n_bytes: float, kind: str) -> Comm:
    """One collective of the data-parallel plan over its mesh axis (``dp``, or hybrid sharding's ``dp_shard`` or
    ``dp_replicate``), its bytes filed under ``kind``."""
    return Comm(c.collective, c.algorithm, c.axis, n_bytes, kind, local=c.local)


def _recompute_flops(remat: str, lp: LayerProgram) -> float:
    """Matmul FLOPs a checkpointed block's backward reruns under ``remat`` (its registry entry)."""
    block, core = Recompute(0.0, 0.0, lp.fwd_matmul_flops), Recompute(0.0, 0.0, lp.selective_matmul_flops)
    unsaved = Recompute(0.0, 0.0, lp.sac_matmul_flops)
    return REMAT_POLICIES[remat].recompute(block, core, unsaved).matmul_flops
