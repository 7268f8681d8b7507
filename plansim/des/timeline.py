"""The discrete-event engine's timeline (spans, memory over time, link traffic) and its export as a Chrome trace
(Trace Event Format JSON), to open in Perfetto or ``chrome://tracing``. It lives beside ``plansim.result``: the
engine builds it, reports and the CLI read it.

Format: Google's "Trace Event Format" document
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU). Each device is one process; each
stream ("compute", "p2p", "dp", ...) is one or more threads (lanes). Complete events ("X") on one thread must nest
strictly (disjoint, or one inside the other), so a span that would overlap a span of its lane without nesting goes
to the stream's next lane ("compute", "compute #2", ...). Lanes are assigned greedily in start order (ties: longer
first, so a container comes before its children), each span to the lowest lane that accepts it.

Times are rounded to whole nanoseconds before lanes are assigned, so the nesting the assignment guarantees holds
exactly for a viewer that reads ``ts`` and ``dur`` (microseconds) back into nanoseconds, as Perfetto does. Process
and thread ids start at 1: Perfetto treats pid 0 as the Linux idle task ("swapper").

>>> t = chrome_trace([Span("gpu0", "compute", "fwd", 0.0, 1e-3), Span("gpu0", "compute", "gemm", 0.0, 5e-4)])
>>> [(e["ph"], e["name"], e["tid"], e.get("ts"), e.get("dur")) for e in t["traceEvents"] if e["ph"] == "X"]
[('X', 'fwd', 1, 0.0, 1000.0), ('X', 'gemm', 1, 0.0, 500.0)]
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plansim.units import GB

__all__ = ["Span", "Timeline", "chrome_trace", "write_chrome_trace"]

#: The stream whose lanes come first in every process.
COMPUTE = "compute"


@dataclass(frozen=True)
class Span:
    """One interval of work on one stream of one device, in seconds."""

    device: str  # e.g. "gpu0 (stage 0)": one trace process per device
    stream: str  # e.g. "compute", "p2p", "dp": one or more lanes (threads) per stream
    name: str
    start_s: float
    end_s: float
    category: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)


def _ns(t: float, what: str) -> int:
    if not math.isfinite(t):
        raise ValueError(f"{what}: time must be finite, got {t!r}")
    return round(t * 1e9)


class _Lane:
    """One thread: the chain of open spans (each inside the one below it), as end times in ns."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open: list[int] = []

    def accepts(self, start: int, end: int) -> bool:
        # Spans come in start order, so a span that ended by ``start`` is disjoint from this and every later one.
        stack = self.open
        while stack and stack[-1] <= start:
            stack.pop()
        return not stack or end <= stack[-1]


def _assign_lanes(spans: Sequence[Span], ns: Sequence[tuple[int, int]]) -> tuple[list[int], dict[tuple[str, str], int]]:
    """The lane index of each span within its (device, stream), and the number of lanes of each (device, stream)."""
    order = sorted(range(len(spans)), key=lambda i: (ns[i][0], ns[i][0] - ns[i][1]))
    lanes: dict[tuple[str, str], list[_Lane]] = {}
    lane_of = [0] * len(spans)
    for i in order:
        start, end = ns[i]
        key = (spans[i].device, spans[i].stream)
        stream_lanes = lanes.setdefault(key, [])
        k = next((k for k, lane in enumerate(stream_lanes) if lane.accepts(start, end)), len(stream_lanes))
        if k == len(stream_lanes):
            stream_lanes.append(_Lane())
        stream_lanes[k].open.append(end)
        lane_of[i] = k
    return lane_of, {key: len(v) for key, v in lanes.items()}


