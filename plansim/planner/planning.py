"""The planner: search every placement of a model on a cluster at a global batch, explain the choice.

``plan`` enumerates the space (``space``), prices it with the analytic engine and re-simulates the finalists with
the discrete-event engine (``search``), and words the outcome (``explain``). The CLI's ``plansim plan`` prints what
it returns. ``PlanResult`` holds the ranked finalists, the winner against the runner-up (and why when they tie: the
lower peak) and against the Megatron-style configuration, the equivalents left out, what the headroom ruled out and
whether the best of those would have won, the smallest change when nothing fits, and the time and cost to train.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from plansim.api import as_cluster, run_model
from plansim.arguments import callback, choice, flag
from plansim.describe import pace
from plansim.errors import PlansimError
from plansim.hardware import Cluster, load_hardware
from plansim.limits import LIMITS, machine_cores, number, refuse_work, whole
from plansim.planner.explain import compare_sentence, describe, is_megatron_style, megatron_style
from plansim.planner.robust import TIE, Rival, RobustReport, family_rival, plan_family, robust_report
from plansim.planner.search import (
    OBJECTIVES,
    Finalist,
    Priced,
    SearchOutcome,
    differing_settings,
    meets_headroom,
    search,
)
from plansim.planner.search import TIE as TIE_REL
from plansim.planner.space import Constraints, candidates, divisors, search_work
from plansim.result import Result
from plansim.strategy.checks import fp8_problems
from plansim.strategy.schema import Strategy
from plansim.uncertainty import model_worst, perturbed, with_model_inputs, worst_corners
from plansim.units import GB
from plansim.workload import ModelSpec
from plansim.workload.families import axis_problems

__all__ = ["Constraints", "PlanResult", "TrainingCost", "plan", "training_cost"]


@dataclass(frozen=True)
class TrainingCost:
    """Time and money to train on ``tokens`` tokens at the winner's step time."""

    tokens: float
    steps: int
    days: float
    gpu_hours: float
    cost: float | None


@dataclass
class PlanResult:
    """The planner's answer: the ranked finalists (``frame``), the winner, the words, and what was rejected."""

    model: str
    hardware: str
    gpus: int
    global_batch: int
    objective: str
    outcome: SearchOutcome
    megatron: Finalist | None
    explanation: str
    suggestion: str
    training: TrainingCost | None
    memory_capacity_bytes: float
    #: With ``robust``: the candidates were ranked at the worst corner of the profiles' ranges, and this says how
    #: robust the winner is (``planner.robust``); None otherwise.
    robust: RobustReport | None = None
    #: The run's sequence length where the plan was given one (``plan(seq_len=)``, ``--seq-len``), overriding the
    #: model's; None: the model's own. winner.yaml carries it.
    seq_len: int | None = None

    @property
    def winner(self) -> Strategy | None:
        """The best strategy that fits (None if nothing fits)."""
        fits = [f for f in self.outcome.finalists if f.result.fits]
        return fits[0].priced.strategy if fits else None

    @property
    def winner_result(self) -> Result | None:
        """The winner's result (the discrete-event engine's when it ran)."""
        fits = [f for f in self.outcome.finalists if f.result.fits]
        return fits[0].result if fits else None

    def frame(self) -> Any:
        """The finalists as a pandas DataFrame, best first: rank, strategy, the deciding engine's figures, the
        analytic step time, comm per GPU by kind and the time breakdown; then the Megatron-style configuration
        (``role`` megatron-style, no rank) when it is not a finalist."""
        import pandas as pd

        rows = [self._row(rank, "finalist", f) for rank, f in enumerate(self.outcome.finalists, start=1)]
        mega = self.megatron
        if mega is not None and all(f.priced.strategy != mega.priced.strategy for f in self.outcome.finalists):
            rows.append(self._row(None, "megatron-style", mega))
        frame = pd.DataFrame(rows)
        if len(frame):  # whole numbers with a gap (the reference has no rank), not floats: results.csv reads "1"
            frame["rank"] = frame["rank"].astype("Int64")
        return frame

    def _row(self, rank: int | None, role: str, f: Finalist) -> dict[str, Any]:
        r = f.result
        return {
            "rank": rank,
            "role": role,
            "strategy": describe(f.priced.strategy),
            "engine": r.engine,
            "step_time_s": r.step_time_s,
            "analytic_step_time_s": f.priced.result.step_time_s,
            "tokens_per_s": r.tokens_per_s,
            "mfu": r.mfu,
            "fits": r.fits,
            "peak_memory_bytes": r.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "memory_margin": r.memory_margin,
            "equivalent": len(self.outcome.equivalent_to(f.priced.strategy)),
            "equivalent_settings": self.equivalent_settings(f.priced.strategy),
            **{f"mem_{k}_bytes": v for k, v in r.memory_breakdown_bytes.items()},
            **{f"comm_{k}_bytes": v for k, v in r.comm_bytes_per_gpu.items()},
            **{f"time_{k}_s": v for k, v in r.time_breakdown_s.items()},
            **{f"strategy.{k}": v for k, v in f.priced.strategy.model_dump().items()},
        }

    def equivalent_settings(self, s: Strategy) -> str:
        """The settings in which finalist ``s``'s twins (left out, ``SearchOutcome.equivalents``) differ from it:
        ``zero=1/0``; empty where it has none."""
        return differing_settings(s, [p.strategy for p in self.outcome.equivalent_to(s)])

    def equivalent_note(self, s: Strategy) -> str:
        """``+2 equivalent: zero=1/0`` for finalist ``s`` (empty where it has no twins)."""
        n = len(self.outcome.equivalent_to(s))
        return f"+{n} equivalent: {self.equivalent_settings(s)}" if n else ""

    def rejected_summary(self) -> list[tuple[str, int]]:
        """Rejected candidates by reason, most frequent first."""
        return sorted(self.outcome.rejected.items(), key=lambda kv: (-kv[1], kv[0]))


