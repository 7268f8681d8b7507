"""What ``plansim plan --out DIR`` writes: results.csv (the finalists, ranked, each with its count of equivalent
candidates left out), candidates.csv (every candidate that fits with the headroom: its analytic figures, or, for
those the search pruned, its memory and the lower bound on its step time, ``pruned`` true), results.json (the
summary, the explanation, the rejected candidates, each finalist's equivalents; with ``--robust`` the robustness
report), winner.yaml (a strategy file ``plansim simulate --strategy`` loads) and the charts
(``report.plan_charts``; with ``--robust`` the tornado chart, ``report.robust_chart``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from plansim.limits import machine_cores
from plansim.planner.explain import describe

if TYPE_CHECKING:
    from plansim.planner import PlanResult
    from plansim.planner.search import Pruned

__all__ = ["draw_charts", "plan_summary", "winner_yaml", "write_plan"]


def plan_summary(r: PlanResult) -> dict[str, Any]:
    """The plan as plain data (``--format json`` and results.json). No timings (``r.outcome.phase_s`` keeps the
    seconds of each phase), so the same input gives the same bytes."""
    winner = r.winner_result
    out: dict[str, Any] = {
        "model": r.model,
        "hardware": r.hardware,
        "gpus": r.gpus,
        "global_batch": r.global_batch,
        "seq_len": r.seq_len,
        "objective": r.objective,
        "headroom": r.outcome.headroom,
        "candidates": r.outcome.candidates,
        "fitting": r.outcome.fit_count,
        "winner": None if r.winner is None else _strategy_fields(r.winner),
        "winner_result": None if winner is None else winner.to_dict(),
        "explanation": r.explanation,
        "suggestion": r.suggestion,
        "rejected": dict(r.rejected_summary()),
        "finalists": [
            {
                "rank": k,
                "strategy": describe(f.priced.strategy),
                "analytic": f.priced.result.to_dict(),
                "des": None if f.des is None else f.des.to_dict(),
                "equivalent": {
                    "count": len(r.outcome.equivalent_to(f.priced.strategy)),
                    "settings": r.equivalent_settings(f.priced.strategy),
                    "strategies": [describe(p.strategy) for p in r.outcome.equivalent_to(f.priced.strategy)],
                },
            }
            for k, f in enumerate(r.outcome.finalists, start=1)
        ],
        "megatron_style": None
        if r.megatron is None
        else {"strategy": describe(r.megatron.priced.strategy), "result": r.megatron.result.to_dict()},
    }
    if r.robust is not None:
        out["robust"] = r.robust.to_dict()
    if r.training is not None:
        t = r.training
        out["training"] = {
            "tokens": t.tokens, "steps": t.steps, "days": t.days, "gpu_hours": t.gpu_hours, "cost": t.cost,
        }  # fmt: skip
    return out


def draw_charts(charts: list[tuple[Any, ...]], jobs: int) -> list[Path]:
    """Each ``(chart, *args)`` called (a chart writer, returning the paths it wrote), in ``jobs`` processes where
    there are several; the paths in ``charts``' order."""
    if jobs <= 1 or len(charts) <= 1:
        return [path for chart, *args in charts for path in chart(*args)]
    from concurrent.futures import ProcessPoolExecutor

    import matplotlib.backends.backend_agg  # noqa: F401  # imported once, before the processes fork

    with ProcessPoolExecutor(max_workers=min(jobs, len(charts))) as pool:
        return [path for paths in pool.map(_draw, charts) for path in paths]


def _draw(chart: tuple[Any, ...]) -> list[Path]:
    writer, *args = chart
    return list(writer(*args))


def _pruned_row(r: PlanResult, p: Pruned) -> dict[str, Any]:
    """A pruned candidate's candidates.csv row: what is known of it (its memory, exact) and its step time's lower
    bound (``step_time_bound_s``); the columns of a priced row that it lacks stay empty."""
    from plansim.step.result import MEMORY_CATEGORIES

    return {
        "strategy": describe(p.strategy), "model": r.model, "hardware": r.hardware, "gpus": r.gpus,
        **{f"strategy.{k}": v for k, v in p.resolved.model_dump().items()},
        "engine": "analytic", "fits": True, "peak_memory_bytes": p.peak_memory_bytes,
        **{f"memory_breakdown_bytes.{k}": round(p.memory.get(k, 0)) for k in MEMORY_CATEGORIES},
        "memory_margin": p.memory_margin, "pruned": True, "step_time_bound_s": p.bound_s,
    }  # fmt: skip


def _strategy_fields(s: Any) -> dict[str, Any]:
    return {k: v for k, v in s.model_dump(mode="json").items() if v is not None}


def winner_yaml(r: PlanResult) -> str:
    """The winner as a strategy file, with where it came from in a comment; with the run's ``seq_len`` where the
    plan was given one (``simulate`` applies it to the model)."""
    assert r.winner is not None
    at = "" if r.seq_len is None else f", seq_len {r.seq_len}"
    head = (
        f"# plansim plan: best of {r.outcome.candidates} candidates for {r.model} on {r.gpus} x {r.hardware}, "
        f"global batch {r.global_batch}{at}\n# load with: plansim simulate --model {r.model} --hardware "
        f"{r.hardware} --gpus {r.gpus} --strategy winner.yaml\n"
    )
    length = {} if r.seq_len is None else {"seq_len": r.seq_len}
    return head + yaml.safe_dump({**_strategy_fields(r.winner), **length}, sort_keys=False)


def write_plan(r: PlanResult, out: str | Path, jobs: int | None = None) -> list[Path]:
    """Write the files named in the module docstring into ``out``, all or none (``plansim.files.outputs.staged_folder``:
    an interrupted or failed run leaves the previous files); returns their paths. The charts are drawn side by side
    in ``jobs`` processes (default: the cores), the same bytes as one after another."""
    import pandas as pd

    from plansim.files.outputs import staged_folder
    from plansim.report.plan_charts import memory_chart, time_chart

    with staged_folder(out) as stage:
        directory = stage.path
        written = []
        frame = r.frame()
        frame.to_csv(directory / "results.csv", index=False)
        written.append(directory / "results.csv")
        rows = [{"strategy": describe(p.strategy), **p.result.to_row(), "pruned": False} for p in r.outcome.fitting]
        rows += [_pruned_row(r, p) for p in r.outcome.pruned if not p.tight]
        pd.DataFrame(rows).to_csv(directory / "candidates.csv", index=False)
        written.append(directory / "candidates.csv")
        (directory / "results.json").write_text(json.dumps(plan_summary(r), indent=2), encoding="utf-8")
        written.append(directory / "results.json")
        if r.winner is not None:
            (directory / "winner.yaml").write_text(winner_yaml(r), encoding="utf-8")
            written.append(directory / "winner.yaml")
        charts: list[tuple[Any, ...]] = []
        title = f"{r.model} on {r.gpus} x {r.hardware}, global batch {r.global_batch}"
        if len(frame):
            charts += [(time_chart, frame, directory / "time_breakdown.svg", title)]
            charts += [(memory_chart, frame, directory / "memory.svg", title)]
        if r.robust is not None:
            from plansim.report.robust_chart import tornado_chart

            charts += [(tornado_chart, r.robust, directory / "robust.svg", title)]
        written += draw_charts(charts, machine_cores() if jobs is None else jobs)
        files = stage.final(written)
    return files
