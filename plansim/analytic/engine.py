"""The analytic engine: one training step in closed form.

step time = pipeline time (per-stage forward + backward + recompute + tensor-parallel and pipeline communication,
laid out by the schedule's closed form, bubble included) + exposed data-parallel/ZeRO communication (what the
overlap with backward does not hide) + the optimizer step. Memory is the analytic memory model per stage; the worst
stage is reported. Every cost comes from ``plansim.costs`` (kernels, collectives, memory), which the discrete-event
engine uses too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import networkx as nx

from plansim.costs.collectives import algorithm_entry, bytes_sent_per_rank, collective_time
from plansim.costs.interference import Beside, Interference, interference_model, overlap_cost, send_load
from plansim.costs.kernels import KernelCostModel
from plansim.costs.remat_policies import REMAT_POLICIES, Recompute
from plansim.costs.stragglers import straggler_wait_s
from plansim.errors import PlansimError
from plansim.hardware import Cluster, Link
from plansim.pipeline.schedules import get_schedule
from plansim.pipeline.stages import chunk_layers, stage_layers
from plansim.remat.plan import StageRemat, milp_stage_plans
from plansim.result import Result
from plansim.step.data_parallel import (
    CHAINED,
    START,
    DataParallelPlan,
    GroupCollective,
    LayerPass,
    bucketed_reduction,
    data_parallel_plan,
    per_layer_overlap,
    prefetched_gathers,
    tied_gradient_bytes,
    weight_gathers,
)
from plansim.step.layers import (
    AxisComm,
    LayerCost,
    layer_costs,
    layer_programs,
    rerun,
    rerun_sync_s,
)
from plansim.step.memory import (
    LayerBytes,
    activation_peak,
    fixed_bytes,
    stage_params,
    static_bytes,
)
from plansim.step.optimizer import optimizer_step_s
from plansim.step.p2p import OverlappedSends, call_overhead_s, regather
from plansim.step.prepare import (
    PreparedStep,
    beside,
    comm_pricer,
    p2p_message_bytes,
    prepare_step,
    rate_beside,
    ring_call_s,
    tied_copy_params,
    tp_overlap,
)
from plansim.step.result import overlap_figures, step_flops, step_result
from plansim.strategy.checks import check_strategy
from plansim.strategy.mesh import mesh_of
from plansim.strategy.schema import Strategy, StrategyProjection
from plansim.units import GB
from plansim.workload.traced import Workload

__all__ = ["AnalyticCache", "simulate_analytic"]


@dataclass(frozen=True)
class StageCost:
    """One pipeline stage, one rank: per-micro-batch times (s), per-step bytes, and memory (bytes).

    ``bwd_weight_s`` is the weight-gradient part of ``bwd_s``, which split-backward schedules (ZB-H1) run apart;
    ``axis_bytes`` the bytes one rank sends per micro-batch in the layers' blocking collectives, per mesh axis;
    ``sync_s`` what those collectives (and their rerun under remat) wait for their slowest member."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    comm_s: float
    axis_bytes: dict[str, float]
    params: int
    #: each layer's parameters, in the stage's forward order (ZeRO-3's gathered layers: ``step.memory.static_bytes``)
    layer_params: tuple[float, ...]
    #: parameters whose gradients backward produces last (the embedding, on the first stage): the last bucket
    tail_params: float
    activations: float
    recompute_matmul_flops: float
    p2p_bytes: float
    num_layers: int
    bwd_weight_s: float = 0.0
    sync_s: float = 0.0
    #: the caching allocator's rounding of ``activations``, allocation by allocation (``step.memory.activation_peak``)
    fragmentation: float = 0.0
    interference_s: float = 0.0
    overlapped_s: float = 0.0
    #: what the stage's sends that run beside compute add once per step (``OverlappedSends.chain_s``)
    send_chain_s: float = 0.0
    #: its layers' forward and backward passes in the order it runs them (gradient buckets, ZeRO-3's gathers)
    forward_layers: tuple[LayerPass, ...] = ()
    backward_layers: tuple[LayerPass, ...] = ()
    #: how many of ``backward_layers`` each of the stage's model chunks holds, in backward order (the last chunk's
    #: first); one entry without interleaving
    backward_chunks: tuple[int, ...] = ()
    #: the pipeline's first stage (where a framework buckets only the first stage, ``DataParallelPlan``)
    first_stage: bool = False

    @property
    def compute_s(self) -> float:
        """Forward + backward compute of one micro-batch."""
        return self.fwd_s + self.bwd_s

    @property
    def time_s(self) -> float:
        """Forward + backward + recompute + blocking communication (and its wait for the slowest member) of one
        micro-batch, and what its pipeline sends cost the compute running beside them (``interference_s``, over
        ``overlapped_s``)."""
        return self.compute_s + self.recompute_s + self.comm_s + self.sync_s + self.interference_s


@dataclass(frozen=True)
class _LayerKey(StrategyProjection):
    """What the op graph of a micro-batch, its per-layer costs (tensor-parallel collectives on the tp axis, which
    is the fastest one: its groups do not depend on dp or pp) and the pipeline message size read of a strategy."""

    micro_batch: int
    tp: int
    sequence_parallel: bool
    compute_dtype: str
    attention: str
    tp_overlap_rules: tuple[
        object, ...
    ]  # which tensor-parallel collectives overlap GEMMs (``step.prepare.tp_overlap``)


@dataclass(frozen=True)
class _PipelineKey(StrategyProjection):
    """What a pipeline's stages read beyond ``_LayerKey``: layout, schedule, remat and, for the stage boundaries'
    links, the data-parallel degree (the pp axis's stride). ZeRO and the all-reduce do not enter."""

    remat: str
    schedule: str
    pp: int
    num_microbatches: int
    virtual_stages: int
    layer_split: tuple[int, ...] | None
    dp: int | None
    blocking_p2p: bool  # the stages' sends (``_SendsKey``), under the framework's pipeline_sends rule
    framework: str


@dataclass(frozen=True)
class _SendsKey(StrategyProjection):
    """What the pipeline sends of every stage read beyond ``_LayerKey`` (the pp axis's stride is tp * dp; the
    schedule also says whether the sends block)."""

    schedule: str
    pp: int
    virtual_stages: int
    dp: int | None
    blocking_p2p: bool  # the framework's pipeline_sends rule
    framework: str  # whether a blocking call ends in a host synchronisation (``step.p2p.call_overhead_s``)


@dataclass(frozen=True)
class _StatesKey(StrategyProjection):
    """What the stages' model states and workspace read (``AnalyticCache.model_states_exceed``)."""

    tp: int
    pp: int
    virtual_stages: int
    layer_split: tuple[int, ...] | None
    dp: int | None
    shard_degree: int  # the ranks ZeRO shards over (``dp_shard`` under hybrid sharding)
    zero: int
    compute_dtype: str
    fp32_grad_accum: bool
    gathers_per_layer: bool  # the framework's ZeRO-2 may shard the weights (FSDP's SHARD_GRAD_OP)
    framework: str  # how far ahead its ZeRO-3 gathers (param_prefetch): the layers gathered at once


