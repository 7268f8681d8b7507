"""Compute slowed by communication beside it (``plansim.costs.interference``) against independent truth: the published
measurement it is calibrated from (given back exactly at the measured conditions), a brute-force time integration of
the closed form, the discrete-event engine on one compute task beside one collective (compute longer and
communication longer), the measured profile's precedence, and both engines on a ZeRO-3 step."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plansim
from plansim.costs.collectives import bytes_sent_per_rank
from plansim.costs.interference import (
    HBM_PER_BUS_BYTE,
    Load,
    collective_load,
    interference_model,
    memory_sensitivity,
    node_channels,
    overlap_cost,
    paced,
    send_load,
)
from plansim.costs.kernels import KernelTable
from plansim.des.engine import WhatIf, _Engine
from plansim.des.taskgraph import StageProgram, Task, TaskGraph
from plansim.errors import PlansimError
from plansim.hardware import load_gpu, load_hardware
from plansim.hardware.schema import OverlapMeasurement
from plansim.profiling.schema import Environment, KernelProfile, Overlap, OverlapPoint
from plansim.step.comm import Comm, Shift
from plansim.strategy.mesh import DeviceMesh

A100 = load_gpu("a100-sxm4-80gb")


# -- the calibration ------------------------------------------------------------------------------------------------


def test_the_published_measurement_is_given_back_at_its_conditions() -> None:
    """NVIDIA/nccl issue #1428: a GEMM 1.18 ms alone, 2.08 ms beside an all-gather inside a DGX A100 (24 channels,
    3 x 230 GB/s of HBM traffic, as the profile states its assumed conditions)."""
    model = interference_model(A100)
    assert model.slowdown(24, 3 * 230e9) == pytest.approx(2.08 / 1.18, rel=1e-12)
    # the SM share alone: 108 SMs, 24 held by NCCL
    assert interference_model(A100).slowdown(24, 0.0) == pytest.approx(108 / 84, rel=1e-12)
    # an all-gather inside the node is that very load
    cluster = load_hardware("dgx-a100", gpus=8)
    assert collective_load(cluster, 8, 1) == Load(24, HBM_PER_BUS_BYTE * 230e9)
    assert model.rate(collective_load(cluster, 8, 1)) == pytest.approx(1.18 / 2.08, rel=1e-12)
    assert "issue #1428" in model.source and model.source.startswith("published")


def test_memory_sensitivity_by_hand() -> None:
    """k = (f (S - c) / S - 1) B / H for the published figures."""
    m = A100.overlap
    assert m is not None
    f = 2.08 / 1.18
    expected = (f * (108 - 24) / 108 - 1) * 2039e9 / 690e9
    assert memory_sensitivity(m, 108, 2039e9) == pytest.approx(expected, rel=1e-12)
    # without an SM count the whole slowdown is put down to memory
    assert memory_sensitivity(m, None, 2039e9) == pytest.approx((f - 1) * 2039e9 / 690e9, rel=1e-12)


def test_a_gpu_without_a_published_measurement_takes_the_a100_sensitivity() -> None:
    h100 = load_gpu("h100-sxm5-80gb")
    assert h100.overlap is None
    model = interference_model(h100)
    assert model.sensitivity == interference_model(A100).sensitivity
    assert model.sm_count == 132 and model.hbm_Bps == h100.hbm_bandwidth_Bps
    assert "on A100-SXM4-80GB" in model.source


def test_channels_default_to_two_per_nic() -> None:
    """Issue #689: 2 SMs for one NIC, 16 for eight; dgx-a100 states its figures."""
    assert node_channels(load_hardware("dgx-h100", gpus=8).node, within_node=False) == 16
    assert node_channels(load_hardware("dgx-a100", gpus=8).node, within_node=True) == 24
    assert node_channels(load_hardware("dgx-a100", gpus=8).node, within_node=False) == 16


@given(
    c1=st.integers(0, 100),
    c2=st.integers(0, 100),
    h1=st.floats(0, 2e12),
    h2=st.floats(0, 2e12),
)
@settings(max_examples=60, deadline=None)
def test_more_load_never_speeds_compute(c1: int, c2: int, h1: float, h2: float) -> None:
    model = interference_model(A100)
    r1 = model.rate(Load(c1, h1))
    r2 = model.rate(Load(max(c1, c2), max(h1, h2)))
    assert 0 < r2 <= r1 <= 1


# -- the closed form ------------------------------------------------------------------------------------------------


