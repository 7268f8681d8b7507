"""The analytic engine: one training step in closed form.

step time = pipeline time (per-stage forward + backward + recompute + tensor-parallel and pipeline communication,
laid out by the schedule's closed form, bubble included) + exposed data-parallel/ZeRO communication (what the
overlap with backward does not hide) + the optimizer step. Memory is what each stage holds (``plansim.step.memory``:
model states, fixed buffers, and the activations' peak walked over the stage's passes, ``activation_peak``); the
worst stage is reported. Every cost comes from ``plansim.costs`` and the step model ``plansim.step``, which the
discrete-event engine reads too.

This module is the glue: a stage's closed form is ``stages``, the pipeline's ``pipeline``, the data-parallel plan's
``data_parallel``, the step's breakdown and result ``assemble``, and what strategies share ``cache``.
"""

from __future__ import annotations

from functools import partial

from plansim.analytic.assemble import StepFrame, assemble_result
from plansim.analytic.cache import AnalyticCache, PipelineKey, PricedLayers, StageMemoryKey
from plansim.analytic.pipeline import Pipeline, model_chunks, stage_layout
from plansim.analytic.stages import StageHeld, stage_cost
from plansim.costs.remat_policies import REMAT_POLICIES
from plansim.errors import PlansimError
from plansim.hardware import Cluster
from plansim.pipeline.stages import uneven_chunks
from plansim.remat.plan import StageRemat, milp_stage_plans
from plansim.result import Result
from plansim.step.data_parallel import grad_copy_in_bytes
from plansim.step.memory import activation_peak, offload_activations, offloaded_activations, with_grad_buffers
from plansim.step.offload import offloaded_blocks
from plansim.step.prepare import PreparedStep, tied_copy_params
from plansim.strategy.schema import Strategy
from plansim.workload.traced import Workload

__all__ = ["simulate_analytic", "step_frame"]


def simulate_analytic(
    model: Workload, cluster: Cluster, strategy: Strategy, *, cache: AnalyticCache | None = None
) -> Result:
    """Price one training step of ``model`` on ``cluster`` under ``strategy`` in closed form.

    Raises ``PlansimError`` when the strategy cannot run (each violation named); a strategy that runs but does not
    fit in memory is a result with ``fits=False`` and a reason. ``cache`` (for this model and cluster) shares the
    op graph and layer costs between calls. ``strategy`` as written or resolved (``Strategy.resolved``): it is
    resolved here, once, and everything below reads the resolved one.
    """
    return assemble_result(step_frame(model, cluster, strategy, cache=cache))


def step_frame(
    model: Workload, cluster: Cluster, strategy: Strategy, *, cache: AnalyticCache | None = None
) -> StepFrame:
    """``simulate_analytic`` up to its data-parallel traffic (``assemble.StepFrame``): each stage's memory, and the
    priced pipeline (built when first read: what does not fit needs none), with a lower bound on the step time.
    Raises ``PlansimError`` as ``simulate_analytic`` does."""
    s = strategy.resolved(cluster)
    shared = (cache if cache is not None and cache.model is model and cache.cluster is cluster else None) or (
        AnalyticCache(model, cluster)
    )
    problems = shared.problems(s)
    if problems:
        raise PlansimError("; ".join(problems))
    priced = shared.priced(s)
    scheduled = REMAT_POLICIES[s.remat].scheduled
    key = StageMemoryKey.of(s)
    prep = PreparedStep(s, priced.prep.graph, priced.prep.kernels)
    plans = milp_stage_plans(prep, cluster, model, priced.costs) if scheduled else {}
    held = priced.stage_memory.get(key) if not scheduled else None
    if held is None:
        held = _stages_held(model, s, priced, plans)
        if not scheduled:
            priced.stage_memory[key] = held
    return StepFrame.of(
        model,
        cluster,
        s,
        priced.model_flops,
        priced.prep.kernels,
        held,
        partial(_pipeline, model, cluster, s, priced, held, plans),
        shared,
        executed_flops=priced.executed_flops,
    )


