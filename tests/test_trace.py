"""Chrome trace export: JSON round trip, strict nesting on every lane, minimal lanes, counters and metadata."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plansim.des.timeline import Span, chrome_trace, write_chrome_trace


def _x(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _meta(trace: dict[str, Any], name: str) -> dict[tuple[int, int], Any]:
    return {
        (e["pid"], e["tid"]): next(iter(e["args"].values()))
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == name
    }


def _ns(e: dict[str, Any]) -> tuple[int, int]:
    start = round(e["ts"] * 1e3)
    return start, start + round(e["dur"] * 1e3)


def _assert_lanes_nest(trace: dict[str, Any]) -> None:
    lanes: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in _x(trace):
        lanes[(e["pid"], e["tid"])].append(_ns(e))
    for lane, ivs in lanes.items():
        for i, (a0, a1) in enumerate(ivs):
            for b0, b1 in ivs[i + 1 :]:
                disjoint = a1 <= b0 or b1 <= a0
                nested = (a0 <= b0 and b1 <= a1) or (b0 <= a0 and a1 <= b1)
                assert disjoint or nested, (lane, (a0, a1), (b0, b1))


def _lanes_of(trace: dict[str, Any]) -> dict[str, int]:
    return {e["name"]: e["tid"] for e in _x(trace)}


def test_round_trip_through_json_and_file(tmp_path: Path) -> None:
    spans = [
        Span("gpu0 (stage 0)", "compute", "fwd mb0", 0.0, 1e-3, "forward", {"layer": 3, "flops": 1.5e12}),
        Span("gpu0 (stage 0)", "p2p", "send mb0", 1e-3, 1.2e-3, "p2p"),
        Span("gpu1 (stage 1)", "compute", "fwd mb0", 1.2e-3, 2.2e-3, "forward"),
    ]
    memory = {"gpu0 (stage 0)": [(0.0, 1e9), (1e-3, 2.5e9)], "gpu1 (stage 1)": [(1.2e-3, 3e9)]}
    trace = chrome_trace(spans, memory, metadata={"model": "gpt-1.3b", "step_time_s": 2.2e-3})
    assert json.loads(json.dumps(trace)) == trace
    assert trace["displayTimeUnit"] == "ms"
    assert trace["otherData"] == {"model": "gpt-1.3b", "step_time_s": 2.2e-3}
    x = _x(trace)
    assert [(e["name"], e["cat"], e["ts"], e["dur"]) for e in x] == [
        ("fwd mb0", "forward", 0.0, 1000.0),
        ("send mb0", "p2p", 1000.0, 200.0),
        ("fwd mb0", "forward", 1200.0, 1000.0),
    ]
    assert x[0]["args"] == {"layer": 3, "flops": 1.5e12}

    path = write_chrome_trace(tmp_path / "out" / "trace.json", spans, memory, metadata={"n": np.int64(3)})
    loaded = json.loads(path.read_text())
    assert loaded["traceEvents"] == trace["traceEvents"]
    assert loaded["otherData"] == {"n": 3}


def test_processes_threads_and_metadata() -> None:
    spans = [
        Span("gpu1", "dp", "allreduce", 0.0, 1.0),
        Span("gpu0", "p2p", "send", 0.0, 1.0),
        Span("gpu0", "compute", "a", 0.0, 1.0),
        Span("gpu0", "compute", "b", 0.5, 1.5),  # overlaps a without nesting: second compute lane
        Span("gpu0", "dp", "rs", 0.0, 1.0),
        Span("gpu1", "compute", "c", 0.0, 1.0),
    ]
    trace = chrome_trace(spans, {"gpu0": [(0.0, 1e9)], "host": [(0.0, 2e9)]})
    assert _meta(trace, "process_name") == {(1, 0): "gpu1", (2, 0): "gpu0", (3, 0): "host"}
    assert _meta(trace, "process_sort_index") == {(1, 0): 1, (2, 0): 2, (3, 0): 3}
    # Compute lanes first, then the other streams in first-seen order on that device.
    assert _meta(trace, "thread_name") == {
        (1, 1): "compute",
        (1, 2): "dp",
        (2, 1): "compute",
        (2, 2): "compute #2",
        (2, 3): "p2p",
        (2, 4): "dp",
    }
    assert _meta(trace, "thread_sort_index") == {k: k[1] for k in _meta(trace, "thread_name")}
    tids = {(e["pid"], e["name"]): e["tid"] for e in _x(trace)}
    assert tids == {(1, "allreduce"): 2, (2, "send"): 3, (2, "a"): 1, (2, "b"): 2, (2, "rs"): 4, (1, "c"): 1}
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert [(e["name"], e["pid"], e["ts"], e["args"]) for e in counters] == [
        ("memory", 2, 0.0, {"live GB": 1.0}),
        ("memory", 3, 0.0, {"live GB": 2.0}),
    ]


def test_sequential_spans_use_one_lane() -> None:
    spans = [Span("g", "compute", f"k{i}", i * 1e-3, (i + 1) * 1e-3) for i in range(10)]
    assert set(_lanes_of(chrome_trace(spans)).values()) == {1}


def test_two_overlapping_spans_use_two_lanes() -> None:
    trace = chrome_trace([Span("g", "compute", "b", 0.5, 2.0), Span("g", "compute", "a", 0.0, 1.0)])
    assert _lanes_of(trace) == {"a": 1, "b": 2}
    assert _meta(trace, "thread_name") == {(1, 1): "compute", (1, 2): "compute #2"}


def test_container_with_children_uses_one_lane() -> None:
    spans = [
        Span("g", "compute", "child 2", 0.5, 1.0),
        Span("g", "compute", "child 1", 0.0, 0.5),
        Span("g", "compute", "grandchild", 0.0, 0.25),
        Span("g", "compute", "marker", 0.5, 0.5),
        Span("g", "compute", "fwd layer", 0.0, 1.0),  # the container, listed last, same start as child 1
    ]
    trace = chrome_trace(spans)
    assert set(_lanes_of(trace).values()) == {1}
    # Start order, container before its children.
    assert [e["name"] for e in _x(trace)] == ["fwd layer", "child 1", "grandchild", "child 2", "marker"]
    _assert_lanes_nest(trace)


def test_lowest_lane_is_reused() -> None:
    spans = [
        Span("g", "compute", "a", 0.0, 2.0),
        Span("g", "compute", "b", 1.0, 3.0),  # lane 2
        Span("g", "compute", "c", 2.5, 4.0),  # a has ended: back to lane 1
        Span("g", "compute", "d", 3.5, 5.0),  # overlaps c, b has ended: lane 2
    ]
    assert _lanes_of(chrome_trace(spans)) == {"a": 1, "b": 2, "c": 1, "d": 2}


def test_streams_get_their_own_lanes() -> None:
    spans = [Span("g", "compute", "a", 0.0, 2.0), Span("g", "dp", "b", 1.0, 3.0)]
    assert _lanes_of(chrome_trace(spans)) == {"a": 1, "b": 2}


def test_bad_spans_raise() -> None:
    with pytest.raises(ValueError, match="before it starts"):
        chrome_trace([Span("g", "compute", "a", 1.0, 0.5)])
    with pytest.raises(ValueError, match="finite"):
        chrome_trace([Span("g", "compute", "a", 0.0, float("inf"))])


def test_empty_trace() -> None:
    assert chrome_trace([]) == {"traceEvents": [], "displayTimeUnit": "ms", "otherData": {}}


_times = st.integers(0, 40).map(lambda k: k * 0.25e-3)  # coarse grid: many ties, touches and zero-length spans


@st.composite
def _spans(draw: st.DrawFn) -> list[Span]:
    out = []
    for i in range(draw(st.integers(0, 40))):
        a, b = sorted((draw(_times), draw(_times)))
        device = draw(st.sampled_from(["gpu0", "gpu1"]))
        stream = draw(st.sampled_from(["compute", "compute", "p2p", "dp"]))
        out.append(Span(device, stream, f"s{i}", a, b, args={"i": i}))
    return out


@settings(max_examples=200, deadline=None)
@given(spans=_spans())
def test_random_spans_nest_on_every_lane(spans: list[Span]) -> None:
    trace = chrome_trace(spans, {s.device: [(s.start_s, 1e9)] for s in spans[:1]})
    _assert_lanes_nest(trace)
    x = _x(trace)
    assert sorted(e["args"]["i"] for e in x) == list(range(len(spans)))  # each span exactly once
    names = _meta(trace, "thread_name")
    pids = {v: k[0] for k, v in _meta(trace, "process_name").items()}
    for e in x:
        s = spans[e["args"]["i"]]
        assert e["ts"] == pytest.approx(s.start_s * 1e6, abs=1e-6)
        assert e["dur"] == pytest.approx((s.end_s - s.start_s) * 1e6, abs=1e-6)
        assert e["pid"] == pids[s.device]
        assert names[(e["pid"], e["tid"])].split(" #")[0] == s.stream
    # Greedy lanes never exceed the peak number of spans of one stream live at one instant.
    for (pid, _tid), name in names.items():
        if " #" in name:
            stream, k = name.split(" #")
            device = next(d for d, p in pids.items() if p == pid)
            ivs = [(s.start_s, s.end_s) for s in spans if (s.device, s.stream) == (device, stream)]
            deepest = max(sum(a <= t < b or a == b == t for a, b in ivs) for t, _ in ivs)
            assert int(k) <= deepest
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    if spans:
        assert [(c["pid"], c["name"]) for c in counters] == [(pids[spans[0].device], "memory")]
    assert json.loads(json.dumps(trace)) == trace
