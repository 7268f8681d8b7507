"""The tornado chart of ``plansim plan --robust``: the winner's analytic step time as each uncertain input moves over
its range (the others at the profiles' values), widest swing at the top, against the rivals' step times at the
profiles' values (``report``: a ``planner.robust.RobustReport``, which the reports, below the planner, do not
import)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plansim.report.figures import bar_figure, legend_right, save_figure
from plansim.uncertainty import input_named

__all__ = ["tornado_chart", "tornado_figure"]


def tornado_figure(report: Any, title: str) -> Any:
    """Per input, a bar from the winner's step time at the profile's value to its step time at the range's low end
    (one colour, the upper half of the row) and at its high end (another, the lower half), each end labelled with
    the input's value beside its own bar, so that the two labels never meet even where both ends lie on one side;
    dashed lines at the rivals' step times."""
    rows = sorted(report.sensitivities, key=lambda s: s.swing_s)  # widest at the top (last drawn row)
    fig, (ax,) = bar_figure(max(len(rows), 1))
    centre = report.winner_nominal_s
    for y, s in enumerate(rows):
        u = input_named(s.name)
        ends = (
            (s.low, s.at_low_s, "C0", "range's low end", y + 0.2),
            (s.high, s.at_high_s, "C1", "range's high end", y - 0.2),
        )
        for end, at, colour, label, row in ends:
            ax.barh(row, at - centre, left=centre, height=0.38, color=colour, label=label if y == 0 else None)
            if end != s.value:
                ax.annotate(
                    u.show(end), (at, row), xytext=(3 if at >= centre else -3, 0), textcoords="offset points",
                    ha="left" if at >= centre else "right", va="center", fontsize=7,
                )  # fmt: skip
    ax.set_yticks(range(len(rows)), [f"{s.label} ({input_named(s.name).show(s.value)})" for s in rows])
    ax.axvline(centre, color="black", lw=1.0, label="winner at the profiles' values")
    for k, (rival, seconds) in enumerate(zip(report.rivals, report.rival_nominal_s, strict=True)):
        ax.axvline(seconds, color=f"C{3 + k}", ls="--", lw=1.2, label=f"{rival.role} at the profiles' values")
    ax.set_xlabel("winner's step time (s, analytic engine)")
    ax.set_title(f"{title}: how far each input moves the winner", fontsize=10)
    ax.margins(x=0.15)
    legend_right(ax)
    ax.tick_params(axis="y", labelsize=8)
    return fig


def tornado_chart(report: Any, path: str | Path, title: str) -> list[Path]:
    """Write ``tornado_figure`` to ``path`` (``figures.save_figure``)."""
    return save_figure(tornado_figure(report, title), path)