def plan(
    model: ModelSpec | str | Path,
    hardware: Cluster | str | Path,
    *,
    gpus: int | None = None,
    global_batch: int,
    constraints: Constraints | None = None,
    objective: str = "step_time",
    top_k: int = 10,
    des: bool = True,
    milp: bool = True,
    splits: bool = True,
    jobs: int | None = None,
    tokens: float | None = None,
    price_per_gpu_hour: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    phase: Callable[[str], None] | None = None,
    robust: bool = False,
    seq_len: int | None = None,
    moe_imbalance: float | None = None,
) -> PlanResult:
    """Find the best way to train ``model`` on ``gpus`` GPUs of ``hardware`` at ``global_batch`` sequences per step.
    ``progress(done, total)`` is called while candidates are priced and finalists re-simulated, ``phase(label)`` as
    each later phase begins (``plansim plan`` shows both on stderr).

    ``robust`` ranks every candidate by its worst case over the ranges of the hardware profiles' uncertain inputs
    (``plansim.uncertainty``: the corner of the box with every input at its worse end), and reports, for the
    winner, its step time at each input's range ends and the break-even values against the runner-up and the best
    candidate of another family (``PlanResult.robust``, ``planner.robust``).

    ``seq_len`` prices the model at that many tokens per sequence instead of its own (``plansim.api.run_model``):
    every candidate, the finalists' re-simulation and the time to train on ``tokens`` read it. ``moe_imbalance``
    sets a mixture of experts' routing imbalance the same way (``plansim.api.simulate``); with ``robust`` it is an
    uncertain input too (``plansim.uncertainty.MODEL_INPUTS``), the search pricing it at the worse end of its range.

    ``constraints`` is a ``Constraints`` or a mapping of its fields (``{"tp": 2}``). The search's work is counted
    before any candidate is priced (``space.search_work``): above ``PLANSIM_MAX_CANDIDATES`` candidates,
    ``PLANSIM_MAX_PLAN_BLOCKS`` blocks walked (``plansim.limits.WORK``)
    the call is refused with the count and the ways to narrow the search; so is a discrete-event re-simulation of
    the finalists above ``PLANSIM_MAX_FINALIST_TASKS`` in all, before the first one runs.

    Raises
    ------
    PlansimError
        Any bad argument, with the CLI's one-line message naming it, before the search starts (numbers outside
        their range: ``docs/limits.md``); a search or a discrete-event re-simulation above its work bound; no
        candidate at all.

    Examples
    --------
    >>> r = plan("gpt3-125m", "dgx-a100", gpus=8, global_batch=16, des=False,
    ...          constraints=Constraints(dp_algorithms=("ring",), remat=("none",)))
    >>> r.winner is not None and r.winner.num_gpus == 8
    True
    """
    gpus = None if gpus is None else whole(gpus, "gpus", "--gpus")
    global_batch = whole(global_batch, "global_batch", "--global-batch")
    c = Constraints.of(constraints)
    choice(objective, OBJECTIVES, "--objective")
    if objective == "cost" and price_per_gpu_hour is None:  # cost ranks as step time at a fixed GPU count and batch
        raise PlansimError(
            "--objective cost needs --price-per-gpu-hour PRICE (and --tokens for the run's cost); without a price it "
            "ranks as --objective step_time"
        )
    top_k = whole(top_k, "top_k", "--top")
    for name, value in (("des (--no-des)", des), ("milp", milp), ("splits", splits), ("robust", robust)):
        flag(value, name)
    jobs = machine_cores() if jobs is None else whole(jobs, "jobs", "--jobs")
    tokens = None if tokens is None else number(tokens, "tokens", "--tokens")
    if price_per_gpu_hour is not None:
        price_per_gpu_hour = number(price_per_gpu_hour, "price_per_gpu_hour", "--price-per-gpu-hour")
    callback(progress, "progress")
    spec = run_model(model, seq_len, moe_imbalance=moe_imbalance)
    if not isinstance(spec, ModelSpec):
        raise PlansimError("model: the planner takes a ModelSpec (a preset, a model file), not a traced module")
    cluster = as_cluster(hardware, gpus)
    c = c.for_gpu(cluster.gpu.memory_bytes)
    if "fp8" in c.dtypes(cluster):  # a dtype the GPU lacks: refused before the search; fp8 no framework runs, too
        said = [fp8_problems(Strategy(dtype="fp8", framework=n), spec, cluster) for n in c.frameworks]
        if all(said):
            raise PlansimError(f"--dtype fp8: {said[0][0]}")
    if c.offload and cluster.node.host is None:
        raise PlansimError(
            f"--offload {','.join(c.offload)} on {cluster.node.name}: its node profile describes no host memory or "
            "host link (hardware_profiles/nodes, host:): leave --offload out or use a node with a host section"
        )
    corners = [perturbed(cluster, v) for v in worst_corners(cluster)] if robust else []
    given = spec  # the robust report's nominal model
    if robust:  # the model's uncertain inputs (a mixture of experts' imbalance) at their worse end, in every corner
        spec = with_model_inputs(spec, model_worst(spec))
    work = search_work(spec, cluster, global_batch, c)
    subject = f"plan of {spec.name} on {cluster.num_gpus} GPUs at --global-batch {global_batch}"
    narrow = "narrow it (--tp, --pp, --max-pp, --micro-batch, --zero, --schedule, fewer --remat policies)"
    refuse_work("candidates", work.candidates, subject, narrow)
    refuse_work("plan_blocks", work.block_walks * max(1, len(corners)), subject, narrow)  # each corner walks anew
    key = OBJECTIVES[objective]
    max_tp = _megatron_tp(spec, cluster)
    # the candidates the explanation reads besides the finalists: the best Megatron-style one at each depth, each
    # framework's best (--framework all), the best without context parallelism, and with --robust each family's best
    # (a rival)
    groups: list[Callable[[Strategy], Hashable]] = [partial(_megatron_depth, max_tp), _framework]
    groups += [partial(_without, name) for name in _FEATURES]
    groups += [plan_family] if robust else []
    outcome = search(
        spec, cluster, global_batch, c, objective=objective, top_k=top_k, des=des, milp=milp, splits=splits, jobs=jobs,
        progress=progress, phase=phase, corners=corners, groups=groups,
        reference=lambda fitting: megatron_style(fitting, max_tp, key),
    )  # fmt: skip
    if not outcome.candidates:
        raise PlansimError(_no_candidate_message(spec, cluster, global_batch, c))
    mega = outcome.reference
    result = PlanResult(
        spec.name, cluster.name, cluster.num_gpus, global_batch, objective, outcome, mega, "", "", None,
        cluster.gpu.memory_bytes, seq_len=None if seq_len is None else spec.seq_len,
    )  # fmt: skip
    winner = result.winner_result
    if winner is None:
        if phase:
            phase("nothing fits: looking for the smallest change that does")
        result.suggestion = _smallest_change(spec, cluster, global_batch, c)
        result.explanation = (
            f"No strategy fits {spec.name} on {cluster.num_gpus} x {cluster.gpu.name}"
            + _tight_only(outcome)
            + ". "
            + result.suggestion
        )
        return result
    excluded = (
        None if mega is not None or not _set_constraints(c) else _megatron_excluded(spec, cluster, global_batch, c)
    )
    result.explanation = _explain(result, excluded)
    if robust:
        if phase:
            phase("break-even values for the winner")
        result.robust = _robust(given, cluster, result)
        # every figure before the robust sentences is a worst case: said first, not left to the end
        result.explanation = (
            "Worst cases over the profiles' uncertainty ranges throughout. "
            + result.explanation
            + " "
            + " ".join(result.robust.sentences())
        )
    if winner.warnings:  # a thin memory margin (plansim.step.result.THIN_MARGIN): said, not hidden
        result.explanation += " Note: the winner's " + "; ".join(winner.warnings) + "."
    if tokens is not None:
        result.training = training_cost(winner, tokens, spec.seq_len, global_batch, price_per_gpu_hour)
    return result


