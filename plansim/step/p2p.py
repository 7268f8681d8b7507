"""Pipeline sends as Megatron-LM issues them, defined once for both engines: what a send costs the stage that makes
it beyond its transfer, and what a received activation costs before it can be used.

Blocking calls. Under the schedules whose registry entry says ``blocking_p2p`` (all but the interleaved one, see
``plansim.schedules.PipelineSchedule``), Megatron-LM runs each pipeline send inside one ``_communicate`` call:
``torch.distributed.batch_isend_irecv`` over the call's sends and receives, a ``wait()`` on every request, then
``torch.cuda.synchronize()`` (``batch_p2p_sync``) (NVIDIA/Megatron-LM d98e8a64,
``megatron/core/pipeline_parallel/p2p_communication.py``, ``_communicate`` and ``_batched_p2p_ops``). In the 1F1B
steady state a send shares its call with the receive the next pass needs (``send_forward_recv_backward`` after a
forward, ``send_backward_recv_forward`` after a backward: ``schedules.py``,
``forward_backward_pipelining_without_interleaving``), so each send is one call. The stage's compute waits for the
transfer (the host is blocked in the synchronize), and after the synchronize nothing is queued on the device: it
idles until the host has launched the next kernel, one kernel launch (the GPU profile's ``kernel_launch_s``). The
call's own NCCL kernel is launched while the device still runs the pass before it (the host runs ahead of the
device), so it adds nothing. The interleaved schedule's separate ``isend``/``irecv`` (``overlap_p2p_comm``) block
nothing: the receiver waits for the data where it needs it.

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
"""

from __future__ import annotations

import networkx as nx

from plansim.hardware import GPUSpec
from plansim.schedules import get_schedule
from plansim.strategy import Strategy
from plansim.taskgraph import Comm

__all__ = ["call_overhead_s", "regather"]


def call_overhead_s(gpu: GPUSpec, s: Strategy) -> float:
    """Seconds a blocking pipeline call keeps the stage's compute idle beyond its transfer: the launch of the next
    kernel after ``torch.cuda.synchronize()`` has drained the device; 0 for schedules whose sends do not block."""
    return gpu.kernel_launch_s if get_schedule(s.schedule).blocking_p2p else 0.0


def regather(graph: nx.DiGraph, s: Strategy) -> Comm | None:
    """The all-gather over the tensor-parallel group that rebuilds a received activation (or its gradient) from the
    1/tp chunks the scatter/gather optimization sends; None where nothing is split (tp = 1, or sequence parallelism,
    which sends its sequence shard as it is). Its message is the whole activation, as ``comm_bytes`` of the op
    graph's collectives."""
    if s.tp <= 1 or s.sequence_parallel:
        return None
    return Comm("all_gather", "ring", "tp", float(graph.graph["layer_input_bytes"]), "tp")