def chrome_trace(
    spans: Iterable[Span],
    memory: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    *,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The trace as a JSON-ready dict: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": metadata}``.

    ``memory`` maps a device to its ``(time s, live bytes)`` timeline (``MemoryTracker.timeline``); each becomes a
    counter track "memory" (``live GB``) in that device's process. Process ids follow the order devices are first
    seen (spans first, then ``memory``); threads list compute lanes first, then the other streams in the order they
    are first seen on that device. X events come in start order (a container before its children).
    """
    spans = list(spans)
    ns = []
    for s in spans:
        start, end = _ns(s.start_s, s.name), _ns(s.end_s, s.name)
        if end < start:
            raise ValueError(f"span {s.name!r} on {s.device} {s.stream}: ends ({s.end_s!r} s) before it starts")
        ns.append((start, end))
    lane_of, n_lanes = _assign_lanes(spans, ns)

    # Processes in first-seen order; per process, streams in first-seen order with compute first.
    pids: dict[str, int] = {}
    streams: dict[str, list[str]] = {}
    for s in spans:
        if s.device not in pids:
            pids[s.device] = len(pids) + 1
            streams[s.device] = []
        if s.stream not in streams[s.device]:
            streams[s.device].append(s.stream)
    for device in memory or {}:
        if device not in pids:
            pids[device] = len(pids) + 1
            streams[device] = []

    events: list[dict[str, Any]] = []
    tids: dict[tuple[str, str], int] = {}  # (device, stream) -> tid of its first lane
    for device, pid in pids.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": device}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        tid = 1
        for stream in sorted(streams[device], key=lambda x: x != COMPUTE):  # stable: compute first, rest in order
            tids[(device, stream)] = tid
            for k in range(n_lanes[(device, stream)]):
                name = stream if k == 0 else f"{stream} #{k + 1}"
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
                events.append(
                    {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
                )
                tid += 1

    for i in sorted(range(len(spans)), key=lambda i: (ns[i][0], ns[i][0] - ns[i][1])):
        s = spans[i]
        start, end = ns[i]
        events.append(
            {
                "ph": "X",
                "name": s.name,
                "cat": s.category,
                "ts": start / 1e3,
                "dur": (end - start) / 1e3,
                "pid": pids[s.device],
                "tid": tids[(s.device, s.stream)] + lane_of[i],
                "args": dict(s.args),
            }
        )

    for device, timeline in (memory or {}).items():
        pid = pids[device]
        for t, live in timeline:
            events.append(
                {
                    "ph": "C",
                    "name": "memory",
                    "ts": _ns(t, f"memory of {device}") / 1e3,
                    "pid": pid,
                    "tid": 0,
                    "args": {"live GB": live / GB},
                }
            )

    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(metadata or {})}


def _json_default(x: Any) -> Any:
    """numpy scalars and arrays as numbers and lists; anything else as its ``str``."""
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def write_chrome_trace(
    path: str | Path,
    spans: Iterable[Span],
    memory: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    *,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write :func:`chrome_trace` as JSON to ``path`` (parents created), whole (``plansim.files.outputs.atomic_path``);
    returns the path."""
    from plansim.files.outputs import atomic_path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    trace = chrome_trace(spans, memory, metadata=metadata)
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        json.dump(trace, f, default=_json_default, separators=(",", ":"))
    return path


class Timeline:
    """What a discrete-event simulation saw: task spans, memory over time per device, and per-link traffic.

    ``spans`` and ``memory`` are given as such, or as callables that make them: the engine hands over its per-task
    times and memory trackers, and they are made the first time they are read (a large step's spans run to
    millions of objects, which a run whose figures alone are read never needs)."""

    __slots__ = ("_memory", "_spans", "link_bytes", "link_utilization", "step_time_s")

    def __init__(
        self,
        spans: list[Span] | Callable[[], list[Span]],
        memory: dict[str, list[tuple[float, float]]] | Callable[[], dict[str, list[tuple[float, float]]]],
        link_bytes: dict[str, float],
        link_utilization: dict[str, float],
        step_time_s: float,
    ) -> None:
        self._spans = spans
        self._memory = memory
        self.link_bytes = link_bytes
        self.link_utilization = link_utilization
        self.step_time_s = step_time_s

    @property
    def spans(self) -> list[Span]:
        """Every task's span (made on first read where the engine handed over a callable)."""
        if callable(self._spans):
            self._spans = self._spans()
        return self._spans

    @property
    def memory(self) -> dict[str, list[tuple[float, float]]]:
        """Per device, ``(time, live bytes)`` after each change (made on first read where a callable was given)."""
        if callable(self._memory):
            self._memory = self._memory()
        return self._memory

    def write_trace(self, path: str) -> str:
        """Write the Chrome trace-event JSON (opens in Perfetto); returns the path."""
        return str(write_chrome_trace(path, self.spans, self.memory, metadata={"step_time_s": self.step_time_s}))
