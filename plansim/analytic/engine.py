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

from plansim.analytic.assemble import assemble_result
from plansim.analytic.cache import AnalyticCache, PipelineKey, PricedLayers
from plansim.analytic.pipeline import Pipeline, model_chunks, stage_layout
from plansim.analytic.stages import stage_cost
from plansim.costs.remat_policies import REMAT_POLICIES
from plansim.errors import PlansimError
from plansim.hardware import Cluster
from plansim.remat.plan import milp_stage_plans
from plansim.result import Result
from plansim.step.memory import activation_peak
from plansim.step.prepare import PreparedStep, tied_copy_params
from plansim.strategy.schema import Strategy
from plansim.workload.traced import Workload

__all__ = ["simulate_analytic"]


def simulate_analytic(
    model: Workload, cluster: Cluster, strategy: Strategy, *, cache: AnalyticCache | None = None
) -> Result:
    """Price one training step of ``model`` on ``cluster`` under ``strategy`` in closed form.

    Raises ``PlansimError`` when the strategy cannot run (each violation named); a strategy that runs but does not
    fit in memory is a result with ``fits=False`` and a reason. ``cache`` (for this model and cluster) shares the
    op graph and layer costs between calls. ``strategy`` as written or resolved (``Strategy.resolved``): it is
    resolved here, once, and everything below reads the resolved one.
    """
    s = strategy.resolved(cluster)
    shared = (cache if cache is not None and cache.model is model and cache.cluster is cluster else None) or (
        AnalyticCache(model, cluster)
    )
    problems = shared.problems(s)
    if problems:
        raise PlansimError("; ".join(problems))
    priced = shared.priced(s)
    return assemble_result(
        model,
        cluster,
        s,
        priced.model_flops,
        priced.prep.kernels,
        _pipeline(model, cluster, s, priced),
        shared,
        kernel_recompute=priced.kernel_recompute_flops,
    )


def _pipeline(model: Workload, cluster: Cluster, s: Strategy, priced: PricedLayers) -> Pipeline:
    """The stages of ``s``'s pipeline, priced from its layers' shared costs (``priced``); a pipeline's stages do not
    depend on ZeRO or the all-reduce, so strategies differing only there share them (unless remat is scheduled)."""
    prep = PreparedStep(s, priced.prep.graph, priced.prep.kernels)
    key = PipelineKey.of(s)
    scheduled = REMAT_POLICIES[s.remat].scheduled
    pipe = priced.pipelines.get(key) if not scheduled else None
    if pipe is None:
        plans = milp_stage_plans(prep, cluster, model, priced.costs) if scheduled else {}
        tied = tied_copy_params(model, s)
        chunks = model_chunks(model.layers, s.pp, s.virtual_stages, s.layer_split)
        stages = []
        for idx, (layers, p2p) in enumerate(
            zip(
                stage_layout(model.layers, s.pp, s.virtual_stages, s.layer_split),
                priced.p2p_of(cluster, s),
                strict=True,
            )
        ):
            sums = priced.sums(layers, model)
            params = sums.params + (tied if idx == s.pp - 1 else 0)
            own = priced.stage_chunks(chunks, s.pp, s.virtual_stages, idx)
            milp = (
                tuple((i, r.stored_bytes, r.rebuilt_bytes, r.recompute_s > 0) for i, r in plans[idx].layers.items())
                if scheduled
                else None
            )
            # the activations' peak as the stage's passes allocate and free them (step.memory.activation_peak)
            peak = activation_peak(s.remat, s.schedule, idx, s.pp, s.num_microbatches, s.virtual_stages, own,
                                   model.layers, sums.layer_input, milp)  # fmt: skip
            if scheduled:
                stages.append(
                    stage_cost(sums, s.remat, p2p, params, peak, plans[idx], chunks=s.virtual_stages, first=idx == 0)
                )
                continue
            stage_key = (sums, s.remat, p2p, params, peak, s.virtual_stages, idx == 0)
            stage = priced.stage_costs.get(stage_key)
            if stage is None:
                stage = priced.stage_costs[stage_key] = stage_cost(
                    sums, s.remat, p2p, params, peak, chunks=s.virtual_stages, first=idx == 0
                )
            stages.append(stage)
        pipe = Pipeline.of(stages, s)
        if not scheduled:
            priced.pipelines[key] = pipe
    return pipe
