"""What a pipeline stage holds for the whole step, defined once for both engines: its parameters (the tied
embedding copy included), its model states and workspace, and the ``remat: milp`` schedule of each stage, which is
budgeted from them; and its activations allocation by allocation (``layer_memory``: what each layer's forward,
recompute and backward allocate and free, with what the caching allocator reserves for each), which the lowering
allocates pass by pass and the analytic engine walks over the stage's schedule (``activation_peak``).

It also holds what a real run loses beside the tensors (``fixed_bytes``): the CUDA context (the GPU profile's
``cuda_context_bytes``) and NCCL's buffers for the communicators the stage's ranks belong to
(``plansim.costs.nccl_memory``, from the node profile's ``nccl`` channels), which both engines hold static; and the
caching allocator's block rounding of each activation allocation (``plansim.costs.allocator``), category
``fragmentation``.

Sources: ZeRO's model-state formulas (Rajbhandari et al. 2020, sec 3 and 5, via ``plansim.costs.memory``); the
tied-embedding copy on Megatron-LM's last stage (``plansim.step.prepare.tied_copy_params``); NCCL's buffers
(NVIDIA/nccl at 5067397c, see ``plansim.costs.nccl_memory``); PyTorch's caching allocator
(``c10/cuda/CUDACachingAllocator.cpp``, see ``plansim.costs.allocator``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import NamedTuple, Protocol

from plansim.costs.allocator import reserved_bytes
from plansim.costs.memory import model_state_bytes
from plansim.costs.nccl_groups import connected_algorithms
from plansim.costs.nccl_memory import Communicator, NcclChannels, communicator_bytes
from plansim.costs.remat_policies import REMAT_POLICIES, weight_grad_kept
from plansim.hardware import Cluster
from plansim.pipeline.runs import Node, order_runs
from plansim.pipeline.schedules import get_schedule
from plansim.step.data_parallel import (
    gathered_weight_bytes,
    gathers_per_layer,
    param_prefetch,
    sharded_params_are_master,
    weights_kept_through_step,
)
from plansim.step.layers import LayerCost, LayerProgram
from plansim.step.offload import host_bytes, offloaded_blocks, on_gpu
from plansim.step.prepare import tied_copy_params
from plansim.step.tp_overlap import userbuffers_bytes
from plansim.strategy.frameworks import ParamPrefetch, load_framework
from plansim.strategy.mesh import EXPERT_GRAD_AXES, GRAD_AXES, mesh_of
from plansim.strategy.schema import Strategy
from plansim.workload.traced import Workload

__all__ = [
    "FIXED_CATEGORIES",
    "FP8_CATEGORIES",
    "LayerBytes",
    "LayerMemory",
    "PassProfile",
    "Sized",
    "activation_peak",
    "backward_workspace",
    "chunk_memory",
    "communicators",
    "dp_all_reduces",
    "ends_saved",
    "expert_shard_degree",
    "fixed_bytes",
    "fp8_bytes",
    "fp8_categories",
    "host_states",
    "layer_memory",
    "model_states",
    "offload_activations",
    "offloaded_activations",
    "pass_profiles",
    "pipeline_wraps",
    "stage_expert_params",
    "stage_fp8",
    "stage_params",
    "static_bytes",
    "with_grad_buffers",
]

#: The memory categories a real run holds beside the tensors torch's allocator counts: the CUDA context and NCCL's
#: buffers (static, per stage), and the allocator's rounding of the activations (``fragmentation``).
FIXED_CATEGORIES = ("cuda_context", "nccl", "userbuffers")


class _HasParams(Protocol):
    @property
    def params(self) -> float: ...


class _HasFP8(Protocol):
    @property
    def fp8_params(self) -> float: ...
    @property
    def fp8_linears(self) -> int: ...


class _HasExperts(Protocol):
    @property
    def expert_params(self) -> float: ...


#: The memory categories of FP8 training (``dtype: fp8``), in a Result only under it: the FP8 copies of the linear
#: layers' weights and their scaling state (``fp8_bytes``).
FP8_CATEGORIES = ("fp8_weights", "fp8_scaling")

#: Bytes per element of the scales a block recipe keeps beside one FP8 copy of a weight: Float8BlockScaling's 128x128
#: tiles (one fp32 each), MXFP8's 32-element blocks (one E8M0 byte each) (transformer_engine/common/recipe/
#: __init__.py:337-420 at NVIDIA/TransformerEngine d0067d0d); one scale a tensor under the per-tensor recipes.
_WEIGHT_SCALE_BYTES = {"delayed": 0.0, "current": 0.0, "block": 4 / (128 * 128), "mxfp8": 1 / 32}

#: Scaling-state tensors one FP8 linear layer keeps: its forward's input, weight and output and its backward's output
#: and input gradients (Transformer Engine's FP8 meta, module/base.py: ``num_fp8_tensors`` 3 forward, 2 backward).
_FP8_META_TENSORS = 5


def fp8_categories(s: Strategy) -> tuple[str, ...]:
    """The FP8 memory categories a Result of ``s`` reports: ``FP8_CATEGORIES`` under ``dtype: fp8``, else none."""
    return FP8_CATEGORIES if s.fp8 else ()


def stage_expert_params(layers: Sequence[int], costs: Mapping[int, _HasExperts]) -> float:
    """The routed experts' parameters a stage holds on one rank (its layers' ``expert_params``)."""
    return sum(costs[i].expert_params for i in layers if i in costs)


def expert_shard_degree(s: Strategy) -> int:
    """The ranks ZeRO shards the routed experts' states over: the expert-data-parallel group (``EXPERT_GRAD_AXES``:
    ``edp``, which regroups one stage's, or under hybrid sharding one replica's, ranks), as Megatron-LM's DDP keeps
    expert parameters in buffers of their own over its expert-data-parallel group
    (``megatron/core/distributed/distributed_data_parallel.py:282-329`` at d98e8a64, ``intra_expt_dp_group``) and
    its distributed optimizer shards each buffer over that buffer's group."""
    return mesh_of(s).size(EXPERT_GRAD_AXES["dp_shard" if s.hybrid_shard else "dp"])


