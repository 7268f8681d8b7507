"""A strategy against a traced module (``plansim.workload.torch_trace.TracedModel``): what the trace fixes (tp 1,
its batch as the micro-batch, its dtype; ``plansim.workload.traced`` says why) checked, and filled in where the
strategy leaves it out."""

from __future__ import annotations

from plansim.strategy.schema import Strategy
from plansim.workload.torch_trace import TracedModel
from plansim.workload.traced import Workload

__all__ = ["traced_problems", "with_traced_defaults"]

_PRICED_DTYPES = ("fp32", "fp16", "bf16")


def traced_problems(s: Strategy, model: TracedModel) -> list[str]:
    """Every way the resolved strategy ``s`` does not fit the trace of ``model``; each message names the field and
    the fix.

    >>> from plansim.strategy.schema import Strategy
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
    if s.cp > 1:
        problems.append(
            f"cp={s.cp}: a traced model runs with cp=1 only: its graph was traced on whole sequences: use dp or pp "
            "(or a model preset or YAML file)"
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

    >>> from plansim.strategy.schema import Strategy
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
