"""Each layer's work in one training step, walked once from the op graph for both engines.

``layer_programs`` walks a micro-batch's op graph (one rank) and gives each layer's forward, backward (whole, and
input-gradient only) and weight-gradient work as runs of compute split at its collectives, with the bytes and FLOPs
that memory, recompute and the FLOP rates read. The lowering runs those segments as tasks; the analytic engine sums
them (``layer_costs``), pricing each collective on the mesh axis its op names. So a layer costs the same in both
engines by construction: there is one walk, and the closed form is its sum. A layer stamped from the same block
template as an earlier one (``graph.graph["copies"]``, recorded by ``plansim.workload.graph.stamp``) is walked once;
``rerun`` is what a remat policy rebuilds of the blocks.

Sources: Megatron-LM's tensor-parallel collectives are blocking, so they sit between compute kernels on the critical
path (Shoeybi et al. 2019, sec 3), except the one a linear layer launches asynchronously in its own backward (see
``_regathered``) and those a framework overlaps with the GEMMs beside them (``plansim.step.tp_overlap.TPOverlap``: the
input gradient's reduction beside the weight gradient, and Megatron-LM's ``--tp-comm-overlap``, GEMMs split into
chunks pipelined with their all-gather or reduce-scatter); a GEMM's backward is an input-gradient and a
weight-gradient kernel, which split-backward schedules run apart (Qi et al. 2023, ZB-H1); model FLOPs count GEMM-like
kinds only (Narayanan et al. 2021, sec 5.1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx

from plansim.costs.allocator import reserved_bytes
from plansim.costs.collectives import COLLECTIVES
from plansim.costs.interference import overlap_cost
from plansim.costs.kernels import KernelCostModel, executed_share
from plansim.costs.memory import LayerActivations
from plansim.costs.remat_policies import REMAT_POLICIES, Recompute
from plansim.costs.stragglers import collective_wait_s
from plansim.step.comm import Comm
from plansim.step.tp_overlap import TPOverlap
from plansim.strategy.mesh import DeviceMesh, comm_kind
from plansim.workload.graph import MATMUL_KINDS

__all__ = [
    "AxisComm",
    "CommPricer",
    "LayerCost",
    "LayerProgram",
    "RateBeside",
    "Segment",
    "forward_bytes",
    "layer_activations",
    "layer_algorithm",
    "layer_costs",
    "layer_programs",
    "rerun",
    "rerun_axis_bytes",
    "rerun_blocks",
    "rerun_sync_s",
    "weight_gradient_s",
]

#: (mesh axis, collective name, message bytes) -> (seconds, bytes this rank sends)
CommPricer = Callable[[str, str, float], tuple[float, float]]
#: an asynchronous collective, its seconds and the bytes this rank sends -> the compute stream's rate (1: full speed)
#: while it runs beside it
#: (``plansim.costs.interference``)
RateBeside = Callable[[Comm, float, float], float]

#: no collective overlapped: every one blocks, but the sequence-parallel re-gather (``_regathered``)
_BLOCKING = TPOverlap()


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of compute (``seconds``) or one collective (``comm``) inside a layer's pass.

    A collective with ``hidden_s > 0`` does not block: it is launched asynchronously and runs beside the next segment
    (``hidden_s`` seconds of compute), and the segment after that waits for it, so ``max(0, its time - hidden_s)`` of
    it is exposed. A collective's ``wait_s`` is the expected time it waits, beyond the mean, for its slowest member's
    run of kernels since the pass's previous collective (``plansim.costs.stragglers.collective_wait_s``)."""

    seconds: float = 0.0
    comm: Comm | None = None
    hidden_s: float = 0.0
    wait_s: float = 0.0
    #: the part of ``seconds`` the GPU waits for the host to launch the run's kernels (``_Runs``)
    host_wait_s: float = 0.0


def _run(gpu_s: float, host_s: float) -> Segment:
    """A run of kernels that take ``gpu_s`` on the GPU and ``host_s`` for the host to launch: the host launches
    ahead while the GPU works through what it launched, so the run takes the longer of the two (the GPU waits for the
    host where launching is slower: small kernels, eager PyTorch)."""
    return Segment(max(gpu_s, host_s), host_wait_s=max(0.0, host_s - gpu_s))


