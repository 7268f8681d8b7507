r"""Mixture-of-Experts op graphs (family ``moe``) for one micro-batch on one rank, and their parameter counts.

A ``moe`` model is a Llama-style decoder (RMSNorm, rotary, SwiGLU, untied; ``plansim.workload.transformer``) whose
blocks past the first ``dense_layers`` replace the dense MLP with a mixture of experts (Shazeer et al. 2017; GShard,
Lepikhin et al. 2021; Mixtral, Jiang et al. 2024; DeepSeek-V3, 2024): a router GEMM (``h x E``) and its softmax and
top-k pick ``k`` of the ``E`` routed experts per token, the tokens are permuted into expert order, each expert runs a
SwiGLU MLP of ``expert_ffn_hidden`` columns over its rows, and the outputs are un-permuted and summed with the
router's weights; the shared experts (``shared_ffn_hidden``) are one more SwiGLU MLP every token runs.

One rank holds ``E / ep`` experts (``Sharding.ep``), each split ``etp`` ways in its FFN width (``Sharding.etp``).
With ``T`` tokens of the micro-batch on the rank before the layer (``b s / cp``, over ``tp`` under sequence
parallelism), balanced routing and ``k`` experts a token, the rank's experts run

    ``R = etp * S`` rows, ``S = T k`` (dropless) or ``E * ceil(c T k / E)`` (capacity factor ``c``, padded),

``R / (E / ep)`` rows each. Megatron-LM's token dispatchers (NVIDIA/Megatron-LM d98e8a64,
megatron/core/transformer/moe/token_dispatcher.py) issue around them:

* ``ep = 1`` (``MoEAllGatherTokenDispatcher``, lines 281-302 and 355-368): the tokens all-gathered over the expert
  tensor-parallel group before the permutation and, after the un-permutation, reduce-scattered back (backward: the
  reverse) -- with ``etp = tp`` and sequence parallelism the collectives of a dense MLP;
* ``ep > 1`` (``MoEAlltoAllTokenDispatcher``): the local permutation, the dispatch all-to-all over the ``ep`` group
  (lines 705-711) of each rank's whole send buffer, ``S x hidden`` elements (``comm_bytes``; what crosses ranks is
  ``(ep-1)/ep`` of it, which the collective registry's all-to-all prices), an all-gather over ``etp`` (746-751), the
  sort into local-expert order (``sort_chunks_by_idxs``, where the rank holds more than one expert), and after the
  experts the reverse: unsort, reduce-scatter over ``etp`` (829-833), the combine all-to-all (864-870) and the
  un-permutation.

Routing imbalance (``moe_imbalance`` ``x >= 1``, the model's: the routed rows the busiest expert-parallel rank
receives over the mean ``S``). Each rank sends its own ``S`` rows, but the experts they go to are uneven, and every
rank waits at the combine all-to-all (and at the next layer's dispatch) for the busiest; so the step runs at the
busiest rank's pace, and the op graph is that rank's: it receives ``ceil(x S)`` rows, which its dispatch and combine
all-to-alls carry (priced as a buffer of that size: the busiest rank's receive -- its send in the combine -- is the
transfer the others wait for; a uniform buffer overstates what the other ranks put on shared links), its ``etp``
gather and reduce-scatter, its sort and unsort, its expert GEMMs (``R = etp ceil(x S)``) and the activations they
save (GShard, Lepikhin et al. 2021 sec 2.2: the busiest expert sets the step's time and memory unless a capacity
caps it; DeepSeek-V3 technical report, 2024, sec 2.1.2: load imbalance across expert-parallel devices lowers
computational efficiency). The permutation before the dispatch and the un-permutation after the combine run over the
rank's own tokens and stay at ``S``. Megatron-LM's dropless dispatcher sizes each rank's buffers from the counts
actually routed to it (``MoEAlltoAllTokenDispatcher.preprocess``: ``output_splits``, the tokens the rank receives,
token_dispatcher.py:584-590 at d98e8a64, used as the all-to-all's receive sizes at 705-711), so the dropless busiest
rank runs all ``x S`` rows. A capacity factor ``c``
pads every expert's buffer to ``c`` times its share and drops the tokens beyond it: the busiest rank's rows stay
``S`` (capacity), and ``dropped = 1 - c/x`` of its tokens are lost when ``x > c``. One of ``ep`` ranks receives at
most every routed row, so ``x`` is capped at ``ep``: at ``ep = 1`` the rank runs every expert and the imbalance
moves work between its own experts only (their grouped GEMM's per-expert sizes, not modelled), changing nothing.

Megatron-LM refuses MoE with tensor parallelism but without sequence parallelism in training
(megatron/core/transformer/moe/moe_layer.py:636-640), and so does the builder. The shared experts are a dense MLP
split over ``tp`` with their own gather and reduce-scatter (megatron/core/transformer/moe/shared_experts.py:574-575).

Routed-expert ops carry ``expert=True`` (their weights are sharded over ``ep`` and their gradients reduced over the
expert-data-parallel group) and ``grouped`` = the rank's experts, so the kernel model prices each expert's GEMM at its
own size (``plansim.costs.kernels``). One expert with top-1 and no capacity factor routes every token to it in order:
no permutation is run, and the block is the dense Llama block plus its router (a ``h x 1`` GEMM and its softmax).

Saved activations (Korthikanti et al. 2022's accounting, as ``transformer``): the router keeps its input ``E T h``
and its fp32 scores' softmax ``E T E_r`` at the activation width; the experts' gate/up GEMM its permuted input
``E R h`` (the dense one's ``Ein x`` under identity routing), SwiGLU its two inputs ``2 E R f_e``, down its input
``E R f_e``; the un-permutation the expert outputs it weights, ``E S h`` (the router's weights' gradient reads them).
The permutation keeps only its index map, counted as nothing. Under ``dtype: fp8`` the grouped expert GEMMs run in
the activation dtype (not marked ``fp8``): an approximation that overprices them; a single local expert's are FP8.

Multi-head latent attention (DeepSeek-V2 sec 2.1; DeepSeek-V3, ``kv_lora_rank > 0``): a query down-projection
``h -> q_lora_rank``, its RMSNorm and up-projection to ``heads x head_dim`` (or one ``h -> heads x head_dim``
projection without ``q_lora_rank``); a key/value down-projection ``h -> kv_lora_rank + rope_head_dim``, its RMSNorm
over the latent and up-projection to ``heads x (head_dim - rope_head_dim + v_head_dim)``; rotary on the
``rope_head_dim`` columns of Q and of the one key shared by the heads; attention with query/key heads of ``head_dim``
and value heads of ``v_head_dim``; the output projection from ``heads x v_head_dim``. As Megatron-LM runs it with
Transformer Engine (megatron/core/transformer/multi_latent_attention.py:516-616 and 638-663 at d98e8a64): the two
down-projections are duplicated on every tensor-parallel rank over its own tokens, the up-projections
column-parallel, each gathering its latent over ``tp`` under sequence parallelism (and the rotary key with it,
line 763). Latent attention runs on the fused kernel without context parallelism (refused otherwise).

Not modelled: the router's auxiliary load-balancing loss (a few pointwise ops over ``T x E`` scores) and DeepSeek-V3's
multi-token-prediction module (``num_nextn_predict_layers: 1``: one more block with its own projection and an output
head shared with the model, 14B parameters by the V3 report, sec 2.2 and the model card; its FLOPs a token are one
MoE block's plus the shared output head's, about 1/61 of the blocks' and as much again for the head): the model's
671B count excludes it, as the report's does, and so its step time and memory leave it out.
"""

