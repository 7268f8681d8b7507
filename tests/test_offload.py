"""Offloading to host memory (``Strategy.offload``, ``plansim.step.offload``): transfers priced as bytes over the host
link's achieved bandwidth plus its latency, the CPU's Adam as the rank's shard over its share of the node's rate,
checked by hand; the GPU's memory drops by exactly what moves and the host tier holds it; both engines agree; what a
framework or node cannot run is refused in one line; more host bandwidth is never slower; without offload nothing
changes (the reference set, ``tests/test_reference_results.py``, pins every figure)."""

from __future__ import annotations

import pytest

from plansim import simulate
from plansim.errors import PlansimError
from plansim.hardware import Cluster, load_hardware
from plansim.hardware.schema import HostSection
from plansim.step.offload import (
    OffloadLayer,
    cpu_adam_s,
    host_link_Bps,
    host_transfer_s,
    offload_times,
)
from plansim.strategy.checks import check_strategy
from plansim.strategy.schema import Strategy
from plansim.workload import load_model

pytestmark = pytest.mark.xdist_group("offload")

MODEL = "gpt3-1.3b"
BASE = "dp=8,micro_batch=1,global_batch=16"
H100_HOST = 63.0e9 * 0.88  # dgx-h100's host section: Gen5 x16 line rate x achieved fraction, per uplink
LATENCY = 5.0e-6


def _run(strategy: str, engine: str = "analytic", cluster: Cluster | None = None, model: str = MODEL):
    return simulate(model, cluster or load_hardware("dgx-h100", gpus=8), strategy, engine=engine)


def _with_host(cluster: Cluster, **update: float) -> Cluster:
    """``cluster`` with its node's host section changed."""
    assert cluster.node.host is not None
    node = cluster.node.model_copy(update={"host": cluster.node.host.model_copy(update=update)})
    return Cluster(node, cluster.gpu, cluster.num_gpus)


# ---- transfers and the CPU's step, by hand --------------------------------------------------------------------------


def test_a_transfer_is_bytes_over_the_shared_uplink_plus_latency() -> None:
    eight = load_hardware("dgx-h100", gpus=8)
    assert host_link_Bps(eight) == pytest.approx(H100_HOST / 2)  # two GPUs behind each PCIe switch's uplink
    assert host_transfer_s(eight, 1e9) == pytest.approx(1e9 / (H100_HOST / 2) + LATENCY, rel=1e-12)
    assert host_transfer_s(eight, 0.0) == 0.0
    one = load_hardware("dgx-h100", gpus=1)  # alone on its uplink
    assert host_transfer_s(one, 1e9) == pytest.approx(1e9 / H100_HOST + LATENCY, rel=1e-12)
    gb200 = load_hardware("gb200-nvl72", gpus=72)  # NVLink-C2C, one Grace per two GPUs
    assert host_transfer_s(gb200, 1e9) == pytest.approx(1e9 / (450e9 * 0.9 / 2) + LATENCY, rel=1e-12)


def test_cpu_adam_is_the_shard_over_the_gpus_share_of_the_node_rate() -> None:
    eight = load_hardware("dgx-h100", gpus=8)
    assert cpu_adam_s(eight, 1e9) == pytest.approx(1e9 / (10.24e9 / 8), rel=1e-12)
    assert cpu_adam_s(load_hardware("dgx-h100", gpus=2), 1e9) == pytest.approx(1e9 / (10.24e9 / 2), rel=1e-12)


def _layers(n: int, params: float, saved: float, fwd: float, bwd: float) -> list[OffloadLayer]:
    return [OffloadLayer(True, params, saved, fwd, bwd) for _ in range(n)]