_Sent = tuple[float, float]  # (seconds, bytes this rank sends)
#: A stage's pipeline traffic per micro-batch: (seconds on the compute stream, pp bytes, tp bytes, ((seconds, compute
#: rate beside it) per send that runs beside compute), those sends per direction)
_Sends = tuple[float, float, float, tuple[tuple[float, float], ...], OverlappedSends]
_DpMessage = tuple[GroupCollective, float]  # a collective of the data-parallel plan and its message bytes
_DpPricer = Callable[[GroupCollective, float], _Sent]
#: What the data-parallel plan's reduction, gather and replicas' all-reduce take from compute beside them (None: the
#: plan has no such collective)
_DpBesides = tuple["Beside | None", "Beside | None", "Beside | None"]
#: ``AnalyticCache.dp_comms``: (rate, micro-batches, pipeline stages, passes per model chunk, params, passes by
#: identity) -> (the passes, their result)
_DpMemo = dict[tuple[Any, ...], tuple[Any, Any, "DataParallelComm"]]


@dataclass(frozen=True)
class _DataParallelKey(StrategyProjection):
    """What the data-parallel plan (``step.data_parallel``) and its collectives' links read: the mesh (the dp
    group's size and stride), ZeRO, the algorithm, the gradient and weight bytes, buckets and overlap."""

    tp: int
    dp: int | None
    shard_degree: int  # hybrid sharding's shard group: the mesh's dp_shard and dp_replicate axes
    pp: int
    zero: int
    dp_algorithm: str
    compute_dtype: str
    fp32_grad_accum: bool
    grad_bucket_bytes: float
    overlap_grad_reduce: bool
    framework: str  # its rules: whether sharded gradients are reduced every micro-batch
    overlap_param_gather: bool


@dataclass(frozen=True)
class _FixedKey(StrategyProjection):
    """What the CUDA context and NCCL's buffers per stage read (``step.memory.fixed_bytes``): the mesh, which
    reductions the dp and tp groups run (all-reduce or not), the interleaved pipeline's wrap-around peer."""

    tp: int
    dp: int | None
    shard_degree: int  # hybrid sharding's two communicators in place of the dp group's
    pp: int
    virtual_stages: int
    zero: int
    sequence_parallel: bool
    tp_comm_overlap: bool  # Transformer Engine's userbuffers, one micro-batch's activation each
    micro_batch: int
    framework: str


@dataclass(frozen=True)
class _Priced:
    """What a strategy's pricing reads that depends only on ``_LayerKey`` (micro-batch, tp, sequence
    parallel, dtype, attention)."""

    prep: PreparedStep
    costs: dict[int, LayerCost]
    model_flops: float
    kernel_recompute_flops: float  # what fused kernels' backward recomputes (workload.kernel_recompute_flops)
    stage_sums: dict[tuple[int, ...], _StageSums] = field(default_factory=dict)
    pipelines: dict[_PipelineKey, _Pipeline] = field(default_factory=dict)
    stage_costs: dict[tuple, StageCost] = field(default_factory=dict)
    p2p: dict[_SendsKey, list[_Sends]] = field(default_factory=dict)
    _alike: dict[tuple[LayerCost, ...], _StageSums] = field(default_factory=dict)
    _bytes: dict[int, LayerBytes] = field(default_factory=dict)

    def layer_bytes(self, layer: int) -> LayerBytes:
        """What the memory model reads of a layer's cost (``step.memory.LayerBytes``)."""
        hit = self._bytes.get(layer)
        if hit is None:
            hit = self._bytes[layer] = LayerBytes.of(self.costs[layer])
        return hit

    def sums(self, layers: tuple[int, ...], model: Workload) -> _StageSums:
        """The sums of a layer list; lists whose layers cost alike (a pipeline's middle stages) share one."""
        hit = self.stage_sums.get(layers)
        if hit is None:
            alike = tuple(self.costs[i] for i in layers if i in self.costs)
            hit = self._alike.get(alike)
            if hit is None:
                hit = _StageSums(list(layers), self.costs, model, self.prep.graph.graph["layer_input_bytes"])
                self._alike[alike] = hit
            self.stage_sums[layers] = hit
        return hit

    def p2p_of(self, cluster: Cluster, s: Strategy) -> list[_Sends]:
        """``_p2p`` of every stage of ``s``'s pipeline, with each send's time and the compute rate beside it."""
        key = _SendsKey.of(s)
        hit = self.p2p.get(key)
        if hit is None:
            model = _interference(cluster, self.prep.kernels)
            hit = self.p2p[key] = [_p2p(cluster, s, idx, self.prep.graph, model) for idx in range(s.pp)]
        return hit


