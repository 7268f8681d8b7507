"""Megatron-LM's own memory report against plansim's, on the configuration its papers and docs give (GPT-3 175B, tensor
8 x pipeline 8, sequence parallelism, selective recompute, the distributed optimizer).

Independent truth: ``report_theoretical_memory`` (NVIDIA/Megatron-LM core_v0.15.0,
megatron/training/theoretical_memory_usage.py), rewritten here from its source: the most loaded shard's parameters
(a pipeline stage's share of the blocks and the embedding, over tp) at 6 + 12/dp bytes each with the distributed
optimizer (lines 175-180), and the first stage's activations, Korthikanti et al. 2022 Table 2 (``s b h (18 + 4 f /
h)`` a layer with sequence parallelism and selective recompute) for every layer, the embedding's input and dropout for
pp micro-batches, times the interleaved schedule's penalty ``1 + (p - 1) / (p v)``, over tp (lines 187-250). What
plansim adds beyond them (the workspace reserve, the CUDA context, NCCL's buffers, the allocator's rounding) is its
own, stated in its breakdown; these two must agree.
"""

from __future__ import annotations

import math

import pytest

import plansim
from plansim.api import load_model


def _megatron_report(tp: int, pp: int, v: int | None, dp: int, mb: int) -> tuple[float, float]:
    """(weights and optimizer, activations) bytes of the most loaded rank, as report_theoretical_memory computes."""
    m = load_model("gpt3-175b")
    s, h, f, layers = m.seq_len, m.hidden, m.ffn_hidden, m.layers
    vocab = math.ceil(m.vocab / (128 * tp)) * 128 * tp  # --make-vocab-size-divisible-by 128, times tp
    layer = 2 * h * (f + 2) + 2 * h * h * 2  # MLP and layernorms, then attention (no grouped query)
    block = layer * layers + 2 * h  # and the final layernorm
    shard = (block / pp + h * vocab) / tp  # the first stage holds the embedding
    weights_and_optimizer = shard * (6 + 12 / dp)
    act = s * mb * h * (18 + 4 * f / h) * layers + 8 * s * mb * pp + s * mb * h * pp
    if v is not None:
        act *= 1 + (pp - 1) / (pp * v)
    return weights_and_optimizer, act / tp


@pytest.mark.parametrize("virtual", [None, 12])
def test_model_states_and_activations_match_megatrons_report(virtual: int | None) -> None:
    schedule = f"interleaved,virtual_stages={virtual}" if virtual else "1f1b"
    strategy = (
        f"dp=16,tp=8,pp=8,micro_batch=1,global_batch=1536,schedule={schedule},sequence_parallel=true,"
        "remat=selective,zero=1"
    )
    r = plansim.simulate("gpt3-175b", "dgx-a100", strategy, gpus=1024)
    states, activations = _megatron_report(8, 8, virtual, 16, 1)
    m = r.memory_breakdown_bytes
    # the report leaves out GPT-3's learned position table (2,048 x 12,288, replicated over tp: 25.2M parameters on
    # each first-stage rank, +0.9%) and the linear biases
    assert m["weights"] + m["gradients"] + m["optimizer"] == pytest.approx(states, rel=0.01)
    assert m["activations"] == pytest.approx(activations, rel=0.01)