@dataclass
class LayerProgram:
    """One layer's passes for one micro-batch on one rank, and its memory and FLOP figures.

    ``fwd``/``bwd``/``bwd_input``: the passes as segments; ``wgrad_s`` the weight-gradient kernels (part of ``bwd``,
    a separate W pass under split backward); ``selective_s`` the forward time of the ops selective recompute reruns;
    ``saved`` bytes its ops save for backward (``selective_saved`` of them by the rerun ops, ``wgrad_saved`` the weight
    GEMMs' inputs); ``bwd_workspace`` the most bytes one of its kernels allocates for its backward only (a fused
    attention kernel's accumulators); FLOPs count GEMM-like kinds. ``sac``: what a per-op remat policy reruns of its
    forward (``remat: op_sac``: each op's ``sac_rerun`` share of its forward, split at the collectives it reruns),
    ``selective_comm`` the collectives a selective rerun runs beside its kernels (the ring attention's exchange),
    ``sac_kept`` the outputs it keeps (its ops' ``sac_kept``). ``same_as``: the earlier layer this one is a copy
    of (same template), whose figures it shares."""

    layer: int
    fwd: list[Segment] = field(default_factory=list)
    bwd: list[Segment] = field(default_factory=list)
    bwd_input: list[Segment] = field(default_factory=list)
    wgrad_s: float = 0.0
    selective_s: float = 0.0
    params: float = 0.0
    #: of ``params``, the routed experts' weights (ops with ``expert``): their ZeRO states shard over ``edp``
    expert_params: float = 0.0
    #: the weight elements of its FP8 linear layers (``dtype: fp8``) and how many there are
    fp8_params: float = 0.0
    fp8_linears: int = 0
    saved: float = 0.0
    selective_saved: float = 0.0
    wgrad_saved: float = 0.0
    bwd_workspace: float = 0.0
    fwd_matmul_flops: float = 0.0
    selective_matmul_flops: float = 0.0
    same_as: int | None = None
    #: ``saved`` and ``selective_saved`` as the caching allocator reserves them, each op's tensor rounded
    #: (``plansim.costs.allocator.reserved_bytes``)
    saved_reserved: float = 0.0
    selective_saved_reserved: float = 0.0
    wgrad_saved_reserved: float = 0.0
    #: bytes live only while its forward runs (the loss's bf16 logits beside the fp32 softmax: ``transient_bytes``)
    transient: float = 0.0
    sac: list[Segment] = field(default_factory=list)
    #: what selective recompute reruns beside its kernels: context parallelism's ring exchange of keys and values
    #: (Transformer Engine's attention forward, rerun whole by the recompute), beside all but the last ring step
    selective_comm: list[Segment] = field(default_factory=list)
    sac_kept: float = 0.0
    sac_kept_reserved: float = 0.0
    sac_matmul_flops: float = 0.0


def weight_gradient_s(op: Mapping[str, Any], kernels: KernelCostModel) -> float:
    """The weight-gradient part of an op's backward time: ``KernelCostModel.backward`` prices a GEMM-like op's
    backward as two kernels of ``bwd_flops / 2``, input gradient and weight gradient; ops with parameters run the
    latter. Everything else in ``kernels.backward(op)`` is input gradient.

    Left in the input-gradient part: a tied output head's weight gradient (its weight is counted once, at the
    embedding, so ``params`` is 0 there).
    """
    if op["kind"] in MATMUL_KINDS and op["params"] > 0:
        return kernels.weight_gradient(op)
    return 0.0


def _close(segments: list[Segment], gpu_s: float, host_s: float, var: float, comm: Comm | None, members: int) -> None:
    """Close a pass's open run (``gpu_s`` of kernels, ``host_s`` of their launches, ``var`` their variance) into
    ``segments``, then the collective ``comm`` among ``members`` ranks that closes it, waiting for the slowest."""
    if gpu_s > 0 or host_s > 0:
        segments.append(_run(gpu_s, host_s))
    if comm is not None:
        segments.append(Segment(comm=comm, wait_s=collective_wait_s(var, members)))


class _Runs:
    """A layer's passes being built: compute accumulates into the open run of each pass until a collective closes
    it (consecutive kernels are one segment), with the run's variance (kernels' noise independent: s^2 adds); a
    collective among ``members`` ranks waits for the slowest member's run."""

    __slots__ = (
        "bwd", "bwd_input", "fwd", "host_bwd", "host_bwd_input", "host_fwd", "host_sac", "lp", "sac", "var_bwd",
        "var_fwd", "var_sac",
    )  # fmt: skip

    def __init__(self, lp: LayerProgram) -> None:
        self.lp = lp
        self.fwd = self.bwd = self.bwd_input = self.sac = 0.0
        # the host's time to launch each open run
        self.host_fwd = self.host_bwd = self.host_bwd_input = self.host_sac = 0.0
        self.var_fwd = self.var_bwd = self.var_sac = 0.0

    def close_sac(self, comm: Comm | None = None, members: int = 1) -> None:
        """The per-op policy's rerun: its open run of compute, then a collective it reruns (blocking)."""
        _close(self.lp.sac, self.sac, self.host_sac, self.var_sac, comm, members)
        self.sac = self.host_sac = self.var_sac = 0.0

    def close_fwd(self, comm: Comm | None = None, members: int = 1) -> None:
        _close(self.lp.fwd, self.fwd, self.host_fwd, self.var_fwd, comm, members)
        self.fwd = self.host_fwd = self.var_fwd = 0.0

    def close_bwd(self, comm: Comm | None = None, members: int = 1) -> None:
        # One wait per collective, from the whole backward's run, for both forms of the pass: under split backward
        # (ZB-H1) the input-gradient run before a collective is shorter, so this overstates its wait slightly; the
        # analytic engine prices the whole backward, and so both engines charge the same.
        wait = collective_wait_s(self.var_bwd, members)
        for segments, run, host in (
            (self.lp.bwd, self.bwd, self.host_bwd),
            (self.lp.bwd_input, self.bwd_input, self.host_bwd_input),
        ):
            if run > 0 or host > 0:
                segments.append(_run(run, host))
            if comm is not None:
                segments.append(Segment(comm=comm, wait_s=wait))
        self.bwd = self.bwd_input = self.host_bwd = self.host_bwd_input = 0.0
        self.var_bwd = 0.0

    def gather_into_gemm(self, comm: Comm, chunks: int, chunk_s: float, backward: bool) -> None:
        """An all-gather run as a ring exchange into a GEMM (or context parallelism's ring attention,
        ``_ring_steps``) of ``chunks`` chunks of ``chunk_s`` each: the gather beside the first ``chunks - 1`` chunks
        (this rank's own and those that arrived), the last chunk waiting for the gather's end. The last chunk opens
        the pass's next run."""
        if backward:
            self.close_bwd()
            for segments in (self.lp.bwd, self.lp.bwd_input):
                segments.append(Segment(comm=comm, hidden_s=(chunks - 1) * chunk_s))
                segments.append(Segment((chunks - 1) * chunk_s))
            self.bwd += chunk_s
            self.bwd_input += chunk_s
            return
        self.close_fwd()
        self.lp.fwd.append(Segment(comm=comm, hidden_s=(chunks - 1) * chunk_s))
        self.lp.fwd.append(Segment((chunks - 1) * chunk_s))
        self.fwd += chunk_s

    def gemm_into_reduce_scatter(self, comm: Comm, chunks: int, chunk_s: float, members: int) -> None:
        """A forward GEMM of ``chunks`` chunks (``chunk_s`` each) whose output is reduce-scattered chunk by chunk
        (``comm`` is one chunk's): each chunk's reduce-scatter runs beside the next chunk's GEMM, the last one
        blocks. The run before opens with the first chunk."""
        var = self.var_fwd
        self.fwd += chunk_s
        self.close_fwd()
        for _ in range(chunks - 1):
            self.lp.fwd.append(Segment(comm=comm, hidden_s=chunk_s))
            self.lp.fwd.append(Segment(chunk_s))
        self.lp.fwd.append(Segment(comm=comm, wait_s=collective_wait_s(var, members)))

    def reduce_beside_wgrad(self, comm: Comm, wgrad_s: float) -> None:
        """A column-parallel linear's input gradient (the run so far ends with its GEMM) reduced beside its weight
        gradient GEMM (``wgrad_s``), which the pass's next run waits for; under split backward the weight gradient
        is a pass of its own (W), so the input-gradient pass (B) waits for the reduction right away."""
        self.close_bwd()
        self.lp.bwd.append(Segment(comm=comm, hidden_s=wgrad_s))
        self.lp.bwd.append(Segment(wgrad_s))
        self.lp.bwd_input.append(Segment(comm=comm))

    def ring_bwd(self, comm: Comm, steps_s: float) -> None:
        """Context parallelism's ring attention backward (``_ring_steps``): each step's keys, values and their
        gradients passed on beside its kernel, so the whole exchange (``comm``) runs beside the steps
        (``steps_s``) and what follows waits for it; both passes run it."""
        self.close_bwd()
        for segments in (self.lp.bwd, self.lp.bwd_input):
            segments.append(Segment(comm=comm, hidden_s=steps_s))
            segments.append(Segment(steps_s))

    def regather_bwd(self, comm: Comm, dgrad_s: float) -> None:
        """A linear layer's backward that re-gathers its input (``_regathered``): the all-gather beside the input
        gradient GEMM (``dgrad_s``), which is a segment of its own because what follows (the weight gradient) waits
        for the gather. Both passes run it (split backward gathers in B and keeps the input for W)."""
        self.close_bwd()
        for segments in (self.lp.bwd, self.lp.bwd_input):
            segments.append(Segment(comm=comm, hidden_s=dgrad_s))
            segments.append(Segment(dgrad_s))