def stage_fp8(layers: Sequence[int], costs: Mapping[int, _HasFP8]) -> tuple[float, int]:
    """The weight elements of a stage's FP8 linear layers on one rank and how many there are (its layers'
    ``LayerCost`` or ``LayerProgram``)."""
    return (
        sum(costs[i].fp8_params for i in layers if i in costs),
        sum(costs[i].fp8_linears for i in layers if i in costs),
    )


def fp8_bytes(s: Strategy, fp8: tuple[float, int]) -> dict[str, float]:
    """What FP8 training holds for the whole step beside the bf16 model states, for a stage whose FP8 linear layers
    hold ``fp8`` (weight elements, layers; ``stage_fp8``); empty without ``dtype: fp8``:

    * ``fp8_weights``: Transformer Engine's cached FP8 weight, row-wise (the forward GEMM's) and column-wise (the
      transpose the input-gradient GEMM reads on Hopper), 1 B an element each with a block recipe's scales, kept
      across micro-batches (module/linear.py:466-488 at d0067d0d: ``columnwise_usage`` when the input needs a
      gradient, the workspace cached under ``is_first_microbatch``). Under ``fp8_param_gather`` the parameter itself
      is the FP8 row-wise copy and its transpose takes the bf16 weight's other byte: nothing beside the weights.
      Under ZeRO-3 the weights are gathered and cast layer by layer (torchao casts inside each forward,
      torchtitan docs/float8.md:45-47): the FP8 copy lives with the gathered layer, not counted here.
    * ``fp8_scaling``: each layer's scaling state, ``_FP8_META_TENSORS`` tensors of an amax history (the framework's
      ``amax_history_len`` under delayed scaling, one amax otherwise) and a scale and its inverse, 4 B each.
    """
    if not s.fp8:
        return {}
    params, linears = fp8
    recipe = load_framework(s.framework).rules.fp8.value
    name = s.fp8_recipe or recipe.default or "delayed"
    cached = not s.fp8_param_gather and s.zero < 3
    weights = params * 2 * (1 + _WEIGHT_SCALE_BYTES[name]) if cached else 0.0
    history = recipe.amax_history_len if name == "delayed" else 1
    scaling = linears * _FP8_META_TENSORS * (history + 2) * 4.0
    return {"fp8_weights": weights, "fp8_scaling": scaling}


def stage_params(layers: Sequence[int], costs: Mapping[int, _HasParams], s: Strategy, model: Workload, idx: int) -> int:
    """Parameters stage ``idx`` holds on one rank: its layers' (``LayerCost`` or ``LayerProgram``), plus the
    tied-embedding copy on the last stage."""
    params = round(sum(costs[i].params for i in layers if i in costs))
    return params + (tied_copy_params(model, s) if idx == s.pp - 1 else 0)


def ends_saved(
    layers: Sequence[int], costs: dict[int, LayerCost], ends_in_flight: tuple[float, float], model: Workload
) -> float:
    """Activations of the embedding and output layer on this stage, every micro-batch in flight there included
    (``ends_in_flight``: the schedule's micro-batches in flight at the first and the last chunk)."""
    first, last = ends_in_flight
    return sum(
        costs[i].saved_bytes * (first if i < 0 else last) for i in layers if not 0 <= i < model.layers and i in costs
    )


