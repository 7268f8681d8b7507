"""What the analytic engine memoizes for one model and cluster (``AnalyticCache``), each memo keyed on what its result
reads of a strategy (a ``plansim.strategy.schema.StrategyProjection``): the op graph and layer costs
(``LayerKey``), a pipeline's stages (``PipelineKey``), its sends (``SendsKey``), the model states
(``StatesKey``), the data-parallel plan (``DataParallelKey``: with what ``data_parallel_comm`` memoizes for it,
``DpMemo``), the fixed memory per stage (``FixedKey``) and the kernel cost model (``KernelKey``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from plansim.analytic.data_parallel import (
    DataParallelComm,
    DpBesides,
    DpMemo,
    DpMessage,
    DpPricer,
    Sent,
    data_parallel_comm,
    price_dp,
)
from plansim.analytic.pipeline import Pipeline, stage_layout
from plansim.analytic.stages import StageCost, StageHeld, StageSends, StageSums, interference_of, stage_sends
from plansim.costs.kernels import FP8Casts, KernelCostModel
from plansim.hardware import Cluster
from plansim.step.data_parallel import (
    DataParallelPlan,
    GroupCollective,
    data_parallel_plan,
    gathered_weight_bytes,
    grad_copy_in_bytes,
)
from plansim.step.layers import CommPricer, LayerCost, layer_costs, layer_programs
from plansim.step.memory import (
    ChunkLayers,
    LayerBytes,
    dp_all_reduces,
    fixed_bytes,
    pipeline_wraps,
    stage_expert_params,
    stage_fp8,
    stage_params,
    static_bytes,
)
from plansim.step.offload import OffloadLayer, offload_layer, offloaded_blocks
from plansim.step.prepare import (
    PreparedStep,
    build_step,
    comm_pricer,
    fp8_casts,
    kernel_model,
    kernel_rules,
    rate_beside,
    sharding_of,
    tied_copy_params,
)
from plansim.step.tp_overlap import overlap_key, tp_overlap, uses_userbuffers
from plansim.strategy.checks import check_strategy
from plansim.strategy.mesh import mesh_of
from plansim.strategy.schema import Strategy, StrategyProjection, read_with
from plansim.workload.graph import Sharding
from plansim.workload.traced import Workload


@dataclass(frozen=True)
class LayerKey(StrategyProjection):
    """What the op graph of a micro-batch (its ``Sharding``: ``step.prepare.sharding_of``), its per-layer costs
    (tensor-parallel collectives on the tp axis, which is the fastest one: its groups do not depend on dp or pp) and
    the pipeline message size read of a strategy."""

    compute_dtype: str  # the kernels' rates (the sharding has only its bytes)
    #: its framework's kernel rules: the fused attention kernel it calls, by the GPU's architecture, and the
    #: host's time to launch a kernel
    kernel_rules: tuple[object, ...] = read_with(kernel_rules)
    #: under dtype fp8, the FP8 layers' casts (recipe, weight casts per forward: ``step.prepare.fp8_casts``)
    fp8: FP8Casts | None = read_with(fp8_casts)
    #: what the op graph is built from (micro-batch, each sharded axis's degree, sequence parallelism, attention):
    #: ``step.prepare.sharding_of``, so a new sharded axis enters the key with its ``Sharding`` field
    sharding: Sharding = read_with(sharding_of)
    #: which tensor-parallel collectives overlap GEMMs: what ``step.tp_overlap.tp_overlap`` reads of the strategy
    tp_overlap: tuple[object, ...] = read_with(overlap_key)


@dataclass(frozen=True)
class KernelKey(StrategyProjection):
    """What the kernel cost model reads of a strategy (``step.prepare.kernel_model``): strategies equal here share
    one, and with it its memo of kernel times."""

    compute_dtype: str
    #: its framework's kernel rules: the fused attention kernel it calls, by the GPU's architecture, and the
    #: host's time to launch a kernel
    kernel_rules: tuple[object, ...] = read_with(kernel_rules)
    #: under dtype fp8, the FP8 layers' casts (``step.prepare.fp8_casts``)
    fp8: FP8Casts | None = read_with(fp8_casts)


@dataclass(frozen=True)
class PipelineKey(StrategyProjection):
    """What a pipeline's stages read beyond ``LayerKey``: layout, schedule, remat and, for the stage boundaries'
    links, the data-parallel degree (the pp axis's stride). ZeRO and the all-reduce do not enter."""

    remat: str
    schedule: str
    pp: int
    num_microbatches: int
    virtual_stages: int
    layer_split: tuple[int, ...] | None
    dp: int | None
    cp: int  # with dp and tp, the strides of the mesh's slower axes and the size of the gradients' group
    framework: str  # the stages' sends (``SendsKey``): its pipeline_sends rule
    #: the blocks whose activations go to the host (``step.offload``): off the stages' activation peaks
    offloaded_blocks: int = read_with(offloaded_blocks)


@dataclass(frozen=True)
class StageMemoryKey(PipelineKey):
    """What the stages' activation peaks read beyond ``PipelineKey``: the gradient buffers a unit holds for its
    reduction where its framework copies them (``step.data_parallel.grad_copy_in_bytes``: ZeRO, dp, dtypes and the
    framework's rule)."""

    grad_copy_in: tuple[int, int] = read_with(grad_copy_in_bytes)


@dataclass(frozen=True)
class SendsKey(StrategyProjection):
    """What the pipeline sends of every stage read beyond ``LayerKey`` (the pp axis's stride is tp * dp; the
    schedule also says whether the sends block)."""

    schedule: str
    pp: int
    virtual_stages: int
    dp: int | None
    cp: int  # with dp and tp, the strides of the mesh's slower axes and the size of the gradients' group
    framework: str  # its pipeline_sends rule: which schedules' sends block, and how (``step.p2p.pipeline_sends``)
    layer_split: tuple[int, ...] | None  # under FP8 delayed scaling, each chunk's amax reduction (``step.p2p``)


@dataclass(frozen=True)
class StatesKey(StrategyProjection):
    """What the stages' model states and workspace read (``AnalyticCache.model_states_exceed``)."""

    tp: int
    pp: int
    virtual_stages: int
    layer_split: tuple[int, ...] | None
    dp: int | None
    cp: int  # with dp and tp, the strides of the mesh's slower axes and the size of the gradients' group
    shard_degree: int  # the ranks ZeRO shards over (``dp_shard`` under hybrid sharding)
    zero: int
    compute_dtype: str
    fp32_grad_accum: bool
    framework: str  # whether its ZeRO-2 shards the weights (FSDP's SHARD_GRAD_OP), how far ahead its ZeRO-3 gathers
    offload: tuple[str, ...]  # the model states that live in host memory (``step.offload.on_gpu``)
    dtype: str | None  # fp8: the FP8 weight copies and scaling state (``step.memory.fp8_bytes``)
    fp8_recipe: str | None
    fp8_param_gather: bool | None
    ep: int  # the routed experts a rank holds, and with etp the expert-data-parallel group that shards their states
    expert_tp: int


@dataclass(frozen=True)
class DataParallelKey(StrategyProjection):
    """What the data-parallel plan (``step.data_parallel``) and its collectives' links read: the mesh (the dp
    group's size and stride), ZeRO, the algorithm, the gradient and weight bytes, buckets and overlap."""

    tp: int
    dp: int | None
    cp: int  # with dp and tp, the strides of the mesh's slower axes and the size of the gradients' group
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
    ep: int  # with etp: whether the experts' gradients go apart, over the expert-data-parallel group (its size, stride)
    expert_tp: int
    #: bytes per parameter its all-gathers move (1 under fp8_param_gather: ``step.data_parallel.gathered_weight_bytes``)
    weight_bytes: int = read_with(gathered_weight_bytes)


def _layer_input_read(s: Strategy) -> LayerKey | None:
    """What ``AnalyticCache.fixed`` reads for Transformer Engine's userbuffers (``step.tp_overlap.userbuffers_bytes``):
    with them, the layer key (its op graph gives the layer input's size; it holds the framework's pipelining, the
    dtype and the sharding); None without."""
    return LayerKey.of(s) if uses_userbuffers(s) else None


@dataclass(frozen=True)
class FixedKey(StrategyProjection):
    """What the CUDA context and NCCL's buffers per stage read (``step.memory.fixed_bytes``): the mesh, which
    reductions the dp and tp groups run (all-reduce or not), whether the interleaved pipeline wraps around, and
    Transformer Engine's userbuffers (one micro-batch's activation each)."""

    tp: int
    dp: int | None
    cp: int  # with dp and tp, the strides of the mesh's slower axes and the size of the gradients' group
    shard_degree: int  # hybrid sharding's two communicators in place of the dp group's (below dp: HSDP)
    pp: int
    sequence_parallel: bool  # the tp group's all-reduce (its tree) or not
    wraps: bool = read_with(pipeline_wraps)  # the interleaved pipeline's wrap-around peer
    dp_all_reduce: bool = read_with(dp_all_reduces)  # ZeRO's stage, as far as the dp group's communicator reads it
    userbuffers: LayerKey | None = read_with(_layer_input_read)


@dataclass(frozen=True)
class PricedLayers:
    """What a strategy's pricing reads that depends only on ``LayerKey`` (micro-batch, tp, sequence
    parallel, dtype, attention)."""

    prep: PreparedStep
    costs: dict[int, LayerCost]
    model_flops: float
    executed_flops: float  # what the kernels execute per micro-batch (costs.kernels.executed_flops)
    stage_sums: dict[tuple[int, ...], StageSums] = field(default_factory=dict)
    pipelines: dict[PipelineKey, Pipeline] = field(default_factory=dict)
    stage_memory: dict[StageMemoryKey, tuple[StageHeld, ...]] = field(default_factory=dict)
    stage_costs: dict[tuple, StageCost] = field(default_factory=dict)
    p2p: dict[SendsKey, list[StageSends]] = field(default_factory=dict)
    _alike: dict[tuple[LayerCost, ...], StageSums] = field(default_factory=dict)
    _bytes: dict[int, LayerBytes] = field(default_factory=dict)
    _chunk_bytes: dict[tuple[tuple[tuple[int, ...], ...], int, int, int], tuple[ChunkLayers, ...]] = field(
        default_factory=dict
    )
    _offload: dict[tuple[tuple[int, ...], int], tuple[OffloadLayer, ...]] = field(default_factory=dict)

    def offload_layers(self, layers: tuple[int, ...], num_blocks: int) -> tuple[OffloadLayer, ...]:
        """What offloading reads of a stage's layers that have a cost, forward order (``step.offload.offload_layer``
        of each); memoized (every strategy of this layout asks it per stage)."""
        key = (layers, num_blocks)
        hit = self._offload.get(key)
        if hit is None:
            costs = self.costs
            hit = self._offload[key] = tuple(offload_layer(costs[i], 0 <= i < num_blocks) for i in layers if i in costs)
        return hit

    def layer_bytes(self, layer: int) -> LayerBytes:
        """What the memory model reads of a layer's cost (``step.memory.LayerBytes``)."""
        hit = self._bytes.get(layer)
        if hit is None:
            hit = self._bytes[layer] = LayerBytes.of(self.costs[layer])
        return hit

    def stage_chunks(
        self, chunks: tuple[tuple[int, ...], ...], pp: int, virtual_stages: int, stage: int
    ) -> tuple[ChunkLayers, ...]:
        """What the memory walk reads of ``stage``'s model chunks (``step.memory.activation_peak``): per chunk
        ``c``, model chunk ``c * pp + stage`` of ``chunks`` (``pipeline.model_chunks``) as (layer, its bytes) for
        its layers that have a cost; memoized (every strategy of this layout asks it per stage)."""
        key = (chunks, pp, virtual_stages, stage)
        hit = self._chunk_bytes.get(key)
        if hit is None:
            hit = self._chunk_bytes[key] = tuple(
                tuple((i, self.layer_bytes(i)) for i in chunks[c * pp + stage] if i in self.costs)
                for c in range(virtual_stages)
            )
        return hit

    def sums(self, layers: tuple[int, ...], model: Workload) -> StageSums:
        """The sums of a layer list; lists whose layers cost alike (a pipeline's middle stages) share one."""
        hit = self.stage_sums.get(layers)
        if hit is None:
            alike = tuple(self.costs[i] for i in layers if i in self.costs)
            hit = self._alike.get(alike)
            if hit is None:
                hit = StageSums(list(layers), self.costs, model, self.prep.graph.graph["layer_input_bytes"])
                self._alike[alike] = hit
            self.stage_sums[layers] = hit
        return hit

    def p2p_of(self, cluster: Cluster, s: Strategy) -> list[StageSends]:
        """``stage_sends`` of every stage of ``s``'s pipeline, with each send's time and the compute rate beside it."""
        key = SendsKey.of(s)
        hit = self.p2p.get(key)
        if hit is None:
            model = interference_of(cluster, self.prep.kernels)
            price = _memoized(comm_pricer(cluster, s))  # the stages' received activations' gathers are alike
            hit = self.p2p[key] = [stage_sends(cluster, s, idx, self.prep.graph, model, price) for idx in range(s.pp)]
        return hit


def _memoized(price: CommPricer) -> CommPricer:
    """``price`` memoized by its arguments (it reads nothing else)."""
    memo: dict[tuple[str, str, float], tuple[float, float]] = {}

    def priced(axis: str, collective: str, n_bytes: float) -> tuple[float, float]:
        hit = memo.get((axis, collective, n_bytes))
        if hit is None:
            hit = memo[axis, collective, n_bytes] = price(axis, collective, n_bytes)
        return hit

    return priced


class AnalyticCache:
    """Memoizes, for one model and cluster, the op graph and the per-layer costs that many strategies share (those
    with equal micro-batch, tensor-parallel degree, sequence parallelism, dtype and attention), so that a planner
    pricing thousands of strategies builds each graph once. Results are exactly ``simulate_analytic``'s without a
    cache."""

    def __init__(self, model: Workload, cluster: Cluster) -> None:
        self.model, self.cluster = model, cluster
        self._priced: dict[LayerKey, PricedLayers] = {}
        self._graphs: dict[Sharding, nx.DiGraph] = {}  # op graphs by what they are built from (``build_step``)
        self._states: dict[StatesKey, int] = {}
        self._fixed: dict[FixedKey, list[dict[str, float]]] = {}
        self._problems: dict[Strategy, list[str]] = {}
        self._kernels: dict[KernelKey, KernelCostModel] = {}
        # per data-parallel key: the plan, its collectives' prices, and what ``data_parallel_comm`` memoizes for it
        self._dp_plans: dict[DataParallelKey, tuple[DataParallelPlan | None, dict[DpMessage, Sent], DpMemo]] = {}

    def data_parallel(self, s: Strategy) -> tuple[DataParallelPlan | None, DpPricer, DpMemo]:
        """``data_parallel_plan`` of a resolved strategy, a memoized ``price_dp`` of its collectives and the memo
        of ``dp_comms``."""
        key = DataParallelKey.of(s)
        hit = self._dp_plans.get(key)
        if hit is None:
            hit = self._dp_plans[key] = (data_parallel_plan(self.cluster, s), {}, DpMemo())
        plan, prices, memo = hit

        def price(c: GroupCollective, n_bytes: float) -> tuple[float, float]:
            got = prices.get((c, n_bytes))
            if got is None:
                assert plan is not None
                got = prices[(c, n_bytes)] = price_dp(self.cluster, s, plan, c, n_bytes)
            return got

        return plan, price, memo

    @staticmethod
    def dp_comms(
        s: Strategy,
        dp: tuple[DataParallelPlan | None, DpPricer, DpMemo],
        stages: list[StageCost],
        besides: DpBesides,
    ) -> list[DataParallelComm]:
        """``data_parallel_comm`` of each stage, with what it memoizes for the data-parallel key in ``dp``
        (``data_parallel(s)``; ``besides`` follow from that key and the cluster): ``DpMemo``."""
        plan, price, memo = dp
        return [
            data_parallel_comm(s, plan, price, stage, stage.bwd_s + stage.recompute_s, stage.fwd_s, besides, memo)
            for stage in stages
        ]

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
        s = strategy.resolved(self.cluster)
        if self.problems(s):  # before the cache: validity is not a matter of the key
            return None
        key = StatesKey.of(s)
        if key not in self._states:
            sharding = sharding_of(s)
            alike = (  # per-layer params: tp's, ep's and etp's
                p.costs
                for k, p in self._priced.items()
                if (k.sharding.tp, k.sharding.ep, k.sharding.etp) == (sharding.tp, sharding.ep, sharding.etp)
            )
            costs = next(alike, None) or self.priced(s).costs
            self._states[key] = max(
                sum(
                    static_bytes(
                        self.cluster, s, stage_params(layers, costs, s, self.model, idx),
                        [costs[i].params for i in layers if i in costs], stage_fp8(layers, costs),
                        stage_expert_params(layers, costs),
                    ).values()
                )
                for idx, layers in enumerate(stage_layout(self.model.layers, s.pp, s.virtual_stages, s.layer_split))
            )  # fmt: skip
        return self._states[key]

    def fixed(self, s: Strategy) -> list[dict[str, float]]:
        """``fixed_bytes`` of every stage of a resolved strategy (CUDA context, NCCL buffers)."""
        key = FixedKey.of(s)
        hit = self._fixed.get(key)
        if hit is None:
            tied = tied_copy_params(self.model, s) > 0
            layer_input = float(self.priced(s).prep.graph.graph["layer_input_bytes"]) if uses_userbuffers(s) else 0.0
            hit = self._fixed[key] = [fixed_bytes(self.cluster, s, idx, tied, layer_input) for idx in range(s.pp)]
        return hit

    def priced(self, prep_strategy: Strategy) -> PricedLayers:
        """The shared part for a resolved strategy that passed ``problems``."""
        s = prep_strategy
        key = LayerKey.of(s)
        hit = self._priced.get(key)
        if hit is None:
            from plansim.costs.kernels import executed_flops
            from plansim.workload import model_flops

            kernels = self._kernels.get(KernelKey.of(s))
            if kernels is None:
                kernels = self._kernels[KernelKey.of(s)] = kernel_model(self.cluster, s)
            prep = build_step(self.model, self.cluster, s, kernels, self._graphs)
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
            hit = PricedLayers(prep, costs, model_flops(prep.graph), executed_flops(prep.graph))
            self._priced[key] = hit
        return hit
