"""Tables that fit the terminal: every row of results on one line of the terminal's width.

``terminal_console`` gives stdout's console at the terminal's width (rich's own detection: ``COLUMNS`` first, then the
terminal's size); where stdout is no terminal and ``COLUMNS`` is unset (a pipe, a file, a test runner) it gives
``PIPE_WIDTH`` columns, since nothing wraps there. ``fit_table`` shapes a table to a width: cells never wrap; where
the table is wider than the width, headers longer than their cells fold onto lines (at spaces and underscores), the
columns a caller marks optional are left out (in the order given), the one elastic column (a strategy or a run's
label) is abbreviated (``abbreviate``), the columns marked ``late`` are left out, and as a last resort the elastic
column is cut with an ellipsis. ``print_fitted`` prints the table and a line saying what was left out or shortened.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

__all__ = ["PIPE_WIDTH", "Fitted", "abbreviate", "fit_table", "print_fitted", "terminal_console"]

#: Columns of output that goes to no terminal (and no ``COLUMNS``): wide enough that no table of plansim's is cut.
PIPE_WIDTH = 200
#: The elastic column is never cut narrower than this.
MIN_ELASTIC = 16

#: Words of ``describe.describe`` and their short forms (whole words only), in the legend's order.
_SHORT = (
    (r"interleaved\(v=(\d+)\)", r"il(v=\1)", "il = interleaved"),
    (r"zero(\d)", r"z\1", "z = ZeRO stage"),
    (r"remat=(selective|none|full|sqrt|milp)", None, "r: = remat"),
    (r"butterfly", "bfly", "bfly = butterfly"),
    (r"hierarchical", "hier", "hier = hierarchical"),
)
_REMAT = {"selective": "r:sel", "none": "r:none", "full": "r:full", "sqrt": "r:sqrt", "milp": "r:milp"}


def terminal_console() -> Console:
    """stdout's console: the terminal's width, or ``PIPE_WIDTH`` where stdout is no terminal and ``COLUMNS`` is
    unset."""
    console = Console()
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        return Console(width=PIPE_WIDTH)
    return console


def abbreviate(text: str) -> tuple[str, list[str]]:
    """``text`` (a strategy as ``describe`` writes it, ``dpN tpN ...``, or a label starting with one) with its long
    words shortened, and the legend entries of the short forms used; other text (a file's name) as it is.

    >>> short, legend = abbreviate("dp16 tp8+sp pp2 mb2 interleaved(v=12) zero1 remat=selective butterfly")
    >>> short
    'dp16 tp8+sp pp2 mb2 il(v=12) z1 r:sel bfly'
    >>> legend
    ['il = interleaved', 'z = ZeRO stage', 'r: = remat', 'bfly = butterfly']
    >>> abbreviate("zero3")
    ('zero3', [])
    """
    if not re.match(r"dp\d+ tp\d+", text):
        return text, []
    used = []
    words = text.split(" ")
    for pattern, short, legend in _SHORT:
        regex = re.compile(rf"^{pattern}$")
        hit = False
        for k, word in enumerate(words):
            m = regex.match(word)
            if m:
                words[k] = _REMAT[m.group(1)] if short is None else m.expand(short)
                hit = True
        if hit:
            used.append(legend)
    return " ".join(words), used


@dataclass
class Fitted:
    """What ``fit_table`` did: the columns left out, the legend of the abbreviations used, the elastic column's
    width where its cells were cut (None: none was)."""

    width: int
    more: str = "--format json or --out"
    dropped: list[str] = field(default_factory=list)
    legend: list[str] = field(default_factory=list)
    cut_at: int | None = None

    def note(self) -> str:
        """One line on what was left out or shortened (empty when nothing was)."""
        parts = []
        if self.dropped:
            parts.append(f"left out: {', '.join(self.dropped)}")
        if self.legend:
            parts.append(f"abbreviated: {', '.join(self.legend)}")
        if self.cut_at is not None:
            parts.append("long names cut (…)")
        if not parts:
            return ""
        return f"To fit {self.width} columns, {'; '.join(parts)}. A wider terminal or {self.more} shows all."


def _key(header: str) -> str:
    """A header without its white space: how a caller's name finds a column whose header was folded."""
    return re.sub(r"\s+", "", header)


def _fold_headers(table: Table, console: Console) -> None:
    """Each header longer than its column's longest cell on lines no longer than that cell (or its longest word),
    broken at spaces and underscores."""
    for column in table.columns:
        header = str(column.header)
        cells = [Measurement.get(console, console.options, c).maximum for c in column._cells]
        widest = max(cells, default=0)
        if "\n" in header or len(header) <= widest:
            continue
        words = re.split(r"[ _]+", header)
        column.header = "\n".join(textwrap.wrap(" ".join(words), width=max(widest, *map(len, words))))


def _unfold_if_it_fits(table: Table, console: Console, headers: dict[int, Any], width: int) -> None:
    """The headers as given again where the table, once columns were left out, fits ``width`` with them unfolded."""
    folded = [(column, column.header) for column in table.columns]
    for column, _ in folded:
        column.header = headers.get(id(column), column.header)
    if _natural(table, console) > width:
        for column, header in folded:
            column.header = header


def _natural(table: Table, console: Console) -> int:
    return Measurement.get(console, console.options.update(width=10**6), table).maximum


def fit_table(
    table: Table,
    console: Console,
    *,
    elastic: str,
    optional: Sequence[str] = (),
    late: Sequence[str] = (),
    width: int | None = None,
    more: str = "--format json or --out",
) -> Fitted:
    """Shape ``table`` in place to ``width`` (default the console's) columns: no cell wraps; too wide, long headers
    fold, the ``optional`` columns go in that order, the ``elastic`` column's cells are abbreviated, the ``late``
    columns go, and the elastic cells are cut (with an ellipsis, not narrower than ``MIN_ELASTIC``). Columns are named
    by their headers (white space does not count). ``more``: what shows every figure, for the note."""
    width = width or console.width
    fitted = Fitted(width, more)
    for column in table.columns:
        column.no_wrap = True
        column.overflow = "ellipsis"
    by_name = {_key(str(c.header)): c for c in table.columns}
    target = by_name[_key(elastic)]
    steps: list[Callable[[], None]] = [
        lambda: _fold_headers(table, console),
        *(partial(_drop, table, by_name, name, fitted) for name in optional),
        lambda: _abbreviate_cells(target, fitted),
        *(partial(_drop, table, by_name, name, fitted) for name in late),
    ]
    headers = {id(column): column.header for column in table.columns}  # as given, before any fold
    for step in steps:
        if _natural(table, console) <= width:
            _unfold_if_it_fits(table, console, headers, width)
            return fitted
        step()
    excess = _natural(table, console) - width
    if excess > 0:
        longest = max(Measurement.get(console, console.options, c).maximum for c in [target.header, *target._cells])
        target.max_width = max(MIN_ELASTIC, longest - excess)
        fitted.cut_at = target.max_width
    return fitted


def _drop(table: Table, by_name: dict[str, Column], name: str, fitted: Fitted) -> None:
    column = by_name.get(_key(name))
    if column is not None and column in table.columns:
        table.columns.remove(column)
        fitted.dropped.append(name)


def _abbreviate_cells(column: Column, fitted: Fitted) -> None:
    cells = []
    for cell in column._cells:
        plain = cell.plain if isinstance(cell, Text) else str(cell)
        short, used = abbreviate(plain)
        fitted.legend += [u for u in used if u not in fitted.legend]
        cells.append(cell if short == plain else short)
    column._cells = cells


def print_fitted(
    console: Console,
    table: Table,
    *,
    elastic: str,
    optional: Sequence[str] = (),
    late: Sequence[str] = (),
    more: str = "--format json or --out",
) -> Fitted:
    """``fit_table`` then print the table, and under it the note of what was left out or shortened."""
    fitted = fit_table(table, console, elastic=elastic, optional=optional, late=late, more=more)
    console.print(table)
    note = fitted.note()
    if note:
        console.print(note, style="dim", markup=False)
    return fitted
