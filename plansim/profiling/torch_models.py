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
Every block keeps for backward what the workload builder counts (Korthikanti et al. 2022 sec 4.1), as the fused
kernels of Megatron-LM would: the attention core is written out (not ``scaled_dot_product_attention``) with one
causal mask shared by all blocks; RMSNorm and SwiGLU are autograd functions that keep their inputs only; rotary
embeddings are products with shared tables; the heads sharing a key/value head read it in place. A flash-attention
variant is a profiler concern, not the validator's.

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
from plansim.workload.families import FAMILIES, family_of

__all__ = ["REMAT_POLICIES", "build_model", "num_parameters"]

#: Remat policies the validator runs (plansim's names).
REMAT_POLICIES = ("none", "selective", "full")


def build_model(
    spec: ModelSpec, remat: str = "none", *, device: Any = None, dtype: Any = None, dropout: float | None = None
) -> nn.Module:
    """``spec`` as a PyTorch module: ``model(tokens)`` with ``tokens`` of shape (batch, seq) gives logits of shape
    (batch, seq, vocab). ``device="meta"`` builds it without memory (for counting parameters). ``dropout`` defaults
    to the builder's: 0.1 for GPT (after the embedding, on the attention probabilities, after the attention
    projection and after the MLP, as Megatron-LM), none for Llama.

    >>> from plansim.workload import load_model
    >>> spec = load_model("gpt3-125m")
    >>> num_parameters(build_model(spec, device="meta")) == spec.num_parameters()
    True
    """
    block = family_of(spec).torch_model  # the family's entry (plansim.workload.families)
    if block is None:
        built = " and ".join(name for name, family in FAMILIES.items() if family.torch_model is not None)
        raise PlansimError(f"model {spec.name}: family {spec.family!r}: the validator builds {built} only")
    if remat not in REMAT_POLICIES:
        raise PlansimError(f"remat {remat!r}: the validator runs {', '.join(REMAT_POLICIES)}")
    gpt = block == "gpt"
    with torch.device(device or "cpu"):
        model = _Transformer(spec, remat, (0.1 if gpt else 0.0) if dropout is None else dropout, gpt=gpt)
    return model.to(dtype=dtype) if dtype is not None else model


def num_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor once (a tied head is not counted twice)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class _RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) * w, keeping x and one fp32 1/rms per token for backward, as fused RMSNorm kernels do (the
    builder's ``E sbh``); the unfused composition of pow, mean and rsqrt would keep fp32 copies of x."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (wide * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.to(rstd.dtype) * rstd
        g = grad.to(rstd.dtype) * weight.to(rstd.dtype)
        dx = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        dw = (grad.to(rstd.dtype) * normed).flatten(0, -2).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class _RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019): a scale, no shift."""

    def __init__(self, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _RMSNormFunction.apply(x, self.weight, self.eps)
        assert isinstance(y, torch.Tensor)
        return y


_SHARED: dict[tuple[Any, ...], torch.Tensor] = {}


def _shared(key: tuple[Any, ...], make: Any) -> torch.Tensor:
    """One tensor per key (causal masks, rotary tables), so that every block saves a reference to the same storage
    rather than a copy of its own, as a fused kernel would keep none."""
    if key not in _SHARED:
        _SHARED[key] = make()
    return _SHARED[key]


def _rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021; the rotate-half form of GPT-NeoX) over the last dimension of
    (batch, heads, seq, head_dim). Written as products with constant tables, so backward keeps no activation."""
    seq, dim = x.shape[-2], x.shape[-1]

    def table() -> torch.Tensor:
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
        angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv).repeat(1, 2)
        return torch.stack((angles.cos(), angles.sin())).to(x.dtype)

    cos, sin = _shared(("rope", seq, dim, x.device, x.dtype), table)
    half = dim // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, training: bool) -> torch.Tensor:
    """Causal softmax(QK^T / sqrt(d)) V, with dropout on the probabilities, over q (batch, heads, seq, head_dim) and
    k, v (batch, kv_heads, seq, head_dim). The heads sharing a key/value head are stacked along the rows, so K and V
    are read where they are, not copied per head (grouped-query attention, Ainslie et al. 2023)."""
    b, heads, seq, d = q.shape
    kv = k.shape[1]
    rows = heads // kv * seq
    q = (q * (1.0 / math.sqrt(d))).reshape(b, kv, rows, d)

    def causal() -> torch.Tensor:
        position = torch.arange(rows, device=q.device) % seq
        return torch.arange(seq, device=q.device)[None, :] > position[:, None]

    scores = (q @ k.transpose(-2, -1)).masked_fill(_shared(("mask", rows, seq, q.device), causal), float("-inf"))
    probs = F.dropout(scores.softmax(-1), dropout, training)
    return (probs @ v).reshape(b, heads, seq, d)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up keeping only gate and up for backward, as fused SwiGLU kernels do (Megatron-LM's
    ``bias_swiglu``): the builder's ``2E sbf``."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        silu = gate * sig
        return grad * up * sig * (1 + gate * (1 - sig)), grad * silu


class _Block(nn.Module):
    def __init__(self, spec: ModelSpec, remat: str, dropout: float, *, gpt: bool) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden
        self.gpt, self.remat, self.rotary, self.dropout = gpt, remat, not spec.learned_positions, dropout
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
        if self.rotary:  # Q and K become new tensors; V is copied out too, so the QKV output is not kept for V's sake
            q, k, v = _rotary(q), _rotary(k), v.contiguous()
        if self.remat == "selective" and self.training:
            a = checkpoint(_attention_core, q, k, v, self.dropout, self.training, use_reentrant=False)
        else:
            a = _attention_core(q, k, v, self.dropout, self.training)
        x = x + F.dropout(self.out(a.transpose(1, 2).reshape(b, s, h)), self.dropout, self.training)
        y = self.norm2(x)
        if self.gpt:
            y = self.fc2(F.gelu(self.fc1(y)))
        else:
            swiglu = _SwiGLU.apply(self.gate(y), self.up(y))
            assert isinstance(swiglu, torch.Tensor)
            y = self.down(swiglu)
        return x + F.dropout(y, self.dropout, self.training)


class _Transformer(nn.Module):
    def __init__(self, spec: ModelSpec, remat: str, dropout: float, *, gpt: bool) -> None:
        super().__init__()
        h = spec.hidden
        self.dropout = dropout
        self.embed = nn.Embedding(spec.vocab, h)
        self.positions = nn.Embedding(spec.seq_len, h) if spec.learned_positions else None
        self.blocks = nn.ModuleList(_Block(spec, remat, dropout, gpt=gpt) for _ in range(spec.layers))
        self.norm = nn.LayerNorm(h) if gpt else _RMSNorm(h)
        self.head = nn.Linear(h, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        x = F.dropout(x, self.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