@given(
    work=st.floats(1e-3, 1.0),
    comm=st.floats(1e-3, 1.0),
    rate=st.floats(0.2, 1.0),
)
@settings(max_examples=40, deadline=None)
def test_overlap_cost_matches_a_time_integration(work: float, comm: float, rate: float) -> None:
    """Integrate compute progress step by step (rate while the communication lasts, 1 after): its end time is
    ``work + cost``, and the time both ran is the overlapped time."""
    steps = 20_000
    end_guess = work / rate + comm
    dt = end_guess / steps
    done = t = both = 0.0
    while done < work:
        speed = rate if t < comm else 1.0
        step = min(dt, (work - done) / speed)
        if t < comm:
            step = min(step, comm - t) if comm - t > 0 else step
            both += step
        done += speed * step
        t += step
    overlapped, cost = overlap_cost(work, comm, rate)
    assert t == pytest.approx(work + cost, rel=1e-9)
    assert both == pytest.approx(overlapped, rel=1e-9)


# -- the discrete-event engine equals the closed form on one compute task beside one collective ---------------------


def _one_overlap(cluster, comm: Comm, work_s: float, mesh: DeviceMesh) -> tuple[float, float, float]:
    """Run one compute task of ``work_s`` and, beside it from t = 0, one collective on the dp (or p2p) stream.
    Returns (compute end, collective seconds, interference the engine booked)."""
    stream = "p2p" if comm.axis == "pp" else "dp"
    prog = StageProgram(0, [Task("gemm", "compute", "forward", work_s), Task("coll", stream, "grad_reduce", comm=comm)])
    stages = [prog] + [StageProgram(i) for i in range(1, mesh.size("pp"))]
    graph = TaskGraph(stages=stages, mesh=mesh, num_microbatches=1, model_flops=0.0, hardware_flops=0.0)
    engine = _Engine(graph, cluster, "symmetric", WhatIf())
    engine.run()
    dev = engine.devices[0]
    return dev.end[0], dev.end[1] - dev.start[1], dev.extra.get(0, 0.0)


@pytest.mark.parametrize("gpus", [8, 32])  # one node (24 channels, NVLink), four nodes (16 channels, NICs)
@pytest.mark.parametrize("n_bytes", [1e6, 1e8, 1e9, 4e9])
@pytest.mark.parametrize("work_s", [1e-3, 2e-2])
def test_des_equals_the_closed_form_beside_a_collective(gpus: int, n_bytes: float, work_s: float) -> None:
    cluster = load_hardware("dgx-a100", gpus=gpus)
    mesh = DeviceMesh((("tp", 1), ("dp", gpus), ("pp", 1)))
    comm = Comm("all_reduce", "ring", "dp", n_bytes, "dp")
    end, comm_s, booked = _one_overlap(cluster, comm, work_s, mesh)
    # an NCCL call loads HBM at its own pace: its bytes over the seconds it ran, not at the link's rate
    wire_s = bytes_sent_per_rank("all_reduce", "ring", gpus, n_bytes) / cluster.group_link(gpus, 1).bandwidth_Bps
    assert wire_s < comm_s
    rate = interference_model(cluster.gpu).rate(paced(collective_load(cluster, gpus, 1), wire_s, comm_s))
    assert interference_model(cluster.gpu).rate(collective_load(cluster, gpus, 1)) < rate < 1
    _, cost = overlap_cost(work_s, comm_s, rate)
    assert end == pytest.approx(work_s + cost, rel=1e-6)
    assert booked == pytest.approx(cost, rel=1e-6)


def test_the_cases_cover_compute_longer_and_communication_longer() -> None:
    cluster = load_hardware("dgx-a100", gpus=8)
    mesh = DeviceMesh((("tp", 1), ("dp", 8), ("pp", 1)))
    rate = interference_model(cluster.gpu).rate(collective_load(cluster, 8, 1))
    kinds = set()
    for n_bytes in (1e6, 4e9):
        for work_s in (1e-3, 2e-2):
            _, comm_s, _ = _one_overlap(cluster, Comm("all_reduce", "ring", "dp", n_bytes, "dp"), work_s, mesh)
            kinds.add(comm_s > work_s / rate)
    assert kinds == {True, False}


@pytest.mark.parametrize("n_bytes", [1e6, 1e8, 2e9])
def test_des_equals_the_closed_form_beside_a_pipeline_send(n_bytes: float) -> None:
    """A send from stage 0 to stage 1 on another node (tp = dp = 8): 2 channels, 3 HBM bytes per byte sent."""
    cluster = load_hardware("dgx-a100", gpus=16)
    mesh = DeviceMesh((("tp", 8), ("dp", 1), ("pp", 2)))
    comm = Comm("send_recv", "direct", "pp", n_bytes, "pp", peers=Shift(1))
    end, comm_s, _ = _one_overlap(cluster, comm, 5e-3, mesh)
    load = send_load(cluster, 0, 8)
    assert load == Load(2, 3.0 * cluster.p2p_link(0, 8).bandwidth_Bps)
    _, cost = overlap_cost(5e-3, comm_s, interference_model(cluster.gpu).rate(load))
    assert end == pytest.approx(5e-3 + cost, rel=1e-6)


