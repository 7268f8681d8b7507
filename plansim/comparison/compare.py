"""Compare strategies and hardware for one model: every (hardware, strategy) pair simulated, as one DataFrame, and
optionally scaling curves (throughput against GPU count). ``plansim compare`` prints and charts what this returns
(``plansim.comparison.output``, ``report.compare_charts``). With ``frameworks``, each strategy runs under each
framework, side by side; a run a framework cannot run is listed with the reason (``Comparison.refused``), not
simulated.

Scaling: a run's strategy keeps its tp, pp, micro-batch and schedule, and dp follows the GPU count. With
``scaling_batch="fixed"`` (strong scaling, the default: the same job on more GPUs) the global batch stays, so each
replica runs fewer micro-batches and the pipeline bubble grows; with ``"per-replica"`` (weak scaling, as Narayanan
et al. 2021 sec 5.1 report throughput) the micro-batches per replica stay and the global batch grows with dp. GPU
counts that cannot run the strategy (tp x pp does not divide them, or the batch does not split) are reported with
the reason, not simulated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plansim.api import ENGINES, as_strategy_input, run_model
from plansim.arguments import callback, choice, type_name
from plansim.describe import describe
from plansim.errors import PlansimError
from plansim.hardware import Cluster, load_hardware, resize
from plansim.hardware.topology import link_tier
from plansim.limits import whole
from plansim.planner.search import OBJECTIVES
from plansim.result import Result
from plansim.step.result import MEMORY_CATEGORIES
from plansim.strategy.frameworks import framework_names
from plansim.strategy.mesh import REPLICA_AXES, ranks_of
from plansim.strategy.schema import Strategy
from plansim.workload import ModelSpec

__all__ = ["COMPARE_OBJECTIVES", "SCALING_BATCH", "Comparison", "Run", "ScalingPoint", "compare", "scaled_strategy"]

#: How the global batch follows the GPU count in scaling curves (see the module docstring).
SCALING_BATCH = ("fixed", "per-replica")
#: What ``compare`` ranks runs by: the planner's objective names (``planner.search.OBJECTIVES``). Runs may differ in
#: global batch and GPU count, so these do not agree as they do in a plan: tokens/s (the default) is the training
#: throughput, ``step_time`` the time of one step whatever it holds, ``cost`` the GPU-seconds per token.
COMPARE_OBJECTIVES = ("tokens_per_s", "step_time", "cost")


@dataclass(frozen=True)
class Run:
    """One compared configuration: its label, hardware, the strategy as run and the engine's result."""

    label: str
    cluster: Cluster
    strategy: Strategy
    result: Result

    @property
    def hardware(self) -> str:
        """The node type's name."""
        return self.cluster.node.name

    @property
    def memory_capacity_bytes(self) -> float:
        """One GPU's memory."""
        return self.cluster.gpu.memory_bytes

    def tier_bytes(self) -> dict[str, float]:
        """Bytes per step on the busiest link of each tier (``link_tier``): the discrete-event engine's link
        traffic; empty for the analytic engine, which does not route traffic over links."""
        timeline = self.result.timeline
        if timeline is None:
            return {}
        out: dict[str, float] = {}
        for link, n_bytes in timeline.link_bytes.items():
            tier = link_tier(self.cluster.node, link)
            out[tier] = max(out.get(tier, 0.0), n_bytes)
        return out

    def port_bytes(self) -> dict[str, float]:
        """Bytes per step through the busiest port of each tier: ``tier_bytes`` with a link between switches (the
        topology's trunk of ports, ``hardware.topology``: its bandwidth is the tier's port bandwidth times its
        ports) divided by its ports, its traffic taken as spread evenly over them, as the engine's single trunk link
        models it; a GPU's NVLink or PCIe connection, a NIC's and a NIC's leaf port count as one port. Empty for
        the analytic engine."""
        timeline = self.result.timeline
        if timeline is None:
            return {}
        graph = self.cluster.topology
        port_Bps = {t.name: t.bandwidth_Bps for t in self.cluster.node.fabric}
        out: dict[str, float] = {}
        for link, n_bytes in timeline.link_bytes.items():
            tier = link_tier(self.cluster.node, link)
            ports = 1
            if tier in port_Bps:
                u, v = link.split("->")
                ports = max(1, round(graph.edges[u, v]["bandwidth_Bps"] / port_Bps[tier]))
            out[tier] = max(out.get(tier, 0.0), n_bytes / ports)
        return out


@dataclass(frozen=True)
class ScalingPoint:
    """One run's strategy at one GPU count: the result, or why it was not simulated."""

    label: str
    gpus: int
    result: Result | None
    reason: str = ""


