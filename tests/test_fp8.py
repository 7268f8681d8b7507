"""FP8 training (``dtype: fp8``): the block linear layers' GEMMs at the fp8 rate with Transformer Engine's casts, their
inputs saved in FP8, the FP8 weight copies and scaling state, the frameworks' and GPUs' refusals, both engines
agreeing, and bf16 untouched. Expected values are worked by hand from the profiles' curves and the formulas the
docstrings cite."""

from __future__ import annotations

import math

import pytest

from plansim import simulate
from plansim.analytic import AnalyticCache, simulate_analytic
from plansim.costs.kernels import FP8Casts, KernelCostModel
from plansim.describe import describe
from plansim.errors import PlansimError
from plansim.hardware import load_gpu, load_hardware
from plansim.step.memory import fp8_bytes
from plansim.step.prepare import kernel_model, sharding_of
from plansim.strategy.schema import Strategy
from plansim.workload import load_model
from plansim.workload.build import build_sharded

H100 = load_gpu("h100-sxm5-80gb")
MODEL = "gpt3-1.3b"


def _memory_s(nbytes: float) -> float:
    """One memory-bound kernel on the H100 by hand: bytes over the memory curve's bandwidth, plus the launch."""
    return nbytes / (H100.hbm_bandwidth_Bps * H100.memory_efficiency(nbytes)) + H100.kernel_launch_s


def test_fp8_gemm_runs_at_the_fp8_peak_on_its_curve() -> None:
    """An FP8 GEMM of 16384^3 (a measured cuBLASLt point: 1377.3 TFLOP/s, 0.696 of 1978.9) takes F / (fp8 peak x
    0.696) plus the launch; the same GEMM in bf16 takes F / (bf16 peak x the bf16 curve)."""
    flops = 2 * 16384**3
    nbytes = 2.0 * 3 * 16384**2
    k = KernelCostModel(H100, "bf16", fp8=FP8Casts("delayed"))
    fp8 = k.kernel_time("matmul", flops, nbytes, dtype="fp8")
    assert fp8 == pytest.approx(flops / (1978.9e12 * 0.6960) + H100.kernel_launch_s, rel=1e-3)
    bf16 = k.kernel_time("matmul", flops, nbytes)
    assert bf16 == pytest.approx(flops / (989.4e12 * H100.matmul_efficiency(flops)) + H100.kernel_launch_s)
    assert fp8 < 0.7 * bf16


def test_fp8_gemm_is_not_slower_than_bf16_from_transformer_sizes_on() -> None:
    """Monotone sense: from 1e10 FLOPs (a 1.3B model's smallest block GEMM at one sequence is 2e10) the FP8 GEMM
    alone never takes longer than the bf16 one on an H100, H200 or B200."""
    for name in ("h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb"):
        gpu = load_gpu(name)
        k = KernelCostModel(gpu, "bf16", fp8=FP8Casts("current"))
        for flops in (1e10, 3e10, 1e11, 5e11, 1e12, 1e13, 1e14):
            assert k.kernel_time("matmul", flops, 0.0, dtype="fp8") <= k.kernel_time("matmul", flops, 0.0), name


@pytest.mark.parametrize("recipe", ["delayed", "current", "block"])
def test_one_linear_layers_casts_by_hand(recipe: str) -> None:
    """fc2 of one GPT block (no norm before it), m x n x k = 2048 x 2048 x 8192, cast once per 8 micro-batches:
    forward the input cast (2 B read, 1 + 1 B written an element; current scaling an amax pass of 2 B first; a
    block recipe's scales 2 x 4/128 B) and 1/8 of the weight's; backward the output gradient's. Launches: the GEMM
    and each cast a micro-batch (the weight's once a step, not counted)."""
    m, n, k = 2048, 2048, 8192
    op = {"kind": "matmul", "flops": 2 * m * n * k, "bwd_flops": 4 * m * n * k, "bytes": 2 * (m * k + k * n + m * n)}
    op["fp8"] = (m, n, k, False, 1)
    casts = FP8Casts(recipe, weight_casts=1 / 8)
    model = KernelCostModel(H100, "bf16", fp8=casts)
    per = 4 + (2 * 4 / 128 if recipe == "block" else 0.0)
    amax = recipe == "current"
    fwd_casts = [2.0 * m * k] * amax + [per * m * k]
    weight = (1 / 8) * ((2.0 * k * n if amax else 0.0) + per * k * n)
    gemm = model.kernel_time("matmul", op["flops"], op["bytes"], dtype="fp8")
    expected_fwd = gemm + sum(_memory_s(b) for b in [*fwd_casts, weight])
    assert model.forward(op) == pytest.approx(expected_fwd, rel=1e-12)
    bwd_casts = [2.0 * m * n] * amax + [per * m * n]
    half = model.kernel_time("matmul", op["bwd_flops"] / 2, op["bytes"], dtype="fp8")
    assert model.backward(op) == pytest.approx(2 * half + sum(_memory_s(b) for b in bwd_casts), rel=1e-12)
    assert model.weight_gradient(op) == half
    assert model.launches(op) == 1 + len(fwd_casts)
    assert model.launches(op, "bwd") == 2 + len(bwd_casts)