class AnalyticCache:
    """Memoizes, for one model and cluster, the op graph and the per-layer costs that many strategies share (those
    with equal micro-batch, tensor-parallel degree, sequence parallelism, dtype and attention), so that a planner
    pricing thousands of strategies builds each graph once. Results are exactly ``simulate_analytic``'s without a
    cache."""

    def __init__(self, model: Workload, cluster: Cluster) -> None:
        self.model, self.cluster = model, cluster
        self._priced: dict[_LayerKey, _Priced] = {}
        self._states: dict[_StatesKey, int] = {}
        self._fixed: dict[_FixedKey, list[dict[str, float]]] = {}
        self._problems: dict[Strategy, list[str]] = {}
        # per data-parallel key: the plan, its collectives' prices, and a stage's reductions and gathers beside its
        # passes by what else they read (``dp_comms``)
        self._dp_plans: dict[_DataParallelKey, tuple[DataParallelPlan | None, dict[_DpMessage, _Sent], _DpMemo]] = {}

    def data_parallel(self, s: Strategy) -> tuple[DataParallelPlan | None, _DpPricer, _DpMemo]:
        """``data_parallel_plan`` of a resolved strategy, a memoized ``_price_dp`` of its collectives and the memo
        of ``dp_comms``."""
        key = _DataParallelKey.of(s)
        hit = self._dp_plans.get(key)
        if hit is None:
            hit = self._dp_plans[key] = (data_parallel_plan(self.cluster, s), {}, {})
        plan, prices, memo = hit

        def price(c: GroupCollective, n_bytes: float) -> tuple[float, float]:
            got = prices.get((c, n_bytes))
            if got is None:
                assert plan is not None
                got = prices[(c, n_bytes)] = _price_dp(self.cluster, s, plan, c, n_bytes)
            return got

        return plan, price, memo

    @staticmethod
    def dp_comms(
        s: Strategy,
        dp: tuple[DataParallelPlan | None, _DpPricer, _DpMemo],
        stages: list[StageCost],
        besides: _DpBesides,
    ) -> list[DataParallelComm]:
        """``_dp_comm`` of each stage, memoized in ``dp`` (``data_parallel(s)``): it reads the data-parallel key
        (``besides`` follow from it and the cluster), the micro-batches, the pipeline's stages and the stage's
        parameters and passes (per model chunk: the interleaved cooldown's walk, ``_last_backwards``)."""
        plan, price, memo = dp
        out = []
        for stage in stages:
            # the passes by identity (built once per layer list and remat: ``_backward_layers``); the entry keeps
            # them alive, so an identity is not reused while it is a key
            key = (besides, s.num_microbatches, s.pp, stage.backward_chunks, stage.params, id(stage.forward_layers),
                   id(stage.backward_layers), stage.first_stage)  # fmt: skip
            hit = memo.get(key)
            if hit is None or hit[0] is not stage.backward_layers or hit[1] is not stage.forward_layers:
                comm = _dp_comm(s, plan, price, stage, stage.bwd_s + stage.recompute_s, stage.fwd_s, besides)
                hit = memo[key] = (stage.backward_layers, stage.forward_layers, comm)
            out.append(hit[2])
        return out

    def problems(self, resolved: Strategy) -> list[str]:
        """``check_strategy`` of a resolved strategy, memoized (the planner asks twice per strategy)."""
        hit = self._problems.get(resolved)
        if hit is None:
            hit = self._problems[resolved] = check_strategy(resolved, self.model, self.cluster)
        return hit

    def model_states_exceed(self, strategy: Strategy) -> bool:
        """Whether some stage's weights, gradients, optimizer states and workspace alone exceed the device's memory
        (then ``simulate_analytic`` reports ``fits=False`` whatever the activations): the memory model's static
        part, without pricing the step. False for a strategy that cannot run (pricing it names why)."""
        states = self.model_states_bytes(strategy)
        return states is not None and states > self.cluster.gpu.memory_bytes

    def model_states_bytes(self, strategy: Strategy) -> int | None:
        """The largest stage's weights, gradients, optimizer states and workspace (ZeRO-3's gathered layers
        included); None for a strategy that cannot run."""
        s = strategy.resolve(self.cluster)
        if self.problems(s):  # before the cache: validity is not a matter of the key
            return None
        key = _StatesKey.of(s)
        if key not in self._states:
            costs = next((p.costs for k, p in self._priced.items() if k.tp == s.tp), None) or self.priced(s).costs
            self._states[key] = max(
                sum(
                    static_bytes(
                        self.cluster, s, stage_params(layers, costs, s, self.model, idx),
                        [costs[i].params for i in layers if i in costs],
                    ).values()
                )
                for idx, layers in enumerate(_layout(self.model.layers, s.pp, s.virtual_stages, s.layer_split))
            )  # fmt: skip
        return self._states[key]

    def fixed(self, s: Strategy) -> list[dict[str, float]]:
        """``fixed_bytes`` of every stage of a resolved strategy (CUDA context, NCCL buffers)."""
        key = _FixedKey.of(s)
        hit = self._fixed.get(key)
        if hit is None:
            tied = tied_copy_params(self.model, s) > 0
            layer_input = float(self.priced(s).prep.graph.graph["layer_input_bytes"]) if s.tp_comm_overlap else 0.0
            hit = self._fixed[key] = [fixed_bytes(self.cluster, s, idx, tied, layer_input) for idx in range(s.pp)]
        return hit

    def priced(self, prep_strategy: Strategy) -> _Priced:
        """The shared part for a resolved, checked strategy."""
        s = prep_strategy
        key = _LayerKey.of(s)
        hit = self._priced.get(key)
        if hit is None:
            from plansim.workload import kernel_recompute_flops, model_flops

            prep = prepare_step(self.model, self.cluster, s)
            programs = layer_programs(
                prep.graph, prep.kernels, mesh_of(prep.strategy), tp_overlap(prep.strategy, self.cluster)
            )
            costs = layer_costs(
                programs,
                comm_pricer(self.cluster, prep.strategy),
                rate_beside(self.cluster, prep.strategy, prep.kernels),
            )
            for block in range(self.model.layers):  # a traced block may run no kernel (nn.Flatten, nn.Identity)
                costs.setdefault(block, LayerCost())
            hit = _Priced(prep, costs, model_flops(prep.graph), kernel_recompute_flops(prep.graph))
            self._priced[key] = hit
        return hit


def simulate_analytic(
    model: Workload, cluster: Cluster, strategy: Strategy, *, cache: AnalyticCache | None = None
) -> Result:
    """Price one training step of ``model`` on ``cluster`` under ``strategy`` in closed form.

    Raises ``PlansimError`` when the strategy cannot run (each violation named); a strategy that runs but does not
    fit in memory is a result with ``fits=False`` and a reason. ``cache`` (for this model and cluster) shares the
    op graph and layer costs between calls.
    """
    s = strategy.resolve(cluster)
    shared = (cache if cache is not None and cache.model is model and cache.cluster is cluster else None) or (
        AnalyticCache(model, cluster)
    )
    problems = shared.problems(s)
    if problems:
        raise PlansimError("; ".join(problems))
    priced = shared.priced(s)
    prep = PreparedStep(s, priced.prep.graph, priced.prep.kernels)
    # a pipeline's stages do not depend on ZeRO or the all-reduce: strategies differing only there share them
    key = _PipelineKey.of(s)
    scheduled = REMAT_POLICIES[s.remat].scheduled
    pipe = priced.pipelines.get(key) if not scheduled else None
    if pipe is None:
        plans = milp_stage_plans(prep, cluster, model, priced.costs) if scheduled else {}
        tied = tied_copy_params(model, s)
        chunks = _chunks(model.layers, s.pp, s.virtual_stages, s.layer_split)
        stages = []
        for idx, (layers, p2p) in enumerate(
            zip(_layout(model.layers, s.pp, s.virtual_stages, s.layer_split), priced.p2p_of(cluster, s), strict=True)
        ):
            sums = priced.sums(layers, model)
            params = sums.params + (tied if idx == s.pp - 1 else 0)
            own = tuple(
                tuple((i, priced.layer_bytes(i)) for i in chunks[c * s.pp + idx] if i in priced.costs)
                for c in range(s.virtual_stages)
            )
            milp = (
                tuple((i, r.stored_bytes, r.rebuilt_bytes, r.recompute_s > 0) for i, r in plans[idx].layers.items())
                if scheduled
                else None
            )
            # the activations' peak as the stage's passes allocate and free them (step.memory.activation_peak)
            peak = activation_peak(s.remat, s.schedule, idx, s.pp, s.num_microbatches, s.virtual_stages, own,
                                   model.layers, sums.layer_input, milp)  # fmt: skip
            if scheduled:
                stages.append(
                    _stage_cost(sums, s.remat, p2p, params, peak, plans[idx], chunks=s.virtual_stages, first=idx == 0)
                )
                continue
            stage_key = (sums, s.remat, p2p, params, peak, s.virtual_stages, idx == 0)
            stage = priced.stage_costs.get(stage_key)
            if stage is None:
                stage = priced.stage_costs[stage_key] = _stage_cost(
                    sums, s.remat, p2p, params, peak, chunks=s.virtual_stages, first=idx == 0
                )
            stages.append(stage)
        pipe = _Pipeline.of(stages, s)
        if not scheduled:
            priced.pipelines[key] = pipe
    return _assemble(
        model,
        cluster,
        s,
        priced.model_flops,
        prep.kernels,
        pipe,
        shared,
        kernel_recompute=priced.kernel_recompute_flops,
    )


@lru_cache(maxsize=4096)
def _chunks(num_layers: int, pp: int, v: int, split: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], ...]:
    """``chunk_layers`` as tuples, memoized: the model chunks, chunk ``c`` of stage ``s`` being ``c * pp + s``."""
    return tuple(tuple(chunk) for chunk in chunk_layers(num_layers, pp, v, split))


@lru_cache(maxsize=4096)
def _layout(num_layers: int, pp: int, v: int, split: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], ...]:
    """``stage_layers`` as tuples, memoized (a planner asks for the same few layouts thousands of times)."""
    return tuple(tuple(layers) for layers in stage_layers(num_layers, pp, v, split))