def _chunk_s(kernels: KernelCostModel, kind: str, flops: float, nbytes: float, n: int, overlap: TPOverlap) -> float:
    """One of the ``n`` chunks a split GEMM of ``flops`` FLOPs runs as: on one stream each chunk is a kernel of its
    own, ramp-up and tail included; where the chunks take ``overlap.chunk_streams`` > 1 streams in turn (Transformer
    Engine's userbuffers) each one's ramp-up and tail run beside its neighbours' work, so together they take the
    whole GEMM's time."""
    if overlap.chunk_streams > 1:
        return kernels.kernel_time(kind, flops, nbytes) / n
    return kernels.kernel_time(kind, flops / n, nbytes / n)


def _execution_order(graph: nx.DiGraph) -> tuple[list[str], bool]:
    """The ops in an order that runs each after its inputs, and whether it is the insertion order: as inserted where
    that already is one (the builders and the tracer add ops in execution order), else a topological sort."""
    order = list(graph)
    position = {name: i for i, name in enumerate(order)}
    if all(position[u] < position[v] for u, v in graph.edges):
        return order, True
    return list(nx.topological_sort(graph)), False


def _regathered(graph: nx.DiGraph, name: str, mesh: DeviceMesh) -> Comm | None:
    """The all-gather a linear layer's backward repeats, or None.

    With sequence parallelism a column-parallel linear all-gathers its sequence-sharded input in forward but saves
    only its shard; its backward all-gathers the input again for the weight gradient, launched asynchronously
    before the input-gradient GEMM and waited for after it (Korthikanti et al. 2022, sec 4.2.2; NVIDIA/Megatron-LM
    d98e8a64, ``megatron/core/tensor_parallel/layers.py``, ``LinearWithGradAccumulationAndAsyncCommunication``:
    ``ctx.save_for_backward(input, ...)``, then in ``backward`` ``dist_all_gather_func(..., async_op=True)``,
    ``grad_output.matmul(weight)``, ``handle.wait()``). A GEMM fed by a forward all-gather on an axis of size > 1
    is such a layer; the gather's message is the forward's."""
    op = graph.nodes[name]
    if op["kind"] not in MATMUL_KINDS:
        return None
    for pred in graph.predecessors(name):
        c = graph.nodes[pred]
        if c["kind"] == "collective" and c["collective"] == "all_gather" and mesh.size(c["group"]) > 1:
            return Comm("all_gather", "ring", c["group"], forward_bytes(c), comm_kind(c["group"]))
    return None


