"""Offloading to host memory (``Strategy.offload``), defined once for both engines: what leaves the GPU for the
host, and what the step then waits for on the host link and the CPU.

Three kinds, each as its framework runs it (the framework's ``offload`` rule, ``frameworks/*.yaml``):

- ``optimizer`` (ZeRO-Offload; Megatron-LM's ``--optimizer-cpu-offload``; FSDP2's ``CPUOffloadPolicy``): the fp32
  master weights, momentum and variance live in host memory and the CPU runs Adam over the rank's shard. The rank's
  gradient shard is copied device-to-host, beside the last micro-batch's backward where the framework copies from its
  reduction hooks (``grads_copied_in_backward``: what is exposed is the copy beyond that backward), else after it;
  the CPU steps the shard at the node's ``cpu_adam_params_per_s`` shared by its GPUs; the updated low-precision
  weights are copied host-to-device (unless the parameters live on the host too). The GPU keeps only its gradient
  clipping of the step (``plansim.step.optimizer``).
- ``params`` (ZeRO-Infinity's ``offload_param``, ZeRO-3; FSDP2's ``CPUOffloadPolicy``): each layer's parameter shard
  lives in host memory and is copied to the GPU before each of its all-gathers, once per pass and micro-batch;
  prefetched as the gathers are, so every fetch but a pass's first hides behind the pass's compute: exposed per pass
  is the first layer's fetch and what the others' take beyond the pass's compute.
- ``activations`` (Megatron-LM's ``--cpu-offloading-num-layers N``, Transformer Engine's CPU offload): the saved
  activations of the first N blocks are copied out after each block's forward and back before its backward on side
  streams; each direction hides behind the compute of the blocks after the first offloaded one (forward) and of the
  backward before the first offloaded block's (backward); exposed is the transfer beyond it, per micro-batch. The
  GPU no longer holds those blocks' saved activations between forward and backward (``plansim.step.memory``).

Every transfer is priced on the host link of the node profile's ``host`` section (``host_transfer_s``): bytes over
the achieved bandwidth of the rank's uplink, shared by the GPUs behind it (every rank copies at once), plus the
copy's latency. A direction's copies queue on it one after another, so a pass's copies add up.

This is a closed form, read by both engines alike: the analytic engine adds its parts to the step, the lowering
issues them as tasks of these durations after the stage's optimizer step. The host link is not a resource of the
discrete-event network: transfers of different kinds do not contend in it (each kind is exposed on its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from plansim.hardware import Cluster
from plansim.hardware.schema import HostSection
from plansim.step.data_parallel import sharded_params_are_master
from plansim.step.layers import LayerCost, LayerProgram
from plansim.strategy.frameworks import Offload, load_framework
from plansim.strategy.schema import Strategy
from plansim.units import dtype_bytes

__all__ = [
    "HOST_CATEGORIES",
    "OFFLOAD_PARTS",
    "OffloadLayer",
    "OffloadTimes",
    "cpu_adam_s",
    "host_bytes",
    "host_link_Bps",
    "host_tier",
    "host_transfer_s",
    "offload_layer",
    "offload_rule",
    "offload_times",
    "offloaded_blocks",
    "offloads",
    "on_gpu",
]

#: The step's time parts offloading adds (``Result.time_breakdown_s``, only where the strategy offloads): the host
#: link's transfers nothing hid, and the CPU's optimizer step.
OFFLOAD_PARTS = ("offload", "cpu_optimizer")

#: ``Result.host_memory["per_gpu_bytes"]`` keys: what one GPU's rank keeps in host memory.
HOST_CATEGORIES = ("weights", "gradients", "optimizer", "activations")

#: Bytes of one fp32 gradient element in host memory: DeepSpeed's and FSDP2's host gradient partition is fp32
#: (DeepSpeed stage_1_and_2.py:1563-1580 at cf443004 copies into the fp32 partition).
_HOST_GRAD_BYTES = 4


def offloads(s: Strategy, kind: str) -> bool:
    """Whether ``s`` keeps ``kind`` (optimizer, params, activations) in host memory."""
    return kind in s.offload


def offload_rule(s: Strategy) -> Offload:
    """``s``'s framework's ``offload`` rule."""
    return load_framework(s.framework).rules.offload.value


def offloaded_blocks(s: Strategy) -> int:
    """The transformer blocks whose activations go to the host (the first ones); 0 without activation offload."""
    return (s.offload_activation_layers or 0) if offloads(s, "activations") else 0


def _host(cluster: Cluster) -> HostSection:
    """The node's host section (the checks refuse offload on a node without one)."""
    host = cluster.node.host
    assert host is not None, "the checks refuse offload on a node without host data"
    return host


