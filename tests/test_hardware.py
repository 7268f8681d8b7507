"""Hardware profiles, the cluster model and its links, checked against figures independent of the code.

Truths used: spec-sheet numbers (A100 BF16 312 TFLOP/s, HDR = 200 Gb/s), the measured NCCL bus bandwidths cited in
the profiles (230 GB/s NVLink3 all-reduce, 192 GB/s across DGX A100s with 8x HDR) and the rank arithmetic of a
node-major layout.
"""

from __future__ import annotations

import doctest
import importlib
import math
import re
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plansim.errors import PlansimError
from plansim.files.data import data_dir
from plansim.hardware import GPUSpec, Link, list_hardware, load_gpu, load_hardware, load_node

PROFILES = data_dir("hardware_profiles")
GPU_STEMS = sorted(p.stem for p in (PROFILES / "gpus").glob("*.yaml"))
NODE_STEMS = sorted(p.stem for p in (PROFILES / "nodes").glob("*.yaml"))
GB = 1e9


# --- profiles ---------------------------------------------------------------------------------------------------


def test_expected_profiles_exist():
    assert set(GPU_STEMS) == {
        "v100-sxm2-32gb",
        "a100-sxm4-40gb",
        "a100-sxm4-80gb",
        "h100-sxm5-80gb",
        "h800-sxm5-80gb",
        "h200-sxm-141gb",
        "h200-nvl-141gb",
        "b200-sxm-180gb",
        "gb200-186gb",
        "mi300x-192gb",
        "rtx-3090",
        "rtx-4090",
    }
    assert set(NODE_STEMS) == {
        "dgx-1",
        "dgx-a100",
        "dgx-h100",
        "hgx-h800",
        "hgx-h200",
        "hgx-b200",
        "gb200-nvl72",
        "h200-nvl-4way",
        "mi300x-platform",
        "pcie-4x4090",
    }


@pytest.mark.parametrize("stem", GPU_STEMS)
def test_gpu_profiles_load_and_name_matches_file(stem):
    gpu = load_gpu(stem)
    assert gpu.name.lower() == stem
    assert gpu.workspace_reserve_bytes < gpu.memory_bytes
    assert gpu.supports("fp32")


