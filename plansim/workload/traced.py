"""A traced module (``plansim.workload.torch_trace.TracedModel``) as a workload both engines price, under data and
pipeline parallelism.

Both engines start from the op graph of one micro-batch on one tensor-parallel rank (``plansim.step.prepare_step``)
and read a few model facts besides: the block count (stage layout), the name, tokens per sample and the tied
embedding copy. A ``ModelSpec`` has its graph built at the strategy's micro-batch, ``tp`` and sequence parallelism; a
traced model *is* its graph, so the strategy must fit the trace (``traced_problems``, called by ``check_strategy``):

- ``tp = 1`` and no sequence parallelism: sharding a layer needs the builders' Megatron-LM column/row split and its
  collectives (Shoeybi et al. 2019, sec 3; Korthikanti et al. 2022, sec 4.2.2), which a trace of an unsharded module
  does not have.
- ``micro_batch`` equal to the traced batch. A traced model is not re-traced at the strategy's micro-batch: it is
  plain data (no module, no torch needed to price it, picklable for the planner's and the sweeps' worker
  processes), and a ``loss`` passed to ``trace_module`` usually holds targets of the traced batch, so a re-trace at
  another batch would fail or price another loss. Trace again with inputs of the batch wanted (meta device: about a
  tenth of a second for a small transformer).
- ``dtype`` equal to the parameters' dtype at tracing (bytes per element are baked into the graph).

``simulate`` fills in the last two from the trace where the strategy does not give them (``with_traced_defaults``).

Everything else is as for a built graph: pipeline stages split blocks ``0 .. L-1`` evenly (or by ``layer_split``),
layer -1 (what runs before the first block) on the first stage and layer ``L`` (after the last) on the last
(``plansim.stages``); per-layer costs from ``plansim.step.layers``; remat from the ops' ``saved_bytes`` and
``selective_recompute`` flags (``plansim.costs.memory``), full and sqrt(N) keeping ``layer_input_bytes`` per block,
the first block's input, which is exact for a stack of like blocks (a transformer) and an approximation for blocks of
different widths, as is the pipeline message, also that size; with ``pp > 1`` the last stage holds a copy of the
``tied_params`` and their gradients are all-reduced with the first stage's (Megatron-LM's tied embeddings).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from plansim.workload.spec import ModelSpec
from plansim.workload.torch_trace import TracedModel

if TYPE_CHECKING:
    from plansim.strategy import Strategy

__all__ = ["Workload", "traced_problems", "with_traced_defaults"]

#: What the engines price: a model spec (op graph built per strategy) or a traced module (its graph as traced).
Workload: TypeAlias = ModelSpec | TracedModel

_PRICED_DTYPES = ("fp32", "fp16", "bf16")


def traced_problems(s: Strategy, model: TracedModel) -> list[str]:
    """Every way the resolved strategy ``s`` does not fit the trace of ``model``; each message names the field and
    the fix.

    >>> from plansim.strategy import Strategy
    >>> import networkx as nx
    >>> traced = TracedModel("mlp", nx.DiGraph(), layers=3, blocks="", batch=8, dtype="fp32")
    >>> traced_problems(Strategy(dp=2, micro_batch=8, dtype="fp32"), traced)
    []
    >>> traced_problems(Strategy(dp=1, tp=2, micro_batch=8, dtype="fp32"), traced)[0]  # doctest: +ELLIPSIS
    "tp=2: a traced model runs with tp=1 only: tensor parallelism needs the builder's Megatron sharding..."
    """
    problems = []
    if s.tp > 1:
        problems.append(
            f"tp={s.tp}: a traced model runs with tp=1 only: tensor parallelism needs the builder's Megatron "
            "sharding, which a trace does not have: use dp or pp (or a model preset or YAML file)"
        )
    if s.sequence_parallel:
        problems.append(
            "sequence_parallel=true: a traced model has no tensor-parallel sharding to split by sequence: "
            "set sequence_parallel=false"
        )
    if s.micro_batch != model.batch:
        problems.append(
            f"micro_batch={s.micro_batch} but model '{model.name}' was traced at batch {model.batch} (its first "
            f"input's first dimension): set micro_batch={model.batch} or trace with inputs of batch {s.micro_batch}"
        )
    if model.dtype not in _PRICED_DTYPES:
        problems.append(
            f"model '{model.name}' was traced in {model.dtype}: plansim prices {', '.join(_PRICED_DTYPES)}: "
            "trace module.to(torch.bfloat16) or module.to(torch.float32)"
        )
    elif s.compute_dtype != model.dtype:
        problems.append(
            f"dtype={s.compute_dtype} but model '{model.name}' was traced in {model.dtype} (its parameters' "
            f"dtype): set dtype={model.dtype} or trace the module in {s.compute_dtype}"
        )
    return problems


def with_traced_defaults(strategy: Strategy, model: Workload) -> Strategy:
    """``strategy`` with what it leaves out taken from a traced model: ``micro_batch`` (unless given) the traced
    batch, ``dtype`` (unless given) the parameters' dtype, where the strategy's defaults (1, the GPU's) would not fit
    the trace. Unchanged for a ``ModelSpec``.

    >>> from plansim.strategy import Strategy
    >>> import networkx as nx
    >>> traced = TracedModel("mlp", nx.DiGraph(), layers=3, blocks="", batch=8, dtype="fp32")
    >>> s = with_traced_defaults(Strategy.parse("dp=2"), traced)
    >>> s.micro_batch, s.dtype
    (8, 'fp32')
    >>> with_traced_defaults(Strategy.parse("dp=2,micro_batch=4"), traced).micro_batch
    4
    """
    if not isinstance(model, TracedModel):
        return strategy
    update: dict[str, object] = {}
    if "micro_batch" not in strategy.model_fields_set:
        update["micro_batch"] = model.batch
    if strategy.dtype is None and model.dtype in _PRICED_DTYPES:
        update["dtype"] = model.dtype
    return strategy.model_copy(update=update) if update else strategy