def _robust(spec: ModelSpec, cluster: Cluster, r: PlanResult) -> RobustReport:
    """The winner's robustness report against the runner-up and the best candidate of another family (by the
    ranking's order, finalists first)."""
    fits = [f for f in r.outcome.finalists if f.result.fits]
    winner = fits[0].priced.strategy
    rivals = []
    apart = [k for k, f in enumerate(fits) if k and not _ties(f.priced.result, fits[0].priced.result)]
    if apart:  # a finalist that prices as the winner (ZeRO-2 beside ZeRO-1, say) never breaks even: the next
        k = apart[0]
        role = "the runner-up" if k == 1 else f"finalist #{k + 1} (those before it price as the winner)"
        rivals.append(Rival(role, fits[k].priced.strategy))
    fits_s = [f.priced.strategy for f in fits]
    ranked = fits_s[1:] + [p.strategy for p in r.outcome.fitting if p.strategy not in fits_s]
    other = family_rival(winner, ranked)
    if other is not None and all(other.strategy != rival.strategy for rival in rivals):
        rivals.append(other)
    return robust_report(spec, cluster, winner, rivals)


def _ties(a: Result, b: Result) -> bool:
    """Whether two analytic results price alike (within ``planner.robust.TIE``)."""
    return abs(a.step_time_s / b.step_time_s - 1) <= TIE