def test_each_kind_by_hand() -> None:
    """offload_times against the closed forms, each kind on its own (8 GPUs of a DGX H100, 2 micro-batches)."""
    cluster = load_hardware("dgx-h100", gpus=8)
    bw = H100_HOST / 2

    def copy(nbytes: float) -> float:
        return nbytes / bw + LATENCY

    params = 8e9  # the stage's, 1e9 per rank under ZeRO over dp=8
    # Megatron-LM: fp32 main gradients out after backward, Adam on the CPU, bf16 weights back
    meg = Strategy.parse(f"{BASE},zero=1,offload=optimizer").resolve(cluster)
    t = offload_times(cluster, meg, params, _layers(4, 2e9, 0.0, 0.1, 0.2))
    assert t.grads_out_s == pytest.approx(copy(1e9 * 4), rel=1e-12)
    assert t.weights_in_s == pytest.approx(copy(1e9 * 2), rel=1e-12)
    assert t.cpu_adam_s == pytest.approx(1e9 / (10.24e9 / 8), rel=1e-12)
    # DeepSpeed copies the bf16 gradients from its reduction hooks: hidden by backward but what it outlasts
    ds = Strategy.parse(f"{BASE},zero=2,framework=deepspeed,offload=optimizer").resolve(cluster)
    t = offload_times(cluster, ds, params, _layers(4, 2e9, 0.0, 0.001, 0.002))
    assert t.grads_out_s == pytest.approx(copy(1e9 * 2) - 4 * 0.002, rel=1e-12)
    assert offload_times(cluster, ds, params, _layers(4, 2e9, 0.0, 0.1, 1.0)).grads_out_s == 0.0
    # ZeRO-Infinity's parameters: each layer's bf16 shard before each gather, per pass and micro-batch; the first
    # fetch of a pass exposed, the others beyond the pass's compute
    zi = Strategy.parse(f"{BASE},zero=3,framework=deepspeed,offload=params").resolve(cluster)
    fetch = copy(2e9 / 8 * 2)
    t = offload_times(cluster, zi, params, _layers(4, 2e9, 0.0, 0.001, 0.002))
    forward = fetch + (3 * fetch - 4 * 0.001)
    backward = fetch + (3 * fetch - 4 * 0.002)
    assert t.param_fetch_s == pytest.approx(2 * (forward + backward), rel=1e-12)
    assert t.grads_out_s == t.cpu_adam_s == t.weights_in_s == 0.0
    # Megatron-LM's activations: the first 2 of 4 blocks out in forward, back in backward, beyond the compute of the
    # blocks after the first offloaded one
    act = Strategy.parse(f"{BASE},zero=1,offload=activations,offload_activation_layers=2").resolve(cluster)
    t = offload_times(cluster, act, params, _layers(4, 2e9, 3e9, 0.01, 0.02))
    out, back = 2 * copy(3e9) - 3 * 0.01, 2 * copy(3e9) - 3 * 0.02
    assert t.activations_s == pytest.approx(2 * (out + back), rel=1e-12)
    assert t.parts() == {"offload": t.transfer_s, "cpu_optimizer": 0.0}


def test_the_result_prices_the_host_tier_it_reports() -> None:
    """End to end, Megatron-LM's optimizer offload: the step's offload part is the rank's fp32 gradients out and bf16
    weights back, whose sizes the host tier reports (its host gradient copy, 4 bytes a parameter), and its CPU part
    that shard over the rank's share of the node's CPU-Adam rate."""
    r = _run(f"{BASE},zero=1,offload=optimizer")
    local = r.host_memory["per_gpu_bytes"]["gradients"] / 4
    bw = H100_HOST / 2
    assert r.time_breakdown_s["offload"] == pytest.approx((local * 4 + local * 2) / bw + 2 * LATENCY, rel=1e-9)
    assert r.time_breakdown_s["cpu_optimizer"] == pytest.approx(local / (10.24e9 / 8), rel=1e-9)
    assert r.host_memory["per_gpu_bytes"]["optimizer"] == pytest.approx(12 * local, rel=1e-9)  # master, m, v
    assert r.step_time_s == pytest.approx(sum(r.time_breakdown_s.values()), rel=1e-12)


