"""What both engines derive from (model, cluster, strategy) before pricing a step: one definition each.

``prepare_step`` checks the strategy, builds the op graph of one micro-batch on one rank of its mesh (``sharding_of``;
a traced model brings its own, ``plansim.workload.traced``) and the kernel cost model; the helpers give the Megatron-LM
quantities both engines use (pipeline message size, the tied embedding copy on the last stage, the sharded collectives'
algorithm). ``comm_pricer`` prices a layer's collectives on their mesh axis (NCCL's default call,
``plansim.costs.nccl_groups.layer_call``), ``ring_call_s`` a call of an entry NCCL runs, ``tp_overlap`` says
which tensor-parallel collectives the framework runs beside GEMMs, and ``beside`` what a collective loads the compute
beside it with (``plansim.costs.interference``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx

from plansim.costs.collectives import ALLREDUCE_ALGORITHMS, algorithm_entry, bytes_sent_per_rank, collective_time
from plansim.costs.interference import Beside, Interference, engine_load, interference_model
from plansim.costs.kernels import FP8Casts, KernelCostModel, load_kernel_table
from plansim.costs.nccl_groups import layer_call, ring_overhead_s, timed
from plansim.errors import PlansimError
from plansim.hardware import Cluster, Link
from plansim.step.comm import Comm
from plansim.step.layers import CommPricer, RateBeside, layer_algorithm
from plansim.strategy.checks import check_strategy
from plansim.strategy.frameworks import load_framework
from plansim.strategy.mesh import DeviceMesh, degrees_of, mesh_of
from plansim.strategy.schema import Strategy
from plansim.units import dtype_bytes
from plansim.workload.build import build_sharded
from plansim.workload.graph import Sharding
from plansim.workload.torch_trace import TracedModel
from plansim.workload.traced import Workload

__all__ = [
    "PreparedStep",
    "beside",
    "build_step",
    "comm_pricer",
    "fp8_casts",
    "kernel_model",
    "kernel_rules",
    "p2p_message_bytes",
    "prepare_step",
    "rate_beside",
    "ring_call_s",
    "shard_algorithm",
    "sharding_of",
    "tied_copy_params",
]


@dataclass(frozen=True)
class PreparedStep:
    """The resolved strategy, the op graph of one micro-batch on one TP rank, and the kernel cost model."""

    strategy: Strategy
    graph: nx.DiGraph
    kernels: KernelCostModel


def prepare_step(model: Workload, cluster: Cluster, strategy: Strategy) -> PreparedStep:
    """Resolve ``strategy`` (where it is not yet, ``Strategy.resolved``) and check it, then ``build_step``; raises
    ``PlansimError`` naming every violation."""
    s = strategy.resolved(cluster)
    problems = check_strategy(s, model, cluster)
    if problems:
        raise PlansimError("; ".join(problems))
    return build_step(model, cluster, s)


def build_step(
    model: Workload,
    cluster: Cluster,
    s: Strategy,
    kernels: KernelCostModel | None = None,
    graphs: dict[Sharding, nx.DiGraph] | None = None,
) -> PreparedStep:
    """The op graph and kernel model of a resolved strategy that passed ``check_strategy`` (the analytic engine
    checks once per strategy, before its cache). A traced model's graph is used as traced (the check has checked
    that the strategy fits it). ``kernels``: a kernel model for ``cluster``'s GPU and ``s``'s compute dtype to share
    (its memo of kernel times with it; ``kernel_model`` by default). ``graphs``: op graphs already built for this
    model, by the ``Sharding`` they were built from (all a builder reads), to share (no reader changes a graph)."""
    if isinstance(model, TracedModel):
        graph = model.graph
    else:
        sharding = sharding_of(s)
        graph = graphs.get(sharding) if graphs is not None else None
        if graph is None:
            graph = build_sharded(model, sharding)
            if graphs is not None:
                graphs[sharding] = graph
    return PreparedStep(s, graph, kernels if kernels is not None else kernel_model(cluster, s))


def kernel_rules(s: Strategy) -> tuple[object, ...]:
    """What ``kernel_model`` reads of ``s``'s framework: its ``attention_kernel`` and ``kernel_launch`` rules (a
    cache key, read once per framework: the planner asks it of every candidate)."""
    return _kernel_rules(s.framework)


@lru_cache(maxsize=16)
def _kernel_rules(framework: str) -> tuple[object, ...]:
    rules = load_framework(framework).rules
    attention, launch = rules.attention_kernel.value, rules.kernel_launch.value
    return (attention.default, *sorted(attention.by_architecture.items()), launch.mode, launch.host_s)


def fp8_casts(s: Strategy) -> FP8Casts | None:
    """How ``s``'s FP8 linear layers cast (``dtype: fp8``; None otherwise): its recipe and how often a forward casts
    a weight, once a step (a ``1 / num_microbatches`` share of each micro-batch's forward) where its framework caches
    the FP8 weight across micro-batches (its ``fp8`` rule's ``weight_cast_once_per_step``), else at every forward.
    A strategy's cache key (``plansim.analytic.cache``): what the kernel model reads of it besides the dtype."""
    if not s.fp8:
        return None
    rule = load_framework(s.framework).rules.fp8.value
    recipe = s.fp8_recipe or rule.default
    assert recipe is not None, "checked: the framework trains in FP8"
    return FP8Casts(recipe, 1.0 / s.num_microbatches if rule.weight_cast_once_per_step else 1.0)


def kernel_model(cluster: Cluster, s: Strategy) -> KernelCostModel:
    """The kernel cost model of ``s`` on ``cluster``: its GPU, its measured kernel table if any, the strategy's
    compute dtype and the fused attention kernel its framework calls on that GPU (its ``attention_kernel`` rule by the
    GPU's architecture), the host's time to launch a kernel (its ``kernel_launch`` rule) and under ``dtype: fp8``
    its FP8 casts (``fp8_casts``): all it reads of the strategy."""
    rules = load_framework(s.framework).rules
    kernel = rules.attention_kernel.value.kernel_for(cluster.gpu.architecture)
    return KernelCostModel(
        cluster.gpu,
        s.compute_dtype,
        load_kernel_table(cluster.gpu.name),
        attention_kernel=kernel,
        host_s=rules.kernel_launch.value.host_s,
        fp8=fp8_casts(s),
    )


def sharding_of(s: Strategy) -> Sharding:
    """What one rank of ``s`` runs of a micro-batch, as the op-graph builders read it (``plansim.workload.build``):
    the micro-batch, each sharded dimension's degree and mesh axis (``plansim.strategy.mesh``), sequence
    parallelism, the activations' bytes and how attention runs. The one place a strategy becomes a ``Sharding``: the
    analytic engine's layer cache keys on what it reads (``plansim.analytic.cache.LayerKey``)."""
    degrees = degrees_of(s)
    return Sharding(
        micro_batch=s.micro_batch,
        tp=degrees["tp"],
        tp_axis="tp",
        sequence_parallel=s.sequence_parallel,
        act_bytes=dtype_bytes(s.compute_dtype),
        attention=s.attention,
        cp=degrees["cp"],
        cp_axis="cp",
        cp_algorithm=(s.cp_algorithm or "ring") if degrees["cp"] > 1 else "ring",
        ep=s.ep,
        ep_axis="ep",
        etp=s.expert_tp,
        etp_axis="etp",
        fp8_linears=s.fp8,
    )


def p2p_message_bytes(graph: nx.DiGraph, s: Strategy) -> float:
    """Bytes one rank sends per pipeline boundary and micro-batch: Megatron's scatter/gather optimization sends
    1/tp of the activation per rank (Narayanan et al. 2021, sec 4.1); with sequence parallelism it is already split."""
    return float(graph.graph["layer_input_bytes"]) / (s.tp if s.tp > 1 and not s.sequence_parallel else 1)


def tied_copy_params(model: Workload, s: Strategy) -> int:
    """Megatron-LM keeps a copy of tied word embeddings (vocab-parallel: ceil(V/tp) rows) on the last stage when
    pp > 1; 0 when there is none. A traced model's copy is its ``tied_params`` (tp = 1: whole tensors)."""
    if isinstance(model, TracedModel):
        return model.tied_params if s.pp > 1 else 0
    if s.pp <= 1 or not model.tied_embeddings:
        return 0
    return math.ceil(model.vocab / s.tp) * model.hidden


def shard_algorithm(s: Strategy) -> str:
    """The algorithm of ZeRO's reduce-scatter and all-gather beside the DP all-reduce (its entry's ``sharded_with``:
    butterflies beside a butterfly, else rings)."""
    return ALLREDUCE_ALGORITHMS[s.dp_algorithm].sharded_with


def comm_pricer(cluster: Cluster, s: Strategy) -> CommPricer:
    """Prices one blocking collective of a layer on the link of the mesh's group along its axis, as NCCL runs it by
    default (``costs.nccl_groups.layer_call``: the ring, the tree, or NVLS for an all-reduce within an NVLS node,
    as NCCL's own model picks): ``(axis, collective, message bytes) -> (seconds, bytes this rank sends)``."""
    mesh = mesh_of(s)
    links: dict[str, Link] = {}
    spans: dict[str, tuple[int, Link, Link] | tuple[()]] = {}

    def price(axis: str, collective: str, n_bytes: float) -> tuple[float, float]:
        p = mesh.size(axis)
        if p <= 1 or n_bytes <= 0:
            return 0.0, 0.0
        link = links.get(axis)
        if link is None:
            link = links[axis] = mesh.link(axis, cluster)
        algorithm = layer_algorithm(collective)
        if algorithm != "ring":  # outside NCCL's tuning model: the schedule's alpha-beta time on the group's link
            placed = spans.get(axis)
            if placed is None:
                placed = spans[axis] = _placed_links(cluster, mesh, axis, collective, algorithm)
            if placed:  # across nodes, each transfer on the link it crosses (an all-to-all's: NVLink or the NIC)
                local, intra, inter = placed
                seconds = collective_time(
                    collective, algorithm, p, n_bytes, intra.latency_s, intra.bandwidth_Bps,
                    inter=(inter.latency_s, inter.bandwidth_Bps), local=local,
                )  # fmt: skip
            else:
                seconds = collective_time(collective, algorithm, p, n_bytes, link.latency_s, link.bandwidth_Bps)
            return seconds, bytes_sent_per_rank(collective, algorithm, p, n_bytes)
        nodes = p // mesh.local_size(axis, cluster.gpus_per_node)
        call = layer_call(cluster, collective, p, nodes, n_bytes, link.bandwidth_Bps)
        if call.algorithm == "ring":
            seconds = ring_call_s(cluster, collective, p, nodes, n_bytes, link)
            return seconds, bytes_sent_per_rank(collective, "ring", p, n_bytes)
        assert call.overhead_s is not None
        return call.sent_factor * n_bytes / link.bandwidth_Bps + call.overhead_s, call.sent_factor * n_bytes

    return price


def _placed_links(
    cluster: Cluster, mesh: DeviceMesh, axis: str, collective: str, algorithm: str
) -> tuple[int, Link, Link] | tuple[()]:
    """(ranks per node, the node-local link, one rank's inter-node link: its NIC share) of a layer's collective on
    ``axis`` whose algorithm prices each transfer on the link it crosses (its entry ``reads_local``: an all-to-all)
    where the group spans nodes; ``()`` where it does not (one node: the group's link prices it, as before)."""
    if not algorithm_entry(collective, algorithm).reads_local:
        return ()
    local, intra, inter = mesh.split_links(axis, cluster)
    return () if inter is None else (local, intra, inter)


def ring_call_s(
    cluster: Cluster, collective: str, p: int, nodes: int, n_bytes: float, link: Link, algorithm: str = "ring"
) -> float:
    """Seconds of one NCCL call among ``p`` ranks on ``nodes`` nodes with ``algorithm`` (a registry entry with an
    ``nccl`` mode: ``ring``, or ``nccl`` for the call NCCL's tuner picks): its schedule's bytes at ``link``'s bus
    bandwidth plus what NCCL adds to them (``plansim.costs.nccl_groups.ring_overhead_s``: the call's fixed cost,
    synchronisations growing with ranks and nodes, small messages' protocols); the alpha-beta latency where the node
    has no NCCL figures."""
    mode = algorithm_entry(collective, algorithm).nccl
    assert mode is not None, f"{collective} {algorithm} is not an NCCL call"
    overhead = ring_overhead_s(cluster, collective, p, nodes, n_bytes, link.bandwidth_Bps, mode)
    if overhead is None:
        return collective_time(collective, algorithm, p, n_bytes, link.latency_s, link.bandwidth_Bps)
    return collective_time(collective, algorithm, p, n_bytes, 0.0, link.bandwidth_Bps) + overhead


def beside(
    cluster: Cluster, mesh: DeviceMesh, model: Interference, axis: str, collective: str, algorithm: str, engine: str
) -> Beside:
    """What a collective of ``algorithm`` on ``mesh``'s ``axis``, moved by ``engine`` (``Comm.engine``), takes from
    the compute beside it (``plansim.costs.interference``): the engine's load on the axis's group at the group's link
    rate, paced by each call's own time where the node times NCCL's calls and NCCL runs it (an entry with an
    ``nccl`` mode; a layer's collective, a ``ring`` NCCL runs as it picks). Both engines ask it."""
    size, stride = mesh.size(axis), mesh.stride(axis)
    load = engine_load(cluster, size, stride, engine)
    if size <= 1:
        return Beside(model, load, 0.0, False)
    nccl = engine == "nccl" and timed(cluster) and algorithm_entry(collective, algorithm).nccl is not None
    return Beside(model, load, mesh.link(axis, cluster).bandwidth_Bps, nccl)


def rate_beside(cluster: Cluster, s: Strategy, kernels: KernelCostModel) -> RateBeside:
    """The compute stream's rate beside a layer's asynchronous collective under ``s`` of ``seconds`` that sends
    ``sent`` bytes (``beside``), as the discrete-event engine slows compute beside its ``tp`` stream."""
    mesh = mesh_of(s)
    model = interference_model(cluster.gpu, kernels.table.overlap if kernels.table is not None else None)

    def rate(comm: Comm, seconds: float, sent: float) -> float:
        group = beside(cluster, mesh, model, comm.axis, comm.collective, comm.algorithm, comm.engine)
        return group.rate(seconds, sent)

    return rate