def _tp_collective(graph: nx.DiGraph, op_name: str, mesh: DeviceMesh, name: str) -> str | None:
    """The collective op ``name`` is a neighbour of (``pred`` or ``succ`` in ``name``'s place): the op's only
    neighbour on that side, a collective on a mesh axis of size > 1; else None."""
    nbrs = list(graph.predecessors(op_name) if name == "pred" else graph.successors(op_name))
    if len(nbrs) != 1:
        return None
    c = graph.nodes[nbrs[0]]
    return nbrs[0] if c["kind"] == "collective" and mesh.size(c["group"]) > 1 else None


def _ring_steps(op: Mapping[str, Any], mesh: DeviceMesh) -> int:
    """The steps of context parallelism's ring attention the op runs as (0: none): a fused attention op that carries
    ``cp_ring`` (``plansim.workload.transformer``) on an axis of more than one rank. Each step computes ``1/steps`` of
    the op's scores against one block of keys and values while the next block is passed on: forward, the blocks are
    passed beside the first ``steps - 1`` steps and the last step waits for the last block; backward, the blocks and
    the gradients of the keys and values are passed beside every step (Transformer Engine's
    ``AttnFuncWithCPAndKVP2P``, context_parallel.py:1691-1720 and 2459-2500 at d0067d0d). Their bytes are an
    all-gather's of the whole sequence's K and V on the group (forward; twice that backward): each rank sends its
    block ``steps - 1`` times, as the ring's point-to-point sends do (Liu et al. 2023, Ring Attention, sec 3)."""
    steps = op.get("cp_ring", 0)
    return steps if steps > 1 and mesh.size(op["group"]) > 1 else 0


