"""How robust the winner is: for each uncertain input (``plansim.uncertainty``: the profiles', and the model's
routing imbalance for a mixture of experts), the winner's step time at the ends
of the input's range (the tornado chart), and the break-even value at which a rival would price as fast: the
runner-up, and the best candidate of another family (with or without ZeRO-3, pipelining, tensor parallelism).

Break-even values are found with the analytic engine, one input moved at a time (the others at the profiles'
values): the ratio of the winner's step time to the rival's is evaluated on a grid from the profile's value out to
the input's search bounds on each side, and the first sign change is closed in by the Illinois variant of regula
falsi (Dowell and Jarratt 1971) until the two price within ``TIE`` of each other. A step in the cost model (NCCL
switching algorithm, say) can jump over the tie; the reported ``gap`` then says by how much, and the sentence says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plansim.analytic import AnalyticCache, simulate_analytic
from plansim.describe import RATIO_FROM, describe, times
from plansim.hardware import Cluster
from plansim.strategy.schema import Strategy
from plansim.uncertainty import (
    MODEL_INPUTS,
    input_named,
    model_nominal,
    model_ranges,
    model_search_bounds,
    model_worst,
    nominal,
    perturbed,
    ranges,
    search_bounds,
    with_model_inputs,
    worst_corners,
)
from plansim.workload import ModelSpec

__all__ = ["TIE", "BreakEven", "Rival", "RobustReport", "Sensitivity", "family_rival", "robust_report"]

#: Two plans tie when their step times differ by at most this fraction; the search stops there.
TIE = 1e-4

#: Where the grid probes between the profile's value (0) and a search bound (1), nearest first.
_GRID = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
_MAX_ITERATIONS = 40


@dataclass(frozen=True)
class Rival:
    """A plan the winner is checked against: its role in words and its strategy."""

    role: str
    strategy: Strategy


@dataclass(frozen=True)
class BreakEven:
    """Where the winner stops being faster than ``rival`` as one input moves (None: nowhere within the input's
    search bounds on that side); ``gap``: the winner's step time over the rival's, less 1, at ``value`` (within
    ``TIE`` unless the cost model steps over the tie there)."""

    rival: str
    below: float | None
    above: float | None
    gap_below: float
    gap_above: float
    already: bool = False


@dataclass(frozen=True)
class Sensitivity:
    """One input: its profile value, range, the winner's analytic step time at the range's ends, and the
    break-even values against each rival."""

    name: str
    label: str
    value: float
    low: float
    high: float
    at_low_s: float
    at_high_s: float
    break_evens: tuple[BreakEven, ...]
    #: the values the break-even search tried between (``uncertainty.search_bounds``)
    search: tuple[float, float] = (0.0, 1.0)

    @property
    def swing_s(self) -> float:
        """How far the winner's step time moves over the range."""
        return abs(self.at_high_s - self.at_low_s)


