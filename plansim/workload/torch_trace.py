r"""Trace an arbitrary ``torch.nn.Module`` into plansim's op graph (the vocabulary of ``plansim.workload.graph``).

``trace_module(module, inputs)`` runs one forward and one backward pass on the meta device (shapes and dtypes only,
no memory, no arithmetic) and records one node per ATen kernel, in execution order (the inputs of an attention core
moved before it, see ``_core_inputs_first``), with the attributes the workload builders give (``NODE_ATTRIBUTES``),
so ``graph_totals``, ``layer_nodes``, ``model_flops``, ``plansim.step.layers.layer_programs`` and
``plansim.remat.stage.stage_graph`` read a traced graph as they read a built one.

How each attribute is measured:

``kind``
    from the ATen op (``mm``/``addmm`` -> matmul, ``bmm``/``baddbmm``/fused attention -> bmm, convolutions -> conv,
    layer/RMS/batch/group norms -> norm, ``_softmax`` -> softmax, ``native_dropout`` -> dropout, ``embedding``,
    log-softmax and the NLL/MSE/BCE losses -> loss, pools -> pool, the rest elementwise).
``flops``, ``bwd_flops``
    ``torch.utils.flop_counter.FlopCounterMode`` counts the matmul-like kernels (GEMMs ``2mnk``, batched matmuls,
    convolutions, fused attention) of the forward and, attributed through the autograd node that runs them, of the
    backward. FlopCounterMode counts nothing for memory-bound kernels; for those the builders' per-element counts
    are used (``LAYERNORM_FLOPS`` and the rest of ``plansim.workload.transformer`` and ``cnn``; 1 per element for other
    point-wise kernels and per input element for reductions, 0 for copies), with backward at the builders' ratio
    (``plansim.workload.graph.op``).
``bytes``
    bytes read plus written by the forward kernel: every tensor argument and result, broadcast (stride-0)
    dimensions counted once.
``saved_bytes``
    what autograd keeps for backward, seen through ``torch.autograd.graph.saved_tensors_hooks``: each distinct
    storage once (a view keeps its whole storage), charged to the first op whose backward reads it (Korthikanti et
    al. 2022, sec 4.1, the builders' rule). Not charged: parameters and buffers (model states), and tensors made
    before the trace (the inputs and targets, which the data loader holds anyway). Tensors that only attention-core
    ops save but that are made outside the core (Q, K, V) are charged to their producer, as the builders charge
    Q, K and V to the QKV projection, so that selective recompute never drops them. A module that checkpoints
    (``torch.utils.checkpoint``) saves what checkpointing keeps, and its recomputation counts in ``bwd_flops``.
``params``
    each trainable parameter once, at the first kernel that reads it (a tied output head's weight is counted at the
    embedding, as the builders count it).
``layer``
    from the module path: the ``i``-th child of the repeated-block container (an ``nn.ModuleList`` or
    ``nn.Sequential`` whose children are all of one class; the one holding most parameters unless ``blocks`` names
    it) is layer ``i``; kernels before the first block are layer ``-1``, after the last (final norm, head, loss)
    layer ``L``; kernels between blocks belong to the block before them. Without a block container, a root
    ``nn.Sequential``'s children are the layers; otherwise everything is layer 0.
``selective_recompute``
    True for the attention core: fused attention kernels, and each pair of batched matmuls joined by memory-bound
    kernels only (QK^T, scale, mask, softmax, dropout, attention over V), the ops Korthikanti et al. 2022 (sec 5)
    recompute.

Kernels are traced as a GPU runs them, not as the meta device's CPU fallbacks would: ``F.dropout`` becomes
``native_dropout`` (1-byte mask, as on CUDA) and ``F.scaled_dot_product_attention`` the flash kernel (fp16/bf16,
no mask) or the memory-efficient one (fp32 or a float mask), which keep O(s) statistics, not the s^2 probabilities
of the math fallback. Views and reshapes that move no data are not ops; the copies that non-viewable reshapes make
are.

Pricing a traced model: ``plansim.simulate(traced, hardware, strategy)`` (either engine) prices it under data and
pipeline parallelism from this graph, one micro-batch (the traced input shapes) at ``tp = 1``; the strategy must
take the traced batch as its micro-batch (``plansim.workload.traced`` says why, and what else it checks).
``plansim.step.layers.layer_programs(traced.graph, kernels, mesh)`` gives its per-layer work with any
``KernelCostModel``, exactly as for a built graph.

Needs torch (the ``torch`` or ``profile`` extra); importing this module does not.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import networkx as nx

from plansim.errors import PlansimError
from plansim.workload.cnn import BATCHNORM_FLOPS
from plansim.workload.graph import MATMUL_KINDS, graph_totals, op
from plansim.workload.transformer import (
    DROPOUT_FLOPS,
    GELU_FLOPS,
    LAYERNORM_FLOPS,
    LOSS_FLOPS,
    RMSNORM_FLOPS,
    SOFTMAX_FLOPS,
)

if TYPE_CHECKING:
    import torch

__all__ = ["TracedModel", "aten_kind", "trace_module"]

_MATMUL_OPS = frozenset({"mm", "addmm", "mv", "addmv", "dot", "vdot", "_scaled_mm", "_int_mm"})
_FUSED_ATTENTION = frozenset(
    {
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention_forward",
        "_efficient_attention_forward",
    }
)
_KIND_OF_OP = {
    **dict.fromkeys(_MATMUL_OPS, "matmul"),
    **dict.fromkeys({"bmm", "baddbmm", *_FUSED_ATTENTION}, "bmm"),
    **dict.fromkeys({"convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution"}, "conv"),
    **dict.fromkeys(
        {
            "native_layer_norm", "_fused_rms_norm", "native_batch_norm", "_native_batch_norm_legit",
            "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training", "native_group_norm",
        },
        "norm",
    ),
    **dict.fromkeys({"_softmax", "_safe_softmax"}, "softmax"),
    "native_dropout": "dropout",
    **dict.fromkeys({"embedding", "_embedding_bag"}, "embedding"),
    **dict.fromkeys(
        {
            "_log_softmax", "nll_loss_forward", "nll_loss2d_forward", "mse_loss", "l1_loss", "smooth_l1_loss",
            "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
        },
        "loss",
    ),
    **dict.fromkeys(
        {
            "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool2d", "avg_pool3d", "_adaptive_avg_pool2d",
            "_adaptive_avg_pool3d", "adaptive_max_pool2d", "_low_memory_max_pool_with_offsets",
        },
        "pool",
    ),
}  # fmt: skip
# Forward FLOPs per output element of memory-bound kernels, the workload builders' counts (transformer.py, cnn.py).
_FLOPS_PER_ELEMENT = {
    "native_layer_norm": LAYERNORM_FLOPS,
    "_fused_rms_norm": RMSNORM_FLOPS,
    **dict.fromkeys(
        {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "native_group_norm"},
        BATCHNORM_FLOPS,
    ),
    "_softmax": SOFTMAX_FLOPS,
    "_safe_softmax": SOFTMAX_FLOPS,
    "_log_softmax": LOSS_FLOPS,
    "native_dropout": DROPOUT_FLOPS,
    "gelu": GELU_FLOPS,
    "silu": 4,  # SWIGLU_FLOPS less the multiply by the up projection, a kernel of its own here
}
# Point-wise-tagged kernels that only move or fill data.
_MOVES = frozenset({"clone", "copy", "copy_", "_to_copy", "fill", "fill_", "zero_", "zeros_like", "ones_like"})
_NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh"})


def aten_kind(name: str) -> str:
    """The op-graph kind (``plansim.workload.graph.KINDS``) of an ATen op, by its name without namespace or
    overload.

    >>> aten_kind("addmm"), aten_kind("bmm"), aten_kind("native_layer_norm"), aten_kind("gelu")
    ('matmul', 'bmm', 'norm', 'elementwise')
    """
    return _KIND_OF_OP.get(name, "elementwise")


@dataclass(frozen=True)
class TracedModel:
    """A traced module: its op graph (one micro-batch, the traced input shapes, one rank), the number of blocks
    ``layers`` (``L``; layers ``-1`` and ``L`` hold what runs before and after them) and the module path of the
    block container (``None`` when there is none).

    What the engines read besides the graph (``plansim.workload.traced``): ``batch``, the micro-batch it was traced
    at (the first input's first dimension); ``seq_len``, tokens per sample for throughput (the second dimension of
    an integer, token-id, first input; else 1: one sample); ``dtype``, its parameters' dtype in plansim's names
    (``fp32``, ``fp16``, ``bf16``; else torch's, which no strategy accepts); ``tied_params``, the elements of
    parameters read both before the first block (layer -1) and after the last (layer ``L``), as a tied output
    head reads the word embedding: Megatron-LM's copy of them on the last pipeline stage.
    """

    name: str
    graph: nx.DiGraph
    layers: int
    blocks: str | None
    batch: int = 1
    seq_len: int = 1
    dtype: str = "fp32"
    tied_params: int = 0

    def totals(self, layers: Sequence[int] | None = None) -> dict[str, int]:
        """``graph_totals`` of the graph (over ``layers`` only when given)."""
        return graph_totals(self.graph, layers)


# --------------------------------------------------------------------------------------------------- inputs


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise PlansimError("trace_module needs PyTorch: pip install 'plansim[torch]'") from None
    return torch


def _meta_input(torch: Any, item: Any, dtype: Any, index: int) -> torch.Tensor:
    """One positional input on the meta device: from a tensor, a shape, or (shape, dtype)."""
    shape, kind = None, dtype
    if isinstance(item, torch.Tensor):
        shape, kind = tuple(item.shape), item.dtype
    elif isinstance(item, tuple | list) and all(isinstance(n, int) and not isinstance(n, bool) for n in item):
        shape = tuple(item)
    elif isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[1], torch.dtype):
        shape, kind = tuple(item[0]), item[1]
    if shape is None or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape):
        raise PlansimError(
            f"inputs[{index}]={item!r}: give a tensor, a shape of positive ints such as (2, 64), or (shape, dtype)"
        )
    return torch.empty(shape, dtype=kind, device="meta")


def _meta_inputs(torch: Any, inputs: Any, dtype: Any) -> list[torch.Tensor]:
    """The module's positional inputs: one item (tensor, shape, (shape, dtype)) or a sequence of them."""
    one = isinstance(inputs, torch.Tensor) or (
        isinstance(inputs, tuple | list)
        and inputs
        and (all(isinstance(n, int) for n in inputs) or (len(inputs) == 2 and isinstance(inputs[1], torch.dtype)))
    )
    items = [inputs] if one else inputs
    if not isinstance(items, tuple | list) or not items:
        raise PlansimError(f"inputs={inputs!r}: give the module's inputs as tensors, shapes or (shape, dtype) pairs")
    return [_meta_input(torch, item, dtype, i) for i, item in enumerate(items)]


def _meta_state(torch: Any, module: Any) -> tuple[dict[str, Any], dict[int, int], set[int]]:
    """Meta copies of the module's parameters and buffers (ties kept), trainable parameters by storage (numel),
    and the storages of all model state."""
    state: dict[str, Any] = {}
    copies: dict[int, Any] = {}
    named = itertools.chain(
        module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)
    )
    for name, tensor in named:
        if tensor is None:
            continue
        if id(tensor) not in copies:
            meta = torch.empty_like(tensor, device="meta")
            copies[id(tensor)] = meta.requires_grad_(tensor.requires_grad) if tensor.is_floating_point() else meta
        state[name] = copies[id(tensor)]
    params = {_key(t): t.numel() for t in copies.values() if t.requires_grad}
    return state, params, {_key(t) for t in copies.values()}


