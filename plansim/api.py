"""The public entry points notebooks and the CLI share: ``simulate`` and its engine registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from plansim.errors import PlansimError
from plansim.hardware import Cluster, load_hardware
from plansim.result import Result
from plansim.strategy import Strategy
from plansim.workload import ModelSpec, load_model
from plansim.yamlfile import validated

__all__ = ["ENGINES", "simulate"]


def _analytic(model: ModelSpec, cluster: Cluster, strategy: Strategy) -> Result:
    from plansim.analytic import simulate_analytic

    return simulate_analytic(model, cluster, strategy)


#: Engine name -> function(model, cluster, strategy) -> Result. The discrete-event engine registers as "des".
ENGINES: dict[str, Callable[[ModelSpec, Cluster, Strategy], Result]] = {"analytic": _analytic}


def _as_strategy(strategy: Strategy | str | Mapping[str, Any]) -> Strategy:
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str):
        return Strategy.parse(strategy)
    return validated(Strategy, dict(strategy), "strategy")


def simulate(
    model: ModelSpec | str | Path,
    hardware: Cluster | str | Path,
    strategy: Strategy | str | Mapping[str, Any],
    *,
    gpus: int | None = None,
    engine: str = "analytic",
) -> Result:
    """Predict one training step.

    Parameters
    ----------
    model : ModelSpec or str
        A model preset name (``plansim models``), a model YAML path, or a loaded spec.
    hardware : Cluster or str
        A node type (``plansim hardware``) or YAML path, sized by ``gpus``; or a loaded cluster.
    strategy : Strategy, str or mapping
        ``"dp=8,tp=2,pp=1,..."``, a strategy YAML path or shipped name, or a mapping of fields.
    gpus : int, optional
        Cluster size; defaults to dp*tp*pp when the strategy gives dp, else one node.
    engine : str
        A name in ``ENGINES``.

    Examples
    --------
    >>> r = simulate("gpt3-1.3b", "dgx-a100", "dp=8,micro_batch=2,global_batch=64,zero=1")
    >>> r.fits, r.gpus, 0 < r.mfu <= r.hfu <= 1
    (True, 8, True)
    """
    if engine not in ENGINES:
        raise PlansimError(f"engine '{engine}' is unknown: choose one of {', '.join(ENGINES)}")
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    strat = _as_strategy(strategy)
    if isinstance(hardware, Cluster):
        cluster = hardware
    else:
        if gpus is None and strat.dp is not None:
            gpus = strat.dp * strat.tp * strat.pp
        cluster = load_hardware(str(hardware), gpus=gpus)
    return ENGINES[engine](spec, cluster, strat)
