"""One wall-clock deadline for a whole remat solve: graph build, start search, LP relaxation, MILP and extraction.

A time limit is created once, where a solve starts (``solve_remat``, ``stage_remat``), and passed down; every phase
asks how much time is left (``remaining``), hands a solver that much less what it needs outside the solver's clock,
stops its loops once ``expired``, and gives a sub-phase a share of what is left (``share``). The clock is injectable
so that tests can move time by hand.

>>> now = [0.0]
>>> d = Deadline(2.0, clock=lambda: now[0])
>>> d.remaining(), d.expired()
(2.0, False)
>>> quarter = d.share(0.25)
>>> now[0] = 0.6
>>> round(quarter.remaining(), 3), quarter.expired(), round(d.remaining(), 3)
(0.0, True, 1.4)
>>> d.less(1.0).remaining(), d.less(2.0).expired()
(0.4, True)
>>> now[0] = 5.0
>>> d.remaining(), d.expired()
(0.0, True)
>>> Deadline(None).remaining()
inf
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from plansim.errors import PlansimError

__all__ = ["Clock", "Deadline", "TimeUp"]

#: A clock: seconds from any fixed origin, never going back (``time.monotonic``).
Clock = Callable[[], float]


class TimeUp(Exception):
    """A phase stopped because its deadline passed (``Deadline.check``); caught inside the remat solve, never
    raised to a caller."""


class Deadline:
    """``seconds`` from now on ``clock`` (None or infinity: no limit).

    ``seconds`` must be a number >= 0 (0: already expired, so a solve returns the best schedule it finds without
    searching); anything else is a ``PlansimError`` naming ``option``.
    """

    __slots__ = ("clock", "end", "seconds")

    def __init__(
        self, seconds: float | None = None, *, clock: Clock = time.monotonic, option: str = "time_limit_s"
    ) -> None:
        if seconds is not None:
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or math.isnan(seconds) or seconds < 0:
                raise PlansimError(f"{option}={str(seconds)[:40]}: a time limit must be a number of seconds >= 0")
            if math.isinf(seconds):
                seconds = None
        self.clock = clock
        self.seconds: float | None = None if seconds is None else float(seconds)
        self.end: float | None = None if seconds is None else clock() + float(seconds)

    @classmethod
    def _until(cls, end: float | None, seconds: float | None, clock: Clock) -> Deadline:
        out = cls(None, clock=clock)
        out.end, out.seconds = end, seconds
        return out

    @property
    def limited(self) -> bool:
        """Whether there is a limit at all."""
        return self.end is not None

    def remaining(self) -> float:
        """Seconds left (never negative; infinity without a limit)."""
        return math.inf if self.end is None else max(0.0, self.end - self.clock())

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return self.end is not None and self.clock() >= self.end

    def check(self) -> None:
        """Raise ``TimeUp`` once the deadline has passed (for loops that cannot return a partial answer)."""
        if self.expired():
            raise TimeUp

    def share(self, fraction: float) -> Deadline:
        """A deadline ``fraction`` of the remaining time from now (never later than this one); the same clock and
        the same ``seconds`` (the limit the user gave, for reports)."""
        if self.end is None:
            return self
        return Deadline._until(self.clock() + fraction * self.remaining(), self.seconds, self.clock)

    def less(self, seconds: float) -> Deadline:
        """This deadline ``seconds`` earlier (for a phase that must leave time after it)."""
        if self.end is None:
            return self
        return Deadline._until(self.end - seconds, self.seconds, self.clock)

    def solver_limit(self, reserve: float = 0.0) -> float | None:
        """The time limit to hand a solver: what is left less ``reserve`` (what the call costs outside the
        solver's own clock, and what must be left for afterwards), or None without a limit. May be <= 0: then
        the call is not worth making."""
        return None if self.end is None else self.remaining() - reserve

    def __repr__(self) -> str:
        return "Deadline(None)" if self.end is None else f"Deadline({self.seconds}, remaining={self.remaining():.3f})"