def training_cost(
    result: Result, tokens: float, seq_len: int, global_batch: int, price_per_gpu_hour: float | None
) -> TrainingCost:
    """Steps, days, GPU-hours and cost to train on ``tokens`` tokens at ``result``'s step time.

    >>> from types import SimpleNamespace
    >>> r = SimpleNamespace(step_time_s=10.0, gpus=1024)
    >>> t = training_cost(r, 2048 * 1536 * 8640, 2048, 1536, 2.0)   # 8,640 steps of 10 s: one day
    >>> t.steps, t.days, t.gpu_hours, t.cost
    (8640, 1.0, 24576.0, 49152.0)
    """
    if tokens <= 0:
        raise PlansimError(f"--tokens {tokens}: must be positive")
    if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
        raise PlansimError(f"--price-per-gpu-hour {price_per_gpu_hour}: must be >= 0")
    steps = math.ceil(tokens / (seq_len * global_batch))
    seconds = steps * result.step_time_s
    gpu_hours = seconds * result.gpus / 3600
    cost = gpu_hours * price_per_gpu_hour if price_per_gpu_hour is not None else None
    return TrainingCost(tokens, steps, seconds / 86400, gpu_hours, cost)


def _megatron_depth(max_tp: int, s: Strategy) -> int | None:
    """A Megatron-style candidate's pipeline depth (``megatron_style`` takes the best of the shallowest that fits);
    None for any other."""
    return s.pp if is_megatron_style(s, max_tp) else None


def _framework(s: Strategy) -> str:
    return s.framework