# -- both engines on whole steps ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        "dp=8,micro_batch=2,global_batch=32,zero=3",  # gathers beside forward; gathers, reduce-scatters beside backward
        "dp=8,micro_batch=2,global_batch=32",  # the last micro-batch's buckets beside its backward
        "dp=32,micro_batch=2,global_batch=128,zero=2",  # every micro-batch's buckets beside its backward
    ],
)
def test_engines_agree_on_interference(strategy: str) -> None:
    """Both engines time the dp stream beside the layers' passes in the lowering's issue order
    (``step.data_parallel``): a bucket once its gradients are complete, buckets in order, the next micro-batch after
    the previous one's buckets (ZeRO-2), ZeRO-3's gathers one layer ahead. Before, the closed form let the
    reduction start with backward and hid all but the last bucket (6 % apart here), and the DES ran a ZeRO-2
    micro-batch's last bucket beside the next forward (4 %)."""
    gpus = int(strategy.split(",")[0][3:])
    a = plansim.simulate("gpt3-350m", "dgx-a100", strategy, gpus=gpus)
    d = plansim.simulate("gpt3-350m", "dgx-a100", strategy, gpus=gpus, engine="des")
    assert a.time_breakdown_s["interference"] > 0
    assert d.time_breakdown_s["interference"] == pytest.approx(a.time_breakdown_s["interference"], rel=1e-6)
    assert d.overlap["overlapped_comm_s"] == pytest.approx(a.overlap["overlapped_comm_s"], rel=1e-6)
    assert d.time_breakdown_s["exposed_comm"] == pytest.approx(a.time_breakdown_s["exposed_comm"], rel=1e-6)
    assert d.step_time_s == pytest.approx(a.step_time_s, rel=1e-6)
    for r in (a, d):
        assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)
        assert r.overlap["interference_s"] == r.time_breakdown_s["interference"]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("gpus", [8, 16])
@pytest.mark.parametrize("algorithm", ["ring", "tree", "ps", "naive", "butterfly", "hierarchical", "nccl"])
def test_engines_agree_on_overlapped_data_parallel_traffic(algorithm: str, gpus: int, zero: int) -> None:
    """Exposed data-parallel communication and step time with overlap on, one and two DGX A100 nodes, every
    all-reduce algorithm (ZeRO >= 1 reduce-scatters with its shard algorithm), two micro-batches. The tree, the
    parameter server and the naive exchange are slower than gpt3-125m's backward across two nodes: their exposure is
    the whole chain of buckets from the first launch (5 ms more than the old closed form's ``t - backward``)."""
    s = f"dp={gpus},micro_batch=1,global_batch={2 * gpus},zero={zero},dp_algorithm={algorithm}"
    a = plansim.simulate("gpt3-125m", "dgx-a100", s, gpus=gpus)
    d = plansim.simulate("gpt3-125m", "dgx-a100", s, gpus=gpus, engine="des")
    assert a.time_breakdown_s["exposed_comm"] > 0
    assert d.time_breakdown_s["exposed_comm"] == pytest.approx(a.time_breakdown_s["exposed_comm"], rel=1e-6)
    assert d.time_breakdown_s["interference"] == pytest.approx(a.time_breakdown_s["interference"], rel=1e-6)
    assert d.step_time_s == pytest.approx(a.step_time_s, rel=1e-6)


def test_a_bucket_waits_for_its_gradients_and_for_the_bucket_before() -> None:
    """The DES timeline: no bucket starts before backward has produced its gradients, buckets run one at a time, and
    a slow reduction (the tree across two nodes) is exposed from its first launch to its last bucket's end."""
    s = "dp=16,micro_batch=1,global_batch=16,dp_algorithm=tree"
    d = plansim.simulate("gpt3-125m", "dgx-a100", s, gpus=16, engine="des")
    assert d.timeline is not None
    spans = [x for x in d.timeline.spans if x.device == d.timeline.spans[0].device]
    backward = [x for x in spans if x.category == "backward"]
    buckets = [x for x in spans if x.category == "grad_reduce"]
    first_layer = min(x.end_s for x in backward if x.name.endswith(".L11"))  # the output layer (L12) has no gradient
    assert buckets[0].start_s >= first_layer > backward[0].start_s
    assert all(b.start_s >= a.end_s - 1e-12 for a, b in itertools.pairwise(buckets))
    exposed = buckets[-1].end_s - max(x.end_s for x in backward)
    assert d.time_breakdown_s["exposed_comm"] == pytest.approx(exposed, rel=1e-9)
    a = plansim.simulate("gpt3-125m", "dgx-a100", s, gpus=16)
    assert a.time_breakdown_s["exposed_comm"] == pytest.approx(exposed, rel=1e-6)


