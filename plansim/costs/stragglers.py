"""The slowest rank: what a synchronising collective waits for when its members' kernel times vary.

Every member of a collective arrives when its own kernels are done, and the collective starts when the last one
arrives. With member times ``mu + sigma * Z_i`` (``Z_i`` independent standard normals) the expected wait beyond the
mean is ``sigma * e_N``, ``e_N = E[max(Z_1..Z_N)]`` (Gumbel 1958, *Statistics of Extremes*, ch. 3; David & Nagaraja
2003, *Order Statistics*, sec 3.1), which grows with the group size like ``sqrt(2 ln N)``.

``expected_max_normal(n)`` computes ``e_N`` by numerical integration of
``E[max] = int_0^inf (1 - Phi(x)^n) dx - int_-inf^0 Phi(x)^n dx`` (the mean of a variable as the integral of its
tails; Phi the standard normal CDF), exact to about 1e-7 for any ``n`` up to 2^20 and memoized, so a planner pays
it once per group size. ``blom(n)`` is Blom's approximation ``Phi^-1((n - 0.375) / (n + 0.25))`` (Blom 1958,
*Statistical Estimates and Transformed Beta-Variables*), within 0.03 of ``e_N`` from n = 2 to 2^20 (4.5 % at n = 2,
under 0.5 % from n = 64 up; checked in tests/test_stragglers.py); it is kept as a check, not used for pricing.

Two sources of variation are charged, each with its own members (docs/stragglers.md):

- kernel-to-kernel noise on one GPU, independent per kernel (the spread of ``plansim profile``'s repeats): a run of
  kernels with standard deviations ``s_i`` varies by ``sqrt(sum s_i^2)``, and each blocking tensor-parallel
  collective waits ``sqrt(sum s_i^2) * e_tp`` for the run since the layer pass's previous collective
  (``collective_wait_s``);
- chip-to-chip variation, persistent per GPU (manufacturing and power management; Sinha et al., SC'22): the slowest
  GPU of the job is slow in every kernel, and since every step ends with a synchronisation of all GPUs (the gradient
  reduction before the optimizer step, the pipeline's flush), the step waits ``cv * e_world`` times that GPU's busy
  time (``straggler_wait_s``). Both engines charge both (the layer walk's ``Segment.wait_s``; the step's wait for the
slowest GPU, part of the breakdown's ``sync_wait``).

Normal rather than log-normal: a run of many kernels is near normal whatever each kernel's law (central limit
theorem), and at the coefficients of variation used here (a few percent) the log-normal's expected maximum differs
from the normal one by ``O(cv^2)``: at cv = 0.05 and N = 1,024 about 7 % of the wait itself.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

import numpy as np

__all__ = ["blom", "collective_wait_s", "expected_max_normal", "straggler_wait_s"]

#: Integration grid for ``expected_max_normal``: Phi is 1 to double precision beyond +8.3 and its n-th power
#: (n <= 2^20) is below 1e-300 under -8, so [-12, 12] holds every integrand's mass; step 1e-3, split at 0 where the
#: two tails meet (trapezoid rule on smooth integrands: error below 1e-7; e_2 and e_3 match their closed forms to
#: 1e-15).
_STEP = 1e-3
_GRID = np.linspace(-12.0, 12.0, 24_001)
_ZERO = 12_000  # the grid point at 0


@lru_cache(maxsize=1)
def _log_cdf() -> np.ndarray:
    """log Phi(x) on the grid, computed once (Phi from erfc, accurate in the lower tail)."""
    return np.log(np.array([0.5 * math.erfc(-x / math.sqrt(2.0)) for x in _GRID]))


@lru_cache(maxsize=4096)
def expected_max_normal(n: int) -> float:
    """``e_N``: the expected maximum of ``n`` independent standard normal variables (0 for n <= 1).

    >>> round(expected_max_normal(2), 6), round(1 / math.sqrt(math.pi), 6)   # e_2 = 1/sqrt(pi)
    (0.56419, 0.56419)
    >>> round(expected_max_normal(1024), 3)
    3.248
    """
    if n <= 1:
        return 0.0
    power = np.exp(n * _log_cdf())  # Phi(x)^n
    zero = _ZERO
    upper = np.trapezoid(1.0 - power[zero:], _GRID[zero:])
    lower = np.trapezoid(power[: zero + 1], _GRID[: zero + 1])
    return float(upper - lower)


def blom(n: int) -> float:
    """Blom's approximation of ``e_N`` (0 for n <= 1); the independent check of ``expected_max_normal``."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def collective_wait_s(variance_s2: float, members: int) -> float:
    """Expected seconds a blocking collective of ``members`` ranks waits for its slowest member, beyond the mean,
    when each member's run of kernels since the previous synchronisation has variance ``variance_s2`` (s^2),
    independently of the others'."""
    if members <= 1 or variance_s2 <= 0:
        return 0.0
    return math.sqrt(variance_s2) * expected_max_normal(members)


def straggler_wait_s(cv: float, world: int, busy_s: float) -> float:
    """Expected seconds a step waits for its slowest GPU when GPUs differ persistently by a coefficient of
    variation ``cv`` and each is busy ``busy_s`` with kernels: ``cv * e_world * busy_s``."""
    if world <= 1 or cv <= 0 or busy_s <= 0:
        return 0.0
    return cv * expected_max_normal(world) * busy_s
