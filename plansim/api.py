"""The public entry points notebooks and the CLI share: ``simulate`` and its engine registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from plansim.errors import PlansimError
from plansim.hardware import Cluster, load_hardware
from plansim.result import Result
from plansim.strategy import Strategy
from plansim.workload import ModelSpec, TracedModel, load_model
from plansim.workload.traced import Workload, with_traced_defaults
from plansim.yamlfile import validated

__all__ = ["ENGINES", "as_strategy", "simulate"]


def _analytic(model: Workload, cluster: Cluster, strategy: Strategy, **options: Any) -> Result:
    from plansim.analytic import simulate_analytic

    if options:
        raise PlansimError(
            f"{', '.join(sorted(options))}: only the discrete-event engine takes these: add engine='des' (--engine des)"
        )
    return simulate_analytic(model, cluster, strategy)


def _des(model: Workload, cluster: Cluster, strategy: Strategy, **options: Any) -> Result:
    from plansim.sim.engine import WhatIf, simulate_des

    mode = options.pop("mode", "symmetric")
    # simulate_des reads a model's name and seq_len and hands it to plansim.lower, which takes a TracedModel too
    return simulate_des(cast(ModelSpec, model), cluster, strategy, mode=mode, what_if=WhatIf(**options))


#: Engine name -> function(model, cluster, strategy, **options) -> Result. Options are the discrete-event engine's
#: mode and what-ifs (see ``simulate``).
ENGINES: dict[str, Callable[..., Result]] = {"analytic": _analytic, "des": _des}


def as_strategy(strategy: Strategy | str | Mapping[str, Any]) -> Strategy:
    """A Strategy from a Strategy, inline ``key=value`` text, a YAML path or shipped name, or a mapping of fields."""
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str):
        return Strategy.parse(strategy)
    return validated(Strategy, dict(strategy), "strategy")


def simulate(
    model: ModelSpec | TracedModel | str | Path,
    hardware: Cluster | str | Path,
    strategy: Strategy | str | Mapping[str, Any],
    *,
    gpus: int | None = None,
    engine: str = "analytic",
    mode: str | None = None,
    stragglers: Mapping[int, float] | None = None,
    link_factors: Mapping[str, float] | None = None,
    failed_links: Sequence[str] = (),
    jitter: float | None = None,
    seed: int | None = None,
) -> Result:
    """Predict one training step.

    Parameters
    ----------
    model : ModelSpec, TracedModel or str
        A model preset name (``plansim models``), a model YAML path, a loaded spec, or a traced module
        (``load_model(module, inputs=...)``; tp=1, its traced batch as micro-batch and its dtype, both filled in
        when the strategy leaves them out: see ``plansim.workload.traced``).
    hardware : Cluster or str
        A node type (``plansim hardware``) or YAML path, sized by ``gpus``; or a loaded cluster.
    strategy : Strategy, str or mapping
        ``"dp=8,tp=2,pp=1,..."``, a strategy YAML path or shipped name, or a mapping of fields.
    gpus : int, optional
        Cluster size; defaults to dp*tp*pp when the strategy gives dp, else one node.
    engine : str
        A name in ``ENGINES``: ``analytic`` (closed form) or ``des`` (discrete-event simulation).
    mode : str, optional
        ``des`` only: ``symmetric`` (one simulated rank per pipeline stage, default) or ``full`` (every rank).
    stragglers : mapping, optional
        ``des`` only: rank -> slowdown factor of that GPU's kernels (1.5 = 50% slower).
    link_factors : mapping, optional
        ``des`` only: link selector (a topology vertex such as ``node0/nic0``, or an edge ``u--v``) -> bandwidth
        factor.
    failed_links : sequence of str
        ``des`` only: link selectors removed from the topology; traffic is rerouted around them.
    jitter, seed : optional
        ``des`` only: log-normal noise on kernel times (standard deviation of the log) and its random seed.

    Examples
    --------
    >>> r = simulate("gpt3-1.3b", "dgx-a100", "dp=8,micro_batch=2,global_batch=64,zero=1")
    >>> r.fits, r.gpus, 0 < r.mfu <= r.hfu <= 1
    (True, 8, True)
    """
    if engine not in ENGINES:
        raise PlansimError(f"engine '{engine}' is unknown: choose one of {', '.join(ENGINES)}")
    spec = model if isinstance(model, ModelSpec | TracedModel) else load_model(model)
    strat = with_traced_defaults(as_strategy(strategy), spec)
    if isinstance(hardware, Cluster):
        cluster = hardware
    else:
        if gpus is None and strat.dp is not None:
            gpus = strat.dp * strat.tp * strat.pp
        cluster = load_hardware(str(hardware), gpus=gpus)
    options: dict[str, Any] = {
        k: v
        for k, v in (
            ("mode", mode),
            ("stragglers", dict(stragglers) if stragglers else None),
            ("link_factors", dict(link_factors) if link_factors else None),
            ("failed_links", tuple(failed_links) or None),
            ("jitter", jitter),
            ("seed", seed),
        )
        if v is not None
    }
    return ENGINES[engine](spec, cluster, strat, **options)
