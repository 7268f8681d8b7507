"""``trace_module`` against independent truth: the GPT builder's graph (Korthikanti et al. 2022 sec 4.1 activations,
Narayanan et al. 2021 sec 5.1 FLOPs) for the same ``ModelSpec``, hand closed forms for MLPs and fused attention, and
PyTorch's own checkpointing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import networkx as nx  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from plansim.costs.kernels import KernelCostModel  # noqa: E402
from plansim.errors import PlansimError  # noqa: E402
from plansim.hardware import load_gpu  # noqa: E402
from plansim.profiling.torch_models import build_model  # noqa: E402
from plansim.remat.stage import stage_graph  # noqa: E402
from plansim.step.layers import layer_costs, layer_programs  # noqa: E402
from plansim.strategy.mesh import DeviceMesh  # noqa: E402
from plansim.workload import ModelSpec, build_graph, graph_totals, model_flops  # noqa: E402
from plansim.workload.graph import (  # noqa: E402
    KINDS,
    MATMUL_KINDS,
    NODE_ATTRIBUTES,
)
from plansim.workload.torch_trace import trace_module  # noqa: E402

#: its module-scoped fixtures computed once: every test here on one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_torch_trace")

SPEC = ModelSpec(name="tiny-gpt", family="gpt", layers=3, hidden=128, heads=4, seq_len=64, vocab=512)
BATCH = 2
E = 2  # bf16


class _Block(nn.Module):
    """A GPT block as plansim's builder counts it: torch_models' block plus Megatron-LM's dropouts (attention
    probabilities, after the out-projection and after fc2), with the causal mask a buffer (as in GPT-2)."""

    def __init__(self, spec: ModelSpec, p: float) -> None:
        super().__init__()
        h, self.heads = spec.hidden, spec.heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, spec.ffn_hidden), nn.Linear(spec.ffn_hidden, h)
        self.drop = nn.Dropout(p)
        causal = torch.ones(spec.seq_len, spec.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(h // self.heads)
        probs = self.drop(scores.masked_fill(self.causal[:s, :s], float("-inf")).softmax(-1))
        x = x + self.drop(self.proj((probs @ v).transpose(1, 2).reshape(b, s, h)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh")))


class _DropoutGPT(nn.Module):
    """torch_models' GPT (learned positions, tied head) with the embedding dropout Korthikanti et al. count."""

    def __init__(self, spec: ModelSpec, p: float = 0.1) -> None:
        super().__init__()
        self.embed, self.positions = nn.Embedding(spec.vocab, spec.hidden), nn.Embedding(spec.seq_len, spec.hidden)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(_Block(spec, p) for _ in range(spec.layers))
        self.norm, self.head = nn.LayerNorm(spec.hidden), nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _fp32_cross_entropy(batch: int, seq: int):
    """Megatron-LM's loss: cross-entropy over fp32 logits (Korthikanti et al. 2022, sec 4.3)."""
    targets = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return lambda logits: F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def _trace_gpt(model: nn.Module, name: str = "gpt"):
    tokens = ((BATCH, SPEC.seq_len), torch.long)
    return trace_module(model, tokens, name=name, loss=_fp32_cross_entropy(BATCH, SPEC.seq_len))


@pytest.fixture(scope="module")
def dropout_gpt():
    with torch.device("meta"):
        model = _DropoutGPT(SPEC).to(torch.bfloat16)
    return _trace_gpt(model), build_graph(SPEC, BATCH, attention="unfused")  # the validator's model runs it unfused


def _close(a: float, b: float, rel: float = 0.01) -> bool:
    return abs(a - b) <= rel * abs(b)


def test_gpt_totals_match_builder_within_1_percent(dropout_gpt):
    traced, built = dropout_gpt
    got, want = traced.totals(), graph_totals(built)
    assert got["params"] == want["params"] == SPEC.num_parameters()
    # GEMM FLOPs (FlopCounterMode) are 2mnk exactly; the trace does not know the core's mask is causal, so it
    # counts every score, as the builder's graph does before the causal share
    assert model_flops(traced.graph) == 3 * sum(
        d["flops"] for _, d in built.nodes(data=True) if d["kind"] in MATMUL_KINDS
    )
    for key in ("flops", "saved_bytes"):
        assert _close(got[key], want[key]), (key, got[key], want[key])