@dataclass
class Comparison:
    """The runs of ``compare`` (in the order given: hardware outermost) and their scaling points."""

    model: str
    engine: str
    runs: list[Run]
    scaling: list[ScalingPoint] = field(default_factory=list)
    scaling_batch: str = "fixed"
    objective: str = "tokens_per_s"
    #: (label, why) of each run a framework refuses (``compare(..., frameworks=...)``): the others still run
    refused: list[tuple[str, str]] = field(default_factory=list)
    #: The run's sequence length where one was given (``compare(seq_len=)``, or ``seq_len`` in the strategies'
    #: files), overriding the model's; None: the model's own.
    seq_len: int | None = None

    def frame(self) -> Any:
        """One pandas row per run: label, hardware, GPUs, global batch, engine, step time, tokens/s, MFU, fit, peak
        memory and capacity, memory by category (``mem_*_bytes``), comm per GPU by kind (``comm_*_bytes``), the time
        breakdown (``time_*_s``), bytes on the busiest link of each tier (``tier_*_bytes``, DES only) and through
        its busiest port (``port_*_bytes``, ``Run.port_bytes``) and the strategy's fields (``strategy.*``)."""
        import pandas as pd

        rows = []
        for run in self.runs:
            r = run.result
            rows.append(
                {
                    "label": run.label,
                    "hardware": run.hardware,
                    "gpus": r.gpus,
                    "global_batch": run.strategy.batch,
                    "engine": r.engine,
                    "step_time_s": r.step_time_s,
                    "tokens_per_s": r.tokens_per_s,
                    "mfu": r.mfu,
                    "fits": r.fits,
                    "peak_memory_bytes": r.peak_memory_bytes,
                    "memory_capacity_bytes": run.memory_capacity_bytes,
                    "bubble_fraction": r.bubble_fraction,
                    **{f"mem_{k}_bytes": r.memory_breakdown_bytes.get(k, 0) for k in MEMORY_CATEGORIES},
                    **{f"comm_{k}_bytes": v for k, v in r.comm_bytes_per_gpu.items()},
                    **{f"time_{k}_s": v for k, v in r.time_breakdown_s.items()},
                    **{f"tier_{k}_bytes": v for k, v in run.tier_bytes().items()},
                    **{f"port_{k}_bytes": v for k, v in run.port_bytes().items()},
                    **{f"strategy.{k}": v for k, v in run.strategy.model_dump().items()},
                }
            )
        return pd.DataFrame(rows)

    def scaling_rows(self) -> list[dict[str, Any]]:
        """One dict per scaling point: label, curve (``curve_names``), GPUs, global batch, micro-batches per
        replica, engine, step time, tokens/s, MFU, fit (None where the point did not run), and the reason a point
        was not simulated."""
        rows = []
        curves = self.curve_names()
        for p in self.scaling:
            r = p.result
            rows.append(
                {
                    "label": p.label,
                    "curve": curves.get(p.label, p.label),
                    "gpus": p.gpus,
                    "global_batch": None if r is None else r.strategy["global_batch"],
                    "microbatches": None if r is None else r.num_microbatches,
                    "engine": None if r is None else r.engine,
                    "step_time_s": None if r is None else r.step_time_s,
                    "tokens_per_s": None if r is None else r.tokens_per_s,
                    "mfu": None if r is None else r.mfu,
                    "fits": None if r is None else r.fits,
                    "reason": p.reason or ("" if r is None or r.fits else r.reason),
                }
            )
        return rows

    def scaling_frame(self) -> Any:
        """``scaling_rows`` as a pandas DataFrame (NaN where a point did not run)."""
        import pandas as pd

        return pd.DataFrame(self.scaling_rows())

    def curve_names(self) -> dict[str, str]:
        """Run label -> the name of its scaling curve, by what stays fixed along it: the strategy without dp (which
        follows the GPU count), then the global batch (``scaling_batch="fixed"``) or the micro-batches per replica,
        the hardware when several are compared, and a strategy file's name first.

        >>> c = compare("gpt3-125m", ["dp=2,micro_batch=2,global_batch=16"], engine="analytic")
        >>> c.curve_names()
        {'dp2 tp1 pp1 mb2 zero0 remat=none nccl': 'tp1 pp1 mb2 zero0 remat=none nccl, global batch 16'}
        """
        names: dict[str, str] = {}
        several = len({r.hardware for r in self.runs}) > 1
        for run in self.runs:
            s = run.strategy
            text = describe(s)
            held = describe(s.model_copy(update={"dp": max(2, s.dp or 1)})).split(" ", 1)[1]  # dp > 1: algorithm shown
            held += f", global batch {s.batch}" if self.scaling_batch == "fixed" else (
                f", {s.num_microbatches} micro-batches per replica"
            )  # fmt: skip
            name = run.label.split(" @ ")[0].split(" #")[0]
            if name != text:  # a strategy file's or shipped strategy's name
                held = f"{name}: {held}"
            if several:
                held += f" @ {run.hardware}"
            k, unique = 2, held
            while unique in names.values():
                unique, k = f"{held} #{k}", k + 1
            names[run.label] = unique
        return names

    def fastest(self) -> Run | None:
        """The run that fits with the shortest step (None if none does), whatever its batch: ``best`` ranks."""
        fitting = [r for r in self.runs if r.result.fits]
        return min(fitting, key=lambda r: r.result.step_time_s) if fitting else None

    def ranked(self) -> list[Run]:
        """The runs that fit, best first by ``objective`` (ties in the order given)."""
        key = OBJECTIVES[self.objective]
        fitting = [(key(r.result), k, r) for k, r in enumerate(self.runs) if r.result.fits]
        return [r for *_, r in sorted(fitting, key=lambda t: t[:2])]

    def best(self) -> Run | None:
        """The best run that fits by ``objective`` (None if none does)."""
        ranked = self.ranked()
        return ranked[0] if ranked else None


