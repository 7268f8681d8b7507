"""The analytic engine's activation walk (``plansim.step.memory``) takes a stage's passes as nested runs, GPipe,
1F1B and ZB-H1 in closed form and the interleaved schedule compressed from its passes: it must find the same highest
point as a walk over ``PipelineSchedule.order`` pass by pass, whatever each pass allocates and frees."""

from __future__ import annotations

import itertools
import random

import pytest

from plansim.pipeline.runs import order_runs
from plansim.pipeline.schedules import get_schedule
from plansim.step.memory import _walk


def _flat(nodes) -> list:  # type: ignore[no-untyped-def]
    out = []
    for node in nodes:
        if isinstance(node[0], int):
            out.append(node)
        else:
            block, k = node
            out += _flat(block) * k
    return out


def _pass_by_pass(profiles, order) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    n = res = peak_n = peak_res = 0.0
    for op in order:
        rise_n, rise_res, net_n, net_res, _ = profiles[op.chunk][op.kind]
        if res + rise_res > peak_res:
            peak_n, peak_res = n + rise_n, res + rise_res
        n += net_n
        res += net_res
    return peak_n, peak_res


def _cases():  # type: ignore[no-untyped-def]
    for name in ("gpipe", "1f1b", "zb-h1"):
        for p in range(1, 7):
            for m in range(1, 3 * p + 2):
                for s in range(p):
                    yield name, s, p, m, 1
    for p, v in itertools.product(range(1, 5), range(2, 4)):
        for m in range(p, 3 * p + 1, p):
            for s in range(p):
                yield "interleaved", s, p, m, v


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_runs_are_the_order(seed: int) -> None:
    rng = random.Random(seed)
    for name, s, p, m, v in _cases():
        order = get_schedule(name).order(s, p, m, v)
        runs = order_runs(name, s, p, m, v)
        assert _flat(runs) == [(op.chunk, op.kind) for op in order], (name, s, p, m, v)
        # a forward leaves bytes live, its backward (and W) frees them; rises above the start are kept positive
        profiles = []
        for _ in range(v):
            f, b = rng.uniform(1, 9), rng.uniform(0, 1)
            profiles.append(
                {
                    "F": (f + 2.0, f + 2.5, f, f + 0.5, 0.0),
                    "B": (rng.uniform(0, 5), rng.uniform(0, 5), -f * b, -(f + 0.5) * b, 0.0),
                    "W": (0.0, 0.0, -f * (1 - b), -(f + 0.5) * (1 - b), 0.0),
                }
            )
        if name != "zb-h1":  # without a W pass the backward frees all
            for prof in profiles:
                f_n, f_res = prof["F"][2], prof["F"][3]
                prof["B"] = (*prof["B"][:2], -f_n, -f_res, 0.0)
        want = _pass_by_pass(profiles, order)
        got = _walk(profiles, runs)
        assert got == pytest.approx((*want, 0.0), rel=1e-12, abs=1e-9), (name, s, p, m, v)  # no gradient buffers