def _float_dtype(torch: Any, module: Any) -> Any:
    """The dtype of the module's first floating parameter (float32 when it has none)."""
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


def _dtype_name(dtype: Any) -> str:
    """plansim's name of a torch dtype (``fp32``, ``fp16``, ``bf16``), else torch's (``float64``)."""
    name = str(dtype).removeprefix("torch.")
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(name, name)


# --------------------------------------------------------------------------------------------------- blocks


def _find_blocks(torch: Any, module: Any, blocks: str | None) -> tuple[str | None, list[Any]]:
    """The block container's path and its children: ``blocks`` when given, else the container of like children
    that holds most parameters, else a root ``nn.Sequential``; ``(None, [])`` when there is none."""
    kinds = (torch.nn.ModuleList, torch.nn.Sequential)
    containers = {name: m for name, m in module.named_modules() if isinstance(m, kinds)}
    if blocks is not None:
        if blocks not in containers:
            found = ", ".join(repr(n) for n in containers) or "none"
            raise PlansimError(f"blocks={blocks!r}: no nn.ModuleList or nn.Sequential at that path (found: {found})")
        return blocks, list(containers[blocks].children())

    def weight(m: Any) -> int:
        return sum(p.numel() for p in m.parameters())

    alike = [
        (weight(m), name)
        for name, m in containers.items()
        if len(list(m.children())) >= 2 and len({type(c) for c in m.children()}) == 1
    ]
    if alike:
        name = max(alike, key=lambda wn: wn[0])[1]
        return name, list(containers[name].children())
    if isinstance(module, torch.nn.Sequential) and len(module) >= 2:
        return "", list(module.children())
    return None, []


