"""Every chart the CLI and the API write, built from small real runs through the writers themselves (``write_plan``,
``write_comparison``, ``write_sweep``, ``write_tradeoff``, ``compare_saved``) and checked with matplotlib's tight
bounding boxes: nothing (titles, texts, tick labels, axis labels, legends) reaches past the figure's edge, no
legend sits on an axis's labels or on another legend, and no legend entry is a series that is zero everywhere.
The chart-specific defects of issue 17 have a check each below."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

pytest.importorskip("matplotlib")

from test_validation import _measured_rows  # measured.csv rows as validate writes them

import plansim
from plansim.comparison.output import write_comparison
from plansim.hardware.topology import link_tier
from plansim.planner.output import write_plan
from plansim.remat.api import default_budgets, plan_remat, remat_graph
from plansim.report import compare_charts, figures, plan_charts, remat_chart, robust_chart, sweep_charts
from plansim.report.remat_output import write_tradeoff
from plansim.sweep import SweepGrid, sweep
from plansim.sweep.output import write_sweep
from plansim.validation.points import default_points
from plansim.validation.run import compare_saved

#: its module-scoped fixtures computed once: every test here on one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_chart_layout")

#: Every chart the writers below produce: <run>/<file stem>. A writer that starts writing another chart fails
#: ``test_every_written_chart_is_checked`` until it is listed here (and so checked).
CHARTS = (
    "plan/time_breakdown",
    "plan/memory",
    "plan/robust",
    "compare/time_breakdown",
    "compare/memory",
    "compare/communication",
    "compare/timeline",
    "compare/scaling",
    "traffic/time_breakdown",
    "traffic/memory",
    "traffic/communication",
    "traffic/timeline",
    "sweep/scaling_tokens_per_s",
    "sweep/scaling_mfu",
    "remat/tradeoff",
    "validation/predicted_vs_measured",
)

#: The compared strategies: 3D on 8 GPUs (tp2 pp2: 12 GPUs cannot run it, the batch does not split over dp=3) and
#: pure data parallelism (all-reduce traffic only: its tp, pp and zero series are zero).
THREE_D = (
    "dp=2,tp=2,pp=2,micro_batch=1,global_batch=16,schedule=interleaved,virtual_stages=3,zero=1,"
    "sequence_parallel=true,remat=selective"
)
DATA = "dp=8,micro_batch=2,global_batch=16"


@pytest.fixture(scope="module")
def charts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run every writer once with ``save_figure`` recording the Figure it is given (laid out as ``save_figure``
    lays it out, and writing nothing)."""
    out = tmp_path_factory.mktemp("charts")
    captured: dict[str, Any] = {}

    def record(fig: Any, path: str | Path, *, top: float = 1.0) -> list[Path]:
        if fig.get_layout_engine() is None:  # what save_figure does to a figure without a layout engine
            fig.tight_layout(rect=(0, 0, 1, top))
        path = Path(path)
        folder = path.parent.parent if path.parent.name.startswith(".plansim-tmp-") else path.parent  # a staging one
        captured[f"{folder.name}/{path.stem}"] = fig
        return [path]

    patch = pytest.MonkeyPatch()
    for module in (compare_charts, plan_charts, sweep_charts, remat_chart, robust_chart, figures):
        patch.setattr(module, "save_figure", record)
    try:
        result = plansim.plan(
            "gpt3-125m", "dgx-a100", gpus=8, global_batch=16, top_k=3, des=False, milp=False, robust=True
        )
        write_plan(result, out / "plan", jobs=1)  # drawn in this process, where save_figure records them
        comparison = plansim.compare(
            "gpt3-125m", [THREE_D, DATA], ["dgx-a100", "dgx-h100"], gpus=8, engine="des", scaling_gpus=[4, 8, 12, 16]
        )
        write_comparison(comparison, out / "compare")
        algorithms = [f"dp=16,micro_batch=1,global_batch=16,dp_algorithm={a}" for a in ("ring", "tree")]
        write_comparison(plansim.compare("gpt3-125m", algorithms, ["dgx-a100"], engine="des"), out / "traffic")
        grid = SweepGrid(("gpt3-125m",), ("dgx-a100", "dgx-h100"), (8, 16), (32, 64))
        write_sweep(sweep(grid), out / "sweep")
        graph = remat_graph("gpt3-125m", "dgx-a100", stage_layers=1, granularity="layer")
        budget = default_budgets(graph, 3)[1]
        remat = plan_remat(graph, budget, time_limit_s=5.0)
        write_tradeoff(out / "remat", graph, remat.results, remat.milp, budget_bytes=budget)
        _validation_folder(out / "validation")
        compare_saved(out / "validation")
    finally:
        patch.undo()
    return captured


