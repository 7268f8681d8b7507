"""Expert parallelism priced in both engines: the dispatch and combine all-to-alls (NCCL's grouped sends and
receives, every peer at once: ``plansim.costs.collectives``' ``all_to_all/direct``, each transfer on the link it
crosses), their bytes against the closed form, and the two engines within 2% on ep groups inside a node and across
nodes."""

from __future__ import annotations

from functools import cache

import pytest

import plansim
from plansim.hardware import Cluster, load_hardware
from plansim.strategy.mesh import mesh_of
from plansim.strategy.schema import Strategy

MIXTRAL = "mixtral-8x7b"  # 32 MoE blocks, 8 experts, top-2, hidden 4096
BASE = "micro_batch=1,global_batch=64,sequence_parallel=true,zero=1"

#: (strategy on 64 H100s, whether its ep groups span two nodes)
EP_CASES = [
    (f"dp=8,tp=2,pp=4,ep=8,{BASE}", True),  # etp = tp = 2: ep groups of 8 every other rank, 4 per node
    (f"dp=8,tp=2,pp=4,ep=8,etp=1,{BASE}", False),
    (f"dp=8,tp=2,pp=4,ep=4,etp=1,{BASE}", False),
    (f"dp=16,tp=1,pp=4,ep=8,{BASE}", False),
]


@cache
def _cluster(gpus: int = 64) -> Cluster:
    return load_hardware("dgx-h100", gpus=gpus)


@cache
def _run(strategy: str, engine: str) -> plansim.Result:
    return plansim.simulate(MIXTRAL, _cluster(), strategy, seq_len=4096, engine=engine)