@pytest.mark.parametrize("stem", NODE_STEMS)
def test_node_profiles_load_with_their_gpu(stem):
    cluster = load_hardware(stem)
    assert cluster.name == stem
    assert cluster.num_gpus == cluster.gpus_per_node
    assert cluster.num_nodes == 1
    assert isinstance(cluster.gpu, GPUSpec)


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*/*.yaml")), ids=lambda p: p.name)
def test_every_number_in_a_profile_has_a_comment(path):
    """Each scalar number carries its source on its line; curve points are explained by the comment above them."""
    number = re.compile(r"^\s*(- )?\w+:\s*[-+]?[0-9][0-9_.eE+-]*\s*(#.*)?$")
    bare = [line for line in path.read_text().splitlines() if number.match(line) and "#" not in line]
    assert bare == []


def test_spec_sheet_peaks():
    assert load_gpu("a100-sxm4-80gb").peak_flops("bf16") == 312e12
    assert load_gpu("h100-sxm5-80gb").peak_flops("fp8") == pytest.approx(1978.9e12)
    assert load_gpu("v100-sxm2-32gb").peak_flops("fp16") == 125e12
    assert load_gpu("a100-sxm4-80gb").memory_bytes == 80 * 2**30


def test_dtype_support_by_generation():
    """No bf16/tf32 on Volta; fp8 from Ada and Hopper on (Blackwell too) and on AMD's CDNA 3."""
    v100 = load_gpu("v100-sxm2-32gb")
    assert not any(v100.supports(d) for d in ("bf16", "tf32", "fp8"))
    with_fp8 = {stem for stem in GPU_STEMS if load_gpu(stem).supports("fp8")}
    assert with_fp8 == {
        "h100-sxm5-80gb",
        "h800-sxm5-80gb",
        "h200-sxm-141gb",
        "h200-nvl-141gb",
        "b200-sxm-180gb",
        "gb200-186gb",
        "mi300x-192gb",
        "rtx-4090",
    }


@pytest.mark.parametrize(
    ("stem", "bf16_tflops", "memory_gib", "hbm_tbps"),
    [
        ("b200-sxm-180gb", 2250.0, 180, 8.0),  # HGX B200: 36 PFLOPS BF16 with sparsity / 8 / 2; DGX B200 1,440 GB
        ("gb200-186gb", 2500.0, 186, 8.0),  # GB200 NVL72: 360 PFLOPS with sparsity / 72 / 2; 13.4 TB / 72
        ("h200-nvl-141gb", 835.5, 140.4, 4.8),  # H200 NVL: 1,671 TFLOPS with sparsity / 2; 141 GB
        ("mi300x-192gb", 1307.4, 192, 5.3),  # MI300X datasheet: 1,307.4 TFLOPS dense; 192 GB HBM3
    ],
)
def test_new_gpus_spec_sheet_figures(stem, bf16_tflops, memory_gib, hbm_tbps):
    """The datasheets' dense rates (sparse ones halved), each GPU's fp8 twice its bf16 and tf32 half of it, fp16
    equal to bf16; memory as the files read it."""
    gpu = load_gpu(stem)
    assert gpu.peak_flops("bf16") == pytest.approx(bf16_tflops * 1e12)
    assert gpu.peak_flops("fp16") == gpu.peak_flops("bf16")
    assert gpu.peak_flops("fp8") == pytest.approx(2 * gpu.peak_flops("bf16"), rel=1e-3)  # the sheets round apart
    assert gpu.peak_flops("tf32") == pytest.approx(gpu.peak_flops("bf16") / 2, rel=1e-3)
    assert gpu.memory_bytes / 2**30 == pytest.approx(memory_gib, abs=0.05)
    assert gpu.hbm_bandwidth_Bps == pytest.approx(hbm_tbps * 1e12)


def test_architecture_sets_the_vendor_and_blackwell_prices_cudnn_attention():
    """AMD's cdna3 marks RCCL; the Blackwell profiles carry cuDNN's measured attention (GB200: cudnn-frontend's run),
    the MI300X none (priced as a GEMM)."""
    assert {stem: load_gpu(stem).vendor for stem in ("mi300x-192gb", "gb200-186gb")} == {
        "mi300x-192gb": "amd",
        "gb200-186gb": "nvidia",
    }
    assert all(load_gpu(stem).vendor == "nvidia" for stem in GPU_STEMS if stem != "mi300x-192gb")
    gb200 = load_gpu("gb200-186gb")
    assert gb200.architecture == "blackwell" and set(gb200.attention_kernels) == {"cudnn"}
    assert gb200.attention_efficiency("cudnn", "fwd", 8.796e12) * 2500 == pytest.approx(1708, abs=0.5)  # 16k, TFLOP/s
    assert load_gpu("mi300x-192gb").attention_kernels == {}


def test_missing_dtype_names_the_gpu_and_an_alternative():
    with pytest.raises(PlansimError, match=r"V100-SXM2-32GB has no bf16 tensor cores: use dtype=fp16"):
        load_gpu("v100-sxm2-32gb").peak_flops("bf16")
    with pytest.raises(PlansimError, match=r"no fp8 .*use dtype=bf16"):
        load_gpu("a100-sxm4-80gb").peak_flops("fp8")
    with pytest.raises(PlansimError, match=r"unknown dtype 'int8'"):
        load_gpu("a100-sxm4-80gb").peak_flops("int8")


def test_names_are_case_insensitive_and_paths_work():
    assert load_gpu("A100-SXM4-80GB") == load_gpu("a100-sxm4-80gb")
    by_path = load_hardware(PROFILES / "nodes" / "dgx-h100.yaml", gpus=16)
    assert by_path == load_hardware("DGX-H100", gpus=16)
    assert hash(by_path) == hash(load_hardware("dgx-h100", gpus=16))
    assert load_node("dgx-a100").gpu == "a100-sxm4-80gb"


def test_list_hardware_has_one_row_per_node_type():
    rows = list_hardware()
    assert [row["name"] for row in rows] == NODE_STEMS
    a100 = next(row for row in rows if row["name"] == "dgx-a100")
    assert a100["gpu"] == "A100-SXM4-80GB"
    assert a100["gpus_per_node"] == 8
    assert a100["gpu_memory_GB"] == pytest.approx(85.9)
    assert (a100["intra_node"], a100["intra_node_GBps"]) == ("nvswitch", 300)
    assert a100["nics"] == "8 x 200 Gb/s"


# --- efficiency curves ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stem", GPU_STEMS)
def test_curves_pass_through_their_points_and_clamp(stem):
    gpu = load_gpu(stem)
    for curve, fn in ((gpu.efficiency.matmul, gpu.matmul_efficiency), (gpu.efficiency.memory, gpu.memory_efficiency)):
        for size, fraction in curve:
            assert fn(size) == pytest.approx(fraction)
        assert fn(curve[0][0] / 1e3) == pytest.approx(curve[0][1])
        assert fn(curve[-1][0] * 1e3) == pytest.approx(curve[-1][1])
        assert fn(0) == pytest.approx(curve[0][1])


@settings(max_examples=200, deadline=None)
@given(
    stem=st.sampled_from(GPU_STEMS),
    a=st.floats(min_value=1.0, max_value=1e15),
    b=st.floats(min_value=1.0, max_value=1e15),
)
def test_shipped_curves_are_monotone_and_bounded(stem, a, b):
    gpu = load_gpu(stem)
    lo, hi = sorted((a, b))
    for curve, fn in ((gpu.efficiency.matmul, gpu.matmul_efficiency), (gpu.efficiency.memory, gpu.memory_efficiency)):
        fractions = [f for _, f in curve]
        assert min(fractions) <= fn(lo) <= fn(hi) <= max(fractions)


points = st.lists(
    st.tuples(st.floats(min_value=1.0, max_value=1e14), st.floats(min_value=0.001, max_value=1.0)),
    min_size=1,
    max_size=8,
    unique_by=lambda p: p[0],
).map(sorted)


@settings(max_examples=200, deadline=None)
@given(curve=points, size=st.floats(min_value=1e-3, max_value=1e16))
def test_any_curve_interpolates_within_its_point_values(curve, size):
    data = load_gpu("a100-sxm4-80gb").model_dump(by_alias=True)
    data["efficiency"] = {"matmul": curve, "memory": curve}
    data["uncertainty"] = None  # its GEMM range is around the profile's own curve
    gpu = GPUSpec.model_validate(data)
    fractions = [f for _, f in curve]
    assert min(fractions) - 1e-12 <= gpu.matmul_efficiency(size) <= max(fractions) + 1e-12


# --- topology graph ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stem", NODE_STEMS)
def test_every_edge_has_positive_bandwidth_and_latency(stem):
    cluster = load_hardware(stem, gpus=3 * load_node(stem).gpus_per_node)
    graph = cluster.topology
    assert nx.is_connected(graph)
    assert graph.number_of_edges() > 0
    for _, _, data in graph.edges(data=True):
        assert data["bandwidth_Bps"] > 0
        assert data["latency_s"] > 0


def _kinds(graph: nx.Graph) -> dict[str, list[str]]:
    by_kind: dict[str, list[str]] = {}
    for name, kind in graph.nodes(data="kind"):
        by_kind.setdefault(kind, []).append(name)
    return by_kind


def test_dgx_a100_16_gpus_graph_counts():
    kinds = _kinds(load_hardware("dgx-a100", gpus=16).topology)
    assert len(kinds["gpu"]) == 16
    assert len(kinds["nic"]) == 16  # 8 compute NICs per node
    assert len(kinds["nvswitch"]) == 2  # one NVSwitch plane per node
    leaves = [s for s in kinds["switch"] if s.startswith("leaf")]
    assert len(leaves) == 8  # rail optimised: one leaf per rail, both nodes in one scalable unit


def test_dgx1_mesh_gives_each_gpu_six_nvlinks_and_shares_nics():
    graph = load_hardware("dgx-1", gpus=8).topology
    for rank in range(8):
        nvlink = sum(d["bandwidth_Bps"] for _, v, d in graph.edges(f"gpu{rank}", data=True) if v.startswith("gpu"))
        assert nvlink == pytest.approx(6 * 25 * GB)
    assert graph.has_edge("gpu0", "gpu3") and not graph.has_edge("gpu0", "gpu5")
    assert len(_kinds(graph)["nic"]) == 4
    assert set(graph["node0/nic1"]) >= {"gpu2", "gpu3"}


def test_uplinks_carry_the_oversubscribed_sum_of_downlinks():
    graph = load_hardware("pcie-4x4090", gpus=4 * 32).topology  # 32 nodes, 16 per leaf, 2:1 spine
    assert graph["leaf0"]["spine0"]["bandwidth_Bps"] == pytest.approx(16 * 12.5 * GB / 2)


# --- effective links --------------------------------------------------------------------------------------------


def test_tensor_parallel_inside_dgx_a100_gets_the_measured_busbw():
    cluster = load_hardware("dgx-a100", gpus=64)
    assert cluster.group_link(8, 1).bandwidth_Bps == pytest.approx(230 * GB)
    assert cluster.group_link(4, 2) == cluster.group_link(8, 1)
    assert cluster.group_link(1, 8) == Link(math.inf, 0.0)


def test_data_parallel_across_nodes_gets_one_nic_times_efficiency():
    """Stride 8 puts one rank per node: it owns one HDR NIC (200 Gb/s) at the measured 0.96."""
    link = load_hardware("dgx-a100", gpus=64).group_link(8, 8)
    assert link.bandwidth_Bps == pytest.approx(200e9 / 8 * 0.96)
    dgx1 = load_hardware("dgx-1", gpus=32).group_link(4, 8)  # one EDR NIC shared by two GPUs, at 0.80
    assert dgx1.bandwidth_Bps == pytest.approx(100e9 / 8 / 2 * 0.80)


def test_full_node_ring_across_nodes_matches_nvidia_measurement():
    """NVIDIA measures 192 GB/s all-reduce busbw across DGX A100s with 8x HDR (NVIDIA/nccl issue #812)."""
    link = load_hardware("dgx-a100", gpus=32).group_link(32, 1)
    assert link.bandwidth_Bps == pytest.approx(192 * GB)


def test_crossing_a_higher_tier_adds_latency_and_oversubscription():
    budget = load_hardware("pcie-4x4090", gpus=4 * 32)
    in_leaf, across_spine = budget.group_link(16, 4), budget.group_link(32, 4)
    assert in_leaf.bandwidth_Bps == pytest.approx(12.5 * GB / 4 * 0.75)
    assert across_spine.bandwidth_Bps == pytest.approx(in_leaf.bandwidth_Bps / 2)
    assert across_spine.latency_s > in_leaf.latency_s > budget.group_link(4, 1).latency_s

    a100 = load_hardware("dgx-a100", gpus=8 * 40)  # two scalable units of 20 nodes
    assert a100.group_link(40, 8).latency_s > a100.group_link(20, 8).latency_s
    assert a100.group_link(40, 8).bandwidth_Bps == a100.group_link(20, 8).bandwidth_Bps  # non-blocking


def test_p2p_links():
    cluster = load_hardware("dgx-h100", gpus=16)
    assert cluster.p2p_link(0, 7) == cluster.group_link(8, 1)
    assert cluster.p2p_link(3, 3) == Link(math.inf, 0.0)
    across = cluster.p2p_link(0, 8)
    assert across.bandwidth_Bps == pytest.approx(400e9 / 8 * 0.94)
    assert across.latency_s > cluster.p2p_link(0, 7).latency_s


def test_node_of_is_node_major():
    cluster = load_hardware("pcie-4x4090", gpus=12)
    assert [cluster.node_of(r) for r in range(12)] == [0] * 4 + [1] * 4 + [2] * 4
    with pytest.raises(PlansimError, match="rank 12 is outside"):
        cluster.node_of(12)


# --- errors -----------------------------------------------------------------------------------------------------


def test_unknown_name_lists_known_ones():
    with pytest.raises(PlansimError, match=r"unknown hardware 'dgx-z100'.*dgx-a100.*pcie-4x4090"):
        load_hardware("dgx-z100")
    with pytest.raises(PlansimError, match=r"unknown GPU 'b300'.*h100-sxm5-80gb"):
        load_gpu("b300")
    with pytest.raises(PlansimError, match="not found"):
        load_hardware("no/such/file.yaml")


@pytest.mark.parametrize(
    ("gpus", "words"),
    [(0, "must be positive"), (-8, "must be positive"), (12, "use a multiple of 8"), (2.5, "whole number")],
)
def test_bad_gpu_counts(gpus, words):
    with pytest.raises(PlansimError, match=words):
        load_hardware("dgx-a100", gpus=gpus)


def test_partial_node_and_group_bounds():
    cluster = load_hardware("dgx-a100", gpus=4)
    assert cluster.num_nodes == 1
    with pytest.raises(PlansimError, match="spans 5 ranks but the cluster has 4 GPUs"):
        cluster.group_link(2, 4)
    with pytest.raises(PlansimError, match="at least 1"):
        cluster.group_link(0, 1)


def _custom_node(tmp_path: Path, old: str, new: str, base: str = "dgx-a100", name: str = "custom") -> Path:
    """A copy of node profile ``base`` with ``old`` replaced by ``new``, as ``nodes/<name>.yaml`` under ``tmp_path``."""
    text = (PROFILES / "nodes" / f"{base}.yaml").read_text()
    assert old in text
    path = tmp_path / "nodes" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace(old, new))
    return path


def test_malformed_yaml(tmp_path):
    path = _custom_node(tmp_path, "gpus_per_node: 8", "gpus_per_node: [8")
    with pytest.raises(PlansimError, match=r"custom.yaml: malformed YAML .*: fix the syntax"):
        load_hardware(path)


def test_unknown_key_names_file_and_field(tmp_path):
    path = _custom_node(tmp_path, "gpus_per_node: 8", "gpus_per_node: 8\ngpus_per_rack: 32")
    with pytest.raises(PlansimError, match=r"custom.yaml: field 'gpus_per_rack': unknown key"):
        load_hardware(path)


def test_missing_key_names_file_and_field(tmp_path):
    path = _custom_node(tmp_path, "  efficiency: 0.96", "")
    with pytest.raises(PlansimError, match=r"custom.yaml: field 'nics.efficiency': required key is missing"):
        load_hardware(path)


def test_unknown_gpu_reference(tmp_path):
    path = _custom_node(tmp_path, "gpu: a100-sxm4-80gb", "gpu: a100-sxm9")
    with pytest.raises(PlansimError, match=r"field 'gpu': unknown GPU 'a100-sxm9'.*a100-sxm4-80gb"):
        load_hardware(path)


def test_gpu_reference_beside_a_custom_node_file(tmp_path):
    path = _custom_node(tmp_path, "gpu: a100-sxm4-80gb", "gpu: my-gpu")
    gpu_text = (PROFILES / "gpus" / "a100-sxm4-80gb.yaml").read_text().replace("name: A100-SXM4-80GB", "name: MY-GPU")
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "my-gpu.yaml").write_text(gpu_text)
    assert load_hardware(path).gpu.name == "MY-GPU"


def test_busbw_above_line_rate_is_rejected(tmp_path):
    path = _custom_node(tmp_path, "allreduce_busbw_Bps: 230.0e9", "allreduce_busbw_Bps: 330.0e9")
    with pytest.raises(PlansimError, match="exceeds bandwidth_per_gpu_Bps"):
        load_hardware(path)


def test_fabric_that_does_not_reach_the_cluster(tmp_path):
    path = _custom_node(tmp_path, "nodes_per_switch: null", "nodes_per_switch: 280")
    assert load_hardware(path, gpus=8 * 280).num_nodes == 280
    with pytest.raises(PlansimError, match="needs 281 nodes but the fabric reaches 280"):
        load_hardware(path, gpus=8 * 281)


def test_inconsistent_mesh_is_rejected(tmp_path):
    text = (PROFILES / "nodes" / "dgx-1.yaml").read_text().replace("[0, 1, 1], [0, 2, 1]", "[0, 1, 2], [0, 2, 1]")
    path = tmp_path / "mesh.yaml"
    path.write_text(text)
    with pytest.raises(PlansimError, match=r"mesh.yaml: .*links give GPU 0 7 links"):
        load_hardware(path)


# --- the new node types: NVLink domains, bridges and AMD -----------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "tp"), [("hgx-b200", 8), ("gb200-nvl72", 8), ("h200-nvl-4way", 4), ("mi300x-platform", 8)]
)
def test_a_step_simulates_on_each_new_node(node, tp):
    import plansim

    result = plansim.simulate(
        "gpt3-1.3b", node, f"tp={tp},dp=1,pp=1,micro_batch=1,global_batch=8", gpus=tp, engine="analytic"
    )
    assert result.fits and 0 < result.step_time_s < 10


def test_gb200_nvl72_is_one_nvlink_domain_of_72():
    """72 GPUs share the rack's NVLink (every group inside it at the NVLink bus bandwidth, tensor parallelism may span
    trays); racks meet over one 400 Gb/s NIC per GPU."""
    cluster = load_hardware("gb200-nvl72", gpus=144)
    assert (cluster.gpus_per_node, cluster.num_nodes) == (72, 2)
    assert cluster.group_link(72, 1).bandwidth_Bps == pytest.approx(721.8 * GB)
    assert cluster.group_link(8, 9).bandwidth_Bps == pytest.approx(721.8 * GB)  # strided, still inside the rack
    assert cluster.group_link(2, 72).bandwidth_Bps == pytest.approx(50 * 0.94 * GB)
    assert cluster.group_link(144, 1).bandwidth_Bps == pytest.approx(721.8 * GB)  # 72 NICs feed the ring
    nics = [v for v, kind in cluster.topology.nodes(data="kind") if kind == "nic"]
    assert len(nics) == 144


def test_h200_nvl_node_is_one_bridged_domain_of_four():
    """The 4-way bridge: each card joined to the 3 others by 6 NVLink 4 links (18 x 25 GB/s); two domains of a server
    meet over NICs."""
    cluster = load_hardware("h200-nvl-4way", gpus=8)
    assert (cluster.gpus_per_node, cluster.num_nodes) == (4, 2)
    graph = cluster.topology
    for rank in range(8):
        nvlink = sum(d["bandwidth_Bps"] for _, v, d in graph.edges(f"gpu{rank}", data=True) if v.startswith("gpu"))
        assert nvlink == pytest.approx(18 * 25 * GB)
    assert not graph.has_edge("gpu3", "gpu4")
    assert cluster.group_link(8, 1).bandwidth_Bps == pytest.approx(4 * 25 * 0.94 * GB)  # 2 NICs of 4 GPUs


def test_mi300x_platform_is_a_full_mesh_on_rccl():
    cluster = load_hardware("mi300x-platform")
    graph = cluster.topology
    assert sum(1 for u, v in graph.edges if u.startswith("gpu") and v.startswith("gpu")) == 28
    assert cluster.node.intra_node.line_rate_Bps == pytest.approx(7 * 64 * GB)
    assert cluster.node.nccl is not None and not cluster.node.nccl.timed and cluster.node.nccl.nvls_channels == 0


def _amd_node(tmp_path: Path, old: str, new: str) -> Path:
    return _custom_node(tmp_path, old, new, base="mi300x-platform", name="amd")


TIMING = """  arch: hopper
  channel_bw_intra_GBps: 6.0
  channel_bw_inter_GBps: 7.14
  call_us: 21.26
  sync_us: [0.0, 1.689, 6.734]
"""


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        (
            "  channels: 56",
            TIMING + "  channels: 56",
            r"field 'nccl.arch': MI300X-192GB \(cdna3\) runs RCCL.*remove arch",
        ),
        (
            "  channels: 56",
            "  nvls_channels: 16\n  channels: 56",
            r"field 'nccl.nvls_channels': .* no NVLink SHARP: set it to 0",
        ),
    ],
    ids=["call-timing", "nvls"],
)
def test_an_amd_node_refuses_what_nccl_models_cannot_price_in_one_line(tmp_path, old, new, words):
    path = _amd_node(tmp_path, old, new)
    with pytest.raises(PlansimError, match=r"amd.yaml: " + words) as caught:
        load_hardware(path)
    assert "\n" not in str(caught.value)


def test_rccl_buffers_are_not_counted_but_nccl_buffers_are():
    """RCCL's buffers are not NCCL's: a step on the MI300X counts none, the same cluster as an NVIDIA GPU counts
    NCCL's for the node's channels."""
    import plansim
    from plansim.hardware import Cluster

    amd = load_hardware("mi300x-platform")
    nvidia = Cluster(amd.node, amd.gpu.model_copy(update={"architecture": "hopper"}), amd.num_gpus)
    strategy = "tp=8,dp=1,pp=1,micro_batch=1,global_batch=8"
    assert plansim.simulate("gpt3-1.3b", amd, strategy).memory_breakdown_bytes["nccl"] == 0
    assert plansim.simulate("gpt3-1.3b", nvidia, strategy).memory_breakdown_bytes["nccl"] > 0


# --- docstring examples -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["__init__", "cluster", "loader", "schema", "topology", "link"])
def test_docstring_examples(module):
    name = "plansim.hardware" if module == "__init__" else f"plansim.hardware.{module}"
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0


def test_a_profile_with_the_old_attention_curves_says_where_they_moved(tmp_path) -> None:
    """efficiency.attention_fwd / attention_bwd became attention_kernels.<kernel>.fwd / .bwd: a profile written
    before is refused in one line that says where its curves go."""
    import yaml

    data = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "hardware_profiles/gpus/h100-sxm5-80gb.yaml").read_text()
    )
    data["efficiency"]["attention_fwd"] = [[1.0e10, 0.5]]
    data["efficiency"]["attention_bwd"] = [[1.0e10, 0.5]]
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(PlansimError, match=r"attention_fwd and attention_bwd moved: put them under attention_kernels"):
        load_gpu(path)