@dataclass(frozen=True)
class _Feature:
    """A capability the explanation weighs where the winner uses it: what the plan would be without it (the best
    candidate without it, which the search prices in full as a group of its own: ``_without``)."""

    #: what it is called in the sentences, given the winner's strategy
    title: Callable[[Strategy], str]
    #: whether a strategy uses it
    uses: Callable[[Strategy], bool]


def _cp_title(s: Strategy) -> str:
    return f"Context parallelism (cp={s.cp})"


def _uses_cp(s: Strategy) -> bool:
    return s.cp > 1


def _fp8_title(s: Strategy) -> str:
    return f"FP8 ({s.fp8_recipe} scaling)" if s.fp8_recipe else "FP8"


def _uses_fp8(s: Strategy) -> bool:
    return s.dtype == "fp8"


def _offload_title(s: Strategy) -> str:
    layers = f", {s.offload_activation_layers} blocks' activations" if s.offload_activation_layers else ""
    return f"Offloading to host memory ({'/'.join(s.offload)}{layers})"


def _uses_offload(s: Strategy) -> bool:
    return bool(s.offload)


def _ep_title(s: Strategy) -> str:
    etp = f", etp={s.etp}" if s.etp is not None else ""
    return f"Expert parallelism (ep={s.ep}{etp})"


def _uses_ep(s: Strategy) -> bool:
    return s.ep > 1


#: What the explanation says each bought (issue 35: "the explanation says what cp, fp8 or offload bought"; issue 36,
#: expert parallelism), by name.
#: Module-level functions throughout: the search's groups travel to its worker processes.
_FEATURES: dict[str, _Feature] = {
    "cp": _Feature(_cp_title, _uses_cp),
    "fp8": _Feature(_fp8_title, _uses_fp8),
    "offload": _Feature(_offload_title, _uses_offload),
    "ep": _Feature(_ep_title, _uses_ep),
}


def _without(name: str, s: Strategy) -> Hashable:
    """The search group of the candidates without the feature ``name`` (None for the others)."""
    return None if _FEATURES[name].uses(s) else "without"


def _megatron_tp(model: ModelSpec, cluster: Cluster) -> int:
    """Tensor parallelism up to a node: the largest divisor of the node's GPUs that the model's family allows (the
    heads)."""
    ok = [t for t in divisors(cluster.gpus_per_node) if cluster.num_gpus % t == 0 and not axis_problems(model, "tp", t)]
    return max(ok, default=1)


def _percent(fraction: float) -> str:
    """A headroom as the sentences say it: ``5%``, ``2.5%``."""
    return f"{fraction:.1%}".replace(".0%", "%")


def _tight_only(outcome: SearchOutcome) -> str:
    """Where nothing meets the headroom but some candidates fit with less: how many, and the headroom that would
    admit the best of them (its free fraction, rounded down to 0.1 %)."""
    if not outcome.tight:
        return ""
    best = outcome.tight[0]
    admits = math.floor(max(best.result.memory_margin, 0.0) * 1000) / 1000
    return (
        f" with {_percent(outcome.headroom)} of its memory free at the peak (--headroom {outcome.headroom:g}): "
        f"{outcome.tight_count:,} fit with less, the best of them {describe(best.strategy)} with "
        f"{best.result.memory_margin:.1%} free (--headroom {admits:g} admits it, at the risk the headroom guards "
        "against)"
    )


