"""The public entry points notebooks and the CLI share: ``simulate`` and its engine registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from plansim.arguments import choice, mapping, name_or_path, names, type_name
from plansim.errors import PlansimError, shown
from plansim.hardware import Cluster, load_hardware
from plansim.limits import number, whole
from plansim.result import Result
from plansim.strategy.mesh import REPLICA_AXES
from plansim.strategy.schema import Strategy, StrategyInput, read_strategy
from plansim.strategy.traced import with_traced_defaults
from plansim.workload import ModelSpec, TracedModel, load_model, with_moe_imbalance, with_seq_len
from plansim.workload.traced import Workload

__all__ = ["ENGINES", "as_cluster", "as_model", "as_strategy", "as_strategy_input", "run_model", "simulate"]


def _analytic(model: Workload, cluster: Cluster, strategy: Strategy, **options: Any) -> Result:
    from plansim.analytic.engine import simulate_analytic

    if options:
        raise PlansimError(
            f"{', '.join(sorted(options))}: only the discrete-event engine takes these: add engine='des' (--engine des)"
        )
    return simulate_analytic(model, cluster, strategy)


def _des(model: Workload, cluster: Cluster, strategy: Strategy, **options: Any) -> Result:
    from plansim.des.engine import WhatIf, simulate_des

    mode = options.pop("mode", "symmetric")
    # simulate_des reads a model's name and seq_len and hands it to plansim.des.lower, which takes a TracedModel too
    return simulate_des(cast(ModelSpec, model), cluster, strategy, mode=mode, what_if=WhatIf(**options))


#: Engine name -> function(model, cluster, strategy, **options) -> Result. Options are the discrete-event engine's
#: mode and what-ifs (see ``simulate``).
ENGINES: dict[str, Callable[..., Result]] = {"analytic": _analytic, "des": _des}


def as_strategy(strategy: Strategy | str | Mapping[str, Any]) -> Strategy:
    """A Strategy from a Strategy, inline ``key=value`` text, a YAML path or shipped name, or a mapping of fields
    (one holding the run's ``seq_len`` is refused: ``as_strategy_input`` reads both)."""
    return as_strategy_input(strategy).alone()


def as_strategy_input(strategy: Strategy | str | Mapping[str, Any]) -> StrategyInput:
    """``as_strategy``'s strategy with the run's ``seq_len`` its text, file or mapping holds beside it
    (``plansim.strategy.schema.read_strategy``)."""
    if isinstance(strategy, Strategy):
        return StrategyInput(strategy)
    if isinstance(strategy, str | Path | Mapping):
        return read_strategy(strategy)
    raise PlansimError(
        f"strategy: expected 'dp=8,tp=2,...' text, a strategy file or name, a mapping of fields or a Strategy, "
        f"got {type_name(strategy)}"
    )


def as_model(model: object) -> ModelSpec | TracedModel:
    """A loaded model, or one loaded from a preset name or a file (``load_model``)."""
    if isinstance(model, ModelSpec | TracedModel):
        return model
    return load_model(name_or_path(model, "model (--model)", "a preset name, a model file or a ModelSpec"))


def run_model(
    model: object, seq_len: object = None, given: Sequence[StrategyInput] = (), moe_imbalance: object = None
) -> ModelSpec | TracedModel:
    """The model a run prices: loaded (``as_model``) at the run's sequence length, ``seq_len`` (``--seq-len``) or
    else the one the strategies ``given`` hold (``seq_len:`` in their files or texts), else the model's own
    (``plansim.workload.with_seq_len``: the one place the length reaches the model). A length given twice must be
    the same: two that differ are refused in one line, as neither can be the one meant. ``moe_imbalance``
    (``--moe-imbalance``) sets a mixture of experts' routing imbalance the same way
    (``plansim.workload.with_moe_imbalance``; refused for a model without routed experts).

    >>> run_model("llama2-7b", 8192).seq_len
    8192
    >>> run_model("llama2-7b", 8192, [read_strategy("dp=8,seq_len=2048")])
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: --seq-len 8192 and seq_len 2048 in strategy differ: give the run's length once, or \
make them agree
    """
    # each length given: (value, how a message says it, the option with_seq_len names)
    lengths = [
        (g.seq_len, f"seq_len {g.seq_len} in {g.source}", f"{g.source}: seq_len")
        for g in given
        if g.seq_len is not None
    ]
    if seq_len is not None:
        n = whole(seq_len, "seq_len", "--seq-len")
        lengths.insert(0, (n, f"--seq-len {n}", "--seq-len"))
    for n, said, _ in lengths[1:]:
        if n != lengths[0][0]:
            raise PlansimError(f"{lengths[0][1]} and {said} differ: give the run's length once, or make them agree")
    spec = with_moe_imbalance(as_model(model), moe_imbalance)
    if not lengths:
        return spec
    n, _, option = lengths[0]
    return with_seq_len(spec, n, option)


def as_cluster(hardware: object, gpus: int | None) -> Cluster:
    """A loaded cluster, or one of ``gpus`` GPUs loaded from a node type or a file (``load_hardware``)."""
    if isinstance(hardware, Cluster):
        return hardware
    what = "a node type (plansim hardware), a hardware file or a Cluster"
    return load_hardware(name_or_path(hardware, "hardware (--hardware)", what), gpus=gpus)


def _what_ifs(
    stragglers: object, link_factors: object, failed_links: object, jitter: object, seed: object
) -> dict[str, Any]:
    """The discrete-event engine's what-ifs, checked (``plansim.limits``), those given only."""
    slow = {
        whole(rank, "rank", "--straggler rank"): number(factor, "straggler_factor", f"--straggler {shown(rank)}=")
        for rank, factor in mapping(stragglers, "stragglers (--straggler)").items()
    }
    links = {
        _link_name(link): number(factor, "link_factor", f"--degrade-link {shown(link)}=")
        for link, factor in mapping(link_factors, "link_factors (--degrade-link)").items()
    }
    given = {
        "stragglers": slow or None,
        "link_factors": links or None,
        "failed_links": names(failed_links, "failed_links (--fail-link)") or None,
        "jitter": None if jitter is None else number(jitter, "jitter", "--jitter"),
        "seed": None if seed is None else whole(seed, "seed", "--seed"),
    }
    return {k: v for k, v in given.items() if v is not None}


def _link_name(link: object) -> str:
    """A key of ``link_factors``: one link's name (a string), never None, a number or a list of names."""
    if not isinstance(link, str) or not link:
        raise PlansimError(
            f"link_factors (--degrade-link): each key is a link's name such as 'node0/nic0', got {type_name(link)}"
        )
    return link


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
    seq_len: int | None = None,
    framework: str | None = None,
    moe_imbalance: float | None = None,
    moe_imbalance_spread: float | None = None,
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
        ``"dp=8,tp=2,pp=1,..."``, a strategy YAML path or shipped name, or a mapping of fields; its text, file or
        mapping may hold the run's ``seq_len`` too (see ``seq_len``).
    gpus : int, optional
        Cluster size; defaults to dp*tp*cp*pp when the strategy gives dp, else one node.
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
    seq_len : int, optional
        Tokens per sequence the run trains at, overriding the model's (``run_model``): a preset's, a model file's,
        or a ``config.json``'s context length, which is often longer than the trained one. A ``seq_len`` in the
        strategy's file or text does the same; given in both, the two must agree. Refused for a traced module at
        another length, a model without sequences (``cnn``), or beyond a learned position table's rows.
    framework : str, optional
        Run the strategy as this framework does (``frameworks/``: its ``framework`` field replaced).
    moe_imbalance : float, optional
        A mixture of experts' routing imbalance, >= 1: the routed tokens the busiest expert-parallel rank receives
        over the mean (default the model's, 1.0: balanced), which the step runs at the pace of
        (``plansim.workload.moe``). Refused for a model without routed experts.
    moe_imbalance_spread : float, optional
        ``des`` only: sample the imbalance per micro-batch and pipeline stage (seeded by ``seed``), its excess over
        1 log-normal with this standard deviation of the log and mean ``moe_imbalance - 1``
        (``plansim.des.engine.WhatIf``).

    Raises
    ------
    PlansimError
        Any bad argument, with the CLI's one-line message naming it and the fix, before any work: a wrong kind
        (``strategy=None``), a number outside its range (``docs/limits.md``: ``gpus=10**12``, ``jitter=nan``), an
        unknown name, a strategy that cannot run, or a discrete-event run above its work bound.

    Examples
    --------
    >>> r = simulate("gpt3-1.3b", "dgx-a100", "dp=8,micro_batch=2,global_batch=64,zero=1")
    >>> r.fits, r.gpus, 0 < r.mfu <= r.hfu <= 1
    (True, 8, True)
    >>> short = simulate("gpt3-1.3b", "dgx-a100", "dp=8,micro_batch=2,global_batch=64,zero=1", seq_len=1024)
    >>> short.step_time_s < r.step_time_s / 2  # half the tokens per step, and attention over half the length
    True
    """
    choice(engine, ENGINES, "engine", quoted=True)
    if mode is not None:
        from plansim.des.engine import MODES

        choice(mode, MODES, "mode", quoted=True)
    if gpus is not None:
        gpus = whole(gpus, "gpus", "--gpus")
    options = _what_ifs(stragglers, link_factors, failed_links, jitter, seed)
    if moe_imbalance_spread is not None:
        options["moe_imbalance_spread"] = number(moe_imbalance_spread, "moe_imbalance_spread", "--moe-imbalance-spread")
    if mode is not None:
        options["mode"] = mode
    if framework is not None:
        from plansim.strategy.frameworks import load_framework

        load_framework(framework)  # one line naming the known ones if it is not
    given = as_strategy_input(strategy)
    spec = run_model(model, seq_len, [given], moe_imbalance)
    strat = given.strategy if framework is None else given.strategy.model_copy(update={"framework": framework})
    strat = with_traced_defaults(strat, spec)
    if gpus is None and strat.dp is not None and not isinstance(hardware, Cluster):
        gpus = whole(strat.num_gpus, "gpus", f"strategy: {'*'.join(('dp', *REPLICA_AXES))} =")
    return ENGINES[engine](spec, as_cluster(hardware, gpus), strat, **options)