@dataclass(frozen=True)
class _Pipeline:
    """A pipeline's stages and what every ZeRO/all-reduce variant of it reads: the schedule's step time (with the
    fill and drain of the sends beside compute, ``send_chain_s``), the bottleneck stage, and the stages grouped
    where the data-parallel traffic (params, layers, backward and forward time) or the static memory (params, largest
    layer) can differ, so that each group is priced once."""

    stages: list[StageCost]
    pipe_s: float
    bottleneck: StageCost
    dp_groups: list[StageCost]
    dp_group_sizes: list[int]
    dp_group_first: list[int]
    dp_group_of: list[int]
    bottleneck_index: int
    memory_groups: list[StageCost]
    memory_group_of: list[int]
    activations: list[int]
    fragmentation: list[int]
    axis_bytes: dict[str, float]
    p2p_bytes: float
    recompute_matmul_flops: float
    send_chain_s: float = 0.0

    @classmethod
    def of(cls, stages: list[StageCost], s: Strategy) -> _Pipeline:
        times = [st.time_s for st in stages]
        weights = [st.bwd_weight_s for st in stages]
        # sends beside compute (plansim.step.p2p.OverlappedSends): one micro-batch's transfers along the chain of
        # chunks, once per step
        chain = sum(st.send_chain_s for st in stages)
        pipe_s = get_schedule(s.schedule).step_time(times, s.num_microbatches, s.virtual_stages, weight_times=weights)
        pipe_s += chain
        busiest = max(range(len(stages)), key=times.__getitem__)
        bottleneck = stages[busiest]
        dp_groups: dict[tuple[float, ...], StageCost] = {}
        dp_sizes: dict[tuple[float, ...], int] = {}
        dp_first: dict[tuple[float, ...], int] = {}
        dp_of: list[int] = []
        memory_groups: dict[tuple[float, tuple[float, ...]], int] = {}
        representatives: list[StageCost] = []
        group_of = []
        for idx, st in enumerate(stages):
            dp_key = (st.params, st.tail_params, st.num_layers, st.bwd_s + st.recompute_s, st.fwd_s, st.first_stage)
            dp_groups.setdefault(dp_key, st)
            dp_sizes[dp_key] = dp_sizes.get(dp_key, 0) + 1
            dp_first.setdefault(dp_key, idx)
            dp_of.append(list(dp_groups).index(dp_key))
            g = memory_groups.setdefault((st.params, st.layer_params), len(representatives))
            if g == len(representatives):
                representatives.append(st)
            group_of.append(g)
        return cls(
            stages, pipe_s, bottleneck, list(dp_groups.values()), list(dp_sizes.values()), list(dp_first.values()),
            dp_of, busiest, representatives, group_of,
            [round(st.activations) for st in stages], [round(st.fragmentation) for st in stages],
            _most_per_axis(st.axis_bytes for st in stages),
            max(st.p2p_bytes for st in stages), sum(st.recompute_matmul_flops for st in stages), chain,
        )  # fmt: skip


def _p2p(cluster: Cluster, s: Strategy, stage: int, graph: nx.DiGraph, model: Interference) -> _Sends:
    """(seconds, pp bytes, tp bytes, sends beside compute, those sends per direction) of one micro-batch's pipeline
    traffic on ``stage``, as its framework issues it (``plansim.step.p2p``): its activation and gradient sends, each on
    its own boundary (the stage's first rank to its neighbour along the mesh's ``pp`` axis; interleaving wraps the
    last stage to the first). A blocking send is on the compute stream's critical path (the seconds), with the idle
    launch after each call; one that does not block runs beside the stage's compute (as the DES runs it on the p2p
    stream), so it is not in the seconds: each such send's seconds and the compute stream's rate beside it
    (``model``, ``plansim.costs.interference``), and their counts and transfers (``OverlappedSends``), of which the
    stage prices what its passes do not cover. The all-gather that rebuilds each received activation under the
    scatter/gather optimization is a tensor-parallel collective on the compute stream, in the seconds."""
    sched = get_schedule(s.schedule)
    fwd, bwd = sched.sends_per_microbatch(stage, s.pp, s.virtual_stages)
    if not fwd + bwd:
        return 0.0, 0.0, 0.0, (), OverlappedSends()
    n_bytes = p2p_message_bytes(graph, s)
    mesh = mesh_of(s)
    first = mesh.rank(pp=stage)
    call = call_overhead_s(cluster.gpu, s)
    seconds = 0.0
    beside: list[tuple[float, float]] = []
    transfers = {+1: 0.0, -1: 0.0}
    for count, steps in ((fwd, +1), (bwd, -1)):
        if not count:
            continue
        peer = mesh.shift("pp", first, steps)
        link = cluster.p2p_link(first, peer)
        transfer = transfers[steps] = link.latency_s + n_bytes / link.bandwidth_Bps
        if s.blocking_p2p:
            seconds += count * (transfer + call)
        else:
            beside += [(transfer, model.rate(send_load(cluster, first, peer)))] * count
    overlapped = OverlappedSends() if s.blocking_p2p else OverlappedSends(fwd, transfers[+1], bwd, transfers[-1])
    gather = regather(graph, s)
    if gather is None:
        return seconds, (fwd + bwd) * n_bytes, 0.0, tuple(beside), overlapped
    received = sum(sched.receives_per_microbatch(stage, s.pp, s.virtual_stages))
    gather_s, gather_sent = comm_pricer(cluster, s)(gather.group, gather.collective, gather.n_bytes)
    return seconds + received * gather_s, (fwd + bwd) * n_bytes, received * gather_sent, tuple(beside), overlapped


def _price(
    coll: str, algorithm: str, p: int, n_bytes: float, link: Link, ring: tuple[Cluster, int] | None = None, **kw: Any
) -> tuple[float, float]:
    """(seconds, bytes one rank sends) of one collective among ``p`` ranks on ``link``; a ring given ``ring=(cluster,
    nodes it spans)`` is priced as NCCL runs it (``ring_call_s``), as is an entry with an ``nccl`` mode."""
    if p <= 1 or n_bytes <= 0:
        return 0.0, 0.0
    if algorithm_entry(coll, algorithm).nccl is not None and ring is not None and not kw:
        seconds = ring_call_s(ring[0], coll, p, ring[1], n_bytes, link, algorithm)
    else:
        seconds = collective_time(coll, algorithm, p, n_bytes, link.latency_s, link.bandwidth_Bps, **kw)
    local = kw.get("local")
    return seconds, bytes_sent_per_rank(coll, algorithm, p, n_bytes, local=local)