class _Modules:
    """Which module is running (global forward hooks) and so which layer a kernel belongs to."""

    def __init__(self, module: Any, blocks: list[Any]) -> None:
        self.path = {id(m): name for name, m in module.named_modules()}
        self.block = {id(m): i for i, m in enumerate(blocks)}
        self.layers = len(blocks)
        self.stack: list[Any] = []
        self.done = -1  # the last block that finished
        self.block_input_bytes = 0

    def enter(self, module: Any, args: tuple[Any, ...]) -> None:
        if id(module) in self.path:
            self.stack.append(module)
            if self.block.get(id(module)) == 0 and not self.block_input_bytes:
                first = next((a for a in args if hasattr(a, "untyped_storage")), None)
                self.block_input_bytes = _footprint(first) if first is not None else 0

    def leave(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()
            self.done = self.block.get(id(module), self.done)

    def where(self) -> tuple[str, int]:
        """(module path, layer) of a kernel running now; ``loss`` for kernels outside the module (the loss)."""
        path = (self.path[id(self.stack[-1])] or "model") if self.stack else "loss"
        if not self.layers:
            return path, 0
        inside = next((self.block[id(m)] for m in reversed(self.stack) if id(m) in self.block), None)
        if inside is not None:
            return path, inside
        if not self.stack or self.done == self.layers - 1:
            return path, self.layers
        return path, self.done  # -1 before the first block; between blocks, the block before


# --------------------------------------------------------------------------------------------------- recording


def _key(t: Any) -> int:
    """A storage's identity (tensors are kept alive while traced, so no address is reused)."""
    return int(t.untyped_storage()._cdata)


def _footprint(t: Any) -> int:
    """Bytes a kernel touches in ``t``: its elements, a broadcast (stride-0) dimension once."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        n *= size if stride else 1
    return n * t.element_size()


def _tensors(value: Any) -> Iterator[Any]:
    if hasattr(value, "untyped_storage"):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)


@dataclass
class _Op:
    """One recorded forward kernel."""

    name: str
    node: str
    path: str
    layer: int
    kind: str
    flops: int
    est_flops: int
    nbytes: int
    params: int
    sources: list[int]
    outputs: list[Any]
    bwd_flops: int = 0


@dataclass
class _Save:
    """One tensor autograd saved: its storage, bytes, the autograd node's sequence number, its producer, and where
    the trace was (ops recorded so far, layer)."""

    key: int
    nbytes: int
    seq: int
    producer: int | None
    ops_before: int
    path: str
    layer: int


@dataclass
class _Trace:
    """Everything recorded during one forward and backward."""

    modules: _Modules
    params: dict[int, int]
    state: set[int]
    readers: dict[int, set[int]] = field(default_factory=dict)  # trainable parameter -> layers of its readers
    ops: list[_Op] = field(default_factory=list)
    saves: list[_Save] = field(default_factory=list)
    producer: dict[int, int] = field(default_factory=dict)
    node_op: dict[int, int] = field(default_factory=dict)
    names: dict[str, int] = field(default_factory=dict)
    alive: list[Any] = field(default_factory=list)
    backward: bool = False
    pending: int = -1
    unattributed_bwd_flops: int = 0

    def resolve(self) -> None:
        """Map the autograd node of the last recorded op (set after its kernel ran) to that op."""
        if 0 <= self.pending < len(self.ops):
            for t in self.ops[self.pending].outputs:
                if getattr(t, "grad_fn", None) is not None:
                    self.node_op.setdefault(t.grad_fn._sequence_nr(), self.pending)
        self.pending = -1

    def pack(self, t: Any) -> Any:
        if not self.backward:
            import torch

            seq = torch._C._autograd._get_sequence_nr() - 1  # the node being built is the newest one
            key = _key(t)
            self.alive.append(t)
            path, layer = self.modules.where()
            nbytes = t.untyped_storage().nbytes()
            self.saves.append(_Save(key, nbytes, seq, self.producer.get(key), len(self.ops), path, layer))
        return t


def _estimate(func: Any, name: str, args: Sequence[Any], outputs: list[Any]) -> int:
    """Forward FLOPs of a memory-bound kernel (FlopCounterMode counts none): the builders' per-element counts."""
    import torch

    if name in _FLOPS_PER_ELEMENT and outputs:
        return _FLOPS_PER_ELEMENT[name] * outputs[0].numel()
    if name in _MOVES:
        return 0
    if torch.Tag.pointwise in func.tags and outputs:
        return outputs[0].numel()
    first = next(_tensors(args), None)
    if torch.Tag.reduction in func.tags and first is not None:
        return int(first.numel())
    return 0


def _record(tr: _Trace, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any, flops: int) -> None:
    """Record one forward kernel, unless it moves no data (a view, an allocation, a metadata query)."""
    name = func._schema.name.split("::")[-1]
    ins, outs = list(_tensors([args, list(kwargs.values())])), list(_tensors(out))
    in_keys = [_key(t) for t in ins]
    mutates = func._schema.is_mutable
    if not outs or name in _NO_KERNEL or (not mutates and all(_key(t) in in_keys for t in outs)):
        for t in outs:
            tr.producer.setdefault(_key(t), -1)  # made in the trace, but by no op of its own
        return
    path, layer = tr.modules.where()
    base = f"{path}/{name}"
    tr.names[base] = tr.names.get(base, 0) + 1
    node = base if tr.names[base] == 1 else f"{base}#{tr.names[base]}"
    params = 0
    for k in dict.fromkeys(in_keys):
        params += tr.params.pop(k, 0)  # a parameter counts once, at its first reader
        if k in tr.readers:
            tr.readers[k].add(layer)
    kind = aten_kind(name)
    est = 0 if kind in MATMUL_KINDS or flops else _estimate(func, name, args, outs)
    nbytes = sum(_footprint(t) for t in ins) + sum(_footprint(t) for t in outs)
    index = len(tr.ops)
    sources = [tr.producer.get(k, -1) for k in in_keys]
    tr.ops.append(_Op(name, node, path, layer, kind, flops, est, nbytes, params, sources, outs))
    tr.alive.extend(outs)
    for t in outs:
        tr.producer[_key(t)] = index
    tr.pending = index


def _bwd_owner(tr: _Trace, node: Any, cache: dict[int, int | None]) -> int | None:
    """The forward op whose autograd node is ``node``; for a node of a view (no op of its own), the op producing
    its input, found through ``next_functions``."""
    seq = node._sequence_nr()
    if seq in cache:
        return cache[seq]
    found, frontier, seen = tr.node_op.get(seq), [node], {seq}
    while found is None and frontier:  # breadth first: the nearest producer
        children = [c for n in frontier for c, _ in n.next_functions if c is not None]
        frontier = [c for c in children if c._sequence_nr() not in seen]
        seen.update(c._sequence_nr() for c in frontier)
        found = next((tr.node_op[c._sequence_nr()] for c in frontier if c._sequence_nr() in tr.node_op), None)
    cache[seq] = found
    return found


def _recorder(torch: Any, tr: _Trace, counter: Any) -> Any:
    """The dispatch mode that records forward kernels and attributes backward FLOPs (inside FlopCounterMode)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    owners: dict[int, int | None] = {}

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            tr.resolve()
            before = counter.get_total_flops()
            out = func(*args, **kwargs)
            flops = counter.get_total_flops() - before
            if not tr.backward:
                _record(tr, func, args, kwargs, out, flops)
            elif flops:
                node = torch._C._current_autograd_node()
                owner = _bwd_owner(tr, node, owners) if node is not None else None
                if owner is None:
                    tr.unattributed_bwd_flops += flops
                else:
                    tr.ops[owner].bwd_flops += flops
            return out

    return Recorder()


def _gpu_kernels(torch: Any) -> Any:
    """A function mode that runs dropout and scaled-dot-product attention as the GPU kernels do (see module doc)."""
    from torch.overrides import TorchFunctionMode

    F = torch.nn.functional
    half = (torch.float16, torch.bfloat16)

    def dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        return torch.native_dropout(x, p, training)[0] if training and 0 < p < 1 else x

    def sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
             scale: float | None = None, enable_gqa: bool = False) -> Any:  # fmt: skip
        aten = torch.ops.aten
        if enable_gqa or (attn_mask is not None and not attn_mask.is_floating_point()):
            return None
        if attn_mask is None and q.dtype in half:
            return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, scale=scale)[0]
        return aten._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale
        )[0]

    class GpuKernels(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func in (F.dropout, torch.dropout):
                return dropout(*args, **kwargs)
            if func is F.scaled_dot_product_attention:
                result = sdpa(*args, **kwargs)
                if result is not None:
                    return result
            return func(*args, **kwargs)

    return GpuKernels()


# --------------------------------------------------------------------------------------------------- the graph


def _attention_cores(graph: nx.DiGraph) -> set[str]:
    """Fused attention kernels, and each pair of batched matmuls joined by memory-bound ops only, with those ops."""
    core = {n for n, name in graph.nodes(data="aten") if name in _FUSED_ATTENTION}
    for end in (n for n, kind in graph.nodes(data="kind") if kind == "bmm"):
        between, starts, stack = set(), set(), [end]
        while stack:
            for p in graph.predecessors(stack.pop()):
                kind = graph.nodes[p]["kind"]
                if kind == "bmm":
                    starts.add(p)
                elif kind not in MATMUL_KINDS and p not in between:
                    between.add(p)
                    stack.append(p)
        if starts:
            reach = set(starts)
            for n in nx.topological_sort(graph.subgraph(between | starts)):
                if n in reach:
                    reach.update(s for s in graph.successors(n) if s in between)
            core |= reach | {end}
    return core


def _core_inputs_first(graph: nx.DiGraph, core: set[str]) -> list[str]:
    """Execution order, but within each layer the ops that feed an attention core without depending on one (the
    copy of V, a causal mask made each forward) run before the core's first op: an equally valid order, in which
    each core is one contiguous run, as the remat coarsening (``plansim.remat.coarsen.layer_parts``) expects."""
    order = list(graph)
    position = {n: i for i, n in enumerate(order)}
    for layer in dict.fromkeys(graph.nodes[n]["layer"] for n in core):
        ops = [n for n in core if graph.nodes[n]["layer"] == layer]
        first, last = min(position[n] for n in ops), max(position[n] for n in ops)
        segment = order[first : last + 1]
        after_core: set[str] = set()
        for n in segment:  # ops with a core op among their ancestors within the segment
            if n in core or any(p in after_core for p in graph.predecessors(n)):
                after_core.add(n)
        feeds: set[str] = set()
        for n in reversed(segment):  # ops with a core op among their descendants within the segment
            if any(c in core or c in feeds for c in graph.successors(n)):
                feeds.add(n)
        hoisted = [n for n in segment if n in feeds and n not in after_core]
        rest = [n for n in segment if n not in hoisted]
        order[first : last + 1] = hoisted + rest
        position = {n: i for i, n in enumerate(order)}
    return order


def _charge_saved(tr: _Trace, owner_of: Callable[[_Save], int], core: set[int]) -> dict[int, int]:
    """Saved bytes per op: each storage once, at the first op outside the attention core that saves it; if only
    core ops save it, at its producer when that is outside the core, else at the first saver."""
    savers: dict[int, list[int]] = {}
    first: dict[int, _Save] = {}
    for s in tr.saves:
        if s.key in tr.state or s.producer is None or s.producer < 0:
            continue  # model state, or a tensor made before the trace (inputs, targets)
        savers.setdefault(s.key, []).append(owner_of(s))
        first.setdefault(s.key, s)
    charged: dict[int, int] = {}
    for key, ops in savers.items():
        outside = [i for i in ops if i not in core]
        producer = first[key].producer
        assert producer is not None
        target = outside[0] if outside else producer if producer not in core else ops[0]
        charged[target] = charged.get(target, 0) + first[key].nbytes
    return charged


def _owner_of_save(tr: _Trace) -> Callable[[_Save], int]:
    """Which op saved a tensor: the op of the newest autograd node if it runs in the module that saved; else (a
    tensor saved by no op's node, as checkpoint saves its inputs) the op recorded next if in the same layer, else
    the op recorded last."""

    def owner(s: _Save) -> int:
        found = tr.node_op.get(s.seq)
        if found is not None and tr.ops[found].path == s.path:
            return found
        if s.ops_before < len(tr.ops) and tr.ops[s.ops_before].layer == s.layer:
            return s.ops_before
        return max(s.ops_before - 1, 0)

    return owner


def _graph(tr: _Trace, meta: dict[str, Any]) -> nx.DiGraph:
    """The op graph: nodes in execution order (``_core_inputs_first``) with ``NODE_ATTRIBUTES``, edges from
    producer to consumer."""
    graph = nx.DiGraph(**meta)
    for o in tr.ops:
        graph.add_node(o.node, aten=o.name, kind=o.kind)
    for i, o in enumerate(tr.ops):
        for p in dict.fromkeys(o.sources):
            if 0 <= p < i:
                graph.add_edge(tr.ops[p].node, o.node)
    core_names = _attention_cores(graph)
    core = {i for i, o in enumerate(tr.ops) if o.node in core_names}
    saved = _charge_saved(tr, _owner_of_save(tr), core)
    # The output head's last GEMM makes the logits; autograd does not save them (the loss keeps its softmax), but they
    # live while the loss runs: the builders' ``transient_bytes`` of the loss (plansim.workload.transformer).
    last = max((o.layer for o in tr.ops), default=0)
    head = [i for i, o in enumerate(tr.ops) if o.layer == last and o.kind in MATMUL_KINDS]
    logits = head[-1] if head else None
    for i, o in enumerate(tr.ops):
        attrs = op(o.kind, flops=o.est_flops, nbytes=o.nbytes, saved=saved.get(i, 0), params=o.params)
        if i == logits:
            attrs["transient_bytes"] = sum(_footprint(t) for t in o.outputs)
        attrs.update(
            flops=o.flops + o.est_flops,
            bwd_flops=o.bwd_flops + attrs["bwd_flops"],  # measured (matmul-like) + builders' ratio (the rest)
            selective_recompute=i in core,
            layer=o.layer,
        )
        graph.nodes[o.node].update(attrs)
    ordered = nx.DiGraph(**meta)
    ordered.add_nodes_from((n, graph.nodes[n]) for n in _core_inputs_first(graph, core_names))
    ordered.add_edges_from(graph.edges)
    return ordered


# --------------------------------------------------------------------------------------------------- the trace


@contextmanager
def _module_hooks(torch: Any, modules: _Modules) -> Iterator[None]:
    from torch.nn.modules import module as nn_module

    pre = nn_module.register_module_forward_pre_hook(modules.enter)
    post = nn_module.register_module_forward_hook(modules.leave, always_call=True)
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def _objective(torch: Any, out: Any, loss: Callable[[Any], Any] | None, name: str) -> Any:
    """The tensor to differentiate: ``loss(out)`` (a scalar), else the output (against ones)."""
    target = loss(out) if loss is not None else out
    what = "loss(output)" if loss is not None else "the output"
    if not isinstance(target, torch.Tensor) or not target.is_floating_point():
        raise PlansimError(
            f"{name}: {what} is {type(target).__name__}, not a floating tensor: "
            "pass loss=, a function of the output returning a scalar tensor"
        )
    if not target.requires_grad:
        raise PlansimError(f"{name}: {what} depends on no trainable parameter: there is no backward to trace")
    if loss is not None and target.numel() != 1:
        raise PlansimError(f"{name}: loss(output) has shape {tuple(target.shape)}: it must return a scalar")
    return target


def _run(torch: Any, module: Any, args: list[Any], state: dict[str, Any], tr: _Trace, loss: Any, name: str) -> None:
    """One forward and backward under the recording modes."""
    from torch.autograd.graph import saved_tensors_hooks
    from torch.utils.flop_counter import FlopCounterMode

    with ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        stack.enter_context(torch.device("meta"))
        counter = stack.enter_context(FlopCounterMode(display=False))
        stack.enter_context(_recorder(torch, tr, counter))
        stack.enter_context(_gpu_kernels(torch))
        stack.enter_context(_module_hooks(torch, tr.modules))
        with saved_tensors_hooks(tr.pack, lambda t: t):
            out = torch.func.functional_call(module, state, tuple(args))
            target = _objective(torch, out, loss, name)
        tr.resolve()
        tr.backward = True
        torch.autograd.backward(target, None if target.numel() == 1 else torch.ones_like(target))


def trace_module(
    module: Any,
    inputs: Any,
    *,
    name: str | None = None,
    loss: Callable[[Any], Any] | None = None,
    blocks: str | None = None,
) -> TracedModel:
    """Trace ``module``'s forward and backward on the meta device into plansim's op graph.

    Parameters
    ----------
    module : torch.nn.Module
        Any module, on any device (its parameters are replaced by meta tensors for the trace; nothing is
        allocated or changed, training mode is set for the trace and restored).
    inputs : tensor, shape, (shape, dtype), or a sequence of them
        The positional inputs of one micro-batch. A bare shape gets the dtype of the module's parameters; token
        ids need an integer dtype: ``((batch, seq), torch.long)``.
    name : str, optional
        The model's name (default: the module's class name).
    loss : callable, optional
        ``loss(output)`` -> scalar tensor, traced too (its kernels are layer ``L``). Default: differentiate the
        output against ones.
    blocks : str, optional
        Module path of the ``nn.ModuleList`` / ``nn.Sequential`` whose children are the layers (default: found).

    Returns
    -------
    TracedModel
        ``graph`` holds one node per kernel with ``plansim.workload.graph.NODE_ATTRIBUTES`` (plus ``aten``, the
        kernel's name); ``graph.graph`` holds ``name``, ``tp`` (1), ``sequence_parallel`` (False), ``act_bytes``
        (bytes per element of the parameters' dtype), ``layers`` and ``layer_input_bytes`` (the first block's
        input) and ``unattributed_bwd_flops`` (backward FLOPs no forward op owns; 0 for plain modules).

    Raises
    ------
    PlansimError
        ``module`` is not a module, ``inputs`` or ``blocks`` are malformed, or the forward or backward fails on
        the inputs given (one line, with PyTorch's reason).

    Examples
    --------
    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    >>> traced = trace_module(mlp, (16, 32))
    >>> traced.totals()["params"] == 32 * 64 + 64 + 64 * 8 + 8
    True
    >>> [traced.totals([i])["flops"] for i in (0, 2)] == [2 * 16 * 32 * 64, 2 * 16 * 64 * 8]
    True
    """
    torch = _import_torch()
    if not isinstance(module, torch.nn.Module):
        raise PlansimError(f"module: got {type(module).__name__}, not a torch.nn.Module: pass the model object")
    name = name or type(module).__name__
    args = _meta_inputs(torch, inputs, _float_dtype(torch, module))
    path, children = _find_blocks(torch, module, blocks)
    state, params, state_keys = _meta_state(torch, module)
    numel = dict(params)  # the trace pops each parameter at its first reader
    tr = _Trace(_Modules(module, children), params, state_keys, {k: set() for k in params})
    was_training = module.training
    module.train()
    try:
        _run(torch, module, args, state, tr, loss, name)
    except PlansimError:
        raise
    except Exception as exc:  # the user's module failed on these inputs: one line, PyTorch's reason
        shapes = ", ".join(f"{tuple(a.shape)} {str(a.dtype).removeprefix('torch.')}" for a in args)
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        raise PlansimError(f"{name}: tracing on inputs {shapes} failed: {type(exc).__name__}: {reason}") from None
    finally:
        module.train(was_training)
    first_input = tr.modules.block_input_bytes or (_footprint(args[0]) if args else 0)
    meta = dict(
        name=name,
        tp=1,
        sequence_parallel=False,
        act_bytes=_float_dtype(torch, module).itemsize,
        layers=max(tr.modules.layers, 1),
        layer_input_bytes=first_input,
        unattributed_bwd_flops=tr.unattributed_bwd_flops,
    )
    ends = {-1, tr.modules.layers}
    tied = sum(numel[k] for k, layers in tr.readers.items() if tr.modules.layers and ends <= layers)
    return TracedModel(
        name,
        _graph(tr, meta),
        max(tr.modules.layers, 1),
        path,
        batch=args[0].shape[0] if args[0].dim() else 1,
        seq_len=args[0].shape[1] if args[0].dim() >= 2 and not args[0].is_floating_point() else 1,
        dtype=_dtype_name(_float_dtype(torch, module)),
        tied_params=tied,
    )
