"""GPT and Llama models in plain PyTorch with the architecture of plansim's workload builders, for the validator's
real training steps: the same layers, widths and parameters (``ModelSpec.num_parameters`` exactly), and the same
rematerialization policies (``torch.utils.checkpoint``).

- GPT (``family: gpt``): learned positions (rotary ones, as GPT-NeoX, when ``learned_positions`` is off),
  pre-LayerNorm blocks, fused QKV and out-projection with biases, GELU MLP with biases, a final LayerNorm, the output
  head tied to the word embedding unless ``tied_embeddings`` is off.
- Llama (``family: llama``): RMSNorm, rotary positions (no parameters), grouped-query attention (``kv_heads``) with
  no biases, SwiGLU MLP, a final RMSNorm, an untied output head unless ``tied_embeddings`` is on.

Remat: ``full`` reruns each block's forward in backward (Chen et al. 2016); ``selective`` reruns the attention core
only (QK^T, softmax, attention over V: Korthikanti et al. 2022 sec 5), which is what plansim's ``selective`` prices.
The attention core is written out (not ``scaled_dot_product_attention``) so that it stores what the workload
builder counts; a flash-attention variant is a profiler concern, not the validator's.

Needs the ``profile`` extra (torch).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from plansim.errors import PlansimError
from plansim.workload import ModelSpec

__all__ = ["REMAT_POLICIES", "build_model", "num_parameters"]

#: Remat policies the validator runs (plansim's names).
REMAT_POLICIES = ("none", "selective", "full")


def build_model(spec: ModelSpec, remat: str = "none", *, device: Any = None, dtype: Any = None) -> nn.Module:
    """``spec`` as a PyTorch module: ``model(tokens)`` with ``tokens`` of shape (batch, seq) gives logits of shape
    (batch, seq, vocab). ``device="meta"`` builds it without memory (for counting parameters).

    >>> from plansim.workload import load_model
    >>> spec = load_model("gpt3-125m")
    >>> num_parameters(build_model(spec, device="meta")) == spec.num_parameters()
    True
    """
    if spec.family not in ("gpt", "llama"):
        raise PlansimError(f"model {spec.name}: family {spec.family!r}: the validator builds gpt and llama only")
    if remat not in REMAT_POLICIES:
        raise PlansimError(f"remat {remat!r}: the validator runs {', '.join(REMAT_POLICIES)}")
    with torch.device(device or "cpu"):
        model = _Transformer(spec, remat)
    return model.to(dtype=dtype) if dtype is not None else model


def num_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor once (a tied head is not counted twice)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class _RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019): a scale, no shift."""

    def __init__(self, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) over the last dimension of (batch, heads, seq, head_dim)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal softmax(QK^T / sqrt(d)) V over (batch, heads, seq, head_dim)."""
    seq = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


class _Block(nn.Module):
    def __init__(self, spec: ModelSpec, remat: str) -> None:
        super().__init__()
        h, f, gpt = spec.hidden, spec.ffn_hidden, spec.family == "gpt"
        self.gpt, self.remat, self.rotary = gpt, remat, not spec.learned_positions
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        kv = 2 * spec.kv_heads * spec.head_dim
        self.norm1 = nn.LayerNorm(h) if gpt else _RMSNorm(h)
        self.norm2 = nn.LayerNorm(h) if gpt else _RMSNorm(h)
        self.qkv = nn.Linear(h, h + kv, bias=gpt)
        self.out = nn.Linear(h, h, bias=gpt)
        if gpt:
            self.fc1, self.fc2 = nn.Linear(h, f), nn.Linear(f, h)
        else:
            self.gate = nn.Linear(h, f, bias=False)
            self.up = nn.Linear(h, f, bias=False)
            self.down = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.remat == "full" and self.training:
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [h, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary:
            q, k = _rotary(q), _rotary(k)
        if not self.gpt:
            groups = self.heads // self.kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if self.remat == "selective" and self.training:
            a = checkpoint(_attention_core, q, k, v, use_reentrant=False)
        else:
            a = _attention_core(q, k, v)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        y = self.norm2(x)
        y = self.fc2(F.gelu(self.fc1(y))) if self.gpt else self.down(F.silu(self.gate(y)) * self.up(y))
        return x + y


class _Transformer(nn.Module):
    def __init__(self, spec: ModelSpec, remat: str) -> None:
        super().__init__()
        h, gpt = spec.hidden, spec.family == "gpt"
        self.embed = nn.Embedding(spec.vocab, h)
        self.positions = nn.Embedding(spec.seq_len, h) if spec.learned_positions else None
        self.blocks = nn.ModuleList(_Block(spec, remat) for _ in range(spec.layers))
        self.norm = nn.LayerNorm(h) if gpt else _RMSNorm(h)
        self.head = nn.Linear(h, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