class _StageSums:
    """The parts of a stage's cost that depend only on its layers (and, for recompute and activations, the remat
    policy): summed once per layer list and reused by every strategy with the same layers and layer costs."""

    def __init__(self, layers: list[int], costs: dict[int, LayerCost], model: Workload, layer_input: float) -> None:
        self.blocks = [costs[i] for i in layers if 0 <= i < model.layers]
        every = self.blocks + [costs[i] for i in layers if not 0 <= i < model.layers and i in costs]
        self.fwd_s = sum(c.fwd_s for c in every)
        self.bwd_s = sum(c.bwd_s for c in every)
        self.comm_s = sum(c.comm_fwd_s + c.comm_bwd_s for c in every)
        self.sync_s = sum(c.sync_fwd_s + c.sync_bwd_s for c in every)
        # compute lost beside the layers' asynchronous tensor-parallel collectives, and how long both ran
        self.interference_s = sum(c.interference_s for c in every)
        self.overlapped_s = sum(c.overlapped_s for c in every)
        # the forward passes' share of the compute stream (kernels, blocking collectives and their waits)
        self.fwd_pass_s = sum(c.fwd_s + c.comm_fwd_s + c.sync_fwd_s + c.interference_fwd_s for c in every)
        self.axis_bytes = _axis_sums(every, lambda a: a.fwd_bytes + a.bwd_bytes)
        self.axis_fwd_bytes_blocks = _axis_sums(self.blocks, lambda a: a.fwd_bytes)
        self.tail_params = sum(costs[i].params for i in layers if i < 0 and i in costs)
        self.bwd_weight_s = sum(c.bwd_weight_s for c in every)
        self.params = round(sum(costs[i].params for i in layers if i in costs))
        # (is a block, its costs) in the order backward runs the layers; the forward passes in theirs
        self.backward = tuple((0 <= i < model.layers, costs[i]) for i in reversed(layers) if i in costs)
        self.forward = tuple(
            LayerPass(c.fwd_s, c.comm_fwd_s + c.sync_fwd_s + c.interference_fwd_s, c.params)
            for _, c in self.backward[::-1]
        )
        self.layer_params = tuple(x.params for x in self.forward)  # in the stage's forward order
        self.layer_input = layer_input
        self._recompute: dict[str, Recompute] = {}
        self._rerun_sync: dict[str, float] = {}
        self.backward_passes: dict[tuple[int, float, float], tuple[LayerPass, ...]] = {}

    def recompute(self, remat: str) -> Recompute:
        if remat not in self._recompute:
            self._recompute[remat] = rerun(remat, self.blocks)
        return self._recompute[remat]

    def rerun_sync(self, remat: str) -> float:
        if remat not in self._rerun_sync:
            self._rerun_sync[remat] = rerun_sync_s(remat, self.blocks)
        return self._rerun_sync[remat]


def _stage_cost(
    sums: _StageSums,
    remat: str,
    p2p: _Sends,
    params: int,
    peak: tuple[float, float],
    plan: StageRemat | None = None,
    chunks: int = 1,
    first: bool = False,
) -> StageCost:
    """One stage from its layers' sums, ``p2p`` (seconds, pp bytes, tp bytes, each send beside compute) of its
    pipeline traffic (``_p2p``), ``params`` it holds and its activations' ``peak`` (bytes, reserved bytes: the
    difference is the caching allocator's rounding, ``fragmentation``; ``step.memory.activation_peak``); ``plan``:
    the stage's ``remat: milp`` schedule, which says what it recomputes.

    Each send that does not block runs beside the compute that follows it, an equal share of the micro-batch's
    compute per send (``overlap_cost``); of its transfer the stage's time per micro-batch holds only what outlasts one
    of its ``chunks``' passes of the send's direction (``OverlappedSends.excess_s``), and the step once the chain of
    one micro-batch's transfers (``send_chain_s``, added by ``_Pipeline``)."""
    if plan is not None:  # remat: milp, the stage's schedule (plansim/remat/plan.py)
        recompute_s, recompute_comm_s, recompute_flops = plan.recompute_s, plan.recompute_comm_s, plan.recompute_flops
        rerun_sync = 0.0  # the schedule's recompute runs as one task, its collectives priced inside it
    else:
        recompute_s, recompute_comm_s, recompute_flops = sums.recompute(remat)
        rerun_sync = sums.rerun_sync(remat)
    activations = peak[0]
    sends, overlapped_sends = p2p[3], p2p[4]
    fwd_pass = sums.fwd_pass_s
    bwd_pass = sums.comm_s + sums.sync_s + sums.interference_s + sums.fwd_s + sums.bwd_s - fwd_pass
    bwd_pass += recompute_s + recompute_comm_s
    bwd_pass += rerun_sync
    send_excess = overlapped_sends.excess_s(fwd_pass / chunks, bwd_pass / chunks)
    beside = (sums.fwd_s + sums.bwd_s + recompute_s) / max(1, len(sends))
    lost = overlapped = 0.0
    for seconds, rate in sends:
        ov, cost = overlap_cost(beside, seconds, rate)
        overlapped += ov
        lost += cost
    return StageCost(
        forward_layers=sums.forward,
        backward_layers=_backward_layers(sums, params, recompute_s, recompute_comm_s + rerun_sync),
        backward_chunks=_chunk_sizes(sums, chunks),
        first_stage=first,
        fwd_s=sums.fwd_s,
        bwd_s=sums.bwd_s,
        recompute_s=recompute_s,
        comm_s=sums.comm_s + recompute_comm_s + p2p[0] + send_excess,
        axis_bytes=_plus(_rerun_bytes(sums, remat), "tp", p2p[2]),
        params=params,
        layer_params=sums.layer_params,
        tail_params=sums.tail_params,
        activations=activations,
        recompute_matmul_flops=recompute_flops,
        p2p_bytes=p2p[1],
        num_layers=max(1, len(sums.blocks)),
        bwd_weight_s=sums.bwd_weight_s,
        sync_s=sums.sync_s + rerun_sync,
        fragmentation=peak[1] - peak[0],
        interference_s=lost + sums.interference_s,
        overlapped_s=overlapped + sums.overlapped_s,
        send_chain_s=overlapped_sends.chain_s,
    )


def _chunk_sizes(sums: _StageSums, chunks: int) -> tuple[int, ...]:
    """How many of the stage's backward passes (``sums.backward``) each of its ``chunks`` model chunks holds, in
    backward order: the blocks split evenly (``plansim.pipeline.stages.chunk_layers``), the output layer with the
    last chunk (first in backward), the embedding with the first (last in backward).

    One chunk, or fewer blocks than chunks: a single entry."""
    blocks = sum(is_block for is_block, _ in sums.backward)
    if chunks <= 1 or blocks < chunks:
        return (len(sums.backward),)
    per, count, seen = blocks // chunks, 0, 0
    sizes: list[int] = []
    for is_block, _ in sums.backward:
        count += 1
        seen += is_block
        if is_block and seen % per == 0 and len(sizes) < chunks - 1:
            sizes.append(count)
            count = 0
    return (*sizes, count)


def _last_backwards(s: Strategy, layers: tuple[LayerPass, ...], sizes: tuple[int, ...]) -> tuple[LayerPass, ...]:
    """The passes a stage runs from its last micro-batch's first chunk backward on, in order (``layers`` as one
    backward runs them, ``sizes`` per chunk). Interleaved 1F1B ends with the last ``p`` micro-batches' backwards
    chunk by chunk, the last chunk first (``pipeline_orders.interleaved_order``; Megatron-LM's cooldown): after the
    last micro-batch's backward of one chunk come the other ``p - 1`` micro-batches' backwards of the next chunk,
    then its last micro-batch's. Those others produce no gradient the reduction waits for; they are compute that
    the chunks' buckets, launched as each chunk completes its gradients, run beside (Megatron-LM launches each
    chunk's reduction after its last backward, ``megatron/core/pipeline_parallel/schedules.py:1234-1271`` at
    core_v0.15.0). The pipeline's idle waits between them are left out (none in the closed form of a stage's
    compute), so the walk hides a little less than the discrete-event engine's timeline."""
    if len(sizes) <= 1:
        return layers
    out: list[LayerPass] = []
    start = 0
    for i, n in enumerate(sizes):
        chunk = layers[start : start + n]
        start += n
        if i:
            work = sum(x.work_s for x in chunk) * (s.pp - 1)
            blocking = sum(x.blocking_s for x in chunk) * (s.pp - 1)
            out.append(LayerPass(work, blocking, 0))
        out.extend(chunk)
    return tuple(out)