from __future__ import annotations

import math

import networkx as nx

from plansim.errors import PlansimError
from plansim.workload.graph import IN, PREV, Attrs, Node, Sharding, collective, op, op_saved, pointwise
from plansim.workload.shape import ModelShape
from plansim.workload.transformer import (
    RMSNORM_FLOPS,
    ROPE_FLOPS,
    SOFTMAX_FLOPS,
    SWIGLU_FLOPS,
    Dims,
    dims,
    flash_attention,
    llama_attention,
    llama_mlp,
    norm,
    residual_add,
    stamp_model,
    tp_enter,
    tp_exit,
)

__all__ = ["Routing", "add_moe", "block_parameters", "latent_attention", "moe_mlp", "moe_parameters", "routing"]


class Routing:
    """What one rank's MoE layer runs (see the module docstring): ``tokens`` ``T``, ``send`` ``S`` (the rows it
    routes, its all-to-all send buffer), ``receive`` (the rows the busiest expert-parallel rank receives: ``S``
    balanced), ``rows`` ``R`` (the rows its local experts run), ``local`` experts, their FFN width ``width`` on this
    rank, whether the routing is the identity (one expert, top-1, no capacity), the ``imbalance`` in force and the
    fraction of the busiest rank's tokens ``dropped`` over capacity."""

    def __init__(self, spec: ModelShape, sh: Sharding, d: Dims) -> None:
        E, k, ep, etp = spec.experts, spec.experts_per_token, sh.ep, sh.etp
        name = spec.name
        if E % ep:
            raise PlansimError(f"ep={ep} does not divide experts={E} of {name}: choose ep among the divisors of {E}")
        if spec.expert_ffn_hidden % etp:
            raise PlansimError(
                f"etp={etp} does not divide expert_ffn_hidden={spec.expert_ffn_hidden} of {name}: choose another etp"
            )
        if d.t > 1 and not d.sp:
            raise PlansimError(
                f"tp={d.t} with the experts of {name} needs sequence_parallel (Megatron-LM refuses MoE with tensor "
                "parallelism without it, moe_layer.py:636-640 at d98e8a64): set sequence_parallel: true"
            )
        self.tokens = d.rows_l
        self.local = E // ep
        self.width = spec.expert_ffn_hidden // etp
        factor = spec.capacity_factor
        self.send = E * math.ceil(factor * self.tokens * k / E) if factor else self.tokens * k
        # the routing imbalance: the busiest of the ep ranks, whose pace the all-to-alls hold every rank to, receives
        # ``x`` times the mean ``S``; at most every rank's rows (``ep`` times), so none at ep = 1
        x = min(spec.moe_imbalance, ep)
        self.imbalance = x
        if factor:  # padded to capacity: the busiest experts take ``c`` times their share, the rest is dropped
            self.receive = self.send
            self.dropped = max(0.0, 1.0 - factor / x)
        else:  # dropless: the busiest rank runs every row routed to it
            self.receive = self.send if x == 1.0 else math.ceil(x * self.send)
            self.dropped = 0.0
        self.rows = etp * self.receive
        self.identity = self.local == 1 and k == 1 and ep == 1 and not factor
        self.ep, self.etp, self.k, self.etp_axis = ep, etp, k, sh.etp_axis