def test_a_norm_fed_layer_casts_as_transformer_engine_fuses() -> None:
    """After a norm: delayed scaling's norm writes FP8 itself (no input cast, only the weight's); current scaling's
    norm computes the amax (a cast, no amax pass); block scaling's norm writes bf16 for a cast."""
    shape = (2048, 6144, 2048, True, 1)
    assert FP8Casts("delayed", 0.5).forward_casts(shape) == [0.5 * 4 * 6144 * 2048]
    assert FP8Casts("current", 1.0).forward_casts(shape) == [4.0 * 2048 * 2048, (2 + 4) * 6144 * 2048]
    assert len(FP8Casts("block", 1.0).forward_casts(shape)) == 2


def test_the_blocks_linear_layers_are_marked_and_save_their_inputs_in_fp8() -> None:
    """Under fp8 the four linear layers of every block (not the output layer, the attention core or the norms) carry
    ``fp8``; fc1's and fc2's saved input is 1 B an element, qkv's input likewise (its kept Q, K, V stay bf16), and
    the projection keeps its FP8 copy beside the bf16 attention output the fused kernel reads."""
    model = load_model(MODEL)
    s = Strategy(dp=1, tp=2, micro_batch=1, dtype="fp8")
    g8 = build_sharded(model, sharding_of(s))
    g16 = build_sharded(model, sharding_of(s.model_copy(update={"dtype": "bf16"})))
    marked = sorted(n for n, d in g8.nodes(data=True) if d.get("fp8"))
    assert len(marked) == 4 * model.layers and all(n.split(".")[1] in ("qkv", "proj", "fc1", "fc2") for n in marked)
    assert not any(d.get("fp8") for _, d in g16.nodes(data=True))
    rows, h = model.seq_len, model.hidden
    assert g16.nodes["L0.fc1"]["saved_bytes"] == 2 * rows * h and g8.nodes["L0.fc1"]["saved_bytes"] == rows * h
    f_l = model.ffn_hidden // 2
    assert g8.nodes["L0.fc2"]["saved_bytes"] == rows * f_l
    assert g16.nodes["L0.qkv"]["saved_bytes"] - g8.nodes["L0.qkv"]["saved_bytes"] == rows * h
    q_l = h // 2
    assert g8.nodes["L0.proj"]["saved_bytes"] == (1 + 2) * rows * q_l
    assert g8.nodes["out.logits"]["flops"] == g16.nodes["out.logits"]["flops"] and "fp8" not in g8.nodes["out.logits"]


def test_fp8_memory_terms_by_hand() -> None:
    """FP8 weight copies: 2 B a weight element (row- and column-wise) under per-tensor recipes, 2 x (1 + 1/32) under
    MXFP8, none under fp8_param_gather (the parameter is the FP8 copy) or ZeRO-3; scaling state: 5 tensors x (amax
    history + scale + inverse) x 4 B a layer, Megatron-LM's history 1 under delayed scaling."""
    params, linears = 1.5e9, 48
    delayed = Strategy(dp=8, zero=1, dtype="fp8", fp8_recipe="delayed")
    assert fp8_bytes(delayed, (params, linears)) == {"fp8_weights": 2 * params, "fp8_scaling": 48 * 5 * 3 * 4.0}
    mx = Strategy(dp=8, zero=1, dtype="fp8", fp8_recipe="mxfp8")
    assert fp8_bytes(mx, (params, linears))["fp8_weights"] == pytest.approx(2 * params * (1 + 1 / 32))
    gathered = delayed.model_copy(update={"fp8_param_gather": True})
    assert fp8_bytes(gathered, (params, linears))["fp8_weights"] == 0.0
    assert fp8_bytes(Strategy(dp=8, dtype="bf16"), (params, linears)) == {}