def _channels(cluster: Cluster) -> NcclChannels | None:
    """The node profile's NCCL channels, with the channels per network peer that NCCL derives from the NICs
    (``src/graph/paths.cc`` ``ncclTopoGetNchannels``: one per local NIC at least, and ``ceil(NIC GB/s / 14)``).
    None on an AMD GPU: RCCL's buffers are not NCCL's (its LL and LL128 buffers are sized for 256 threads, ROCm/rccl
    0cbce2a7 src/include/device.h:68-87, init.cc:837-839, and its allocations are not cuMem's), so they are not
    counted, as on a node without an ``nccl`` section; its channel counts still say what RCCL holds of compute."""
    setup = cluster.node.nccl
    if setup is None or cluster.gpu.vendor != "nvidia":
        return None
    nics = cluster.node.nics
    per_gpu = max(1, nics.count // cluster.gpus_per_node)
    net = max(per_gpu, math.ceil(nics.bandwidth_Bps / 1e9 / 14))
    return NcclChannels(setup.channels, setup.p2p_channels_per_peer, setup.nvls_channels, net, cluster.gpus_per_node)


def dp_all_reduces(s: Strategy) -> bool:
    """Whether the data-parallel group all-reduces the gradients (ZeRO-0) rather than reduce-scatters them: what
    ``communicators`` reads of the ZeRO stage (NCCL runs a tree only for an all-reduce, PAT only for the others)."""
    return s.zero == 0


def pipeline_wraps(s: Strategy) -> bool:
    """Whether the pipeline's last stage sends to its first (interleaving: the last chunk's stage feeds the next
    chunk's first): what ``communicators`` reads of the virtual stages."""
    return s.virtual_stages > 1


#: What a group's calls are: all-reduces, or all-gathers and reduce-scatters (sharded data, ZeRO, sequence
#: parallelism).
ALL_REDUCE = ("all_reduce",)
SHARDED = ("all_gather", "reduce_scatter")


def communicators(cluster: Cluster, s: Strategy, stage: int, tied: bool) -> list[Communicator]:
    """The NCCL communicators a rank of pipeline stage ``stage`` uses in the step, each with the algorithms its calls
    run (``plansim.costs.nccl_groups.connected_algorithms``: NCCL connects an algorithm at its first call): its tp
    group (all-reduces, or with sequence parallelism all-gathers and reduce-scatters), its dp group (all-reduces
    under ZeRO-0, else all-gathers and reduce-scatters; under hybrid sharding its shard group and its replicas'
    all-reduce group in its place), one point-to-point pair per pipeline neighbour (interleaving wraps the last stage
    to the first) and, with tied embeddings (``tied``) on the first and last stage, Megatron-LM's embedding group of
    those two (an all-reduce)."""
    mesh = mesh_of(s)
    gpn = cluster.gpus_per_node
    first = mesh.rank(pp=stage)

    def group(name: str, ranks: int, local: int, calls: tuple[str, ...]) -> Communicator:
        algorithms = connected_algorithms(cluster, calls, ranks, -(-ranks // max(1, local)))
        return Communicator(name, ranks, local, algorithms=algorithms)

    out = [group("tp", s.tp, mesh.local_size("tp", gpn), SHARDED if s.sequence_parallel else ALL_REDUCE)]
    if s.hybrid_shard:
        shard, replicate = GRAD_AXES["dp_shard"], GRAD_AXES["dp_replicate"]
        out += [
            group("dp_shard", mesh.size(shard), mesh.local_size(shard, gpn), SHARDED),
            group("dp_replicate", mesh.size(replicate), mesh.local_size(replicate, gpn), ALL_REDUCE),
        ]
    else:
        axis = GRAD_AXES["dp"]
        calls = ALL_REDUCE if dp_all_reduces(s) else SHARDED
        out.append(group("dp", mesh.size(axis), mesh.local_size(axis, gpn), calls))
    if s.cp > 1:  # the ring's sends to the next context-parallel rank and receives from the previous one; the
        # all-to-all's, to and from every other rank of the group (NCCL's grouped sends and receives)
        steps = (-1, +1) if s.cp_algorithm != "all_to_all" else range(1, s.cp)
        for peer in sorted({mesh.shift("cp", first, step) for step in steps} - {first}):
            out.append(Communicator("cp", 2, 2 if peer // gpn == first // gpn else 1, algorithms=(), p2p=True))
    if s.pp > 1:
        wraps = pipeline_wraps(s)
        peers = {
            mesh.shift("pp", first, step)
            for step, present in ((-1, stage > 0 or wraps), (+1, stage < s.pp - 1 or wraps))
            if present
        }
        for peer in sorted(peers - {first}):
            out.append(Communicator("pp", 2, 2 if peer // gpn == first // gpn else 1, algorithms=(), p2p=True))
        if tied and stage in (0, s.pp - 1):
            last = mesh.rank(pp=s.pp - 1 if stage == 0 else 0)
            out.append(group("embedding", 2, 2 if last // gpn == first // gpn else 1, ALL_REDUCE))
    return out


def fixed_bytes(
    cluster: Cluster, s: Strategy, stage: int, tied: bool, layer_input_bytes: float = 0.0
) -> dict[str, float]:
    """What a rank of ``stage`` holds beside its tensors for the whole run, by category (``FIXED_CATEGORIES``):
    the CUDA context, NCCL's buffers of its communicators (0 where the node profile names no NCCL channels) and,
    with ``tp_comm_overlap``, Transformer Engine's userbuffers (``plansim.step.tp_overlap.userbuffers_bytes`` of
    ``layer_input_bytes``, one block's input on this rank)."""
    channels = _channels(cluster)
    nccl = (
        0 if channels is None else sum(communicator_bytes(c, channels) for c in communicators(cluster, s, stage, tied))
    )
    userbuffers = userbuffers_bytes(s, layer_input_bytes)
    return {"cuda_context": float(cluster.gpu.cuda_context_bytes), "nccl": float(nccl), "userbuffers": userbuffers}


def backward_workspace(blocks: Sequence[int], costs: Mapping[int, LayerCost]) -> float:
    """The most bytes one block's backward allocates for its length only (a fused attention kernel's accumulators:
    ``LayerCost.bwd_workspace_bytes``); one block's backward runs at a time."""
    return max((costs[i].bwd_workspace_bytes for i in blocks if i in costs), default=0.0)


def model_states(
    cluster: Cluster, s: Strategy, params: float, fp8: tuple[float, int] = (0.0, 0), experts: float = 0.0
) -> dict[str, float]:
    """What a rank holding ``params`` keeps on its GPU for the whole step, by memory category: its weights,
    gradients and optimizer states under the strategy's ZeRO stage, less what it offloads to the host
    (``step.offload.on_gpu``), and the device's workspace reserve; under ``dtype: fp8`` the FP8 weight copies and
    scaling state of its FP8 linear layers (``fp8``: ``fp8_bytes``). The DES holds these static and allocates
    ZeRO-3's gathered layers as they are gathered; the analytic engine adds those (``static_bytes``). ``experts``: of
    ``params``, the routed experts', sharded over the expert-data-parallel group (``expert_shard_degree``)."""
    states = _states(s, params, experts)
    return {
        **(on_gpu(s, states) if s.offload else states),
        "workspace": float(cluster.gpu.workspace_reserve_bytes),
        **fp8_bytes(s, fp8),
    }


def host_states(s: Strategy, params: float, activations: float, experts: float = 0.0) -> dict[str, float]:
    """What a rank holding ``params`` (``experts`` of them routed experts') keeps in host memory
    (``step.offload.host_bytes``), ``activations`` the offloaded blocks' saved bytes of one micro-batch
    (``offloaded_activations``)."""
    return host_bytes(s, _states(s, params, experts), params, activations)


def _states(s: Strategy, params: float, experts: float = 0.0) -> dict[str, float]:
    """The weights, gradients and optimizer states a rank holding ``params`` keeps under the strategy's ZeRO stage,
    wherever they live: ``experts`` of them (the routed experts') sharded over the expert-data-parallel group, the
    rest over the gradients' group (``shard_degree``)."""
    shard = expert_shard_degree(s) if experts else s.shard_degree
    if shard == s.shard_degree:  # one group shards them all (a dense model; ep = 1 with etp = tp)
        return _sharded_states(s, params, s.shard_degree)
    dense, expert = _sharded_states(s, params - experts, s.shard_degree), _sharded_states(s, experts, shard)
    return {k: dense[k] + expert[k] for k in dense}


def _sharded_states(s: Strategy, params: float, shard: int) -> dict[str, float]:
    states = model_state_bytes(
        params,
        shard,
        1 if weights_kept_through_step(s) else s.zero,  # weights and gradients whole through the step
        mixed_precision=s.mixed_precision,
        fp32_grad_accum=s.grads_fp32,
        weights_sharded=gathers_per_layer(s),
        master_in_weights=sharded_params_are_master(s),
    )
    return {"weights": states.weights, "gradients": states.gradients, "optimizer": states.optimizer}


def offload_activations(s: Strategy, chunk: ChunkLayers, num_blocks: int) -> ChunkLayers:
    """A chunk's layers with the first ``step.offload.offloaded_blocks`` blocks' saved activations off the GPU
    between forward and backward: what each saves is live only while its forward runs (it is copied out as it is
    made) and again while its backward runs (copied back into a buffer its backward frees): its ``transient`` and
    its ``workspace``. Activation offloading runs without recomputation (the checks), where a block stores all it
    saves. The chunk as it is without activation offloading."""
    n = offloaded_blocks(s)
    if n <= 0:
        return chunk
    return tuple((i, _off_gpu(b) if 0 <= i < min(n, num_blocks) else b) for i, b in chunk)


def offloaded_activations(s: Strategy, chunk: ChunkLayers, num_blocks: int) -> float:
    """The saved bytes per micro-batch of a chunk's blocks whose activations go to the host (``chunk`` as it is
    before ``offload_activations``)."""
    n = min(offloaded_blocks(s), num_blocks)
    if n <= 0:
        return 0.0
    return sum(b.saved for i, b in chunk if 0 <= i < n)


def _off_gpu(b: LayerBytes) -> LayerBytes:
    moved = b.saved
    return b._replace(
        saved=0.0,
        selective=0.0,
        wgrad=0.0,
        saved_reserved=0.0,
        selective_reserved=0.0,
        wgrad_reserved=0.0,
        transient=b.transient + moved,
        workspace=b.workspace + moved,
    )


@lru_cache(maxsize=4096)
def gathered_at_once(prefetch: ParamPrefetch, layer_params: tuple[float, ...]) -> float:
    """The most parameters ZeRO-3 holds gathered at once on a stage whose layers hold ``layer_params`` (forward
    order): a layer in use with the layers ``prefetch`` keeps ahead of it, in forward or in backward order.

    >>> gathered_at_once(ParamPrefetch(layers=1), (4.0, 1.0, 1.0, 3.0))
    5.0
    """
    return max(
        (
            sum(order[pos : pos + 1 + ahead])
            for order in (layer_params, layer_params[::-1])
            for pos, ahead in enumerate(prefetch.windows(order))
        ),
        default=0.0,
    )


def static_bytes(
    cluster: Cluster,
    s: Strategy,
    params: float,
    layer_params: Sequence[float],
    fp8: tuple[float, int] = (0.0, 0),
    experts: float = 0.0,
) -> dict[str, int]:
    """``model_states`` in whole bytes, ZeRO-3's weights with the gathered layers in flight (the one in use and those
    the framework prefetches, ``FrameworkRules.param_prefetch``, as the DES's gathers hold them: ``gathered_at_once``
    of ``layer_params``, the stage's layers' parameters in forward order); FSDP's SHARD_GRAD_OP keeps every layer it
    gathered in forward until that layer's backward, so at the end of forward, where the activations peak too, the
    stage's weights are all gathered. ``experts``: of ``params``, the routed experts' (``model_states``); ASSUMPTION:
    a gathered layer counts its experts too, as where their group shards them (edp > 1)."""
    states = model_states(cluster, s, params, fp8, experts)
    gathering = gathers_per_layer(s) and s.shard_degree > 1
    held = params
    if s.zero >= 3:
        prefetch = param_prefetch(s)
        held = min(params, gathered_at_once(prefetch, tuple(layer_params)))
    gathered = held * gathered_weight_bytes(s) if gathering else 0.0
    return {
        "weights": round(states["weights"] + gathered),
        "gradients": round(states["gradients"]),
        "optimizer": round(states["optimizer"]),
        "workspace": int(states["workspace"]),
        **{k: round(v) for k, v in states.items() if k in FP8_CATEGORIES},
    }


# -- activations, allocation by allocation ----------------------------------------------------------------------------


class LayerBytes(NamedTuple):
    """What the memory model reads of one layer, per micro-batch (``LayerCost`` or ``LayerProgram``): its saved
    bytes (``selective`` of them by the rerun ops, ``wgrad`` the weight GEMMs' inputs), each with what the caching
    allocator reserves for them (``*_reserved``, each op's tensor rounded), the bytes live only while its forward runs
    (``transient``) and its backward's workspace; ``op_kept``: the outputs a per-op remat policy keeps; and, where
    the framework copies a unit's gradients into a flat buffer for their reduction (``with_grad_buffers``), its
    unsharded ``grads`` (from its weight gradients' pass to the copy) and that ``reduce_input`` (from the copy to the
    next unit's)."""

    saved: float
    selective: float
    wgrad: float
    transient: float
    workspace: float
    saved_reserved: float
    selective_reserved: float
    wgrad_reserved: float
    op_kept: float = 0.0
    op_kept_reserved: float = 0.0
    grads: float = 0.0
    reduce_input: float = 0.0

    @classmethod
    def of(cls, layer: LayerCost | LayerProgram) -> LayerBytes:
        if isinstance(layer, LayerCost):
            return cls(layer.saved_bytes, layer.selective_saved_bytes, layer.wgrad_saved_bytes, layer.transient_bytes,
                       layer.bwd_workspace_bytes, layer.saved_reserved_bytes, layer.selective_saved_reserved_bytes,
                       layer.wgrad_saved_reserved_bytes, layer.sac_kept_bytes,
                       layer.sac_kept_reserved_bytes)  # fmt: skip
        return cls(layer.saved, layer.selective_saved, layer.wgrad_saved, layer.transient, layer.bwd_workspace,
                   layer.saved_reserved, layer.selective_saved_reserved, layer.wgrad_saved_reserved, layer.sac_kept,
                   layer.sac_kept_reserved)  # fmt: skip


class Sized(NamedTuple):
    """An allocation's bytes and what the caching allocator reserves for it."""

    n: float
    reserved: float


_NOTHING = Sized(0.0, 0.0)


class LayerMemory(NamedTuple):
    """What one layer allocates per micro-batch, as the lowering names it (``plansim.des.lower``): ``stored`` (``a/``,
    forward to backward) and ``kept`` (``k/``, forward to the weight-gradient pass under a split backward) at its
    forward; ``transient`` (``w/``, what its forward makes and does not keep, and the loss's logits) for its forward
    only; ``rebuilt`` (``r/``, to its backward) and ``rebuilt_kept`` (``rk/``, to its W) by its recompute, where
    ``rebuilds``; ``workspace`` (``ws/``) for its backward only."""

    stored: Sized
    kept: Sized
    transient: Sized
    rebuilt: Sized
    rebuilt_kept: Sized
    workspace: Sized
    rebuilds: bool


def _part(n: float, whole: float, whole_reserved: float) -> float:
    """What the allocator reserves for ``n`` bytes out of tensors of ``whole`` bytes it reserves ``whole_reserved``
    for: all of them when ``n`` is all of them (the exact rounding), else their average share."""
    if n <= 0:
        return 0.0
    if n >= whole:
        return whole_reserved + (n - whole)
    return n * whole_reserved / whole


def layer_memory(
    remat: str,
    b: LayerBytes,
    layer_input: float,
    *,
    block: bool,
    segment_start: bool,
    split: bool,
    milp: tuple[float, float, bool] | None = None,
) -> LayerMemory:
    """``LayerMemory`` of a layer under ``remat`` (a block: its policy's ``stored`` rule; the embedding and output
    layer keep all they save), with a split backward (``split``: ZB-H1) keeping its weight GEMMs' inputs to W
    (``weight_grad_kept``). ``milp``: a block's (stored, rebuilt, rebuilds) under its stage's schedule.

    Reserved bytes: each allocation is a set of ops' tensors, each rounded by the caching allocator
    (``plansim.costs.allocator.reserved_bytes``): what a policy keeps whole (all saved, all but the attention core,
    the layer input, the weight GEMMs' inputs) takes its tensors' rounding exactly; a part of a set that no op
    boundary delimits (a ``milp`` schedule's) takes the set's average rounding.

    >>> b = LayerBytes(34.0, 10.0, 20.0, 0.0, 3.0, 36.0, 11.0, 21.0)
    >>> m = layer_memory("full", b, 2.0, block=True, segment_start=True, split=False)
    >>> m.stored.n, m.transient.n, m.rebuilt.n, m.workspace.reserved
    (2.0, 32.0, 32.0, 512.0)
    """
    policy = REMAT_POLICIES[remat]
    input_res = float(reserved_bytes(layer_input))
    if milp is not None and block:
        stored_n, rebuilt_n, rebuilds = min(b.saved, milp[0]), milp[1], milp[2]
        stored = Sized(stored_n, _part(stored_n, b.saved, b.saved_reserved))
        rebuilt = Sized(rebuilt_n, _part(rebuilt_n, b.saved, b.saved_reserved)) if rebuilds else _NOTHING
        keep = min(stored.n, b.wgrad) if split else 0.0
        kept = Sized(keep, min(stored.reserved, _part(keep, b.wgrad, b.wgrad_reserved)))
        gone = max(b.saved - stored.n, 0.0)
        gone_res = max(b.saved_reserved - stored.reserved, 0.0)
        transient = Sized(gone + b.transient, gone_res + reserved_bytes(b.transient))
        workspace = Sized(b.workspace, float(reserved_bytes(b.workspace)))
        return _normalized(Sized(stored.n - kept.n, stored.reserved - kept.reserved), kept, transient, rebuilt,
                           _NOTHING, workspace, rebuilds)  # fmt: skip
    if not block:
        stored = Sized(b.saved, b.saved_reserved)
    else:
        n = policy.stored(b.saved, b.selective, layer_input, segment_start, b.op_kept)
        if policy.reruns == "nothing":
            stored = Sized(n, b.saved_reserved)
        elif policy.reruns == "attention_core":
            stored = Sized(n, b.saved_reserved - b.selective_reserved)
        elif policy.reruns == "unsaved_ops":
            stored = Sized(n, input_res + b.op_kept_reserved)
        else:
            stored = Sized(n, input_res if n > 0 else 0.0)
    rebuilds = block and policy.reruns != "nothing"
    # with backward split, the weight GEMMs' inputs outlive B until the deferred W pass
    keep_n = min(stored.n, b.wgrad) if split else 0.0
    keep_res = stored.reserved if keep_n >= stored.n else _part(keep_n, b.wgrad, b.wgrad_reserved)
    kept = Sized(keep_n, min(keep_res, stored.reserved))
    gone = b.saved - stored.n  # what the forward makes and the policy does not keep (negative: a traced block may
    gone_res = b.saved_reserved - stored.reserved  # save less than the input it keeps)
    transient = Sized(gone + b.transient, gone_res + reserved_bytes(b.transient))
    rebuilt = rebuilt_kept = _NOTHING
    if rebuilds:
        rebuilt_all = Sized(max(gone, 0.0), max(gone_res, 0.0))
        # split backward: what W needs beyond the stored part is rebuilt here and stays for the W pass
        w_all = weight_grad_kept(b.saved, stored.n, b.wgrad)
        rk_n = w_all - min(stored.n, b.wgrad) if split else 0.0
        rk_res = min(rebuilt_all.reserved, _part(w_all, b.wgrad, b.wgrad_reserved) - kept.reserved) if rk_n > 0 else 0.0
        rebuilt_kept = Sized(rk_n, max(rk_res, rk_n))
        rebuilt = Sized(rebuilt_all.n - rk_n, rebuilt_all.reserved - rebuilt_kept.reserved)
    workspace = Sized(b.workspace, float(reserved_bytes(b.workspace)))
    return _normalized(Sized(stored.n - kept.n, stored.reserved - kept.reserved), kept, transient, rebuilt,
                       rebuilt_kept, workspace, rebuilds)  # fmt: skip


def _normalized(
    stored: Sized, kept: Sized, transient: Sized, rebuilt: Sized, rebuilt_kept: Sized, workspace: Sized, rebuilds: bool
) -> LayerMemory:
    """``LayerMemory`` with no allocation reserving less than its bytes (an average share can, by float rounding)."""

    def fix(s: Sized) -> Sized:
        return Sized(s.n, max(s.reserved, s.n))

    return LayerMemory(
        fix(stored), fix(kept), fix(transient), fix(rebuilt), fix(rebuilt_kept), fix(workspace), rebuilds
    )


#: A pass's effect on a stage's live activations: (bytes, reserved) at its highest point over its start, and
#: (bytes, reserved) it leaves live at its end; the highest point is the one with the most reserved bytes. Its last
#: element: the gradient buffers' bytes (``LayerBytes.grads``, ``reduce_input``) among those at the highest point,
#: which a pass frees before it ends.
PassProfile = tuple[float, float, float, float, float]


class _Walk:
    """Live (bytes, reserved) through a sequence of allocations and frees, with the highest reserved point (and how
    many of its bytes are gradient buffers)."""

    def __init__(self) -> None:
        self.n = self.res = self.g = self.peak_n = self.peak_res = self.peak_g = 0.0

    def alloc(self, *sizes: Sized, grad: tuple[Sized, ...] = ()) -> None:
        for s in sizes:
            self.n += s.n
            self.res += s.reserved
        for s in grad:
            self.n += s.n
            self.res += s.reserved
            self.g += s.n
        if self.res > self.peak_res:
            self.peak_n, self.peak_res, self.peak_g = self.n, self.res, self.g

    def free(self, *sizes: Sized, grad: tuple[Sized, ...] = ()) -> None:
        for s in sizes:
            self.n -= s.n
            self.res -= s.reserved
        for s in grad:
            self.n -= s.n
            self.res -= s.reserved
            self.g -= s.n

    def profile(self) -> PassProfile:
        return self.peak_n, self.peak_res, self.n, self.res, self.peak_g


#: One chunk's layers for the memory walk: (layer index, its bytes) in forward order.
ChunkLayers = tuple[tuple[int, LayerBytes], ...]


def with_grad_buffers(chunk: ChunkLayers, params: Mapping[int, float], per_param: tuple[int, int]) -> ChunkLayers:
    """``chunk`` with each layer's gradient buffers for its reduction: ``per_param`` (bytes per parameter of the
    unsharded gradients and of the flat reduce input: ``plansim.step.data_parallel.grad_copy_in_bytes``) times the
    layer's ``params`` (a layer absent holds none); ``chunk`` itself where ``per_param`` is (0, 0)."""
    grads, reduce = per_param
    if not grads and not reduce:
        return chunk
    return tuple(
        (i, b._replace(grads=n * grads, reduce_input=n * reduce)) if (n := params.get(i, 0.0)) > 0 else (i, b)
        for i, b in chunk
    )


def chunk_memory(
    remat: str,
    chunk: ChunkLayers,
    num_blocks: int,
    layer_input: float,
    split: bool,
    milp: Mapping[int, tuple[float, float, bool]] | None = None,
    offset: int = 0,
) -> list[tuple[int, LayerMemory, int]]:
    """Each layer of a chunk with its ``LayerMemory`` and its sqrt(N) segment's last block (the layer whose
    backward's recompute rebuilds the segment; -1 outside segments), as the lowering allocates them: segments of
    ``ceil(sqrt(blocks in the chunk))`` blocks, each chunk being checkpointed on its own (a Megatron-LM model
    chunk is its own module). A policy that checkpoints every n-th block (``RematPolicy.every``) counts the rank's
    blocks over its chunks: ``offset`` of them are in its earlier chunks; a block it does not checkpoint keeps all
    it saves (``none``)."""
    policy = REMAT_POLICIES[remat]
    blocks = [i for i, _ in chunk if 0 <= i < num_blocks]
    position: dict[int, int] = {}  # each block's place among the chunk's blocks (its first, as list.index)
    for pos, i in enumerate(blocks):
        position.setdefault(i, pos)
    k_seg = math.ceil(math.sqrt(len(blocks) or 1))
    out = []
    # alike layers (a stamped model's blocks) at alike places in their segments allocate alike: one LayerMemory each
    alike: dict[tuple[LayerBytes, bool, bool, tuple[float, float, bool] | None, bool], LayerMemory] = {}
    for i, b in chunk:
        block = 0 <= i < num_blocks
        pos = position[i] if block else -1
        last = blocks[min(pos - pos % k_seg + k_seg, len(blocks)) - 1] if block and policy.segments else -1
        plan = milp.get(i) if milp is not None and block else None
        start = block and pos % k_seg == 0
        kept = block and not policy.checkpoints(offset + pos)
        mem = alike.get((b, block, start, plan, kept))
        if mem is None:
            mem = alike[b, block, start, plan, kept] = layer_memory("none" if kept else remat, b, layer_input,
                                                                    block=block, segment_start=start, split=split,
                                                                    milp=plan)  # fmt: skip
        out.append((i, mem, last))
    return out


def pass_profiles(
    remat: str,
    chunk: ChunkLayers,
    num_blocks: int,
    layer_input: float,
    split: bool,
    milp: Mapping[int, tuple[float, float, bool]] | None = None,
    offset: int = 0,
) -> dict[str, PassProfile]:
    """``PassProfile`` of a chunk's forward (``F``), backward (``B``: input gradients only when ``split``) and
    weight-gradient pass (``W``) for one micro-batch, in the lowering's order: a layer's forward allocates what it
    stores and its transient and frees the transient at its end; its backward first recomputes (allocating what that
    rebuilds: a sqrt(N) segment's before its last block's backward), then allocates its workspace and frees at its
    end the workspace, what it stored and rebuilt (but for W's part when split); W frees that part. ``offset``: the
    rank's blocks in its earlier chunks (``chunk_memory``).

    Gradient buffers (``LayerBytes.grads``, ``reduce_input``; in the pass that makes the weight gradients: B, or W
    when split): a layer's unsharded gradients are allocated with its workspace (W: at its start); at its end the
    previous layer's reduce input is freed, then its copy allocates its own reduce input and frees its gradients;
    the pass's last reduce input is freed at its copy's end (FSDP2's foreach_reduce and post_backward)."""
    layers = chunk_memory(remat, chunk, num_blocks, layer_input, split, milp, offset)
    mem = {i: m for i, m, _ in layers}
    sized = dict(chunk)
    segment: dict[int, list[int]] = {}  # a sqrt(N) segment's last block -> its blocks, in order
    for j, _, seg in layers:
        segment.setdefault(seg, []).append(j)
    fwd, bwd, wgt = _Walk(), _Walk(), _Walk()
    for _, m, _ in layers:
        fwd.alloc(m.stored, m.kept, *([m.transient] if m.transient.n > 0 else []))
        fwd.free(*([m.transient] if m.transient.n > 0 else []))
    grads_in = wgt if split else bwd
    held: tuple[Sized, ...] = ()  # the reduce input of the layer before, in this pass
    buffers = any(b.grads > 0 or b.reduce_input > 0 for _, b in chunk)
    grads: tuple[Sized, ...] = ()
    copy: tuple[Sized, ...] = ()
    for i, m, last in reversed(layers):
        if buffers:
            grads, copy = _grad_buffers(sized[i])
        if m.rebuilds and (last < 0 or last == i):
            todo = segment.get(i, []) if last == i else [i]
            bwd.alloc(*(s for j in todo for s in (mem[j].rebuilt, mem[j].rebuilt_kept)))
        ws = [m.workspace] if m.workspace.n > 0 else []
        bwd.alloc(*ws, grad=() if split else grads)
        bwd.free(m.stored, *ws, m.rebuilt)
        if not split:
            bwd.free(m.kept, m.rebuilt_kept)
        if split and grads:
            wgt.alloc(grad=grads)
        wgt.free(m.kept, m.rebuilt_kept)
        if copy:
            grads_in.free(grad=held)
            grads_in.alloc(grad=copy)
            grads_in.free(grad=grads)
            held = copy
    grads_in.free(grad=held)
    return {"F": fwd.profile(), "B": bwd.profile(), "W": wgt.profile()}


def _grad_buffers(b: LayerBytes) -> tuple[tuple[Sized, ...], tuple[Sized, ...]]:
    """A layer's unsharded gradients (autograd's tensors, counted at their bytes) and its flat reduce input (one
    tensor, with the caching allocator's rounding), each empty where it holds none."""
    grads = (Sized(b.grads, b.grads),) if b.grads > 0 else ()
    copy = (Sized(b.reduce_input, float(reserved_bytes(b.reduce_input))),) if b.reduce_input > 0 else ()
    return grads, copy


def activation_peak(
    remat: str,
    schedule: str,
    stage: int,
    pp: int,
    num_microbatches: int,
    virtual_stages: int,
    chunks: tuple[ChunkLayers, ...],
    num_blocks: int,
    layer_input: float,
    milp: tuple[tuple[int, float, float, bool], ...] | None = None,
) -> tuple[float, float, float]:
    """A stage's activation peak, (bytes live, bytes the allocator reserves for them, the gradient buffers' bytes
    among the live ones: ``LayerBytes.grads`` and ``reduce_input``) at the moment the reserved bytes are highest,
    walking its schedule's passes (``PipelineSchedule.order``) with each chunk's ``pass_profiles``: what the DES's
    memory tracker sees of the lowering's allocations, since one stage's passes run one after
    another on its compute stream. ``chunks``: the stage's chunks, ``chunks[c]`` its ``c``-th (model chunk
    ``c * pp + stage``); ``milp``: (block, stored, rebuilt, rebuilds) of each block under ``remat: milp``.

    Without ``milp`` a chunk's layers matter by kind and position only (the embedding, the blocks in order, the
    output layer), so they are renumbered before the memoized walk: stages and candidates whose chunks hold alike
    layers share it."""
    if milp is None:
        runs = tuple(_block_runs(c, num_blocks) for c in chunks)
        return _activation_peak(remat, schedule, stage, pp, num_microbatches, virtual_stages, runs, num_blocks,
                                layer_input)  # fmt: skip
    plan = {i: (st, rb, on) for i, st, rb, on in milp}
    split = get_schedule(schedule).split_backward
    offsets = _offsets(remat, [sum(1 for i, _ in c if 0 <= i < num_blocks) for c in chunks])
    profiles = [
        pass_profiles(remat, c, num_blocks, layer_input, split, plan, k) for c, k in zip(chunks, offsets, strict=True)
    ]
    return _walk(profiles, order_runs(schedule, stage, pp, num_microbatches, virtual_stages))


def _offsets(remat: str, blocks: Sequence[int]) -> list[int]:
    """Each chunk's ``offset`` (``chunk_memory``) from the blocks of a rank's chunks in order: the blocks before
    it where ``remat`` counts them over the rank (``RematPolicy.every``), else 0 (so alike chunks share a walk)."""
    if not REMAT_POLICIES[remat].every:
        return [0] * len(blocks)
    return [sum(blocks[:c]) for c in range(len(blocks))]


#: A chunk's layers by kind and position only: (the layer's index for the embedding and the output layer, else
#: None for a run of alike blocks; its bytes; how many in a row).
_BlockRuns = tuple[tuple[int | None, LayerBytes, int], ...]


def _block_runs(chunk: ChunkLayers, num_blocks: int) -> _BlockRuns:
    """``chunk`` with consecutive alike blocks counted, not listed (stamped blocks are alike)."""
    out: list[tuple[int | None, LayerBytes, int]] = []
    for i, b in chunk:
        if 0 <= i < num_blocks:
            if out and out[-1][0] is None and (out[-1][1] is b or out[-1][1] == b):
                out[-1] = (None, out[-1][1], out[-1][2] + 1)
            else:
                out.append((None, b, 1))
        else:
            out.append((i, b, 1))
    return tuple(out)


def _chunk_of(runs: _BlockRuns) -> ChunkLayers:
    """The chunk ``_block_runs`` counted, its blocks numbered 0, 1, ... in order."""
    out: list[tuple[int, LayerBytes]] = []
    k = 0
    for i, b, count in runs:
        if i is None:
            out.extend((k + j, b) for j in range(count))
            k += count
        else:
            out.append((i, b))
    return tuple(out)


@lru_cache(maxsize=65536)
def _activation_peak(
    remat: str,
    schedule: str,
    stage: int,
    pp: int,
    num_microbatches: int,
    virtual_stages: int,
    chunks: tuple[_BlockRuns, ...],
    num_blocks: int,
    layer_input: float,
) -> tuple[float, float, float]:
    split = get_schedule(schedule).split_backward
    offsets = _offsets(remat, [sum(count for i, _, count in c if i is None) for c in chunks])
    profiles = [
        _pass_profiles(remat, c, num_blocks, layer_input, split, k) for c, k in zip(chunks, offsets, strict=True)
    ]
    return _walk(profiles, order_runs(schedule, stage, pp, num_microbatches, virtual_stages))


def _walk(profiles: Sequence[Mapping[str, PassProfile]], runs: tuple[Node, ...]) -> tuple[float, float, float]:
    """The highest (bytes, reserved, gradient buffers' bytes) point of a stage's passes in order (``order_runs``),
    each pass's effect its chunk's ``PassProfile``; (0, 0, 0) if nothing is ever live."""
    top_n, top_res, _, _, top_g = _node_profile(runs, profiles)
    return (top_n, top_res, top_g) if top_res > 0 else (0.0, 0.0, 0.0)


def _node_profile(nodes: tuple[Node, ...], profiles: Sequence[Mapping[str, PassProfile]]) -> PassProfile:
    """(bytes, reserved) at the highest point of ``nodes`` run in order over their start, what they leave live, and
    the gradient buffers' bytes at that point (a pass frees its own, so none is left live across passes). A repeated
    block's highest point is in its last repetition if each leaves more live, else in its first."""
    n = res = 0.0
    top_n = top_res = -math.inf
    top_g = 0.0
    for node in nodes:
        if isinstance(node[0], int):  # one pass: (chunk, kind)
            rise_n, rise_res, net_n, net_res, rise_g = profiles[node[0]][node[1]]
        else:  # (block, repeats)
            block, repeats = node
            b_top_n, b_top_res, b_n, b_res, rise_g = _node_profile(block, profiles)
            r = repeats - 1 if b_res > 0 else 0
            rise_n, rise_res = r * b_n + b_top_n, r * b_res + b_top_res
            net_n, net_res = repeats * b_n, repeats * b_res
        if res + rise_res > top_res:
            top_n, top_res, top_g = n + rise_n, res + rise_res, rise_g
        n += net_n
        res += net_res
    return top_n, top_res, n, res, top_g


@lru_cache(maxsize=16384)
def _pass_profiles(
    remat: str, runs: _BlockRuns, num_blocks: int, layer_input: float, split: bool, offset: int = 0
) -> dict[str, PassProfile]:
    return pass_profiles(remat, _chunk_of(runs), num_blocks, layer_input, split, offset=offset)