def routing(spec: ModelShape, sh: Sharding) -> Routing:
    """The routing of ``spec``'s MoE layer on one rank under ``sh`` (``Routing``)."""
    return Routing(spec, sh, dims(spec, sh))


def _expert_gemm(d: Dims, r: Routing, n: int, k: int, *, saved: int, kept: int, rerun: float = 0.0) -> Attrs:
    """The rank's experts' GEMMs ``[R/local, k] @ [k, n]`` each, as one grouped op (``grouped`` = local experts)."""
    if r.local == 1:  # one GEMM: a block linear layer (FP8 where the block's are)
        attrs = d.linear(r.rows, n, k, saved=saved, after_norm=r.identity)
    else:
        weights = r.local * k * n
        attrs = op(
            "matmul",
            flops=2 * r.rows * n * k,
            nbytes=d.E * (r.rows * k + weights + r.rows * n),
            saved=saved,
            params=weights,
        )
        attrs["grouped"] = r.local
    attrs["expert"] = True
    if r.receive != r.send:  # the busiest rank's rows: MFU counts the mean rank's (workload.graph.mean_share)
        attrs["mean_share"] = r.send / r.receive
    return op_saved(attrs, kept=kept, rerun=rerun)


def _copy(d: Dims, read: int, written: int, *, flops: int = 0, saved: int = 0) -> Attrs:
    """A memory-bound gather of rows (a permutation): ``read`` elements in, ``written`` out."""
    return op("elementwise", flops=flops, nbytes=d.E * (read + written), saved=saved)


