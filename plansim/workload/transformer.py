r"""GPT and Llama op graphs for one micro-batch on one tensor-parallel rank.

Tensor parallelism follows Megatron-LM (Shoeybi et al. 2019, sec 3): QKV and fc1 (Llama: gate/up) are
column-parallel, the attention output projection and fc2 (Llama: down) row-parallel, heads and the feed-forward
width are split ``t`` ways, and the embedding and output layer are vocab-parallel (``ceil(V / t)`` rows per rank,
the vocabulary padded to a multiple of ``t`` as Megatron-LM does). Without sequence parallelism, ``f`` (forward
identity, backward all-reduce) precedes each column-parallel GEMM and ``g`` (forward all-reduce) follows each
row-parallel one. With sequence parallelism (Korthikanti et al. 2022, sec 4.2.2) they become all-gather /
reduce-scatter and reduce-scatter / all-gather, and norms, dropouts and residual adds work on ``s / t`` tokens.

Saved activations (``saved_bytes``) follow Korthikanti et al. 2022, sec 4.1. Each saved tensor is charged to the
op whose backward reads it, except Q, K and V, charged to the op producing them (QKV projection; Llama: rotary for
Q and K) because they must outlive selective recompute. With ``E = act_bytes`` (2 in the paper), masks 1 byte, and
per rank ``d = t`` under sequence parallelism (else 1):

GPT block, ``a`` heads, ``f = 4h``::

    E*sbh*(4/d + 12/t) + 2*sbh/d + a*s^2*b*(2E + 1)/t
    # E = 2: sbh*(10 + 24/t + 5as/(ht)) without SP, sbh*(34/t + 5as/(ht)) with SP (Korthikanti, Table 2)

made of: LayerNorm inputs ``2E sbh/d``; QKV input ``E sbh/d`` and Q, K, V ``3E sbh/t``; softmax output
``E as^2b/t``; softmax-dropout mask ``as^2b/t``; dropout output ``E as^2b/t`` (kept by attention-over-V);
out-projection input ``E sbh/t``; fc1 input ``E sbh/d``; GELU input ``4E sbh/t``; fc2 input ``4E sbh/t``; two
dropout masks ``2 sbh/d``. Selective recompute drops the ``as^2b`` terms. With rotary positions instead of a learned
table (``learned_positions: false``, GPT-NeoX) the QKV projection keeps V and a rotary op keeps the rotated Q and K,
as in Llama: the same bytes.

Llama block, ``a`` heads, ``h_kv`` the key/value width on this rank (``kv_heads/t * head_dim``; one head when
``kv_heads < t``, replicated), ``q = h/t``, SwiGLU width ``f``, no dropout::

    E*sb*(4h/d + 2q + 2h_kv + 3f/t) + E*a*s^2*b/t

made of: two RMSNorm inputs ``2E sbh/d``; QKV input ``E sbh/d`` and V ``E sb h_kv``; rotated Q and K
``E sb(q + h_kv)``; softmax output ``E as^2b/t`` (also what attention-over-V reads: stored once); out-projection
input ``E sbq``; gate/up input ``E sbh/d``; SwiGLU inputs (gate and up) ``2E sbf/t``; down-projection input
``E sbf/t``. Selective recompute drops ``E as^2b/t``.

Embedding (layer -1): GPT keeps its dropout mask ``sbh/d`` (and adds learned positions, if it has them). Output
(layer ``layers``): final-norm input ``E sbh/d``, logits-GEMM input ``E sbh/d`` and fp32 softmax of the logits
``4 sbV/t`` (Korthikanti, sec 4.3).

FLOPs: GEMMs ``2mnk``, QK^T and attention-over-V ``2bs^2h/t`` each over every score, biases not counted, so for GPT
at ``t = 1`` the matmul FLOPs times 3 are Narayanan et al. 2021 (sec 5.1) ``72Bslh^2(1 + s/(6h) + V/(12lh))``
exactly. The attention core's ops carry ``causal`` (the decoder's mask): model FLOPs count the half of the scores
it keeps, as Megatron-LM's formula does today (``plansim.workload.graph.model_flops``).

The formulas above are ``attention: unfused`` (Megatron-LM's core attention of 2021-22, which Korthikanti et al.
measured). Under ``attention: flash`` (the default) one fused kernel replaces QK^T, softmax, dropout and attention
over V (FlashAttention-2, Dao 2023, Algorithm 1 and 2): it keeps Q, K, V and its output O (already counted: the QKV
projection or rotary op keeps Q, K, V; O is the out-projection's input) and the fp32 log-sum-exp of each row,
``4asb/t`` bytes; no ``s x s`` tensor and no dropout mask (the kernel regenerates the mask from the RNG state). So the
attention term ``as^2b(2E+1)/t`` (GPT) or ``Eas^2b/t`` (Llama) becomes ``4asb/t``, linear in ``s``. Its forward
FLOPs are the unfused pair's (``4bs^2h/t``), its backward's 2.5 times that (it recomputes QK^T and the softmax:
FlashAttention-2 sec 3.1.2 and 4.1); the kernel skips the blocks above the diagonal (causal), which its time prices
(``plansim.costs.kernels``). Its backward allocates fp32 accumulators for its length only (``workspace_bytes``, from
``mha_bwd`` in flash-attention's ``csrc/flash_attn/flash_api.cpp``): ``dq_accum`` (``b x s x heads x d``, fp32),
``softmax_d`` (``b x heads x s``, fp32), sequences rounded up to 128 rows and the head width to 32 (64 above 128), and
with grouped-query attention ``dk_expanded`` and ``dv_expanded`` at the query heads' width in the activation dtype.

Per-op remat (``remat: op_sac``, torchtitan's ``op`` selective checkpointing; pytorch/torchtitan v0.2.2): each op
says what of its output the policy keeps and what share of its forward the recompute reruns (``sac_kept``,
``sac_rerun``: ``plansim.workload.graph.op_saved``). The policy keeps the outputs of the ops in the model's save list
(torchtitan/models/llama3/infra/parallelize.py:36-51: ``aten.mm``, the fused attention kernels, the functional
``reduce_scatter_tensor``, ``max``) but every second ``mm`` of a block's forward, counted from 1
(torchtitan/distributed/activation_checkpoint.py:108-122), and reruns everything else. torchtitan's Llama block runs
seven mms, wq, wk, wv, wo, w1, w3, w2 (torchtitan/models/llama3/model/model.py:251, 304, 343), so wq, wv, w1 and w2
are kept and wk, wo and w3 rerun: the fused QKV op keeps Q and V, ``E sb(q + h_kv)``, and reruns K's share of its
FLOPs, ``h_kv / (q + 2 h_kv)``; gate/up keeps the gate, ``E sbf/t``, and reruns half; down keeps its output before the
reduction, ``E sbh``; the fused attention kernel keeps O and its log-sum-exp, ``E sbq + 4asb/t``; a reduce-scatter
(sequence parallelism) keeps its shard, ``E sbh/t``. Norms, rotary, SwiGLU, residual adds, all-gathers and
all-reduces rerun, and so do unfused attention's ``bmm`` and softmax. A GPT block's GEMMs have biases, which PyTorch
runs as ``addmm``, not in the list: they rerun, and only its fused attention and reduce-scatters are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from plansim.errors import PlansimError
from plansim.workload.graph import IN, PREV, Attrs, Node, Sharding, collective, gemm, op, op_saved, pointwise, stamp
from plansim.workload.shape import ModelShape

__all__ = [
    "Dims",
    "add_transformer",
    "dims",
    "flash_attention",
    "head_nodes",
    "heads_swap_problems",
    "llama_attention",
    "llama_block",
    "llama_mlp",
    "norm",
    "residual_add",
    "sequence_split_problems",
    "stamp_model",
    "tp_enter",
    "tp_exit",
    "transformer_parameters",
]


# Forward FLOPs per output element of the memory-bound ops (they matter little next to the GEMMs).
LAYERNORM_FLOPS = 7  # mean, centre, square, variance sum, scale by rsqrt, gain, shift
RMSNORM_FLOPS = 4  # square, sum, scale by rsqrt, gain
SOFTMAX_FLOPS = 5  # max, subtract, exp, sum, divide (scale and causal mask fused in)
DROPOUT_FLOPS = 2  # compare a random draw, multiply by mask / keep-probability
GELU_FLOPS = 8  # tanh approximation
SWIGLU_FLOPS = 5  # sigmoid (negate, exp, add, divide), times x, times up
ROPE_FLOPS = 3  # x*cos + rotate(x)*sin
LOSS_FLOPS = 5  # max, subtract, exp, sum, log/select per logit
ADD_FLOPS = 1


@dataclass(frozen=True)
class Dims:
    """Per-rank sizes: micro-batch ``b``, sequence ``s``, width ``h``, ``t``-way tensor parallel, ``E`` bytes."""

    b: int
    s: int
    h: int
    t: int
    E: int
    sp: bool
    heads_l: int  # attention heads on this rank
    head_dim: int
    kv_heads_l: int  # key/value heads on this rank
    f_l: int  # feed-forward width on this rank
    v_l: int  # vocabulary rows on this rank
    t_axis: str  # the mesh axis whose groups split t ways: the group of the tensor-parallel collectives
    flash: bool = True  # attention as one fused kernel (FlashAttention-2), else unfused
    c: int = 1  # context-parallel degree: the sequence split c ways
    c_axis: str = "cp"  # the mesh axis of the context-parallel group
    c_ring: bool = True  # context parallelism's attention by ring exchange of K/V (else all-to-all over heads)
    fp8: bool = False  # the block's linear layers run in FP8 (``Sharding.fp8_linears``)
    v_dim: int = 0  # a value head's width where it differs from ``head_dim`` (latent attention); 0: ``head_dim``

    @property
    def Ein(self) -> int:
        """Bytes per element of a block linear layer's input kept for its backward: 1 under FP8, where Transformer
        Engine saves the quantized input (module/linear.py:602-617 at NVIDIA/TransformerEngine d0067d0d: the FP8
        input, its row-wise data dropped unless the backward re-gathers it; layernorm_linear.py keeps its FP8
        ``ln_out`` alike), else ``E``."""
        return 1 if self.fp8 else self.E

    @property
    def proj_saved(self) -> int:
        """Bytes the attention output projection keeps of its input (the attention's output O): ``Ein`` per
        element, and under FP8 with the fused kernel also O in bf16, which the kernel's backward reads (the bf16
        graph counts O once, here; FP8 adds the projection's quantized copy beside it)."""
        extra = self.E if self.fp8 and self.flash else 0
        return (self.Ein + extra) * self.rows * self.o_l

    def linear(self, m: int, n: int, k: int, *, bias: int = 0, saved: int = 0, after_norm: bool = False) -> Attrs:
        """A block linear layer's GEMM ``[m, k] @ [k, n]`` (``gemm``), marked under FP8 with ``fp8``: its shape,
        whether a norm feeds it (``after_norm``: Transformer Engine's LayerNormLinear, whose norm writes the FP8
        input itself; the column-parallel layers after ``tp_enter``) and from how many ranks its input is gathered
        (``t`` under sequence parallelism for those, else 1), which ``plansim.costs.kernels`` prices at the fp8 rate
        with its casts (``FP8Casts``)."""
        attrs = gemm(m, n, k, self.E, bias=bias, saved=saved)
        if self.fp8:
            attrs["fp8"] = (m, n, k, after_norm, self.t if after_norm and self.sp else 1)
        return attrs

    @property
    def rows(self) -> int:
        """Tokens of the micro-batch on this rank, ``b * s / c`` (context parallelism splits the sequence)."""
        return self.b * self.s // self.c

    @property
    def rows_l(self) -> int:
        """Tokens of the residual stream on this rank (``rows / t`` under sequence parallelism)."""
        return self.rows // self.t if self.sp else self.rows

    @property
    def x(self) -> int:
        """Elements of the residual stream on this rank."""
        return self.rows_l * self.h

    @property
    def q_l(self) -> int:
        """Query (and attention output) width on this rank."""
        return self.heads_l * self.head_dim

    @property
    def kv_l(self) -> int:
        """Key (and value) width on this rank."""
        return self.kv_heads_l * self.head_dim

    @property
    def vd(self) -> int:
        """Width of one value head (``head_dim`` but under latent attention, whose value heads are narrower)."""
        return self.v_dim or self.head_dim

    @property
    def val_l(self) -> int:
        """Value width on this rank."""
        return self.kv_heads_l * self.vd

    @property
    def o_l(self) -> int:
        """Attention output width on this rank (the output projection's input)."""
        return self.heads_l * self.vd


def _divisors(n: int) -> str:
    return ", ".join(str(k) for k in range(1, min(n, 128) + 1) if n % k == 0)


def _kv_heads_per_rank(spec: ModelShape, t: int) -> int:
    if spec.kv_heads % t == 0:
        return spec.kv_heads // t
    if t % spec.kv_heads == 0:  # fewer kv heads than ranks: each rank holds one, replicated (Megatron-LM)
        return 1
    raise PlansimError(f"tp={t} and kv_heads={spec.kv_heads} of {spec.name}: one must divide the other")


def dims(spec: ModelShape, sh: Sharding, *, shard_tokens: bool = False) -> Dims:
    """Per-rank sizes of ``spec`` under ``sh``; PlansimError when ``tp`` does not split the model evenly.

    Sequence parallelism splits the sequence (``seq_len % tp == 0``), or, with ``shard_tokens``, all tokens of
    the micro-batch (``micro_batch * seq_len % tp == 0``, for MLPs).
    """
    t, name = sh.tp, spec.name
    if spec.heads and spec.heads % t:
        raise PlansimError(
            f"tp={t} does not divide heads={spec.heads} of {name}: choose tp from {_divisors(spec.heads)}"
        )
    if spec.ffn_hidden % t:
        raise PlansimError(f"tp={t} does not divide ffn_hidden={spec.ffn_hidden} of {name}: choose another tp")
    c = sh.cp
    if c > 1:
        _check_context_parallel(spec, sh)
    tokens = sh.micro_batch * spec.seq_len if shard_tokens else spec.seq_len // c
    if sh.sequence_parallel and tokens % t:
        what = "micro_batch*seq_len" if shard_tokens else ("seq_len" if c == 1 else f"seq_len/cp={tokens}")
        raise PlansimError(f"sequence_parallel: tp={t} does not divide {what}={tokens} of {name}: choose another tp")
    return Dims(
        b=sh.micro_batch,
        s=spec.seq_len,
        h=spec.hidden,
        t=t,
        E=sh.act_bytes,
        sp=sh.sequence_parallel and t > 1,
        heads_l=spec.heads // t,
        head_dim=spec.head_dim,
        kv_heads_l=_kv_heads_per_rank(spec, t) if spec.heads else 0,
        f_l=spec.ffn_hidden // t,
        v_l=-(-spec.vocab // t),
        t_axis=sh.tp_axis,
        flash=sh.attention == "flash",
        c=c,
        c_axis=sh.cp_axis,
        c_ring=sh.cp_algorithm == "ring",
        fp8=sh.fp8_linears,
        v_dim=spec.v_head_dim if spec.v_head_dim != spec.head_dim else 0,
    )


def sequence_split_problems(spec: ModelShape, cp: int) -> list[str]:
    """What ``cp`` context-parallel ranks need of the sequence: ``2 cp`` equal chunks, two per rank for the causal
    load balance (megatron/training/arguments.py:1336-1338 at d98e8a64). The family's ``cp`` rule, and the
    builder's check."""
    if cp > 1 and spec.seq_len % (2 * cp):
        return [
            f"cp={cp} needs seq_len={spec.seq_len} of {spec.name} to split into 2*cp={2 * cp} equal chunks: choose cp "
            "so that 2*cp divides seq_len"
        ]
    return []


def heads_swap_problems(spec: ModelShape, ranks: int) -> list[str]:
    """What context parallelism by all-to-all needs of the model: query and key/value heads that split over its
    ``ranks`` (tp x cp; Transformer Engine's ``AttnFuncWithCPAndQKVOA2A``, context_parallel.py:4246-4248 at
    NVIDIA/TransformerEngine d0067d0d). The checks', the planner's and the builder's one rule."""
    if spec.heads % ranks or spec.kv_heads % ranks:
        return [
            f"cp_algorithm=all_to_all splits the heads over tp*cp={ranks} ranks, which does not divide "
            f"heads={spec.heads} and kv_heads={spec.kv_heads} of {spec.name}: use cp_algorithm=ring or a smaller cp"
        ]
    return []


def _check_context_parallel(spec: ModelShape, sh: Sharding) -> None:
    """What context parallelism needs of the model's sequence (``sequence_split_problems``) and of attention: a fused
    kernel (Transformer Engine's dot_product_attention/utils.py:1169-1173 at d0067d0d). The all-to-all's heads are
    the strategy checks' (``heads_swap_problems``, asked with the mesh's tp x cp): the graph is defined without
    them."""
    problems = sequence_split_problems(spec, sh.cp)
    if sh.attention != "flash":
        problems.append(f"cp={sh.cp} runs on fused attention only: use attention=flash")
    if problems:
        raise PlansimError(problems[0])


def tp_enter(d: Dims, name: str, *, linear: bool = False) -> list[Node]:
    """The collective before a column-parallel GEMM: Megatron ``f`` (none / all-reduce), or with sequence
    parallelism ``g`` (all-gather / reduce-scatter). Empty when ``t = 1``. Before a block's linear layer
    (``linear``) under FP8 with sequence parallelism the all-gather moves the FP8 input, 1 B an element
    (``fp8_comm_bytes``, its forward and its backward's re-gather): Transformer Engine quantizes the local norm
    output and gathers it with the quantizer (module/layernorm_linear.py:294-313 at NVIDIA/TransformerEngine
    d0067d0d, ``gather_along_first_dim(ln_out, tp_group, quantizer=...)``); the reduce-scatter of the input gradient
    stays bf16."""
    if d.t == 1:
        return []
    fwd, bwd = ("all_gather", "reduce_scatter") if d.sp else ("none", "all_reduce")
    attrs = collective(fwd, bwd, d.E * d.rows * d.h, d.t_axis)
    if d.sp and d.fp8 and linear:
        attrs["fp8_comm_bytes"] = d.rows * d.h
    return [Node(name, attrs)]


def tp_exit(d: Dims, name: str) -> list[Node]:
    """The collective after a row-parallel GEMM: Megatron ``g`` (all-reduce / none), or with sequence
    parallelism ``g-bar`` (reduce-scatter / all-gather). Empty when ``t = 1``."""
    if d.t == 1:
        return []
    fwd, bwd = ("reduce_scatter", "all_gather") if d.sp else ("all_reduce", "none")
    attrs = collective(fwd, bwd, d.E * d.rows * d.h, d.t_axis)
    if d.sp:  # torchtitan's per-op policy keeps a reduce-scatter's output (its shard), and reruns an all-reduce
        attrs = op_saved(attrs, kept=d.E * d.x)
    return [Node(name, attrs)]


def residual_add(d: Dims) -> Attrs:
    """The residual add: reads two residual-stream tensors, saves nothing."""
    return pointwise("elementwise", d.x, ADD_FLOPS, d.E, reads=2)


def norm(d: Dims, *, rms: bool) -> Attrs:
    """An RMSNorm (``rms``) or LayerNorm over the residual stream on this rank, keeping its input."""
    return _norm(d, rms=rms)


def _norm(d: Dims, *, rms: bool) -> Attrs:
    params = d.h if rms else 2 * d.h  # RMSNorm gain; LayerNorm gain and shift (replicated across ranks)
    flops = RMSNORM_FLOPS if rms else LAYERNORM_FLOPS
    return pointwise("norm", d.x, flops, d.E, extra_bytes=d.E * params, saved=d.E * d.x, params=params)


def _dropout(d: Dims, elements: int, *, selective: bool = False) -> Attrs:
    """Dropout writing and keeping a 1-byte mask."""
    return pointwise("dropout", elements, DROPOUT_FLOPS, d.E, extra_bytes=elements, saved=elements, selective=selective)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def flash_attention(d: Dims, *, qk_input: str, v_input: str = "qkv") -> Node:
    """The fused attention kernel over the rotated Q and K of ``qk_input`` and the V of ``v_input``
    (``_flash_attention``)."""
    return _flash_attention(d, qk_input=qk_input, v_input=v_input)


def _flash_attention(d: Dims, *, qk_input: str, v_input: str = "qkv") -> Node:
    """The fused attention kernel (FlashAttention-2, Dao 2023): QK^T, causal softmax, (dropout) and attention over V
    in one kernel that keeps the fp32 log-sum-exp per row for backward (see the module docstring).

    Under context parallelism (``c`` ranks) a rank computes ``1/c`` of the scores, evenly under the causal mask: by
    the ring its ``s/c`` queries (two chunks, the ``i``-th and ``(2c-1-i)``-th, so every rank meets as many scores
    below the diagonal) against every key, in ``c`` steps of one key/value block each; by the all-to-all every query
    of its ``1/c`` of the heads (Transformer Engine's ``AttnFuncWithCPAndKVP2P`` and ``AttnFuncWithCPAndQKVOA2A``,
    context_parallel.py at NVIDIA/TransformerEngine d0067d0d). The ring's op carries ``cp_ring`` (its steps), the
    group's axis and ``comm_bytes``, the whole sequence's K and V on this rank's heads (what the ring passes, an
    all-gather's worth; the backward passes K and V and their gradients, twice that); in forward the rank holds
    every block it received until the last step (``p2p_comm_buffers``), in backward two buffers of K, V and their
    gradients."""
    scores = d.b * d.heads_l * d.s * d.s // d.c  # this rank's share of the scores
    qk_flops = 2 * scores * d.head_dim  # QK^T, counted over every score
    av_flops = 2 * scores * d.vd  # attention over V (as wide as QK^T but under latent attention)
    q, kv, rows = d.rows * d.q_l, d.rows * d.kv_l, d.b * d.heads_l * d.s // d.c
    v, o = d.rows * d.val_l, d.rows * d.o_l
    lse = 4 * rows  # fp32 log-sum-exp per row and head (FlashAttention-2 Algorithm 1, line 13)
    # mha_bwd's fp32 workspace: dq_accum (b, s_rounded, heads, d_rounded) and softmax_d (b, heads, s_rounded); with
    # fewer key/value heads than query heads, dk and dv at the query heads' width (summed down afterwards)
    s_r = _round_up(d.s // d.c, 128)
    d_r = _round_up(d.head_dim, 32 if d.head_dim <= 128 else 64)
    workspace = 4 * d.b * d.heads_l * s_r * (d_r + 1)
    if d.kv_heads_l != d.heads_l:
        workspace += 2 * d.E * q
    ring = d.c > 1 and d.c_ring
    if ring:
        workspace += 2 * 2 * d.E * (kv + v)  # two receive buffers of [K V, dK dV]
    attrs = op(
        "attention",
        flops=qk_flops + av_flops,
        bwd_flops=5 * (qk_flops + av_flops) // 2,  # five matmuls to the forward's two (FlashAttention-2 sec 3.1.2)
        nbytes=d.E * (q + kv + v + o) + lse,  # reads Q, K, V; writes O and the log-sum-exp
        saved=lse,
        selective=True,
        workspace=workspace,
    )
    attrs["causal"] = True  # the decoder's causal mask: the kernel skips the blocks above the diagonal
    if ring:
        attrs.update(
            cp_ring=d.c, group=d.c_axis, comm_bytes=d.c * d.E * (kv + v), transient_bytes=(d.c - 1) * d.E * (kv + v)
        )
    # torchtitan's per-op policy keeps a fused attention kernel's outputs: O and the log-sum-exp
    return Node("attn", op_saved(attrs, kept=d.E * o + lse), (qk_input, v_input))


def _heads_swap(d: Dims, name: str, width: int) -> list[Node]:
    """Context parallelism by all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023, sec 3; Transformer Engine's
    ``a2a``): a tensor of ``width`` columns on this rank's ``s/c`` tokens swapped for all tokens of ``1/c`` of its
    heads (or back), the same all-to-all in backward for its gradient; ``comm_bytes`` is each rank's whole buffer.
    Empty without it."""
    if d.c == 1 or d.c_ring:
        return []
    return [Node(name, collective("all_to_all", "all_to_all", d.E * d.rows * width, d.c_axis))]


def _attention(d: Dims, *, dropout: bool, qk_input: str) -> list[Node]:
    """The attention core between the QKV projection (and rotary) and the output projection, with context
    parallelism's all-to-alls around it where it runs by them."""
    core = _attention_core(d, dropout=dropout, qk_input=qk_input)
    swaps = _heads_swap(d, "cp_qkv", d.q_l + 2 * d.kv_l)
    if not swaps:
        return core
    first = core[0]
    core[0] = Node(first.name, first.attrs, tuple(PREV if i == qk_input else i for i in first.inputs))
    return [*swaps, *core, *_heads_swap(d, "cp_out", d.o_l)]


def _attention_core(d: Dims, *, dropout: bool, qk_input: str) -> list[Node]:
    """QK^T, softmax, (dropout), attention over V: the ops selective recompute drops (Korthikanti 2022, sec 5); or,
    under flash attention, the one fused kernel that runs them."""
    if d.flash:
        return [_flash_attention(d, qk_input=qk_input)]
    scores = d.b * d.heads_l * d.s * d.s
    flops = 2 * scores * d.head_dim  # 2 b s^2 h / t per batched GEMM
    q, kv, v, o = d.rows * d.q_l, d.rows * d.kv_l, d.rows * d.val_l, d.rows * d.o_l
    qk = op("bmm", flops=flops, nbytes=d.E * (q + kv + scores), selective=True)
    nodes = [
        Node("qk", {**qk, "causal": True}, (qk_input,)),
        Node("softmax", pointwise("softmax", scores, SOFTMAX_FLOPS, d.E, saved=d.E * scores, selective=True)),
    ]
    if dropout:
        nodes.append(Node("attn_drop", _dropout(d, scores, selective=True)))
    probs = d.E * scores if dropout else 0  # without dropout AV reads the softmax output, already saved
    av = op("bmm", flops=2 * scores * d.vd, nbytes=d.E * (scores + v + o), saved=probs, selective=True)
    return [*nodes, Node("av", {**av, "causal": True}, (PREV, "qkv"))]


def _rope(d: Dims) -> Node:
    """Rotary position embedding (Su et al. 2021) of Q and K, keeping the rotated Q and K for backward."""
    rotated = d.rows * (d.q_l + d.kv_l)
    return Node("rope", pointwise("elementwise", rotated, ROPE_FLOPS, d.E, saved=d.E * rotated))


def gpt_block(d: Dims, *, rotary: bool = False) -> list[Node]:
    """One GPT block (pre-LayerNorm, GELU MLP, dropout after attention-out and fc2), biases on every GEMM.

    With ``rotary`` (GPT-NeoX, Black et al. 2022 sec 2.1) Q and K are rotated after the QKV projection, which then
    keeps only V (the rotary op keeps Q and K). GPT-NeoX rotates a quarter of each head (``rotary_pct``); the op is
    priced on whole heads, a pointwise cost that is small next to the GEMMs.
    """
    E, x, mlp = d.E, d.x, d.rows * d.f_l
    qkv = d.q_l + 2 * d.kv_l
    kept = d.rows * (d.kv_l if rotary else qkv)  # Q, K, V, or only V when the rotary op keeps Q and K
    return [
        Node("ln1", _norm(d, rms=False)),
        *tp_enter(d, "attn_in", linear=True),
        Node("qkv", d.linear(d.rows, qkv, d.h, bias=qkv, saved=d.Ein * x + E * kept, after_norm=True)),
        *([_rope(d)] if rotary else []),
        *_attention(d, dropout=True, qk_input="rope" if rotary else "qkv"),
        Node("proj", d.linear(d.rows, d.h, d.o_l, bias=d.h, saved=d.proj_saved)),
        *tp_exit(d, "attn_out"),
        Node("proj_drop", _dropout(d, x)),
        Node("res1", residual_add(d), (PREV, IN)),
        Node("ln2", _norm(d, rms=False)),
        *tp_enter(d, "mlp_in", linear=True),
        Node("fc1", d.linear(d.rows, d.f_l, d.h, bias=d.f_l, saved=d.Ein * x, after_norm=True)),
        Node("gelu", pointwise("elementwise", mlp, GELU_FLOPS, E, saved=E * mlp)),
        Node("fc2", d.linear(d.rows, d.h, d.f_l, bias=d.h, saved=d.Ein * mlp)),
        *tp_exit(d, "mlp_out"),
        Node("mlp_drop", _dropout(d, x)),
        Node("res2", residual_add(d), (PREV, "res1")),
    ]


def llama_block(d: Dims) -> list[Node]:
    """One Llama block (pre-RMSNorm, rotary, grouped-query attention, SwiGLU MLP), no biases, no dropout."""
    return [*llama_attention(d), *llama_mlp(d)]


def llama_attention(d: Dims) -> list[Node]:
    """A Llama block's first half: RMSNorm, QKV, rotary, attention, the output projection and the residual add."""
    E, x = d.E, d.x
    qkv = d.q_l + 2 * d.kv_l
    return [
        Node("norm1", _norm(d, rms=True)),
        *tp_enter(d, "attn_in", linear=True),
        # torchtitan's wq, wk, wv: the block's mm 1-3, of which its per-op policy keeps 1 and 3 (docstring)
        Node(
            "qkv",
            op_saved(
                d.linear(d.rows, qkv, d.h, saved=d.Ein * x + E * d.rows * d.kv_l, after_norm=True),
                kept=E * d.rows * (d.q_l + d.kv_l),
                rerun=d.kv_l / qkv,
            ),
        ),
        _rope(d),
        *_attention(d, dropout=False, qk_input="rope"),
        Node("proj", d.linear(d.rows, d.h, d.o_l, saved=d.proj_saved)),
        *tp_exit(d, "attn_out"),
        Node("res1", residual_add(d), (PREV, IN)),
    ]


def llama_mlp(d: Dims, *, width: int | None = None, prefix: str = "", last: bool = True) -> list[Node]:
    """A Llama block's second half: RMSNorm, the SwiGLU MLP of ``width`` columns on this rank (``f_l`` by default)
    between its tensor-parallel collectives, and the residual add. With ``last`` False only the MLP's ops, from the
    collective before its gate/up GEMM to the one after its down GEMM, named with ``prefix`` (a MoE block's shared
    experts)."""
    E, f_l = d.E, d.f_l if width is None else width
    mlp = d.rows * f_l
    ops = [
        *tp_enter(d, prefix + "mlp_in", linear=True),
        # w1 and w3, mm 5 (kept) and 6 (rerun); w2, mm 7 (kept); wo, mm 4, reruns
        Node(
            prefix + "gate_up",
            op_saved(d.linear(d.rows, 2 * f_l, d.h, saved=d.Ein * d.x, after_norm=True), kept=E * mlp, rerun=0.5),
        ),
        Node(prefix + "swiglu", pointwise("elementwise", mlp, SWIGLU_FLOPS, E, reads=2, saved=2 * E * mlp)),
        Node(prefix + "down", op_saved(d.linear(d.rows, d.h, f_l, saved=d.Ein * mlp), kept=E * d.rows * d.h)),
        *tp_exit(d, prefix + "mlp_out"),
    ]
    if not last:
        return ops
    return [Node("norm2", _norm(d, rms=True)), *ops, Node("res2", residual_add(d), (PREV, "res1"))]


def _embedding(d: Dims, *, gpt: bool, positions: bool) -> list[Node]:
    """Vocab-parallel word embedding; GPT adds learned positions (replicated; if ``positions``) and dropout."""
    full = d.rows * d.h
    lookup = op("embedding", nbytes=2 * d.E * full, params=d.v_l * d.h, bwd_flops=full)
    nodes = [Node("embed", lookup), *tp_exit(d, "embed_out")]
    if positions:
        table = pointwise("elementwise", d.x, ADD_FLOPS, d.E, reads=2, params=d.s * d.h)
        nodes.append(Node("pos", table))
    if gpt:
        nodes.append(Node("drop", _dropout(d, d.x)))
    return nodes


def head_nodes(d: Dims, norm: Attrs | None, *, tied: bool, bias: bool) -> list[Node]:
    """Final norm (optional), vocab-parallel logits GEMM and cross-entropy over ``ceil(V/t)`` classes per rank.

    Under tensor parallelism the cross-entropy all-reduces three fp32 values per token (max, sum of
    exponentials, target logit), as one collective of ``12 * b * s`` bytes.
    """
    E, logits = d.E, d.rows * d.v_l
    nodes = [Node("norm", norm)] if norm is not None else []
    weights = 0 if tied else None  # a tied head's weight is counted once, at the embedding
    nodes += tp_enter(d, "logits_in")
    nodes.append(Node("logits", gemm(d.rows, d.v_l, d.h, E, bias=d.v_l if bias else 0, saved=E * d.x, params=weights)))
    if d.t > 1:
        nodes.append(Node("loss_stats", collective("all_reduce", "none", 3 * 4 * d.rows, d.t_axis)))
    # The loss keeps the fp32 softmax (Korthikanti et al. 2022 sec 4.3, 4sbV) until backward. The logits GEMM's output
    # (E bytes per logit) lives beside it while the loss runs, and the logits' gradient (as large) beside it at the
    # start of backward: a transient of the last stage, at its peak when every activation is live, never at the same
    # time as a remat working set (``transient_bytes``; both engines read it through ``LayerProgram.transient``).
    loss = op("loss", flops=LOSS_FLOPS * logits, nbytes=(E + 4) * logits, saved=4 * logits)
    loss["transient_bytes"] = E * logits
    return [*nodes, Node("loss", loss)]


def add_transformer(graph: nx.DiGraph, spec: ModelShape, sh: Sharding, *, gpt: bool) -> int:
    """Add a GPT (``gpt``: LayerNorm, GELU, biases) or Llama model's ops to ``graph``; return the bytes of one
    block's input on this rank."""
    d = dims(spec, sh)
    block = gpt_block(d, rotary=not spec.learned_positions) if gpt else llama_block(d)
    return stamp_model(graph, spec, d, [block] * spec.layers, gpt=gpt)


def stamp_model(graph: nx.DiGraph, spec: ModelShape, d: Dims, blocks: list[list[Node]], *, gpt: bool) -> int:
    """Stamp the embedding, ``blocks`` (one block template per layer; layers sharing a template share its list) and
    the output head into ``graph``; return the bytes of one block's input on this rank."""
    last = stamp(graph, _embedding(d, gpt=gpt, positions=spec.learned_positions), -1, "in.", None)
    for layer, block in enumerate(blocks):
        last = stamp(graph, block, layer, f"L{layer}.", last)
    head = head_nodes(d, _norm(d, rms=not gpt), tied=spec.tied_embeddings, bias=False)
    stamp(graph, head, spec.layers, "out.", last)
    return d.E * d.x


def transformer_parameters(spec: ModelShape, *, gpt: bool) -> int:
    """Total trainable parameters of a GPT (``gpt``) or Llama model, embeddings and any untied output head included.

    GPT: ``l(12h^2 + 13h) + (V + s)h + 2h`` with ``ffn_hidden = 4h`` and a tied output head (Narayanan et al. 2021,
    sec 5.1, plus biases and LayerNorms; ``sh`` is the learned position table, absent with rotary positions). Llama:
    ``l(2h^2 + 2h h_kv + 3hf + 2h) + 2Vh + h``.
    """
    h, f, v = spec.hidden, spec.ffn_hidden, spec.vocab
    q = spec.heads * spec.head_dim  # h unless the model sets head_dim
    qkv = q + 2 * spec.kv_heads * spec.head_dim
    attention = h * qkv + q * h + ((qkv + h) if gpt else 0)  # QKV and out-proj weights (+ biases for GPT)
    mlp = (2 * h * f + f + h) if gpt else 3 * h * f  # fc1, fc2 (+ biases) or SwiGLU gate, up, down
    norms = 4 * h if gpt else 2 * h  # LayerNorm scale+shift, or RMSNorm scale, twice per block
    final_norm = 2 * h if gpt else h
    embeddings = v * h + (spec.seq_len * h if spec.learned_positions else 0)  # word (+ learned positions)
    output = 0 if spec.tied_embeddings else v * h
    return spec.layers * (attention + mlp + norms) + final_norm + embeddings + output
