"""The committed notebooks: executed with their outputs stored (by scripts/run_notebooks.py, so they read on GitHub),
normalised so that a re-run gives the same file, and their text free of control characters (LaTeX written as a
Python string with ``\\f`` or ``\\a`` becomes a form feed or a bell). ``pytest --nbmake`` runs them (conftest.py)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

#: its module-scoped fixtures computed once: every test here on one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_notebooks")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def script() -> dict:
    return runpy.run_path(str(ROOT / "scripts" / "run_notebooks.py"), run_name="run_notebooks")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def test_there_are_eight_notebooks() -> None:
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07", "08"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_control_characters(path: Path) -> None:
    for k, cell in enumerate(_cells(path)):
        text = "".join(cell["source"])
        bad = sorted({hex(ord(c)) for c in text if ord(c) < 32 and c != "\n"})
        assert not bad, f"{path.name} cell {k}: control characters {bad}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_executed_and_normalised(path: Path, script: dict) -> None:
    """Every code cell ran, in order, in one kernel, and shows something; no timings or machine details stored."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb["metadata"] == script["KERNEL"]
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), f"{path.name}: not executed in order"
    assert sum(bool(c["outputs"]) for c in code) >= len(code) // 2, f"{path.name}: most cells show nothing"
    assert not any("execution" in c["metadata"] for c in nb["cells"])
    assert not [o for c in code for o in c["outputs"] if o["output_type"] == "error"]


def test_normalise_removes_what_changes_between_runs(script: dict) -> None:
    nbformat = pytest.importorskip("nbformat")
    html = '<style>#T_1a2b3_row0_col0 {}</style><table id="T_1a2b3"><td id="T_1a2b3_row0_col0">1</td></table>'
    nb = nbformat.v4.new_notebook(metadata={"language_info": {"name": "python", "version": "3.12.1"}, "widgets": {}})
    cell = nbformat.v4.new_code_cell("x", execution_count=1, metadata={"execution": {"iopub.status.idle": "2025"}})
    cell.outputs = [
        nbformat.v4.new_output(
            "execute_result", {"text/html": html, "text/plain": "<pandas.io.formats.style.Styler at 0x7f3a2c1d0e50>"}
        )
    ]
    cell.outputs += [
        nbformat.v4.new_output("stream", name="stderr", text="USDT:2026-11-24 09:01:46 7812:7812 x.cpp:52] start\n"),
        nbformat.v4.new_output("stream", name="stdout", text="Running HiGHS 1.16.0\nanswer 42\n"),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), cell]
    out = script["normalise"](nb)
    assert out.metadata == script["KERNEL"]
    assert "execution" not in out.cells[1].metadata
    data = out.cells[1].outputs[0]["data"]
    assert "1a2b3" not in data["text/html"] and data["text/html"].count("T_c01s1") == 3
    assert data["text/plain"] == "<pandas.io.formats.style.Styler>"
    assert [o["text"] for o in out.cells[1].outputs[1:]] == ["answer 42\n"]  # timestamped noise and banners cut
    assert script["normalise"](out) == out


def test_quickstart_calls_the_efficiency_curves_assumed() -> None:
    """The GPU profiles' efficiency curves are assumptions (their YAML says so), not measurements."""
    text = " ".join("".join(c["source"]) for c in _cells(ROOT / "notebooks" / "01_quickstart.ipynb")).split()
    words = " ".join(text)
    assert "measured efficiency curves" not in words and "assumed efficiency curves" in words
    assert "ASSUMPTIONS" in (ROOT / "hardware_profiles" / "gpus" / "h100-sxm5-80gb.yaml").read_text()


def test_narrative_figures_are_checked_and_refreshed_from_the_run(script: dict) -> None:
    """A markdown cell's marked figure (run ``nb``: the notebook's FIGURES) that differs from the run is reported, and
    rewritten when updating; other runs' markers and text are left alone."""
    import sys

    nbformat = pytest.importorskip("nbformat")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        text = "H200: <!-- fig nb h200.gain pct.1 -->1.0<!-- /fig --> % faster; <!-- fig other x s.3 -->9<!-- /fig -->"
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
        figures = {"h200": {"gain": 0.132}}
        problems = script["narrative_figures"](nb, figures, update=False)
        assert problems == ["cell 0: h200.gain quotes '1.0', the run gives '13.2'"] and nb.cells[0].source == text
        script["narrative_figures"](nb, figures, update=True)
        assert "h200.gain pct.1 -->13.2<!-- /fig -->" in nb.cells[0].source and "x s.3 -->9<!--" in nb.cells[0].source
        assert script["narrative_figures"](nb, figures, update=False) == []
        missing = script["narrative_figures"](nb, {}, update=False)
        assert missing and "h200" in missing[0]
    finally:
        sys.path.remove(str(ROOT / "scripts"))