def _node_gpus(cluster: Cluster) -> int:
    """The GPUs the run uses on one node, which share its CPUs and host memory."""
    return min(cluster.gpus_per_node, cluster.num_gpus)


def _sharing(cluster: Cluster) -> int:
    """GPUs copying at once over one uplink: those behind it, at most the GPUs the run uses on a node."""
    return max(1, min(_host(cluster).gpus_per_uplink, cluster.num_gpus))


def host_link_Bps(cluster: Cluster) -> float:
    """Bytes per second one GPU moves per direction over its host link while every rank copies: the uplink's
    achieved rate shared by the GPUs behind it."""
    return _host(cluster).achieved_Bps / _sharing(cluster)


def host_transfer_s(cluster: Cluster, nbytes: float) -> float:
    """Seconds one copy of ``nbytes`` takes over the host link: bytes over ``host_link_Bps`` plus its latency
    (0 for nothing)."""
    if nbytes <= 0:
        return 0.0
    return nbytes / host_link_Bps(cluster) + _host(cluster).link_latency_s


def cpu_adam_s(cluster: Cluster, params: float) -> float:
    """Seconds the CPU takes to step ``params`` parameters of one rank: the node's CPU-Adam rate shared by the GPUs
    the run uses on it."""
    return params / (_host(cluster).cpu_adam_params_per_s / _node_gpus(cluster))


def _local(s: Strategy, params: float) -> float:
    """The parameters a rank's optimizer steps (its shard under ZeRO >= 1)."""
    return params / (s.shard_degree if s.zero >= 1 else 1)


def _shard_bytes_per_param(s: Strategy) -> int:
    """Bytes of one element of the sharded parameters: fp32 where they are the master weights (FSDP2), else the
    compute dtype."""
    return 4 if sharded_params_are_master(s) else dtype_bytes(s.compute_dtype)


def on_gpu(s: Strategy, states: Mapping[str, float]) -> dict[str, float]:
    """The model states a rank keeps on the GPU (``states``: weights, gradients, optimizer as the GPU would hold
    them without offloading): the optimizer states leave it with ``optimizer``, and so does the gradient shard where
    the framework keeps it on the host (``grads_on_host``, ZeRO >= 2); the parameter shard leaves it with ``params``
    (ZeRO-3's gathered layers stay: ``plansim.step.memory.static_bytes``)."""
    out = dict(states)
    if offloads(s, "optimizer"):
        out["optimizer"] = 0.0
        if offload_rule(s).grads_on_host and s.zero >= 2:
            out["gradients"] = 0.0
    if offloads(s, "params"):
        out["weights"] = 0.0
    return out


def host_bytes(s: Strategy, states: Mapping[str, float], params: float, activations: float) -> dict[str, float]:
    """What one rank keeps in host memory, by ``HOST_CATEGORIES``: the optimizer states it offloads (as the GPU
    would hold them: fp32 master, momentum and variance), the host gradient partition (fp32; a copy where the GPU
    keeps its gradients, Megatron-LM's pinned buffers), the parameter shard, and ``activations`` (one micro-batch's
    offloaded blocks: no pipelining with it)."""
    out = dict.fromkeys(HOST_CATEGORIES, 0.0)
    if offloads(s, "optimizer"):
        out["optimizer"] = states["optimizer"]
        rule = offload_rule(s)
        local = _local(s, params)
        out["gradients"] = local * (_HOST_GRAD_BYTES if rule.grads_on_host else s.grad_bytes)
    if offloads(s, "params"):
        out["weights"] = states["weights"]
    out["activations"] = activations
    return out


def host_tier(cluster: Cluster, per_gpu: Mapping[str, float]) -> dict[str, object]:
    """``Result.host_memory``: one rank's host bytes by category (the worst stage's), the node's (every GPU the run
    uses on it holds as much), the node's host memory, and whether it fits."""
    host = _host(cluster)
    gpu = round(sum(per_gpu.values()))
    node = gpu * _node_gpus(cluster)
    return {
        "per_gpu_bytes": {k: round(per_gpu.get(k, 0.0)) for k in HOST_CATEGORIES},
        "per_gpu_total_bytes": gpu,
        "per_node_bytes": node,
        "capacity_bytes": host.memory_bytes,
        "fits": node <= host.memory_bytes,
    }


class OffloadLayer(NamedTuple):
    """What offloading reads of one layer of a stage (forward order): whether it is a transformer block, its
    parameters, the activations it saves per micro-batch, and its forward and backward compute per micro-batch."""

    block: bool
    params: float
    saved: float
    fwd_s: float
    bwd_s: float


