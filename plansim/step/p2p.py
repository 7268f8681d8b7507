"""Pipeline sends as the framework issues them, defined once for both engines: what a send costs the stage that
makes it beyond its transfer, and what a received activation costs before it can be used.

Which sends block is the framework's ``pipeline_sends`` rule (``pipeline_sends``): Megatron-LM's under 1F1B,
with a host synchronisation after each call (below); DeepSpeed's pipeline engine's, whose blocking ``dist.send`` makes
the compute stream wait for the transfer without one; none under torch's pipelining (``fsdp``), which waits a send
only in a batch with the receive the next pass needs, or at the end of a phase, so its sends run beside compute as
the overlapped ones below do.

Blocking calls. Under 1F1B Megatron-LM runs each pipeline send inside one ``_communicate`` call:
``torch.distributed.batch_isend_irecv`` over the call's sends and receives, a ``wait()`` on every request, then
``torch.cuda.synchronize()`` (``batch_p2p_sync``) (NVIDIA/Megatron-LM d98e8a64,
``megatron/core/pipeline_parallel/p2p_communication.py``, ``_communicate`` and ``_batched_p2p_ops``). In the 1F1B
steady state a send shares its call with the receive the next pass needs (``send_forward_recv_backward`` after a
forward, ``send_backward_recv_forward`` after a backward: ``schedules.py``,
``forward_backward_pipelining_without_interleaving``), so each send is one call. The stage's compute waits for the
transfer (the host is blocked in the synchronize), and after the synchronize nothing is queued on the device: it
idles until the host has launched the next kernel: one launch's host time (the framework's ``kernel_launch``
rule) and the GPU's start of it (the GPU profile's ``kernel_launch_s``). The
call's own NCCL kernel is launched while the device still runs the pass before it (the host runs ahead of the
device), so it adds nothing. The interleaved schedule's separate ``isend``/``irecv`` (``overlap_p2p_comm``) block
nothing: the receiver waits for the data where it needs it.

Overlapped sends. With ``overlap_p2p_comm`` (NVIDIA/Megatron-LM d98e8a64,
``megatron/core/pipeline_parallel/schedules.py``, ``forward_backward_pipelining_with_interleaving``: ``pp_post_forward``
and ``pp_post_backward`` issue ``send_forward_recv_forward`` / ``send_backward_recv_backward`` with
``overlap_p2p_comm=True``, which ``p2p_communication.py`` turns into plain ``isend``/``irecv`` with
``wait_on_reqs=False``) a send is launched after the chunk's pass and the stage goes on with its next pass; its handle
is waited for only after the stage's next send of that direction is issued, and the receiver waits for its
``irecv``, posted one pass ahead, in ``pp_pre_forward`` / ``pp_pre_backward``, just before the pass that reads it.
The lowering runs exactly that: the send on the p2p stream after the pass, the receiver's first task of the next
chunk waiting for it, nothing on the sender's compute stream. ``OverlappedSends`` is the closed form of what this
costs the step, found by running ``plansim.pipeline.orders.interleaved_order`` with a delay on every chunk boundary
(``tests/test_p2p_overlap.py``): for p equal stages whose every transfer fits in one chunk pass (forward or
backward), the step grows by exactly the transfers of one micro-batch along the whole chain of chunks, forward and
back (``chain_s`` summed over the stages: ``2 (p v - 1)`` transfers), the pipeline's fill and drain, and the steady
state hides every send behind the passes the receiver runs meanwhile. A transfer longer than its direction's chunk
pass shows the rest in the steady state, once per send (``excess_s``): an estimate there, above the orders run pass by
pass, and equal to the p2p stream's own saturation once transfers outlast both passes. With unequal stages the
faster stages' idle time absorbs part of the chain, which the closed form still charges (an upper bound, within a few
per cent of the step for heavier first or last stages).

Not counted: the calls that only receive (``recv_forward`` before each warm-up forward and the first steady-state
one, ``recv_backward`` before each cool-down backward: one launch each, about 2 (p - 1) launches on 1F1B's critical
path, but one per micro-batch and stage under GPipe).

Scatter/gather. Without sequence parallelism each tensor-parallel rank sends 1/tp of the activation across the
stage boundary and the receiver rebuilds it with an all-gather over the tensor-parallel group (Narayanan et al.
2021, sec 4.1; Megatron-LM 0b44909c, ``megatron/p2p_communication.py``: ``split_tensor_into_1d_equal_chunks``
before the send, ``gather_split_1d_tensor`` after the receive, on the compute stream before the pass that reads
it). That all-gather is tensor-parallel traffic on the receiver's critical path, after every receive. With sequence
parallelism the activation is already split along the sequence and is sent as it is, with nothing to gather
(the same file skips the optimization ``if args.sequence_parallel``). Megatron-Core dropped the optimization when it
moved the pipeline code into ``megatron/core`` (3c92fa93, March 2023): there every rank sends the whole activation.
plansim prices the paper's scheme, as ``p2p_message_bytes`` does.

FP8 amax reduction (``amax_reduction``). Under delayed scaling Megatron-LM wraps each model chunk's pass in one
``fp8_autocast`` (NVIDIA/Megatron-LM d98e8a64, megatron/core/transformer/transformer_block.py:619-629) over the amax
reduction group, every rank of the stage (fp8_utils.py:857-866: ``get_amax_reduction_group(with_context_parallel=
True)``, data, tensor and context parallel); Transformer Engine all-reduces (MAX) the amaxes the pass recorded when
it leaves the region, blocking (NVIDIA/TransformerEngine d0067d0d, transformer_engine/pytorch/quantization.py:
645-690 and 772-782: ``reduce_and_update_fp8_tensors``, ``async_op=False``), and the backward's likewise: one small
all-reduce on the compute stream after each chunk's forward and backward pass, 4 B for each of a linear layer's 3
forward (input, weight, output) or 2 backward tensors. Current and block scaling reduce nothing across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from plansim.hardware import GPUSpec
from plansim.step.comm import Comm
from plansim.step.layers import CommPricer
from plansim.strategy.frameworks import load_framework
from plansim.strategy.mesh import STAGE_AXIS, mesh_of
from plansim.strategy.schema import Strategy

__all__ = ["OverlappedSends", "PipelineSends", "amax_reduction", "amax_reduction_s", "pipeline_sends", "regather"]


@dataclass(frozen=True)
class PipelineSends:
    """How a stage issues its pipeline sends under the strategy's schedule and framework: whether its compute waits
    for each send's transfer (``blocking``; else the send runs beside compute and only its receiver waits for it),
    and ``call_s``, what each blocking call keeps the compute idle beyond the transfer. The lowering turns it into a
    send task and, when blocking, a call task of ``call_s`` after it on the compute stream; the analytic engine into
    each send's seconds on the stage's critical path, or into ``OverlappedSends``."""

    blocking: bool
    call_s: float = 0.0


def pipeline_sends(gpu: GPUSpec, s: Strategy) -> PipelineSends:
    """The framework's ``pipeline_sends`` rule for ``s``'s schedule on ``gpu``: blocking where the rule names the
    schedule, and a blocking call's idle time the launch of the next kernel after ``torch.cuda.synchronize()`` has
    drained the device, where the framework's blocking calls end in one (Megatron-LM's); 0 where the wait is the
    stream's only."""
    rules = load_framework(s.framework).rules
    rule = rules.pipeline_sends.value
    blocking = s.schedule in rule.blocking
    launch = rules.kernel_launch.value.host_s + gpu.kernel_launch_s
    return PipelineSends(blocking, launch if blocking and rule.host_sync else 0.0)


