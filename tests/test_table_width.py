"""Tables fit the terminal (issue 17: plan, compare and sweep forced 200 columns, so every row wrapped in a
100-column terminal): rendered at ``COLUMNS=100`` no line is wider than 100 and each result row is one line; where
stdout is no terminal and ``COLUMNS`` is unset, every column is there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from plansim.cli.app import app
from plansim.report.fit import MIN_ELASTIC, PIPE_WIDTH, fit_table, terminal_console

runner = CliRunner()

PLAN = ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64", "--no-des", "--top", "5"]
COMPARE = ["compare", "--model", "gpt3-13b", "-H", "dgx-h100", "--gpus", "64", "-s",
           "dp=64,micro_batch=1,global_batch=512,zero=1,remat=selective", "-s", "tp-node-dp", "-s", "zero3",
           "--engine", "analytic"]  # fmt: skip


def _tables(text: str) -> list[list[str]]:
    """The body rows of each table in ``text`` (lines between a header rule and the bottom rule)."""
    tables, body = [], None
    for line in text.splitlines():
        if line.startswith("┡"):
            body = []
        elif line.startswith("└") and body is not None:
            tables.append(body)
            body = None
        elif body is not None:
            body.append(line)
    return tables


def _run(argv: list[str], columns: int | None) -> str:
    env = {"COLUMNS": str(columns)} if columns else {"COLUMNS": ""}
    res = runner.invoke(app, argv, env=env)
    assert res.exit_code == 0, res.output
    return res.stdout


def _assert_fits(text: str, width: int) -> None:
    wide = [line for line in text.splitlines() if len(line) > width]
    assert not wide, f"{len(wide)} lines wider than {width}: {wide[0]!r}"


def test_plan_table_fits_100_columns_one_line_a_row() -> None:
    finalists = json.loads(_run([*PLAN, "--format", "json"], None))["finalists"]
    text = _run(PLAN, 100)
    _assert_fits(text, 100)
    rows = _tables(text)[0]
    ranks = [row.split("│")[1].strip() for row in rows]
    assert ranks == [str(f["rank"]) for f in finalists] + ["M"] * (len(rows) - len(finalists)), "a row took 2 lines"
    for row, f in zip(rows, finalists, strict=False):
        cells = [c.strip() for c in row.split("│")]
        assert cells[1] == str(f["rank"]) and f"{f['analytic']['step_time_s'] * 1e3:,.1f} ms" in row
    assert "To fit 100 columns" in text


def test_compare_table_fits_100_columns_one_line_a_row() -> None:
    text = _run(COMPARE, 100)
    _assert_fits(text, 100)
    rows = _tables(text)[0]
    assert len(rows) == 3
    assert [r.split("│")[3].strip() for r in rows] == ["64"] * 3  # GPUs: on the row's one line
    assert [r.split("│")[4].strip() for r in rows] == ["512", "8", "128"]  # and the global batch


def test_sweep_and_listings_fit_100_columns(tmp_path: Path) -> None:
    argv = ["sweep", "-m", "gpt3-125m,gpt3-350m", "-H", "dgx-a100,dgx-h100", "-g", "8", "-B", "16",
            "--out", str(tmp_path)]  # fmt: skip
    text = _run(argv, 100)
    _assert_fits(text, 100)
    assert len(_tables(text)[0]) == 4
    for listing, n in (
        ("hardware", len(list((Path(__file__).parents[1] / "hardware_profiles" / "nodes").glob("*.yaml")))),
        ("models", None),
    ):
        text = _run([listing], 80)
        _assert_fits(text, 80)
        if n is not None:
            assert len(_tables(text)[0]) == n


def test_without_a_terminal_every_column_is_there() -> None:
    text = _run(COMPARE, None)
    assert "comm per GPU" in text and "compute/recompute/" in text and "comm/bubble/optim/wait/interf" in text
    assert "To fit" not in text
    assert max(len(line) for line in text.splitlines()) <= PIPE_WIDTH


def test_terminal_console_reads_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "93")
    assert terminal_console().width == 93
    monkeypatch.delenv("COLUMNS")
    assert terminal_console().width == PIPE_WIDTH  # pytest's stdout is no terminal


def _table() -> Table:
    t = Table()
    for name in ("strategy", "step", "comm per GPU dp/tp/pp/zero", "memory / capacity"):
        t.add_column(name)
    t.add_row("dp16 tp8+sp pp2 mb2 interleaved(v=12) zero1 remat=selective butterfly", "5,303.9 ms",
              "20.7/272.0/1.1/20.6 GB", "76.2 / 86 GB")  # fmt: skip
    return t


@pytest.mark.parametrize(
    "width,dropped,abbreviated,cut_at",
    [
        (150, [], False, None),  # 135 columns wide: as it is
        (110, ["comm per GPU dp/tp/pp/zero"], False, None),  # headers folded, 126: the optional column goes
        (80, ["comm per GPU dp/tp/pp/zero"], True, None),  # 101: the strategy abbreviated to 42 characters
        (50, ["comm per GPU dp/tp/pp/zero"], True, 18),  # 74: the strategy cut by the 24 columns too many
    ],
)
def test_fit_table_folds_drops_abbreviates_then_cuts(
    width: int, dropped: list[str], abbreviated: bool, cut_at: int | None
) -> None:
    console = Console(width=width)
    t = _table()
    fitted = fit_table(t, console, elastic="strategy", optional=["comm per GPU dp/tp/pp/zero"])
    with console.capture() as cap:
        console.print(t)
    lines = cap.get().splitlines()
    assert all(len(line) <= width for line in lines)
    (row,) = _tables(cap.get())[0]  # one line
    assert fitted.dropped == dropped and bool(fitted.legend) == abbreviated and fitted.cut_at == cut_at
    strategy = row.split("│")[1].strip()
    if cut_at is not None:
        assert len(strategy) == cut_at and strategy.endswith("…") and cut_at >= MIN_ELASTIC
    elif abbreviated:
        assert strategy == "dp16 tp8+sp pp2 mb2 il(v=12) z1 r:sel bfly"
    assert "5,303.9 ms" in row and "76.2 / 86 GB" in row