@dataclass(frozen=True)
class RobustReport:
    """The winner's robustness: the winner's slowest corner of the box (``worst``), the profiles' values
    (``nominal``), the winner's analytic step time at both, the rivals, and one ``Sensitivity`` per input."""

    nominal: dict[str, float]
    worst: dict[str, float]
    winner_nominal_s: float
    winner_worst_s: float
    rivals: tuple[Rival, ...]
    rival_nominal_s: tuple[float, ...]
    sensitivities: tuple[Sensitivity, ...]

    def sentences(self) -> list[str]:
        """The report in words: the worst case ranked by, and per rival where the winner stops winning."""
        ranged = {s.name for s in self.sensitivities if s.low != s.high}
        shown = ", ".join(
            f"{input_named(n).label} {input_named(n).show(v)}" for n, v in self.worst.items() if n in ranged
        )
        fixed = [input_named(n).label for n in self.worst if n not in ranged]
        held = f"; the profiles give no range for {' or '.join(fixed)}" if fixed else ""
        where = f"over the profiles' ranges ({shown}{held})" if ranged else "(the profiles give no ranges)"
        out = [
            f"Ranked by the worst case {where}: the winner takes {self.winner_worst_s:.3f} s per step there by the "
            f"analytic engine, {self.winner_nominal_s:.3f} s at the profiles' values."
        ]
        for rival in self.rivals:
            out.append(self._rival_sentence(rival))
        return out

    def _rival_sentence(self, rival: Rival) -> str:
        head = f"Against {rival.role}, {describe(rival.strategy)}"
        evens = [(s, next(b for b in s.break_evens if b.rival == rival.role)) for s in self.sensitivities]
        if any(b.already for _, b in evens):
            gap = next(b.gap_below for _, b in evens if b.already)
            if abs(gap) <= TIE:
                return f"{head}: the two price alike by the analytic engine at the profiles' values."
            faster = f"{gap:.2%} faster" if 1 + gap < RATIO_FROM else f"{times(1 + gap)} as fast"  # describe.pace
            return (
                f"{head}: at the profiles' values the analytic engine prices it {faster}; the winner leads "
                "in the worst case the plan is ranked by."
            )
        clauses, steady = [], []
        for s, b in evens:
            u = input_named(s.name)
            parts = []
            for value, gap, words in ((b.below, b.gap_below, "falls below"), (b.above, b.gap_above, "rises above")):
                if value is None:
                    continue
                notes = ["within its range"] if s.low <= value <= s.high else []
                if abs(gap) > 0.005:
                    notes.append(f"where the model steps {abs(gap):.1%} past the tie")
                parts.append(f"{u.label} {words} {u.show(value)}" + (f" ({'; '.join(notes)})" if notes else ""))
            if parts:
                clauses.append(" or ".join(parts))
            else:
                low, high = s.search
                steady.append(f"{u.label} ({u.show(low)} to {u.show(high)})")
        if not clauses:
            return f"{head}: the winner holds over every input's search range."
        text = f"{head}: the winner holds unless " + ", or ".join(clauses)
        if steady:
            text += f"; no value of {' or '.join(steady)} changes it"
        return text + "."

    def to_dict(self) -> dict[str, Any]:
        """Plain data for results.json."""
        return {
            "nominal": self.nominal,
            "worst": self.worst,
            "winner_nominal_step_time_s": self.winner_nominal_s,
            "winner_worst_step_time_s": self.winner_worst_s,
            "rivals": [
                {"role": r.role, "strategy": describe(r.strategy), "nominal_step_time_s": t}
                for r, t in zip(self.rivals, self.rival_nominal_s, strict=True)
            ],
            "inputs": [
                {
                    "name": s.name,
                    "label": s.label,
                    "value": s.value,
                    "range": [s.low, s.high],
                    "winner_step_time_s_at_range": [s.at_low_s, s.at_high_s],
                    "break_even": [
                        {
                            "rival": b.rival,
                            "below": b.below,
                            "above": b.above,
                            "gap_below": b.gap_below,
                            "gap_above": b.gap_above,
                            "already": b.already,
                        }
                        for b in s.break_evens
                    ],
                }
                for s in self.sensitivities
            ],
            "sentences": self.sentences(),
        }


class _Pricer:
    """Analytic step times of strategies on ``cluster`` with inputs set, memoized (one ``AnalyticCache`` per set of
    values)."""

    def __init__(self, model: ModelSpec, cluster: Cluster) -> None:
        self.model, self.cluster = model, cluster
        self._caches: dict[tuple[tuple[str, float], ...], AnalyticCache] = {}
        self._times: dict[tuple[Strategy, tuple[tuple[str, float], ...]], float] = {}

    def step_time(self, s: Strategy, values: Mapping[str, float]) -> float:
        key = tuple(sorted(values.items()))
        hit = self._times.get((s, key))
        if hit is None:
            c = perturbed(self.cluster, {n: v for n, v in values.items() if n not in MODEL_INPUTS})
            model = with_model_inputs(self.model, values)
            cache = self._caches.get(key)
            if cache is None:
                cache = self._caches[key] = AnalyticCache(model, c)
            hit = self._times[(s, key)] = simulate_analytic(model, c, s, cache=cache).step_time_s
        return hit

    def search_bounds(self, name: str) -> tuple[float, float]:
        """The values input ``name`` may take in a break-even search."""
        if name in MODEL_INPUTS:
            return model_search_bounds(self.model, name)
        return search_bounds(self.cluster, name)


def plan_family(s: Strategy) -> tuple[bool, bool, bool]:
    """A plan's family, as ``family_rival`` tells them apart: ZeRO-3 or not, pipelined or not, tensor parallel or
    not."""
    return (s.zero >= 3, s.pp > 1, s.tp > 1)