@pytest.mark.parametrize("layer", [0, 1, 2, 3])
def test_gpt_blocks_and_head_match_builder_within_1_percent(dropout_gpt, layer):
    traced, built = dropout_gpt
    got, want = traced.totals([layer]), graph_totals(built, [layer])
    assert got["params"] == want["params"]
    for key in ("flops", "saved_bytes"):
        assert _close(got[key], want[key]), (layer, key, got[key], want[key])


def test_gpt_embedding_layer_keeps_position_ids(dropout_gpt):
    """Layer -1: the builder's dropout mask (b*s*h bytes) plus the int64 position ids the embedding backward
    keeps (8*s bytes), which Korthikanti et al. leave out as O(s) next to O(s*h); token ids are the caller's."""
    traced, built = dropout_gpt
    got, want = traced.totals([-1]), graph_totals(built, [-1])
    assert (got["flops"], got["params"]) == (want["flops"], want["params"])
    assert got["saved_bytes"] == want["saved_bytes"] + 8 * SPEC.seq_len


def test_gpt_selective_recompute_drops_what_builder_drops(dropout_gpt):
    """Korthikanti et al. 2022 sec 5: selective recompute drops the softmax output, its dropout mask and dropout
    output, 5*a*s^2*b bytes per block in bf16; Q, K and V stay."""
    traced, _ = dropout_gpt
    a, s, b = SPEC.heads, SPEC.seq_len, BATCH
    for layer in range(SPEC.layers):
        dropped = sum(
            d["saved_bytes"]
            for _, d in traced.graph.nodes(data=True)
            if d["layer"] == layer and d["selective_recompute"]
        )
        assert dropped == 5 * a * s * s * b


def test_graph_speaks_the_builders_vocabulary(dropout_gpt):
    traced, _ = dropout_gpt
    graph = traced.graph
    order = {n: i for i, n in enumerate(graph)}
    assert all(order[u] < order[v] for u, v in graph.edges)  # execution order, edges forward in it
    assert nx.is_directed_acyclic_graph(graph)
    for _, data in graph.nodes(data=True):
        assert set(NODE_ATTRIBUTES) <= set(data) and data["kind"] in KINDS
        assert -1 <= data["layer"] <= SPEC.layers
    assert graph.graph["layer_input_bytes"] == E * BATCH * SPEC.seq_len * SPEC.hidden
    assert (traced.layers, traced.blocks, graph.graph["unattributed_bwd_flops"]) == (SPEC.layers, "blocks", 0)
    kernels, no_tp = KernelCostModel(load_gpu("a100-sxm4-80gb"), "bf16"), lambda a, c, n: (0.0, 0.0)
    costs = layer_costs(layer_programs(graph, kernels, DeviceMesh((("tp", 1), ("dp", 1), ("pp", 1)))), no_tp)
    assert sorted(costs) == list(range(-1, SPEC.layers + 1)) and all(c.fwd_s > 0 for c in costs.values())


@pytest.mark.parametrize("model", ["dropout", "validator"])
def test_remat_coarsens_a_traced_block_as_a_built_one(dropout_gpt, validator_gpt, model):
    """The remat stage graph at layer granularity: four forward nodes per block (its first op, the ops before the
    attention core, the core, the rest), as for the builder's graph; the core's inputs (the copy of V, a causal
    mask made each forward) are ordered before it."""
    traced = dropout_gpt[0] if model == "dropout" else validator_gpt["none"]
    kernels, no_tp = KernelCostModel(load_gpu("a100-sxm4-80gb"), "bf16"), lambda a, c, n: (0.0, 0.0)
    blocks = range(SPEC.layers)
    coarse = stage_graph(traced.graph, blocks, kernels, no_tp, granularity="layer")
    built = stage_graph(dropout_gpt[1], blocks, kernels, no_tp, granularity="layer")
    assert coarse.forward_count == built.forward_count == 4 * SPEC.layers


