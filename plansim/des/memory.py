"""Per-device memory tracking for the discrete-event simulator.

A :class:`MemoryTracker` follows the named tensors live on one device as the simulation allocates and frees them: the
live total, its peak (when, and how it splits by category), a compact timeline, and the first moment the device ran
out of memory. Running out is a result, recorded as an :class:`OutOfMemory`, not an exception; a double allocation,
a free of something not live, or time going backwards is a bug in the caller and raises ``ValueError``.

>>> m = MemoryTracker("gpu 0 (stage 0)", capacity_bytes=10e9)
>>> m.alloc("weights", 4e9, 0.0, "weights")
>>> m.alloc("act mb0", 3e9, 0.5, "activations")
>>> m.free("act mb0", 1.0)
>>> m.live_bytes, m.peak_bytes, m.peak_time_s, m.timeline
(4000000000.0, 7000000000.0, 0.5, [(0.0, 4000000000.0), (0.5, 7000000000.0), (1.0, 4000000000.0)])
>>> m.peak_by_category
{'weights': 4000000000.0, 'activations': 3000000000.0}
>>> m.alloc("act mb1", 7e9, 1.5, "activations")
>>> print(m.oom.message())
gpu 0 (stage 0) ran out of memory at 1.500 s: 11.0 GB live of 10.0 GB; largest: act mb1 (7.0 GB), weights (4.0 GB)

``rounding`` is reserved over allocated bytes for activations: each activation allocation also holds
``(rounding - 1) x`` its bytes in the category ``fragmentation`` until it is freed. (The lowering passes 1.0 and
allocates the caching allocator's exact rounding of each activation as ``<name>#rounding`` beside it, which ``free``
releases with it: ``plansim.step.memory.layer_memory``.)

>>> m = MemoryTracker("gpu 0", capacity_bytes=10e9, rounding=1.01)
>>> m.alloc("act", 1e9, 0.0, "activations")
>>> {k: round(v) for k, v in m.peak_by_category.items()}
{'activations': 1000000000, 'fragmentation': 10000000}
>>> m.free("act", 1.0)
>>> m.live_bytes
0.0
"""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass

from plansim.units import GB

__all__ = ["MemoryTracker", "OutOfMemory"]

#: How many of the largest live tensors an :class:`OutOfMemory` names.
OOM_LARGEST = 5


def _size(n_bytes: float) -> str:
    """A byte count in the largest decimal unit it reaches, one decimal (``2.1 GB``, ``512.0 MB``, ``64 B``)."""
    for unit, scale in (("GB", GB), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes:.0f} B"


@dataclass(frozen=True)
class OutOfMemory:
    """The first moment a device's live bytes exceeded its capacity."""

    device: str
    time_s: float
    live_bytes: float
    capacity_bytes: float
    #: The largest live tensors at that moment, ``(name, bytes)``, largest first (at most five).
    largest: tuple[tuple[str, float], ...]

    def message(self) -> str:
        """One line: device, time, live and capacity, and the largest live tensors."""
        # One decimal in GB, more where one decimal would print live and capacity as the same number.
        digits = 1
        while digits < 9 and f"{self.live_bytes / GB:.{digits}f}" == f"{self.capacity_bytes / GB:.{digits}f}":
            digits += 1
        live, cap = f"{self.live_bytes / GB:.{digits}f}", f"{self.capacity_bytes / GB:.{digits}f}"
        largest = ", ".join(f"{name} ({_size(n)})" for name, n in self.largest)
        return (
            f"{self.device} ran out of memory at {self.time_s:.3f} s: {live} GB live of {cap} GB; "
            f"largest: {largest or '(none)'}"
        )