def compare(
    model: ModelSpec | str | Path,
    strategies: Sequence[Strategy | str | Mapping[str, Any]],
    hardware: Sequence[Cluster | str] = ("dgx-a100",),
    *,
    gpus: int | None = None,
    engine: str = "des",
    scaling_gpus: Sequence[int] = (),
    scaling_engine: str = "analytic",
    scaling_batch: str = "fixed",
    objective: str = "tokens_per_s",
    progress: Callable[[str], None] | None = None,
    frameworks: Sequence[str] = (),
    seq_len: int | None = None,
    moe_imbalance: float | None = None,
) -> Comparison:
    """Simulate every strategy on every hardware profile for ``model`` (and each at ``scaling_gpus``).

    ``gpus`` sizes every cluster; without it each strategy's GPUs (``Strategy.num_gpus``: dp x tp x cp x pp) do (or
    one node when dp is left out). ``frameworks`` runs each strategy under each of these frameworks
    (``strategy.frameworks``), side by side, each run labelled with its framework; without them each strategy runs
    under its own ``framework``.
    ``progress(label)`` is called before each simulation. One string is one strategy (or node type).
    ``seq_len`` prices the model at that many tokens per sequence instead of its own (``plansim.api.run_model``); a
    strategy's file or text may give ``seq_len`` instead. Every run of a comparison is at one length: lengths that
    differ (``seq_len`` and a file's, or two files') are refused. ``moe_imbalance`` sets a mixture of experts'
    routing imbalance (``plansim.api.simulate``) for every run.

    Raises ``PlansimError`` with the CLI's one-line message for any bad argument, before the first simulation.

    Examples
    --------
    >>> c = compare("gpt3-1.3b", ["dp=8,micro_batch=2,global_batch=64", "dp=4,tp=2,micro_batch=2,global_batch=64"],
    ...             engine="analytic")
    >>> [r.label for r in c.runs]
    ['dp8 tp1 pp1 mb2 zero0 remat=none nccl', 'dp4 tp2 pp1 mb2 zero0 remat=none nccl']
    >>> list(c.frame()["gpus"])
    [8, 8]
    """
    for name, value in (("--engine", engine), ("--scaling-engine", scaling_engine)):
        choice(value, ENGINES, name)
    strategies = _listed(strategies, (str, Path, Strategy, Mapping), "--strategy")
    hardware = _listed(hardware, (str, Path, Cluster), "--hardware")
    if not strategies:
        raise PlansimError("--strategy: give at least one strategy to compare")
    if not hardware:
        raise PlansimError("--hardware: give at least one hardware profile")
    if gpus is not None:
        gpus = whole(gpus, "gpus", "--gpus")
    choice(objective, COMPARE_OBJECTIVES, "--objective")
    choice(scaling_batch, SCALING_BATCH, "--scaling-batch")
    scaling = [scaling_gpus] if isinstance(scaling_gpus, int) else scaling_gpus
    if not isinstance(scaling, list | tuple | range):
        raise PlansimError(f"--scaling: expected a list of GPU counts, got {type_name(scaling)}")
    scaling_gpus = [whole(g, "gpus", "--scaling") for g in scaling]
    callback(progress, "progress")
    given = [as_strategy_input(s) for s in strategies]
    spec = run_model(model, seq_len, given, moe_imbalance)
    if not isinstance(spec, ModelSpec):
        raise PlansimError("model: compare takes a ModelSpec (a preset, a model file), not a traced module")
    parsed = [(g.strategy, _name(s)) for g, s in zip(given, strategies, strict=True)]
    under = _listed(frameworks, (str,), "--framework")
    for name in under:
        choice(name, framework_names(), "--framework")
    if under:
        parsed = [(s.model_copy(update={"framework": f}), n) for s, n in parsed for f in dict.fromkeys(under)]
    runs: list[Run] = []
    refused: list[tuple[str, str]] = []
    for hw in hardware:
        for strategy, file_name in parsed:
            cluster = _cluster(hw, gpus, strategy)
            if file_name:
                name = f"{file_name} under {strategy.framework}" if under else file_name
            else:
                name = describe(strategy.resolve(cluster), framework=bool(under))
            label = _label(name, cluster, len(hardware) > 1, runs)
            if progress:
                progress(label)
            try:
                result = ENGINES[engine](spec, cluster, strategy)
            except PlansimError as err:
                if not under:
                    raise
                refused.append((label, str(err)))  # the framework cannot run it: say so beside the others
                continue
            run = Run(label, cluster, strategy.resolve(cluster), result)
            runs.append(run)
    if not runs:
        raise PlansimError(refused[0][1])
    length = None if seq_len is None and not any(g.seq_len for g in given) else spec.seq_len
    out = Comparison(
        spec.name, engine, runs, scaling_batch=scaling_batch, objective=objective, refused=refused, seq_len=length
    )
    for run in runs:
        for g in scaling_gpus:
            if progress:
                progress(f"{run.label} on {g} GPUs")
            out.scaling.append(_scaling_point(spec, run, g, scaling_engine, scaling_batch))
    return out


