"""Mixture-of-Experts models (family ``moe``, ``plansim.workload.moe``): parameter counts against the published
figures, the MoE layer's ops on one rank (one expert at top-1 is the dense block plus its router; the all-to-all's
bytes at ep > 1 against the closed form; a grouped GEMM priced expert by expert), both engines on every preset, and
the Hugging Face importer (the four MoE model types; a dense type carrying expert keys refused)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import plansim
from plansim.costs.kernels import KernelCostModel
from plansim.errors import PlansimError
from plansim.hardware import load_hardware
from plansim.workload import ModelSpec, build_graph, graph_totals, load_model
from plansim.workload.build import build_sharded
from plansim.workload.graph import Sharding
from plansim.workload.hf_config import from_hf_config, unmodelled

DATA = Path(__file__).parent / "data" / "hf_moe"
HF = "https://huggingface.co"

# file -> the config.json its numeric keys were copied from (only the keys the importer reads, and a few it checks).
CONFIGS = {
    "mixtral-8x7b-v0.1.json": f"{HF}/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
    "qwen1.5-moe-a2.7b.json": f"{HF}/Qwen/Qwen1.5-MoE-A2.7B/blob/main/config.json",
    "qwen3-30b-a3b.json": f"{HF}/Qwen/Qwen3-30B-A3B/blob/main/config.json",
    "qwen3-235b-a22b.json": f"{HF}/Qwen/Qwen3-235B-A22B/blob/main/config.json",
    "deepseek-v3.json": f"{HF}/deepseek-ai/DeepSeek-V3/blob/main/config.json",
}

# (preset, published total, published active, where each was published). Each holds within 1%, but the two
# actives marked in ROUNDED, which their publishers give to two digits, truncated (3.353B "3.3B"; 37.55B "37B").
PUBLISHED = [
    # Mistral AI, "Mixtral of experts" (2023-12-11): "46.7B total parameters but only uses 12.9B parameters per token"
    ("mixtral-8x7b", 46.7e9, 12.9e9, "https://mistral.ai/news/mixtral-of-experts"),
    # Mistral AI, "Cheaper, Better, Faster, Stronger" (2024-04-17): "39B active parameters out of 141B"
    ("mixtral-8x22b", 141e9, 39e9, "https://mistral.ai/news/mixtral-8x22b"),
    # Model card: "Number of Parameters: 30.5B in total and 3.3B activated"
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, f"{HF}/Qwen/Qwen3-30B-A3B"),
    # Model card: "Number of Parameters: 235B in total and 22B activated"
    ("qwen3-235b-a22b", 235e9, 22e9, f"{HF}/Qwen/Qwen3-235B-A22B"),
    # DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", abstract: "671B total parameters with 37B activated for each
    # token"; its multi-token-prediction module (14B on top, model card) is not part of either figure nor the model
    ("deepseek-v3", 671e9, 37e9, "arXiv:2412.19437 abstract"),
]
#: preset -> the published active figure's last digit, in parameters: ours, truncated to it, is the figure.
ROUNDED = {"qwen3-30b-a3b": 0.1e9, "deepseek-v3": 1e9}

PRESETS = [p[0] for p in PUBLISHED]


def config(file: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / file).read_text())
    return data


@pytest.mark.parametrize(("preset", "total", "active", "source"), PUBLISHED, ids=PRESETS)
def test_parameter_counts_match_published(preset: str, total: float, active: float, source: str) -> None:
    spec = load_model(preset)
    assert spec.num_parameters() == pytest.approx(total, rel=0.01), source
    if preset in ROUNDED:
        unit = ROUNDED[preset]
        assert math.floor(spec.active_parameters() / unit) * unit == pytest.approx(active), source
        assert spec.active_parameters() == pytest.approx(active, rel=0.02), source
    else:
        assert spec.active_parameters() == pytest.approx(active, rel=0.01), source


def test_counts_by_hand() -> None:
    """Mixtral 8x7B by hand: attention (GQA, 8 of 32 heads' keys and values), 8 experts of 3 h f, router, norms."""
    h, f, layers, vocab = 4096, 14336, 32, 32000
    attention = h * (h + 2 * 1024) + h * h
    block = attention + 8 * 3 * h * f + 8 * h + 2 * h
    spec = load_model("mixtral-8x7b")
    assert spec.num_parameters() == layers * block + h + 2 * vocab * h
    assert spec.active_parameters() == spec.num_parameters() - layers * 6 * 3 * h * f
    # DeepSeek-V3's latent attention, by hand (config.json: q_lora 1536, kv_lora 512, heads of 128 + 64 and 128)
    h, heads = 7168, 128
    mla = h * 1536 + 1536 + 1536 * heads * 192 + h * (512 + 64) + 512 + 512 * heads * (128 + 128) + heads * 128 * h
    v3 = load_model("deepseek-v3")
    dense = mla + 2 * h + 3 * h * 18432
    sparse = mla + 2 * h + 256 * h + 3 * h * (256 * 2048 + 2048)
    assert v3.num_parameters() == 3 * dense + 58 * sparse + h + 2 * 129280 * h


@pytest.mark.parametrize("preset", PRESETS)
def test_graph_holds_every_parameter_at_ep_1(preset: str) -> None:
    spec = load_model(preset).model_copy(update={"seq_len": 64})
    assert graph_totals(build_graph(spec, 1))["params"] == spec.num_parameters()


def _twins(**moe: Any) -> tuple[ModelSpec, ModelSpec]:
    """A llama model and the moe model of one expert at top-1 of the same FFN width."""
    base = {"layers": 4, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "seq_len": 4096,
            "vocab": 32000}  # fmt: skip
    llama = ModelSpec(name="dense", family="llama", **base)
    one = ModelSpec(name="one", family="moe", experts=1, experts_per_token=1, expert_ffn_hidden=14336, **base, **moe)
    return llama, one


@pytest.mark.parametrize("tp", [1, 2])
def test_one_expert_at_top_1_is_the_dense_block_plus_its_router(tp: int) -> None:
    llama, one = _twins()
    sh = Sharding(micro_batch=2, tp=tp, sequence_parallel=tp > 1, etp=tp, etp_axis="tp")
    dense, moe = build_sharded(llama, sh), build_sharded(one, sh)
    router = {n for n in moe if n.endswith((".router", ".topk"))}
    assert len(router) == 2 * llama.layers
    renamed = {"experts_gate_up": "gate_up", "experts_swiglu": "swiglu", "experts_down": "down", "moe_in": "mlp_in",
               "moe_out": "mlp_out"}  # fmt: skip

    def plain(node: str) -> str:
        prefix, _, op = node.rpartition(".")
        return f"{prefix}.{renamed.get(op, op)}"

    assert sorted(plain(n) for n in moe if n not in router) == sorted(dense)
    for node in moe:
        if node not in router:
            attrs = {k: v for k, v in moe.nodes[node].items() if k != "expert"}
            assert attrs == dense.nodes[plain(node)], node
    # the router: a h x 1 GEMM and a softmax over one score per token, keeping that score (tokens on this rank: T)
    T, h = 2 * 4096 // tp, 4096
    r = moe.nodes["L0.router"]
    assert (r["flops"], r["params"], r["saved_bytes"]) == (2 * T * h, h, 0)
    assert moe.nodes["L0.topk"]["saved_bytes"] == 2 * T


def test_one_expert_prices_as_the_dense_model_but_for_its_router() -> None:
    """Both engines: step time and peak memory within 1% of the dense twin's (the router's two small kernels a block,
    their launches and its h parameters a block are all that differs)."""
    llama, one = _twins()
    strategy = "dp=2,tp=2,pp=2,micro_batch=1,global_batch=8,sequence_parallel=true"
    for engine in ("analytic", "des"):
        dense = plansim.simulate(llama, "dgx-h100", strategy, gpus=8, engine=engine)
        moe = plansim.simulate(one, "dgx-h100", strategy, gpus=8, engine=engine)
        assert moe.step_time_s > dense.step_time_s  # the router runs
        assert moe.step_time_s == pytest.approx(dense.step_time_s, rel=0.01), engine
        assert moe.peak_memory_bytes >= dense.peak_memory_bytes
        assert moe.peak_memory_bytes == pytest.approx(dense.peak_memory_bytes, rel=0.01), engine


def test_all_to_all_bytes_are_the_closed_form() -> None:
    """At ep > 1 the dispatch and combine all-to-alls carry each rank's whole send buffer, tokens x top-k x hidden x
    bytes (the collective registry prices (ep-1)/ep of it across ranks), on the ep group; the rank runs E/ep experts
    over those rows, times etp once gathered over the expert tensor-parallel group."""
    spec = load_model("qwen3-30b-a3b").model_copy(update={"layers": 2, "seq_len": 4096})
    b, E, k, h, f = 2, 128, 8, 2048, 768
    for tp, ep, etp in ((1, 8, 1), (2, 4, 2), (2, 16, 1)):
        sh = Sharding(micro_batch=b, tp=tp, sequence_parallel=tp > 1, act_bytes=2, ep=ep, etp=etp)
        g = build_sharded(spec, sh)
        tokens = b * 4096 // tp
        for name in ("L1.dispatch", "L1.combine"):
            a2a = g.nodes[name]
            assert (a2a["collective"], a2a["bwd_collective"], a2a["group"]) == ("all_to_all", "all_to_all", "ep")
            assert a2a["comm_bytes"] == tokens * k * h * 2
        gate_up = g.nodes["L1.experts_gate_up"]
        assert gate_up["expert"] and gate_up["grouped"] == E // ep
        assert gate_up["params"] == E // ep * h * 2 * f // etp
        assert gate_up["flops"] == 2 * etp * tokens * k * 2 * (f // etp) * h
        assert ("L1.dispatch_gather" in g) == (etp > 1)
        assert not g.nodes["L1.router"].get("expert", False)
        experts = sum(d["params"] for _, d in g.nodes(data=True) if d.get("expert"))
        assert experts == spec.layers * E // ep * 3 * h * f // etp


def test_capacity_factor_pads_each_experts_rows() -> None:
    spec = load_model("mixtral-8x7b").model_copy(update={"layers": 1, "seq_len": 1000})
    sh = Sharding(micro_batch=1, ep=4)
    free = build_sharded(spec, sh)
    padded = build_sharded(spec.model_copy(update={"capacity_factor": 1.25}), sh)
    send = 8 * math.ceil(1.25 * 1000 * 2 / 8)  # experts x capacity: ceil(c T k / E) rows each
    assert padded.nodes["L0.dispatch"]["comm_bytes"] == send * 4096 * 2
    assert free.nodes["L0.dispatch"]["comm_bytes"] == 1000 * 2 * 4096 * 2
    assert padded.nodes["L0.experts_down"]["flops"] / free.nodes["L0.experts_down"]["flops"] == send / 2000


def test_grouped_gemm_prices_each_expert_at_its_own_size() -> None:
    """A grouped GEMM of n experts is n GEMMs of 1/n the FLOPs, each on its own point of the efficiency curve: slower
    than the one GEMM of the same FLOPs, and n times one expert's GEMM."""
    gpu = load_hardware("dgx-h100", gpus=8).gpu
    kernels = KernelCostModel(gpu, "bf16")
    spec = load_model("qwen3-30b-a3b").model_copy(update={"layers": 1, "seq_len": 4096})
    op = build_sharded(spec, Sharding(micro_batch=1, ep=1)).nodes["L0.experts_gate_up"]
    n = op["grouped"]
    whole = {**op, "grouped": 1}
    one = {**op, "grouped": 1, "flops": op["flops"] / n, "bwd_flops": op["bwd_flops"] / n, "bytes": op["bytes"] / n}
    assert kernels.forward(op) == pytest.approx(n * kernels.forward(one))
    assert kernels.backward(op) == pytest.approx(n * kernels.backward(one))
    assert kernels.forward(op) > kernels.forward(whole)
    assert kernels.launches(op) == n


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_runs_in_both_engines(preset: str) -> None:
    """Every preset at sequence 512 on one DGX H100: whole, dp x tp (sequence parallel); cut to 8 blocks, dp x tp x
    pp. The engines within 2%. Not whole under pp: there the engines part by 2-4% on dense models too (llama3-8b,
    dp2 tp2 pp2 at sequence 512: -2.8%), nor DeepSeek-V3, whose dense prefix makes its stages unequal, where they
    part by more for a llama model with an uneven layer_split too."""
    spec = load_model(preset)
    runs = [(spec, "dp=4,tp=2,pp=1")]
    if not spec.dense_layers:
        runs.append((spec.model_copy(update={"layers": 8}), "dp=2,tp=2,pp=2"))
    for model, strategy in runs:
        strategy += ",micro_batch=1,global_batch=8,sequence_parallel=true"
        analytic = plansim.simulate(model, "dgx-h100", strategy, gpus=8, seq_len=512)
        des = plansim.simulate(model, "dgx-h100", strategy, gpus=8, seq_len=512, engine="des")
        assert des.step_time_s == pytest.approx(analytic.step_time_s, rel=0.02), strategy
        assert des.peak_memory_bytes == pytest.approx(analytic.peak_memory_bytes, rel=0.02), strategy


def test_tensor_parallel_experts_need_sequence_parallelism() -> None:
    with pytest.raises(PlansimError, match=r"needs sequence_parallel.*moe_layer\.py:636-640"):
        build_sharded(load_model("mixtral-8x7b"), Sharding(micro_batch=1, tp=2, etp=2, etp_axis="tp"))
    with pytest.raises(PlansimError, match="ep=3 does not divide experts=8"):
        build_sharded(load_model("mixtral-8x7b"), Sharding(micro_batch=1, ep=3))


# --- Hugging Face configs -------------------------------------------------------------------------------------


def test_every_fixture_is_cited_and_the_four_types_are_covered() -> None:
    assert sorted(p.name for p in DATA.glob("*.json")) == sorted(CONFIGS)
    assert {config(f)["model_type"] for f in CONFIGS} == {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"}


@pytest.mark.parametrize(
    ("file", "preset"),
    [("mixtral-8x7b-v0.1.json", "mixtral-8x7b"), ("qwen3-30b-a3b.json", "qwen3-30b-a3b"),
     ("qwen3-235b-a22b.json", "qwen3-235b-a22b"), ("deepseek-v3.json", "deepseek-v3")],
)  # fmt: skip
def test_configs_import_to_the_presets(file: str, preset: str) -> None:
    ours = load_model(preset)
    spec = from_hf_config(DATA / file, name=preset, seq_len=ours.seq_len)
    assert spec == ours
    assert ModelSpec.model_validate(spec.file_fields()) == spec  # a model YAML gives it back


def test_qwen2_moe_imports_its_shared_expert() -> None:
    """Qwen1.5-MoE-A2.7B: 60 experts of 1,408 at top-4 and a shared expert of 5,632; the model card's "14.3B" total
    and "2.7B" activated (https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B)."""
    spec = from_hf_config(DATA / "qwen1.5-moe-a2.7b.json")
    assert (spec.experts, spec.experts_per_token, spec.expert_ffn_hidden, spec.shared_ffn_hidden) == (60, 4, 1408, 5632)
    assert spec.num_parameters() == pytest.approx(14.3e9, rel=0.01)
    assert spec.active_parameters() == pytest.approx(2.7e9, rel=0.01)
    notes = unmodelled(config("qwen1.5-moe-a2.7b.json"), spec)
    assert any("sigmoid gate: 49,152 parameters" in n for n in notes)


def test_deepseek_reports_its_multi_token_prediction() -> None:
    c = config("deepseek-v3.json")
    spec = from_hf_config(c)
    (mtp,) = [n for n in unmodelled(c, spec) if n.startswith("multi-token prediction")]
    size = int(mtp.split(": ")[1].split(" parameters")[0].replace(",", ""))
    assert size == pytest.approx(14e9 - 2 * 129280 * 7168, rel=0.05)  # the card's 14B holds the embedding and head


@pytest.mark.parametrize("key", ["num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok",
                                 "moe_intermediate_size"])  # fmt: skip
@pytest.mark.parametrize("dense_type", ["mistral", "llama", "qwen2"])
def test_a_dense_type_with_expert_keys_is_refused(key: str, dense_type: str) -> None:
    mixtral = {
        k: v
        for k, v in config("mixtral-8x7b-v0.1.json").items()
        if k not in ("num_local_experts", "num_experts_per_tok")
    }
    with pytest.raises(PlansimError) as err:
        from_hf_config({**mixtral, "model_type": dense_type, key: 8})
    message = str(err.value)
    assert "\n" not in message
    assert f"'{key}'" in message and f"'{dense_type}' is dense" in message and "mixtral" in message


def test_an_unexpressed_qwen_layout_is_refused() -> None:
    c = config("qwen3-30b-a3b.json")
    with pytest.raises(PlansimError, match=r"decoder_sparse_step=2.*write a model YAML with dense_layers"):
        from_hf_config({**c, "decoder_sparse_step": 2})
    with pytest.raises(PlansimError, match=r"mlp_only_layers=\[0\]"):
        from_hf_config({**c, "mlp_only_layers": [0]})


def test_bad_moe_shapes_are_refused() -> None:
    base = {"name": "m", "family": "moe", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "seq_len": 8,
            "vocab": 10, "experts": 4, "experts_per_token": 2, "expert_ffn_hidden": 32}  # fmt: skip
    ModelSpec.model_validate(base)
    for bad, words in (
        ({"experts_per_token": 5}, "experts_per_token=5 must be 1 to experts=4"),
        ({"dense_layers": 3}, "dense_layers=3 exceeds layers=2"),
        ({"rope_head_dim": 4}, "give kv_lora_rank too"),
        ({"kv_lora_rank": 8, "rope_head_dim": 16}, "rope_head_dim=16 must be 1 to head_dim-1=15"),
        ({"kv_lora_rank": 8, "rope_head_dim": 4, "kv_heads": 2}, "kv_heads=2 must equal heads=4"),
        ({"v_head_dim": 8}, "v_head_dim=8 differs from head_dim=16 without latent attention"),
    ):
        with pytest.raises(ValueError, match=words):
            ModelSpec.model_validate({**base, **bad})
    with pytest.raises(ValueError, match="llama models do not use 'experts'"):
        ModelSpec.model_validate({**base, "family": "llama"})