def _explain(r: PlanResult, excluded: tuple[Strategy, list[str]] | None = None) -> str:
    finalists = [f for f in r.outcome.finalists if f.result.fits]
    best = finalists[0]
    w = best.result
    engine = "the discrete-event engine" if best.des is not None else "the analytic engine"
    room = f" with {_percent(r.outcome.headroom)} of memory free" if r.outcome.headroom > 0 else ""
    text = [
        f"Best of {r.outcome.candidates:,} candidates ({r.outcome.fit_count:,} fit{room}) by {engine}: "
        f"{describe(best.priced.strategy)}, {w.step_time_s:.3f} s per step, {w.tokens_per_s:,.0f} tokens/s, "
        f"MFU {w.mfu:.1%}, peak memory {w.peak_memory_bytes / GB:.1f} of {r.memory_capacity_bytes / GB:.1f} GB."
    ]
    text += _equivalent_sentences(r, best.priced.strategy)
    if len(finalists) > 1:
        runner = finalists[1]
        text.append(
            "Runner-up " + describe(runner.priced.strategy) + ". " + compare_sentence(w, runner.result, "the runner-up")
        )
        if _ties_in_time(r.objective, w, runner.result) and w.peak_memory_bytes < runner.result.peak_memory_bytes:
            text.append(
                f"The two tie within {TIE_REL:.1%} in step time, and the winner needs less memory: ties break toward "
                "the lower peak."
            )
    if r.megatron is not None:
        if r.megatron.priced.strategy == best.priced.strategy:
            text.append("It is the Megatron-style configuration (tp within a node, pp to fit, mb 1, selective).")
        else:
            text.append(
                "Megatron-style " + describe(r.megatron.priced.strategy) + ". "
                + compare_sentence(w, r.megatron.result, "the Megatron-style configuration")
            )  # fmt: skip
    elif excluded is not None:
        mega_s, options = excluded
        text.append(
            "No Megatron-style configuration (tp within a node, pp to fit, mb 1, selective) within your constraints: "
            f"the one that fits, {describe(mega_s)}, is excluded by {' and '.join(options)}."
        )
    else:
        text.append("No Megatron-style configuration (tp within a node, pp to fit, mb 1, selective) fits.")
    text += _overlap_sentences(r, best.priced)
    text += [line for f in _FEATURES.values() for line in _feature_sentences(f, r, best.priced)]
    text += _framework_sentences(r, best.priced)
    text += _headroom_sentences(r, best.priced)
    return " ".join(text)


def _ties_in_time(objective: str, a: Result, b: Result) -> bool:
    """Whether ``a`` and ``b`` tie on ``objective`` (within ``search.TIE``), as the ranking judges."""
    x, y = OBJECTIVES[objective](a), OBJECTIVES[objective](b)
    return abs(x - y) <= TIE_REL * max(abs(x), abs(y))


def _equivalent_sentences(r: PlanResult, s: Strategy) -> list[str]:
    """How many candidates price as the winner and differ from it only in settings (its twins, left out)."""
    twins = r.outcome.equivalent_to(s)
    if not twins:
        return []
    n = len(twins)
    return [
        f"It stands for {n} equivalent candidate{'s' if n > 1 else ''} ({r.equivalent_settings(s)}) that differ from "
        f"it only there and price alike, within {TIE_REL:.1%} in step time and peak memory."
    ]


def _headroom_sentences(r: PlanResult, best: Priced) -> list[str]:
    """What the headroom did: how many candidates it ruled out, and whether the best of them, by the analytic engine
    as the search ranked them, would have beaten the winner (and by how much)."""
    tight = r.outcome.tight
    if not tight:
        return []
    h = r.outcome.headroom
    first = tight[0]
    n = r.outcome.tight_count
    head = (
        f"--headroom {h:g} ruled out {n:,} candidate{'s' if n > 1 else ''} that fit with less than "
        f"{_percent(h)} of memory free at the peak"
    )
    key = OBJECTIVES[r.objective]
    if key(first.result) < key(best.result) and not _ties_in_time(r.objective, first.result, best.result):
        phrase = pace(first.result.step_time_s, best.result.step_time_s)
        return [
            f"{head}; the best of them, {describe(first.strategy)} with {first.result.memory_margin:.1%} free, "
            f"{phrase} the winner by the analytic engine and would have won."
        ]
    return [f"{head}; none of them would have won."]


def _overlap_sentences(r: PlanResult, best: Priced) -> list[str]:
    """Where the search tried ``tp_comm_overlap`` on the winner's configuration: what it would do to it, or, where
    the winner runs with it, what it does without it (both by the analytic engine)."""
    s = best.strategy
    if s.tp_comm_overlap:
        twin = next(
            (p for p in r.outcome.fitting if p.strategy == s.model_copy(update={"tp_comm_overlap": False})), None
        )
        if twin is None:
            return []
        ours, theirs = best.result.step_time_s, twin.result.step_time_s
        return [
            f"Megatron-LM's --tp-comm-overlap decides: without it the same configuration takes {theirs:.3f} s by the "
            f"analytic engine: it {pace(theirs, ours)} the winner."
        ]
    twin = next(
        (p for p in r.outcome.overlap_tried if p.strategy == s.model_copy(update={"tp_comm_overlap": True})), None
    )
    if twin is None:
        return []
    mine, theirs = best.result.step_time_s, twin.result.step_time_s
    fits = "" if twin.result.fits else ", and does not fit"
    return [
        "With Megatron-LM's --tp-comm-overlap (tried on each finalist) the winner's configuration takes "
        f"{theirs:.3f} s by the analytic engine against {mine:.3f} s without: it {pace(theirs, mine)} the winner"
        f"{fits}."
    ]