def moe_mlp(d: Dims, spec: ModelShape, sh: Sharding) -> list[Node]:
    """A MoE block's second half: RMSNorm, router, shared experts, dispatch, the routed experts, combine, the residual
    add (the module docstring)."""
    r = Routing(spec, sh, d)
    E, h, T, experts = d.E, d.h, r.tokens, spec.experts
    routed_in = r.rows * h
    nodes = [
        Node("norm2", norm(d, rms=True)),
        # the router reads the normalised tokens; their copy is the experts' input under identity routing
        Node("router", op("matmul", flops=2 * T * experts * h, nbytes=E * (T * h + h * experts + T * experts),
                          saved=0 if r.identity else E * T * h, params=h * experts)),
        Node("topk", pointwise("softmax", T * experts, SOFTMAX_FLOPS, E, saved=E * T * experts)),
    ]  # fmt: skip
    if spec.shared_ffn_hidden:
        if spec.shared_ffn_hidden % d.t:
            raise PlansimError(
                f"tp={d.t} does not divide shared_ffn_hidden={spec.shared_ffn_hidden} of {spec.name}: choose another tp"
            )
        nodes += llama_mlp(d, width=spec.shared_ffn_hidden // d.t, prefix="shared_", last=False)
    if r.ep == 1:  # the all-gather dispatcher: tokens gathered over etp, then permuted
        nodes += _etp_collective(d, r, "moe_in", T * h, gather=True)
        if not r.identity:
            nodes.append(Node("permute", _copy(d, r.etp * T * h, routed_in)))
    else:  # the all-to-all dispatcher
        nodes.append(Node("permute", _copy(d, T * h, r.send * h)))
        nodes.append(Node("dispatch", collective("all_to_all", "all_to_all", E * r.receive * h, sh.ep_axis)))
        nodes += _etp_collective(d, r, "dispatch_gather", r.receive * h, gather=True)
        if r.local > 1:
            nodes.append(Node("sort", _copy(d, routed_in, routed_in)))
    f_e = r.rows * r.width
    gate_saved = d.Ein * d.x if r.identity else E * routed_in
    nodes += [
        Node("experts_gate_up", _expert_gemm(d, r, 2 * r.width, h, saved=gate_saved, kept=E * f_e, rerun=0.5)),
        Node("experts_swiglu", {**pointwise("elementwise", f_e, SWIGLU_FLOPS, E, reads=2, saved=2 * E * f_e)}),
        Node("experts_down", _expert_gemm(d, r, h, r.width, saved=d.Ein * f_e if r.local == 1 else E * f_e,
                                          kept=E * routed_in)),
    ]  # fmt: skip
    if r.ep == 1:
        if not r.identity:  # weight each copy by its router probability and sum a token's copies
            combine = _copy(d, routed_in, r.etp * T * h, flops=2 * routed_in, saved=E * routed_in)
            nodes.append(Node("unpermute", combine))
        nodes += _etp_collective(d, r, "moe_out", T * h, gather=False)
    else:
        if r.local > 1:
            nodes.append(Node("unsort", _copy(d, routed_in, routed_in)))
        nodes += _etp_collective(d, r, "combine_scatter", r.receive * h, gather=False)
        nodes.append(Node("combine", collective("all_to_all", "all_to_all", E * r.receive * h, sh.ep_axis)))
        nodes.append(Node("unpermute", _copy(d, r.send * h, T * h, flops=2 * r.send * h, saved=E * r.send * h)))
    if spec.shared_ffn_hidden:
        nodes.append(Node("shared_add", residual_add(d), (PREV, "shared_down" if d.t == 1 else "shared_mlp_out")))
    nodes.append(Node("res2", residual_add(d), (PREV, "res1")))
    return nodes


def _etp_collective(d: Dims, r: Routing, name: str, elements: int, *, gather: bool) -> list[Node]:
    """The expert tensor-parallel group's all-gather (``gather``: forward all-gather, backward reduce-scatter) or
    reduce-scatter of ``elements`` per rank (its whole tensor ``etp`` times that); none when ``etp = 1``."""
    if r.etp == 1:
        return []
    fwd, bwd = ("all_gather", "reduce_scatter") if gather else ("reduce_scatter", "all_gather")
    attrs = collective(fwd, bwd, d.E * r.etp * elements, r.etp_axis)
    if not gather:  # torchtitan's per-op policy keeps a reduce-scatter's output (its shard), as ``tp_exit``'s
        attrs = op_saved(attrs, kept=d.E * elements)
    return [Node(name, attrs)]


def latent_attention(d: Dims, spec: ModelShape) -> list[Node]:
    """A block's first half under multi-head latent attention (the module docstring)."""
    if not d.flash:
        raise PlansimError(f"latent attention of {spec.name} runs on the fused kernel only: use attention=flash")
    if d.c > 1:
        raise PlansimError(f"cp={d.c}: context parallelism with the latent attention of {spec.name} is not modelled")
    E, h, T, rows = d.E, d.h, d.rows_l, d.rows
    qr, kvr, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.rope_head_dim
    q, heads_l = d.q_l, d.heads_l
    kv_up = heads_l * (d.head_dim - rope + d.vd)
    nodes = [Node("norm1", norm(d, rms=True))]
    if qr:
        nodes += [
            Node("q_down", _gemm(E, T, qr, h, saved=d.Ein * d.x)),
            Node("q_norm", pointwise("norm", T * qr, RMSNORM_FLOPS, E, extra_bytes=E * qr, saved=E * T * qr,
                                     params=qr)),
            *_latent_gather(d, "q_in", qr),
            Node("q_up", _gemm(E, rows, q, qr, saved=E * T * qr)),
        ]  # fmt: skip
    else:
        nodes += [*tp_enter(d, "q_in", linear=True), Node("q_up", _gemm(E, rows, q, h, saved=d.Ein * d.x))]
    nodes += [
        Node("kv_down", _gemm(E, T, kvr + rope, h, saved=0), ("norm1",)),
        Node("kv_norm", pointwise("norm", T * kvr, RMSNORM_FLOPS, E, extra_bytes=E * kvr, saved=E * T * kvr,
                                  params=kvr)),
        *_latent_gather(d, "kv_in", kvr + rope),
        # keeps V for the attention's backward, as the Llama QKV projection does
        Node("kv_up", _gemm(E, rows, kv_up, kvr, saved=E * T * kvr + E * rows * d.val_l)),
        # the rotary columns of Q and of the shared key; keeps the assembled Q and K
        Node("rope", pointwise("elementwise", rows * (heads_l + 1) * rope, ROPE_FLOPS, E,
                               saved=E * rows * (q + d.kv_l)), ("q_up", PREV)),
        flash_attention(d, qk_input="rope", v_input="kv_up"),
        Node("proj", d.linear(rows, h, d.o_l, saved=d.proj_saved)),
        *tp_exit(d, "attn_out"),
        Node("res1", residual_add(d), (PREV, IN)),
    ]  # fmt: skip
    return nodes


def _gemm(act_bytes: int, m: int, n: int, k: int, *, saved: int) -> Attrs:
    return op("matmul", flops=2 * m * n * k, nbytes=act_bytes * (m * k + k * n + m * n), saved=saved, params=k * n)


def _latent_gather(d: Dims, name: str, width: int) -> list[Node]:
    """A latent's all-gather over ``tp`` before its column-parallel up-projection (sequence parallelism)."""
    if d.t == 1:
        return []
    return [Node(name, collective("all_gather", "reduce_scatter", d.E * d.rows * width, d.t_axis))]


def add_moe(graph: nx.DiGraph, spec: ModelShape, sh: Sharding) -> int:
    """Add a ``moe`` model's ops to ``graph`` (dense blocks first, then MoE blocks); return the bytes of one block's
    input on this rank."""
    d = dims(spec, sh)
    attention = latent_attention(d, spec) if spec.kv_lora_rank else llama_attention(d)
    dense = [*attention, *llama_mlp(d)]
    sparse = [*attention, *moe_mlp(d, spec, sh)]
    blocks = [dense if layer < spec.dense_layers else sparse for layer in range(spec.layers)]
    return stamp_model(graph, spec, d, blocks, gpt=False)


def _attention_parameters(spec: ModelShape) -> int:
    """One block's attention weights: grouped-query (``h(q + 2 kv) + qh``) or latent (the module docstring)."""
    h, heads, hd = spec.hidden, spec.heads, spec.head_dim
    if not spec.kv_lora_rank:
        q = heads * hd
        return h * (q + 2 * spec.kv_heads * hd) + q * h
    qr, kvr, rope, vd = spec.q_lora_rank, spec.kv_lora_rank, spec.rope_head_dim, spec.v_head_dim
    query = (h * qr + qr + qr * heads * hd) if qr else h * heads * hd  # down, its norm, up; or one projection
    key_value = h * (kvr + rope) + kvr + kvr * heads * (hd - rope + vd)  # down, its norm, up
    return query + key_value + heads * vd * h


def moe_parameters(spec: ModelShape, *, active: bool = False) -> int:
    """Parameters of a ``moe`` model, every expert counted, or (``active``) those one token runs through: its
    attention, norms, dense FFNs, router, shared experts, ``experts_per_token`` routed experts, the embedding and the
    output head (Mixtral 8x7B's 12.9B active of 46.7B: Mistral AI, "Mixtral of experts", 2023-12-11, counts the
    embedding and head; ``tests/test_moe.py`` checks every preset against its published figures)."""
    h, v = spec.hidden, spec.vocab
    dense = _attention_parameters(spec) + 2 * h + 3 * h * spec.ffn_hidden  # + two RMSNorm gains
    blocks = spec.dense_layers * dense + (spec.layers - spec.dense_layers) * block_parameters(spec, active=active)
    return blocks + h + v * h * (1 if spec.tied_embeddings else 2)


def block_parameters(spec: ModelShape, *, active: bool = False) -> int:
    """One MoE block's parameters (``active``: those a token runs through): attention, two RMSNorm gains, router,
    shared experts and the routed experts (all, or ``experts_per_token`` of them)."""
    h = spec.hidden
    routed = spec.experts_per_token if active else spec.experts
    experts = 3 * h * (routed * spec.expert_ffn_hidden + spec.shared_ffn_hidden)
    return _attention_parameters(spec) + 2 * h + h * spec.experts + experts