def test_a_result_counts_the_fp8_memory_and_says_its_dtype() -> None:
    """The peak holds the FP8 copies of the stage's linear weights (their elements from the model: 12 h^2 a block
    on one tp rank: qkv 3h^2, proj h^2, fc1 and fc2 4h^2 each, over tp); a bf16 Result has no FP8 categories."""
    model = load_model(MODEL)
    strategy = "dp=4,tp=2,zero=1,micro_batch=1,global_batch=32,dtype=fp8"
    r = simulate(model, "dgx-h100", strategy, gpus=8)
    h = model.hidden
    assert r.memory_breakdown_bytes["fp8_weights"] == pytest.approx(2 * model.layers * 12 * h * h / 2, rel=1e-9)
    assert r.strategy["dtype"] == "fp8" and r.strategy["fp8_recipe"] == "delayed"
    b = simulate(model, "dgx-h100", strategy.replace("fp8", "bf16"), gpus=8)
    assert "fp8_weights" not in b.memory_breakdown_bytes and "fp8_recipe" not in b.strategy
    assert r.step_time_s < b.step_time_s
    assert r.peak_memory_bytes != b.peak_memory_bytes
    # MFU keeps the bf16 peak as its denominator, as Megatron-LM and published FP8 runs report it
    assert r.mfu / b.mfu == pytest.approx(b.step_time_s / r.step_time_s, rel=1e-9)


def test_fp8_speeds_up_a_gemm_bound_step() -> None:
    """An 8B model, data parallel on 8 H100s: the GEMMs dominate, FP8 makes the step at least 15 % faster, and
    each recipe's extra casts make it no faster than delayed scaling's (current: amax passes)."""
    model = load_model("llama3-8b")
    base = "dp=8,zero=1,micro_batch=1,global_batch=32,remat=full"
    bf16 = simulate(model, "dgx-h100", base, gpus=8).step_time_s
    delayed = simulate(model, "dgx-h100", base + ",dtype=fp8,fp8_recipe=delayed", gpus=8).step_time_s
    current = simulate(model, "dgx-h100", base + ",dtype=fp8,fp8_recipe=current", gpus=8).step_time_s
    assert delayed < 0.85 * bf16
    assert delayed < current < bf16


FP8_STRATEGIES = [
    "dp=2,tp=2,pp=2,micro_batch=1,global_batch=16,zero=1,dtype=fp8",
    "dp=2,tp=2,pp=2,micro_batch=1,global_batch=16,zero=1,sequence_parallel=true,dtype=fp8,fp8_recipe=current",
    "dp=1,tp=2,pp=4,micro_batch=1,global_batch=16,schedule=interleaved,virtual_stages=3,sequence_parallel=true,"
    "dtype=fp8,remat=selective",
    "dp=8,micro_batch=1,global_batch=16,zero=3,framework=fsdp,dtype=fp8,fp8_param_gather=true",
    "dp=4,tp=2,micro_batch=1,global_batch=16,zero=1,dtype=fp8,fp8_recipe=block,fp8_param_gather=true",
]


@pytest.mark.parametrize("strategy", FP8_STRATEGIES)
def test_engines_agree_with_fp8(strategy: str) -> None:
    """Both engines read one step model: within 2 % on the step time, and the same peak memory."""
    model = load_model("gpt3-125m")
    a = simulate(model, "dgx-h100", strategy, gpus=8, engine="analytic")
    d = simulate(model, "dgx-h100", strategy, gpus=8, engine="des")
    assert d.step_time_s == pytest.approx(a.step_time_s, rel=0.02), strategy
    assert d.peak_memory_bytes == pytest.approx(a.peak_memory_bytes, rel=0.02), strategy
    assert a.memory_breakdown_bytes["fp8_scaling"] > 0