@pytest.mark.parametrize(("strategy", "across"), EP_CASES)
def test_engines_agree_on_expert_parallel_steps(strategy: str, across: bool) -> None:
    s = Strategy.parse(strategy).resolved(_cluster())
    mesh = mesh_of(s)
    members = mesh.group("ep", 0)
    assert (members[-1] // 8 != members[0] // 8) == across
    analytic, des = _run(strategy, "analytic"), _run(strategy, "des")
    assert des.step_time_s == pytest.approx(analytic.step_time_s, rel=0.02), strategy
    assert des.comm_bytes_per_gpu["ep"] == pytest.approx(analytic.comm_bytes_per_gpu["ep"], rel=1e-9)


@pytest.mark.parametrize(("strategy", "across"), EP_CASES)
def test_all_to_all_bytes_per_gpu_are_the_closed_form(strategy: str, across: bool) -> None:
    """Each rank sends (ep-1)/ep of its send buffer, tokens x top_k x hidden x bytes, in each of the four
    all-to-alls of an MoE block's forward and backward (dispatch, combine, and their gradients), for every block of
    its stage and every micro-batch. Its tokens: the micro-batch's sequence split over tp by sequence parallelism."""
    s = Strategy.parse(strategy).resolved(_cluster())
    tokens = 1 * 4096 // s.tp
    per_call = tokens * 2 * 4096 * 2 * (s.ep - 1) / s.ep
    blocks = 32 // s.pp
    microbatches = 64 // s.dp
    expected = 4 * blocks * microbatches * per_call
    for engine in ("analytic", "des"):
        assert _run(strategy, engine).comm_bytes_per_gpu["ep"] == pytest.approx(expected, rel=1e-12), engine


def test_an_all_to_all_across_nodes_is_its_nic_share_not_the_rings_bus_bandwidth() -> None:
    """The brief's case (issue 36): ep = 8 over two nodes, 4 members per node, so half of each rank's buffer leaves
    through its own NIC (a GPU's NIC share), while the ring's bus bandwidth of the group is four NICs'. The layer's
    pricer takes the NIC: (p - k)/p of the buffer at one NIC share, plus one inter-node latency."""
    from plansim.step.prepare import comm_pricer

    cluster = _cluster()
    s = Strategy.parse(EP_CASES[0][0]).resolved(cluster)
    n = 2.0**28
    seconds, sent = comm_pricer(cluster, s)("ep", "all_to_all", n)
    _, _, inter = mesh_of(s).split_links("ep", cluster)
    assert inter is not None
    node = cluster.node
    assert inter.bandwidth_Bps == pytest.approx(node.nic_share_Bps * node.nics.efficiency)
    assert seconds == pytest.approx(inter.latency_s + 0.5 * n / inter.bandwidth_Bps, rel=1e-12)
    assert sent == pytest.approx(7 / 8 * n, rel=1e-12)


#: the network's rates and latencies an ep step's all-to-alls ride on (tests/test_monotone.py's scalings)
NETWORK = [
    "nics.bandwidth_Bps",
    "nics.efficiency",
    "nics.latency_s",
    "intra_node.allreduce_busbw_Bps",
    "intra_node.bandwidth_per_gpu_Bps",
    "fabric.bandwidth_Bps",
    "fabric.latency_s",
]


@pytest.mark.parametrize("field", NETWORK)
@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_more_network_bandwidth_never_slows_an_expert_parallel_step(field: str, engine: str) -> None:
    """Monotone physics (tests/test_monotone.py) on the brief's case, ep groups across two nodes: more of a network
    rate, or less of its latency, never makes the step slower."""
    from test_monotone import FIELDS

    strategy = EP_CASES[0][0]
    base = _run(strategy, engine).step_time_s
    for factor in (1.25, 4.0):
        better = plansim.simulate(MIXTRAL, FIELDS[field](_cluster(), factor), strategy, seq_len=4096, engine=engine)
        assert better.step_time_s <= base * (1 + 1e-9), (field, factor, base, better.step_time_s)


def test_qwen3_235b_from_its_config_runs_in_both_engines() -> None:
    """Issue 36's run: Qwen3-235B-A22B from its config.json at sequence 4,096 on 256 H100s, tp 2, ep 32 (etp 1: the
    default etp = tp would need tp x ep = 64 of a stage's 32 ranks), pp 8 interleaved 4; its 94 blocks over 32 model
    chunks: 3 each but the first and the last chunk, 2."""
    from pathlib import Path

    split = "/".join(["2"] + ["3"] * 30 + ["2"])
    strategy = (
        f"tp=2,pp=8,ep=32,etp=1,schedule=interleaved,virtual_stages=4,layer_split={split},"
        "micro_batch=1,global_batch=512,sequence_parallel=true,zero=1"
    )
    model = Path(__file__).parent / "data" / "hf_moe" / "qwen3-235b-a22b.json"
    cluster = load_hardware("dgx-h100", gpus=256)
    analytic, des = (plansim.simulate(model, cluster, strategy, seq_len=4096, engine=e) for e in ("analytic", "des"))
    assert analytic.fits and des.fits
    assert des.step_time_s == pytest.approx(analytic.step_time_s, rel=0.02)
    assert analytic.comm_bytes_per_gpu["ep"] > 0


def test_deepseek_v3_on_2048_h800s_runs() -> None:
    """Issue 36's run: DeepSeek-V3 on 2,048 H800s (hardware_profiles/nodes/hgx-h800.yaml: NVLink at 200 GB/s per
    direction per GPU) with pp 16 and ep 64 (edp 2), its 61 blocks split evenly, full recompute; the analytic engine
    here (the discrete-event one takes seconds: the report gives both)."""
    cluster = load_hardware("hgx-h800", gpus=2048)
    assert cluster.node.intra_node.bandwidth_per_gpu_Bps == 200e9
    assert cluster.gpu.peak_flops("bf16") == load_hardware("dgx-h100", gpus=8).gpu.peak_flops("bf16")
    strategy = "tp=1,pp=16,ep=64,etp=1,micro_batch=1,global_batch=2048,zero=1,remat=full"
    r = plansim.simulate("deepseek-v3", cluster, strategy, seq_len=4096)
    assert r.fits and r.step_time_s > 0 and r.comm_bytes_per_gpu["ep"] > 0


@pytest.mark.parametrize(("zero", "etp", "ep"), [(1, 1, 8), (2, 1, 8), (1, 2, 4), (0, 1, 8), (1, 2, 1)])
def test_expert_states_are_sharded_over_the_expert_data_parallel_group(zero: int, etp: int, ep: int) -> None:
    """ZeRO shards the routed experts' states over edp, the rest over dp x cp (Megatron-LM's expert buffers over its
    expert-data-parallel group): Mixtral on 16 H100s, tp 2, dp 8, so edp = 16 / (etp x ep). By hand from the rank's
    op graph: optimizer states 12 B a parameter, fp32 gradients 4 B, each divided by its group where the stage
    shards it."""
    from plansim.step.prepare import sharding_of
    from plansim.workload import load_model
    from plansim.workload.build import build_sharded

    strategy = f"dp=8,tp=2,ep={ep},etp={etp},micro_batch=1,global_batch=16,sequence_parallel=true,zero={zero}"
    cluster = _cluster(16)
    s = Strategy.parse(strategy).resolved(cluster)
    graph = build_sharded(load_model(MIXTRAL).model_copy(update={"seq_len": 4096}), sharding_of(s))
    params = sum(d.get("params", 0) for _, d in graph.nodes(data=True))
    experts = sum(d.get("params", 0) for _, d in graph.nodes(data=True) if d.get("expert"))
    assert experts == 32 * (8 // ep) * 3 * 4096 * 14336 // etp
    edp = 16 // (etp * ep)
    dense_shard, expert_shard = (8, edp) if zero >= 1 else (1, 1)
    optimizer = 12 * ((params - experts) / dense_shard + experts / expert_shard)
    grads = 4 * ((params - experts) / (8 if zero >= 2 else 1) + experts / (edp if zero >= 2 else 1))
    for engine in ("analytic", "des"):
        r = plansim.simulate(MIXTRAL, cluster, strategy, seq_len=4096, engine=engine)
        assert r.memory_breakdown_bytes["optimizer"] == pytest.approx(optimizer, rel=1e-9), engine
        assert r.memory_breakdown_bytes["gradients"] == pytest.approx(grads, rel=1e-9), engine