def test_zero2_next_microbatch_waits_for_the_previous_buckets() -> None:
    """Backward's end waits for its reductions (FSDP's final callback, DeepSpeed ZeRO-2's epilogue): the second
    micro-batch's forward starts after the first one's last bucket ends."""
    s = "dp=16,micro_batch=1,global_batch=32,zero=2,dp_algorithm=ring"
    d = plansim.simulate("gpt3-125m", "dgx-a100", s, gpus=16, engine="des")
    assert d.timeline is not None
    spans = [x for x in d.timeline.spans if x.device == d.timeline.spans[0].device]
    first = [x for x in spans if x.category == "grad_reduce" and x.name.startswith("reduce0.")]
    second_forward = min(x.start_s for x in spans if x.category == "forward" and x.name.startswith("F1."))
    assert second_forward >= first[-1].end_s - 1e-12


def test_without_data_parallelism_or_asynchronous_tp_collectives_nothing_interferes() -> None:
    """Under fsdp (DTensor) every tensor-parallel collective blocks; under megatron a column-parallel linear's
    input-gradient all-reduce runs beside its weight-gradient GEMM, which then runs slower."""
    s = "dp=1,tp=2,micro_batch=1,global_batch=4"
    for engine in ("analytic", "des"):
        r = plansim.simulate("gpt3-125m", "dgx-a100", f"{s},framework=fsdp", engine=engine)
        assert r.time_breakdown_s["interference"] == 0.0 and r.overlap["overlapped_comm_s"] == 0.0
        beside = plansim.simulate("gpt3-125m", "dgx-a100", s, engine=engine)
        assert beside.time_breakdown_s["interference"] > 0 and beside.overlap["overlapped_comm_s"] > 0


# -- a measured profile's overlap section takes precedence ----------------------------------------------------------

ENV = Environment(
    device="cuda", device_name="NVIDIA A100-SXM4-80GB", torch="2.13.0", python="3.11.7", platform="Linux",
    date="2026-11-21T00:00:00+00:00", command="plansim profile",
)  # fmt: skip


def test_a_measured_overlap_section_replaces_the_published_figure(tmp_path: Path) -> None:
    overlap = Overlap(
        load="copy_stream",
        channels=0,
        load_hbm_Bps=1.0e12,
        points=[
            OverlapPoint(op="gemm", dtype="bf16", shape=(8192, 8192, 2048), alone_s=1e-3, overlapped_s=1.2e-3,
                         repeats=20),
            OverlapPoint(op="add", dtype="bf16", shape=(8192, 2048), alone_s=1e-4, overlapped_s=1.9e-4, repeats=20),
        ],
    )  # fmt: skip
    profile = KernelProfile(environment=ENV, points=[], overlap=overlap)
    path = tmp_path / "a100.yaml"
    path.write_text(profile.to_yaml())
    table = KernelTable.from_profile(profile, "a100.yaml")
    assert table.overlap is not None and table.overlap.kernel == "gemm"  # the GEMMs' slowdown, 1.2
    model = interference_model(A100, table.overlap)
    assert model.source.startswith("measured: a100.yaml")
    # a copy stream holds no SMs: the measured 1.2 is all memory, at 1 TB/s of load on a 2,039 GB/s GPU
    assert model.sensitivity == pytest.approx(0.2 * 2039e9 / 1e12, rel=1e-12)
    assert model.slowdown(0, 1.0e12) == pytest.approx(1.2, rel=1e-12)
    assert overlap.slowdown("add") == pytest.approx(1.9)


def test_an_overlap_faster_than_alone_is_refused(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "hardware_profiles/gpus/a100-sxm4-80gb.yaml").read_text()
    bad = tmp_path / "gpu.yaml"
    bad.write_text(text.replace("overlapped_s: 2.08e-3", "overlapped_s: 1.0e-3"))
    with pytest.raises(PlansimError, match="overlapped_s") as err:
        load_gpu(bad)
    assert "\n" not in str(err.value)
    with pytest.raises(PlansimError, match="channels"):
        bad.write_text(text.replace("channels: 24", "channels: 200"))
        load_gpu(bad)


def test_overlap_measurement_is_a_plain_record() -> None:
    m = OverlapMeasurement(kernel="gemm", alone_s=1.0, overlapped_s=1.5, channels=8, load_hbm_Bps=1e11, source="x")
    assert math.isclose(memory_sensitivity(m, 100, 1e12), (1.5 * 92 / 100 - 1) * 10)
