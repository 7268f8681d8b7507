"""A time bound for a test's block: a SIGALRM timer that turns a hang into a failing ``TimeoutError``."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def alarm(seconds: float, what: str) -> Iterator[None]:
    """Raise ``TimeoutError`` in the block once it has run ``seconds`` (``what`` names it in the message)."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"hang: {what} ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