def _backward_layers(
    sums: _StageSums, params: int, recompute_s: float, rerun_blocking_s: float
) -> tuple[LayerPass, ...]:
    """The stage's layers' backward in the order it runs them (``step.data_parallel.LayerPass``): a block's
    share of the stage's recompute (and its collectives) runs before its backward; the output layer also holds the
    tied embeddings' copy (``params`` beyond its layers', on the last stage with pp > 1)."""
    key = (params, recompute_s, rerun_blocking_s)
    hit = sums.backward_passes.get(key)
    if hit is not None:  # one tuple per stage's layers and remat: ``AnalyticCache.dp_comm`` keys on its identity
        return hit
    blocks = max(1, len(sums.blocks))
    out = []
    for is_block, c in sums.backward:
        work, blocking, layer_params = c.bwd_s, c.comm_bwd_s + c.sync_bwd_s + c.interference_bwd_s, c.params
        if is_block:
            work += recompute_s / blocks
            blocking += rerun_blocking_s / blocks
        elif c is sums.backward[0][1]:  # the output layer (or, without one, the stage's first layer in backward)
            layer_params += params - sums.params
        out.append(LayerPass(work, blocking, layer_params))
    hit = sums.backward_passes[key] = tuple(out)
    return hit


def _plus(axis_bytes: dict[str, float], axis: str, n_bytes: float) -> dict[str, float]:
    """``axis_bytes`` with ``n_bytes`` more on ``axis`` (a new dict; unchanged when there are none)."""
    if not n_bytes:
        return axis_bytes
    return {**axis_bytes, axis: axis_bytes.get(axis, 0.0) + n_bytes}