class MemoryTracker:
    """Live tensors on one device: totals, peak, per-category split at the peak, timeline and the first OOM.

    ``timeline`` holds ``(time, live bytes)`` after each change; several changes at one time collapse into one point
    (the last value). ``peak_by_category`` is the live bytes of each category at the peak instant (the first time the
    peak was reached); it names every category allocated up to then, 0 for those with nothing live at the peak.
    """

    __slots__ = (
        "_cat_count",
        "_cat_live",
        "_last_t",
        "_live",
        "_times",
        "_values",
        "capacity_bytes",
        "device",
        "live_bytes",
        "oom",
        "peak_by_category",
        "peak_bytes",
        "peak_time_s",
        "rounding",
    )

    def __init__(self, device: str, capacity_bytes: float, rounding: float = 1.0) -> None:
        if not capacity_bytes >= 0:
            raise ValueError(f"{device}: memory capacity must be >= 0 bytes, got {capacity_bytes!r}")
        self.device = device
        self.capacity_bytes = capacity_bytes
        self.rounding = rounding
        self.live_bytes: float = 0.0
        self.peak_bytes: float = 0.0
        self.peak_time_s: float = 0.0
        # the timeline as two arrays of 8-byte floats (times, live bytes): a full-mode run holds one per GPU
        self._times = array("d")
        self._values = array("d")
        self.peak_by_category: dict[str, float] = {}
        self.oom: OutOfMemory | None = None
        self._live: dict[str, tuple[float, str]] = {}  # name -> (bytes, category)
        self._cat_live: dict[str, float] = {}
        self._cat_count: dict[str, int] = {}
        self._last_t = float("-inf")

    def _advance(self, t: float, name: str) -> None:
        if not t >= self._last_t:  # also catches NaN
            raise ValueError(
                f"{self.device}: {name!r} at {t!r} s, before the last change at {self._last_t!r} s: time went backwards"
            )
        self._last_t = t

    @property
    def timeline(self) -> list[tuple[float, float]]:
        """``(time, live bytes)`` after each change (several at one time: the last)."""
        return list(zip(self._times, self._values, strict=True))

    def _record(self, t: float) -> None:
        times = self._times
        if times and times[-1] == t:
            self._values[-1] = self.live_bytes
        else:
            times.append(t)
            self._values.append(self.live_bytes)

    def alloc(self, name: str, n_bytes: float, t: float, category: str) -> None:
        """Allocate ``n_bytes`` (0 allowed) named ``name`` at time ``t``; ``name`` must not be live."""
        if name in self._live:
            raise ValueError(f"{self.device}: {name!r} allocated at {t!r} s while already live")
        if not n_bytes >= 0:
            raise ValueError(f"{self.device}: {name!r} allocated with {n_bytes!r} bytes (must be >= 0)")
        self._advance(t, name)
        self._add(name, n_bytes, category)
        if category == "activations" and self.rounding != 1.0:
            self._add(name + "#rounding", n_bytes * (self.rounding - 1.0), "fragmentation")
        self._record(t)
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_time_s = t
            self.peak_by_category = dict(self._cat_live)
        if self.oom is None and self.live_bytes > self.capacity_bytes:
            largest = heapq.nlargest(OOM_LARGEST, ((n, b) for n, (b, _) in self._live.items()), key=lambda x: x[1])
            self.oom = OutOfMemory(self.device, t, self.live_bytes, self.capacity_bytes, tuple(largest))

    def _add(self, name: str, n_bytes: float, category: str) -> None:
        self._live[name] = (n_bytes, category)
        cat_live = self._cat_live
        if category in cat_live:
            cat_live[category] += n_bytes
            self._cat_count[category] += 1
        else:
            cat_live[category] = n_bytes
            self._cat_count[category] = 1
        self.live_bytes += n_bytes

    def _remove(self, name: str, entry: tuple[float, str]) -> None:
        del self._live[name]
        n_bytes, category = entry
        count = self._cat_count[category] - 1
        self._cat_count[category] = count
        # Snap sums to exactly 0 when nothing is left, so float rounding does not leave crumbs behind.
        self._cat_live[category] = self._cat_live[category] - n_bytes if count else 0.0
        self.live_bytes = self.live_bytes - n_bytes if self._live else 0.0

    def free(self, name: str, t: float) -> None:
        """Free the live tensor ``name`` at time ``t``."""
        entry = self._live.get(name)
        if entry is None:
            raise ValueError(f"{self.device}: {name!r} freed at {t!r} s but it is not live")
        self._advance(t, name)
        self._remove(name, entry)
        rounding = self._live.get(name + "#rounding")
        if rounding is not None:
            self._remove(name + "#rounding", rounding)
        self._record(t)

    def live_tensors(self) -> dict[str, float]:
        """The live tensors now, ``{name: bytes}``, in allocation order."""
        return {name: n for name, (n, _) in self._live.items()}

    def live_by_category(self) -> dict[str, float]:
        """Live bytes per category now (every category allocated so far; 0 where nothing is live)."""
        return dict(self._cat_live)

    def __repr__(self) -> str:
        return (
            f"MemoryTracker({self.device!r}, live={self.live_bytes / GB:.3f} GB, peak={self.peak_bytes / GB:.3f} GB"
            f" at {self.peak_time_s:.6f} s, capacity={self.capacity_bytes / GB:.3f} GB"
            f"{', OOM' if self.oom else ''})"
        )