@pytest.fixture(scope="module")
def validator_gpt():
    return {
        r: _trace_gpt(build_model(SPEC, r, device="meta", dtype=torch.bfloat16, dropout=0.0))
        for r in ("none", "selective", "full")
    }


def test_validator_gpt_params_and_flops(validator_gpt):
    """torch_models' GPT (built without dropout): the builder's parameters and Narayanan et al.'s model FLOPs."""
    traced = validator_gpt["none"]
    b, s, L, h, V = BATCH, SPEC.seq_len, SPEC.layers, SPEC.hidden, SPEC.vocab
    assert traced.totals()["params"] == SPEC.num_parameters()
    assert model_flops(traced.graph) == 72 * b * s * L * h * h + 12 * b * s * s * L * h + 6 * b * s * h * V


def test_validator_gpt_activations_per_block(validator_gpt):
    """Korthikanti et al. 2022 sec 4.1 without the dropout terms (E*16sbh + E*as^2b; built with dropout 0), plus what
    that count leaves out: LayerNorm's fp32 mean and 1/std (2 norms x 8 bytes per token) and the causal mask (s^2
    bool), one tensor shared by every block, so counted once, in the first. Full recompute keeps the block input
    only (Chen et al. 2016); selective drops the softmax output and the mask."""
    a, s, b, h = SPEC.heads, SPEC.seq_len, BATCH, SPEC.hidden
    for layer in range(SPEC.layers):
        mask = s * s if layer == 0 else 0
        none = E * 16 * s * b * h + E * a * s * s * b + 2 * 8 * b * s + mask
        wants = (("none", none), ("selective", none - E * a * s * s * b - mask), ("full", E * s * b * h))
        for remat, want in wants:
            assert validator_gpt[remat].totals([layer])["saved_bytes"] == want, (remat, layer)


@given(
    rows=st.integers(1, 64),
    widths=st.lists(st.integers(1, 96), min_size=4, max_size=4),
)
@settings(max_examples=8, deadline=None)
def test_mlp_closed_forms(rows, widths):
    """Linear(k,n1) GELU Linear(n1,n2) ReLU Linear(n2,n3) on (m, k) fp32: 2mnk FLOPs per linear, kn+n parameters;
    backward 4mnk, but 2mnk for the first (its input needs no gradient); saved: GELU's input, GELU's output (fc2's
    input) and ReLU's output (also fc3's input, kept once)."""
    m, (k, n1, n2, n3) = rows, widths
    mlp = nn.Sequential(nn.Linear(k, n1), nn.GELU(), nn.Linear(n1, n2), nn.ReLU(), nn.Linear(n2, n3))
    traced = trace_module(mlp, (m, k))
    assert (traced.layers, traced.blocks) == (5, "")
    linears = {0: (k, n1), 2: (n1, n2), 4: (n2, n3)}
    for layer, (fan_in, fan_out) in linears.items():
        got = traced.totals([layer])
        assert got["flops"] == 2 * m * fan_in * fan_out
        assert got["bwd_flops"] == (2 if layer == 0 else 4) * m * fan_in * fan_out
        assert got["params"] == fan_in * fan_out + fan_out
    assert traced.totals()["saved_bytes"] == 4 * m * (2 * n1 + n2)