def test_fp8_param_gather_halves_the_weight_gather() -> None:
    """ZeRO-1's weight all-gather after the step moves 1 B a parameter under fp8_param_gather, 2 B without."""
    model = load_model("gpt3-125m")
    base = "dp=8,micro_batch=1,global_batch=16,zero=1,overlap_param_gather=false,dtype=fp8"
    plain = simulate(model, "dgx-h100", base, gpus=8).comm_bytes_per_gpu
    gathered = simulate(model, "dgx-h100", base + ",fp8_param_gather=true", gpus=8).comm_bytes_per_gpu
    assert gathered["zero"] == pytest.approx(plain["zero"] / 2, rel=1e-9)


def test_a_shared_cache_prices_fp8_variants_as_fresh_ones() -> None:
    """The analytic caches key on every field FP8 reads (dtype, recipe, parameter gather, the micro-batches its
    weight casts are spread over): strategies differing in one of them priced through one cache equal fresh ones."""
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-h100", gpus=8)
    shared = AnalyticCache(model, cluster)
    base = {"dp": 4, "tp": 2, "micro_batch": 1, "global_batch": 16, "zero": 1, "dtype": "fp8"}
    variants = [
        base,
        {**base, "dtype": "bf16"},
        {**base, "fp8_recipe": "current"},
        {**base, "fp8_recipe": "block"},
        {**base, "fp8_param_gather": True},
        {**base, "global_batch": 32},
        {**base, "framework": "fsdp", "zero": 3},
        {**base, "framework": "fsdp", "zero": 3, "fp8_param_gather": True},
    ]
    seen = set()
    for fields in variants:
        s = Strategy(**fields)
        fresh = simulate_analytic(model, cluster, s, cache=AnalyticCache(model, cluster))
        assert simulate_analytic(model, cluster, s, cache=shared).to_dict() == fresh.to_dict(), fields
        assert shared.model_states_bytes(s) == AnalyticCache(model, cluster).model_states_bytes(s), fields
        seen.add(fresh.step_time_s)
    assert len(seen) == len(variants)


@pytest.mark.parametrize(
    ("hardware", "strategy", "words"),
    [
        ("dgx-a100", "dp=8,dtype=fp8", "A100-SXM4-80GB has no FP8 tensor cores"),
        ("dgx-1", "dp=8,dtype=fp8", "V100-SXM2-32GB has no FP8 tensor cores"),
        ("mi300x-platform", "dp=8,dtype=fp8", "FP8 training on NVIDIA GPUs"),
        ("dgx-h100", "dp=8,dtype=fp8,fp8_recipe=mxfp8", "fp8_recipe=mxfp8 on H100-SXM5-80GB"),
        ("dgx-h100", "dp=8,dtype=fp8,framework=deepspeed", "DeepSpeed trains in no FP8"),
        ("dgx-h100", "dp=8,fp8_recipe=current", "fp8_recipe=current needs dtype=fp8"),
        ("dgx-h100", "dp=8,dtype=bf16,fp8_param_gather=true", "fp8_param_gather=True needs dtype=fp8"),
        ("dgx-h100", "dp=8,dtype=fp8,framework=fsdp,fp8_recipe=delayed", "fp8_recipe=delayed with framework=fsdp"),
        ("dgx-h100", "dp=8,dtype=fp8,fp8_param_gather=true", "fp8_param_gather=true with zero=0"),
    ],
)
def test_refusals_are_one_line(hardware: str, strategy: str, words: str) -> None:
    with pytest.raises(PlansimError) as err:
        simulate(load_model("gpt3-125m"), hardware, strategy, gpus=8)
    text = str(err.value)
    assert words in text and "\n" not in text


def test_blackwell_runs_mxfp8_and_describe_says_fp8() -> None:
    """B200 runs MXFP8 (Transformer Engine: compute capability 10.x); the strategy's words name the recipe."""
    r = simulate(load_model("gpt3-125m"), "hgx-b200", "dp=8,dtype=fp8,fp8_recipe=mxfp8", gpus=8)
    assert r.step_time_s > 0
    s = Strategy(dp=8, dtype="fp8").resolve(load_hardware("dgx-h100", gpus=8))
    assert s.fp8_recipe == "delayed" and s.fp8_param_gather is False
    assert "fp8(delayed)" in describe(s)