# ---- memory: a second tier ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["analytic", "des"])
@pytest.mark.parametrize(
    ("strategy", "moved"),
    [
        ("zero=1,framework=deepspeed,offload=optimizer", ("optimizer",)),
        ("zero=2,framework=deepspeed,offload=optimizer", ("optimizer", "gradients")),
        ("zero=3,framework=deepspeed,offload=optimizer/params", ("optimizer", "gradients", "weights")),
        ("zero=1,offload=optimizer", ("optimizer",)),
    ],
)
def test_gpu_memory_drops_by_exactly_what_the_host_tier_holds(strategy: str, moved: tuple[str, ...], engine) -> None:
    without = _run(f"{BASE},{strategy.split(',offload')[0]}", engine)
    with_ = _run(f"{BASE},{strategy}", engine)
    gone = 0
    for category in ("weights", "gradients", "optimizer"):
        before, after = without.memory_breakdown_bytes[category], with_.memory_breakdown_bytes[category]
        if category not in moved:
            assert after == before, category
            continue
        gone += before - after
        if category == "weights":  # ZeRO-3: the shard leaves, the gathered layers stay
            assert before - after == with_.host_memory["per_gpu_bytes"]["weights"]
        else:
            assert after == 0
        if category == "optimizer":
            assert with_.host_memory["per_gpu_bytes"]["optimizer"] == before
    assert with_.memory_breakdown_bytes["activations"] == without.memory_breakdown_bytes["activations"]
    assert without.peak_memory_bytes - with_.peak_memory_bytes == gone
    host = with_.host_memory
    assert host["per_node_bytes"] == 8 * host["per_gpu_total_bytes"] == 8 * sum(host["per_gpu_bytes"].values())
    assert host["capacity_bytes"] == 2_000_000_000_000 and host["fits"]


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_activation_offload_moves_saved_activations_to_the_host(engine: str) -> None:
    without = _run(f"{BASE},zero=1", engine)
    with_ = _run(f"{BASE},zero=1,offload=activations,offload_activation_layers=12", engine)
    moved = with_.host_memory["per_gpu_bytes"]["activations"]
    drop = without.memory_breakdown_bytes["activations"] - with_.memory_breakdown_bytes["activations"]
    assert moved > 0 and 0 < drop <= moved  # a block's reloaded activations stay for its backward
    assert drop > 0.8 * moved


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_a_host_tier_over_the_nodes_host_memory_does_not_fit(engine: str) -> None:
    small = _with_host(load_hardware("dgx-h100", gpus=8), memory_bytes=10**9)
    r = _run(f"{BASE},zero=1,framework=deepspeed,offload=optimizer", engine, small)
    assert not r.fits and not r.host_memory["fits"]
    assert "host memory" in r.reason and "\n" not in r.reason


# ---- the engines agree ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        "zero=1,framework=deepspeed,offload=optimizer",
        "zero=2,framework=deepspeed,offload=optimizer",
        "zero=3,framework=deepspeed,offload=optimizer",
        "zero=3,framework=deepspeed,offload=params",
        "zero=3,framework=deepspeed,offload=optimizer/params",
        "zero=1,offload=optimizer",
        "zero=1,offload=activations,offload_activation_layers=8",
        "zero=1,offload=optimizer/activations,offload_activation_layers=20",
        "zero=3,framework=fsdp,offload=optimizer/params",
        "zero=2,framework=fsdp,offload=optimizer/params",
    ],
)
def test_both_engines_agree_within_2_percent(strategy: str) -> None:
    analytic, des = _run(f"{BASE},{strategy}"), _run(f"{BASE},{strategy}", "des")
    assert des.step_time_s == pytest.approx(analytic.step_time_s, rel=0.02)
    for part in ("offload", "cpu_optimizer"):
        assert des.time_breakdown_s[part] == pytest.approx(analytic.time_breakdown_s[part], rel=1e-9)
    assert des.host_memory == analytic.host_memory
    assert analytic.time_breakdown_s["offload"] + analytic.time_breakdown_s["cpu_optimizer"] > 0


# ---- monotone in the host link --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        "zero=1,offload=optimizer",
        "zero=3,framework=deepspeed,offload=optimizer/params",
        "zero=1,offload=activations,offload_activation_layers=20",
    ],
)
def test_more_host_bandwidth_or_cpu_is_never_slower(strategy: str) -> None:
    base = load_hardware("dgx-h100", gpus=8)
    times = [
        _run(f"{BASE},{strategy}", cluster=_with_host(base, link_bandwidth_Bps=bw)).step_time_s
        for bw in (8e9, 32e9, 63e9, 256e9, 1e12)
    ]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]
    cpus = [
        _run(f"{BASE},{strategy}", cluster=_with_host(base, cpu_adam_params_per_s=rate)).step_time_s
        for rate in (1e9, 1e10, 1e11)
    ]
    assert cpus == sorted(cpus, reverse=True)