def offload_layer(layer: LayerCost | LayerProgram, block: bool) -> OffloadLayer:
    """``OffloadLayer`` of a layer's priced sums (the analytic engine's) or its program (the lowering's): the same
    figures, a pass's compute the sum of its segments."""
    if isinstance(layer, LayerCost):
        return OffloadLayer(block, layer.params, layer.saved_bytes, layer.fwd_s, layer.bwd_s)
    fwd = sum(seg.seconds for seg in layer.fwd)
    bwd = sum(seg.seconds for seg in layer.bwd)
    return OffloadLayer(block, layer.params, layer.saved, fwd, bwd)


@dataclass(frozen=True)
class OffloadTimes:
    """A stage's waits for the host per step, seconds: the gradients' copy out beyond what hid it, the CPU's Adam,
    the updated weights' copy back, the parameter fetches beyond the compute they hide behind, and the
    activations' copies beyond theirs."""

    grads_out_s: float = 0.0
    cpu_adam_s: float = 0.0
    weights_in_s: float = 0.0
    param_fetch_s: float = 0.0
    activations_s: float = 0.0

    @property
    def transfer_s(self) -> float:
        """The step's ``offload`` part: what the host link's transfers add."""
        return self.grads_out_s + self.weights_in_s + self.param_fetch_s + self.activations_s

    def parts(self) -> dict[str, float]:
        """The time parts (``OFFLOAD_PARTS``)."""
        return {"offload": self.transfer_s, "cpu_optimizer": self.cpu_adam_s}


def _param_fetch_s(cluster: Cluster, s: Strategy, layers: Sequence[OffloadLayer], m: int) -> float:
    """ZeRO-3 with ``params``: each layer's shard copied in before its gather, per pass (forward and backward; only
    forward where the gathered weights stay to backward, ZeRO-2's SHARD_GRAD_OP) and micro-batch; a pass's first
    fetch is exposed, the others beyond the pass's compute."""
    per_byte = _shard_bytes_per_param(s) / s.shard_degree
    with_params = [x for x in layers if x.params > 0]
    if not with_params:
        return 0.0
    fetches = [host_transfer_s(cluster, x.params * per_byte) for x in with_params]
    forward = fetches[0] + max(0.0, sum(fetches[1:]) - sum(x.fwd_s for x in layers))
    total = forward
    if s.zero >= 3:  # backward gathers again, in reverse order
        backward = fetches[-1] + max(0.0, sum(fetches[:-1]) - sum(x.bwd_s for x in layers))
        total += backward
    return m * total


def _activations_s(cluster: Cluster, s: Strategy, layers: Sequence[OffloadLayer], m: int) -> float:
    """The first ``offloaded_blocks`` blocks' saved activations, out in forward and back in backward, each per
    micro-batch: what each direction's copies take beyond the compute that hides them (forward: the layers after
    the first offloaded block; backward: the layers after it too, which run their backward before it)."""
    n = offloaded_blocks(s)
    blocks = [i for i, x in enumerate(layers) if x.block]
    chosen = blocks[:n]
    if not chosen:
        return 0.0
    copies = sum(host_transfer_s(cluster, layers[i].saved) for i in chosen)
    after = layers[chosen[0] + 1 :]
    out = max(0.0, copies - sum(x.fwd_s for x in after))
    back = max(0.0, copies - sum(x.bwd_s for x in after))
    return m * (out + back)


def offload_times(cluster: Cluster, s: Strategy, params: float, layers: Sequence[OffloadLayer]) -> OffloadTimes:
    """The waits a stage holding ``params`` parameters and ``layers`` (forward order) adds to the step for what
    ``s`` offloads; the gradients' copy hides, where the framework copies in backward, behind the stage's backward of
    its last micro-batch. Zero for a strategy that offloads nothing."""
    if not s.offload:
        return OffloadTimes()
    m = s.num_microbatches
    grads_out = cpu = weights_in = 0.0
    if offloads(s, "optimizer"):
        local = _local(s, params)
        copy = host_transfer_s(cluster, local * s.grad_bytes)
        last_bwd_s = sum(x.bwd_s for x in layers)
        grads_out = max(0.0, copy - last_bwd_s) if offload_rule(s).grads_copied_in_backward else copy
        cpu = cpu_adam_s(cluster, local)
        if not offloads(s, "params"):
            weights_in = host_transfer_s(cluster, local * dtype_bytes(s.compute_dtype))
    fetch = _param_fetch_s(cluster, s, layers, m) if offloads(s, "params") else 0.0
    acts = _activations_s(cluster, s, layers, m) if offloads(s, "activations") else 0.0
    return OffloadTimes(grads_out, cpu, weights_in, fetch, acts)
