"""A traced module (``plansim.workload.torch_trace.TracedModel``) as a workload both engines price, under data and
pipeline parallelism.

Both engines start from the op graph of one micro-batch on one tensor-parallel rank (``step.prepare.prepare_step``)
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
(``plansim.pipeline.stages``); per-layer costs from ``plansim.step.layers``; remat from the ops' ``saved_bytes`` and
``selective_recompute`` flags (``plansim.costs.memory``), full and sqrt(N) keeping ``layer_input_bytes`` per block,
the first block's input, which is exact for a stack of like blocks (a transformer) and an approximation for blocks of
different widths, as is the pipeline message, also that size; with ``pp > 1`` the last stage holds a copy of the
``tied_params`` and their gradients are all-reduced with the first stage's (Megatron-LM's tied embeddings).
"""

from __future__ import annotations

from typing import TypeAlias

from plansim.workload.spec import ModelSpec
from plansim.workload.torch_trace import TracedModel

__all__ = ["Workload"]

#: What the engines price: a model spec (op graph built per strategy) or a traced module (its graph as traced).
Workload: TypeAlias = ModelSpec | TracedModel