def _ring_step(op: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """One step of a ring attention op: ``1/steps`` of its FLOPs (the causal chunks balance them), reading as much."""
    return {**op, "flops": op["flops"] / steps, "bwd_flops": op["bwd_flops"] / steps}


def _weight_gemm(op: Mapping[str, Any]) -> bool:
    return op["kind"] in MATMUL_KINDS and op["params"] > 0


def layer_algorithm(collective: str) -> str:
    """The algorithm a layer's ``collective`` runs as (a key of ``COLLECTIVES[collective]``): the ring NCCL's calls
    are priced from (``plansim.costs.nccl_groups.layer_call`` picks what NCCL runs), else the collective's one
    schedule (an all-to-all's direct exchange: NCCL runs it as grouped sends and receives, outside its tuning
    model)."""
    algorithms = COLLECTIVES[collective]
    return "ring" if "ring" in algorithms else next(iter(algorithms))


def _comm(op: Mapping[str, Any], collective: str, n_bytes: float | None = None) -> Comm:
    n = op["comm_bytes"] if n_bytes is None else n_bytes
    return Comm(collective, layer_algorithm(collective), op["group"], n, comm_kind(op["group"]))


def forward_bytes(op: Mapping[str, Any]) -> float:
    """The bytes of a collective op's forward call: ``comm_bytes``, or an all-gather's FP8 message where it gathers
    a linear layer's FP8 input (``fp8_comm_bytes``: ``plansim.workload.transformer.tp_enter``), which its backward's
    re-gather moves too (``_regathered``)."""
    return float(op.get("fp8_comm_bytes", op["comm_bytes"]))


def layer_programs(
    graph: nx.DiGraph, kernels: KernelCostModel, mesh: DeviceMesh, overlap: TPOverlap = _BLOCKING
) -> dict[int, LayerProgram]:
    """Each layer's (-1 embedding, 0..L-1 blocks, L output layer) forward, backward and weight-gradient work, split at
    its collectives. Each collective runs on the mesh axis its op names (``group``, e.g. ``tp``); one on an axis of
    size 1, or named ``none`` for a direction, is no collective. ``overlap`` says which collectives run beside the
    GEMMs next to them (``TPOverlap``)."""
    runs: dict[int, _Runs] = {}
    nodes = graph.nodes
    order, inserted = _execution_order(graph)
    # A layer stamped from the same template as an earlier one (``workload.graph.stamp``) has the same ops in the
    # same order, so the same program: it is walked once. Only where the walk follows insertion order.
    copies: dict[int, int] = graph.graph.get("copies", {}) if inserted else {}
    if copies:
        order = [name for name in order if nodes[name]["layer"] not in copies]
    taken: set[str] = set()  # collectives a GEMM's overlap ran already, in the pass being walked
    # the overlaps split only the transformer blocks' GEMMs (Transformer Engine's layers), not the output layer's
    spec = graph.graph.get("spec")
    blocks = spec.layers if spec is not None and overlap != _BLOCKING else 0
    # the blocks a per-op remat policy can rerun (the embedding and the output layer are never rerun)
    rerun_below = spec.layers if spec is not None else len(graph)
    for name in order:
        op = nodes[name]
        r = runs.get(op["layer"])
        if r is None:
            r = runs[op["layer"]] = _Runs(LayerProgram(op["layer"]))
        lp = r.lp
        rerunnable = 0 <= op["layer"] < rerun_below
        if op["kind"] == "collective":
            members = mesh.size(op["group"])
            if members > 1 and op["collective"] != "none":
                if name not in taken:
                    r.close_fwd(_comm(op, op["collective"], forward_bytes(op)), members)
                if rerunnable and op.get("sac_rerun", 1.0) > 0:  # a per-op policy reruns it, blocking,
                    r.close_sac(_comm(op, op["collective"], forward_bytes(op)), members)
                elif rerunnable:  # or keeps its output
                    lp.sac_kept += op.get("sac_kept", 0)
                    lp.sac_kept_reserved += reserved_bytes(op.get("sac_kept", 0))
            continue
        fwd = kernels.forward(op)
        # what the per-op policy reruns of it, at its whole forward's speed
        share = op.get("sac_rerun", 1.0) if rerunnable else 0.0
        if share > 0 and fwd > 0:
            r.sac += share * fwd
            r.var_sac += (kernels.time_cv(op["kind"]) * share * fwd) ** 2
        if share > 0:
            r.host_sac += kernels.host_s * kernels.launches(op)  # a rerun op's kernel is launched again
        lp.sac_kept += op.get("sac_kept", 0)
        lp.sac_kept_reserved += reserved_bytes(op.get("sac_kept", 0))
        launches = kernels.launches(op)
        steps = _ring_steps(op, mesh)
        if steps:  # context parallelism's ring: its steps beside the exchange of keys and values
            step = kernels.forward(_ring_step(op, steps))
            ring = Comm("all_gather", "ring", op["group"], op["comm_bytes"], comm_kind(op["group"]))
            r.gather_into_gemm(ring, steps, step, backward=False)
            if op["selective_recompute"]:  # a selective rerun runs the ring again, beside the same steps
                lp.selective_comm.append(Segment(comm=ring, hidden_s=(steps - 1) * step))
            r.var_fwd += (kernels.time_cv(op["kind"]) * steps * step) ** 2
            launches *= steps
            fwd = steps * step
        split = _weight_gemm(op) and 0 <= op["layer"] < blocks  # a block's GEMM, which the overlap splits
        before = _tp_collective(graph, name, mesh, "pred") if split else None
        after = _tp_collective(graph, name, mesh, "succ") if split else None
        gather = _comm(nodes[before], "all_gather") if before is not None else None
        if overlap.ring_exchange and gather is not None and lp.fwd and lp.fwd[-1].comm == gather:
            # the blocking gather the walk put down before this GEMM becomes a ring exchange beside its chunks
            assert before is not None
            members = mesh.size(nodes[before]["group"])
            chunk = _chunk_s(kernels, op["kind"], op["flops"], op["bytes"], members, overlap)
            lp.fwd.pop()
            r.gather_into_gemm(replace(gather, engine="copy_engine"), members, chunk, backward=False)
            r.var_fwd += (kernels.time_cv(op["kind"]) * members * chunk) ** 2
            fwd = 0.0
        elif overlap.reduce_scatter_splits and after is not None and nodes[after]["collective"] == "reduce_scatter":
            n = overlap.reduce_scatter_splits
            chunk = overlap.gemm_slowdown * _chunk_s(kernels, op["kind"], op["flops"], op["bytes"], n, overlap)
            r.var_fwd += (kernels.time_cv(op["kind"]) * n * chunk) ** 2
            rs = replace(_comm(nodes[after], "reduce_scatter", nodes[after]["comm_bytes"] / n), engine="userbuffers")
            r.gemm_into_reduce_scatter(rs, n, chunk, mesh.size(nodes[after]["group"]))
            taken.add(after)
            fwd = 0.0
        if fwd > 0 and not steps:
            r.fwd += fwd
            r.var_fwd += (kernels.time_cv(op["kind"]) * fwd) ** 2
        r.host_fwd += kernels.host_s * launches
        lp.params += op["params"]
        if op.get("expert"):
            lp.expert_params += op["params"]
        if op.get("fp8"):  # an FP8 linear layer: its weight's elements (its FP8 copies, ``step.memory.fp8_bytes``)
            n, k = op["fp8"][1:3]
            lp.fp8_params += k * n
            lp.fp8_linears += 1
        lp.saved += op["saved_bytes"]
        lp.saved_reserved += reserved_bytes(op["saved_bytes"])
        lp.transient += op.get("transient_bytes", 0)
        lp.bwd_workspace = max(lp.bwd_workspace, op.get("workspace_bytes", 0))
        if op["kind"] in MATMUL_KINDS:  # what a recompute of the forward executes (hardware FLOPs)
            lp.fwd_matmul_flops += op["flops"] * executed_share(op)
            lp.sac_matmul_flops += share * op["flops"] * executed_share(op)
            if op["params"] > 0:  # a weight GEMM saves its input for the weight gradient
                lp.wgrad_saved += op["saved_bytes"]
                lp.wgrad_saved_reserved += reserved_bytes(op["saved_bytes"])
        if op["selective_recompute"]:
            lp.selective_s += fwd
            lp.selective_saved += op["saved_bytes"]
            lp.selective_saved_reserved += reserved_bytes(op["saved_bytes"])
            if op["kind"] in MATMUL_KINDS:
                lp.selective_matmul_flops += op["flops"] * executed_share(op)
    for r in runs.values():
        r.close_fwd()
        r.close_sac()
    taken.clear()
    for name in reversed(order):
        op = nodes[name]
        r = runs[op["layer"]]
        if op["kind"] == "collective":
            members = mesh.size(op["group"])
            if members > 1 and op["bwd_collective"] != "none" and name not in taken:
                r.close_bwd(_comm(op, op["bwd_collective"]), members)
            continue
        steps = _ring_steps(op, mesh)
        if steps:  # the ring's backward: K, V and their gradients passed on beside every step
            step = kernels.backward(_ring_step(op, steps))
            launched = kernels.host_s * kernels.launches(op, "bwd") * steps
            r.host_bwd += launched
            r.host_bwd_input += launched
            r.ring_bwd(
                Comm("all_gather", "ring", op["group"], 2 * op["comm_bytes"], comm_kind(op["group"])), steps * step
            )
            r.var_bwd += (kernels.time_cv(op["kind"], "bwd") * steps * step) ** 2
            continue
        bwd = kernels.backward(op)
        wgrad = weight_gradient_s(op, kernels)
        r.lp.wgrad_s += wgrad
        launched = kernels.host_s * kernels.launches(op, "bwd")
        r.host_bwd += launched
        # a weight GEMM's weight-gradient kernel is launched in the W pass under split backward
        r.host_bwd_input += launched - (kernels.host_s if _weight_gemm(op) else 0.0)
        split = _weight_gemm(op) and 0 <= op["layer"] < blocks
        after = _tp_collective(graph, name, mesh, "succ") if split else None
        gather = _comm(nodes[after], "all_gather") if after is not None else None
        if overlap.ring_exchange and gather is not None and r.lp.bwd and r.lp.bwd[-1].comm == gather:
            # the output gradient's blocking gather, the pass's collective before this GEMM, pipelined with the
            # input-gradient GEMM's chunks
            assert after is not None
            members = mesh.size(nodes[after]["group"])
            chunk = _chunk_s(kernels, op["kind"], op["bwd_flops"] / 2, op["bytes"], members, overlap)
            for segments in (r.lp.bwd, r.lp.bwd_input):
                segments.pop()
            r.gather_into_gemm(replace(gather, engine="copy_engine"), members, chunk, backward=True)
            r.bwd += wgrad
            r.var_bwd += (kernels.time_cv(op["kind"], "bwd") * bwd) ** 2
            continue
        before = _tp_collective(graph, name, mesh, "pred") if _weight_gemm(op) else None
        reduced = before is not None and nodes[before]["bwd_collective"] in overlap.grad_input_beside_wgrad
        gathered = _regathered(graph, name, mesh)
        # a block's column-parallel backward under Transformer Engine's userbuffers: both collectives in SM kernels
        # beside GEMMs that leave them their SMs ("bulk" overlap)
        bulk = overlap.userbuffers and split and gathered is not None
        slowdown = overlap.gemm_slowdown if bulk else 1.0
        dgrad = slowdown * (bwd - wgrad)
        if gathered is not None:
            r.regather_bwd(replace(gathered, engine="userbuffers") if bulk else gathered, dgrad)
        elif dgrad > 0:
            r.bwd += dgrad
            r.bwd_input += dgrad
        r.var_bwd += (kernels.time_cv(op["kind"], "bwd") * bwd) ** 2
        if reduced:
            assert before is not None
            comm = _comm(nodes[before], nodes[before]["bwd_collective"])
            r.reduce_beside_wgrad(replace(comm, engine="userbuffers") if bulk else comm, slowdown * wgrad)
            taken.add(before)
        else:
            r.bwd += wgrad
    for r in runs.values():
        r.close_bwd()
    programs = {layer: r.lp for layer, r in runs.items()}
    for layer, first in copies.items():
        lp = programs[first]
        programs[layer] = replace(lp, layer=layer, fwd=list(lp.fwd), bwd=list(lp.bwd), bwd_input=list(lp.bwd_input),
                                  sac=list(lp.sac), selective_comm=list(lp.selective_comm),
                                  same_as=first)  # fmt: skip
    return dict(sorted(programs.items())) if copies else programs


@dataclass(frozen=True)
class AxisComm:
    """A layer's blocking collectives on one mesh axis, one micro-batch: seconds and bytes this rank sends, per pass."""

    axis: str
    fwd_s: float = 0.0
    bwd_s: float = 0.0
    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0


@dataclass(frozen=True)
class LayerCost:
    """One layer, one micro-batch, one rank: the sums of its ``LayerProgram`` (the analytic engine's view).

    Times in seconds: ``fwd_s``/``bwd_s`` compute; ``bwd_weight_s`` the weight-gradient part of ``bwd_s``;
    ``selective_fwd_s`` the forward time of the ops that selective recompute rebuilds; ``comm`` the blocking
    collectives per mesh axis (Megatron-LM's tensor-parallel ones are on the critical path; an asynchronous one for
    what it outlasts the compute beside it); ``sync_fwd_s`` / ``sync_bwd_s`` what those collectives wait for their
    slowest member, per pass (``Segment.wait_s``); ``interference_fwd_s`` / ``interference_bwd_s`` what the compute
    beside the asynchronous ones loses to them, per pass, and ``overlapped_s`` how long both ran; ``host_fwd_s`` /
    ``host_bwd_s`` the part of ``fwd_s`` / ``bwd_s`` the GPU waits for the host to launch kernels
    (``Segment.host_wait_s``). ``sac_*``: what a per-op remat policy reruns (compute, its collectives per axis, their
    waits, matmul FLOPs) and keeps (bytes).
    """

    fwd_s: float = 0.0
    bwd_s: float = 0.0
    bwd_weight_s: float = 0.0
    selective_fwd_s: float = 0.0
    comm: tuple[AxisComm, ...] = ()
    sync_fwd_s: float = 0.0
    sync_bwd_s: float = 0.0
    interference_fwd_s: float = 0.0
    interference_bwd_s: float = 0.0
    overlapped_s: float = 0.0
    host_fwd_s: float = 0.0
    host_bwd_s: float = 0.0
    fwd_matmul_flops: float = 0.0
    selective_matmul_flops: float = 0.0
    params: float = 0.0
    expert_params: float = 0.0  # of ``params``, the routed experts' (``LayerProgram``)
    #: the weight elements of its FP8 linear layers and how many there are (``LayerProgram``)
    fp8_params: float = 0.0
    fp8_linears: int = 0
    saved_bytes: float = 0.0
    selective_saved_bytes: float = 0.0
    saved_reserved_bytes: float = 0.0
    selective_saved_reserved_bytes: float = 0.0
    wgrad_saved_reserved_bytes: float = 0.0
    transient_bytes: float = 0.0
    wgrad_saved_bytes: float = 0.0
    bwd_workspace_bytes: float = 0.0
    #: selective recompute's collectives beside its kernels (exposed seconds, bytes) and what compute loses to them
    selective_comm: tuple[AxisComm, ...] = ()
    selective_interference_s: float = 0.0
    sac_fwd_s: float = 0.0
    sac_comm: tuple[AxisComm, ...] = ()
    sac_sync_s: float = 0.0
    sac_host_s: float = 0.0
    sac_matmul_flops: float = 0.0
    sac_kept_bytes: float = 0.0
    sac_kept_reserved_bytes: float = 0.0

    @property
    def selective_comm_s(self) -> float:
        """Seconds selective recompute's collectives add beyond the kernels they run beside, every axis."""
        return sum(c.fwd_s for c in self.selective_comm)

    @property
    def sac_comm_s(self) -> float:
        """Seconds of the collectives a per-op policy reruns, every axis."""
        return sum(c.fwd_s for c in self.sac_comm)

    @property
    def comm_fwd_s(self) -> float:
        """Seconds of the forward pass's collectives, every axis."""
        return sum(c.fwd_s for c in self.comm)

    @property
    def comm_bwd_s(self) -> float:
        """Seconds of the backward pass's collectives, every axis."""
        return sum(c.bwd_s for c in self.comm)

    @property
    def interference_s(self) -> float:
        """Seconds both passes' compute loses beside their asynchronous collectives."""
        return self.interference_fwd_s + self.interference_bwd_s

    @property
    def comm_fwd_bytes(self) -> float:
        """Bytes this rank sends in the forward pass's collectives, every axis."""
        return sum(c.fwd_bytes for c in self.comm)


def _priced(
    segments: Iterable[Segment], price: CommPricer, rate: RateBeside
) -> tuple[dict[str, tuple[float, float]], float, float]:
    """Per axis, (exposed seconds, bytes sent) of the collectives among ``segments``, and the seconds compute beside
    the asynchronous ones lost to them and ran beside them: an asynchronous collective of ``T`` seconds beside
    ``W`` seconds of compute slows it to ``rate`` while both run (``plansim.costs.interference.overlap_cost``) and
    is exposed for what outlasts the slowed compute, ``max(0, T - W - lost)``."""
    out: dict[str, tuple[float, float]] = {}
    lost = overlapped = 0.0
    for seg in segments:
        if seg.comm is not None:
            seconds, sent = price(seg.comm.axis, seg.comm.collective, seg.comm.n_bytes)
            exposed = seconds
            if seg.hidden_s > 0:
                ran, cost = overlap_cost(seg.hidden_s, seconds, rate(seg.comm, seconds, sent))
                lost += cost
                overlapped += ran
                exposed = max(0.0, seconds - seg.hidden_s - cost)
            was = out.get(seg.comm.axis, (0.0, 0.0))
            out[seg.comm.axis] = (was[0] + exposed, was[1] + sent)
    return out, lost, overlapped


def _full_speed(comm: Comm, seconds: float, sent: float) -> float:
    return 1.0


def layer_cost(lp: LayerProgram, price: CommPricer, rate: RateBeside = _full_speed) -> LayerCost:
    """The sums of one layer's program, each collective priced by ``price`` on its axis, compute beside the
    asynchronous ones at ``rate`` (default: full speed)."""
    (fwd, lost_fwd, ran_fwd), (bwd, lost_bwd, ran_bwd) = _priced(lp.fwd, price, rate), _priced(lp.bwd, price, rate)
    comm = []
    for axis in sorted(fwd.keys() | bwd.keys()):
        (fwd_s, fwd_bytes), (bwd_s, bwd_bytes) = fwd.get(axis, (0.0, 0.0)), bwd.get(axis, (0.0, 0.0))
        comm.append(AxisComm(axis, fwd_s, bwd_s, fwd_bytes, bwd_bytes))
    sac, _, _ = _priced(lp.sac, price, rate)  # blocking collectives only: nothing runs beside them
    selective, selective_lost, _ = _priced(lp.selective_comm, price, rate)
    sac_comm = tuple(AxisComm(axis, seconds, 0.0, sent) for axis, (seconds, sent) in sorted(sac.items()))
    return LayerCost(
        fwd_s=sum(seg.seconds for seg in lp.fwd),
        bwd_s=sum(seg.seconds for seg in lp.bwd),
        sync_fwd_s=sum(seg.wait_s for seg in lp.fwd),
        sync_bwd_s=sum(seg.wait_s for seg in lp.bwd),
        host_fwd_s=sum(seg.host_wait_s for seg in lp.fwd),
        host_bwd_s=sum(seg.host_wait_s for seg in lp.bwd),
        interference_fwd_s=lost_fwd,
        interference_bwd_s=lost_bwd,
        overlapped_s=ran_fwd + ran_bwd,
        bwd_weight_s=lp.wgrad_s,
        selective_fwd_s=lp.selective_s,
        selective_comm=tuple(AxisComm(axis, seconds, 0.0, sent) for axis, (seconds, sent) in sorted(selective.items())),
        selective_interference_s=selective_lost,
        comm=tuple(comm),
        fwd_matmul_flops=lp.fwd_matmul_flops,
        selective_matmul_flops=lp.selective_matmul_flops,
        params=lp.params,
        expert_params=lp.expert_params,
        fp8_params=lp.fp8_params,
        fp8_linears=lp.fp8_linears,
        saved_bytes=lp.saved,
        selective_saved_bytes=lp.selective_saved,
        saved_reserved_bytes=lp.saved_reserved,
        selective_saved_reserved_bytes=lp.selective_saved_reserved,
        wgrad_saved_reserved_bytes=lp.wgrad_saved_reserved,
        transient_bytes=lp.transient,
        wgrad_saved_bytes=lp.wgrad_saved,
        bwd_workspace_bytes=lp.bwd_workspace,
        sac_fwd_s=sum(seg.seconds for seg in lp.sac),
        sac_comm=sac_comm,
        sac_sync_s=sum(seg.wait_s for seg in lp.sac),
        sac_host_s=sum(seg.host_wait_s for seg in lp.sac),
        sac_matmul_flops=lp.sac_matmul_flops,
        sac_kept_bytes=lp.sac_kept,
        sac_kept_reserved_bytes=lp.sac_kept_reserved,
    )


def layer_costs(
    programs: Mapping[int, LayerProgram], price: CommPricer, rate: RateBeside = _full_speed
) -> dict[int, LayerCost]:
    """``layer_cost`` of every layer's program (a copy of an earlier layer's shares its cost)."""
    out: dict[int, LayerCost] = {}
    for layer, lp in programs.items():
        same = out.get(lp.same_as) if lp.same_as is not None else None
        out[layer] = same if same is not None else layer_cost(lp, price, rate)
    return out


def layer_activations(cost: LayerCost, layer_input_bytes: float) -> LayerActivations:
    """The saved-activation view of a layer's costs, for the memory model."""
    return LayerActivations(
        full=cost.saved_bytes,
        selective=cost.saved_bytes - cost.selective_saved_bytes,
        layer_input=layer_input_bytes,
        op_kept=cost.sac_kept_bytes,
    )


def rerun_blocks(remat: str, blocks: Sequence[LayerCost], start: int = 0) -> list[LayerCost]:
    """The blocks ``remat`` checkpoints among ``blocks``, a pipeline rank's blocks in the order it runs their forward
    from its ``start``-th (``RematPolicy.checkpoints``: all, or every n-th)."""
    policy = REMAT_POLICIES[remat]
    if not policy.every:
        return list(blocks)
    return [c for k, c in enumerate(blocks, start) if policy.checkpoints(k)]


def rerun_sync_s(remat: str, blocks: Sequence[LayerCost]) -> float:
    """What the collectives of ``remat``'s rerun wait for their slowest member per micro-batch of these blocks: the
    checkpointed blocks' forward waits where the policy reruns their forward with its collectives, the waits of the
    collectives a per-op policy reruns, else none."""
    again = rerun_blocks(remat, blocks)
    block = Recompute(0.0, sum(c.sync_fwd_s for c in again), 0.0)
    unsaved = Recompute(0.0, sum(c.sac_sync_s for c in again), 0.0)
    return REMAT_POLICIES[remat].recompute(block, Recompute(0, 0, 0), unsaved)[1]


def rerun_host_s(remat: str, blocks: Sequence[LayerCost]) -> float:
    """What ``remat``'s rerun waits for the host's launches per micro-batch of these blocks (part of its compute
    seconds): the checkpointed blocks' forward waits, or those of the ops a per-op policy reruns, else none."""
    again = rerun_blocks(remat, blocks)
    block = Recompute(sum(c.host_fwd_s for c in again), 0.0, 0.0)
    unsaved = Recompute(sum(c.sac_host_s for c in again), 0.0, 0.0)
    return REMAT_POLICIES[remat].recompute(block, Recompute(0, 0, 0), unsaved)[0]


def rerun(remat: str, blocks: Sequence[LayerCost], start: int = 0) -> Recompute:
    """What ``remat``'s backward rebuilds per micro-batch of these blocks (compute s, blocking collective s, matmul
    FLOPs), a rank's blocks from its ``start``-th: its registry entry's rule (``plansim.costs.remat_policies``) over
    the checkpointed blocks' forward, attention core, or the ops a per-op policy reruns."""
    blocks = rerun_blocks(remat, blocks, start)
    block = Recompute(  # a rerun forward's interference goes with its collectives
        sum(c.fwd_s for c in blocks),
        sum(c.comm_fwd_s + c.interference_fwd_s for c in blocks),
        sum(c.fwd_matmul_flops for c in blocks),
    )
    core = Recompute(  # its ring exchange's exposed time and interference go with its collectives, as the block's
        sum(c.selective_fwd_s for c in blocks),
        sum(c.selective_comm_s + c.selective_interference_s for c in blocks),
        sum(c.selective_matmul_flops for c in blocks),
    )
    unsaved = Recompute(
        sum(c.sac_fwd_s for c in blocks), sum(c.sac_comm_s for c in blocks), sum(c.sac_matmul_flops for c in blocks)
    )
    return REMAT_POLICIES[remat].recompute(block, core, unsaved)


def rerun_axis_bytes(remat: str, blocks: Sequence[LayerCost]) -> dict[str, float]:
    """Per mesh axis, the bytes one rank sends per micro-batch in ``remat``'s rerun of these blocks (a rank's, in
    order): the checkpointed blocks' forward collectives where it reruns their forward, the collectives a per-op
    policy reruns; empty where it reruns none."""
    reruns = REMAT_POLICIES[remat].reruns
    if reruns not in ("block_forward", "unsaved_ops", "attention_core"):
        return {}
    out: dict[str, float] = {}
    for c in rerun_blocks(remat, blocks):
        rerun_comm = {"block_forward": c.comm, "unsaved_ops": c.sac_comm, "attention_core": c.selective_comm}[reruns]
        for a in rerun_comm:
            out[a.axis] = out.get(a.axis, 0.0) + a.fwd_bytes
    return out
