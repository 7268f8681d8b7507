"""Physics is monotone: more of any hardware rate or capacity (or less of a latency or a per-call cost) never makes
a step slower, in either engine, nor a plan worse.

Each case scales one field of a shipped profile by a drawn factor and prices the same strategy on both clusters.
Causes found and fixed (issue 31): NCCL's tuner's pick timed as it runs flipped to a slower protocol as a channel's
bandwidth grew (``plansim.costs.nccl.nccl_call`` now runs the fastest pair); interference read the link's rate while
NCCL's call ran slower (``plansim.costs.interference.paced``); a NIC faster than its switch port counted in the
analytic engine but not in the discrete-event network (``NodeSpec.nic_share_Bps``); the published overlap
measurement read at the profile's own SMs and HBM bandwidth, so a copy with more of either interfered more (the
measurement now carries the GPU it was timed on).

The one stated exception is memory, not time: NCCL gives a network peer ``ceil(NIC GB/s / 14)`` channels, at least
one per local NIC (``ncclTopoGetNchannels``), so a faster or an extra NIC holds more NCCL buffers
(``plansim.step.memory``), a discrete choice NCCL makes; and NCCL connects an algorithm's channels only when a call
first runs it (src/enqueue.cc:495-505 at 5067397c), so a faster algorithm that NCCL's model now picks for some call
size (an NVLS call made cheaper, say) adds its connections' buffers. There only the ``nccl`` memory category may grow.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plansim
from plansim.hardware import Cluster, load_hardware
from plansim.hardware.schema import GPUSpec, NodeSpec

Scale = Callable[[Cluster, float], Cluster]


def _gpu(c: Cluster, **update: object) -> Cluster:
    return Cluster(c.node, c.gpu.model_copy(update=update), c.num_gpus)


def _node(c: Cluster, part: str, **update: object) -> Cluster:
    if part == "node":
        return Cluster(c.node.model_copy(update=update), c.gpu, c.num_gpus)
    section = getattr(c.node, part)
    return Cluster(c.node.model_copy(update={part: section.model_copy(update=update)}), c.gpu, c.num_gpus)


def _fraction(points: tuple[tuple[float, float], ...] | None, f: float) -> tuple[tuple[float, float], ...] | None:
    return None if points is None else tuple((size, min(1.0, frac * f)) for size, frac in points)


def _efficiency(c: Cluster, f: float) -> Cluster:
    e = c.gpu.efficiency
    curves = {k: _fraction(getattr(e, k), f) for k in ("matmul", "memory")}
    attention = {
        name: a.model_copy(update={"fwd": _fraction(a.fwd, f), "bwd": _fraction(a.bwd, f)})
        for name, a in c.gpu.attention_kernels.items()
    }
    return _gpu(c, efficiency=e.model_copy(update=curves), attention_kernels=attention)


def _busbw(c: Cluster, f: float) -> Cluster:
    intra = c.node.intra_node
    busbw = intra.allreduce_busbw_Bps * f
    return _node(
        c, "intra_node", allreduce_busbw_Bps=busbw, bandwidth_per_gpu_Bps=max(intra.bandwidth_per_gpu_Bps, busbw)
    )


def _fabric(c: Cluster, name: str, f: float, inverse: bool = False) -> Cluster:
    floor = 1.0 if name == "oversubscription" else 0.0  # a tier is at best non-blocking
    tiers = tuple(
        t.model_copy(update={name: max(floor, getattr(t, name) / f) if inverse else getattr(t, name) * f})
        for t in c.node.fabric
    )
    return _node(c, "node", fabric=tiers)


def _nccl(c: Cluster, name: str, f: float) -> Cluster:
    section = c.node.nccl
    value = None if section is None else getattr(section, name)
    if value is None:
        return c
    scaled = tuple(x * f for x in value) if isinstance(value, tuple) else value * f
    return _node(c, "nccl", **{name: scaled})


#: field -> how to scale it by f >= 1 in the direction that is better (a rate or capacity up; a latency, a per-call
#: cost or an oversubscription down)
FIELDS: dict[str, Scale] = {
    "gpu.memory_bytes": lambda c, f: _gpu(c, memory_bytes=int(c.gpu.memory_bytes * f)),
    "gpu.hbm_bandwidth_Bps": lambda c, f: _gpu(c, hbm_bandwidth_Bps=c.gpu.hbm_bandwidth_Bps * f),
    "gpu.peak_flops": lambda c, f: _gpu(
        c, peak_flops_by_dtype={k: v * f for k, v in c.gpu.peak_flops_by_dtype.items()}
    ),
    "gpu.sm_count": lambda c, f: _gpu(c, sm_count=round((c.gpu.sm_count or 1) * f)),
    "gpu.efficiency": _efficiency,
    "gpu.kernel_launch_s": lambda c, f: _gpu(c, kernel_launch_s=c.gpu.kernel_launch_s / f),
    "intra_node.bandwidth_per_gpu_Bps": lambda c, f: _node(
        c, "intra_node", bandwidth_per_gpu_Bps=c.node.intra_node.bandwidth_per_gpu_Bps * f
    ),
    "intra_node.allreduce_busbw_Bps": _busbw,
    "intra_node.link_bandwidth_Bps": lambda c, f: (
        c
        if c.node.intra_node.link_bandwidth_Bps is None
        else _node(c, "intra_node", link_bandwidth_Bps=c.node.intra_node.link_bandwidth_Bps * f)
    ),
    "intra_node.latency_s": lambda c, f: _node(c, "intra_node", latency_s=c.node.intra_node.latency_s / f),
    "nics.count": lambda c, f: _node(c, "nics", count=round(c.node.nics.count * f)),
    "nics.bandwidth_Bps": lambda c, f: _node(c, "nics", bandwidth_Bps=c.node.nics.bandwidth_Bps * f),
    "nics.efficiency": lambda c, f: _node(c, "nics", efficiency=min(1.0, c.node.nics.efficiency * f)),
    "nics.latency_s": lambda c, f: _node(c, "nics", latency_s=c.node.nics.latency_s / f),
    "fabric.bandwidth_Bps": lambda c, f: _fabric(c, "bandwidth_Bps", f),
    "fabric.latency_s": lambda c, f: _fabric(c, "latency_s", f, inverse=True),
    "fabric.oversubscription": lambda c, f: _fabric(c, "oversubscription", f, inverse=True),
    "nccl.channel_bw_intra_GBps": lambda c, f: _nccl(c, "channel_bw_intra_GBps", f),
    "nccl.channel_bw_inter_GBps": lambda c, f: _nccl(c, "channel_bw_inter_GBps", f),
    "nccl.ll128_channel_GBps": lambda c, f: _nccl(c, "ll128_channel_GBps", f),
    "nccl.nvls_bw_intra_GBps": lambda c, f: _nccl(c, "nvls_bw_intra_GBps", f),
    "nccl.nvls_bw_inter_GBps": lambda c, f: _nccl(c, "nvls_bw_inter_GBps", f),
    "nccl.call_us": lambda c, f: _nccl(c, "call_us", 1 / f),
    "nccl.sync_us": lambda c, f: _nccl(c, "sync_us", 1 / f),
    "nccl.nvls_call_us": lambda c, f: _nccl(c, "nvls_call_us", 1 / f),
    "nccl.nvls_sync_us": lambda c, f: _nccl(c, "nvls_sync_us", 1 / f),
}
#: fields where NCCL holds more buffers as they grow (the module's stated exception, memory only): the NICs, and
#: NCCL's own rates and per-call costs, which decide the algorithms it picks and so connects
MORE_NCCL_BUFFERS = {"nics.count", "nics.bandwidth_Bps"} | {f for f in FIELDS if f.startswith("nccl.")}

#: (model, node, GPUs, strategy): tensor parallelism with its layer calls inside a node, data parallelism across nodes
#: on NCCL's calls, ZeRO-3 per layer (FSDP), hybrid sharding, pipelines across nodes (sends, interleaving), an
#: NVLS node and expert parallelism's all-to-alls across nodes
CASES = [
    ("gpt3-1.3b", "dgx-a100", 16, "dp=2,tp=8,micro_batch=1,global_batch=64,sequence_parallel=true"),
    ("gpt3-1.3b", "dgx-a100", 16, "dp=16,tp=1,micro_batch=4,global_batch=64,zero=1"),
    ("gpt3-350m", "dgx-h100", 16, "dp=8,tp=2,micro_batch=1,global_batch=32,zero=3,framework=fsdp"),
    ("gpt3-350m", "dgx-h100", 16, "dp=16,micro_batch=2,global_batch=32,zero=2,framework=fsdp,dp_shard=8"),
    ("gpt3-1.3b", "dgx-a100", 32, "dp=2,tp=4,pp=4,micro_batch=1,global_batch=32,schedule=interleaved,virtual_stages=2"),
    ("gpt3-350m", "dgx-1", 16, "dp=4,tp=2,pp=2,micro_batch=2,global_batch=32,dtype=fp16"),
    # expert parallelism: ep groups of 8 every other rank over two nodes, the all-to-alls on NVLink and the NICs
    ("mixtral-8x7b", "dgx-h100", 16, "dp=8,tp=2,ep=8,micro_batch=1,global_batch=16,sequence_parallel=true,zero=1"),
]
#: a smaller set for the discrete-event engine
DES_CASES = [CASES[0], CASES[2], CASES[5], CASES[6]]


@cache
def _cluster(node: str, gpus: int) -> Cluster:
    return load_hardware(node, gpus=gpus)


@cache
def _priced(case: int, engine: str) -> plansim.Result:
    model, node, gpus, strategy = CASES[case]
    return plansim.simulate(model, _cluster(node, gpus), strategy, engine=engine)


def _check(case: int, field: str, factor: float, engine: str) -> None:
    model, node, gpus, strategy = CASES[case]
    base = _priced(case, engine)
    better = plansim.simulate(model, FIELDS[field](_cluster(node, gpus), factor), strategy, engine=engine)
    assert better.step_time_s <= base.step_time_s * (1 + 1e-9), (field, factor, base.step_time_s, better.step_time_s)
    grown = {k for k, v in better.memory_breakdown_bytes.items() if v > base.memory_breakdown_bytes[k]}
    assert not grown or (field in MORE_NCCL_BUFFERS and grown == {"nccl"}), (field, factor, grown)
    assert better.fits or not base.fits or field in MORE_NCCL_BUFFERS


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.integers(0, len(CASES) - 1),
    field=st.sampled_from(sorted(FIELDS)),
    factor=st.floats(1.0, 8.0),
)
def test_more_hardware_never_slows_the_analytic_step(case: int, field: str, factor: float) -> None:
    _check(case, field, factor, "analytic")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from([CASES.index(c) for c in DES_CASES]),
    field=st.sampled_from(sorted(FIELDS)),
    factor=st.floats(1.0, 8.0),
)
def test_more_hardware_never_slows_the_discrete_event_step(case: int, field: str, factor: float) -> None:
    _check(case, field, factor, "des")


@pytest.mark.parametrize(
    "field,factors",
    [
        ("nccl.channel_bw_intra_GBps", (2.5, 3.0)),  # the issue's repro: 1.222 -> 1.415 s at 3x
        ("intra_node.allreduce_busbw_Bps", (1.0, 8.0)),  # interference 99 -> 256 ms as busbw grew 8x
    ],
)
def test_the_issues_repros_are_monotone(field: str, factors: tuple[float, float]) -> None:
    """The series the issue reported, in both engines: the larger factor is never the slower step."""
    cluster = _cluster("dgx-a100", 16)
    strategy = CASES[0][3]
    for engine in ("analytic", "des"):
        lo, hi = (plansim.simulate("gpt3-1.3b", FIELDS[field](cluster, f), strategy, engine=engine) for f in factors)
        assert hi.step_time_s <= lo.step_time_s * (1 + 1e-9), (engine, lo.step_time_s, hi.step_time_s)


def test_a_nic_faster_than_its_switch_port_moves_what_the_port_does() -> None:
    """Doubling only the NICs (the switch ports stay at 25 GB/s) changes nothing in either engine: the port is the
    bottleneck in the discrete-event network, and now in the analytic engine's links too (the issue: the DES 8.5%
    slower, the analytic engine 4% faster)."""
    cluster = _cluster("dgx-a100", 16)
    faster = FIELDS["nics.bandwidth_Bps"](cluster, 2.0)
    assert faster.group_link(2, 8).bandwidth_Bps == cluster.group_link(2, 8).bandwidth_Bps
    strategy = CASES[1][3]
    for engine in ("analytic", "des"):
        base, fast = (plansim.simulate("gpt3-1.3b", c, strategy, engine=engine) for c in (cluster, faster))
        assert fast.step_time_s == pytest.approx(base.step_time_s, rel=1e-9), engine


def test_every_rate_field_of_the_schemas_is_covered() -> None:
    """A new rate, capacity or latency field in the hardware schemas needs its entry in ``FIELDS`` (or a reason
    here): the names ending in _Bps, _GBps, _s, _us, flops, memory_bytes, sm_count, count, efficiency."""
    rated = ("_Bps", "_GBps", "_s", "_us", "flops", "memory_bytes", "sm_count", "count", "efficiency")
    # not rates or capacities of this GPU or node: memory other things hold, a GPU's variation (a spread, not a
    # capacity), the node's and the fabric's shape (topology, not a rate)
    exempt = {"workspace_reserve_bytes", "cuda_context_bytes", "kernel_time_cv", "gpu_to_gpu_cv", "gpus_per_node",
              "nodes_per_switch"}  # fmt: skip
    covered = {name.split(".")[1] for name in FIELDS} | {"peak_flops_by_dtype", "efficiency"}
    names = (
        set(GPUSpec.model_fields)
        | {f"{name}" for part in ("intra_node", "nics", "nccl") for name in _fields_of(NodeSpec, part)}
        | set(_fields_of(NodeSpec, "fabric"))
    )
    missing = {n for n in names if n.endswith(rated) and n not in covered and n not in exempt}
    assert not missing, missing


def _fields_of(spec: type, part: str) -> set[str]:
    annotation = spec.model_fields[part].annotation  # type: ignore[attr-defined]
    for candidate in getattr(annotation, "__args__", ()) or (annotation,):
        inner = getattr(candidate, "model_fields", None)
        if inner is None and getattr(candidate, "__args__", None):
            inner = getattr(candidate.__args__[0], "model_fields", None)
        if inner is not None:
            return set(inner)
    return set()


@pytest.mark.parametrize("field", ["nics.efficiency", "gpu.memory_bytes"])
def test_more_hardware_never_makes_the_plan_worse(field: str) -> None:
    """The planner's winner (analytic, every candidate) on twice the field is never slower than on the profile: each
    candidate is no slower and fits where it fitted, so the best can only improve."""
    from plansim.planner import plan

    cluster = _cluster("dgx-a100", 16)
    kw = {"gpus": 16, "global_batch": 32, "des": False, "milp": False, "splits": False}
    base = plan("gpt3-125m", cluster, **kw).winner_result
    better = plan("gpt3-125m", FIELDS[field](cluster, 1.04 if field == "nics.efficiency" else 2.0), **kw).winner_result
    assert base is not None and better is not None
    assert better.step_time_s <= base.step_time_s * (1 + 1e-9), (field, base.step_time_s, better.step_time_s)