def _feature_sentences(f: _Feature, r: PlanResult, best: Priced) -> list[str]:
    """What ``f`` bought where the winner uses it: the best candidate without it (priced in full: ``_without``), by
    the analytic engine against the winner's analytic step, or that none fits without it."""
    s = best.strategy
    if not f.uses(s):
        return []
    key = OBJECTIVES[r.objective]
    plain = min((p for p in r.outcome.fitting if not f.uses(p.strategy)), key=lambda p: key(p.result), default=None)
    if plain is None:
        return [
            f"{f.title(s)} is what makes the plan fit: no candidate without it fits with "
            f"{_percent(r.outcome.headroom)} of memory free."
        ]
    ours, theirs = best.result.step_time_s, plain.result.step_time_s
    return [
        f"{f.title(s)} against the best candidate without it, {describe(plain.strategy)}, "
        f"{theirs:.3f} s and {plain.result.peak_memory_bytes / GB:.1f} GB by the analytic engine: that one "
        f"{pace(theirs, ours)} the winner's {ours:.3f} s."
    ]


def _framework_sentences(r: PlanResult, best: Priced) -> list[str]:
    """Where the search covered several frameworks (``--framework all``): per other framework, its best candidate by
    the analytic engine, how much slower, and the framework's rules that differ from the winner's
    (``plansim.strategy.frameworks.rule_differences``)."""
    from plansim.strategy.frameworks import load_framework, rule_differences

    key = OBJECTIVES[r.objective]
    names = sorted({p.strategy.framework for p in r.outcome.fitting} - {best.strategy.framework})
    architecture = as_cluster(r.hardware, r.gpus).gpu.architecture if names else None
    out = []
    for name in names:
        other = min((p for p in r.outcome.fitting if p.strategy.framework == name), key=lambda p: key(p.result))
        how = f"which {pace(other.result.step_time_s, best.result.step_time_s)} the winner by the analytic engine"
        b = best.strategy
        why = rule_differences(
            b.framework, name, b.zero, b.pp, b.tp, b.schedule, architecture=architecture, attention=b.attention
        )
        out.append(
            f"Best under {load_framework(name).title}: {describe(other.strategy)}, {how}"
            + (f" ({'; '.join(why)})." if why else ".")
        )
    return out


def _megatron_excluded(
    model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints
) -> tuple[Strategy, list[str]] | None:
    """The Megatron-style configuration that fits once the user's constraints ``c`` are lifted (``megatron_style``
    over the recipe's candidates, priced by the analytic engine), and the options of ``c`` that exclude it; None
    when none fits even so, or when no option of ``c`` can be named."""
    from plansim.analytic import AnalyticCache, simulate_analytic

    max_tp = _megatron_tp(model, cluster)
    recipe = Constraints(
        tp=max_tp, micro_batch=1, remat=("selective",), dp_algorithms=("nccl",),
        allow_cross_node_tp=c.allow_cross_node_tp, dtype=c.dtype, headroom=c.headroom,
    )  # fmt: skip
    cache = AnalyticCache(model, cluster)
    fitting = []
    for k, s in enumerate(candidates(model, cluster, global_batch, recipe)):
        if not is_megatron_style(s, max_tp):
            continue
        try:
            r = simulate_analytic(model, cluster, s, cache=cache)
        except PlansimError:
            continue
        if meets_headroom(r, c.headroom):
            fitting.append(Priced(k, s, r))
    found = megatron_style(fitting, max_tp, OBJECTIVES["step_time"])
    if found is None:
        return None
    s = found.strategy
    options = [
        f"--{name.replace('_', '-')} {getattr(c, name)}"
        for name in ("tp", "pp", "dp", "zero", "micro_batch", "schedule")
        if getattr(c, name) is not None and getattr(c, name) != getattr(s, name)
    ]
    if c.max_pp is not None and s.pp > c.max_pp:
        options.append(f"--max-pp {c.max_pp}")
    if c.max_micro_batch is not None and s.micro_batch > c.max_micro_batch:
        options.append(f"--max-micro-batch {c.max_micro_batch}")
    if c.remat is not None and "selective" not in c.remat:  # --remat milp searches full, with milp for finalists
        options.append("--remat, which leaves out selective")
    if c.sequence_parallel is not None and c.sequence_parallel != s.sequence_parallel:
        options.append(f"sequence_parallel={c.sequence_parallel}")
    if c.tp_comm_overlap is not None and c.tp_comm_overlap != s.tp_comm_overlap:
        options.append(f"tp_comm_overlap={c.tp_comm_overlap}")
    if c.dp_algorithms is not None and "nccl" not in c.dp_algorithms:
        options.append(f"--dp-algorithms {','.join(c.dp_algorithms)}")
    return (s, options) if options else None