def _most_per_axis(per_stage: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per mesh axis, the most bytes any stage sends."""
    out: dict[str, float] = {}
    for axis_bytes in per_stage:
        for axis, n_bytes in axis_bytes.items():
            out[axis] = max(out.get(axis, 0.0), n_bytes)
    return out


def _axis_sums(costs: list[LayerCost], part: Callable[[AxisComm], float]) -> dict[str, float]:
    """Per mesh axis, the sum of ``part`` of the layers' blocking collectives."""
    out: dict[str, float] = {}
    for c in costs:
        for a in c.comm:
            out[a.axis] = out.get(a.axis, 0.0) + part(a)
    return out


def _rerun_bytes(sums: _StageSums, remat: str) -> dict[str, float]:
    """Per axis, bytes one rank sends per micro-batch: the layers' collectives, and again the blocks' forward ones
    where the policy reruns the block's forward."""
    if REMAT_POLICIES[remat].reruns != "block_forward":
        return sums.axis_bytes
    return {a: b + sums.axis_fwd_bytes_blocks.get(a, 0.0) for a, b in sums.axis_bytes.items()}


@dataclass(frozen=True)
class DataParallelComm:
    """Per step: exposed seconds, bytes one GPU sends for gradient reduction (dp) and for parameter gathers (zero),
    and the seconds compute ran beside them and lost to them (``plansim.costs.interference``)."""

    exposed_s: float
    dp_bytes: float
    zero_bytes: float
    interference_s: float = 0.0
    overlapped_s: float = 0.0
    #: what the stage's first forwards wait for an overlapped ZeRO-1/2 gather, and what they lose to it beside them
    #: (``step.data_parallel.prefetched_gathers``); not in the fields above
    lead_s: float = 0.0
    lead_interference_s: float = 0.0
    lead_overlapped_s: float = 0.0


def _dp_links(cluster: Cluster, s: Strategy, c: GroupCollective) -> tuple[Link, dict[str, Any]]:
    """The link of the collective's data-parallel group (its mesh axis: ``dp``, or under hybrid sharding
    ``dp_shard`` or ``dp_replicate``) and, where the algorithm prices each transfer on the link it crosses (its entry
    ``reads_local``: every one but NCCL's rings), the node-local group size and the inter-node link (one rank per
    node: a GPU's own NIC share) as keyword arguments of ``collective_time``: hierarchical's inter-node phase, a
    butterfly's steps between ranks ``local`` or more apart (recursive halving and doubling move their largest
    blocks over the longest distances, Thakur et al. 2005 sec 4), a tree's levels, a naive exchange and a parameter
    server's pushes and pulls between nodes each go through the sending or receiving GPU's NIC."""
    mesh = mesh_of(s)
    if c.local is None:
        return mesh.link(c.axis, cluster), {}
    local, intra, inter = mesh.split_links(c.axis, cluster)
    if inter is None:  # one node: no step crosses (hierarchical's inter-node phase is among one rank)
        return intra, {"local": local}
    return intra, {"local": local, "inter": (inter.latency_s, inter.bandwidth_Bps)}


def _price_dp(
    cluster: Cluster, s: Strategy, plan: DataParallelPlan, c: GroupCollective, n_bytes: float
) -> tuple[float, float]:
    """(seconds, bytes one rank sends) of one collective of ``plan`` over its data-parallel group."""
    link, kw = _dp_links(cluster, s, c)
    mesh = mesh_of(s)
    ranks = mesh.size(c.axis)
    nodes = max(1, ranks // mesh.local_size(c.axis, cluster.gpus_per_node))
    return _price(c.collective, c.algorithm, ranks, n_bytes, link, (cluster, nodes), **kw)


def _dp_comm(
    s: Strategy,
    plan: DataParallelPlan | None,
    price: _DpPricer,
    stage: StageCost,
    backward_s: float,
    fwd_s: float,
    besides: _DpBesides = (None, None, None),
) -> DataParallelComm:
    """The closed form of ``plan`` (``plansim.step.data_parallel``) for one stage: its gradient reductions and weight
    gathers, how much of them backward does not hide, and what compute loses beside them; ``price`` is ``_price_dp``
    of a collective of ``plan``, ``besides`` what the reductions, the gathers and hybrid sharding's all-reduce among
    replicas that follows each reduction (``DataParallelPlan.replicate``) take from compute beside them
    (``plansim.costs.interference``: the compute stream's rate beside each call, at its own pace).

    Overlap: the stage's layers' passes and the dp stream walked in the lowering's issue order
    (``step.data_parallel``): gradient buckets launched once backward has completed their gradients and run one
    after another, backward's end waiting for them (``bucketed_reduction``); ZeRO-3's gathers as far ahead as the
    framework prefetches and per-layer reduce-scatters (``per_layer_overlap``); compute at ``rate`` while a
    collective runs. Volumes are ZeRO's 2x (stages 1-2) and 3x (stage 3) the parameter bytes (Rajbhandari et al.
    2020, sec 7).
    """
    if plan is None:
        return DataParallelComm(0.0, 0.0, 0.0)
    m = s.num_microbatches
    reduce, gather = _rated(price, plan.reduce, besides[0]), _rated(price, plan.gather, besides[1])
    then = None
    if plan.replicate is not None:
        replicated = _rated(price, plan.replicate, besides[2])
        then = lambda n_bytes: replicated(n_bytes / plan.shard_ranks)  # noqa: E731
    if plan.per_layer:  # one gather and one reduce-scatter per layer, each a call of its own (FSDP's units)
        z = per_layer_overlap(
            plan,
            stage.forward_layers or (LayerPass(fwd_s, 0.0, stage.params),),
            stage.backward_layers or (LayerPass(backward_s, 0.0, stage.params),),
            gather,
            reduce,
            m,
            then,
        )
        return DataParallelComm(z.exposed_s, z.reduce_sent, z.gather_sent, z.interference_s, z.overlapped_s)
    t_ag, ag_sent, lead = (0.0, 0.0, None)
    if plan.gather_after_step and plan.gather_overlapped:  # under the next step's first forward, bucket by bucket
        forward = stage.forward_layers or (LayerPass(fwd_s, 0.0, stage.params),)
        walk, gathers = _first_forwards(s, plan, forward, stage)
        # a later stage's first forward waits for the pipeline's fill: at least the stage before it running its
        # first chunk's forward (taken as this stage's own), which the gathers may use
        idle = 0.0 if stage.first_stage else fwd_s / max(1, len(stage.backward_chunks))
        lead = prefetched_gathers(walk, gathers, gather, idle)
        ag_sent = lead.gather_sent
    elif plan.gather_after_step:
        t_ag, ag_sent = price(plan.gather, stage.params * plan.weight_bytes)  # exposed: nothing beside it
    layers = stage.backward_layers or (LayerPass(backward_s, 0.0, stage.params),)
    sizes = stage.backward_chunks if len(stage.backward_chunks) > 1 else (len(layers),)
    if not plan.reduce_every_microbatch:  # the last micro-batch's backward, chunk by chunk with interleaving
        layers = _last_backwards(s, layers, stage.backward_chunks)
    else:
        sizes = (len(layers),)
    chunks = _chunk_ends(plan, stage.first_stage, sizes)
    r = bucketed_reduction(plan, layers, reduce, chunks, then)
    exposed, r_sent, lost, overlapped = r.exposed_s, r.reduce_sent, r.interference_s, r.overlapped_s
    reductions = m if plan.reduce_every_microbatch else 1
    out = DataParallelComm(
        reductions * exposed + t_ag, reductions * r_sent, ag_sent, reductions * lost, reductions * overlapped
    )
    if lead is not None:
        out = replace(
            out, lead_s=lead.exposed_s, lead_interference_s=lead.interference_s, lead_overlapped_s=lead.overlapped_s
        )
    return out


def _chunk_ends(plan: DataParallelPlan, first_stage: bool, sizes: tuple[int, ...]) -> list[tuple[int, float]]:
    """(the index of each model chunk's last pass, its bucket size) in the walk ``_last_backwards`` builds from
    ``sizes`` passes per chunk (backward order: the last chunk first; a filler pass between two chunks)."""
    out, end = [], -1
    for i, n in enumerate(sizes):
        end += n + (1 if i else 0)
        out.append((end, plan.chunk_bucket_bytes(first_stage, len(sizes) - 1 - i)))
    return out


def _first_forwards(
    s: Strategy, plan: DataParallelPlan, forward: tuple[LayerPass, ...], stage: StageCost
) -> tuple[tuple[LayerPass, ...], list[tuple[int, float, int | None]]]:
    """The passes a stage runs from the step's start until its first micro-batch has been through every one of its
    model chunks, and its weight gathers (``step.data_parallel.weight_gathers``) as (the walk index of the pass that
    waits for it, bytes, the walk index at whose start it is issued: -1 the step's start, None chained). Interleaved
    1F1B's warm-up runs the first ``p`` micro-batches' forwards chunk by chunk (``pipeline_orders.interleaved_order``),
    so after the first micro-batch's forward of a chunk come the other ``p - 1`` micro-batches' forwards of that
    chunk (one filler pass), then the first's of the next. The stage's extra parameters (the tied embeddings' copy
    on the last stage) go with its last layer, whose weights the gather also brings."""
    extra = stage.params - sum(x.params for x in forward)
    if extra > 0 and forward:
        last = forward[-1]
        forward = (*forward[:-1], LayerPass(last.work_s, last.blocking_s, last.params + extra))
    sizes = stage.backward_chunks[::-1] or (len(forward),)
    walk: list[LayerPass] = []
    starts: list[int] = []
    chunk_params: list[list[float]] = []
    start = 0
    for i, n in enumerate(sizes):
        chunk = forward[start : start + n]
        start += n
        starts.append(len(walk))
        chunk_params.append([x.params for x in chunk])
        walk.extend(chunk)
        if i < len(sizes) - 1:
            work = sum(x.work_s for x in chunk) * (s.pp - 1)
            blocking = sum(x.blocking_s for x in chunk) * (s.pp - 1)
            walk.append(LayerPass(work, blocking, 0))
    gathers: list[tuple[int, float, int | None]] = []
    for g in weight_gathers(plan, stage.first_stage, chunk_params):
        issue = -1 if g.issue == START else None if g.issue == CHAINED else starts[int(g.issue)]
        gathers.append((starts[g.chunk] + g.first, g.n_bytes, issue))
    return tuple(walk), gathers


def _rated(
    price: _DpPricer, c: GroupCollective | None, beside: Beside | None
) -> Callable[[float], tuple[float, float, float]]:
    """``price`` of collective ``c`` with the compute stream's rate beside each call (``Beside.rate``)."""

    def priced(n_bytes: float) -> tuple[float, float, float]:
        assert c is not None and beside is not None, "a collective the plan issues"
        seconds, sent = price(c, n_bytes)
        return seconds, sent, beside.rate(seconds, sent)

    return priced


def _dp_besides(cluster: Cluster, s: Strategy, plan: DataParallelPlan, model: Interference) -> _DpBesides:
    """What the plan's reduction, gather and replicas' all-reduce take from compute beside them, each on its own
    group (``plansim.step.prepare.beside``; under hybrid sharding the shard group's and the replicas')."""
    mesh = mesh_of(s)

    def of(c: GroupCollective | None) -> Beside | None:
        return None if c is None else beside(cluster, mesh, model, c.axis, c.collective, c.algorithm, "nccl")

    return of(plan.reduce), of(plan.gather), of(plan.replicate)


def _embedding_sync(cluster: Cluster, s: Strategy, model: Workload) -> tuple[float, float]:
    """(seconds, bytes sent) of the all-reduce between the two copies of tied embeddings' gradients (first and last
    pipeline stage), which Megatron-LM runs after backward, before the optimizer step."""
    grad_bytes = tied_gradient_bytes(model, s)
    if not grad_bytes:
        return 0.0, 0.0
    ends = mesh_of(s).group("pp", 0)
    link = cluster.p2p_link(ends[0], ends[-1])
    nodes = 1 if cluster.node_of(ends[0]) == cluster.node_of(ends[-1]) else 2
    return _price("all_reduce", "ring", 2, grad_bytes, link, (cluster, nodes))


def _optimizer_s(kernels: KernelCostModel, s: Strategy, params: int) -> float:
    """One fused Adam step over this rank's parameters (its 1/dp share under ZeRO >= 1): memory-bound."""
    return optimizer_step_s(kernels, s, params)


def _time_breakdown(
    model: Workload, cluster: Cluster, s: Strategy, kernels: KernelCostModel, pipe: _Pipeline, shared: AnalyticCache
) -> tuple[dict[str, float], DataParallelComm, float]:
    """The step's time by part (they sum to the step time), the worst stage's DP/ZeRO traffic, and the bytes of the
    tied-embedding gradient sync. Compute, recompute and blocking communication are the bottleneck stage's."""
    m = s.num_microbatches
    bottleneck = pipe.bottleneck
    dp = shared.data_parallel(s)
    besides = (None, None, None) if dp[0] is None else _dp_besides(cluster, s, dp[0], _interference(cluster, kernels))
    comms = shared.dp_comms(s, dp, pipe.dp_groups, besides)
    # the worst stage's exposed tail; every stage's interference, since each stage's reduction slows its last
    # micro-batch's backward and those passes follow one another on the pipeline's drain (stage p-1 first); and
    # the step's start as late as the stage whose first forwards an overlapped ZeRO-1/2 gather delays most (waits
    # and compute lost beside it): the stages' warm-up forwards run side by side, so their delays do not add up
    lead = max(comms, key=lambda c: c.lead_s + c.lead_interference_s)
    # stage k's tail after its last backward is hidden by the drain behind it: stages k-1 .. 0 each run that
    # micro-batch's backward of their first chunk after it (1F1B's cooldown; Megatron-LM: "other pipeline stages do
    # grad reduction during pipeline bubble", schedules.py:2220-2224); a group's earliest stage has the least
    tails = [
        max(0.0, c.exposed_s - k * (st.bwd_s + st.recompute_s) / max(1, len(st.backward_chunks)))
        for c, st, k in zip(comms, pipe.dp_groups, pipe.dp_group_first, strict=True)
    ]
    worst = max(range(len(comms)), key=tails.__getitem__)
    dpc = replace(
        comms[worst],
        exposed_s=tails[worst],
        interference_s=sum(c.interference_s * n for c, n in zip(comms, pipe.dp_group_sizes, strict=True))
        + lead.lead_interference_s,
        overlapped_s=sum(c.overlapped_s * n for c, n in zip(comms, pipe.dp_group_sizes, strict=True))
        + lead.lead_overlapped_s,
        lead_s=lead.lead_s,
    )
    emb_s, emb_bytes = _embedding_sync(cluster, s, model)
    optimizer = [_optimizer_s(kernels, s, st.params) for st in pipe.memory_groups]
    bubble = pipe.pipe_s - pipe.send_chain_s - m * bottleneck.time_s
    # the breakdown is the busiest stage's (as the DES reports it): what the drain hides of that stage's own
    # reduction tail is, on its GPU, a wait for communication rather than the pipeline's idle time
    k = pipe.bottleneck_index
    slack = k * (bottleneck.bwd_s + bottleneck.recompute_s) / max(1, len(bottleneck.backward_chunks))
    own = comms[pipe.dp_group_of[k]].exposed_s
    hidden = min(max(0.0, min(own, slack + dpc.exposed_s) - dpc.exposed_s), max(0.0, bubble))
    breakdown = {
        "compute": m * bottleneck.compute_s,
        "recompute": m * bottleneck.recompute_s,
        "exposed_comm": m * bottleneck.comm_s + pipe.send_chain_s + dpc.exposed_s + dpc.lead_s + emb_s + hidden,
        "bubble": bubble - hidden,
        "optimizer": max(optimizer),
        "sync_wait": m * bottleneck.sync_s + _slowest_gpu_s(cluster, s, pipe, optimizer),
        "interference": m * bottleneck.interference_s + dpc.interference_s,
    }
    return breakdown, dpc, emb_bytes


def _slowest_gpu_s(cluster: Cluster, s: Strategy, pipe: _Pipeline, optimizer: list[float]) -> float:
    """What the step waits for its slowest GPU (``plansim.costs.stragglers.straggler_wait_s``): GPUs differ
    persistently, the step ends with a synchronisation of all of them, and the slowest is slow in every kernel of its
    stage (its micro-batches' compute and recompute, and its optimizer step)."""
    m = s.num_microbatches
    busy = max(
        m * (st.compute_s + st.recompute_s) + optimizer[g]
        for st, g in zip(pipe.stages, pipe.memory_group_of, strict=True)
    )
    return straggler_wait_s(cluster.gpu.gpu_to_gpu_cv, mesh_of(s).num_ranks, busy)


def _interference(cluster: Cluster, kernels: KernelCostModel) -> Interference:
    """The GPU's interference model, from the measured profile's overlap section when it has one."""
    return interference_model(cluster.gpu, kernels.table.overlap if kernels.table is not None else None)


def _assemble(
    model: Workload,
    cluster: Cluster,
    s: Strategy,
    micro_batch_flops: float,
    kernels: KernelCostModel,
    pipe: _Pipeline,
    shared: AnalyticCache,
    *,
    kernel_recompute: float = 0.0,
) -> Result:
    m = s.num_microbatches
    stages = pipe.stages
    breakdown, dpc, emb_bytes = _time_breakdown(model, cluster, s, kernels, pipe, shared)
    step = sum(breakdown.values())
    static = [static_bytes(cluster, s, st.params, st.layer_params) for st in pipe.memory_groups]
    totals = [sum(x.values()) for x in static]
    fixed = shared.fixed(s)
    peaks = [
        totals[g] + a + f + sum(fixed[i].values())
        for i, (g, a, f) in enumerate(zip(pipe.memory_group_of, pipe.activations, pipe.fragmentation, strict=True))
    ]
    worst = max(range(len(stages)), key=peaks.__getitem__)
    worst_static = dict(static[pipe.memory_group_of[worst]])
    memory = {
        **worst_static, "activations": pipe.activations[worst], "workspace": worst_static.pop("workspace"),
        **fixed[worst], "fragmentation": pipe.fragmentation[worst],
    }  # fmt: skip
    fits = peaks[worst] <= cluster.gpu.memory_bytes
    return step_result(
        model,
        cluster,
        s,
        engine="analytic",
        step_s=step,
        flops=step_flops(micro_batch_flops, pipe.recompute_matmul_flops + kernel_recompute, s),
        memory=memory,
        comm={"dp": dpc.dp_bytes + emb_bytes, "pp": m * pipe.p2p_bytes, "zero": dpc.zero_bytes}
        | {axis: m * n_bytes for axis, n_bytes in pipe.axis_bytes.items()},
        cost_model=kernels.provenance,
        fits=fits,
        peak_memory_bytes=int(peaks[worst]),
        time_breakdown_s=breakdown,
        reason="" if fits else _no_fit_reason(worst, memory, peaks[worst], cluster),
        num_microbatches=m,
        stage_peak_memory_bytes=[int(p) for p in peaks],
        overlap=overlap_figures(
            m * pipe.bottleneck.overlapped_s + dpc.overlapped_s,
            breakdown["interference"],
            _interference(cluster, kernels).source,
        ),
    )


def _no_fit_reason(stage: int, mem: dict[str, float], peak: float, cluster: Cluster) -> str:
    parts = ", ".join(f"{k} {v / GB:.1f}" for k, v in mem.items())
    return (
        f"stage {stage} needs {peak / GB:.1f} GB ({parts}) but {cluster.gpu.name} has "
        f"{cluster.gpu.memory_bytes / GB:.1f} GB"
    )