def _family_words(winner: Strategy, other: Strategy) -> str:
    pairs = zip(plan_family(winner), plan_family(other), strict=True)
    for (w, o), what in zip(pairs, ("ZeRO-3", "pipelining", "tensor parallelism"), strict=True):
        if w != o:
            return f"the best {'with' if o else 'without'} {what}"
    raise AssertionError("the same family")


def family_rival(winner: Strategy, ranked: Sequence[Strategy]) -> Rival | None:
    """The best of ``ranked`` (best first) whose family (ZeRO-3 or not, pipelined or not, tensor parallel or not)
    differs from ``winner``'s, named by the first difference; None when every candidate shares its family."""
    for s in ranked:
        if plan_family(s) != plan_family(winner):
            return Rival(_family_words(winner, s), s)
    return None


def robust_report(
    model: ModelSpec,
    cluster: Cluster,
    winner: Strategy,
    rivals: Sequence[Rival],
) -> RobustReport:
    """The winner's ``RobustReport`` on ``cluster`` (at the profiles' values) against ``rivals``."""
    pricer = _Pricer(model, cluster)
    base = nominal(cluster) | model_nominal(model)
    box = ranges(cluster) | model_ranges(model)
    sensitivities = []
    for name, (low, high) in box.items():
        value = base[name]
        at_low = pricer.step_time(winner, {name: low})
        at_high = pricer.step_time(winner, {name: high})
        evens = tuple(_break_even(pricer, winner, r, name, value) for r in rivals)
        sensitivities.append(
            Sensitivity(
                name, input_named(name).label, value, low, high, at_low, at_high, evens, pricer.search_bounds(name)
            )
        )
    pinned = model_worst(model)  # the model's inputs are monotone: at their worse end in every corner
    corner = max(
        ({**values, **pinned} for values in worst_corners(cluster)), key=lambda values: pricer.step_time(winner, values)
    )
    return RobustReport(
        base, corner, pricer.step_time(winner, {}), pricer.step_time(winner, corner), tuple(rivals),
        tuple(pricer.step_time(r.strategy, {}) for r in rivals), tuple(sensitivities),
    )  # fmt: skip


def _break_even(pricer: _Pricer, winner: Strategy, rival: Rival, name: str, value: float) -> BreakEven:
    def gap(x: float) -> float:
        values = {name: x}
        return pricer.step_time(winner, values) / pricer.step_time(rival.strategy, values) - 1

    at_value = gap(value)
    if at_value >= 0:
        return BreakEven(rival.role, None, None, at_value, at_value, already=True)
    low, high = pricer.search_bounds(name)
    below, gap_below = _crossing(gap, value, at_value, low)
    above, gap_above = _crossing(gap, value, at_value, high)
    return BreakEven(rival.role, below, above, gap_below, gap_above)


def _crossing(gap: Callable[[float], float], start: float, at_start: float, bound: float) -> tuple[float | None, float]:
    """The value nearest ``start`` toward ``bound`` where ``gap`` reaches 0 (it is negative at ``start``), and the
    gap there; (None, the gap at ``bound``) when it stays negative."""
    if bound == start:
        return None, at_start
    a, fa = start, at_start
    for t in _GRID:
        b = start + t * (bound - start)
        fb = gap(b)
        if fb >= 0:
            return _illinois(gap, a, fa, b, fb)
        a, fa = b, fb
    return None, fa


def _illinois(gap: Callable[[float], float], a: float, fa: float, b: float, fb: float) -> tuple[float, float]:
    """Regula falsi, Illinois variant, on [a, b] with ``fa < 0 <= fb``: the point where the gap is within ``TIE``
    of 0, else (a step in the model) the closest point found on the rival's side."""
    if fb <= TIE:
        return b, fb
    wa, wb, side = fa, fb, 0  # the interpolation's weights: Illinois halves the end that stays put twice
    for _ in range(_MAX_ITERATIONS):
        if abs(b - a) <= 1e-9 * max(1.0, abs(b)):
            break
        c = b - wb * (b - a) / (wb - wa)
        fc = gap(c)
        if abs(fc) <= TIE:
            return c, fc
        if fc >= 0:
            b, wb = c, fc
            if side == +1:
                wa /= 2
            side = +1
        else:
            a, wa = c, fc
            if side == -1:
                wb /= 2
            side = -1
    return b, gap(b)