def test_kernel_model_spreads_the_weight_cast_over_the_micro_batches() -> None:
    """Megatron-LM (Transformer Engine's weight cache) casts each weight once a step; torchtitan at every forward."""
    cluster = load_hardware("dgx-h100", gpus=8)
    mega = kernel_model(cluster, Strategy(dp=8, global_batch=32, dtype="fp8").resolve(cluster))
    fsdp = kernel_model(cluster, Strategy(dp=8, global_batch=32, dtype="fp8", framework="fsdp").resolve(cluster))
    assert mega.fp8 == FP8Casts("delayed", 1 / 4)
    assert fsdp.fp8 == FP8Casts("current", 1.0)
    assert math.isclose(mega.fp8.weight_casts * 4, 1.0)


def test_a_measured_profiles_fp8_gemms_price_the_fp8_layers() -> None:
    """``plansim profile`` records scaled FP8 GEMMs as gemm points of dtype fp8: the measured table prices an FP8
    linear layer's GEMMs from them (forward and the backward pair), and the bf16 GEMMs from the bf16 points."""
    from plansim.costs.kernels import KernelTable
    from plansim.profiling.schema import Environment, KernelPoint, KernelProfile

    env = Environment(device="cuda", device_name="Test GPU", torch="2.13.0", python="3.11", platform="test",
                      date="2026-11-29T00:00:00+00:00", command="test")  # fmt: skip
    rows = [("fwd", "fp8", 1e12, 1e-3), ("fwd", "fp8", 1e13, 8e-3), ("bwd", "fp8", 2e12, 2.5e-3),
            ("bwd", "fp8", 2e13, 17e-3), ("fwd", "bf16", 1e12, 2e-3), ("fwd", "bf16", 1e13, 16e-3)]  # fmt: skip
    points = [KernelPoint(op="gemm", direction=d, dtype=dt, shape=(1,), flops=f, bytes=1.0, time_s=t, repeats=3)  # type: ignore[arg-type]
              for d, dt, f, t in rows]  # fmt: skip
    table = KernelTable.from_profile(KernelProfile(environment=env, points=points), "test")
    k = KernelCostModel(H100, "bf16", table, fp8=FP8Casts("delayed", 0.0))
    op = {"kind": "matmul", "flops": 1e12, "bwd_flops": 2e12, "bytes": 1e6, "fp8": (1024, 1024, 1024, True, 1)}
    assert k.forward(op) == pytest.approx(1e-3)  # delayed, after a norm, the weight cast spread to nothing
    assert k.backward(op) == pytest.approx(2.5e-3 + _memory_s(4.0 * 1024 * 1024))
    assert k.forward({**op, "fp8": False}) == pytest.approx(2e-3)


def test_the_profiler_times_fp8_only_where_the_device_runs_it() -> None:
    torch = pytest.importorskip("torch")
    from plansim.profiling.profiler import fp8_gemm_available

    assert fp8_gemm_available(torch.device("cpu")) is False


def test_the_text_report_names_fp8_only_under_it() -> None:
    from io import StringIO

    from rich.console import Console

    from plansim.report.text import print_result

    model = load_model("gpt3-125m")
    for dtype, shown in (("fp8", True), ("bf16", False)):
        out = StringIO()
        r = simulate(model, "dgx-h100", f"dp=8,global_batch=16,dtype={dtype}", gpus=8)
        print_result(r, Console(file=out, width=120))
        assert ("fp8 (delayed)" in out.getvalue()) is shown


