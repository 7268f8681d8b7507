"""``plansim remat --out``: the trade-off curve (CSV and chart) and the chosen schedule, written whole."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from plansim.files.outputs import staged_folder
from plansim.remat.api import schedule_document, tradeoff_frame
from plansim.remat.graph import RematGraph
from plansim.remat.result import RematResult
from plansim.report.remat_chart import tradeoff_chart

__all__ = ["write_schedule", "write_tradeoff"]


def write_tradeoff(
    out_dir: str | Path,
    graph: RematGraph,
    results: Sequence[RematResult],
    schedule: RematResult,
    *,
    budget_bytes: float | None = None,
    title: str | None = None,
) -> list[Path]:
    """Write ``tradeoff.csv``, ``tradeoff.png``, ``tradeoff.svg`` (the curve of ``results``) and ``schedule.json``
    (``schedule``'s ops) under ``out_dir`` (created), all or none (``plansim.files.outputs.staged_folder``); return the
    paths."""
    with staged_folder(out_dir) as stage:
        out = stage.path
        frame = tradeoff_frame(results, graph)
        csv_path = out / "tradeoff.csv"
        frame.to_csv(csv_path, index=False)
        charts = tradeoff_chart(frame, out / "tradeoff.svg", title or graph.name, budget_bytes=budget_bytes)
        sched_path = out / "schedule.json"
        sched_path.write_text(json.dumps(schedule_document(graph, schedule), indent=1) + "\n", encoding="utf-8")
        files = stage.final([csv_path, *charts, sched_path])
    return files


def write_schedule(out_dir: str | Path, graph: RematGraph, schedule: RematResult) -> list[Path]:
    """Write ``schedule.json`` (``schedule``'s ops, as ``write_tradeoff`` writes it) alone under ``out_dir``
    (created), whole (``plansim.files.outputs.staged_folder``); return its path in a list."""
    with staged_folder(out_dir) as stage:
        path = stage.path / "schedule.json"
        path.write_text(json.dumps(schedule_document(graph, schedule), indent=1) + "\n", encoding="utf-8")
        files = stage.final([path])
    return files