def _listed(values: object, kinds: tuple[type, ...], option: str) -> list[Any]:
    """``values`` as a list: one value of ``kinds`` is a list of one (a string is one name, not its characters)."""
    if isinstance(values, kinds) and not isinstance(values, bool):
        return [values]
    if not isinstance(values, list | tuple):
        raise PlansimError(f"{option}: expected a list, got {type_name(values)}")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, kinds)]
    if bad:
        raise PlansimError(f"{option}: {type_name(bad[0])} is not one of the values it takes")
    return list(values)


def scaled_strategy(s: Strategy, gpus: int, batch: str = "fixed") -> Strategy:
    """``s`` (resolved: dp set) on ``gpus`` GPUs: the same tp, pp and micro-batch, dp = gpus over one replica's GPUs
    (``ranks_of(s, besides=("dp",))``: tp x cp x pp); the global batch kept (``fixed``) or grown with dp at the same
    micro-batches per replica (``per-replica``).

    >>> s = Strategy(dp=4, tp=2, micro_batch=2, global_batch=32)
    >>> [(t.dp, t.global_batch, t.num_microbatches) for t in (scaled_strategy(s, 16, b) for b in SCALING_BATCH)]
    [(8, 32, 2), (8, 64, 4)]
    """
    width = ranks_of(s, besides=("dp",))
    if gpus % width:
        raise PlansimError(f"{gpus} GPUs: not a multiple of {' x '.join(REPLICA_AXES)} = {width}")
    dp = gpus // width
    if batch == "per-replica":
        return s.model_copy(update={"dp": dp, "global_batch": s.batch // (s.dp or 1) * dp})
    if s.batch % (s.micro_batch * dp):
        raise PlansimError(
            f"{gpus} GPUs: global batch {s.batch} is not a multiple of micro_batch x dp = {s.micro_batch * dp}"
        )
    return s.model_copy(update={"dp": dp, "global_batch": s.batch})


def _scaling_point(spec: ModelSpec, run: Run, gpus: int, engine: str, batch: str) -> ScalingPoint:
    try:
        s = scaled_strategy(run.strategy, gpus, batch)
        return ScalingPoint(run.label, gpus, ENGINES[engine](spec, resize(run.cluster, gpus), s))
    except PlansimError as err:
        return ScalingPoint(run.label, gpus, None, str(err))


def _cluster(hw: Cluster | str, gpus: int | None, s: Strategy) -> Cluster:
    if isinstance(hw, Cluster):
        return hw if gpus is None or gpus == hw.num_gpus else resize(hw, gpus)
    if gpus is None and s.dp is not None:
        gpus = s.num_gpus
    return load_hardware(str(hw), gpus=gpus)


def _name(s: Strategy | str | Mapping[str, Any]) -> str | None:
    """A strategy file's or shipped strategy's name; None for inline text, mappings and objects."""
    if isinstance(s, str) and "=" not in s:
        return Path(s.strip()).stem
    return None


def _label(name: str, cluster: Cluster, several_hardware: bool, runs: Sequence[Run]) -> str:
    label = f"{name} @ {cluster.node.name}" if several_hardware else name
    taken = {r.label for r in runs}
    if label not in taken:
        return label
    k = 2
    while f"{label} #{k}" in taken:
        k += 1
    return f"{label} #{k}"