def test_sequence_parallel_gathers_the_fp8_input() -> None:
    """With sequence parallelism Transformer Engine all-gathers the quantized input of the QKV and FC1 layers: the
    forward all-gather (and the backward's re-gather) moves 1 B an element, the input gradient's reduce-scatter
    stays bf16; the output layer's gather stays bf16 too. Per block and micro-batch the tp bytes fall by the two
    gathers' halves: 2 x 2 x (t-1)/t x rows x h x 1 B on a ring."""
    model = load_model("gpt3-125m")
    base = "dp=2,tp=4,micro_batch=1,global_batch=2,sequence_parallel=true"
    # current scaling: no amax all-reduce (delayed scaling's few bytes would count as tp traffic too)
    fp8 = simulate(model, "dgx-h100", base + ",dtype=fp8,fp8_recipe=current", gpus=8).comm_bytes_per_gpu["tp"]
    bf16 = simulate(model, "dgx-h100", base + ",dtype=bf16", gpus=8).comm_bytes_per_gpu["tp"]
    rows, h, t = model.seq_len, model.hidden, 4
    assert bf16 - fp8 == pytest.approx(model.layers * 2 * 2 * (t - 1) / t * rows * h, rel=1e-9)
    g = build_sharded(model, sharding_of(Strategy(dp=2, tp=4, sequence_parallel=True, dtype="fp8")))
    assert g.nodes["L0.attn_in"]["fp8_comm_bytes"] == rows * h and "fp8_comm_bytes" not in g.nodes["out.logits_in"]


def test_a_gathered_input_is_cast_on_the_local_rows_and_transposed_after_the_regather() -> None:
    """Sequence parallelism, tp 4, QKV after its norm under block scaling: the forward casts this rank's quarter of
    the rows row-wise (2 B read, 1 B and the half of the block scales written an element) and the weight; the
    backward casts the output gradient and makes the re-gathered input's column-wise copy (1 B read, 1 B and the
    scales written, all rows). Under delayed scaling the norm writes the local FP8 rows itself."""
    m, n, k = 2048, 3 * 1024, 1024
    block = FP8Casts("block", 1.0)
    scale = 2 * 4 / 128
    assert block.forward_casts((m, n, k, True, 4)) == [(3 + scale / 2) * m / 4 * k, (4 + scale) * k * n]
    assert block.backward_casts((m, n, k, True, 4)) == [(4 + scale) * m * n, (2 + scale / 2) * m * k]
    assert FP8Casts("delayed", 0.0).forward_casts((m, n, k, True, 4)) == [0.0]
    g = build_sharded(load_model(MODEL), sharding_of(Strategy(dp=2, tp=4, sequence_parallel=True, dtype="fp8")))
    assert g.nodes["L0.qkv"]["fp8"][4] == 4 and g.nodes["L0.fc1"]["fp8"][4] == 4 and g.nodes["L0.fc2"]["fp8"][4] == 1


def test_delayed_scaling_all_reduces_each_chunks_amaxes() -> None:
    """Megatron-LM under delayed scaling: after each model chunk's forward and backward pass one blocking all-reduce
    of its amaxes (4 B x 3 forward or 2 backward tensors a linear layer) over every rank of the stage; per
    micro-batch a stage pays it for each of its chunks, priced by the layer collectives' pricer on the stage's
    group. Current scaling has none; a stage of one rank neither."""
    from plansim.analytic.stages import stage_sends
    from plansim.costs.interference import interference_model
    from plansim.step.p2p import amax_reduction
    from plansim.step.prepare import comm_pricer, prepare_step

    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-h100", gpus=16)
    s = Strategy(dp=2, tp=2, pp=4, virtual_stages=3, schedule="interleaved", micro_batch=1, global_batch=8,
                 dtype="fp8").resolve(cluster)  # fmt: skip
    prep = prepare_step(model, cluster, s)
    price = comm_pricer(cluster, s)
    linears = 4  # 12 blocks over 4 x 3 chunks: one block, four linear layers a chunk
    one = price("stage", "all_reduce", 4.0 * 3 * linears)[0] + price("stage", "all_reduce", 4.0 * 2 * linears)[0]
    model_ = interference_model(cluster.gpu, None)
    seconds = stage_sends(cluster, s, 1, prep.graph, model_, price)[0]
    current = s.model_copy(update={"fp8_recipe": "current"})
    assert seconds - stage_sends(cluster, current, 1, prep.graph, model_, price)[0] == pytest.approx(3 * one)
    assert amax_reduction(current, linears, True) is None
    assert amax_reduction(Strategy(dp=1, dtype="fp8", fp8_recipe="delayed"), linears, True) is None
    comm = amax_reduction(s, linears, False)
    assert comm is not None and comm.n_bytes == 32.0 and comm.axis == "stage"