def _validation_folder(folder: Path) -> None:
    """measured.csv and environment.json as ``validate --device cpu --quick`` writes them: the CPU's tiny models,
    whose peaks are a few MB."""
    folder.mkdir(parents=True)
    frame = _measured_rows(default_points("cpu", quick=True))
    frame["measured_step_time_s"] = [0.02 * (k + 1) for k in range(len(frame))]
    frame["measured_peak_memory_bytes"] = [3e6 * (k + 1) for k in range(len(frame))]
    frame.to_csv(folder / "measured.csv", index=False)
    (folder / "environment.json").write_text(json.dumps({"device_name": "cpu", "hardware": "dgx-a100"}))


# --- the checks --------------------------------------------------------------------------------------------------


def _drawn(fig: Any) -> Any:
    """Lay ``fig`` out and draw it (as saving does); a layout warning (axes collapsed, no room) is a failure."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.canvas.draw()
    return fig.canvas.get_renderer()


def _legends(fig: Any) -> list[Any]:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]


def _texts(fig: Any) -> Iterator[tuple[str, Any]]:
    """(name, artist) of every text-like artist that is drawn: titles, suptitle, annotations, whole axes (tick
    labels and axis labels, as their tight bounding box counts only the ticks drawn) and legends."""
    for text in fig.texts:
        yield f"figure text {text.get_text()!r}", text
    for k, ax in enumerate(fig.axes):
        for title in (ax.title, ax._left_title, ax._right_title):
            if title.get_text():
                yield f"axes {k} title {title.get_text()!r}", title
        for text in ax.texts:
            yield f"axes {k} text {text.get_text()!r}", text
        yield f"axes {k} x axis ({ax.get_xlabel()!r})", ax.xaxis
        yield f"axes {k} y axis ({ax.get_ylabel()!r})", ax.yaxis
    for legend in _legends(fig):
        yield f"legend {[t.get_text() for t in legend.get_texts()]}", legend


def _extent(artist: Any, renderer: Any) -> Any:
    """An axis's tight bounding box (its drawn tick labels and its label), else the artist's window extent."""
    if hasattr(artist, "get_ticks_position"):
        return artist.get_tightbbox(renderer)
    return artist.get_window_extent(renderer)


def layout_problems(fig: Any) -> list[str]:
    """Every clipped artist, every legend on an axis's labels or on another legend, and every legend entry that is
    zero everywhere, as one line each."""
    renderer = _drawn(fig)
    page = fig.bbox
    problems = []
    slack = 1.0  # pixels: anti-aliasing of a glyph on the edge
    for name, artist in _texts(fig):
        box = _extent(artist, renderer)
        if box is None or (box.width == 0 and box.height == 0):
            continue
        if box.x0 < page.x0 - slack or box.y0 < page.y0 - slack or box.x1 > page.x1 + slack or box.y1 > page.y1 + slack:
            problems.append(f"{name} is clipped: {box.bounds} outside the figure {page.bounds}")
    whole, size = fig.get_tightbbox(renderer), fig.bbox_inches  # inches
    if whole.x0 < -0.01 or whole.y0 < -0.01 or whole.x1 > size.x1 + 0.01 or whole.y1 > size.y1 + 0.01:
        problems.append(f"the figure's tight bounding box {whole.bounds} exceeds its size {size.bounds}")
    legends = _legends(fig)
    for i, legend in enumerate(legends):
        box = legend.get_window_extent(renderer)
        for k, ax in enumerate(fig.axes):
            for axis, what in ((ax.xaxis, "x"), (ax.yaxis, "y")):
                labels = axis.get_tightbbox(renderer)
                if labels is not None and box.overlaps(labels):
                    problems.append(f"legend {i} sits on axes {k}'s {what} axis labels")
            if ax.title.get_text() and box.overlaps(ax.title.get_window_extent(renderer)):
                problems.append(f"legend {i} sits on axes {k}'s title")
        for text in fig.texts:  # the suptitle
            if text.get_text() and box.overlaps(text.get_window_extent(renderer)):
                problems.append(f"legend {i} sits on {text.get_text()!r}")
        for j in range(i + 1, len(legends)):
            if box.overlaps(legends[j].get_window_extent(renderer)):
                problems.append(f"legends {i} and {j} overlap")
    for k, ax in enumerate(fig.axes):  # texts on the axes (annotations) never on one another
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if t.get_text()]
        for i, (a, box) in enumerate(boxes):
            problems += [f"axes {k}: texts {a!r} and {b!r} overlap" for b, o in boxes[i + 1 :] if box.overlaps(o)]
    entries = {t.get_text() for legend in legends for t in legend.get_texts()}
    for ax in fig.axes:
        for container in ax.containers:
            if container.get_label() in entries:
                sizes = [p.get_width() if container.orientation == "horizontal" else p.get_height() for p in container]
                if not any(s and not math.isnan(s) for s in sizes):
                    problems.append(f"legend entry {container.get_label()!r} is zero everywhere")
        for line in ax.lines:
            drawn_as_line = line.get_linestyle() not in ("None", "none", "")
            if line.get_label() in entries and drawn_as_line and not any(y and y == y for y in line.get_ydata()):
                problems.append(f"legend entry {line.get_label()!r} is zero everywhere")
    return problems


def test_every_written_chart_is_checked(charts: dict[str, Any]) -> None:
    assert sorted(charts) == sorted(CHARTS)


@pytest.mark.parametrize("name", CHARTS)
def test_nothing_is_clipped_or_covered(charts: dict[str, Any], name: str) -> None:
    assert layout_problems(charts[name]) == []


def test_the_check_finds_what_it_looks_for() -> None:
    """A chart with each defect: a legend past the figure's edge, a legend on the x axis's label, an all-zero
    series in the legend."""
    fig = figures.new_figure(4, 3)
    fig.set_layout_engine("none")
    ax = fig.add_subplot()
    ax.barh([0, 1], [1.0, 2.0], label="some")
    ax.barh([0, 1], [0.0, 0.0], label="nothing")
    ax.set_xlabel("a label under the axes")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2)
    fig.legend(["a long entry " * 6], loc="center left", bbox_to_anchor=(0.6, 0.5))
    problems = "\n".join(layout_problems(fig))
    assert "is clipped" in problems
    assert "sits on axes 0's x axis labels" in problems
    assert "'nothing' is zero everywhere" in problems


# --- the defects of issue 17, one check each ---------------------------------------------------------------------


def _legend_texts(fig: Any) -> list[str]:
    return [t.get_text() for legend in _legends(fig) for t in legend.get_texts()]


def test_all_zero_series_are_left_out(charts: dict[str, Any]) -> None:
    """Pure data parallelism: no tp, pp or zero bytes, no recompute: none of them in a legend."""
    kinds = _legend_texts(charts["traffic/communication"])
    assert "dp" in kinds and not {"tp", "pp", "zero"} & set(kinds)
    parts = _legend_texts(charts["traffic/time_breakdown"])
    assert "compute" in parts and "recompute" not in parts


def test_link_tiers_are_drawn_per_port(charts: dict[str, Any]) -> None:
    fig = charts["traffic/communication"]
    tiers = fig.axes[1]
    assert "busiest port" in tiers.get_xlabel() and "per port" in tiers.get_title()
    assert not [t for t in tiers.get_yticklabels() if t.get_visible() and t.get_text()]  # shared with the left panel


def test_port_bytes_divide_a_trunk_by_its_ports() -> None:
    """A leaf's uplink is a trunk of the spine's ports: per port it carries its bytes over their count; one-port
    links (a GPU's NVLink, a NIC) carry what ``tier_bytes`` says."""
    comparison = plansim.compare("gpt3-125m", ["dp=16,micro_batch=1,global_batch=16"], ["dgx-a100"], engine="des")
    run = comparison.runs[0]
    graph, node = run.cluster.topology, run.cluster.node
    want: dict[str, float] = {}
    for link, n_bytes in run.result.timeline.link_bytes.items():
        u, v = link.split("->")
        tier = link_tier(node, link)
        port = next((t.bandwidth_Bps for t in node.fabric if t.name == tier), None)
        ports = 1 if port is None else round(graph.edges[u, v]["bandwidth_Bps"] / port)
        want[tier] = max(want.get(tier, 0.0), n_bytes / ports)
    assert run.port_bytes() == pytest.approx(want)
    tiers = run.tier_bytes()
    for tier in ("nvlink", "nic"):
        assert run.port_bytes()[tier] == tiers[tier]


def test_scaling_curves_are_named_by_what_they_hold(charts: dict[str, Any]) -> None:
    """dp follows the GPU count, so no curve is named by one dp; counts that cannot run are drawn (triangles on the
    bottom edge at their GPU count) and the legend says what they mean."""
    fig = charts["compare/scaling"]
    names = _legend_texts(fig)
    curves = [n for n in names if "@" in n]
    assert len(curves) == 4 and not [n for n in curves if n.startswith("dp")]
    assert all("global batch 16" in n for n in curves)
    assert "cannot run at that count" in names
    ax = fig.axes[0]
    marked = {x for line in ax.lines if line.get_marker() == "v" for x in line.get_xdata()}
    assert 12 in marked


def test_timeline_panels_share_one_time_axis(charts: dict[str, Any]) -> None:
    fig = charts["compare/timeline"]
    assert len(fig.axes) == 4
    limits = {ax.get_xlim() for ax in fig.axes}
    assert len(limits) == 1
    first = fig.axes[0]
    assert all(first.get_shared_x_axes().joined(first, ax) for ax in fig.axes)


def test_validation_axes_read_in_plain_units(charts: dict[str, Any]) -> None:
    """CPU peaks of a few MB: the memory axis is in MiB with plain numbers, not "3x10^-3 GB"."""
    fig = charts["validation/predicted_vs_measured"]
    _drawn(fig)
    memory = fig.axes[1]
    assert memory.get_xlabel().endswith("(MiB)") and memory.get_ylabel().endswith("(MiB)")
    assert fig.axes[0].get_xlabel().endswith("(ms)")
    for ax in fig.axes:
        for label in [*ax.get_xticklabels(which="both"), *ax.get_yticklabels(which="both")]:
            assert "10^" not in label.get_text() and "times" not in label.get_text(), label.get_text()


def test_a_sweep_legend_of_many_long_names_fits() -> None:
    """Eight model x hardware lines with long names (a sweep over files): the legend takes as many columns as fit
    the figure, none clipped on either side."""
    rows = [
        {"model": f"{name}-with-a-long-config-file-name", "hardware": hw, "gpus": g, "global_batch": 64, "fits": True,
         "engine": "analytic", "tokens_per_s": 1e4 * g * (k + 1), "mfu": 0.3 + 0.01 * k}
        for k, name in enumerate(("gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b"))
        for hw in ("dgx-a100", "dgx-h100")
        for g in (8, 16, 32)
    ]  # fmt: skip
    for metric in sweep_charts.METRICS:
        fig = sweep_charts.scaling_figure(pd.DataFrame(rows), metric, "plansim sweep")
        assert layout_problems(fig) == []
        assert len(_legend_texts(fig)) == 8


# --- the defects of issue 31, one check each ---------------------------------------------------------------------


def test_plan_time_chart_shows_the_gaps_between_finalists(charts: dict[str, Any]) -> None:
    """Step times differ by a fraction of a percent between finalists: beside the breakdown from 0, a panel of the
    distance from the best (%) whose widest bar spans most of its axis, each bar the plan's (step / best - 1)."""
    fig = charts["plan/time_breakdown"]
    _drawn(fig)
    breakdown, gaps = fig.axes
    assert breakdown.get_xlim()[0] == 0
    widths = [p.get_width() for p in gaps.patches]
    lo, hi = gaps.get_xlim()
    assert lo == 0 and max(widths) > 0 and max(widths) / hi > 0.5
    labels = [t.get_text() for t in gaps.texts]
    assert len(labels) == len(widths) and all("%)" in t for t in labels)


def test_plan_memory_chart_has_categories_and_says_gb_and_gib(charts: dict[str, Any]) -> None:
    """Peak memory stacked by category (each bar's total the plan's peak), and the capacity of an 80 GiB A100 in
    the GB every figure uses with the GiB it is sold in, not "86 GB"."""
    fig = charts["plan/memory"]
    _drawn(fig)
    names = _legend_texts(fig)
    assert {"weights", "optimizer", "activations"} <= set(names)
    assert "capacity 85.9 GB (80 GiB)" in names
    assert plan_charts.capacity_label(80 * 2**30) == "85.9 GB (80 GiB)"
    frame = plansim.plan("gpt3-125m", "dgx-a100", gpus=8, global_batch=16, top_k=3, des=False, milp=False).frame()
    (ax,) = plan_charts.memory_figure(frame, "t").axes
    totals: dict[float, float] = {}
    for bar in ax.patches:
        totals[round(bar.get_y(), 6)] = totals.get(round(bar.get_y(), 6), 0.0) + bar.get_width()
    peaks = sorted(float(v) / 1e9 for v in frame["peak_memory_bytes"])
    assert sorted(totals.values()) == pytest.approx(peaks, rel=1e-9)


def test_every_link_tier_bar_is_visible(charts: dict[str, Any]) -> None:
    """A switch port's share of a trunk (a few GB) beside a GPU's NVLink (hundreds): on the tier panel's log axis
    every bar with bytes spans at least 10 pixels, and carries its value."""
    for name in ("compare/communication", "traffic/communication"):
        fig = charts[name]
        _drawn(fig)
        tiers = fig.axes[1]
        assert tiers.get_xscale() == "log"
        left = tiers.transData.transform((tiers.get_xlim()[0], 0))[0]
        for bar in tiers.patches:
            right = tiers.transData.transform((bar.get_x() + bar.get_width(), 0))[0]
            assert right - left >= 10, (name, bar.get_width())
        assert len(tiers.texts) == len(tiers.patches)


def test_scaling_efficiency_reads_on_a_linear_axis_and_marks_do_not_hide_points(charts: dict[str, Any]) -> None:
    """Beside the throughput, each curve's tokens/s per GPU over its first point's on a linear axis (a log-log plot
    draws every curve straight); points that do not fit are hollow rings drawn under the filled ones."""
    fig = charts["compare/scaling"]
    throughput, efficiency = fig.axes
    assert efficiency.get_yscale() == "linear" and throughput.get_yscale() == "linear"
    for line in efficiency.lines:
        if line.get_marker() == "o" and len(line.get_xdata()) and line.get_linestyle() in ("None", "none", ""):
            ys = list(line.get_ydata())
            assert all(0 < y <= 100.0 + 1e-9 or line.get_markerfacecolor() == "none" for y in ys)
    points = [line for line in throughput.lines if line.get_marker() == "o" and len(line.get_xdata())]
    hollow = [line for line in points if line.get_markerfacecolor() == "none"]
    filled = [line for line in points if line.get_markerfacecolor() != "none"]
    assert filled and all(h.get_zorder() < f.get_zorder() for h in hollow for f in filled)