def _stages_held(
    model: Workload, s: Strategy, priced: PricedLayers, plans: dict[int, StageRemat]
) -> tuple[StageHeld, ...]:
    """What each stage holds: its layers, their sums, its parameters (the tied embedding's copy on the last) and its
    activations' peak as its passes allocate and free them (``step.memory.activation_peak``; under ``remat: milp``
    as the stage's schedule ``plans`` keeps them), with the gradient buffers of each layer's reduction where its
    framework copies them (``step.data_parallel.grad_copy_in_bytes``; the output layer's with the tied copy)."""
    tied = tied_copy_params(model, s)
    chunks = model_chunks(model.layers, s.pp, s.virtual_stages, s.layer_split)
    per_param = grad_copy_in_bytes(s)
    offloaded = offloaded_blocks(s) > 0  # blocks whose activations go to the host
    out = []
    for idx, layers in enumerate(stage_layout(model.layers, s.pp, s.virtual_stages, s.layer_split)):
        sums = priced.sums(layers, model)
        params = sums.params + (tied if idx == s.pp - 1 else 0)
        own = priced.stage_chunks(chunks, s.pp, s.virtual_stages, idx)
        # what offloading reads of the stage's layers (whatever the strategy offloads: strategies that differ only
        # there share what is held); the offloaded blocks' activations off the GPU, into host memory
        offload = priced.offload_layers(layers, model.layers)
        host_activations = 0.0
        if offloaded:
            host_activations = sum(offloaded_activations(s, c, model.layers) for c in own)
            own = tuple(offload_activations(s, c, model.layers) for c in own)
        if any(per_param):
            extra = {model.layers: float(tied)} if idx == s.pp - 1 else {}
            held = {i: priced.costs[i].params + extra.get(i, 0.0) for c in own for i, _ in c}
            own = tuple(with_grad_buffers(c, held, per_param) for c in own)
        milp = (
            tuple((i, r.stored_bytes, r.rebuilt_bytes, r.recompute_s > 0) for i, r in plans[idx].layers.items())
            if plans
            else None
        )
        peak = activation_peak(s.remat, s.schedule, idx, s.pp, s.num_microbatches, s.virtual_stages, own,
                               model.layers, sums.layer_input, milp)  # fmt: skip
        out.append(StageHeld(sums, params, peak, offload, host_activations))
    return tuple(out)


def _pipeline(
    model: Workload,
    cluster: Cluster,
    s: Strategy,
    priced: PricedLayers,
    held: tuple[StageHeld, ...],
    plans: dict[int, StageRemat],
) -> Pipeline:
    """The stages of ``s``'s pipeline, priced from its layers' shared costs (``priced``) and what each stage holds
    (``held``); a pipeline's stages do not depend on ZeRO or the all-reduce, so strategies differing only there
    share them (unless remat is scheduled: ``plans``, each stage's schedule)."""
    key = PipelineKey.of(s)
    scheduled = bool(plans)
    pipe = priced.pipelines.get(key) if not scheduled else None
    if pipe is None:
        stages = []
        chunks = model_chunks(model.layers, s.pp, s.virtual_stages, s.layer_split)
        for idx, (stage, p2p) in enumerate(zip(held, priced.p2p_of(cluster, s), strict=True)):
            sums, params, peak = stage.sums, stage.params, stage.peak
            # each model chunk's layers with a cost, in backward order (an uneven split's chunks differ)
            sizes = tuple(len(c) for c in reversed(priced.stage_chunks(chunks, s.pp, s.virtual_stages, idx)))
            if scheduled:
                stages.append(stage_cost(sums, s.remat, p2p, params, peak, plans[idx], chunks=sizes, first=idx == 0))
                continue
            stage_key = (sums, s.remat, p2p, params, peak, sizes, idx == 0)
            cost = priced.stage_costs.get(stage_key)
            if cost is None:
                cost = priced.stage_costs[stage_key] = stage_cost(
                    sums, s.remat, p2p, params, peak, chunks=sizes, first=idx == 0
                )
            stages.append(cost)
        pipe = Pipeline.of(stages, s, uneven_chunks(model.layers, s.pp, s.virtual_stages, s.layer_split))
        if not scheduled:
            priced.pipelines[key] = pipe
    return pipe