def test_cnn_closed_forms():
    """A convolution is 2*k^2*c_in*c_out*H*W FLOPs per image (k x k kernel, same padding), k^2*c_in*c_out (+c_out)
    parameters; the first needs no input gradient, so its backward is its weight gradient alone (1x), the second's
    2x. BatchNorm holds 2*c parameters."""
    n, size, c1, c2, k = 4, 16, 8, 16, 3
    net = nn.Sequential(
        nn.Conv2d(3, c1, k, padding=1, bias=False), nn.BatchNorm2d(c1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, k, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c2, 10),
    )  # fmt: skip
    traced = trace_module(net, (n, 3, size, size), loss=lambda y: y.logsumexp(-1).mean())
    kinds = [d["kind"] for _, d in traced.graph.nodes(data=True)]
    assert {"conv", "norm", "pool", "matmul"} <= set(kinds)
    conv1, conv2 = 2 * k * k * 3 * c1 * size * size * n, 2 * k * k * c1 * c2 * (size // 2) ** 2 * n
    assert (traced.totals([0])["flops"], traced.totals([0])["bwd_flops"]) == (conv1, conv1)
    assert (traced.totals([4])["flops"], traced.totals([4])["bwd_flops"]) == (conv2, 2 * conv2)
    assert traced.totals([1])["params"] == 2 * c1
    assert traced.totals()["params"] == k * k * 3 * c1 + 2 * c1 + k * k * c1 * c2 + c2 + c2 * 10 + 10


def test_fused_attention_is_traced_as_the_gpu_kernel():
    """``F.scaled_dot_product_attention`` in bf16 runs as flash attention: one bmm-kind op in the attention core,
    4*b*a*s^2*d FLOPs (QK^T and attention over V), keeping Q, K, V, the output and the fp32 log-sum-exp (4*b*a*s
    bytes) plus the RNG state, not the s^2 probabilities of the meta device's math fallback."""

    class Attention(nn.Module):
        def __init__(self, h: int, heads: int) -> None:
            super().__init__()
            self.heads, self.qkv, self.out = heads, nn.Linear(h, 3 * h), nn.Linear(h, h)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, h = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(y.transpose(1, 2).reshape(b, s, h))

    b, s, h, heads = 2, 256, 64, 4
    traced = trace_module(Attention(h, heads).to(torch.bfloat16), (b, s, h))
    fused = [d for _, d in traced.graph.nodes(data=True) if d["kind"] == "bmm"]
    assert len(fused) == 1 and fused[0]["selective_recompute"]
    assert fused[0]["flops"] == 4 * b * heads * s * s * (h // heads)
    lse = 4 * b * heads * s
    assert lse <= fused[0]["saved_bytes"] <= lse + 64
    assert traced.totals()["saved_bytes"] == 4 * E * b * s * h + fused[0]["saved_bytes"]


def test_input_forms_agree_and_module_is_left_as_it_was():
    mlp = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).eval()
    forms = [(5, 8), [(5, 8)], ((5, 8), torch.float32), torch.zeros(5, 8), [torch.zeros(5, 8)]]
    totals = [trace_module(mlp, form).totals() for form in forms]
    assert all(t == totals[0] for t in totals)
    assert not mlp.training and next(mlp.parameters()).device.type == "cpu"
    with torch.no_grad():  # the trace turns gradients on for itself
        assert trace_module(mlp, (5, 8)).totals() == totals[0]


@pytest.mark.parametrize(
    ("module", "inputs", "kwargs", "fragment"),
    [
        ("not a module", (2, 3), {}, "module: got str"),
        (nn.Linear(3, 4), (2, 5), {}, "tracing on inputs (2, 5) float32 failed: RuntimeError"),
        (nn.Linear(3, 4), (2, 0), {}, "inputs[0]=(2, 0)"),
        (nn.Linear(3, 4), ["x"], {}, "inputs[0]='x'"),
        (nn.Linear(3, 4), (2, 3), {"blocks": "layers"}, "blocks='layers'"),
        (nn.Linear(3, 4), (2, 3), {"loss": lambda y: y * 2}, "must return a scalar"),
        (nn.Linear(3, 4), (2, 3), {"loss": lambda y: 1.0}, "pass loss="),
        (nn.ReLU(), (2, 3), {}, "depends on no trainable parameter"),
    ],
)
def test_bad_input_is_one_line(module, inputs, kwargs, fragment):
    with pytest.raises(PlansimError) as err:
        trace_module(module, inputs, **kwargs)
    message = str(err.value)
    assert fragment in message and "\n" not in message