def amax_reduction(s: Strategy, linears: int, forward: bool) -> Comm | None:
    """The all-reduce of the amaxes a model chunk's pass recorded (module docstring) over its FP8 linear layers
    (``linears``), forward or backward; None without delayed FP8 scaling, without FP8 layers in the chunk or on a
    stage of one rank."""
    if not s.fp8 or s.fp8_recipe != "delayed" or linears <= 0 or mesh_of(s).size(STAGE_AXIS) <= 1:
        return None
    return Comm("all_reduce", "ring", STAGE_AXIS, 4.0 * (3 if forward else 2) * linears, "tp")


def amax_reduction_s(s: Strategy, linears: int, forward: bool, price: CommPricer) -> float:
    """Seconds the compute stream waits for ``amax_reduction`` (0 where there is none), as the layers' collectives
    are priced (``price``: ``plansim.step.prepare.comm_pricer``). A call of a few hundred bytes is latency alone:
    both engines hold the stream for it rather than simulating its flows, and its bytes are not counted."""
    comm = amax_reduction(s, linears, forward)
    return price(comm.axis, comm.collective, comm.n_bytes)[0] if comm is not None else 0.0


def regather(graph: nx.DiGraph, s: Strategy) -> Comm | None:
    """The all-gather over the tensor-parallel group that rebuilds a received activation (or its gradient) from the
    1/tp chunks the scatter/gather optimization sends; None where nothing is split (tp = 1, or sequence parallelism,
    which sends its sequence shard as it is). Its message is the whole activation, as ``comm_bytes`` of the op
    graph's collectives."""
    if s.tp <= 1 or s.sequence_parallel:
        return None
    return Comm("all_gather", "ring", "tp", float(graph.graph["layer_input_bytes"]), "tp")


@dataclass(frozen=True)
class OverlappedSends:
    """One stage's sends of one micro-batch that run beside its compute (``overlap_p2p_comm``), per direction: how many
    and one transfer's seconds (each direction goes to one peer, over one link).

    >>> s = OverlappedSends(2, 0.1, 2, 0.3)
    >>> round(s.chain_s, 6)                        # its share of the pipeline's fill and drain
    0.8
    >>> round(s.excess_s(0.2, 0.4), 6), round(s.excess_s(0.05, 0.2), 6)   # exposed in the steady state
    (0.0, 0.3)
    """

    forward: int = 0
    forward_s: float = 0.0
    backward: int = 0
    backward_s: float = 0.0

    @property
    def chain_s(self) -> float:
        """Seconds these sends add once per step, on the chain of chunks that the first micro-batch's forward and
        the last one's backward cross with no pass beside them: every transfer of one micro-batch."""
        return self.forward * self.forward_s + self.backward * self.backward_s

    def excess_s(self, forward_pass_s: float, backward_pass_s: float) -> float:
        """Seconds per micro-batch these sends show in the steady state: what each transfer outlasts one chunk pass
        of its direction (the pass the receiver runs before it needs the data)."""
        return self.forward * max(0.0, self.forward_s - forward_pass_s) + self.backward * max(
            0.0, self.backward_s - backward_pass_s
        )
