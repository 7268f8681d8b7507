"""The one walk over a micro-batch's op graph (plansim.step.layers): the lowering runs its segments, the analytic
engine sums them. Checked against sums taken straight over the graph's ops, and per mesh axis."""

from __future__ import annotations

from dataclasses import replace

import networkx as nx
import pytest

from plansim.costs.kernels import KernelCostModel
from plansim.hardware import load_hardware
from plansim.step.layers import layer_costs, layer_programs, rerun, weight_gradient_s
from plansim.strategy.mesh import mesh_of
from plansim.strategy.schema import Strategy
from plansim.workload import build_graph, load_model
from plansim.workload.graph import Node, stamp
from plansim.workload.graph import op as make_op


def _graph(preset: str, tp: int):  # type: ignore[no-untyped-def]
    model = load_model(preset)
    kernels = KernelCostModel(load_hardware("dgx-a100", gpus=8).gpu, "bf16")
    graph = build_graph(model, micro_batch=1, tp=tp)
    return graph, kernels, mesh_of(Strategy(tp=tp, dp=8 // tp, micro_batch=1, global_batch=8 // tp))


@pytest.mark.parametrize("preset,tp", [("gpt3-1.3b", 1), ("gpt3-1.3b", 4), ("llama3-8b", 2), ("resnet50", 1)])
def test_layer_sums_are_the_sums_over_its_ops(preset: str, tp: int) -> None:
    """Compute, weight gradient, parameters, saved bytes and FLOPs of each layer equal the plain sums over its ops."""
    graph, kernels, mesh = _graph(preset, tp)
    costs = layer_costs(layer_programs(graph, kernels, mesh), lambda axis, coll, n: (0.0, 0.0))
    by_layer: dict[int, list[dict]] = {}
    for _, op in graph.nodes(data=True):
        if op["kind"] != "collective":
            by_layer.setdefault(op["layer"], []).append(op)
    assert set(costs) == set(by_layer)
    for layer, ops in by_layer.items():
        c = costs[layer]
        assert c.fwd_s == pytest.approx(sum(kernels.forward(op) for op in ops), rel=1e-12)
        assert c.bwd_s == pytest.approx(sum(kernels.backward(op) for op in ops), rel=1e-12)
        assert c.bwd_weight_s == pytest.approx(sum(weight_gradient_s(op, kernels) for op in ops), rel=1e-12)
        assert c.params == sum(op["params"] for op in ops)
        assert c.saved_bytes == sum(op["saved_bytes"] for op in ops)
        sel = [op for op in ops if op["selective_recompute"]]
        assert c.selective_saved_bytes == sum(op["saved_bytes"] for op in sel)
        assert c.selective_fwd_s == pytest.approx(sum(kernels.forward(op) for op in sel), rel=1e-12)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_collectives_are_priced_on_the_axis_their_op_names(tp: int) -> None:
    """Every collective op is priced once per pass that runs it, on its op's axis (a layer copied from an earlier
    one's template shares that layer's prices); on an axis of size 1 none is. The passes: forward, backward, and a
    block's rerun under a per-op remat policy (``op_sac``), which reruns the forward collectives it does not keep."""
    graph, kernels, mesh = _graph("gpt3-1.3b", tp)
    asked: list[tuple[str, str, float]] = []

    def price(axis: str, coll: str, n_bytes: float) -> tuple[float, float]:
        asked.append((axis, coll, n_bytes))
        return 1.0, n_bytes

    costs = layer_costs(layer_programs(graph, kernels, mesh), price)
    copies = graph.graph["copies"]
    ops = [op for _, op in graph.nodes(data=True) if op["kind"] == "collective"]
    runs = [
        (op["group"], name, op["comm_bytes"], op["layer"])
        for op in ops
        for name in (op["collective"], op["bwd_collective"])
        if name != "none" and mesh.size(op["group"]) > 1
    ]
    reruns = [
        (op["group"], op["collective"], op["comm_bytes"], op["layer"])
        for op in ops
        if op["collective"] != "none" and mesh.size(op["group"]) > 1 and op.get("sac_rerun", 1.0) > 0
        and 0 <= op["layer"] < graph.graph["spec"].layers
    ]  # fmt: skip
    assert sorted(asked) == sorted(run[:3] for run in runs + reruns if run[3] not in copies)
    assert bool(runs) == (tp > 1)
    total = sum(c.comm_fwd_s + c.comm_bwd_s for c in costs.values())
    assert total == len(runs)
    assert {a.axis for c in costs.values() for a in c.comm} == ({"tp"} if tp > 1 else set())


def test_rerun_follows_the_policy_registry() -> None:
    """full and sqrt rerun each block's forward with its collectives; selective the attention core only; none and
    the scheduled milp nothing here."""
    graph, kernels, mesh = _graph("gpt3-1.3b", 2)
    costs = layer_costs(layer_programs(graph, kernels, mesh), lambda axis, coll, n: (1e-3, n))
    blocks = [costs[i] for i in range(3)]
    for remat in ("full", "sqrt"):
        r = rerun(remat, blocks)
        assert r.compute_s == pytest.approx(sum(c.fwd_s for c in blocks))
        assert r.tp_comm_s == pytest.approx(sum(c.comm_fwd_s for c in blocks)) and r.tp_comm_s > 0
    sel = rerun("selective", blocks)
    assert sel.compute_s == pytest.approx(sum(c.selective_fwd_s for c in blocks)) and sel.tp_comm_s == 0
    assert 0 < sel.matmul_flops < rerun("full", blocks).matmul_flops
    assert rerun("none", blocks) == rerun("milp", blocks) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("preset,tp", [("gpt3-1.3b", 4), ("mlp-small", 2), ("resnet50", 1)])
def test_layers_stamped_from_one_template_are_walked_once_with_the_same_result(preset: str, tp: int) -> None:
    """``stamp`` records which layers copy an earlier layer's template; walking each template once gives exactly
    the programs of the walk over every op (the graph without that record)."""
    graph, kernels, mesh = _graph(preset, tp)
    shortcut = layer_programs(graph, kernels, mesh)
    if preset != "resnet50":  # its blocks differ (a template per stage and stride)
        assert len(graph.graph["copies"]) == load_model(preset).layers - 1
    copies = graph.graph.pop("copies", {})
    full = layer_programs(graph, kernels, mesh)
    assert list(shortcut) == list(full)
    for layer, program in full.items():
        assert replace(shortcut[layer], same_as=None) == program
        assert shortcut[layer].same_as == copies.get(layer)


def test_a_layer_is_stamped_once() -> None:
    block = [Node("a", make_op("elementwise"))]
    graph = nx.DiGraph()
    stamp(graph, block, 0, "L0.", None)
    with pytest.raises(ValueError, match="layer 0 stamped twice"):
        stamp(graph, block, 0, "L0b.", "L0.a")


@pytest.mark.parametrize("preset", ["gpt3-1.3b", "llama3-8b"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_sequence_parallel_backward_regathers_each_column_parallel_input(preset: str, tp: int) -> None:
    """Bytes one rank sends in a block's tensor-parallel collectives, counted by hand from Megatron-LM's layers
    (Korthikanti et al. 2022, sec 4.2.2): without sequence parallelism two all-reduces forward and two backward, 2
    (t-1)/t N bytes each (N = one micro-batch's whole activation); with it an all-gather and a reduce-scatter
    replace each all-reduce ((t-1)/t N each, the same volume), and the backward of each column-parallel linear
    (QKV, first MLP GEMM) gathers its input once more for the weight gradient: 2 (t-1)/t N more."""
    model = load_model(preset)
    kernels = KernelCostModel(load_hardware("dgx-a100", gpus=8).gpu, "bf16")
    mesh = mesh_of(Strategy(tp=tp, dp=8 // tp, micro_batch=1, global_batch=8 // tp))
    share = (tp - 1) / tp * model.seq_len * model.hidden * 2

    def sent(axis: str, coll: str, n: float) -> tuple[float, float]:
        return 0.0, (2 if coll == "all_reduce" else 1) * (tp - 1) / tp * n

    for sp, (fwd, bwd) in ((False, (4, 4)), (True, (4, 6))):
        graph = build_graph(model, micro_batch=1, tp=tp, sequence_parallel=sp)
        block = layer_costs(layer_programs(graph, kernels, mesh), sent)[0]
        (axis,) = block.comm
        assert axis.axis == "tp"
        assert axis.fwd_bytes == pytest.approx(fwd * share, rel=1e-12)
        assert axis.bwd_bytes == pytest.approx(bwd * share, rel=1e-12)


def test_the_regather_hides_behind_the_input_gradient_gemm() -> None:
    """Megatron-LM launches the re-gather before the input-gradient GEMM and waits for it after (layers.py,
    LinearWithGradAccumulationAndAsyncCommunication.backward): a gather of g seconds beside a GEMM of d seconds is
    exposed for max(0, g - d). The segment right after the gather is that GEMM alone; the weight gradient follows."""
    model = load_model("gpt3-1.3b")
    kernels = KernelCostModel(load_hardware("dgx-a100", gpus=8).gpu, "bf16")
    mesh = mesh_of(Strategy(tp=2, dp=4, micro_batch=1, global_batch=4))
    graph = build_graph(model, micro_batch=1, tp=2, sequence_parallel=True)
    programs = layer_programs(graph, kernels, mesh)
    qkv = graph.nodes["L0.qkv"]
    dgrad = kernels.backward(qkv) - weight_gradient_s(qkv, kernels)
    lp = programs[0]
    for segments in (lp.bwd, lp.bwd_input):
        hidden = [i for i, seg in enumerate(segments) if seg.hidden_s > 0]
        assert len(hidden) == 2  # QKV and fc1
        assert [seg.comm.collective for seg in (segments[i] for i in hidden)] == ["all_gather", "all_gather"]
        assert all(segments[i + 1].comm is None for i in hidden)
    qkv_gather = max(i for i, seg in enumerate(lp.bwd) if seg.hidden_s > 0)  # the walk runs backward: QKV is last
    assert lp.bwd[qkv_gather].hidden_s == pytest.approx(dgrad, rel=1e-12)
    assert lp.bwd[qkv_gather + 1].seconds == pytest.approx(dgrad, rel=1e-12)
    for g in (0.5 * dgrad, 3 * dgrad):  # hidden, then exposed by the difference

        def price(axis: str, coll: str, n: float, g: float = g) -> tuple[float, float]:
            return (g, n) if coll == "all_gather" else (0.0, n)

        c = layer_costs({0: lp}, price)[0]
        fc1 = graph.nodes["L0.fc1"]
        fc1_dgrad = kernels.backward(fc1) - weight_gradient_s(fc1, kernels)
        blocking = 2 * g  # the two blocking all-gathers of the row-parallel outputs' gradients
        exposed = max(0.0, g - dgrad) + max(0.0, g - fc1_dgrad)
        assert c.comm_bwd_s == pytest.approx(blocking + exposed, rel=1e-12)