def _no_candidate_message(model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints) -> str:
    n = cluster.num_gpus
    dps = [dp for dp in divisors(n) if c.dp in (None, dp)]  # every split of n GPUs leaves dp some divisor of n
    mb = c.micro_batch or 1
    if not any(global_batch % (dp * mb) == 0 for dp in dps):
        unit = min(dps) * mb
        nearest = unit * max(1, round(global_batch / unit))
        return (
            f"--global-batch {global_batch} is not a multiple of micro-batch x dp for any split of {n} GPUs "
            f"(micro-batch {mb}, dp in {', '.join(map(str, dps[:8]))}{', ...' if len(dps) > 8 else ''}): "
            f"use a multiple of {unit}, e.g. {nearest}"
        )
    return (
        f"no strategy for {model.name} on {n} GPUs satisfies the constraints "
        f"({', '.join(f'{k}={v}' for k, v in _set_constraints(c).items()) or 'none'}): relax them"
    )


def _set_constraints(c: Constraints) -> dict[str, Any]:
    default = Constraints()
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if getattr(c, f.name) != getattr(default, f.name)}


def _smallest_change(model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints) -> str:
    """The first change, in order of how little it asks, after which some strategy fits: lift the user's limits on
    ZeRO, remat and the micro-batch (one at a time, then all), then more GPUs (2x .. 16x)."""
    lenient = dataclasses.replace(c, remat=("full",), dp_algorithms=("nccl",))
    tries: list[tuple[str, Constraints, Cluster]] = []
    if c.micro_batch not in (None, 1) or c.max_micro_batch not in (None, 1):
        one = dataclasses.replace(lenient, micro_batch=1, max_micro_batch=None)
        tries.append(("use --micro-batch 1", one, cluster))
    if c.zero not in (None, 3):
        tries.append(("allow ZeRO-3 (--zero 3)", dataclasses.replace(lenient, zero=3), cluster))
    if c.remat is not None and "full" not in c.remat:
        tries.append(("allow full recomputation (remat=full)", lenient, cluster))
    everything = Constraints(
        remat=("full",), dp_algorithms=("nccl",), allow_cross_node_tp=c.allow_cross_node_tp, headroom=c.headroom
    )
    if _set_constraints(c).keys() - {"remat", "dp_algorithms", "headroom"}:
        tries.append(("drop the --tp/--pp/--zero/--micro-batch limits", everything, cluster))
    for factor in (2, 4, 8, 16):
        if cluster.num_gpus * factor > LIMITS["gpus"].high:  # beyond the largest cluster plansim takes
            break
        bigger = load_hardware(cluster.node.name, gpus=cluster.num_gpus * factor)
        tries.append((f"use {bigger.num_gpus} GPUs ({factor}x)", everything, bigger))
    for words, cons, clus in tries:
        if _any_fits(model, clus, global_batch, cons):
            return f"Smallest change that fits: {words}."
    return "Nothing tried fits (ZeRO-3, full recomputation, micro-batch 1, up to 16x the GPUs): use a larger GPU."


def _any_fits(model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints) -> bool:
    from plansim.analytic import AnalyticCache, simulate_analytic

    cache = AnalyticCache(model, cluster)
    for s in candidates(model, cluster, global_batch, c):
        try:
            if meets_headroom(simulate_analytic(model, cluster, s, cache=cache), c.headroom):
                return True
        except PlansimError:
            continue
    return False
