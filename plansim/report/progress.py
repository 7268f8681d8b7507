"""Progress of a long command, on stderr only (stdout stays the result: a table, JSON or CSV).

On a terminal, a rich bar (what, bar, done/total, the current step, time elapsed, time left) that disappears when
done. Elsewhere (a pipe, a file, CI, ``TERM=dumb``) plain lines, from a background thread so that a step that blocks
(a MILP solve, one long simulation) still shows the time going by: nothing for the first ``DELAY_S`` seconds (a
quick command prints nothing), then a line when the step changes and at least every ``EVERY_S`` seconds, and a last
line with the total time when anything was printed. Where the work is counted, a line also estimates the time left
(``remaining_s``: the phase's rate so far, once ``ESTIMATE_AFTER`` of it is done). ``PLANSIM_PROGRESS=off`` in
the environment silences it (the test suite sets it, so that an error stays one line on stderr however slow the
machine).

    with Progress("pricing candidates") as p:
        p.update(done, total)          # or p.update(label="solving the MILP"), p.advance(label=...)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from types import TracebackType
from typing import IO, Any

__all__ = ["DELAY_S", "ESTIMATE_AFTER", "EVERY_S", "Progress"]

#: Plain lines start once a command has run this long (seconds).
DELAY_S = 2.0
#: And repeat at least this often (seconds) while nothing changes.
EVERY_S = 15.0
_POLL_S = 0.25
#: The time left is estimated once this share of a phase's work is done (before, one slow first item would say
#: nothing about the rest).
ESTIMATE_AFTER = 0.02


def _live(stream: IO[str]) -> bool:
    """Whether ``stream`` is a terminal that can redraw a bar."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM") != "dumb" and not os.environ.get("CI")


class Progress:
    """Progress of ``what`` on ``stream`` (default stderr): a rich bar where ``live`` (default: ``stream`` is a
    terminal), else plain lines (see the module docstring)."""

    def __init__(
        self, what: str, total: int | None = None, *, stream: IO[str] | None = None, live: bool | None = None
    ) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self.label = ""
        self.stream = stream if stream is not None else sys.stderr
        self.live = _live(self.stream) if live is None else live
        self.off = os.environ.get("PLANSIM_PROGRESS", "").lower() in ("off", "0", "no", "false")
        self._bar: Any = None
        self._task: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._began = 0.0
        self._phase_began = 0.0
        self._printed = False

    def __enter__(self) -> Progress:
        self._began = self._phase_began = time.perf_counter()
        if self.off:
            return self
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn(self.what),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.total)
        else:
            self._thread = threading.Thread(target=self._lines, name="plansim-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, error, tb)
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if self._printed and kind is None:
                self._write(f"{self.what}: done in {self._elapsed()}")

    def update(self, done: int | None = None, total: int | None = None, label: str | None = None) -> None:
        """Set the count done, the total and the current step's label (each where given)."""
        if done is not None:
            self.done = done
        if total is not None:
            self.total = total
        if label is not None:
            self.label = label
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, total=self.total, description=self.label)

    def counter(self, label: str | None = None) -> Any:
        """A ``progress(done, total)`` callback (the planner's, the sweep's, the profiler's) that moves this."""
        if label is not None:
            self.update(label=label)

        def progress(done: int, total: int) -> None:
            self.update(done, total)

        return progress

    def advance(self, label: str | None = None, by: int = 1) -> None:
        """Count ``by`` more done and set the current step's label."""
        self.update(self.done + by, label=label)

    def phase(self, label: str, total: int | None = None) -> None:
        """A new phase of the work: its label, and its own count from 0 (of ``total``; None: not counted)."""
        self.done, self.total, self.label = 0, total, label
        self._phase_began = time.perf_counter()
        if self._bar is not None:  # a bar's total cannot go back to None: a new task for the phase
            self._bar.remove_task(self._task)
            self._task = self._bar.add_task(label, total=total)

    # Plain lines.

    def _elapsed(self) -> str:
        return _duration(time.perf_counter() - self._began)

    def remaining_s(self, now: float | None = None) -> float | None:
        """Seconds the phase's work left should take at its rate so far: None until ``ESTIMATE_AFTER`` of a counted
        total is done, and once all of it is.

        >>> p = Progress("x", 100)
        >>> p.update(25)
        >>> p._phase_began = 0.0
        >>> p.remaining_s(now=10.0)  # a quarter in 10 s: three quarters in 30 s more
        30.0
        """
        total, done = self.total or 0, self.done
        if total <= 0 or not total * ESTIMATE_AFTER <= done < total:
            return None
        spent = (time.perf_counter() if now is None else now) - self._phase_began
        return spent * (total - done) / done

    def _line(self) -> str:
        count = f" {self.done:,}/{self.total:,}" if self.total else ""
        label = f": {self.label}" if self.label else ""
        left = self.remaining_s()
        estimate = f", about {_duration(left)} left" if left is not None else ""
        return f"{self.what}{count}{label} ({self._elapsed()}{estimate})"

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: progress is not worth failing for
            pass

    def _lines(self) -> None:
        shown, last = None, 0.0
        while not self._stop.wait(_POLL_S):
            now = time.perf_counter()
            if now - self._began < DELAY_S:
                continue
            state = (self.label, self.done * 10 // max(self.total or 1, 1))  # the step, the tenth of the work
            if state != shown or now - last >= EVERY_S:
                shown, last = state, now
                self._printed = True
                self._write(self._line())


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