# ---- refusals, one line each ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hardware", "strategy", "words"),
    [
        ("hgx-h200", "zero=1,offload=optimizer", "describes no host memory"),
        ("dgx-h100", "zero=1,offload=params", "Megatron-LM offloads optimizer or activations"),
        ("dgx-h100", "zero=3,framework=deepspeed,offload=activations", "DeepSpeed offloads optimizer"),
        ("dgx-h100", "zero=2,framework=deepspeed,offload=params", "under ZeRO 3"),
        ("dgx-h100", "zero=3,framework=fsdp,offload=optimizer", "offloads optimizer/params"),
        ("dgx-h100", "zero=0,offload=optimizer", "use zero=1"),
        ("dgx-h100", "zero=1,offload=activations", "offload_activation_layers=None"),
        ("dgx-h100", "zero=1,offload=activations,offload_activation_layers=24", "1 to 23"),
        ("dgx-h100", "zero=1,offload=activations,offload_activation_layers=4,remat=full", "recomputation"),
    ],
)
def test_what_cannot_run_is_refused_in_one_line(hardware: str, strategy: str, words: str) -> None:
    cluster = load_hardware(hardware, gpus=8)
    problems = check_strategy(Strategy.parse(f"{BASE},{strategy}"), load_model(MODEL), cluster)
    assert len(problems) == 1 and words in problems[0] and "\n" not in problems[0], problems
    with pytest.raises(PlansimError, match=words.replace("(", r"\(")):
        _run(f"{BASE},{strategy}", cluster=cluster)


def test_activation_offload_is_refused_with_pipelining() -> None:
    cluster = load_hardware("dgx-h100", gpus=8)
    s = Strategy.parse("dp=4,pp=2,micro_batch=1,global_batch=16,offload=activations,offload_activation_layers=2")
    problems = check_strategy(s, load_model(MODEL), cluster)
    assert any("with pipelining" in p for p in problems), problems


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("offload=disk", "'disk' is not offloadable"),
        ("offload=optimizer/optimizer", "named twice"),
        ("offload_activation_layers=2", "needs offload=activations"),
        ("offload=activations,offload_activation_layers=-1", "offload_activation_layers"),
    ],
)
def test_a_bad_offload_field_is_one_line(text: str, words: str) -> None:
    with pytest.raises(PlansimError, match=words) as err:
        Strategy.parse(f"dp=8,{text}")
    assert "\n" not in str(err.value)


def test_a_host_section_whose_uplink_share_does_not_divide_the_node_is_refused() -> None:
    node = load_hardware("dgx-h100").node
    assert node.host is not None
    with pytest.raises(ValueError, match="gpus_per_uplink"):
        type(node).model_validate({**node.model_dump(), "host": {**node.host.model_dump(), "gpus_per_uplink": 3}})
    assert HostSection.model_fields.keys() >= {"link_bandwidth_Bps", "memory_bytes", "cpu_adam_params_per_s"}


# ---- without offload, nothing changes -------------------------------------------------------------------------------


def test_a_strategy_without_offload_keeps_its_keys() -> None:
    """No offload key in its dump, no offload parts in its breakdown, no host tier: the stored results keep their
    keys (and the reference set its figures)."""
    s = Strategy.parse(f"{BASE},zero=1")
    assert "offload" not in s.model_dump() and "offload_activation_layers" not in s.model_dump()
    r = _run(f"{BASE},zero=1")
    assert "offload" not in r.time_breakdown_s and "cpu_optimizer" not in r.time_breakdown_s
    assert r.host_memory == {} and "host_memory" not in {k for k, v in r.to_dict().items() if v}
    offloaded = Strategy.parse(f"{BASE},zero=1,offload=optimizer")
    assert offloaded.model_dump()["offload"] == ["optimizer"]
    assert Strategy.model_validate(offloaded.model_dump()) == offloaded
